"""Evaluate a parsed answer expression (:mod:`verifiers.math.expr`) exactly or numerically.

Values stay ``fractions.Fraction`` while the arithmetic is rational (``\\frac{1}{2} + \\frac13`` is
exactly 5/6, ``2^{-98}`` is exact) and become ``complex`` once something irrational appears
(``\\sqrt{2}``, ``\\pi``, ``\\sin``); variables take the values given in ``env``. Every operation that
could run away is bounded: exact powers, factorials and binomials beyond ~19,000 digits raise
:class:`~verifiers.math.expr.TooLarge`; float overflow and underflow are reported instead of
silently becoming ``inf`` or ``0``.
"""

from __future__ import annotations

import cmath
import math
from fractions import Fraction

from rlvr.verifiers.math.expr import MAX_BITS, MAX_FACTORIAL, EvalError, TooLarge, Value

def evaluate(tree: tuple, env: dict[str, complex] | None = None) -> Value:
    """The value of ``tree``: a ``Fraction`` while the arithmetic stays rational, else a ``complex``.

    Raises :class:`EvalError` where the expression has no value and :class:`TooLarge` where computing
    it would be unbounded (including float overflow and trees too deep to recurse).
    """
    try:
        return _eval(tree, env)
    except (OverflowError, RecursionError, MemoryError) as exc:
        raise TooLarge(f"evaluation failed: {type(exc).__name__}") from exc
    except (ZeroDivisionError, ValueError, TypeError) as exc:
        if isinstance(exc, (EvalError, TooLarge)):
            raise
        raise EvalError(str(exc)) from exc


def _eval(tree: tuple, env: dict[str, complex] | None) -> Value:
    kind = tree[0]
    if kind == "num":
        return tree[1]
    if kind == "var":
        if env is None or tree[1] not in env:
            raise EvalError(f"free variable {tree[1]}")
        return env[tree[1]]
    if kind == "const":
        if tree[1] == "pi":
            return complex(math.pi)
        if tree[1] == "e":
            return complex(math.e)
        if tree[1] == "i":
            return 1j
        raise EvalError("infinity has no finite value")
    if kind in ("add", "sub", "mul", "div", "frac"):
        a = _eval(tree[1], env)
        b = _eval(tree[2], env)
        return _arith(kind, a, b)
    if kind == "neg":
        return -_eval(tree[1], env)
    if kind == "pow":
        return _power(_eval(tree[1], env), _eval(tree[2], env))
    if kind == "root":
        index = _eval(tree[2], env) if tree[2] is not None else Fraction(2)
        return _root(_eval(tree[1], env), index)
    if kind == "fact":
        return _factorial(_eval(tree[1], env))
    if kind == "binom":
        return _binomial(_eval(tree[1], env), _eval(tree[2], env))
    if kind == "func":
        base = _eval(tree[3], env) if tree[3] is not None else None
        return _function(tree[1], _eval(tree[2], env), base)
    raise EvalError(f"unknown node {kind}")


def _arith(kind: str, a: Value, b: Value) -> Value:
    if kind == "add":
        return a + b
    if kind == "sub":
        return a - b
    if kind == "mul":
        if isinstance(a, Fraction) and isinstance(b, Fraction):
            if _bits(a) + _bits(b) > MAX_BITS:
                raise TooLarge("product too large")
        return a * b
    if b == 0:
        raise EvalError("division by zero")
    return a / b


def _bits(x: Fraction) -> int:
    return max(x.numerator.bit_length(), x.denominator.bit_length())


def _power(a: Value, b: Value) -> Value:
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        if b.denominator == 1:
            e = int(b)
            if a == 0 and e < 0:
                raise EvalError("zero to a negative power")
            if abs(a) != 1 and a != 0 and abs(e) * _bits(a) > MAX_BITS:
                raise TooLarge("power too large")
            return a ** e
        if a >= 0:
            root = _exact_root(a, b.denominator)
            if root is not None:
                return _power(root, Fraction(b.numerator))
    try:
        za, zb = complex(a), complex(b)
        if za == 0:
            if zb.real > 0:
                return 0j
            raise EvalError("zero to a non-positive power")
        if za.imag == 0 and za.real < 0 and zb.imag == 0 and isinstance(b, Fraction) and b.denominator % 2 == 1:
            magnitude = abs(za.real) ** zb.real  # real odd root of a negative number: (-8)^(1/3) = -2
            result = complex(magnitude if b.numerator % 2 == 0 else -magnitude)
        else:
            result = za ** zb
    except (OverflowError, ZeroDivisionError) as exc:
        raise TooLarge("power overflows") from exc
    if result == 0:  # underflow: e^{-1000} and e^{-1001} would both read as 0
        raise EvalError("power underflows")
    return _finite(result)


