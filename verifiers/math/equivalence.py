"""Is the extracted answer the gold answer? Cheap exact/numeric comparison first, sympy last.

Rules, by the shape of the gold (see :mod:`verifiers.math.answer`):

* **numbers** compare *exactly* while both sides are rational and written without decimals
  (``\\frac{3}{2} == 1.5`` is exact too, since ``1.5`` is read as ``3/2``); when a decimal literal
  or an irrational value is involved they compare with a *relative* tolerance::

      equal  <=>  |a - b| <= tol * max(|a|, |b|)     (tol = ``rel_tol`` with decimals, 1e-9 otherwise)

  so ``2^{-98}`` and ``2^{-99}`` differ (an absolute tolerance would call them equal).
* **rounded golds**: a decimal gold with two or more significant digits stands for its rounding
  interval, so an exact answer or a full-precision decimal that rounds to it matches (``33.3`` vs
  ``\\frac{100}{3}``, ``0.29`` vs ``0.290243``); ``0.5`` (one digit) and answers rounded differently
  must match exactly (``3.14`` vs ``3.15``, ``1.5`` vs ``1.54`` differ).
* **written precision** (``exact_decimals``): the relative tolerance never accepts what the written
  digits rule out: a decimal gold is exact to half a unit in its last place (``12345.67`` is not
  ``12345.68``), a decimal answer to an exact gold must be it rounded or cut at the answer's last
  place (``1234567.4`` is not ``1234567``).
* **percent**: ``50\\%`` matches ``50`` and ``0.5``.
* **shapes**: a single value never equals a matrix, tuple or list of several entries (a 1x1 matrix
  and a 1-tuple are their entry).
* **formulas in variables** must use the same variables and agree at four fixed points
  (polynomial-identity testing: two different rational functions agree on random points with
  probability ~0); this is how ``(a+5)(b+2)`` equals ``ab+2a+5b+10`` without sympy.
* **tuples** ``(a, b)`` compare in order; **sets** ``\\{a, b\\}``, bare lists ``a, b`` and ``\\pm``
  pairs compare as multisets, a value listed twice counting once (``(1,2), (3,4), (1,2)`` is the two
  pairs); an open interval ``(a, b)`` and the pair ``(a, b)`` are the same text, so they match each
  other; ``x = 1, y = 2`` matches the tuple ``(1, 2)`` in its written order.
* **inequalities** in one variable are solved when linear (``-x > -1`` is ``(-oo, 1)``, see
  :mod:`verifiers.math.answer`); two inequalities match when ``lhs - rhs``, signed by their
  direction, differ by a positive factor (``y > -x`` is ``x + y > 0``), strict against strict.
* **equations**: ``x = 3`` matches ``3`` either way round, and so does a gold whose left side is a
  label (``f(x) = 1``, ``|AB| = 1``, ``(p, q) = (3, 2)``, ``A:B = 1``; not ``x + y = 5``, not ``2x = 6``);
  two equations ``y = ...`` compare their right sides; general equations match when ``lhs - rhs``
  differ by a non-zero constant factor.
* **intervals, unions, matrices** compare part by part; a column vector matches the same tuple.
* **words** compare case- and punctuation-insensitively.

:func:`compare` returns True/False when these rules decide and None when they cannot (an
unreadable side, or a point where evaluation fails); the caller then asks sympy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from rlvr.verifiers.math.answer import (
    Answer, Choice, Infinity, Interval, Matrix, Relation, Scalar, Seq, Text, Union_, Unparsed, relation_as_interval,
)
from rlvr.verifiers.math.evaluate import evaluate
from rlvr.verifiers.math.expr import EvalError, TooLarge

EXACT_REL_TOL = 1e-9
MAX_DEDUP = 64
_POINTS = ((0.7373, 1.3161, 0.4142, 1.9129), (1.2247, 0.5772, 1.6180, 0.8415),
           (0.3183, 2.2361, 1.1447, 0.6931), (1.4427, 0.9069, 0.2679, 1.7321))


@dataclass(frozen=True)
class Tolerance:
    """How close two numbers must be. ``relative`` applies when a decimal literal is involved;
    ``rounded_gold`` accepts a more precise answer that rounds to a decimal gold with at least two
    significant digits (gold ``33.3``, answer ``\\frac{100}{3}`` or ``33.33``); ``exact_decimals``
    keeps the relative tolerance within the digits written (gold ``12345.67`` is not ``12345.68``)."""

    relative: float = 1e-6
    rounded_gold: bool = True
    exact_decimals: bool = True  # a decimal gold is exact to its last written digit (see _within_written_precision)


def compare(gold: Answer, pred: Answer, tol: Tolerance | float) -> bool | None:
    """True/False when the fast rules decide ``pred == gold``; None to ask sympy."""
    if not isinstance(tol, Tolerance):
        tol = Tolerance(float(tol))
    if isinstance(gold, Unparsed) or isinstance(pred, Unparsed):
        return None
    if isinstance(pred, Relation) and not isinstance(gold, Relation):
        return compare(gold, pred.rhs, tol) if pred.op == "=" else False
    handler = _HANDLERS.get(type(gold))
    if handler is None:
        return None
    return handler(gold, pred, tol)


def _scalar(gold: Scalar, pred: Answer, tol: Tolerance) -> bool | None:
    if not isinstance(pred, Scalar):
        if isinstance(pred, Seq) and len(pred.items) == 1:
            return compare(gold, pred.items[0], tol)
        if isinstance(pred, Matrix) and len(pred.rows) == 1 and len(pred.rows[0]) == 1:
            return compare(gold, pred.rows[0][0], tol)  # a 1x1 matrix is its entry; any other shape is not a value
        return False
    g, p = gold.expr, pred.expr
    if g.variables != p.variables:
        return False
    approx = g.decimal or p.decimal
    if g.variables:
        return _same_function(g, p, tol.relative if approx else 1e-8)
    try:
        gv = evaluate(g.tree)
        pv = evaluate(p.tree)
    except EvalError:
        return None
    candidates = [(pv, pred.ulp)]  # (value, unit in its last written place), rescaled with a percent sign
    if pred.percent and not gold.percent:
        candidates.append((pv / 100, pred.ulp / 100 if pred.ulp is not None else None))
    if gold.percent and not pred.percent:
        candidates.append((pv * 100, pred.ulp * 100 if pred.ulp is not None else None))
    for c, ulp in candidates:
        if values_equal(gv, c, tol.relative if approx else EXACT_REL_TOL, exact=not approx) \
                and (not tol.exact_decimals or _within_written_precision(gold, gv, c, ulp)):
            if not approx and _near_miss(gv, pv):
                return None  # equal to 1e-9 but not to rounding error (e^{100} vs e^{100}+1): sympy decides
            return True
    return tol.rounded_gold and any(_rounds_to_gold(gold, pred, gv, c) for c, _ in candidates)


def _within_written_precision(gold: Scalar, gv, pv, pred_ulp) -> bool:
    """A relative tolerance must not accept what the written digits rule out.

    * a decimal gold is exact to its last written place: ``12345.67`` and ``12345.68`` differ,
      although they agree to 1e-6 (the answer may differ by less than half a unit there: a value that
      rounds to the gold);
    * a decimal answer to an exact gold (an integer, a fraction, ``\\sqrt{2}``) must be that value
      rounded or cut at the answer's last written place: ``0.666667`` or ``0.666666`` for ``2/3``,
      not ``0.666668``, and not ``1234567.4`` for ``1234567``.
    """
    if gold.ulp is None and pred_ulp is None:
        return True
    try:
        diff = abs(gv - pv) if isinstance(gv, Fraction) and isinstance(pv, Fraction) else abs(complex(gv) - complex(pv))
    except (OverflowError, TypeError):
        return False
    if diff == 0:
        return True
    exact = isinstance(diff, Fraction)
    if gold.ulp is not None:
        return diff <= (gold.ulp / 2 if exact else float(gold.ulp) / 2 * (1 + 1e-12))
    if diff <= (pred_ulp / 2 if exact else float(pred_ulp) / 2 * (1 + 1e-12)):
        return True  # rounded at the answer's last place
    try:  # or cut there: 0.666666 for 2/3 (towards zero, by less than one unit)
        shorter = abs(complex(pv)) < abs(complex(gv))
    except (OverflowError, TypeError):
        return False
    return shorter and diff < (pred_ulp if exact else float(pred_ulp))


def _near_miss(a, b) -> bool:
    """Two floats that agree to 1e-9 but differ by more than floating-point noise (~1e-13)."""
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        return False
    za, zb = complex(a), complex(b)
    scale = max(abs(za), abs(zb))
    return scale > 0 and abs(za - zb) > 1e-12 * scale


def _rounds_to_gold(gold: Scalar, pred: Scalar, gv, pv) -> bool:
    """A decimal gold such as ``0.29`` stands for [0.285, 0.295]: accept an exact answer
    (``\\frac{100}{3}`` for ``33.3``) or a full-precision decimal (three or more extra places) in that
    range. One significant digit is too coarse to mean a range (``0.5`` is 0.5), and an answer rounded
    differently (``1.54`` for ``1.5``) must simply equal it."""
    if gold.ulp is None or (gold.sig or 0) < 2:
        return False
    if pred.ulp is not None and pred.ulp * 1000 > gold.ulp:
        return False  # a decimal answer must be a full-precision value (0.290243...), not another rounding (1.54 for 1.5)
    try:
        diff = abs(complex(gv) - complex(pv))
    except (OverflowError, TypeError):
        return False
    return diff <= float(gold.ulp) / 2 * (1 + 1e-12)


def _same_function(g, p, tol: float) -> bool | None:
    names = sorted(g.variables)
    decided = 0
    for point in _POINTS:
        env = {name: complex(point[i % len(point)] + 0.1 * (i // len(point))) for i, name in enumerate(names)}
        try:
            gv = evaluate(g.tree, env)
            pv = evaluate(p.tree, env)
        except EvalError:
            continue
        if not values_equal(gv, pv, tol, exact=False):
            return False
        decided += 1
    return True if decided >= 2 else None


def values_equal(a, b, rel_tol: float, *, exact: bool) -> bool:
    """Exact equality for two rationals when ``exact``; otherwise relative tolerance (module docstring)."""
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        if exact or a == b:
            return a == b
        return abs(a - b) <= Fraction(rel_tol) * max(abs(a), abs(b))
    za, zb = complex(a), complex(b)
    scale = max(abs(za), abs(zb))
    if scale == 0:
        return True
    diff = abs(za - zb)
    if diff <= rel_tol * scale:
        return True
    # Floating noise around an exact zero (sin(pi) = 1.2e-16): only when one side *is* zero.
    return (a == 0 or b == 0) and diff < 1e-12


def _infinity(gold: Infinity, pred: Answer, tol) -> bool:
    return isinstance(pred, Infinity) and pred.sign == gold.sign


def _seq(gold: Seq, pred: Answer, tol) -> bool | None:
    if isinstance(pred, Matrix):
        return _seq(gold, _flat_vector(pred), tol) if _flat_vector(pred) is not None else False
    if isinstance(pred, Interval) and gold.kind == "tuple" and len(gold.items) == 2:
        return _interval_as_pair(pred, gold, tol)
    if not isinstance(pred, Seq):
        return False
    if gold.kind != "tuple" and pred.kind == "tuple" and len(pred.items) == len(gold.items) > 1 \
            and _named_values(gold) is not None:  # "p = 5, q = 2" against (5, 2): the values in their order
        return _all_pairs(_named_values(gold), pred.items, tol)
    if gold.kind == "tuple":
        if len(pred.items) != len(gold.items) or pred.kind not in ("tuple", "list"):
            return False  # an ordered pair is not a set
        return _all_pairs(gold.items, pred.items, tol)
    golds, preds = gold.items, pred.items
    if len(golds) != len(preds) and pred.kind != "tuple":  # a list of solutions names each once: {1, 2, 2} is {1, 2}
        golds, preds = _without_repeats(golds, tol), _without_repeats(preds, tol)
    if len(golds) != len(preds):
        return False
    return _multiset_equal(golds, preds, tol)


def _named_values(seq: Seq) -> tuple | None:
    """The right sides of ``x = 1, y = 2`` (distinct lone variables, in order); None for anything else."""
    items = seq.items
    if not all(isinstance(i, Relation) and i.op == "=" and _lone_variable(i.lhs) for i in items):
        return None
    if len({i.lhs.expr.tree for i in items}) != len(items):
        return None
    return tuple(i.rhs for i in items)


def _without_repeats(items, tol) -> tuple:
    """``items`` with later duplicates dropped (only what the fast rules call equal is a duplicate)."""
    kept: list = []
    for item in items[:MAX_DEDUP]:
        if not any(compare(k, item, tol) for k in kept):
            kept.append(item)
    return tuple(kept) + tuple(items[MAX_DEDUP:])


def _all_pairs(golds, preds, tol) -> bool | None:
    unknown = False
    for g, p in zip(golds, preds):
        verdict = compare(g, p, tol)
        if verdict is False:
            return False
        unknown |= verdict is None
    return None if unknown else True


def _multiset_equal(golds, preds, tol) -> bool | None:
    """Greedy matching is exact here because equivalence of answers is transitive."""
    remaining = list(preds)
    unknown = False
    for g in golds:
        for j, p in enumerate(remaining):
            verdict = compare(g, p, tol)
            if verdict:
                del remaining[j]
                break
            unknown |= verdict is None
        else:
            return None if unknown else False
    return True


def _interval_as_pair(interval: Interval, pair: Seq, tol) -> bool | None:
    if interval.lo_closed or interval.hi_closed:
        return False
    return _all_pairs(pair.items, (interval.lo, interval.hi), tol)


def _interval(gold: Interval, pred: Answer, tol) -> bool | None:
    if isinstance(pred, Relation) and relation_as_interval(pred) is not None:  # x > a for (a, oo)
        pred = relation_as_interval(pred)
    if isinstance(pred, Seq) and pred.kind == "tuple" and len(pred.items) == 2:
        return _interval_as_pair(gold, pred, tol)
    if not isinstance(pred, Interval):
        return False
    if (gold.lo_closed, gold.hi_closed) != (pred.lo_closed, pred.hi_closed):
        return False
    return _all_pairs((gold.lo, gold.hi), (pred.lo, pred.hi), tol)


def _union(gold: Union_, pred: Answer, tol) -> bool | None:
    if not isinstance(pred, Union_) or len(pred.items) != len(gold.items):
        return False
    return _multiset_equal(gold.items, pred.items, tol)


def _flat_vector(m: Matrix) -> Seq | None:
    if len(m.rows) == 1:
        return Seq(tuple(m.rows[0]), "tuple")
    if all(len(r) == 1 for r in m.rows):
        return Seq(tuple(r[0] for r in m.rows), "tuple")
    return None


def _nested_rows(seq: Seq) -> Matrix | None:
    """``[[1,2],[3,4]]`` written as nested brackets: a matrix (a ``[1,2]`` row reads as an interval)."""
    rows = []
    for item in seq.items:
        if isinstance(item, Seq) and item.kind == "tuple":
            rows.append(tuple(item.items))
        elif isinstance(item, Interval) and item.lo_closed and item.hi_closed:
            rows.append((item.lo, item.hi))
        else:
            return None
    if len(rows) < 2 or any(len(r) != len(rows[0]) for r in rows):
        return None
    return Matrix(tuple(rows))


def _matrix(gold: Matrix, pred: Answer, tol) -> bool | None:
    if isinstance(pred, Seq) and _nested_rows(pred) is not None and len(gold.rows) > 1 and len(gold.rows[0]) > 1:
        pred = _nested_rows(pred)
    if isinstance(pred, Seq):
        flat = _flat_vector(gold)
        return _seq(flat, pred, tol) if flat is not None else False
    if not isinstance(pred, Matrix):
        return False
    if len(gold.rows) != len(pred.rows) or any(len(a) != len(b) for a, b in zip(gold.rows, pred.rows)):
        return False
    return _all_pairs([c for r in gold.rows for c in r], [c for r in pred.rows for c in r], tol)


def _relation(gold: Relation, pred: Answer, tol) -> bool | None:
    if isinstance(pred, Interval) and relation_as_interval(gold) is not None:  # x > a against (a, oo)
        return _interval(relation_as_interval(gold), pred, tol)
    if not isinstance(pred, Relation):
        # x = 5 vs 5; y = 2x + 3 vs 2x + 3; f(x) = 1, |AB| = 1, (p, q) = (3, 2) vs the value: only when the
        # left side is a lone variable or a label (not x + y = 5, not 2x = 6)
        if gold.op == "=" and (_lone_variable(gold.lhs) or gold.named):
            return compare(gold.rhs, pred, tol)
        return False
    if gold.op in _INEQUALITIES and pred.op in _INEQUALITIES \
            and all(isinstance(x, Scalar) for x in (gold.lhs, gold.rhs, pred.lhs, pred.rhs)):
        return _same_inequality(gold, pred)
    if gold.op != pred.op:
        flipped = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(pred.op)
        if flipped == gold.op:
            return _all_pairs((gold.lhs, gold.rhs), (pred.rhs, pred.lhs), tol)
        return False
    if _lone_variable(gold.lhs) and _lone_variable(pred.lhs):
        if gold.lhs.expr.tree != pred.lhs.expr.tree:
            return False
        return compare(gold.rhs, pred.rhs, tol)
    if gold.op == "=" and all(isinstance(x, Scalar) for x in (gold.lhs, gold.rhs, pred.lhs, pred.rhs)):
        return _proportional_equations(gold, pred)
    return _all_pairs((gold.lhs, gold.rhs), (pred.lhs, pred.rhs), tol)


_INEQUALITIES = ("<", "<=", ">", ">=")


def _same_inequality(gold: Relation, pred: Relation) -> bool | None:
    """Two inequalities ``f < 0`` and ``g < 0`` (each written as ``lhs - rhs < 0``, or ``rhs - lhs < 0``
    for ``>``) describe the same set when ``f / g`` is a *positive* constant: ``-x > -1`` is ``x < 1``
    (multiplying by -1 flips the sign), ``y > -x`` is ``x + y > 0``; ``y < -x`` is not."""
    if (gold.op in ("<=", ">=")) != (pred.op in ("<=", ">=")):
        return False  # strict and non-strict differ on the boundary
    return _constant_ratio(gold, pred, _signed_side, positive=True)


def _proportional_equations(gold: Relation, pred: Relation) -> bool | None:
    """``l1 = r1`` and ``l2 = r2`` describe the same set when ``(l1-r1) / (l2-r2)`` is a constant."""
    return _constant_ratio(gold, pred, _difference, positive=False)


def _constant_ratio(gold: Relation, pred: Relation, side: Callable[[Relation, dict], complex], *,
                    positive: bool) -> bool | None:
    """Is ``side(gold) / side(pred)`` the same constant at every test point (a positive real one when
    ``positive``)? Both relations must use the same variables; a point where one side is zero and the
    other is not decides False, a point where both are zero or evaluation fails decides nothing, and
    fewer than two decided points give None (ask sympy)."""
    names = sorted(gold.lhs.expr.variables | gold.rhs.expr.variables | pred.lhs.expr.variables
                   | pred.rhs.expr.variables)
    if (gold.lhs.expr.variables | gold.rhs.expr.variables) != (pred.lhs.expr.variables | pred.rhs.expr.variables):
        return False
    ratio = None
    decided = 0
    for point in _POINTS:
        env = {name: complex(point[i % len(point)] + 0.1 * (i // len(point))) for i, name in enumerate(names)}
        try:
            g = side(gold, env)
            p = side(pred, env)
        except EvalError:
            continue
        if abs(p) < 1e-12 or abs(g) < 1e-12:
            if abs(p) < 1e-12 and abs(g) < 1e-12:
                continue
            return False
        r = g / p
        if positive and (abs(r.imag) > 1e-9 * abs(r) or r.real <= 0):
            return False
        if ratio is None:
            ratio = r
        elif abs(r - ratio) > 1e-8 * max(abs(r), abs(ratio)):
            return False
        decided += 1
    return True if decided >= 2 else None


def _difference(rel: Relation, env) -> complex:
    """``lhs - rhs`` at ``env``."""
    return complex(evaluate(rel.lhs.expr.tree, env)) - complex(evaluate(rel.rhs.expr.tree, env))


def _signed_side(rel: Relation, env) -> complex:
    """``lhs - rhs`` for ``<``/``<=``, ``rhs - lhs`` for ``>``/``>=``: the relation is ``value < 0``."""
    diff = _difference(rel, env)
    return diff if rel.op in ("<", "<=") else -diff


def _lone_variable(a: Answer) -> bool:
    return isinstance(a, Scalar) and a.expr.tree[0] == "var"


def _choice(gold: Choice, pred: Answer, tol) -> bool:
    return isinstance(pred, Choice) and pred.letter == gold.letter


def _text(gold: Text, pred: Answer, tol) -> bool | None:
    if isinstance(pred, Text):
        return pred.text == gold.text
    return None


_HANDLERS = {
    Scalar: _scalar, Infinity: _infinity, Seq: _seq, Interval: _interval, Union_: _union, Matrix: _matrix,
    Relation: _relation, Choice: _choice, Text: _text,
}

__all__ = ["Tolerance", "compare", "values_equal", "TooLarge"]
