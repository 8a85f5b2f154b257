"""``numeric``: the last number in the completion equals the gold number.

The simplest verifiable reward, used by the quickstart's arithmetic task. It reads the final
number written in the completion (``-12``, ``3.5``, ``1,234``, ``+7``) and compares it with
``reference["answer"]`` using a relative tolerance, so that ``352`` and ``352.0`` agree and two
tiny but different values do not.

score = 1.0 if |x - gold| <= rel_tol * max(|x|, |gold|) + abs_tol else 0.0

A completion cut off at the token budget (``finish_reason="length"``) has no final number: its
last number is wherever the budget ran out (mid-reasoning, or the first digits of a longer number),
so it scores 0 with no answer extracted, unless ``allow_truncated=True``.
"""

from __future__ import annotations

import math
import re
import time

from rlvr.verifiers.base import Reward, Verifier
from rlvr.verifiers.registry import register_verifier

# A number with optional sign, thousands separators and decimals; the lookbehind keeps the "-" of
# "3-2" from being read as a sign of "2".
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|(?<![\w.])[-+]?\.\d+")


def parse_number(text: str) -> float | None:
    """The value of a number written like ``-1,234.5``; None when ``text`` is not one."""
    text = text.strip().replace(",", "")
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (as written), or None."""
    matches = _NUMBER.findall(text)
    return matches[-1] if matches else None


@register_verifier("numeric")
class NumericVerifier(Verifier):
    """1.0 when the final number of the completion equals ``reference["answer"]`` (relative tolerance)."""

    kind = "answer"
    in_process = True  # one linear regex scan and a float(): microseconds, whatever the text

    name = "numeric"
    description = "final number in the completion equals the gold number (relative tolerance)"

    def __init__(self, rel_tol: float = 1e-6, abs_tol: float = 0.0, allow_truncated: bool = False):
        if rel_tol < 0 or abs_tol < 0:
            raise ValueError("numeric: rel_tol and abs_tol must be >= 0")
        self.rel_tol = rel_tol
        self.abs_tol = abs_tol
        self.allow_truncated = allow_truncated

    def audit_cases(self) -> list[dict]:
        """Plain-number golden cases for ``rlvr verifiers audit`` (this verifier reads no LaTeX)."""
        from rlvr.verifiers.golden import NUMERIC_CASES, answer_probes

        return answer_probes(NUMERIC_CASES)

    def score(self, completion: str, reference: dict, *, finish_reason: str | None = None) -> Reward:
        start = time.perf_counter()
        if "answer" not in reference:
            return Reward(0.0, status="error", info={"error": "reference has no 'answer' field"})
        gold = parse_number(str(reference["answer"]))
        if gold is None:
            return Reward(0.0, status="error", info={"error": f"gold answer {reference['answer']!r} is not a number"})
        if finish_reason == "length" and not self.allow_truncated:
            return Reward(0.0, latency_s=time.perf_counter() - start, info={"extracted": None, "truncated": True})
        written = last_number(completion)
        value = parse_number(written) if written is not None else None
        correct = value is not None and math.isclose(value, gold, rel_tol=self.rel_tol, abs_tol=self.abs_tol)
        return Reward(
            float(correct),
            latency_s=time.perf_counter() - start,
            info={"extracted": written},
        )
