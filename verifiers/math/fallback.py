"""The last-resort answer of a response without an explicit marker (``fallback="last_number"``).

When a response writes no ``<answer>`` tag, box, answer statement or final bold value, its answer
is taken from how it ends:

* a *bare answer*: a short response that is nothing but one math segment (``$\\frac13$``,
  ``$$\\text{odd}$$``, ``$f(y) = y$``) or one formula without prose (``\\frac{10}{9}``, ``1 000``,
  ``1000,99``) is its own answer, whether or not it holds a standalone number;
* the *concluding value*: the math segment (``$...$``, ``\\(...\\)``, ``\\[...\\]``, ``$$...$$``, a
  matrix environment) holding the last number, when only the end of its sentence follows
  ("Therefore $(p, q) = (3, 2)$." -> the pair; a matrix stays a matrix; ``x = 3 \\Rightarrow y = 4``
  -> ``y = 4``), or ``X`` in "X is the solution";
* else the last number (a decimal comma ``2,74`` and a unit written against it, ``1,000.99m²``, are
  part of the number).

Guessing is dangerous for a reward, so the fallback refuses where the last number is not an answer:
a long response that ends in the middle of a number or an expression (it looks cut off), a number
the text rules out ("the answer is not 42", "42 is wrong"), or one that closes an enumeration of
candidates (``1, 2, 3, 4, 5``, ``3 or 4``), or one inside a matrix environment too long to read as
the concluding value (a matrix is not the number it is filled with).
"""

from __future__ import annotations

import re

from rlvr.verifiers.math.self_correction import alternatives_after
from rlvr.verifiers.math.statements import CONCLUDING_RE, CONNECTOR_RE, NUMBER_RE, formula_like

# Refusals: a response that looks cut off, a number the text rules out, the end of an enumeration.
_TRUNCATED_TAIL_RE = re.compile(r"(?:[-+*/=^(\[{,]|\\[a-zA-Z]*|\d)$")
# Words that rule out the value after them: "the answer is not 42", "it cannot be $7$".
_NEGATED_BEFORE_RE = re.compile(r"(?i)(?:\bnot|n't|\bnever|\bno\s+longer)\s+(?:equal\s+to\s+|be\s+|exactly\s+)?\$?$")
# A sentence that rejects the value before it: "$5$ is not the answer", "12 is wrong".
_NEGATED_AFTER_RE = re.compile(r"(?i)^[^.!?\n\d]{0,30}?(?:\b(?:is|are|was|were|does|do|would\s+be)\s+not\b|n't\b"
                               r"|\b(?:wrong|incorrect)\b)")
_ENUMERATION_RE = re.compile(
    r"(?:\d[\d.,/]*\s*(?:,\s*(?:or\b|and\b)?|\bor\b|\band\b|;)\s*){2,}[-+]?\d[\d.,/]*\s*\W{0,3}$")
_OR_PAIR_RE = re.compile(r"\d[\d./]*\s*(?:,\s*(?:or\b)?|\bor\b)(?:\s+(?:maybe|perhaps|possibly|even))?\s*[-+]?\d[\d./]*\s*\W{0,3}$")
_THOUSANDS_RE = re.compile(r"\d{1,3}(?:,\d{3})+(?!\d)")

# The concluding value.
_DELIMITER_RE = re.compile(r"\\\\|\\\$|\$\$|\$|\\\(|\\\)|\\\[|\\\]")
_CLOSER = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
MAX_SEGMENT = 1500
# After the concluding math segment only the end of its sentence may follow ("$x > 3$ is the solution.").
_SENTENCE_TAIL_RE = re.compile(r"^[\s.,;:!?)]*(?:[^\s.!?\d$\\][^.!?\d$\\\n]{0,80})?[.!?]?[\s*_]*$")
_SEGMENT_SPLIT_RE = re.compile(
    r"\\(?:Rightarrow|Longrightarrow|implies|iff|therefore|equiv|quad|qquad|sim|simeq|to)(?![a-zA-Z])|;|\\\\")
