"""What a response says after it commits to an answer: a hedge or a self-correction.

Once a response has written an answer, a later one means one of two things, and the verifier must
tell them apart (see :mod:`verifiers.math.verifier`):

* a *hedge* proposes another candidate next to the first ("the answer is 3, or maybe 4",
  "Alternatively, it could be 4"): :func:`alternatives_after` returns such candidates, and a
  response that commits to two different answers scores 0;
* a *self-correction* replaces the earlier answer ("\\boxed{5}. Wait, that is wrong ...
  \\boxed{7}", "Actually, it's 13"): :func:`revision_cut` says where the answers that count begin,
  :func:`revision_values` finds the values a revision names without a marker, and
  :data:`RETRACTION_RE` recognises a retraction that withdraws the last answer of a cut-off response.

A revision with a hedge ("or maybe", "alternatively", ...) between the old and the new answer, or one
that *adds* an answer ("Actually, there is another root"), is not a correction: every answer counts.
"""

from __future__ import annotations

import re

from rlvr.verifiers.math.statements import MAX_STATEMENT, NEGATION_RE, Item, clean_statement, looks_like_answer

# Phrases that propose another answer next to the committed one ("the answer is 3, or maybe 4",
# "Alternatively, it could be 4", "Wait, no, it's 4"): what follows them joins the candidates.
_ALTERNATIVE_CUE_RE = re.compile(
    r"(?i)(?:\bor\s+(?:maybe|perhaps|possibly)\b"
    r"|\b(?:could|might|may|can)\s+also\s+be\b"
    r"|\balternatively,?\s+(?:the\s+answer\s+)?(?:(?:it|this|that)\s+)?(?:could|might|may|would|is)\s+(?:also\s+)?(?:be\b)?"
    r"|\banother\s+(?:possible\s+)?(?:answer|option|value|solution)\s+(?:is|would\s+be|could\s+be|might\s+be)\b"
    r"|\bor\s+(?:it\s+|the\s+answer\s+)?(?:could|might|may)\s+be\b"
    r"|\banswer\s+(?:would|could|might)\s+(?:instead\s+)?be\b"
    r"|\(\s*or\b(?!\s+(?:else|otherwise|not)\b))"
    r"[\s:*$]*")
# A revision that names its new value ("Wait, no, it's 4", "Actually, it's 13"): the value is a later answer.
_REVISION_VALUE_RE = re.compile(
    r"(?i)\b(?:actually|wait|oops|correction|no)\b[,.!:]?\s+(?:no[,.!]?\s+)?"
    r"(?:it'?s|it\s+is|the\s+answer\s+is|that'?s|i\s+think\s+it'?s)\b[\s:*$]*")
# An explicit revision of what was written before: a sentence opening with "Wait", "Actually", "No,",
# "Oops", or "that is wrong", "I made a mistake", "let me recheck". Answers after it replace those before.
_REVISION_RE = re.compile(
    r"(?im)(?:(?:^|(?<=[.!?;:\n]))[ \t\n]*(?:\*\*)?(?:(?:hmm+|oh|ah|uh|um+|well|but)[,.!]*\s+)?"
    r"(?:wait|hold\s+on|oops|whoops|actually|no|nope|correction|"
    r"on\s+second\s+thought|scratch\s+that)\b(?!\s+(?:matter|one|other|longer|more|further|solutions?|real|such|"
    r"need|way)\b)"
    r"|\b(?:that|this|it|which)(?:'s|\s+is|\s+was)\s+(?:wrong|incorrect|not\s+(?:right|correct))\b"
    r"|\b(?:i|we)\s+(?:made|have\s+made|'ve\s+made)\s+(?:a|an)\s+(?:\w+\s+)?(?:mistake|error)\b"
    r"|\bmy\s+(?:mistake|error|bad)\b|\b(?:i|we)\s+(?:was|were)\s+wrong\b|\b(?:i|we)\s+miscalculated\b"
    r"|\blet(?:\s+(?:me|us)|'s)\s+(?:re-?check|re-?calculate|recompute|re-?do|re-?examine|re-?consider|re-?evaluate|"
    r"correct|fix)\b)")
