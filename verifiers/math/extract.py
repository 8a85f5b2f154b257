"""Find the final answer(s) a response commits to.

Before anything else the response is cut at the first chat-template or special token it wrote
after its text (``<|im_end|>``, ``<|im_start|>``, ``<|endoftext|>``, ``<|eot_id|>``, ``</s>``,
``<end_of_turn>``, ...): what follows is a turn the model invented, not its answer.

Markers, strongest first (the first tier present wins):

1. ``<answer>...</answer>`` tags (their content is searched again for the markers below);
2. ``\\boxed{...}`` / ``\\fbox{...}`` (every box in the final region);
3. statements: "the answer is ...", "final answer: ...", an ``Answer:`` line (markdown allowed:
   ``**Answer: B**``), a "Final Answer" heading followed by its line, GSM8K's ``#### N``; a
   statement that is a sentence keeps its value ("Final Answer: The largest n is 34" -> 34), and a
   display (``$$...$$``, ``\\[...\\]``, a matrix environment) continues over the lines it spans;
4. a bold ``**...**`` on the last line;
5. with ``fallback="last_number"``, the concluding value: the math segment (``$...$``, ``\\[...\\]``,
   a matrix environment) holding the last number when it ends the last sentence ("Therefore
   $(p, q) = (3, 2)$." -> the pair; a matrix stays a matrix), or ``X`` in "X is the solution";
   else the last number. Refused where the response ends in the middle of a number or an
   expression (it looks truncated) or the number closes an enumeration (``1, 2, 3, 4, 5``).

Tiers 1-3 are *explicit* final-answer markers. A response cut off by the length limit
(``finish_reason="length"``) has an answer only through one of them, and none while its reasoning
block (``<think>``) is still open or when it retracted its last answer ("that is wrong") before
the cut.

Every answer of the winning tier is returned, plus any box or statement written *after* its last
one, so that the verifier can see a response that commits to two different answers (hedging).
A *self-correction* is not hedging: when an explicit revision ("Wait, that is wrong", "Actually,",
"I made a mistake", "let me recheck") separates earlier answers from later ones, with no hedge
("or maybe", "alternatively", ...) between them, only the answers after it count.
The final region is what follows the closing ``</think>`` tag when there is one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rlvr.verifiers.math.choices import choice_letters  # noqa: F401  (importable from here as before)
from rlvr.verifiers.math.normalize import matching_brace
from rlvr.verifiers.math.self_correction import RETRACTION_RE, alternatives_after, revision_cut, revision_values
from rlvr.verifiers.math.special_tokens import cut_at_special_tokens
from rlvr.verifiers.math.statements import (
    CONCLUDING_RE, CONNECTOR_RE, MAX_STATEMENT, NUMBER_RE, Item, find_statements, formula_like,
)

MAX_BOXES = 64

_BOX_RE = re.compile(r"\\(?:boxed|fbox|framebox)\s*(\{|\s+(?=\S))")
_BOLD_RE = re.compile(r"\*\*([^*\n]{1,80}?)\*\*")
_ENUMERATION_RE = re.compile(
    r"(?:\d[\d.,/]*\s*(?:,\s*(?:or\b|and\b)?|\bor\b|\band\b|;)\s*){2,}[-+]?\d[\d.,/]*\s*\W{0,3}$")
_OR_PAIR_RE = re.compile(r"\d[\d./]*\s*(?:,\s*(?:or\b)?|\bor\b)(?:\s+(?:maybe|perhaps|possibly|even))?\s*[-+]?\d[\d./]*\s*\W{0,3}$")
_NEGATED_BEFORE_RE = re.compile(r"(?i)(?:\bnot|n't|\bnever|\bno\s+longer)\s+(?:equal\s+to\s+|be\s+|exactly\s+)?\$?$")
_THOUSANDS_RE = re.compile(r"\d{1,3}(?:,\d{3})+(?!\d)")
_TRUNCATED_TAIL_RE = re.compile(r"(?:[-+*/=^(\[{,]|\\[a-zA-Z]*|\d)$")


@dataclass
class Extraction:
    """Answers found in a response: ``answers`` in text order, from marker ``source``; ``alternatives``
    are other answers the response proposes after committing ("..., or maybe 4")."""

    answers: list[str] = field(default_factory=list)
    source: str | None = None
    alternatives: list[str] = field(default_factory=list)
    revised: list[str] = field(default_factory=list)  # answers a self-correction replaced (before ``answers``)

    @property
    def found(self) -> bool:
        return bool(self.answers)


def final_region(text: str, think_tag: str | None) -> str:
    """The text after the last ``</think>`` when the model closed its reasoning, else all of it."""
    if think_tag:
        close = f"</{think_tag}>"
        idx = text.rfind(close)
        if idx >= 0 and text[idx + len(close):].strip():
            return text[idx + len(close):]
    return text


def answer_tags(text: str, tag: str = "answer") -> list[str]:
    """Contents of every closed ``<answer>...</answer>`` (linear scan: no regex backtracking)."""
    lower = text.lower()
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    out, pos = [], 0
    while True:
        start = lower.find(open_tag, pos)
        if start < 0:
            break
        end = lower.find(close_tag, start)
        if end < 0:
            break
        inner_start = lower.rfind(open_tag, start, end)  # <answer><answer>x</answer>: the innermost
        out.append(text[inner_start + len(open_tag): end])
        pos = end + len(close_tag)
    return out


def find_boxed(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, content)`` of each outermost ``\\boxed{...}`` (last :data:`MAX_BOXES` only)."""
    matches = list(_BOX_RE.finditer(text))[-MAX_BOXES:]
    out: list[tuple[int, int, str]] = []
    covered_until = -1
    for m in matches:
        if m.start() < covered_until:
            continue  # a box inside a box
        if m.group(1) == "{":
            close = matching_brace(text, m.end() - 1)
            if close < 0:
                continue  # never closed: the response was cut off
            out.append((m.start(), close + 1, text[m.end(): close]))
            covered_until = close + 1
        else:  # \boxed 5
            token = re.match(r"[^\s$.,;]+", text[m.end():])
            if token:
                out.append((m.start(), m.end() + token.end(), token.group(0)))
    return out

