"""Inequalities as intervals: ``x > 3`` is ``(3, oo)``, ``2x + 4 >= 0`` is ``[-2, oo)``, ``0 < f(x) < 1`` is
``(0, 1)`` and ``1 <= |z| <= 2`` is ``[-2, -1] \\cup [1, 2]``; and which left sides only name a quantity
(``f(x) = 1`` states the value 1)."""

from __future__ import annotations

import re
from fractions import Fraction

from rlvr.verifiers.math.evaluate import evaluate
from rlvr.verifiers.math.expr import EvalError, Expr, TooLarge
from rlvr.verifiers.math.shapes import Answer, Infinity, Interval, Relation, Scalar, Union_, Unparsed

_SUBSCRIPT_RE = re.compile(r"_\s*(?:\{[^{}]*\}|\w)")
_LABEL_RE = re.compile(r"^[A-Za-z\\(){}|:,\s']+$")  # f(x), |AB|, A:B, (p, q), \frac{NO}{BO}, m\angle BAC


def is_label(text: str) -> bool:
    """A left side that names a quantity (:class:`Relation` ``named``): letters, brackets, bars and colons,
    no digits outside subscripts, no sum or difference."""
    bare = _SUBSCRIPT_RE.sub("", text).strip()
    return bool(bare) and bool(_LABEL_RE.match(bare)) and bool(re.search(r"[A-Za-z]", bare)) \
        and not re.search(r"\\(?:sqrt|pi|infty|sum|int|prod|lim)(?![a-zA-Z])", bare)


def relation_as_interval(rel: Relation) -> Answer | None:
    """An inequality in one variable with a bound in other variables (``x > a``) as the interval
    ``(a, oo)``; None when it is not one."""
    return half_line(rel.lhs, rel.op, rel.rhs, variable_bound=True)


def half_line(lhs: Answer, op: str, rhs: Answer, *, variable_bound: bool = False) -> Answer | None:
    """``x > 3`` -> ``(3, oo)``; ``x <= -1`` -> ``(-oo, -1]``; ``3 < x`` -> ``(3, oo)``; a linear
    inequality in one variable is solved first (``-x > -1`` -> ``x < 1``, ``2x + 4 >= 0`` -> ``x >= -2``)."""
    if op == "=":
        return None
    if op == "!=":  # x != 2: every real number but 2
        if _is_variable(lhs) and isinstance(rhs, Scalar):
            return Union_((Interval(Infinity(-1), rhs, False, False), Interval(rhs, Infinity(1), False, False)))
        return None
    var_left = _is_variable(lhs)
    if not var_left and not _is_variable(rhs):
        solved = _solve_linear(lhs, op, rhs)
        if solved is None:
            return None
        lhs, op, rhs = solved
        var_left = True
    bound = rhs if var_left else lhs
    if not variable_bound and not _constant(bound) and not isinstance(bound, (Infinity, Unparsed)):
        return None  # y > -x stays an inequality (it is x + y > 0); x > a is compared as (a, oo) on demand
    upper = (op in ("<", "<=")) == var_left  # x < b: b is an upper bound; b < x: b is a lower bound
    closed = op in ("<=", ">=")
    if upper:
        return Interval(Infinity(-1), bound, False, closed)
    return Interval(bound, Infinity(1), closed, False)


_FLIP = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}


def _linear(a: Answer) -> tuple[str, Fraction, Fraction] | None:
    """``(x, k, b)`` when ``a`` is ``k*x + b`` in its one variable ``x`` with rational ``k != 0`` and ``b``
    (checked exactly at five points); None otherwise."""
    if not isinstance(a, Scalar) or len(a.expr.variables) != 1:
        return None
    (name,) = a.expr.variables
    points = (Fraction(0), Fraction(1), Fraction(2), Fraction(7), Fraction(1, 3))
    try:
        values = [evaluate(a.expr.tree, {name: t}) for t in points]
    except (EvalError, TooLarge):
        return None
    if not all(isinstance(v, Fraction) for v in values):
        return None
    b, k = values[0], values[1] - values[0]
    if k == 0 or any(v != b + k * t for v, t in zip(values, points)):
        return None
    return name, k, b


def _constant(a: Answer) -> bool:
    return isinstance(a, Scalar) and not a.expr.variables


