"""The shape of an answer: a value, a tuple, a set, an interval, a matrix, an equation, a letter.

:func:`parse_answer` turns one answer string (gold or extracted) into a small typed object, so that
:mod:`verifiers.math.equivalence` can compare like with like: ``(1, 2)`` is an ordered pair,
``\\{1, 2\\}`` and ``1, 2`` are collections whose order does not matter, ``(3, 4]`` is an interval,
``1 \\pm \\sqrt{19}`` is the pair of its two values, ``x = 5`` is an equation whose right side may be
compared with ``5``, ``\\text{(C)}`` is a multiple-choice letter and ``\\text{Evelyn}`` is a word.

A chain ``x = 5 + 5 + 1 = 11`` is ``x = 11``; ``x = \\frac13 \\approx 0.33`` keeps the exact value
(``x \\approx 0.33`` alone is ``x = 0.33``); ``0 < f(x) < 1`` is the interval ``(0, 1)`` and
``1 \\le |z| \\le 2`` the union ``[-2, -1] \\cup [1, 2]``. ``{1, 2}`` without backslashes is a list
(LaTeX grouping braces), a set only when escaped. A gold may list its answers with "or" or
separate solutions with ";" (``p=5, q=2; p=7, q=2``). Against a plain-number gold, ``1000,99`` is
one number with a decimal comma; ``48, 120`` (a comma and a space) is always a list.

Anything the structural parser cannot read becomes :class:`Unparsed`, which the comparison hands
to sympy (via math-verify) instead of guessing.
"""

from __future__ import annotations

import re
from fractions import Fraction

from rlvr.verifiers.math.expr import ParseError, parse_expr
from rlvr.verifiers.math.inequalities import chain, half_line, is_label, relation_as_interval
from rlvr.verifiers.math.normalize import matching_brace, normalize
from rlvr.verifiers.math.shapes import (Answer, Choice, Infinity, Interval, Matrix, Relation, Scalar, Seq, Text,
                                        Union_, Unparsed)

__all__ = ["Answer", "Choice", "Infinity", "Interval", "Matrix", "Relation", "Scalar", "Seq", "Text", "Union_",
           "Unparsed", "is_label", "parse_answer", "relation_as_interval", "split_top", "split_top_relations",
           "strip_units"]

# Every matrix environment is the same matrix: pmatrix, bmatrix, Bmatrix, vmatrix, matrix, smallmatrix,
# the starred forms with their alignment option (\begin{pmatrix*}[r]) and array with any column spec.
_MATRIX_RE = re.compile(r"^\\begin\{((?:[pbBvV]?matrix|smallmatrix)\*?|array)\}(.*)\\end\{\1\}$", re.S)
_ALIGN_OPTION_RE = re.compile(r"^\s*\[[lcr]\]")
_INF_RE = re.compile(r"^([-+]?)\s*(?:\\infty|infinity|inf|oo)$", re.I)
_IN_RE = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?\s*\\in\s*")
_CHOICE_RE = re.compile(r"^\(?\s*([A-J])\s*\)?$")
_SCALE_WORDS = {"thousand": 3, "million": 6, "billion": 9, "trillion": 12}
_SCALE_RE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*(thousand|million|billion|trillion)\b", re.I)
_NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen".split())}
_NUMBER_WORDS.update({w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)})
_NUMBER_WORD_RE = re.compile(r"^(?:a|(%s)(?:[- ](%s))?)(?:\s+(hundred|thousand|million|billion))?$" % (
    "|".join(_NUMBER_WORDS), "one|two|three|four|five|six|seven|eight|nine"), re.I)
_THOUSANDS_RE = re.compile(r"^[-+]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?$|^[-+]?[1-9]\d{0,2}(?: \d{3})+(?:\.\d+)?$")
# A decimal comma (1000,99; 0,111): one comma that is not a thousands separator, read so for a numeric gold.
_DECIMAL_COMMA_RE = re.compile(r"^([-+]?\d+),(\d+)$")
_WORD_ANSWER_RE = re.compile(r"^[A-Za-z][A-Za-z' -]*[A-Za-z]$")  # "Odd", "no solution", "Evelyn"
_BRACKETED_ENV_RE = re.compile(r"^[(\[]\s*(\\begin\{.*\\end\{[a-zA-Z]+\})\s*[)\]]$", re.S)
_UNIT_CHARS_RE = re.compile(r"\^\s*\{?\s*-?\d+\s*\}?|\\mu|\\AA|\\odot|[/\s{}.*~\-]|\bper\b")
_RELATION_RE = re.compile(r"<=|>=|!=|=|<|>")
_WORDY_RE = re.compile(r"[A-Za-z]{3,}")
_LONE_NAME_RE = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?$")
MAX_ITEMS = 64
_MATH_WORDS = {"sin", "cos", "tan", "cot", "sec", "csc", "log", "exp", "sqrt", "inf", "abs"}


