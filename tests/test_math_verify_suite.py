"""The ``math`` verifier on Math-Verify's own unit tests: at least as good as the library it wraps.

huggingface/Math-Verify 0.9.0 ships ``tests/*.py`` in its sdist: 276 labelled (gold, prediction)
pairs as this project reads them (``tests/verifier_cases/math_verify_suite.py`` parses the files
with ``ast``; nothing of them is copied here). Every pair is one test: ``get_verifier("math")
.score(pred, {"answer": gold})`` must agree with the label, except the pairs listed below, each a
strict expected failure (fixing one fails the run, so the list stays exact). The count test puts
plain math-verify (``verify(parse(gold), parse(pred))``, its defaults) side by side.

The suite is found through ``$RLVR_MATH_VERIFY_TESTS`` or ``~/.cache/rlvr/math-verify-suite``
(``.ci/run`` fetches it there); without it every test here skips, saying so.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from rlvr.verifiers import get_verifier

_PATH = Path(__file__).resolve().parent / "verifier_cases" / "math_verify_suite.py"
_spec = importlib.util.spec_from_file_location("verifier_cases_math_verify_suite", _PATH)
suite = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = suite  # dataclasses look their module up
_spec.loader.exec_module(suite)

PAIRS_IN_0_9_0 = 276
MIN_AGREEMENT = 263  # the goal set when plain math-verify agreed on 263 of the 270 pairs then counted

# The test passes comparison settings this verifier does not take (it keeps its own, see docs/verifiers.md).
SETTING = {
    "test_all::test_latex_notation[5]":
        "latex-only extraction (match_types=['latex']): an inline $...$ split over lines is no LaTeX match "
        "for math-verify; this verifier still reads the response's only number, 9",
    "test_all::test_latex_notation[6]": "as test_latex_notation[5], with \\( ... \\) split over lines",
    "test_all::test_precision#call0":
        "precision=4: 0.3333 for 1/3 passes at 4 decimals; this verifier's tolerance is relative 1e-6",
    "test_all::test_complex_math_expressions[7]": "precision=2: 0.33 for 1/3 passes at 2 decimals, not at 1e-6",
    "test_all::test_complex_math_expressions[13]": "precision=2: 2.6667 for 8/3 passes at 2 decimals, not at 1e-6",
    "test_all::test_set_rel_assymetry[3]":
        "allow_set_relation_comp=False makes the gold x in [-2,7] differ from -2 <= x <= 7; this verifier "
        "compares an interval and its inequality both ways (the same pair with the option on, [2], passes)",
    "test_strict::test_strict_variable_comparison[1]":
        "strict=False lets f(x) equal f(y); this verifier is strict about variable names ([0] passes)",
}
# The label is wrong.
MISLABELLED = {
    "test_yujianll::test_string_extraction[9]":
        "1 - 1/e and 1 + 1/e are labelled equal; they differ by 2/e (math-verify passes it only because "
        "it parses both as 1, cutting at \\mathrm{e})",
}
KNOWN = {**SETTING, **MISLABELLED}

TESTS_DIR = suite.suite_dir()
ABSENT = (f"Math-Verify's test suite is not here: set ${suite.ENV} to the unpacked math-verify=={suite.VERSION} "
          f"sdist, or unpack it under {suite.DEFAULT_CACHE} (.ci/run does)")
try:
    PAIRS, SKIPPED = suite.extract_pairs(TESTS_DIR) if TESTS_DIR else ([], [])
except (OSError, SyntaxError, UnicodeDecodeError) as exc:  # a folder that is not the suite
    TESTS_DIR, PAIRS, SKIPPED = None, [], []
    ABSENT = f"{ABSENT} (unreadable: {exc})"
requires_suite = pytest.mark.skipif(TESTS_DIR is None, reason=ABSENT)


def _params():
    if not PAIRS:
        return [pytest.param(None, id="suite-absent", marks=pytest.mark.skip(reason=ABSENT))]
    return [pytest.param(p, id=p.id, marks=pytest.mark.xfail(strict=True, reason=KNOWN[p.id]) if p.id in KNOWN else ())
            for p in PAIRS]


@pytest.fixture(scope="module")
def verifier():
    return get_verifier("math")


@pytest.mark.parametrize("pair", _params())
def test_pair(pair, verifier):
    reward = verifier.score(pair.pred, {"answer": pair.gold})
    assert int(reward.score > 0) == pair.expected, (
        f"{pair.id}: expected {pair.expected}, got {reward.score} ({reward.status}); extracted "
        f"{reward.info.get('extracted')!r}; gold {pair.gold[-200:]!r}; pred {pair.pred[-200:]!r}")


@requires_suite
def test_extraction_reads_every_pair():
    assert SKIPPED == [], f"rows that are not literals: {SKIPPED}"
    assert len(PAIRS) == PAIRS_IN_0_9_0, (f"{len(PAIRS)} pairs in {TESTS_DIR}: the known lists here are for "
                                          f"math-verify {suite.VERSION} ({PAIRS_IN_0_9_0} pairs)")
    assert set(KNOWN) <= {p.id for p in PAIRS}, set(KNOWN) - {p.id for p in PAIRS}
    assert len({p.id for p in PAIRS}) == len(PAIRS)


@requires_suite
def test_agreement_at_least_plain_math_verify(verifier):
    pytest.importorskip("math_verify")
    ours = suite.score_ours(PAIRS, verifier)
    plain = suite.score_math_verify(PAIRS)
    agree = {p.id for p in PAIRS if ours[p.id] == p.expected}
    agree_plain = {p.id for p in PAIRS if plain[p.id] == p.expected}
    assert len(agree) >= MIN_AGREEMENT, (len(agree), sorted({p.id for p in PAIRS} - agree))
    # on the pairs whose label is right, this verifier agrees at least as often as math-verify itself
    assert len(agree - set(MISLABELLED)) >= len(agree_plain - set(MISLABELLED)), (
        f"ours {len(agree)}, plain math-verify {len(agree_plain)} of {len(PAIRS)}; plain right where we are "
        f"not: {sorted(agree_plain - agree)}")