def _solved_bound(c: Scalar, k: Fraction, b: Fraction) -> Scalar:
    """``(c - b) / k`` as an expression (exact, and ``c`` may be irrational)."""
    if b == 0 and k == 1:
        return c
    tree = c.expr.tree
    if b != 0:
        tree = ("sub", tree, ("num", b))
    if k != 1:
        tree = ("div", tree, ("num", k))
    return Scalar(Expr(tree, frozenset(), c.expr.decimal, ""), c.percent)


def _solve_linear(lhs: Answer, op: str, rhs: Answer) -> tuple[Answer, str, Answer] | None:
    """``lhs op rhs`` rewritten as ``x op' bound`` when it is linear in one variable ``x`` (dividing by
    a negative coefficient flips the sign); None otherwise."""
    left, right = _linear(lhs), _linear(rhs)
    if left and _constant(rhs):
        name, k, b = left
        bound = _solved_bound(rhs, k, b)
    elif right and _constant(lhs):
        name, k, b = right
        bound, op = _solved_bound(lhs, k, b), _FLIP[op]
    elif left and right and left[0] == right[0] and left[1] != right[1]:  # 3x + 1 < x + 5
        name, k, b = left[0], left[1] - right[1], left[2] - right[2]
        bound = _solved_bound(Scalar(Expr(("num", Fraction(0)), frozenset(), False, "0")), k, b)
    else:
        return None
    if k < 0:
        op = _FLIP[op]
    return Scalar(Expr(("var", name), frozenset({name}), False, name)), op, bound


def chain(lo: Answer, mid: Answer, hi: Answer, lo_closed: bool, hi_closed: bool, text: str) -> Answer:
    """``lo < mid < hi`` as an interval of the variable in ``mid`` (solved when ``mid`` is linear)."""
    if _is_variable(mid) or (_constant(lo) and _constant(hi) and _is_label_value(mid)):  # 0 < f(x) < 1
        return Interval(lo, hi, lo_closed, hi_closed)
    if _is_abs_variable(mid) and _constant(lo) and _constant(hi):  # 1 <= |z| <= 3/2: two intervals
        return _abs_chain(lo, hi, lo_closed, hi_closed, text)
    linear = _linear(mid)
    if linear is None or not _constant(lo) or not _constant(hi):
        return Unparsed(text, "chained relation of an expression")
    _, k, b = linear
    lo, hi = _solved_bound(lo, k, b), _solved_bound(hi, k, b)
    if k < 0:
        return Interval(hi, lo, hi_closed, lo_closed)
    return Interval(lo, hi, lo_closed, hi_closed)


def _is_label_value(a: Answer) -> bool:
    """A named quantity such as ``f(x)``: variables only, no number (``2x``), no sum (``x + 1``)."""
    if not isinstance(a, Scalar) or not a.expr.variables:
        return False
    return is_label(a.expr.text) and not _is_abs_variable(a)


def _is_abs_variable(a: Answer) -> bool:
    return isinstance(a, Scalar) and a.expr.tree[0] == "func" and a.expr.tree[1] == "abs" \
        and a.expr.tree[2][0] == "var"


def _negated(a: Scalar) -> Scalar:
    return Scalar(Expr(("neg", a.expr.tree), frozenset(), a.expr.decimal, f"-({a.expr.text})"), a.percent)


def _abs_chain(lo: Scalar, hi: Scalar, lo_closed: bool, hi_closed: bool, text: str) -> Answer:
    """``lo <= |z| <= hi`` (``0 <= lo``) as ``[-hi, -lo] \\cup [lo, hi]``; one interval when ``lo`` is 0 and
    included."""
    try:
        low = evaluate(lo.expr.tree)
    except (EvalError, TooLarge):
        return Unparsed(text, "chained relation of an absolute value")
    if not isinstance(low, Fraction) or low < 0:
        return Unparsed(text, "chained relation of an absolute value")
    if low == 0 and lo_closed:
        return Interval(_negated(hi), hi, hi_closed, hi_closed)
    return Union_((Interval(_negated(hi), _negated(lo), hi_closed, lo_closed), Interval(lo, hi, lo_closed, hi_closed)))


def _is_variable(a: Answer) -> bool:
    return isinstance(a, Scalar) and a.expr.tree[0] == "var"