def parse_answer(raw: str, *, numeric_gold: bool = False) -> Answer:
    """Parse one answer string. ``numeric_gold`` (the gold is a plain number) lets ``1,234`` be a
    number and strips trailing units more aggressively (``5 m`` -> ``5``).

    Raises :class:`verifiers.math.expr.TooLarge` for input that would be unbounded to evaluate.
    """
    norm = normalize(raw)
    return _parse(norm.text, norm.percent, numeric_gold, depth=0)


def _parse(s: str, percent: bool, numeric_gold: bool, depth: int) -> Answer:
    s = s.strip()
    if depth > 8:
        return Unparsed(s, "nested too deeply")
    if not s:
        return Unparsed("", "empty")
    s = _IN_RE.sub("", s)
    sub = lambda t: _parse(t, percent, numeric_gold, depth + 1)  # noqa: E731

    m = _BRACKETED_ENV_RE.match(s)  # \left[ \begin{array}...\end{array} \right]
    if m:
        s = m.group(1)
    m = _MATRIX_RE.match(s)
    if m:
        return _matrix(m.group(1), m.group(2), sub)
    m = _INF_RE.match(s)
    if m:
        return Infinity(-1 if m.group(1) == "-" else 1)
    if s in ("\\emptyset", "\\varnothing", "\\{\\}", "\\{ \\}", "\\O"):
        return Seq((), "set")
    if s in ("\\mathbb{R}", "\\mathbb R", "\\R", "\\mathbf{R}"):
        return Interval(Infinity(-1), Infinity(1), False, False)

    parts = split_top(s, (" or ",))  # a gold that lists its answers with "or" ("21, 16 or 11", "x < 1 or x > 3")
    if len(parts) > 1:
        return _or_list([sub(p) for p in parts])

    parts = split_top(s, ("\\approx",))
    if len(parts) > 1:
        return sub(_approximation(parts))

    parts = split_top(s, ("\\cup",))
    if len(parts) > 1:
        return Union_(tuple(sub(p) for p in parts))

    if _THOUSANDS_RE.match(s):  # 11,111,111,100 (a comma with a space after it separates a list: 32, 349)
        return _scalar(s.replace(",", "").replace(" ", ""), percent, numeric_gold)
    m = _DECIMAL_COMMA_RE.match(s)
    if m and numeric_gold:  # 1000,99 against a plain-number gold: one value, not a list of two
        return _scalar(f"{m.group(1)}.{m.group(2)}", percent, numeric_gold)

    parts = split_top(s, (";",))  # "p=5, q=2; p=7, q=2": solutions separated by ";", each with its parts
    if len(parts) > 1 and any(len(split_top(p, (",",))) > 1 for p in parts):
        return Seq(tuple(sub(p) for p in parts), "list")

    parts = split_top(s, (",", ";", " and ", "\\text{and}"))
    if len(parts) > 1:
        return _comma_list(parts, sub)

    rel = _relation(s, sub)  # before the ratio: "A:B = 1", "V_1:V_2 = 11:21" are labelled values
    if rel is not None:
        return rel

    parts = split_top(s, (":",))  # a time or a ratio (12:00, 1:2:3) is an ordered tuple
    if len(parts) > 1 and not any(p.endswith("\\") for p in parts):
        return Seq(tuple(sub(p) for p in parts), "tuple")

    enclosed = _enclosure(s, sub)
    if enclosed is not None:
        return enclosed

    if "\\pm" in s or "\\mp" in s:
        pm = s.replace("\\mp", "\\pm")
        if pm.count("\\pm") > 2:
            return Unparsed(s, "too many \\pm")
        plus, minus = pm.replace("\\pm", "+", 1), pm.replace("\\pm", "-", 1)
        return Seq((sub(plus), sub(minus)), "pm")

    m = _CHOICE_RE.match(s)
    if m and (s.startswith("(") or len(s) == 1):
        return Choice(m.group(1))
    return _scalar(s, percent, numeric_gold)