# "x = 5 \quad\text{or}\quad x = -5" is two answers, not "x = -5": no split at \quad then.
_SEGMENT_CONNECTOR_RE = re.compile(r"\\text\s*\{\s*(?:or|and)\s*\}|\\(?:lor|vee|land)(?![a-zA-Z])|\s(?:or|and)\s")
_MOD_RE = re.compile(r"\\pmod\s*\{[^{}]*\}|\\pmod\s*\w+|\(\s*\\(?:bmod|mod)\s*[^()]*\)|\\bmod\s*\w+")
_ENV_OPEN_RE = re.compile(r"\\begin\{([a-zA-Z]*matrix\*?|array)\}")
_PLAIN_SOLUTION_RE = re.compile(
    r"(?i)(?:^|(?<=[.!?:;\n]))\s*(?:(?:therefore|thus|hence|so|finally|consequently)\b,?\s*)?"
    r"(?P<value>[^.!?:;\n]{1,80}?)\s+(?:is|are)\s+(?:the|our)\s+(?:(?:only|final|complete|required|desired|"
    r"correct|unique)\s+)*(?:solutions?(?:\s+set)?|set\s+of\s+solutions|answers?)\b[^.!?\n\d]{0,60}[.!]?\s*$")
_PLAIN_VALUE_RE = re.compile(r"^[\w\s+\-*/^=<>!\u2264\u2265\u2260().,{}|\\]+$")

# The bare answer: a whole response that is one math segment, or one formula.
MAX_BARE = 200
_WHOLE_SEGMENT_RE = re.compile(r"^(?:\$\$(?P<a>[^$]+)\$\$|\$(?P<b>[^$\n]+)\$|\\\((?P<c>(?:(?!\\[()]).)+)\\\)"
                               r"|\\\[(?P<d>(?:(?!\\[\[\]]).)+)\\\])[\s.!]*$", re.S)
_BARE_FORMULA_RE = re.compile(r"^[-+]?[\w\\{}()\[\]^_.,/*+\-=<>|!:' ]+\$?$")
_SPACED_NUMBERS_RE = re.compile(r"\d\s+\d")
_DIGIT_GROUPS_RE = re.compile(r"(?<![\d.])[1-9]\d{0,2}(?: \d{3})+(?![\d])")
# A number with a decimal comma (2,74: one or two digits after it, not inside a pair or a list) or
# with a unit written against it (1,000.99m², 15cm; a lone letter only with a power: 5m², not 2x).
_DECIMAL_COMMA_NUMBER_RE = re.compile(r"(?<![\w.,(\[{])[-+]?\d+,\d{1,2}(?![\w,)\]}]|\.\d)")
_UNIT_SUFFIX_RE = re.compile(r"(?:(?:cm|mm|km|kg|mg|ml|ft|yd|lb|oz|mi)(?:\^?[23²³])?|[mgsL](?:\^?[23]|[²³]))"
                             r"(?![\w²³])")


def _math_spans(s: str, start: int) -> list[tuple[int, int, int, int]]:
    """``(content_start, content_end, outer_start, outer_end)`` of each closed ``$...$``, ``$$...$$``,
    ``\\(...\\)``, ``\\[...\\]`` in ``s[start:]`` (a linear scan; ``\\$`` is a dollar, ``\\\\`` a row break)."""
    spans = []
    opener = None
    open_at = content_at = 0
    for m in _DELIMITER_RE.finditer(s, start):
        token = m.group(0)
        if token in ("\\\\", "\\$"):
            continue
        if opener is None:
            if token in _CLOSER:
                opener, open_at, content_at = token, m.start(), m.end()
        elif token == _CLOSER[opener]:
            spans.append((content_at, m.start(), open_at, m.end()))
            opener = None
    return spans


