"""``format``: does the response have the required structure?

Styles:

* ``think_answer`` (default, the R1-Zero template): ``<think>reasoning</think>`` then
  ``<answer>final answer</answer>``, each tag exactly once, in that order, nothing but whitespace
  before ``<think>`` or after ``</answer>``;
* ``think``: ``<think>reasoning</think>`` then a non-empty final part;
* ``boxed``: exactly one non-empty ``\\boxed{...}``;
* ``regex``: ``pattern`` must match (``match="full"``: the whole response; ``"search"``: anywhere).

Format hacks score 0: an empty (or near-empty, < ``min_think_chars`` non-blank characters) think
block, an empty answer, duplicated or nested tags, tags out of order, text outside the template.
With ``think_prefilled=True`` the prompt already ends with ``<think>``, so the response must not
repeat it.

score = 1.0 when every check passes, else 0.0 (``partial=True``: the fraction of checks passed).
The checks and their outcomes are in ``info["checks"]``.
"""

from __future__ import annotations

import re
import time

from rlvr.verifiers.base import Reward, Verifier
from rlvr.verifiers.math.extract import find_boxed
from rlvr.verifiers.registry import register_verifier

STYLES = ("think_answer", "think", "boxed", "regex")


@register_verifier("format")
class FormatVerifier(Verifier):
    """Structure of the response: think/answer tags, one box, or a regex (see the module docstring)."""

    name = "format"
    description = "response structure: <think>..</think><answer>..</answer>, one \\boxed{}, or a regex; empty think = 0"

    def __init__(self, style: str = "think_answer", think_tag: str = "think", answer_tag: str = "answer",
                 min_think_chars: int = 1, think_prefilled: bool = False, pattern: str | None = None,
                 match: str = "full", partial: bool = False):
        if style not in STYLES:
            raise ValueError(f"format: style must be one of {STYLES}, got {style!r}")
        if style == "regex" and not pattern:
            raise ValueError("format: style 'regex' needs a 'pattern'")
        if match not in ("full", "search"):
            raise ValueError("format: match must be 'full' or 'search'")
        self.style = style
        self.think_tag = think_tag
        self.answer_tag = answer_tag
        self.min_think_chars = int(min_think_chars)
        self.think_prefilled = think_prefilled
        self.pattern = pattern
        self.match = match
        self.partial = partial
        self._regex = re.compile(pattern, re.S) if pattern else None

    def score(self, completion: str, reference: dict) -> Reward:
        start = time.perf_counter()
        text = completion or ""
        if self.style == "regex":
            found = self._regex.fullmatch(text) if self.match == "full" else self._regex.search(text)
            checks = {"pattern": found is not None}
        elif self.style == "boxed":
            boxes = find_boxed(text)
            checks = {"one_box": len(boxes) == 1, "box_nonempty": bool(boxes) and bool(boxes[-1][2].strip())}
        else:
            checks = self._tag_checks(text)
        passed = sum(checks.values())
        score = passed / len(checks) if self.partial else float(passed == len(checks))
        return Reward(score, latency_s=time.perf_counter() - start, info={"checks": checks})

    def audit_cases(self) -> list[dict]:
        """Golden structure and format hacks for ``rlvr verifiers audit`` (think/answer styles only)."""
        from rlvr.verifiers.golden import format_probes

        if self.style != "think_answer" or self.think_prefilled or (self.think_tag, self.answer_tag) != ("think", "answer"):
            return []
        return format_probes()

    def _tag_checks(self, text: str) -> dict[str, bool]:
        t_open, t_close = f"<{self.think_tag}>", f"</{self.think_tag}>"
        a_open, a_close = f"<{self.answer_tag}>", f"</{self.answer_tag}>"
        counts = {tag: text.count(tag) for tag in (t_open, t_close, a_open, a_close)}
        expected_open = 0 if self.think_prefilled else 1
        checks = {"think_tags_once": counts[t_open] == expected_open and counts[t_close] == 1}
        body_start = 0 if self.think_prefilled else text.find(t_open) + len(t_open)
        think_end = text.find(t_close)
        think_body = text[body_start:think_end] if checks["think_tags_once"] and think_end >= body_start else ""
        checks["think_nonempty"] = len(re.sub(r"\s+", "", think_body)) >= max(1, self.min_think_chars)
        prefix = text[: text.find(t_open)] if not self.think_prefilled and t_open in text else ""
        after_think = text[think_end + len(t_close):] if think_end >= 0 else ""
        if self.style == "think":
            checks["nothing_before_think"] = not prefix.strip()
            checks["final_nonempty"] = bool(after_think.strip())
            return checks
        checks["answer_tags_once"] = counts[a_open] == 1 and counts[a_close] == 1
        a_start, a_end = after_think.find(a_open), after_think.find(a_close)
        checks["in_order"] = checks["answer_tags_once"] and 0 <= a_start < a_end
        inner = after_think[a_start + len(a_open): a_end] if checks["in_order"] else ""
        checks["answer_nonempty"] = bool(inner.strip())
        outside = prefix + (after_think[:a_start] + after_think[a_end + len(a_close):] if checks["in_order"] else "x")
        checks["nothing_outside"] = not outside.strip()
        return checks
