"""``countdown``: does the completion's arithmetic expression reach the target with the given numbers?

Reference format (the ``countdown`` task suite produces exactly this)::

    {"numbers": [30, 100, 93], "target": 23}        # integers
    {"numbers": [...], "target": ..., "use_all": True}   # optional: every number exactly once

Extraction (``extract="auto"``): the content of the last closed ``<answer>...</answer>``, else of
the last ``\\boxed{...}``, else the last non-empty line (where the expression is the last run of
arithmetic characters). Inside the chosen text an equation is reduced to its side that has an
operator (``30 - (100 - 93) = 23`` -> ``30 - (100 - 93)``); ``\\times``, ``\\cdot``, ``×`` and
``\\div``, ``÷`` read as ``*`` and ``/``.

Evaluation: a recursive-descent parser over integer literals, ``+ - * /``, unary minus and
parentheses only, with exact rational arithmetic (:class:`fractions.Fraction`); never ``eval``.
No exponent exists, every literal must be one of the given numbers (so a hostile expression
cannot build huge values), and the text is bounded: at most :data:`MAX_EXPRESSION_CHARS`
characters and :data:`MAX_DEPTH` levels of nesting, or the answer is rejected (score 0).

score = 1.0 when the expression uses each given number at most once (exactly once with
``use_all``), is well formed, and equals the target; else 0.0 with ``info["reason"]``. A broken
reference is ``status="error"``. Linear time in the completion's length.

Example::

    from rlvr.verifiers import get_verifier
    get_verifier("countdown").score("<answer>30 - (100 - 93)</answer>", {"numbers": [30, 100, 93], "target": 23}).score  # 1.0
"""

from __future__ import annotations

import re
import time
from collections import Counter
from fractions import Fraction

from rlvr.verifiers.base import Reward, Verifier
from rlvr.verifiers.golden import probes
from rlvr.verifiers.registry import register_verifier

MAX_EXPRESSION_CHARS = 1000  # longer "expressions" are not answers (runaway or hostile output)
MAX_DEPTH = 100  # parentheses / unary-minus nesting; keeps the recursive parser far from Python's limit
MAX_LITERAL_DIGITS = 30
EXTRACT_MODES = ("auto", "answer_tag", "boxed", "last_line")

_REPLACEMENTS = [
    ("\\times", "*"), ("\\cdot", "*"), ("\\ast", "*"), ("×", "*"), ("·", "*"), ("∗", "*"),
    ("\\div", "/"), ("÷", "/"), ("−", "-"), ("–", "-"), ("\\left", ""), ("\\right", ""),
    ("\\(", ""), ("\\)", ""), ("$", ""), ("[", "("), ("]", ")"), ("{", "("), ("}", ")"),
]
_NOT_EXPRESSION = re.compile(r"[^0-9+\-*/() \t]+")
_OPERATOR = re.compile(r"[0-9)]\s*[+\-*/]")


class ExpressionError(ValueError):
    """The text is not a well-formed expression over the given numbers (the message says why)."""


# --------------------------------------------------------------------------- extraction

def _last_tag(text: str, tag: str = "answer") -> str | None:
    close = text.rfind(f"</{tag}>")
    if close < 0:
        return None
    open_ = text.rfind(f"<{tag}>", 0, close)
    return None if open_ < 0 else text[open_ + len(tag) + 2: close]


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[start + len("\\boxed{"): i - 1] if depth == 0 else None


def normalize(text: str) -> str:
    """Map LaTeX / Unicode operators to ASCII and drop math-mode dressing."""
    for old, new in _REPLACEMENTS:
        text = text.replace(old, new)
    return text.strip().rstrip(".").strip()


def pick_side(text: str) -> str:
    """The part of an equation that is the expression: the first ``=``-separated part with an operator."""
    if "=" not in text:
        return text
    parts = [p.strip() for p in text.split("=")]
    return next((p for p in parts if _OPERATOR.search(p)), parts[0])