# A retraction strong enough to withdraw the last answer of a cut-off response with nothing after it.
RETRACTION_RE = re.compile(
    r"(?i)\b(?:that|this|it|which)(?:'s|\s+is|\s+was)\s+(?:wrong|incorrect|not\s+(?:right|correct))\b"
    r"|\b(?:i|we)\s+(?:made|have\s+made|'ve\s+made)\s+(?:a|an)\s+(?:\w+\s+)?(?:mistake|error)\b"
    r"|\bmy\s+(?:mistake|error)\b|\b(?:i|we)\s+(?:was|were)\s+wrong\b|\b(?:i|we)\s+miscalculated\b"
    r"|\bscratch\s+that\b|\blet\s+me\s+(?:redo|start\s+over)\b")
# Between a retracted answer and its replacement these make it a hedge, not a correction.
_GAP_HEDGE_RE = re.compile(
    r"(?i)\bor\s+(?:maybe|perhaps|possibly)\b|\balternative(?:ly|s)?\b|\b(?:could|might|may)\s+also\s+be\b"
    r"|\banother\s+(?:possible\s+)?(?:answer|option|value|solution)\b|\beither\b|\bcandidates?\b")
_ADDITION_RE = re.compile(r"(?i)\banother\b|\balso\b|\bas\s+well\b|\badditional(?:ly)?\b|\bin\s+addition\b"
                          r"|\b(?:second|other)\s+(?:root|solution|answer|value|case)s?\b")
_GAP_OR_RE = re.compile(r"(?i)^[\s$.,;:*)\]}]*or\b")
# A word that ends the clause holding a proposed value ("4, depending on the base", "5 if ...").
_CONNECTIVE_RE = re.compile(r"(?i)\s(?:because|since|as|which|if|when|where|depending|but|so|for|given|though|although|instead)\b")


def alternatives_after(text: str, start: int) -> list[str]:
    """Answers proposed by hedging phrases in ``text[start:]`` (see ``_ALTERNATIVE_CUE_RE``): what
    follows the cue up to the end of its clause ("..., it could be \\sqrt{63} if we ..." -> \\sqrt{63})."""
    found = []
    for cue in _ALTERNATIVE_CUE_RE.finditer(text, start):
        line = text[cue.end(): cue.end() + MAX_STATEMENT].split("\n", 1)[0]
        value = _clause(clean_statement(line))
        if value and looks_like_answer(value):
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


def revision_values(region: str, start: int) -> list[Item]:
    """Answers named by a revision after ``start`` ("Wait, no, it's 4" -> 4)."""
    found = []
    for n, cue in enumerate(_REVISION_VALUE_RE.finditer(region, start)):
        if n >= 64:
            break
        line = region[cue.end(): cue.end() + MAX_STATEMENT].split("\n", 1)[0]
        value = _clause(clean_statement(line))
        if value and looks_like_answer(value) and not NEGATION_RE.match(value):
            found.append(Item(cue.end(), cue.end() + len(value), value))
        if len(found) >= 8:
            break
    return found


def revision_cut(region: str, items: list[Item]) -> int | None:
    """Where the answers that count begin: the last explicit revision with answers before and after it,
    unless a hedge sits between them (then every answer counts and the verifier sees the hedge)."""
    if len(items) < 2:
        return None
    cues = list(_REVISION_RE.finditer(region, items[0].end, items[-1].pos))[-64:]
    for cue in reversed(cues):
        before = [i for i in items if i.end <= cue.start()]
        after = [i for i in items if i.pos >= cue.end()]
        if not before or not after:
            continue
        gap = region[before[-1].end: after[0].pos]
        if _GAP_HEDGE_RE.search(gap) or _GAP_OR_RE.match(gap):
            return None
        if _ADDITION_RE.search(region[cue.start(): cue.end() + 100]) or _ADDITION_RE.search(gap[-100:]):
            return None  # "Actually, there is another root: \boxed{5}" adds an answer, it does not replace one
        return cue.start()
    return None
