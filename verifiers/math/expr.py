"""A small, safe parser and evaluator for answer expressions, in LaTeX or plain text.

It reads what final answers are made of — numbers, ``\\frac``, ``\\sqrt[n]{}``, powers, ``\\pi``,
``e``, ``i``, variables, ``!``, ``\\binom``, ``|x|``, trig/log functions, implicit multiplication,
mixed numbers (``1\\frac{4}{5}``), plain ``sqrt(3)`` / ``pi/2`` / ``(x+1)/(x-1)`` — into a tiny tree,
and :mod:`verifiers.math.evaluate` computes its value either *exactly* (``fractions.Fraction``) or,
once something irrational appears, as a ``complex``. Two answers are then compared by value (see
:mod:`verifiers.math.equivalence`), which decides the ordinary case in well under a millisecond
and leaves sympy for the rest.

Nothing is ``eval``-ed: the input is untrusted model output. Every costly operation is bounded
(token count, nesting depth, result size of powers, factorials and binomials), so hostile input
raises :class:`TooLarge` / :class:`ParseError` at once instead of hanging.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Union

Value = Union[Fraction, complex]

MAX_TOKENS = 2_000
MAX_DEPTH = 60
MAX_BITS = 64_000  # exact results beyond ~19,000 digits are refused (power towers, giant factorials)
MAX_FACTORIAL = 5_000


class ParseError(ValueError):
    """The string is not an expression this parser understands (sympy may still)."""


class TooLarge(ValueError):
    """Evaluating the expression would need unbounded time or memory."""


class EvalError(ValueError):
    """The expression has no value at this point (division by zero, domain error)."""


# ----------------------------------------------------------------------------- tokens

_TOKEN_RE = re.compile(
    r"(?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+(?![\d.]))?)"
    r"|(?P<cmd>\\[a-zA-Z]+|\\[{}|])"
    r"|(?P<word>[a-zA-Z]+)"
    r"|(?P<op>\*\*|>=|<=|!=|[-+*/^!()\[\]{},|_=<>'])"
    r"|(?P<ws>\s+)"
)
FUNCTIONS = {
    "sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
    "log", "ln", "lg", "exp", "sqrt", "floor", "ceil", "abs",
}
_PLAIN_ALIASES = {"asin": "arcsin", "acos": "arccos", "atan": "arctan"}
CONSTANTS = {"pi": "pi", "infty": "inf", "infinity": "inf", "inf": "inf"}
# Short English words that must not be read as a product of single-letter variables.
_STOPWORDS = {"and", "or", "the", "is", "are", "of", "to", "in", "no", "not", "yes", "nor", "for", "all",
              "any", "but", "so", "if", "be", "as", "at", "by", "on", "it", "an", "we", "its", "has", "was"}
_GREEK = {
    "alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta", "vartheta", "iota",
    "kappa", "lambda", "mu", "nu", "xi", "rho", "sigma", "tau", "upsilon", "phi", "varphi", "chi", "psi",
    "omega", "Gamma", "Delta", "Theta", "Lambda", "Xi", "Sigma", "Phi", "Psi", "Omega",
}


def tokenize(s: str) -> list[tuple[str, str]]:
    """Split ``s`` into ``(kind, text)`` tokens: num, var, const, func, cmd, op."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    n = len(s)
    while pos < n:
        m = _TOKEN_RE.match(s, pos)
        if not m:
            raise ParseError(f"unexpected character {s[pos]!r}")
        pos = m.end()
        kind = m.lastgroup
        text = m.group(kind)
        if kind == "ws":
            continue
        if kind == "word":
            tokens.extend(_split_word(text))
        elif kind == "cmd":
            name = text[1:]
            if name in FUNCTIONS:
                tokens.append(("func", name))
            elif name in CONSTANTS:
                tokens.append(("const", CONSTANTS[name]))
            elif name in _GREEK:
                tokens.append(("var", name))
            else:
                tokens.append(("cmd", name))
        else:
            tokens.append((kind, text))
        if len(tokens) > MAX_TOKENS:
            raise TooLarge("expression has too many tokens")
    return tokens