def _scalar(s: str, percent: bool, numeric_gold: bool) -> Answer:
    s = _SCALE_RE.sub(lambda m: f"({m.group(1)}*10^{_SCALE_WORDS[m.group(2).lower()]})", s)
    word = s.strip().lower()
    number = _number_words(word)
    if number is not None:
        s = str(number)
    elif _WORD_ANSWER_RE.match(s.strip()) and len(s.strip()) >= 3 and word not in _MATH_WORDS \
            and re.search(r"[A-Za-z]{2}", s):  # "b - a" is a difference of variables, not a word
        return _word_answer(_text_key(s))
    try:
        expr = parse_expr(s)
    except ParseError as exc:
        stripped = strip_units(s, aggressive=numeric_gold)
        if stripped is not None:
            return _scalar(stripped, percent, numeric_gold)
        if _WORDY_RE.search(s) and "\\" not in s.replace("\\text", ""):
            return _word_answer(_text_key(s))
        return Unparsed(s, str(exc))
    if numeric_gold and expr.variables:
        stripped = strip_units(s, aggressive=True)
        if stripped is not None:
            return _scalar(stripped, percent, numeric_gold)
    return Scalar(expr, percent, *_literal_precision(s))


_DECIMAL_LITERAL_RE = re.compile(r"^[-+]?(\d*)\.(\d+)(?:e([-+]?\d+))?$|^[-+]?(\d+)e([-+]?\d+)$", re.I)


_TIMES_TEN_LITERAL_RE = re.compile(r"^([-+]?\d*\.?\d+)\s*\*\s*10\s*\^\s*\{?\s*([-+]?\d+)\s*\}?$")


def _literal_precision(s: str) -> tuple[Fraction | None, int | None]:
    """``(ulp, significant digits)`` of a decimal literal such as ``0.29`` or ``4.5e33``; ``(None, None)``
    for anything else (integers, fractions, expressions are exact)."""
    times_ten = _TIMES_TEN_LITERAL_RE.match(s.strip())  # 4.52 * 10^{33} is the literal 4.52e33
    m = _DECIMAL_LITERAL_RE.match(f"{times_ten.group(1)}e{times_ten.group(2)}" if times_ten else s.strip())
    if not m:
        return None, None
    if m.group(4) is not None:  # 3e6: one significant digit at 10^6
        whole, frac, exp = m.group(4), "", int(m.group(5))
    else:
        whole, frac, exp = m.group(1), m.group(2), int(m.group(3) or 0)
    digits = (whole + frac).lstrip("0")
    return Fraction(10) ** (exp - len(frac)), len(digits)


def _number_words(word: str) -> int | None:
    """``"twenty-five"`` -> 25, ``"one million"`` -> 1000000, ``"seven"`` -> 7; None otherwise."""
    m = _NUMBER_WORD_RE.match(word)
    if not m or (m.group(1) is None and m.group(3) is None):
        return None
    value = _NUMBER_WORDS[m.group(1).lower()] if m.group(1) else 1
    if m.group(2):
        if value < 20 or value % 10:
            return None
        value += _NUMBER_WORDS[m.group(2).lower()]
    if m.group(3):
        value *= {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9}[m.group(3).lower()]
    return value


def strip_units(s: str, *, aggressive: bool) -> str | None:
    """``"864 inches^2"`` -> ``"864"``: drop a tail of unit words after a numeric head.

    The tail is taken word by word from the end while each word is unit-like (letters, with an
    optional ``^2`` / ``^{-1}``, ``/``, ``per``). Without ``aggressive`` the tail must hold a word of
    two or more letters (so ``p - q`` and ``5 r`` keep their variables); with it (the gold is a
    plain number) single letters go too (``5 m``).
    """
    words = s.strip().split(" ")
    tail: list[str] = []
    while len(words) > 1:
        cleaned = _UNIT_CHARS_RE.sub(" ", words[-1]).split()
        if words[-1] in ("/", "*", "per") or all(w.isalpha() for w in cleaned):  # "^{2}" cleans to nothing
            tail.extend(cleaned)
            words.pop()
        else:
            break
    head = " ".join(words).rstrip(" /*")
    if not tail or not head or not re.search(r"\d", head) or not re.search(r"[\d})\]]$|\\pi$", head):
        return None
    if not aggressive and not any(len(w) >= 2 for w in tail):
        return None
    return head