def _environment_span(s: str, index: int) -> tuple[int, int] | None:
    """The matrix environment (``\\begin{pmatrix}...\\end{pmatrix}``) around ``s[index]``, if any."""
    for m in reversed(list(_ENV_OPEN_RE.finditer(s, 0, index))[-64:]):  # the innermost open one, nearby
        if s.find(f"\\end{{{m.group(1)}}}", m.end(), index) >= 0:
            continue  # closed before the number
        close = s.find(f"\\end{{{m.group(1)}}}", index)
        if close >= 0:
            return m.start(), close + len(m.group(1)) + 6
    return None


def _bare_answer(stripped: str) -> str | None:
    """The whole response when it is a bare answer (module docstring), else None."""
    if len(stripped) > MAX_BARE:
        return None
    m = _WHOLE_SEGMENT_RE.match(stripped)
    if m:
        content = next(g for g in m.groups() if g is not None).strip()
        return content or None
    if "\n" in stripped or "$" in stripped.rstrip("$") or not _BARE_FORMULA_RE.match(stripped):
        return None
    if not formula_like(stripped) or re.search(r"[A-Za-z]{2,}", re.sub(r"\\[a-zA-Z]+", " ", stripped)):
        return None  # prose, or a word: the sentence rules read it
    if _SPACED_NUMBERS_RE.search(_DIGIT_GROUPS_RE.sub("0", stripped)):
        return None  # "3 4" is two numbers, not 3 * 4
    return stripped.rstrip("$").strip()


def _segment_answer(content: str) -> str | None:
    """The answer in a concluding math segment: its last part after ``\\Rightarrow``, ``\\implies``,
    ``\\quad``, ... (outside brackets), without ``\\pmod``; None when it reads as prose."""
    content = _MOD_RE.sub(" ", content).strip()
    depth, cut = 0, 0
    splits = {m.start(): m.end() for m in _SEGMENT_SPLIT_RE.finditer(content)
              if not (m.group(0).endswith("quad") and _SEGMENT_CONNECTOR_RE.search(content))}
    i = 0
    while i < len(content):
        c = content[i]
        if i in splits and depth == 0 and not content.startswith("\\\\", i):
            cut = splits[i]
            i = splits[i]
            continue
        if content.startswith("\\begin{", i):
            depth += 1
        elif content.startswith("\\end{", i):
            depth -= 1
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        i += 2 if c == "\\" and content[i + 1: i + 2] in "{}()[]\\" else 1
    value = content[cut:].strip().rstrip(".,;:").strip()
    if not value or not re.search(r"\d", value) or not formula_like(value):
        return None
    return value


def _concluding_value(stripped: str, last: re.Match) -> str | None:
    """The concluding value holding the last number (module docstring), or None."""
    window = stripped.rfind("\n", 0, max(0, len(stripped) - 4 * MAX_SEGMENT)) + 1
    outer = None
    chain: list[str] = []
    env = _environment_span(stripped, last.start())
    if env is not None and env[1] - env[0] > MAX_SEGMENT:
        return _TOO_LONG  # inside a matrix too long to read: not an answer, and not its last entry
    for k in range(len(spans := _math_spans(stripped, window)) - 1, -1, -1):
        content_start, content_end, outer_start, outer_end = spans[k]
        if content_start <= last.start() < content_end:
            if content_end - content_start <= MAX_SEGMENT:
                chain = [stripped[content_start:content_end]]
                while k > 0 and len(chain) < 16:  # "$x = 3$ or $x = 4$": segments joined by connectors
                    gap = stripped[spans[k - 1][3]: spans[k][2]]
                    if not CONNECTOR_RE.match(gap):
                        break
                    k -= 1
                    chain[:0] = [stripped[spans[k][0]: spans[k][1]], gap.strip() or ","]
                outer = (spans[k][2], outer_end)
            break
    if outer is None and env is not None:
        outer, chain = env, [stripped[env[0]: env[1]]]
    if outer is not None:
        outer_start, outer_end = outer
        if not _SENTENCE_TAIL_RE.match(stripped[outer_end: outer_end + 200]) or len(stripped) - outer_end > 200:
            return None
        if _NEGATED_BEFORE_RE.search(stripped[max(0, outer_start - 40): outer_start + 1]) \
                or _NEGATED_AFTER_RE.match(stripped[outer_end: outer_end + 60]):
            return None
        parts = [p if i % 2 else _segment_answer(p) for i, p in enumerate(chain)]
        return None if None in parts else " ".join(parts)
    sentence = _PLAIN_SOLUTION_RE.search(stripped[-300:])
    if sentence:
        value = sentence.group("value").strip()
        value = CONCLUDING_RE.sub("", value).strip()
        if value and _PLAIN_VALUE_RE.match(value) and formula_like(value) and last.group(0).strip() in value:
            return value
    return None


