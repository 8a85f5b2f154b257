"""Find the final answer(s) a response commits to.

Markers, strongest first (the first tier present wins):

1. ``<answer>...</answer>`` tags (their content is searched again for the markers below);
2. ``\\boxed{...}`` / ``\\fbox{...}`` (every box in the final region);
3. statements: "the answer is ...", "final answer: ...", an ``Answer:`` line (markdown allowed:
   ``**Answer: B**``), a "Final Answer" heading followed by its line, GSM8K's ``#### N``;
4. a bold ``**...**`` on the last line;
5. the last number (``fallback="last_number"``), refused where the response ends in the middle of
   a number or an expression (it looks truncated) or the number closes an enumeration
   (``1, 2, 3, 4, 5``): a match there would be luck, not an answer.

Every answer of the winning tier is returned, plus any box or statement written *after* its last
one, so that the verifier can see a response that commits to two different answers (hedging).
The final region is what follows the closing ``</think>`` tag when there is one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rlvr.verifiers.math.normalize import matching_brace

MAX_BOXES = 64
MAX_STATEMENT = 300

_BOX_RE = re.compile(r"\\(?:boxed|fbox|framebox)\s*(\{|\s+(?=\S))")
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
_BOLD_RE = re.compile(r"\*\*([^*\n]{1,80}?)\*\*")
_NUMBER_RE = re.compile(r"(?<![\w.^])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?(?:\s*\\?%)?(?![\w])|(?<![\w.])[-+]?\.\d+")
_SENTENCE_END_RE = re.compile(r"\.(?=\s|$)|(?<!\\)[;!?](?=\s|$)")  # not LaTeX's \! or \;
_NEGATION_RE = re.compile(r"(?i)^\s*(?:not\b|never\b|wrong|incorrect|unclear|unknown|n't)")
_ENUMERATION_RE = re.compile(
    r"(?:\d[\d.,/]*\s*(?:,\s*(?:or\b|and\b)?|\bor\b|\band\b|;)\s*){2,}[-+]?\d[\d.,/]*\s*\W{0,3}$")
_OR_PAIR_RE = re.compile(r"\d[\d./]*\s*(?:,\s*(?:or\b)?|\bor\b)(?:\s+(?:maybe|perhaps|possibly|even))?\s*[-+]?\d[\d./]*\s*\W{0,3}$")
_NEGATED_BEFORE_RE = re.compile(r"(?i)(?:\bnot|n't|\bnever|\bno\s+longer)\s+(?:equal\s+to\s+|be\s+|exactly\s+)?\$?$")
_MARKDOWN_BOLD_RE = re.compile(r"(?<![\w)\]])\*\*|\*\*(?![\w(\[])")  # "**73**" but not "10**23"
_THOUSANDS_RE = re.compile(r"\d{1,3}(?:,\d{3})+(?!\d)")
_MATH_SEGMENT_RE = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)", re.S)
_CONNECTOR_RE = re.compile(r"(?i)^\s*(?:,?\s*(?:or|and)\s*|,\s*)$")
# Phrases that propose another answer next to the committed one ("the answer is 3, or maybe 4",
# "Alternatively, it could be 4", "Wait, no, it's 4"): what follows them joins the candidates.
_ALTERNATIVE_CUE_RE = re.compile(
    r"(?i)(?:\bor\s+(?:maybe|perhaps|possibly)\b"
    r"|\b(?:could|might|may|can)\s+also\s+be\b"
    r"|\balternatively,?\s+(?:the\s+answer\s+)?(?:(?:it|this|that)\s+)?(?:could|might|may|would|is)\s+(?:also\s+)?(?:be\b)?"
    r"|\banother\s+(?:possible\s+)?(?:answer|option|value|solution)\s+(?:is|would\s+be|could\s+be|might\s+be)\b"
    r"|\bor\s+(?:it\s+|the\s+answer\s+)?(?:could|might|may)\s+be\b"
    r"|\banswer\s+(?:would|could|might)\s+(?:instead\s+)?be\b"
    r"|\(\s*or\b(?!\s+(?:else|otherwise|not)\b)"
    r"|\b(?:actually|wait|oops|correction|no)\b[,.!:]?\s+(?:no[,.!]?\s+)?(?:it'?s|it\s+is|the\s+answer\s+is|that'?s|i\s+think\s+it'?s)\b)"
    r"[\s:*$]*")
_CONNECTIVE_RE = re.compile(r"(?i)\s(?:because|since|as|which|if|when|where|depending|but|so|for|given|though|although|instead)\b")
_TRUNCATED_TAIL_RE = re.compile(r"(?:[-+*/=^(\[{,]|\\[a-zA-Z]*|\d)$")


@dataclass
class Extraction:
    """Answers found in a response: ``answers`` in text order, from marker ``source``; ``alternatives``
    are other answers the response proposes after committing ("..., or maybe 4")."""

    answers: list[str] = field(default_factory=list)
    source: str | None = None
    alternatives: list[str] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return bool(self.answers)


def alternatives_after(text: str, start: int) -> list[str]:
    """Answers proposed by hedging phrases in ``text[start:]`` (see ``_ALTERNATIVE_CUE_RE``): what
    follows the cue up to the end of its clause ("..., it could be \\sqrt{63} if we ..." -> \\sqrt{63})."""
    found = []
    for cue in _ALTERNATIVE_CUE_RE.finditer(text, start):
        line = text[cue.end(): cue.end() + MAX_STATEMENT].split("\n", 1)[0]
        value = _clause(_clean_statement(line))
        if value and _looks_like_answer(value):
            found.append(value)
        if len(found) >= 8:
            break
    return found


def _clause(s: str) -> str:
    """``"4, depending on the base"`` -> ``"4"``: cut at a top-level comma or a connecting word."""
    m = _CONNECTIVE_RE.search(s)
    if m:
        s = s[: m.start()]
    depth = 0
    for i, c in enumerate(s):
        depth += c in "([{"
        depth -= c in ")]}"
        if depth < 0:  # the ")" closing "(or 4)"
            return s[:i].strip()
        if c == "," and depth == 0 and s[i + 1: i + 2] == " ":
            return s[:i].strip()
    return s.strip()


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
        if not _CONNECTOR_RE.match(gap) and gap.strip():
            break
        chain.append(gap.strip() or ",")
        chain.append(next(g for g in seg.groups() if g is not None))
    return " ".join(chain)


def _clean_statement(rest: str) -> str:
    """The answer part of a statement line: its first sentence (a period inside ``$...$`` does not
    end it), then its math segments if it has any, with fillers and markdown removed."""
    rest = _MARKDOWN_BOLD_RE.sub(" ", rest).replace("__", " ").strip(" *_\t")
    spans = [m.span() for m in _MATH_SEGMENT_RE.finditer(rest)]
    for end in _SENTENCE_END_RE.finditer(rest):
        if not any(a <= end.start() < b for a, b in spans):
            rest = rest[: end.start()]
            break
    chain = _math_chain(rest)
    if chain is not None:
        return chain.strip()
    rest = _FILLER_RE.sub("", rest.strip())
    return rest.strip(" *_\t:")


def _statements(text: str) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for regex in _STATEMENT_RES:
        pos = 0
        while True:  # overlapping search: "the answer is not 5, it is 6. Answer: 6" holds two statements
            m = regex.search(text, pos)
            if not m:
                break
            found.append((m.start("rest"), _clean_statement(m.group("rest"))))
            pos = m.start("rest")
    for m in _HEADING_RE.finditer(text):
        following = text[m.end():].lstrip("\n")
        line = following.split("\n", 1)[0] if following else ""
        found.append((m.start(), _clean_statement(line[:MAX_STATEMENT])))
    for m in _GSM8K_RE.finditer(text):
        found.append((m.start(), _clean_statement(m.group("rest"))))
    unique = {pos: s for pos, s in found}  # both regexes may find the same statement
    return sorted((pos, s) for pos, s in unique.items() if s and not _NEGATION_RE.match(s) and _looks_like_answer(s))


def _short_answer(s: str) -> bool:
    """An answer-tag content that is an answer, not a paragraph (a paragraph goes to the fallback)."""
    return len(s) <= MAX_STATEMENT and len([w for w in s.split() if w.isalpha() and len(w) > 1]) <= 6


def _looks_like_answer(s: str) -> bool:
    """Drop prose that follows "answer is" in passing ("the answer is what we need to find")."""
    words = s.lower().split()
    if len([w for w in words if w.isalpha() and len(w) > 1]) > 5:
        return False  # a sentence, not an answer
    if len(words[0]) >= 3 and words[0].strip(".,:;") in _PROSE_START:
        return False
    if re.search(r"[\d\\$^=(){}]|\b[A-J]\b", s):
        return True
    return len(words) <= 3 and words[0] not in _PROSE_START


def extract(text: str, *, think_tag: str | None = "think", fallback: str = "last_number",
            max_chars: int = 20_000) -> Extraction:
    """The answers ``text`` commits to (module docstring); ``Extraction([])`` when there is none."""
    if len(text) > max_chars:
        text = text[-max_chars:]  # the final answer is at the end; hostile megabytes are not read
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
                answers.extend(_last_number(content).answers)
        return Extraction([a for a in answers if a.strip()], "answer_tag", alternatives)

    boxes = find_boxed(region)
    last_open = region.rfind("\\boxed{")
    if last_open >= (boxes[-1][1] if boxes else 0) and last_open >= 0:
        return Extraction([], "truncated")  # the last box was never closed: the response was cut off
    statements = _statements(region)
    if boxes:
        last_box_end = boxes[-1][1]
        later = [s for pos, s in statements if pos >= last_box_end]
        return Extraction([b[2] for b in boxes] + later, "boxed", alternatives_after(region, boxes[0][0]))
    if statements:
        return Extraction([s for _, s in statements], "statement", alternatives_after(region, statements[0][0]))

    lines = [ln for ln in region.strip().split("\n") if ln.strip()]
    if lines:
        bolds = _BOLD_RE.findall(lines[-1])
        if bolds and re.search(r"[\d\\]|^\(?[A-J]\)?$", bolds[-1].strip()):
            return Extraction([bolds[-1].strip()], "bold", alternatives_after(region, region.rfind(lines[-1])))
    if fallback == "last_number":
        return _last_number(region)
    return Extraction([], None)


def _last_number(region: str) -> Extraction:
    stripped = region.strip()
    matches = list(_NUMBER_RE.finditer(stripped))
    if not matches:
        return Extraction([], None)
    last = matches[-1]
    # A long response that stops on a digit or an operator was probably cut off mid-answer.
    if len(stripped) > 200 and _TRUNCATED_TAIL_RE.search(stripped[-64:]):
        return Extraction([], "truncated")
    if _NEGATED_BEFORE_RE.search(stripped[max(0, last.start() - 40): last.start()]):
        return Extraction([], "negated")  # "the answer is not 42": the last number is the one ruled out
    line_start = stripped.rfind("\n", 0, last.start()) + 1
    # only the end of the line: the pattern backtracks, and hostile lines are long
    tail = _THOUSANDS_RE.sub("N", stripped[max(line_start, last.end() - 200): last.end() + 3]).replace("N", "0")
    if _ENUMERATION_RE.search(tail) or _OR_PAIR_RE.search(tail):
        return Extraction([], "enumeration")
    return Extraction([last.group(0)], "last_number", alternatives_after(stripped, line_start))


_CHOICE_LEAD_RE = re.compile(r"^\s*(?:option|choice)?\s*\(?\s*([A-J])\s*\)?(?=$|[\s.:)\],;])")
_CHOICE_PAREN_RE = re.compile(r"\(\s*([A-J])\s*\)")
_CHOICE_BARE_RE = re.compile(r"(?<![A-Za-z\\])([A-J])(?![A-Za-z])")
_CHOICE_JOIN_RE = re.compile(r"^\s*(?:\bor\b|\band\b|/|,|&|\\lor|\\vee)\s*\(?\s*([A-J])\s*\)?(?![A-Za-z])")


def choice_letters(answer: str, allowed: str) -> set[str]:
    """Multiple-choice letters an answer names: ``(D)``, ``**B**``, ``\\textbf{(A)}``, ``C) 42``.

    An answer that *starts* with a letter names that letter (``B because C is wrong`` names B) plus
    any letter joined to it by "or", "and", "/" or a comma (``A or B`` names both: a hedge).
    """
    s = re.sub(r"\\(?:text|textbf|mathbf|mathrm|textit|boxed)\s*\{([^{}]*)\}", r"\1", answer)
    s = s.replace("*", " ").replace("$", " ").replace("\\(", " ").replace("\\)", " ").strip()
    lead = _CHOICE_LEAD_RE.match(s)
    if lead and lead.group(1) in allowed:
        letters = {lead.group(1)}
        rest = s[lead.end():]
        while True:
            joined = _CHOICE_JOIN_RE.match(rest)
            if not joined:
                break
            letters.add(joined.group(1))
            rest = rest[joined.end():]
        return letters
    paren = {c for c in _CHOICE_PAREN_RE.findall(s) if c in allowed}
    if paren:
        return paren
    bare = set()
    for m in _CHOICE_BARE_RE.finditer(s):
        letter = m.group(1)
        after = s[m.end(): m.end() + 2]
        if letter == "A" and re.match(r" [a-z]", after):  # the article "A total of"
            continue
        if letter in allowed:
            bare.add(letter)
    return bare
