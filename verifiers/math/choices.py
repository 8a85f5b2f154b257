"""The multiple-choice letters an extracted answer names.

A response to a multiple-choice question may name its option in many ways: ``(D)``, ``**B**``,
``\\textbf{(A)}``, ``C) 42``, ``option B``, or a letter followed by its reasoning. The verifier
compares letters, not texts, and must see a hedge such as ``A or B`` as two letters.
"""

from __future__ import annotations

import re

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
