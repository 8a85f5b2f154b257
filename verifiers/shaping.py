"""Shaping rewards: ``length`` and ``repetition``. Usually parts of a ``compose`` (see compose.py).

``length``, ``mode="overlong"`` — DAPO's soft overlong punishment (Yu et al., 2025). With
``L`` the response length, ``L_max = max_length`` and ``L_cache = buffer``::

    R = 0                                  if L <= L_max - L_cache
    R = ((L_max - L_cache) - L) / L_cache  if L_max - L_cache < L <= L_max   (linear, 0 -> -1)
    R = -1                                 if L > L_max

``length``, ``mode="cosine"`` — cosine length scaling (Yeo et al., 2025, "Demystifying Long
Chain-of-Thought Reasoning"): correct answers earn more when short, wrong answers are punished
less when long (the model may keep thinking when it has not found the answer yet)::

    t = L / L_max
    R = r_end + (r_start - r_end) * (1 + cos(pi * t)) / 2        for L < L_max
    R = exceed_reward                                            for L >= L_max
    (r_start, r_end) = (correct_start, correct_end) if correct else (wrong_start, wrong_end)

correctness comes from another verifier (``correctness``, default ``{"name": "math"}``) and is kept
in ``components["correct"]``; its timeout/error is this reward's status.

``repetition`` — n-gram repetition penalty (Yeo et al., 2025). With the response split into
``unit`` tokens (words by default) and ``G`` its list of ``n``-grams::

    R = max_penalty * (1 - |set(G)| / |G|)        (0 when the response has fewer than n tokens)

so ``R`` runs from 0 (no n-gram repeats) towards ``max_penalty`` (<= 0) as the response loops.

Lengths are measured in ``unit``: ``chars``, ``words`` (whitespace-separated), or ``tokens`` taken
from ``reference[length_key]`` (the trainer knows the token count; the verifier only sees text).
"""

from __future__ import annotations

import math
import time

from rlvr.verifiers.base import Reward, Verifier, coerce_reward
from rlvr.verifiers.registry import get_verifier, register_verifier

UNITS = ("chars", "words", "tokens")


def measure(completion: str, reference: dict, unit: str, length_key: str) -> int:
    """The response length in ``unit`` (``tokens`` reads ``reference[length_key]``)."""
    if unit == "chars":
        return len(completion)
    if unit == "words":
        return len(completion.split())
    if length_key not in reference:
        raise KeyError(f"unit 'tokens' needs reference[{length_key!r}] (the completion's token count)")
    return int(reference[length_key])


def overlong_penalty(length: int, max_length: int, buffer: int) -> float:
    """DAPO's soft overlong punishment (module docstring)."""
    threshold = max_length - buffer
    if length <= threshold:
        return 0.0
    if length <= max_length:
        return (threshold - length) / buffer
    return -1.0


def cosine_reward(length: int, max_length: int, start: float, end: float, exceed: float) -> float:
    """Cosine interpolation from ``start`` (length 0) to ``end`` (length ``max_length``)."""
    if length >= max_length:
        return exceed
    return end + (start - end) * (1.0 + math.cos(math.pi * length / max_length)) / 2.0


