"""Math-Verify's own unit tests, read as ``(gold, prediction, expected)`` pairs.

huggingface/Math-Verify ships its regression tests in its source distribution (``tests/*.py``):
mostly ``pytest.mark.parametrize`` lists of ``(gold, pred, expected)`` (some with a fourth column:
``precision``, ``strict``, ``allow_set_relation_comp``) and a few direct ``compare_strings(gold,
pred, ...) == 1`` asserts. This module *reads* those files with :mod:`ast` (nothing is imported or
executed, and nothing is copied into this repository) and returns the pairs, so that
``tests/test_math_verify_suite.py`` and ``benchmarks/verifiers.py`` can score the ``math`` verifier on
the library's own suite, next to plain math-verify.

Where the suite is: ``$RLVR_MATH_VERIFY_TESTS`` (the unpacked sdist, or its ``tests`` folder), else
``~/.cache/rlvr/math-verify-suite`` (where ``.ci/run`` unpacks it)::

    pip download math-verify==0.9.0 --no-deps --no-binary :all: -d DIR && tar xzf DIR/math_verify-0.9.0.tar.gz -C DIR

What counts as a pair: every parametrize row and every direct call whose arguments name a gold and a
prediction string and an expected 0/1 (``test_string_extraction.py`` parses a prediction alone,
``test_configs.py``, ``test_timeout.py`` and the like test the library's internals: none of them is a
pair). A value is a string literal, a number, or an f-string over ``math.<function>(number)``
(``f"{math.sqrt(17):.15f}"``); a row with anything else is counted in ``skipped``.
"""

from __future__ import annotations

import ast
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

ENV = "RLVR_MATH_VERIFY_TESTS"
VERSION = "0.9.0"
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlvr" / "math-verify-suite"
_GOLD_NAMES = ("gold",)
_PRED_NAMES = ("pred", "prediction")
_EXPECTED_NAMES = ("expected", "result")
_OPTIONS = ("precision", "strict", "allow_set_relation_comp", "match_types")


@dataclass(frozen=True)
class Pair:
    """One labelled pair: ``id`` is ``file::function[row]`` (pytest's row index) or
    ``file::function#call<k>``; ``options`` are the comparison settings that test passes
    (``precision``, ``strict``, ``allow_set_relation_comp``, ``match_types``) where it sets any."""

    id: str
    gold: str
    pred: str
    expected: int
    options: dict = field(default_factory=dict, hash=False, compare=False)


class _Unsupported(ValueError):
    pass


def suite_dir() -> Path | None:
    """The folder holding Math-Verify's ``test_*.py`` files, or None when it is not on this machine."""
    roots = [Path(os.environ[ENV]).expanduser()] if os.environ.get(ENV) else [DEFAULT_CACHE]
    for root in roots:
        candidates = [root, root / "tests", root / f"math_verify-{VERSION}" / "tests",
                      *sorted(root.glob("math_verify-*/tests"), reverse=True)]
        for c in candidates:
            if c.is_dir() and (c / "test_all.py").is_file():
                return c
    return None


def _value(node: ast.AST):
    """A literal (string, number, bool, list of those), or an f-string over ``math.f(number)``."""
    if isinstance(node, ast.JoinedStr):
        out = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                out.append(str(part.value))
            elif isinstance(part, ast.FormattedValue) and part.conversion == -1:
                spec = _value(part.format_spec) if part.format_spec is not None else ""
                out.append(format(_value(part.value), spec))
            else:
                raise _Unsupported(ast.dump(part)[:80])
        return "".join(out)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "math" and not node.keywords
            and callable(getattr(math, node.func.attr, None))):
        args = [_value(a) for a in node.args]
        if not all(isinstance(a, (int, float)) for a in args):
            raise _Unsupported("math call on a non-number")
        return getattr(math, node.func.attr)(*args)
    if isinstance(node, (ast.Tuple, ast.List)):
        values = [_value(e) for e in node.elts]
        return tuple(values) if isinstance(node, ast.Tuple) else values
    try:
        return ast.literal_eval(node)
    except ValueError as exc:
        raise _Unsupported(ast.dump(node)[:80]) from exc


def _param_names(node: ast.AST) -> list[str]:
    names = _value(node)
    if isinstance(names, str):
        return [n.strip() for n in names.split(",") if n.strip()]
    return [str(n) for n in names]


def _is_parametrize(dec: ast.AST) -> bool:
    return (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr == "parametrize"
            and len(dec.args) >= 2)


def _call_name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _compare_calls(func: ast.FunctionDef) -> list[ast.Call]:
    return [n for n in ast.walk(func) if isinstance(n, ast.Call) and _call_name(n) == "compare_strings"]