_ALL_REALS = {"allrealnumbers", "allreals", "realnumbers", "everyrealnumber", "allrealvalues"}
_NO_SOLUTION = {"nosolution", "nosolutions", "norealsolutions", "norealsolution", "none", "emptyset", "theemptyset",
                "nosuchnumber", "nosuchvalue", "novalue", "novalues"}


def _word_answer(key: str) -> Answer:
    """A word answer; "all real numbers" and "no solution" are the sets they name."""
    if key in _ALL_REALS:
        return Interval(Infinity(-1), Infinity(1), False, False)
    if key in _NO_SOLUTION:
        return Seq((), "set")
    return Text(key)


def _text_key(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "", s.lower())


def _matrix(env: str, body: str, sub) -> Answer:
    if env.endswith("*"):
        body = _ALIGN_OPTION_RE.sub("", body, count=1)
    if env == "array":  # the column spec: {cc}, {c|c}, {@{}rr@{}}, {*{3}{c}}
        stripped = body.lstrip()
        if stripped.startswith("{"):
            close = matching_brace(stripped, 0)
            if close < 0:
                return Unparsed(body, "bad array")
            body = stripped[close + 1:]
    rows = [r for r in re.split(r"\\\\|\\cr(?![a-zA-Z])", body) if r.strip()]
    if not rows or len(rows) > MAX_ITEMS:
        return Unparsed(body, "bad matrix")
    cells = [[c for c in row.split("&")] for row in rows]
    if any(len(r) != len(cells[0]) for r in cells) or len(cells[0]) > MAX_ITEMS:
        return Unparsed(body, "ragged matrix")
    return Matrix(tuple(tuple(sub(c) for c in row) for row in cells))


def _comma_list(parts: list[str], sub) -> Answer:
    if len(parts) > MAX_ITEMS:
        return Unparsed(",".join(parts), "too many items")
    # "x = 1, 2" is one equation whose right side lists values; "x=1, y=2" is a list of equations.
    first_rel = _RELATION_RE.search(parts[0])
    if first_rel and first_rel.group(0) == "=" and not any("=" in p for p in parts[1:]):
        lhs, _, rhs = parts[0].partition("=")
        if lhs.strip() and rhs.strip():
            return Relation(sub(lhs), "=", Seq(tuple(sub(p) for p in [rhs, *parts[1:]]), "list"))
    return Seq(tuple(_flatten_pm(sub(p) for p in parts)), "list")


def _or_list(items: list) -> Answer:
    """The parts of an "or" list: a union when they are all intervals, else the list of their values."""
    if all(isinstance(i, (Interval, Union_)) for i in items):
        return Union_(tuple(x for i in items for x in (i.items if isinstance(i, Union_) else (i,))))
    flat = []
    for item in items:
        flat.extend(item.items if isinstance(item, Seq) and item.kind in ("list", "pm") else [item])
    return Seq(tuple(flat), "list")


def _approximation(parts: list[str]) -> str:
    """``x = 1/3 \\approx 0.33`` -> ``x = 1/3`` (the exact value the response wrote); ``x \\approx 11`` ->
    ``x = 11`` (only an approximate value for a named unknown); ``\\frac13 \\approx 0.33`` -> ``\\frac13``."""
    left = parts[0].strip()
    if _LONE_NAME_RE.match(left):
        return f"{left} = {parts[-1].strip()}"
    return left


def _flatten_pm(items) -> list:
    out = []
    for item in items:
        out.extend(item.items if isinstance(item, Seq) and item.kind == "pm" else [item])
    return out


def _relation(s: str, sub) -> Answer | None:
    pieces = split_top_relations(s)
    if len(pieces) == 1:
        return None
    sides = pieces[0::2]
    ops = pieces[1::2]
    if any(not side.strip() for side in sides):
        return Unparsed(s, "dangling relation")
    if len(ops) == 1:
        lhs, op, rhs = sub(sides[0]), ops[0], sub(sides[1])
        interval = half_line(lhs, op, rhs)
        return interval if interval is not None else Relation(lhs, op, rhs, op == "=" and is_label(sides[0]))
    if len(ops) == 2 and all(o in ("<", "<=") for o in ops):  # a < x <= b
        return chain(sub(sides[0]), sub(sides[1]), sub(sides[2]), ops[0] == "<=", ops[1] == "<=", s)
    if len(ops) == 2 and all(o in (">", ">=") for o in ops):  # b > x >= a
        return chain(sub(sides[2]), sub(sides[1]), sub(sides[0]), ops[1] == ">=", ops[0] == ">=", s)
    if all(o == "=" for o in ops):  # a = b = c: the last member is the value
        if is_label(sides[0]):  # x = 5 + 5 + 1 = 11: the named unknown is the last member
            return Relation(sub(sides[0]), "=", sub(sides[-1]), True)
        return Relation(sub(sides[-2]), "=", sub(sides[-1]))
    return Unparsed(s, "mixed relations")