_TOO_LONG = object()


def _last_number(stripped: str) -> re.Match | None:
    """The last number of the response, with a decimal comma or a unit written against it."""
    last = None
    for last in NUMBER_RE.finditer(stripped):
        pass
    start = last.end() if last is not None else 0
    # 2,74 (decimal comma) where the plain pattern stops at 2; 1,000.99m² where it refuses the unit
    for m in _DECIMAL_COMMA_NUMBER_RE.finditer(stripped, max(0, start - 8)):
        if last is None or m.end() >= last.end():
            last = m
    tail = _UNIT_TAIL_RE.search(stripped, max(0, start - 64))
    if tail is not None and (last is None or tail.end() >= last.end()):
        return _UnitNumber(tail)
    return last


class _UnitNumber:
    """A match of a number followed by its unit, read as the number alone."""

    def __init__(self, m: re.Match):
        self._m = m

    def group(self, _index: int = 0) -> str:
        return self._m.group("number")

    def start(self) -> int:
        return self._m.start()

    def end(self) -> int:
        return self._m.end("number")


_UNIT_TAIL_RE = re.compile(r"(?<![\w.^])(?P<number>[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)" + _UNIT_SUFFIX_RE.pattern
                           + r"(?=[\s.,;:!?)]*$)")


def fallback_answers(region: str) -> tuple[list[str], str | None, list[str]]:
    """The bare answer, else the concluding value, else the last number (module docstring), as
    ``(answers, source, alternatives)``, the fields of an :class:`~verifiers.math.extract.Extraction`;
    no answers, and the reason as ``source``, where the fallback refuses."""
    stripped = region.strip()
    bare = _bare_answer(stripped)
    if bare is not None:
        return [bare], "bare", []
    last = _last_number(stripped)
    if last is None:
        return [], None, []
    # A long response that stops on a digit or an operator was probably cut off mid-answer.
    if len(stripped) > 200 and _TRUNCATED_TAIL_RE.search(stripped[-64:]):
        return [], "truncated", []
    line_start = stripped.rfind("\n", 0, last.start()) + 1
    concluded = _concluding_value(stripped, last)
    if concluded is _TOO_LONG:
        return [], "environment", []
    if concluded is not None:
        return [concluded], "conclusion", alternatives_after(stripped, line_start)
    if _NEGATED_BEFORE_RE.search(stripped[max(0, last.start() - 40): last.start()]) \
            or _NEGATED_AFTER_RE.match(stripped[last.end(): last.end() + 60]):
        return [], "negated", []  # "the answer is not 42", "42 is wrong": the number is ruled out
    # only the end of the line: the pattern backtracks, and hostile lines are long
    # the last number itself stands as one digit (its own comma is no list: 2,74 is one number)
    before = stripped[max(line_start, last.end() - 200): last.start()]
    tail = _THOUSANDS_RE.sub("N", before).replace("N", "0") + "0" + stripped[last.end(): last.end() + 3]
    if _ENUMERATION_RE.search(tail) or _OR_PAIR_RE.search(tail):
        return [], "enumeration", []
    return [last.group(0)], "last_number", alternatives_after(stripped, line_start)