def _body_options(func: ast.FunctionDef, row: dict) -> dict:
    """The settings the test body passes to ``compare_strings`` (constants or the row's own columns)."""
    options: dict = {}
    for call in _compare_calls(func)[:1]:
        for kw in call.keywords:
            if kw.arg not in _OPTIONS:
                continue
            if isinstance(kw.value, ast.Name) and kw.value.id in row:
                options[kw.arg] = row[kw.value.id]
            else:
                try:
                    options[kw.arg] = _value(kw.value)
                except _Unsupported:
                    pass
    return options


def _first(names: list[str], wanted: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in wanted), None)


def _parametrized_pairs(stem: str, func: ast.FunctionDef, dec: ast.Call, skipped: list[str]) -> list[Pair]:
    names = _param_names(dec.args[0])
    gold_n, pred_n, exp_n = _first(names, _GOLD_NAMES), _first(names, _PRED_NAMES), _first(names, _EXPECTED_NAMES)
    if not (gold_n and pred_n and exp_n) or not isinstance(dec.args[1], (ast.List, ast.Tuple)):
        return []  # not a gold/prediction table (test_string_extraction.py parses a prediction alone)
    pairs = []
    for i, row_node in enumerate(dec.args[1].elts):
        rid = f"{stem}::{func.name}[{i}]"
        try:
            values = _value(row_node)
        except _Unsupported:
            skipped.append(rid)
            continue
        if not isinstance(values, (tuple, list)) or len(values) != len(names):
            skipped.append(rid)
            continue
        row = dict(zip(names, values))
        options = {k: v for k, v in row.items() if k in _OPTIONS}
        options.update({k: v for k, v in _body_options(func, row).items() if k not in options})
        if not (isinstance(row[gold_n], str) and isinstance(row[pred_n], str)):
            skipped.append(rid)
            continue
        pairs.append(Pair(rid, row[gold_n], row[pred_n], int(bool(row[exp_n])), options))
    return pairs


def _direct_pairs(stem: str, func: ast.FunctionDef, skipped: list[str]) -> list[Pair]:
    """``assert compare_strings(gold, pred, ...) == 1`` written out in a test body."""
    pairs = []
    for k, node in enumerate(n for n in ast.walk(func) if isinstance(n, ast.Compare)):
        left = node.left
        if not (isinstance(left, ast.Call) and _call_name(left) == "compare_strings" and len(node.ops) == 1
                and isinstance(node.ops[0], ast.Eq) and len(left.args) >= 2):
            continue
        rid = f"{stem}::{func.name}#call{len(pairs)}"
        try:
            gold, pred, expected = _value(left.args[0]), _value(left.args[1]), _value(node.comparators[0])
        except _Unsupported:
            skipped.append(rid)
            continue
        options = {}
        for kw in left.keywords:
            if kw.arg in _OPTIONS:
                try:
                    options[kw.arg] = _value(kw.value)
                except _Unsupported:
                    pass
        pairs.append(Pair(rid, gold, pred, int(bool(expected)), options))
    return pairs


def extract_pairs(tests_dir: Path) -> tuple[list[Pair], list[str]]:
    """Every labelled pair in ``tests_dir/test_*.py`` (module docstring), and the ids of rows that
    could not be read as literals."""
    pairs: list[Pair] = []
    skipped: list[str] = []
    for path in sorted(Path(tests_dir).glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for func in tree.body:
            if not isinstance(func, ast.FunctionDef) or not func.name.startswith("test"):
                continue
            tables = [d for d in func.decorator_list if _is_parametrize(d)]
            for dec in tables:
                pairs += _parametrized_pairs(path.stem, func, dec, skipped)
            if not tables:
                pairs += _direct_pairs(path.stem, func, skipped)
    return pairs, skipped


def score_ours(pairs: list[Pair], verifier=None) -> dict[str, int]:
    """The ``math`` verifier's verdict (0/1) on each pair: ``score(pred, {"answer": gold})``."""
    if verifier is None:
        from rlvr.verifiers import get_verifier

        verifier = get_verifier("math")
    return {p.id: int(verifier.score(p.pred, {"answer": p.gold}).score > 0) for p in pairs}


def score_math_verify(pairs: list[Pair]) -> dict[str, int]:
    """Plain math-verify's verdict: ``verify(parse(gold), parse(pred))`` with its defaults (main thread)."""
    from math_verify import parse, verify

    out = {}
    for p in pairs:
        try:
            out[p.id] = int(bool(verify(parse(p.gold), parse(p.pred))))
        except Exception:
            out[p.id] = 0
    return out
