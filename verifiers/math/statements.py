"""Explicit final-answer statements, and reading the value out of the sentence that states it.

A statement is a marker in prose: "the answer is ...", "final answer: ...", an ``Answer:`` line
(markdown allowed: ``**Answer: B**``), a "Final Answer" heading followed by its line, GSM8K's
``#### N``. :func:`find_statements` finds them; :func:`clean_statement` reduces what follows the
marker to the answer itself, because models rarely write a bare value there:

* a sentence keeps its value ("Final Answer: The largest $n$ is $34$" -> ``34``, "there are 15 such
  numbers" -> ``15``, "$x \\ge 5$ is the solution" -> ``x \\ge 5``);
* math segments joined by "or"/"and"/"," are the answer ("$x = 3$ or $x = 4$");
* fillers ("approximately", "equal to") and markdown go; a display (``$$...$$``, ``\\[...\\]``, a
  matrix environment) continues the statement over the lines it spans;
* prose that only mentions the answer ("the answer is what we need to find") is not one
  (:func:`looks_like_answer`).

The same reading serves the hedges and self-corrections written after an answer, and the
last-number fallback (:func:`formula_like`, :data:`NUMBER_RE`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_STATEMENT = 300
_REST = r"[\s*_]*(?P<rest>[^\n]{0,%d})" % MAX_STATEMENT
_STATEMENT_RES = (
    # "the answer is 5", "the final answer to part (a) is: 5", "the correct option is (B)"
    re.compile(r"(?i)(?<![a-z])(?:(?:(?:the|my|our)\s+)?(?:(?:final|correct)\s+)?answer|(?:correct|right|best)\s+(?:option|choice))"
               r"(?:\s+(?:to|for)\s+[^.:\n]{0,40}?)?\s+is\s*[:：]?" + _REST),
    # "Answer: 5" at the start of a line (markdown allowed), or "final answer: 5" anywhere
    re.compile(r"(?im)(?:^[ \t#*_>\-]*(?:(?:the|my)\s+)?(?:final\s+)?|(?<![a-z])final\s+)answers?[ \t*_]*[:：=]" + _REST),
)
# Words between the marker and the answer that carry no value: "the answer is approximately 3.14".
_FILLER_RE = re.compile(r"(?i)^(?:(?:approximately|approx\.?|about|around|roughly|exactly|equal\s+to|equals|simply|"
                        r"just|now|then|therefore|thus|hence|so|given\s+by|as\s+follows|equivalently|"
                        r"(?:written|expressed|simplified|rewritten|stated)\s+(?:as|to)|:)\s*)+")
_PROSE_START = {"to", "that", "this", "what", "which", "how", "why", "because", "correct", "right", "wrong", "a", "an",
                "the", "in", "of", "as", "we", "it", "clearly", "indeed", "given", "found", "below", "above", "not",
                "still", "also", "different", "same", "obtained", "reached"}
_HEADING_RE = re.compile(r"(?im)^[ \t#*_>]*(?:final[ \t]+)?answer[ \t*_:：]*$")
_GSM8K_RE = re.compile(r"(?m)^[ \t]*####[ \t]*(?P<rest>[^\n]{1,%d})" % MAX_STATEMENT)
NUMBER_RE = re.compile(r"(?<![\w.^])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?(?:\s*\\?%)?(?![\w])|(?<![\w.])[-+]?\.\d+")
_SENTENCE_END_RE = re.compile(r"\.(?=\s|$)|(?<!\\)[;!?](?=\s|$)")  # not LaTeX's \! or \;
NEGATION_RE = re.compile(r"(?i)^\s*(?:not\b|never\b|wrong|incorrect|unclear|unknown|n't)")
_MARKDOWN_BOLD_RE = re.compile(r"(?<![\w)\]])\*\*|\*\*(?![\w(\[])")  # "**73**" but not "10**23"
_MATH_SEGMENT_RE = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|(?<!\\)\\\[(.+?)(?<!\\)\\\]", re.S)
CONNECTOR_RE = re.compile(r"(?i)^\s*(?:,?\s*(?:or|and)\s*|,\s*)$")


def _math_chain(rest: str) -> str | None:
    """``"$-\\frac38$, as required"`` -> ``"-\\frac38"``: the math segments of a statement, from the
    first one while only connectors ("or", "and", ",") separate them; None without math segments."""
    segments = list(_MATH_SEGMENT_RE.finditer(rest))
    if not segments:
        return None
    prefix = _FILLER_RE.sub("", rest[: segments[0].start()].strip())
    if len(prefix.split()) >= 3:  # "correct by plugging in $x=2$": prose that happens to hold math
        return None
    chain = [next(g for g in segments[0].groups() if g is not None)]
    for prev, seg in zip(segments, segments[1:]):
        gap = rest[prev.end(): seg.start()]
        if not CONNECTOR_RE.match(gap) and gap.strip():
            break
        chain.append(gap.strip() or ",")
        chain.append(next(g for g in seg.groups() if g is not None))
    return " ".join(chain)


# "Therefore, " / "In conclusion, " in front of a concluding sentence.
CONCLUDING_RE = re.compile(r"(?i)^(?:(?:therefore|thus|hence|so|finally|consequently|overall|altogether|in\s+conclusion|"
                           r"in\s+summary|in\s+total|in\s+all|we\s+conclude\s+that|this\s+means\s+that)\b[,:]?\s*)+")
# "The largest $n$ is $34$" -> "$34$": a sentence whose subject names the quantity and whose verb gives it.
_COPULA_RE = re.compile(
    r"(?i)^(?:the|our|this|that|its|his|her|their)\s+(?P<subject>[^=<>\d]{1,80}?)\s+(?:is|are|equals|was|were|"
    r"will\s+be|would\s+be|must\s+be|should\s+be|comes\s+to|=)\s+(?P<value>\S.*)$")
# "$x \ge 5$ is the solution" -> "$x \ge 5$": the value first, then what it is.
_SOLUTION_RE = re.compile(
    r"(?i)^(?P<value>\S.{0,120}?)\s+(?:is|are|gives|describes)\s+(?:the|our)\s+(?:(?:only|final|complete|required|desired|"
    r"correct|unique|general|full)\s+)*(?:solutions?(?:\s+set)?|set\s+of\s+solutions|answers?|results?|values?|"
    r"roots?|range|domain)\b")


def _conclusion_value(sentence: str) -> str:
    """The value a concluding sentence states ("The largest n is 34" -> "34"; "x >= 5 is the
    solution" -> "x >= 5"); the sentence itself when it is not of that form."""
    s = CONCLUDING_RE.sub("", sentence.strip())
    m = _SOLUTION_RE.match(s)
    if m and formula_like(m.group("value")):
        return m.group("value").strip()
    m = _COPULA_RE.match(s)
    if m and len(_MATH_SEGMENT_RE.sub(" x ", m.group("subject")).split()) <= 8:
        return m.group("value").strip()
    return s


def formula_like(s: str) -> bool:
    """Math rather than prose: a digit or a math segment, and at most one word of three letters or more
    outside LaTeX commands and math segments (``x >= 5``, ``$n \\le 7$``, ``sqrt(2)``)."""
    if not re.search(r"[\d$\\]", s):
        return False
    bare = re.sub(r"\\[a-zA-Z]+", " ", _MATH_SEGMENT_RE.sub(" ", _ENV_NAME_RE.sub(" ", s)))
    return len([w for w in re.findall(r"[A-Za-z]{3,}", bare) if w.lower() not in _MATH_WORDS]) <= 1


_ENV_NAME_RE = re.compile(r"\\(?:begin|end)\s*\{[^{}]*\}")
_MATH_WORDS = {"sqrt", "sin", "cos", "tan", "log", "exp", "pi", "inf", "infty", "and", "or"}


def clean_statement(rest: str) -> str:
    """The answer part of a statement line: its first sentence (a period inside ``$...$`` does not
    end it), then its value if it is a concluding sentence, then its math segments if it has any,
    with fillers and markdown removed."""
    rest = _MARKDOWN_BOLD_RE.sub(" ", rest).replace("__", " ").strip(" *_\t")
    spans = [m.span() for m in _MATH_SEGMENT_RE.finditer(rest)]
    for end in _SENTENCE_END_RE.finditer(rest):
        if not any(a <= end.start() < b for a, b in spans):
            rest = rest[: end.start()]
            break
    rest = _conclusion_value(rest)
    chain = _math_chain(rest)
    if chain is not None:
        return chain.strip()
    rest = _FILLER_RE.sub("", rest.strip())
    return _sole_number(rest.strip(" *_\t:"))


_QUALIFIERS = {"or", "and", "least", "most", "than", "less", "more", "not", "between", "either", "neither", "nor",
               "each", "per", "every", "times", "plus", "minus", "over", "under", "up", "to", "from"}


def _sole_number(s: str) -> str:
    """``"there are 15 such numbers"`` -> ``"15"``: a sentence after an explicit marker that states a
    single number and qualifies it with nothing ("at least", "or", "per") gives that number."""
    words = re.findall(r"[A-Za-z]{2,}", s)
    if len(words) <= 2 or "\\" in s or any(w.lower() in _QUALIFIERS for w in words):
        return s
    numbers = list(NUMBER_RE.finditer(s))
    if len(numbers) != 1 or re.search(r"[=<>^/*+]", s.replace(numbers[0].group(0), " ")):
        return s
    return numbers[0].group(0).strip()


MAX_DISPLAY = 2000  # a display or environment that continues a statement over several lines, at most


def _display_end(text: str, start: int, end: int) -> int:
    """``end``, moved to the end of a later line while ``text[start:end]`` leaves a display (``$$``,
    ``\\[``) or an environment (``\\begin{...}``) open; unchanged when it does not close soon."""
    limit = min(len(text), end + MAX_DISPLAY)
    pos = end
    for _ in range(4):  # nested environments close one by one
        chunk = text[start:pos]
        if chunk.count("$$") % 2:
            closer = "$$"
        elif len(_OPEN_DISPLAY_RE.findall(chunk)) > len(_CLOSE_DISPLAY_RE.findall(chunk)):
            closer = "\\]"
        elif chunk.count("\\begin{") > chunk.count("\\end{"):
            closer = "\\end{"
        else:
            return pos
        found = text.find(closer, pos, limit)
        if found < 0:
            return end
        line_end = text.find("\n", found + len(closer), limit)
        pos = limit if line_end < 0 else line_end
    return end


_OPEN_DISPLAY_RE = re.compile(r"(?<!\\)\\\[")
_CLOSE_DISPLAY_RE = re.compile(r"(?<!\\)\\\]")


@dataclass(frozen=True)
class Item:
    """One answer the response commits to: ``text`` found at ``text[pos:end]``."""

    pos: int
    end: int
    text: str


def _statement_item(text: str, start: int, line_end: int) -> Item | None:
    end = _display_end(text, start, line_end)
    raw = text[start:end]
    value = clean_statement(raw.replace("\n", " ") if end > line_end else raw)
    if not value or NEGATION_RE.match(value) or NEGATION_RE.match(raw.lstrip(" \t*_$:")) \
            or not looks_like_answer(value):
        return None
    where = raw.find(value[:40])
    return Item(start, start + where + len(value) if where >= 0 else start + 1, value)


def find_statements(text: str) -> list[Item]:
    """Every answer statement in ``text`` (module docstring) with its value, in text order."""
    found: list[Item] = []
    for regex in _STATEMENT_RES:
        pos = 0
        while True:  # overlapping search: "the answer is not 5, it is 6. Answer: 6" holds two statements
            m = regex.search(text, pos)
            if not m:
                break
            item = _statement_item(text, m.start("rest"), m.end("rest"))
            if item:
                found.append(item)
            pos = m.start("rest")
    for m in _HEADING_RE.finditer(text):
        following = text[m.end():]
        skipped = len(following) - len(following.lstrip("\n"))
        start = m.end() + skipped
        line_end = text.find("\n", start)
        line_end = len(text) if line_end < 0 else min(line_end, start + MAX_STATEMENT)
        item = _statement_item(text, start, line_end)
        if item:
            found.append(Item(m.start(), item.end, item.text))
    for m in _GSM8K_RE.finditer(text):
        item = _statement_item(text, m.start("rest"), m.end("rest"))
        if item:
            found.append(Item(m.start(), item.end, item.text))
    unique = {item.pos: item for item in found}  # both regexes may find the same statement
    return sorted(unique.values(), key=lambda item: item.pos)


def looks_like_answer(s: str) -> bool:
    """Drop prose that follows "answer is" in passing ("the answer is what we need to find")."""
    words = s.lower().split()
    if len([w for w in words if w.isalpha() and len(w) > 1]) > 5:
        return False  # a sentence, not an answer
    if len(words[0]) >= 3 and words[0].strip(".,:;") in _PROSE_START:
        return False
    if re.search(r"[\d\\$^=(){}]|\b[A-J]\b", s):
        return True
    return len(words) <= 3 and words[0] not in _PROSE_START
