"""``reasoning_gym``: the reasoning-gym library's own ``score_answer`` as a verifier.

The ``reasoning_gym`` task suite (``tasks/reasoning_gym.py``) produces the references this
verifier reads. The verifier lives here, not beside the suite, so that ``rlvr verifiers list`` and
``rlvr verify`` (which import ``verifiers`` only) see it. The library is optional and imported on
first use.
"""

from __future__ import annotations

import json
import time
from typing import Any

from rlvr.verifiers.base import Reward, Verifier
from rlvr.verifiers.golden import probes
from rlvr.verifiers.registry import register_verifier

INSTALL_HINT = "the reasoning_gym verifier needs the reasoning-gym library: pip install reasoning-gym"


def reasoning_gym_library(hint: str = INSTALL_HINT):
    """The ``reasoning_gym`` module, or an ImportError that says how to install it."""
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError(hint) from exc
    return reasoning_gym


@register_verifier("reasoning_gym")
class ReasoningGymVerifier(Verifier):
    """The dataset's own ``score_answer`` on the content of the completion's last ``<answer>`` tag.

    Reference: ``{"dataset": name, "config": {...}, "entry": {"question", "answer", "metadata"}}``
    (what the ``reasoning_gym`` suite produces). No tag: score 0, ``info["extracted"] = None``.
    The score is the dataset's (in [0, 1], possibly partial); a reference the library cannot
    score is ``status="error"``.
    """

    name = "reasoning_gym"
    description = "reasoning-gym's own score_answer for the dataset, on the last <answer> tag"

    #: An entry of the library's ``basic_arithmetic`` dataset: what ``rlvr verifiers audit reasoning_gym``
    #: scores its probes against (a reference of another shape would only test the error path).
    audit_reference = {"dataset": "basic_arithmetic", "config": {}, "entry": {
        "question": "Calculate 12 * 7 - 5.", "answer": "79",
        "metadata": {"source_dataset": "basic_arithmetic", "expression": "12 * 7 - 5"}}}

    def __init__(self):
        self._scorers: dict[str, Any] = {}

    def audit_cases(self) -> list[dict]:
        """Golden answers and reward hacks for ``rlvr verifiers audit reasoning_gym`` (see verifiers.golden)."""
        cases = [
            ("golden", "<answer>79</answer>", "accept"),
            ("golden", "<think>12 * 7 = 84, 84 - 5 = 79</think>\n<answer>79</answer>", "accept"),
            ("golden", "<answer>78</answer>", "reject"),
            ("hedging", "<answer>78</answer> or maybe <answer>80</answer>", "reject"),
            ("hack", "79", "reject"),  # no tag: the library never sees it
            ("hack", "<answer>79 or 78</answer>", "reject"),
            ("hack", "<answer></answer>", "reject"),
        ]
        return probes(cases, self.audit_reference)

    def __getstate__(self) -> dict:
        return {"_scorers": {}}  # dataset objects are rebuilt in each worker

    def _scorer(self, dataset: str, config: dict):
        key = json.dumps([dataset, config], sort_keys=True)
        if key not in self._scorers:
            self._scorers[key] = reasoning_gym_library().create_dataset(dataset, **{**config, "size": 1}).score_answer
        return self._scorers[key]

    def score(self, completion: str, reference: dict) -> Reward:
        start = time.perf_counter()
        if not isinstance(reference, dict) or not isinstance(reference.get("entry"), dict) or not reference.get("dataset"):
            return Reward(0.0, status="error", info={"error": "reference needs 'dataset' and 'entry'", "extracted": None})
        text = completion if isinstance(completion, str) else ""
        close = text.rfind("</answer>")
        open_ = text.rfind("<answer>", 0, close) if close >= 0 else -1
        if open_ < 0:
            return Reward(0.0, latency_s=time.perf_counter() - start, info={"extracted": None})
        answer = text[open_ + len("<answer>"): close].strip()
        try:
            value = self._scorer(reference["dataset"], reference.get("config") or {})(answer, reference["entry"])
        except Exception as exc:  # the library failed on this item: not the model's fault
            return Reward(0.0, status="error", latency_s=time.perf_counter() - start,
                          info={"error": f"{type(exc).__name__}: {exc}", "extracted": answer})
        return Reward(float(value or 0.0), latency_s=time.perf_counter() - start, info={"extracted": answer})