def _split_word(word: str) -> list[tuple[str, str]]:
    """A run of letters: a known function or constant name, else single-letter variables (``xy`` = x*y)."""
    lower = word.lower()
    if lower in FUNCTIONS or lower in _PLAIN_ALIASES:
        return [("func", _PLAIN_ALIASES.get(lower, lower))]
    if lower in CONSTANTS:
        return [("const", CONSTANTS[lower])]
    for name in sorted(FUNCTIONS | set(CONSTANTS), key=len, reverse=True):  # e.g. "2pi" "sqrtx" "xsqrt"
        if len(name) > 1 and lower.startswith(name) and len(word) > len(name):
            return _split_word(word[: len(name)]) + _split_word(word[len(name):])
    if len(word) > 3 or lower in _STOPWORDS:
        raise ParseError(f"word {word!r} is not math")
    return [("var", c) for c in word]


# ----------------------------------------------------------------------------- tree
# Nodes are tuples: ("num", Fraction, is_decimal) ("var", name) ("const", name) ("add", a, b)
# ("sub", a, b) ("mul", a, b) ("div", a, b) ("neg", a) ("pow", a, b) ("func", name, arg, base)
# ("fact", a) ("binom", n, k) ("root", x, n) ("frac", a, b) for a \frac (kept apart for mixed numbers).