def _enclosure(s: str, sub) -> Answer | None:
    if s.startswith("{") and s.endswith("}") and _closes_at_end(s, 0) and len(split_top(s[1:-1], (",",))) > 1:
        # {1, 2} without backslashes: LaTeX grouping braces around a list (a set only when escaped), so
        # it equals the set {1, 2} and, in its written order, the pair (1, 2)
        return Seq(tuple(_flatten_pm(sub(p) for p in split_top(s[1:-1], (",", ";")))), "list")
    if s.startswith("\\{") and s.endswith("\\}") and _closes_at_end(s, 1):
        inner = s[2:-2]
        items = split_top(inner, (",", ";")) if inner.strip() else []
        return Seq(tuple(_flatten_pm(sub(p) for p in items)), "set")
    if len(s) < 2 or s[0] not in "([" or s[-1] not in ")]" or not _closes_at_end(s, 0):
        return None
    inner = s[1:-1]
    items = split_top(inner, (",", ";"))
    if len(items) == 1:
        if s[0] == "(" and s[-1] == ")":
            return sub(inner)
        return None
    if len(items) > MAX_ITEMS:
        return Unparsed(s, "too many items")
    parsed = [sub(p) for p in items]
    endpoints = all(isinstance(p, (Scalar, Infinity, Unparsed)) for p in parsed)
    if len(parsed) == 2 and endpoints and (s[0] != "(" or s[-1] != ")" or any(isinstance(p, Infinity) for p in parsed)):
        return Interval(parsed[0], parsed[1], s[0] == "[", s[-1] == "]")
    if s[0] == "(" and s[-1] == ")":
        return Seq(tuple(parsed), "tuple")
    return Seq(tuple(parsed), "tuple")  # [a, b, c]: a vector written with brackets


def _closes_at_end(s: str, open_index: int) -> bool:
    """True when the bracket opened at ``open_index`` is closed by the last character of ``s``."""
    depth = 0
    i = open_index
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s) and s[i + 1] in "{}":
            c = s[i + 1]
            i += 1
            if c == "{":
                depth += 1
            else:
                depth -= 1
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if depth == 0:
            return i == len(s) - 1
        i += 1
    return False


def split_top(s: str, separators: tuple[str, ...]) -> list[str]:
    """Split ``s`` on any of ``separators`` where no bracket is open.

    Interval brackets do not pair up (``(3, 4]``), so any of ``( [ {`` opens and any of ``) ] }``
    closes; an unbalanced string is returned whole.
    """
    parts: list[str] = []
    depth = 0
    start = 0
    i = 0
    n = len(s)
    while i < n:
        c = s[i]
        if c == "\\" and i + 1 < n:
            if s.startswith("\\begin", i):
                depth += 1
            elif s.startswith("\\end", i):
                depth -= 1
            elif s[i + 1] in "{}":
                depth += 1 if s[i + 1] == "{" else -1
                i += 2
                continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth < 0:
                return [s]
        elif depth == 0:
            for sep in separators:
                if s.startswith(sep, i):
                    parts.append(s[start:i])
                    i += len(sep)
                    start = i
                    break
            else:
                i += 1
                continue
            continue
        i += 1
    if depth != 0:
        return [s]
    parts.append(s[start:])
    parts = [p for p in (p.strip() for p in parts) if p]
    return parts if len(parts) > 1 else [s]


def split_top_relations(s: str) -> list[str]:
    """``"a < x <= b"`` -> ``["a", "<", "x", "<=", "b"]``, splitting only outside brackets."""
    out: list[str] = []
    depth = 0
    start = 0
    i = 0
    n = len(s)
    while i < n:
        c = s[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and c in "<>=!":
            op = s[i: i + 2] if s[i: i + 2] in ("<=", ">=", "!=") else c
            if op == "!":
                i += 1
                continue
            out.extend([s[start:i], op])
            i += len(op)
            start = i
            continue
        i += 1
    out.append(s[start:])
    return out
