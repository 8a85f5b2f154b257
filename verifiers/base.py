"""The reward contract: a completion and its reference in, a typed :class:`Reward` out.

A verifier is any object with a ``name`` and a ``score(completion, reference)`` method. It never
raises for bad *model output* (that is a score of 0 with status ``ok``); it reports *its own*
failure through ``status`` so the trainer can tell "the answer is wrong" apart from "we could not
check the answer":

======== =====================================================================
status   meaning
======== =====================================================================
ok       the verifier checked the completion; ``score`` is the reward
timeout  checking ran past its deadline; ``score`` carries no information
error    the verifier (or the reference) is broken; ``score`` carries no information
abstain  the verifier has no opinion on this item (e.g. a TRL function returned None)
======== =====================================================================

Example::

    from rlvr.verifiers import Reward, Verifier, register_verifier

    @register_verifier("exact")
    class Exact(Verifier):
        '''1.0 when the stripped completion equals reference["answer"].'''
        def score(self, completion: str, reference: dict) -> Reward:
            return Reward(float(completion.strip() == str(reference["answer"]).strip()))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

STATUSES = ("ok", "timeout", "error", "abstain")


@dataclass
class Reward:
    """The result of scoring one completion.

    Attributes:
        score: the reward, a finite float (usually in [0, 1]).
        status: one of ``ok | timeout | error | abstain`` (see the module docstring).
        components: named sub-scores (e.g. ``{"format": 1.0, "math": 0.0}``) that the trainer logs
            separately under ``reward/<name>``.
        latency_s: wall-clock seconds the verifier spent on this item.
        info: free-form details. By convention ``info["extracted"]`` holds the answer the verifier
            pulled out of the completion, or ``None`` when it found none (the trainer alarms when
            almost nothing can be extracted).
    """

    score: float
    status: str = "ok"
    components: dict[str, float] = field(default_factory=dict)
    latency_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Reward.status must be one of {STATUSES}, got {self.status!r}")
        self.score = float(self.score)
        if not math.isfinite(self.score):
            raise ValueError(f"Reward.score must be finite, got {self.score!r}")

    @property
    def failed(self) -> bool:
        """True when the verifier could not produce a meaningful score (timeout or error)."""
        return self.status in ("timeout", "error")


def coerce_reward(value: Any) -> Reward:
    """A :class:`Reward` from what a verifier returned: a Reward as is, a number as an ``ok`` score,
    ``None`` as ``abstain``; anything else is the verifier's error."""
    if isinstance(value, Reward):
        return value
    if value is None:
        return Reward(0.0, status="abstain")
    if isinstance(value, bool) or isinstance(value, (int, float)):
        score = float(value)
        if math.isfinite(score):
            return Reward(score)
        return Reward(0.0, status="error", info={"error": f"verifier returned a non-finite score {value!r}"})
    return Reward(0.0, status="error", info={"error": f"verifier returned {type(value).__name__}, not a Reward"})


class Verifier:
    """Base class for reward plugins (subclassing is optional: any object with ``name`` and
    ``score`` works).

    Subclasses take their options as keyword arguments of ``__init__`` so that
    ``get_verifier("name", **options)`` can build them from a config file.
    """

    name: ClassVar[str] = "verifier"
    description: ClassVar[str] = ""
    #: False for verifiers whose score may change between calls (sampling judges, learned models):
    #: the runner then never serves them from its cache.
    cacheable: ClassVar[bool] = True

    def score(self, completion: str, reference: dict) -> Reward:  # pragma: no cover - interface
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