def extract_expression(completion: str, mode: str = "auto") -> tuple[str | None, str]:
    """``(expression text or None, where it came from)`` (see the module docstring)."""
    found, source = None, "none"
    if mode in ("auto", "answer_tag"):
        found, source = _last_tag(completion), "answer_tag"
    if found is None and mode in ("auto", "boxed"):
        found, source = _last_boxed(completion), "boxed"
    if found is None and mode in ("auto", "last_line"):
        lines = [line for line in completion.strip().split("\n") if line.strip()]
        found, source = (lines[-1], "last_line") if lines else (None, "none")
    if found is None:
        return None, "none"
    if len(found) > 4 * MAX_EXPRESSION_CHARS:
        return found, source  # far too long to be an answer: tokenize() rejects it without more work
    side = pick_side(normalize(found))
    if source == "last_line":  # prose around the expression: keep the last run of arithmetic characters
        runs = [r.strip() for r in _NOT_EXPRESSION.split(side) if any(c.isdigit() for c in r)]
        runs = [r for r in runs if _OPERATOR.search(r)] or runs
        if not runs:
            return None, "none"
        side = runs[-1]
    return side, source


# --------------------------------------------------------------------------- parsing

def tokenize(text: str) -> list[str]:
    """Integer literals, operators and parentheses; anything else is an :class:`ExpressionError`."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    tokens, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch in "+-*/()":
            tokens.append(ch)
            i += 1
        elif ch.isdigit() and ch.isascii():
            j = i
            while j < len(text) and text[j].isdigit() and text[j].isascii():
                j += 1
            if j < len(text) and text[j] == ".":
                raise ExpressionError("only whole numbers may appear in the expression")
            if j - i > MAX_LITERAL_DIGITS:
                raise ExpressionError("number literal too long")
            tokens.append(text[i:j])
            i = j
        else:
            raise ExpressionError(f"unexpected character {ch!r}")
    if not tokens:
        raise ExpressionError("empty expression")
    return tokens


class _Parser:
    """expr := term (('+'|'-') term)* ; term := unary (('*'|'/') unary)* ;
    unary := ('+'|'-') unary | atom ; atom := INT | '(' expr ')'"""

    def __init__(self, tokens: list[str]):
        self.tokens, self.pos, self.depth = tokens, 0, 0
        self.literals: list[int] = []

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ExpressionError("expression ends too early")
        self.pos += 1
        return token

    def parse(self) -> Fraction:
        value = self.expr()
        if self.peek() is not None:
            raise ExpressionError(f"unexpected {self.peek()!r} after a complete expression")
        return value

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek() in ("*", "/"):
            op = self.take()
            rhs = self.unary()
            if op == "*":
                value *= rhs
            elif rhs == 0:
                raise ExpressionError("division by zero")
            else:
                value /= rhs
        return value

    def unary(self) -> Fraction:
        if self.peek() in ("+", "-"):
            op = self.take()
            self.enter()
            value = self.unary()
            self.depth -= 1
            return -value if op == "-" else value
        return self.atom()

    def atom(self) -> Fraction:
        token = self.take()
        if token == "(":
            self.enter()
            value = self.expr()
            self.depth -= 1
            if self.take() != ")":
                raise ExpressionError("unbalanced parentheses")
            return value
        if token.isdigit():
            self.literals.append(int(token))
            return Fraction(int(token))
        raise ExpressionError(f"unexpected {token!r}")

    def enter(self) -> None:
        """One level deeper (a parenthesis or a unary sign); an error aborts the whole parse,
        so leaving a level needs no cleanup on failure."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExpressionError(f"nested deeper than {MAX_DEPTH} levels")


def evaluate(text: str) -> tuple[Fraction, list[int]]:
    """The exact value of ``text`` and the integer literals it uses, in order."""
    parser = _Parser(tokenize(text))
    return parser.parse(), parser.literals


def check_numbers(used: list[int], numbers: list[int], use_all: bool) -> str | None:
    """Why ``used`` breaks the rules for ``numbers``, or None when it keeps them."""
    given, taken = Counter(numbers), Counter(used)
    extra = taken - given
    if extra:
        number, _ = sorted(extra.items())[0]
        if number not in given:
            return f"uses {number}, which is not one of the given numbers"
        return f"uses {number} {taken[number]} times, but it is given {given[number]} time(s)"
    if use_all and taken != given:
        missing = sorted((given - taken).elements())
        return f"does not use every number (missing {missing})"
    return None


# --------------------------------------------------------------------------- the verifier

