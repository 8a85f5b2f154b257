"""The shapes an answer can have, as :func:`verifiers.math.answer.parse_answer` reads them: a value, an
infinity, a sequence (tuple, set, list), an interval, a union, a matrix, a relation, a choice letter, a
word, or text only sympy may read."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Union

from rlvr.verifiers.math.expr import Expr


@dataclass(frozen=True)
class Scalar:
    """One expression (number, or a formula in variables); ``percent`` if written with ``%``.

    For a decimal literal, ``ulp`` is the unit in its last written place (``33.3`` -> 0.1,
    ``4.5e33`` -> 1e32) and ``sig`` its count of significant digits; both are None otherwise.
    """

    expr: Expr
    percent: bool = False
    ulp: Fraction | None = None
    sig: int | None = None


@dataclass(frozen=True)
class Infinity:
    sign: int  # +1 or -1


@dataclass(frozen=True)
class Seq:
    """Several values. ``kind``: ``tuple`` (ordered, in parentheses), ``set`` (``\\{...\\}``),
    ``list`` (bare commas: the order of listed solutions does not matter) or ``pm`` (from ``\\pm``)."""

    items: tuple
    kind: str


@dataclass(frozen=True)
class Interval:
    lo: object
    hi: object
    lo_closed: bool
    hi_closed: bool


@dataclass(frozen=True)
class Union_:
    """A union of intervals or sets (``\\cup``); the order of the parts does not matter."""

    items: tuple


@dataclass(frozen=True)
class Matrix:
    rows: tuple  # tuple of tuples of answers


@dataclass(frozen=True)
class Relation:
    """``lhs op rhs`` with op one of ``= != < <= > >=``. ``named``: the left side is a label, not a
    quantity to solve for (``f(x)``, ``|AB|``, ``A:B``, ``(p, q)``, ``\\frac{NO}{BO}``: letters, no
    digits outside subscripts, no sum), so ``label = value`` states the value."""

    lhs: object
    op: str
    rhs: object
    named: bool = False


@dataclass(frozen=True)
class Choice:
    letter: str


@dataclass(frozen=True)
class Text:
    """A word answer (``Evelyn``, ``east``, ``even``), compared case- and punctuation-insensitively."""

    text: str


@dataclass(frozen=True)
class Unparsed:
    """Not readable here; ``text`` is the normalised string for the sympy fallback."""

    text: str
    reason: str = ""


Answer = Union[Scalar, Infinity, Seq, Interval, Union_, Matrix, Relation, Choice, Text, Unparsed]
