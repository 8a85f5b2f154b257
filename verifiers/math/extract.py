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
5. with ``fallback="last_number"``, a bare answer (a short response that is one math segment or
   one formula: ``$\\frac13$``, ``1 000``), else the concluding value: the math segment
   (``$...$``, ``\\[...\\]``, a matrix environment) holding the last number when it ends the last
   sentence ("Therefore $(p, q) = (3, 2)$." -> the pair; a matrix stays a matrix), or ``X`` in "X is
   the solution"; else the last number. Refused where the response ends in the middle of a number
   or an expression (it looks truncated), the number closes an enumeration (``1, 2, 3, 4, 5``) or
   sits in a matrix too long to read (see fallback.py).

Tiers 1-3 are *explicit* final-answer markers. A response cut off by the length limit
(``finish_reason="length"``) has an answer only through one of them, and none while its reasoning
block (``<think>``) is still open or when it retracted its last answer ("that is wrong") before
the cut. A response whose reasoning block is still open at its end (``<think>`` with no
``</think>`` after it) was cut off while thinking, whatever its finish reason: only tiers 1-3
count there, never a bold value or the last number of its reasoning.

A box that is the result of a step of a worked computation (``... = \\boxed{200}$ So, ...``), followed
by more working and then an explicit "Final Answer" statement, is a highlighted intermediate result:
the final statement is the answer (``\\boxed{200} ... \\boxed{255} ... Final Answer: 10,455``). A box
not written as such a step still counts next to the statement (hedging).

Every answer of the winning tier is returned, plus any box or statement written *after* its last
one, so that the verifier can see a response that commits to two different answers (hedging).
A *self-correction* is not hedging: when an explicit revision ("Wait, that is wrong", "Actually,",
"I made a mistake", "let me recheck") separates earlier answers from later ones, with no hedge
("or maybe", "alternatively", ...) between them, only the answers after it count.
The final region is what follows the closing ``</think>`` tag when there is one.

This module holds :func:`extract`, which applies the tiers in order, and the markers that need no
reading (tags, boxes, the last bold); each other concept has its own module::

    special_tokens.py    cutting at the chat-template token that ends the turn
    statements.py        tier 3, and reading the value out of the sentence that states an answer
    self_correction.py   later answers: hedges (alternatives) against revisions (self-corrections)
    fallback.py          tier 5: the concluding value, else the last number, and when to refuse
    choices.py           the multiple-choice letters an extracted answer names

``choice_letters`` and ``cut_at_special_tokens`` are importable from here as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rlvr.verifiers.math.choices import choice_letters  # noqa: F401  (importable from here as before)
from rlvr.verifiers.math.fallback import fallback_answers
from rlvr.verifiers.math.normalize import matching_brace
from rlvr.verifiers.math.self_correction import RETRACTION_RE, alternatives_after, revision_cut, revision_values
from rlvr.verifiers.math.special_tokens import cut_at_special_tokens
from rlvr.verifiers.math.statements import MAX_STATEMENT, Item, find_statements

MAX_BOXES = 64

_BOX_RE = re.compile(r"\\(?:boxed|fbox|framebox)\s*(\{|\s+(?=\S))")
_BOLD_RE = re.compile(r"\*\*([^*\n]{1,80}?)\*\*")


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
    thinking = bool(think_tag) and text.rfind(f"<{think_tag}>") > text.rfind(f"</{think_tag}>")

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
                answers.extend(fallback_answers(content)[0])
        return Extraction([a for a in answers if a.strip()], "answer_tag", alternatives)

    boxes = find_boxed(region)
    last_open = region.rfind("\\boxed{")
    if last_open >= (boxes[-1][1] if boxes else 0) and last_open >= 0:
        return Extraction([], "truncated")  # the last box was never closed: the response was cut off
    statements = find_statements(region)
    if boxes:
        items = [Item(start, end, content) for start, end, content in boxes]
        after = [s for s in statements if s.pos >= boxes[-1][1]]
        items += after
        source = "boxed"
        if after and _intermediate_boxes(region, boxes, after[-1]):
            items, source = after, "statement"
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
    if thinking:
        return Extraction([], "unclosed_think")  # cut off while reasoning: its last number is not an answer

    lines = [ln for ln in region.strip().split("\n") if ln.strip()]
    if lines:
        bolds = _BOLD_RE.findall(lines[-1])
        if bolds and re.search(r"[\d\\]|^\(?[A-J]\)?$", bolds[-1].strip()):
            return Extraction([bolds[-1].strip()], "bold", alternatives_after(region, region.rfind(lines[-1])))
    if fallback == "last_number":
        return Extraction(*fallback_answers(region))
    return Extraction([], None)


_STEP_BEFORE_RE = re.compile(r"=\s*\$*\s*$")
_FINAL_ANSWER_BEFORE_RE = re.compile(r"(?i)final\s+answer[^\n]{0,40}$")
MIN_WORKING_AFTER_BOX = 40


def _intermediate_boxes(region: str, boxes: list[tuple[int, int, str]], final: Item) -> bool:
    """Every box is the result of a computation step (right after ``=``) with more working after it,
    and ``final`` is an explicit "Final Answer" statement (module docstring)."""
    if not _FINAL_ANSWER_BEFORE_RE.search(region[max(0, final.pos - 60): final.pos]):
        return False
    if final.pos - boxes[-1][1] < MIN_WORKING_AFTER_BOX:
        return False  # "x = \boxed{5}. Final Answer: 7": two answers side by side, not a step and a conclusion
    return all(_STEP_BEFORE_RE.search(region[max(0, start - 40): start]) for start, _, _ in boxes)


def _short_answer(s: str) -> bool:
    """An answer-tag content that is an answer, not a paragraph (a paragraph goes to the fallback)."""
    return len(s) <= MAX_STATEMENT and len([w for w in s.split() if w.isalpha() and len(w) > 1]) <= 6