# ----------------------------------------------------------------------------- extraction
def extract(text: str, *, think_tag: str | None = "think", fallback: str = "last_number",
            max_chars: int = 20_000, finish_reason: str | None = None) -> Extraction:
    """The answers ``text`` commits to (module docstring); ``Extraction([])`` when there is none.

    ``finish_reason="length"`` (the response was cut off by the token limit) accepts explicit
    markers only (tiers 1-3)."""
    text = cut_at_special_tokens(text)
    if len(text) > max_chars:
        text = text[-max_chars:]  # the final answer is at the end; hostile megabytes are not read
    truncated = finish_reason == "length"
    if truncated and think_tag and f"<{think_tag}>" in text and f"</{think_tag}>" not in text:
        return Extraction([], "truncated")  # cut off while still reasoning
    region = final_region(text, think_tag)

    tags = answer_tags(region)
    if tags:
        answers: list[str] = []
        alternatives: list[str] = []
        for content in tags:
            inner = extract(content, think_tag=None, fallback="none", max_chars=max_chars)
            alternatives.extend(inner.alternatives)
            if inner.found:
                answers.extend(inner.answers)
            elif content.strip() and _short_answer(content):
                answers.append(content.strip())
            elif fallback == "last_number":
                answers.extend(_fallback(content).answers)
        return Extraction([a for a in answers if a.strip()], "answer_tag", alternatives)

    boxes = find_boxed(region)
    last_open = region.rfind("\\boxed{")
    if last_open >= (boxes[-1][1] if boxes else 0) and last_open >= 0:
        return Extraction([], "truncated")  # the last box was never closed: the response was cut off
    statements = find_statements(region)
    if boxes:
        items = [Item(start, end, content) for start, end, content in boxes]
        items += [s for s in statements if s.pos >= boxes[-1][1]]
        source = "boxed"
    elif statements:
        items, source = statements, "statement"
    else:
        items, source = [], None
    if truncated:  # a statement running into the cut may be cut itself ("The answer is 12" of "... 125")
        items = [i for i in items if i not in statements or region[i.end:].strip(" \t*_$")]
    if items:
        items = sorted(items + revision_values(region, items[0].end), key=lambda i: i.pos)
        cut = revision_cut(region, items)
        revised = [i.text for i in items if cut is not None and i.pos < cut]
        if cut is not None:
            items = [i for i in items if i.pos >= cut]
        if truncated and RETRACTION_RE.search(region, items[-1].end):
            return Extraction([], "retracted")  # "\boxed{5}. Wait, that is wrong: ..." and then the cut
        return Extraction([i.text for i in items], source, alternatives_after(region, items[0].pos), revised)
    if truncated:
        return Extraction([], "truncated")  # no explicit final answer before the cut

    lines = [ln for ln in region.strip().split("\n") if ln.strip()]
    if lines:
        bolds = _BOLD_RE.findall(lines[-1])
        if bolds and re.search(r"[\d\\]|^\(?[A-J]\)?$", bolds[-1].strip()):
            return Extraction([bolds[-1].strip()], "bold", alternatives_after(region, region.rfind(lines[-1])))
    if fallback == "last_number":
        return _fallback(region)
    return Extraction([], None)


def _short_answer(s: str) -> bool:
    """An answer-tag content that is an answer, not a paragraph (a paragraph goes to the fallback)."""
    return len(s) <= MAX_STATEMENT and len([w for w in s.split() if w.isalpha() and len(w) > 1]) <= 6