@dataclass(frozen=True)
class Expr:
    """A parsed expression: its tree, free variables and whether a decimal literal appears."""

    tree: tuple
    variables: frozenset
    decimal: bool
    text: str = ""


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens = tokens
        self.i = 0
        self.depth = 0
        self.variables: set[str] = set()
        self.decimal = False

    # -- helpers
    def peek(self, offset: int = 0) -> tuple[str, str] | None:
        j = self.i + offset
        return self.tokens[j] if j < len(self.tokens) else None

    def next(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise ParseError("unexpected end of expression")
        self.i += 1
        return tok

    def accept(self, text: str) -> bool:
        tok = self.peek()
        if tok is not None and tok[0] == "op" and tok[1] == text:
            self.i += 1
            return True
        return False

    def expect(self, text: str) -> None:
        if not self.accept(text):
            raise ParseError(f"expected {text!r} at token {self.i}")

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise TooLarge("expression is nested too deeply")

    # -- grammar
    def parse(self) -> tuple:
        node = self.expr()
        if self.i != len(self.tokens):
            raise ParseError(f"unexpected token {self.tokens[self.i][1]!r}")
        return node

    def expr(self) -> tuple:
        self.enter()
        node = self.term()
        while True:
            if self.accept("+"):
                node = ("add", node, self.term())
            elif self.accept("-"):
                node = ("sub", node, self.term())
            else:
                break
        self.depth -= 1
        return node

    def term(self) -> tuple:
        node = self.unary()
        while True:
            tok = self.peek()
            if tok is None:
                break
            if tok == ("op", "*"):
                self.i += 1
                node = ("mul", node, self.unary())
            elif tok == ("op", "/"):
                self.i += 1
                node = ("div", node, self.unary())
            elif self._starts_atom(tok):
                rhs = self.power()
                if _is_mixed_number(node, rhs):  # 1\frac{4}{5} is 1 + 4/5, not 4/5
                    node = ("add", node, rhs)
                else:
                    node = ("mul", node, rhs)
            else:
                break
        return node

    @staticmethod
    def _starts_atom(tok: tuple[str, str]) -> bool:
        kind, text = tok
        if kind in ("num", "var", "const", "func"):
            return True
        if kind == "cmd":
            return text in ("frac", "sqrt", "binom", "lfloor", "lceil")
        return kind == "op" and text in ("(", "{", "[")

    def unary(self) -> tuple:
        if self.accept("-"):
            self.enter()
            node = ("neg", self.unary())
            self.depth -= 1
            return node
        if self.accept("+"):
            return self.unary()
        return self.power()

    def power(self) -> tuple:
        base = self.postfix()
        if self.accept("^") or self.accept("**"):
            self.enter()
            exponent = self.group() if self.peek() == ("op", "{") else self.unary()
            self.depth -= 1
            return ("pow", base, exponent)
        return base

    def postfix(self) -> tuple:
        node = self.atom()
        while self.accept("!"):
            node = ("fact", node)
        return node

    def group(self) -> tuple:
        """``{ expr }``"""
        self.expect("{")
        node = self.expr()
        self.expect("}")
        return node

    def latex_arg(self) -> tuple:
        """A LaTeX macro argument: ``{...}`` or a single token (``\\frac12`` reads 1 and 2)."""
        tok = self.peek()
        if tok == ("op", "{"):
            return self.group()
        if tok is None:
            raise ParseError("missing argument")
        if tok[0] == "num" and len(tok[1]) > 1 and tok[1].isdigit():
            self.tokens[self.i] = ("num", tok[1][1:])
            return ("num", Fraction(int(tok[1][0])), False)
        if tok[0] in ("num", "var", "const"):
            return self.atom()
        raise ParseError("bad macro argument")

    def atom(self) -> tuple:
        self.enter()
        kind, text = self.next()
        node: tuple
        if kind == "num":
            node = self._number(text)
        elif kind == "var":
            node = self._variable(text)
        elif kind == "const":
            node = ("const", text)
        elif kind == "func":
            node = self._function(text)
        elif kind == "cmd":
            node = self._command(text)
        elif (kind, text) == ("op", "("):
            node = self.expr()
            self.expect(")")
        elif (kind, text) == ("op", "["):
            node = self.expr()
            self.expect("]")
        elif (kind, text) == ("op", "{"):
            node = self.expr()
            self.expect("}")
        elif (kind, text) == ("op", "|"):
            node = ("func", "abs", self.expr(), None)
            self.expect("|")
        else:
            raise ParseError(f"unexpected token {text!r}")
        self.depth -= 1
        return node

    def _number(self, text: str) -> tuple:
        mantissa, _, exponent = text.lower().partition("e")
        is_decimal = "." in mantissa or bool(exponent)
        self.decimal = self.decimal or is_decimal
        value = Fraction(mantissa.rstrip(".") or "0")
        if exponent:
            e = int(exponent)
            if abs(e) > 400:
                raise TooLarge("scientific exponent out of range")
            value *= Fraction(10) ** e
        return ("num", value, is_decimal)

    def _variable(self, name: str) -> tuple:
        if name in ("e", "i") and not self._subscript_follows():
            return ("const", name)
        if self.accept("_"):  # a_1, x_{n+1}: the subscript is part of the name, not a variable of its own
            tok = self.next()
            if tok == ("op", "{"):
                depth, parts = 1, []
                while True:
                    t = self.next()
                    depth += t == ("op", "{")
                    depth -= t == ("op", "}")
                    if depth == 0:
                        break
                    parts.append(t[1])
                name += "_" + "".join(parts)
            else:
                name += "_" + tok[1]
        self.variables.add(name)
        return ("var", name)

    def _subscript_follows(self) -> bool:
        return self.peek() == ("op", "_")

    def _function(self, name: str) -> tuple:
        base = None
        power = None
        if name == "sqrt":
            return self._command("sqrt")
        if self.accept("_"):  # \log_2 x, \log_{10} x
            base = self.latex_arg()
        if self.accept("^"):  # \sin^2 x
            power = self.latex_arg() if self.peek() != ("op", "(") else self.atom()
        tok = self.peek()
        if tok in (("op", "("), ("op", "{"), ("op", "[")):
            arg = self.atom()
        else:  # \sin 2x: the argument runs over the following numbers and variables
            arg = self.power()
            while self.peek() is not None and self.peek()[0] in ("num", "var", "const"):
                arg = ("mul", arg, self.power())
        node = ("func", name, arg, base)
        return ("pow", node, power) if power is not None else node

    def _command(self, name: str) -> tuple:
        if name == "frac":
            return ("frac", self.latex_arg(), self.latex_arg())
        if name == "sqrt":
            index = None
            if self.accept("["):
                index = self.expr()
                self.expect("]")
            arg = self.latex_arg() if self.peek() != ("op", "(") else self.atom()
            return ("root", arg, index)
        if name == "binom":
            return ("binom", self.latex_arg(), self.latex_arg())
        if name in ("lfloor", "lceil"):
            inner = self.expr()
            closing = self.next()
            if closing != ("cmd", "rfloor" if name == "lfloor" else "rceil"):
                raise ParseError("unbalanced floor/ceil")
            return ("func", "floor" if name == "lfloor" else "ceil", inner, None)
        raise ParseError(f"unsupported command \\{name}")


def _is_mixed_number(left: tuple, right: tuple) -> bool:
    return (
        left[0] == "num" and not left[2] and left[1].denominator == 1 and left[1] >= 0
        and right[0] == "frac" and right[1][0] == "num" and right[2][0] == "num"
        and not right[1][2] and not right[2][2] and 0 < right[1][1] < right[2][1]
    )


def parse_expr(text: str) -> Expr:
    """Parse one expression; raises :class:`ParseError` or :class:`TooLarge`."""
    if len(text) > 4 * MAX_TOKENS:
        raise TooLarge("expression is too long")
    tokens = tokenize(text)
    if not tokens:
        raise ParseError("empty expression")
    parser = _Parser(tokens)
    tree = parser.parse()
    return Expr(tree, frozenset(parser.variables), parser.decimal, text)