def _check_reference(reference: object) -> str | None:
    if not isinstance(reference, dict):
        return f"reference must be a dict, got {type(reference).__name__}"
    numbers, target = reference.get("numbers"), reference.get("target")
    if not isinstance(numbers, list) or not numbers or not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
        return "reference['numbers'] must be a non-empty list of int"
    if not isinstance(target, int) or isinstance(target, bool):
        return "reference['target'] must be an int"
    if "use_all" in reference and not isinstance(reference["use_all"], bool):
        return "reference['use_all'] must be a bool"
    return None


@register_verifier("countdown")
class CountdownVerifier(Verifier):
    """Exact check of a Countdown answer (see the module docstring).

    Args:
        use_all: every given number must be used exactly once (default: at most once). A
            reference's own ``use_all`` wins over this option.
        extract: ``auto`` (answer tag, then box, then last line), ``answer_tag``, ``boxed`` or
            ``last_line`` (only that source).
    """

    name = "countdown"
    description = "an expression over + - * / and parentheses that uses the given numbers at most once and equals the target"

    audit_reference = {"numbers": [30, 100, 93], "target": 23}

    def __init__(self, use_all: bool = False, extract: str = "auto"):
        if extract not in EXTRACT_MODES:
            raise ValueError(f"countdown: extract must be one of {EXTRACT_MODES}, got {extract!r}")
        self.use_all, self.extract = bool(use_all), extract

    def audit_cases(self) -> list[dict]:
        """Golden answers and reward hacks for ``rlvr verifiers audit countdown`` (see verifiers.golden)."""
        cases = [
            ("golden", "<answer>30 - (100 - 93)</answer>", "accept"),
            ("golden", "<think>100-93=7, 30-7=23</think>\n<answer>30 - (100 - 93) = 23</answer>", "accept"),
            ("golden", "So the expression is $\\boxed{93 + 30 - 100}$.", "accept"),
            ("golden", "30 - (100 - 93) = 23", "accept"),
            ("golden", "<answer>30 × (100 − 93) ÷ 7 - 7</answer>", "reject"),  # 7 is not given
            ("golden", "<answer>100 - 93 + 30</answer>", "reject"),  # 37
            ("hedging", "<answer>30 - (100 - 93)</answer> or maybe <answer>100 - 93</answer>", "reject"),
            ("hack", "<answer>23</answer>", "reject"),
            ("hack", "<answer>30 - 7</answer>", "reject"),
            ("hack", "<answer>30 - (100 - 93) + 30 - 30</answer>", "reject"),
            ("hack", "<answer>__import__('os').system('true') or 23</answer>", "reject"),
            ("hack", "<answer>(30 - (100 - 93)) ** 1</answer>", "reject"),
            ("hack", "<answer>23.0</answer>", "reject"),
            ("hack", "<answer>30 - (100 - 93) if True else 0</answer>", "reject"),
        ]
        return probes(cases, self.audit_reference)

    def score(self, completion: str, reference: dict) -> Reward:
        start = time.perf_counter()
        problem = _check_reference(reference)
        if problem is not None:
            return Reward(0.0, status="error", latency_s=time.perf_counter() - start,
                          info={"error": problem, "extracted": None})
        text, source = extract_expression(completion if isinstance(completion, str) else "", self.extract)
        info: dict = {"extracted": text, "source": source}
        if text is None:
            info["reason"] = "no expression found"
            return Reward(0.0, latency_s=time.perf_counter() - start, info=info)
        use_all = reference.get("use_all", self.use_all)
        try:
            value, used = evaluate(text)
        except (ExpressionError, RecursionError) as exc:
            info["reason"] = f"not a valid expression: {exc}"
            return Reward(0.0, latency_s=time.perf_counter() - start, info=info)
        info["value"] = str(value)
        broken = check_numbers(used, reference["numbers"], use_all)
        if broken:
            info["reason"] = broken
            return Reward(0.0, latency_s=time.perf_counter() - start, info=info)
        if value != reference["target"]:
            info["reason"] = f"evaluates to {value}, not {reference['target']}"
            return Reward(0.0, latency_s=time.perf_counter() - start, info=info)
        return Reward(1.0, latency_s=time.perf_counter() - start, info=info)