# ----------------------------------------------------------------------------- the fallback
_DELIMITER_RE = re.compile(r"\\\\|\\\$|\$\$|\$|\\\(|\\\)|\\\[|\\\]")
_CLOSER = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
MAX_SEGMENT = 1500
# After the concluding math segment only the end of its sentence may follow ("$x > 3$ is the solution.").
_SENTENCE_TAIL_RE = re.compile(r"^[\s.,;:!?)]*(?:[^\s.!?\d$\\][^.!?\d$\\\n]{0,80})?[.!?]?[\s*_]*$")
_SEGMENT_SPLIT_RE = re.compile(
    r"\\(?:Rightarrow|Longrightarrow|implies|iff|therefore|approx|equiv|quad|qquad|sim|simeq|to)(?![a-zA-Z])|;|\\\\")
# "x = 5 \quad\text{or}\quad x = -5" is two answers, not "x = -5": no split at \quad then.
_SEGMENT_CONNECTOR_RE = re.compile(r"\\text\s*\{\s*(?:or|and)\s*\}|\\(?:lor|vee|land)(?![a-zA-Z])|\s(?:or|and)\s")
# A sentence that rejects the value before it: "$5$ is not the answer", "12 is wrong".
_NEGATED_AFTER_RE = re.compile(r"(?i)^[^.!?\n\d]{0,30}?(?:\b(?:is|are|was|were|does|do|would\s+be)\s+not\b|n't\b"
                               r"|\b(?:wrong|incorrect)\b)")
_MOD_RE = re.compile(r"\\pmod\s*\{[^{}]*\}|\\pmod\s*\w+|\(\s*\\(?:bmod|mod)\s*[^()]*\)|\\bmod\s*\w+")
_ENV_OPEN_RE = re.compile(r"\\begin\{([a-zA-Z]*matrix\*?|array)\}")
_PLAIN_SOLUTION_RE = re.compile(
    r"(?i)(?:^|(?<=[.!?:;\n]))\s*(?:(?:therefore|thus|hence|so|finally|consequently)\b,?\s*)?"
    r"(?P<value>[^.!?:;\n]{1,80}?)\s+(?:is|are)\s+(?:the|our)\s+(?:(?:only|final|complete|required|desired|"
    r"correct|unique)\s+)*(?:solutions?(?:\s+set)?|set\s+of\s+solutions|answers?)\b[^.!?\n\d]{0,60}[.!]?\s*$")
_PLAIN_VALUE_RE = re.compile(r"^[\w\s+\-*/^=<>!\u2264\u2265\u2260().,{}|\\]+$")


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
    for m in reversed(list(_ENV_OPEN_RE.finditer(s, max(0, index - MAX_SEGMENT), index))):
        close = s.find(f"\\end{{{m.group(1)}}}", index)
        if close >= 0:
            return m.start(), close + len(m.group(1)) + 6
    return None


def _segment_answer(content: str) -> str | None:
    """The answer in a concluding math segment: its last part after ``\\Rightarrow``, ``\\approx``,
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
    """The concluding value holding the last number (module docstring, tier 5), or None."""
    window = stripped.rfind("\n", 0, max(0, len(stripped) - 4 * MAX_SEGMENT)) + 1
    outer = None
    chain: list[str] = []
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
    if outer is None:
        env = _environment_span(stripped, last.start())
        if env is not None:
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


def _fallback(region: str) -> Extraction:
    """Tier 5: the concluding value, else the last number (module docstring)."""
    stripped = region.strip()
    last = None
    for last in NUMBER_RE.finditer(stripped):
        pass
    if last is None:
        return Extraction([], None)
    # A long response that stops on a digit or an operator was probably cut off mid-answer.
    if len(stripped) > 200 and _TRUNCATED_TAIL_RE.search(stripped[-64:]):
        return Extraction([], "truncated")
    line_start = stripped.rfind("\n", 0, last.start()) + 1
    concluded = _concluding_value(stripped, last)
    if concluded is not None:
        return Extraction([concluded], "conclusion", alternatives_after(stripped, line_start))
    if _NEGATED_BEFORE_RE.search(stripped[max(0, last.start() - 40): last.start()]) \
            or _NEGATED_AFTER_RE.match(stripped[last.end(): last.end() + 60]):
        return Extraction([], "negated")  # "the answer is not 42", "42 is wrong": the number is ruled out
    # only the end of the line: the pattern backtracks, and hostile lines are long
    tail = _THOUSANDS_RE.sub("N", stripped[max(line_start, last.end() - 200): last.end() + 3]).replace("N", "0")
    if _ENUMERATION_RE.search(tail) or _OR_PAIR_RE.search(tail):
        return Extraction([], "enumeration")
    return Extraction([last.group(0)], "last_number", alternatives_after(stripped, line_start))
