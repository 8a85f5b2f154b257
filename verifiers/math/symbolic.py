"""The slow path: sympy (through math-verify's LaTeX parser) for answers the fast parser cannot read.

math-verify's own timeouts use ``SIGALRM``, which only works in a process's main thread; from any
other thread ``parse`` raises and callers that swallow the error score everything 0. We therefore
call it with its timeouts *disabled* and enforce the deadline outside: the
:class:`~verifiers.runner.VerifierRunner` kills a worker process that overruns. Before calling it we
also refuse input that is known to make sympy run away (very long strings, deep nesting, towers of
exponents, huge factorials), so that ordinary hostile input fails fast with an error instead of
spending the whole deadline.

After math-verify says "equal" for two numbers we re-check them with a *relative* tolerance:
math-verify rounds floats to a fixed number of decimals, which calls ``2^{-98}`` and ``2^{-99}`` equal.
"""

from __future__ import annotations

import logging
import re
import threading
from functools import lru_cache

MAX_CHARS = 400
MAX_NESTING = 24

_lock = threading.Lock()
_mv = None


class TooComplex(ValueError):
    """The answer is too large or too deeply nested to hand to sympy safely."""


def _load():
    """Import math-verify on first use (about half a second) and silence its timeout warnings."""
    global _mv
    if _mv is None:
        with _lock:
            if _mv is None:
                import math_verify
                from math_verify import ExprExtractionConfig, LatexExtractionConfig

                for name in ("math_verify", "math_verify.parser", "math_verify.grader", "latex2sympy2_extended"):
                    logging.getLogger(name).setLevel(logging.CRITICAL)
                _mv = (math_verify, (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()))
    return _mv


def warm() -> None:
    """Import the slow path now (worker processes call this before they report ready)."""
    try:
        _load()
    except ImportError:  # without math-verify only the fast path works; say so where it is needed
        pass


def guard(text: str) -> None:
    """Raise :class:`TooComplex` for input that could make sympy run for a long time."""
    if len(text) > MAX_CHARS:
        raise TooComplex(f"answer longer than {MAX_CHARS} characters")
    depth = best = 0
    for c in text:
        if c in "({[":
            depth += 1
            best = max(best, depth)
        elif c in ")}]":
            depth -= 1
    if best > MAX_NESTING:
        raise TooComplex("answer nested too deeply")
    if text.count("|") > 4:  # absolute-value bars make the LaTeX grammar backtrack exponentially
        raise TooComplex("too many '|' bars")
    if len(re.findall(r"\^", text)) > 12 or re.search(r"\^\s*\{?[^{}]*\^\s*\{?[^{}]*\^", text):
        raise TooComplex("tower of exponents")
    if re.search(r"\d{7,}\s*\}?\s*\)?\s*!|\^\s*\{?\s*\d{5,}|\d{60,}", text):
        raise TooComplex("number too large")
    if re.search(r"\^\s*\{\s*\d+\s*\^|\^\s*\{[^{}]*\d{6,}", text):  # x^{10^{12}}, k^{123456}
        raise TooComplex("exponent too large")
    if re.search(r"\\(?:sum|prod|int|lim)\b", text) and len(text) > 200:
        raise TooComplex("long symbolic expression")


@lru_cache(maxsize=2048)
def _parse(text: str):
    mv, config = _load()
    parsed = mv.parse(f"${text}$", extraction_config=config, parsing_timeout=None)
    return parsed[0] if parsed else None


def sympy_equal(gold: str, pred: str, *, rel_tol: float, abs_tol: float | None = None) -> bool | None:
    """True/False when sympy can decide ``gold == pred``; None when it cannot parse either side.
    ``abs_tol`` further bounds the difference of two numbers (half a unit in the last place a
    decimal gold is written to)."""
    guard(gold)
    guard(pred)
    g = _parse(gold)
    p = _parse(pred)
    if g is None or p is None or isinstance(g, str) or isinstance(p, str):
        return None
    mv, _ = _load()
    try:
        same = bool(mv.verify(g, p, timeout_seconds=None, raise_on_error=False))
    except Exception:  # math-verify raises for some comparisons (e.g. dict ordering in solve)
        return None
    if same:
        return _relative_check(g, p, rel_tol, abs_tol)
    return False


def _relative_check(g, p, rel_tol: float, abs_tol: float | None = None) -> bool:
    """Keep math-verify's "equal" for numbers only when they also agree to a relative tolerance,
    computed in sympy's floats (unbounded exponent: e^{-1000} does not underflow to 0)."""
    try:
        if not (getattr(g, "is_number", False) and getattr(p, "is_number", False)):
            return True
        import sympy

        diff = sympy.Abs(g - p).evalf(30)
        scale = sympy.Max(sympy.Abs(g), sympy.Abs(p)).evalf(30)
        if scale == 0:
            return True
        if abs_tol is not None and diff > abs_tol * (1 + 1e-12):
            return False
        return bool(diff <= max(rel_tol, 1e-12) * scale)
    except Exception:
        return True