@register_verifier("length")
class LengthVerifier(Verifier):
    """Length shaping: DAPO overlong punishment or cosine length scaling (see the module docstring)."""

    name = "length"
    description = "length shaping: DAPO soft overlong punishment, or cosine length-scaled correctness"

    def __init__(self, mode: str = "overlong", max_length: int = 4096, buffer: int = 1024, unit: str = "chars",
                 length_key: str = "completion_tokens", correctness: dict | None = None,
                 correct_start: float = 2.0, correct_end: float = 1.0, wrong_start: float = -10.0,
                 wrong_end: float = 0.0, exceed_reward: float = -10.0):
        if mode not in ("overlong", "cosine"):
            raise ValueError("length: mode must be 'overlong' or 'cosine'")
        if unit not in UNITS:
            raise ValueError(f"length: unit must be one of {UNITS}")
        if max_length <= 0 or (mode == "overlong" and not 0 < buffer <= max_length):
            raise ValueError("length: need max_length > 0 and, for overlong, 0 < buffer <= max_length")
        self.mode, self.max_length, self.buffer, self.unit, self.length_key = mode, int(max_length), int(buffer), unit, length_key
        self.correct = (float(correct_start), float(correct_end))
        self.wrong = (float(wrong_start), float(wrong_end))
        self.exceed_reward = float(exceed_reward)
        self.correctness = None
        self.in_process = mode == "overlong"  # a length and a formula; cosine mode calls a full verifier
        if mode == "cosine":
            spec = dict(correctness or {"name": "math"})
            self.correctness = get_verifier(spec.pop("name"), **spec.pop("options", {}), **spec)

    def audit_cases(self) -> list[dict]:
        """Exact expected scores at chosen lengths, for ``rlvr verifiers audit``."""
        cases = []
        if self.mode == "overlong":
            lengths = [0, self.max_length - self.buffer, self.max_length - self.buffer // 2, self.max_length,
                       self.max_length + 1]
            for i, n in enumerate(lengths, 1):
                text, ref = self._text_of_length(n)
                cases.append({"id": f"golden-{i:02d}", "category": "golden", "completion": text, "reference": ref,
                              "expect": overlong_penalty(n, self.max_length, self.buffer)})
            return cases
        for i, (answer, correct) in enumerate([("42", True), ("41", False)], 1):
            text = f"so the answer is \\boxed{{{answer}}}"
            n = len(text) if self.unit == "chars" else len(text.split())
            ref = {"answer": "42", self.length_key: n}
            r_start, r_end = self.correct if correct else self.wrong
            cases.append({"id": f"golden-{i:02d}", "category": "golden", "completion": text, "reference": ref,
                          "expect": cosine_reward(n, self.max_length, r_start, r_end, self.exceed_reward)})
        return cases

    def _text_of_length(self, n: int) -> tuple[str, dict]:
        if self.unit == "chars":
            return "a" * n, {}
        if self.unit == "words":
            return "a " * n, {}
        return "a", {self.length_key: n}

    def score(self, completion: str, reference: dict) -> Reward:
        start = time.perf_counter()
        try:
            length = measure(completion or "", reference, self.unit, self.length_key)
        except (KeyError, TypeError, ValueError) as exc:
            return Reward(0.0, status="error", info={"error": str(exc)})
        info: dict = {"length": length}
        if self.mode == "overlong":
            value = overlong_penalty(length, self.max_length, self.buffer)
            return Reward(value, latency_s=time.perf_counter() - start, info=info)
        verdict = coerce_reward(self.correctness.score(completion, reference))
        info["extracted"] = verdict.info.get("extracted")
        if verdict.status != "ok":
            info["error"] = verdict.info.get("error", f"correctness check: {verdict.status}")
            return Reward(0.0, status=verdict.status, latency_s=time.perf_counter() - start, info=info)
        correct = verdict.score >= 1.0
        r_start, r_end = self.correct if correct else self.wrong
        value = cosine_reward(length, self.max_length, r_start, r_end, self.exceed_reward)
        return Reward(value, components={"correct": float(correct)}, latency_s=time.perf_counter() - start, info=info)


@register_verifier("repetition")
class RepetitionVerifier(Verifier):
    """n-gram repetition penalty in ``[max_penalty, 0]`` (see the module docstring)."""

    name = "repetition"
    in_process = True  # a set of n-grams: linear in the text
    description = "n-gram repetition penalty: max_penalty * (1 - unique n-grams / n-grams)"

    def __init__(self, n: int = 3, max_penalty: float = -1.0, unit: str = "words"):
        if n < 1:
            raise ValueError("repetition: n must be >= 1")
        if max_penalty > 0:
            raise ValueError("repetition: max_penalty must be <= 0 (it is a penalty)")
        if unit not in ("words", "chars"):
            raise ValueError("repetition: unit must be 'words' or 'chars'")
        self.n, self.max_penalty, self.unit = int(n), float(max_penalty), unit

    def audit_cases(self) -> list[dict]:
        """Exact expected penalties, for ``rlvr verifiers audit``."""
        sep = " " if self.unit == "words" else ""
        distinct = sep.join(f"w{i}" if self.unit == "words" else chr(65 + i % 26) for i in range(self.n + 5))
        looping = sep.join(["a"] * (self.n + 4))
        loops = len(looping.split()) if self.unit == "words" else len(looping)
        count = loops - self.n + 1
        return [
            {"id": "golden-01", "category": "golden", "completion": distinct, "reference": {},
             "expect": 0.0},
            {"id": "golden-02", "category": "golden", "completion": looping, "reference": {},
             "expect": self.max_penalty * (1 - 1 / count)},
        ]

    def score(self, completion: str, reference: dict) -> Reward:
        start = time.perf_counter()
        tokens = (completion or "").split() if self.unit == "words" else list(completion or "")
        count = len(tokens) - self.n + 1
        if count <= 0:
            return Reward(0.0, latency_s=time.perf_counter() - start, info={"ngrams": 0, "repeated": 0.0})
        grams = {tuple(tokens[i: i + self.n]) for i in range(count)}
        repeated = 1.0 - len(grams) / count
        return Reward(self.max_penalty * repeated, latency_s=time.perf_counter() - start,
                      info={"ngrams": count, "repeated": repeated})