def _exact_root(a: Fraction, n: int) -> Fraction | None:
    if n > 64:
        return None
    num = _int_root(a.numerator, n)
    den = _int_root(a.denominator, n)
    return Fraction(num, den) if num is not None and den is not None else None


def _int_root(x: int, n: int) -> int | None:
    if x.bit_length() > MAX_BITS:
        return None
    r = round(x ** (1.0 / n)) if x.bit_length() < 1000 else math.isqrt(x) if n == 2 else None
    if r is None:
        return None
    for cand in (r - 1, r, r + 1):
        if cand >= 0 and cand ** n == x:
            return cand
    return None


def _root(x: Value, index: Value) -> Value:
    if isinstance(index, Fraction) and index.denominator == 1 and index > 0:
        n = int(index)
        if isinstance(x, Fraction):
            if x >= 0:
                exact = _exact_root(x, n)
                if exact is not None:
                    return exact
            elif n % 2 == 1:
                exact = _exact_root(-x, n)
                return -exact if exact is not None else complex(-(float(-x) ** (1.0 / n)))
        return _power(x, Fraction(1, n))
    return _power(x, _arith("div", Fraction(1), index))


def _factorial(x: Value) -> Value:
    if isinstance(x, Fraction) and x.denominator == 1 and x >= 0:
        if x > MAX_FACTORIAL:
            raise TooLarge("factorial too large")
        return Fraction(math.factorial(int(x)))
    raise EvalError("factorial of a non-integer")


def _binomial(n: Value, k: Value) -> Value:
    if all(isinstance(v, Fraction) and v.denominator == 1 for v in (n, k)):
        n_int, k_int = int(n), int(k)
        if n_int < 0 or k_int < 0:
            raise EvalError("binomial of a negative number")
        if min(k_int, max(n_int - k_int, 0)) * max(n_int, 2).bit_length() > MAX_BITS:
            raise TooLarge("binomial too large")
        return Fraction(math.comb(n_int, k_int))
    raise EvalError("binomial of a non-integer")


_CFUNCS = {
    "sin": cmath.sin, "cos": cmath.cos, "tan": cmath.tan, "arcsin": cmath.asin, "arccos": cmath.acos,
    "arctan": cmath.atan, "sinh": cmath.sinh, "cosh": cmath.cosh, "tanh": cmath.tanh, "exp": cmath.exp,
}


def _function(name: str, x: Value, base: Value | None) -> Value:
    if name == "abs":
        return abs(x) if isinstance(x, Fraction) else complex(abs(x))
    if name in ("floor", "ceil"):
        if isinstance(x, Fraction):
            return Fraction(math.floor(x) if name == "floor" else math.ceil(x))
        if x.imag != 0 or not math.isfinite(x.real):
            raise EvalError("floor of a complex number")
        return Fraction(math.floor(x.real) if name == "floor" else math.ceil(x.real))
    if name == "sqrt":
        return _root(x, Fraction(2))
    z = complex(x)
    try:
        if name in ("log", "ln", "lg"):
            if z == 0:
                raise EvalError("log of zero")
            value = cmath.log(z)
            if base is not None:
                value /= cmath.log(complex(base))
            elif name == "lg":
                value /= math.log(10)
            return _finite(value)
        if name in ("cot", "sec", "csc"):
            inner = {"cot": cmath.tan, "sec": cmath.cos, "csc": cmath.sin}[name](z)
            if inner == 0:
                raise EvalError(f"{name} undefined")
            return _finite(1 / inner)
        value = _CFUNCS[name](z)
        if name == "exp" and value == 0:
            raise EvalError("exp underflows")
        return _finite(value)
    except (OverflowError, ValueError, ZeroDivisionError) as exc:
        if isinstance(exc, EvalError):
            raise
        raise EvalError(f"{name} undefined here") from exc


def _finite(z: complex) -> complex:
    if not (math.isfinite(z.real) and math.isfinite(z.imag)):
        raise TooLarge("value overflows")
    return z
