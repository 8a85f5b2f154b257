"""The reward contract: a sample in, a typed :class:`Reward` out.

A verifier is any object with a ``name`` and a ``score(completion, reference)`` method. The rest
of the sample reaches a verifier that asks for it, as keyword-only arguments of ``score``
(:data:`CONTEXT_FIELDS`), the same way in training, ``rlvr eval`` and ``rlvr verify``:

* ``prompt``: the chat messages the model answered, ``[{"role": ..., "content": ...}, ...]``;
* ``finish_reason``: ``"stop"`` (the model ended its answer) or ``"length"`` (cut off at the token
  budget), None when unknown (e.g. a JSONL line without one).

A ``score`` that takes neither is called with the completion and reference only. It never
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

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

STATUSES = ("ok", "timeout", "error", "abstain")
#: The parts of a sample besides the completion and reference that a verifier may ask for, as
#: keyword-only parameters of ``score`` (a ``**kwargs`` parameter asks for all of them).
CONTEXT_FIELDS = ("prompt", "finish_reason")


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
        if isinstance(self.score, (str, bytes)) or not hasattr(self.score, "__float__"):
            # float("1.0") would silently accept a verifier's bug (a score built as text)
            raise TypeError(f"Reward.score must be a number, got {type(self.score).__name__} {self.score!r}")
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


def context_fields(verifier: Any) -> tuple[str, ...]:
    """The :data:`CONTEXT_FIELDS` that ``verifier.score`` takes (all of them with ``**kwargs``)."""
    method = getattr(verifier, "score", None)
    owner = getattr(type(verifier), "score", None)
    if owner is not None and getattr(method, "__func__", None) is owner:
        return _context_fields_of(owner)  # a method of the class: inspected once per class
    return _inspect_context_fields(method)


_FIELDS_CACHE: dict[Any, tuple[str, ...]] = {}


def _context_fields_of(function: Any) -> tuple[str, ...]:
    try:
        return _FIELDS_CACHE[function]
    except (KeyError, TypeError):
        fields = _inspect_context_fields(function)
        try:
            _FIELDS_CACHE[function] = fields
        except TypeError:
            pass
        return fields


def _inspect_context_fields(function: Any) -> tuple[str, ...]:
    try:
        params = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return ()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return CONTEXT_FIELDS
    return tuple(f for f in CONTEXT_FIELDS if f in params and params[f].kind is not inspect.Parameter.POSITIONAL_ONLY)


def score_sample(verifier: Any, completion: str, reference: dict, context: dict | None = None) -> Any:
    """``verifier.score(completion, reference, **the context fields it takes)``; what it returned."""
    if context:
        wanted = context_fields(verifier)
        kwargs = {k: context[k] for k in wanted if k in context}
        if kwargs:
            return verifier.score(completion, reference, **kwargs)
    return verifier.score(completion, reference)


def error_reward(exc: BaseException) -> Reward:
    """``status="error"`` for a verifier that raised: the exception in ``info["error"]`` and its
    traceback in ``info["traceback"]`` (the trainer prints the first one of a run)."""
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return Reward(0.0, status="error", info={"error": f"{type(exc).__name__}: {exc}"[:1000], "traceback": text[-4000:]})


class Verifier:
    """Base class for reward plugins (subclassing is optional: any object with ``name`` and
    ``score`` works).

    Subclasses take their options as keyword arguments of ``__init__`` so that
    ``get_verifier("name", **options)`` can build them from a config file. To see the prompt or
    the finish reason, declare them: ``def score(self, completion, reference, *, prompt=None,
    finish_reason=None)``.
    """

    name: ClassVar[str] = "verifier"
    description: ClassVar[str] = ""
    #: What the verifier checks, which picks the built-in golden cases ``rlvr verifiers audit``
    #: uses when it has no ``audit_cases()``: ``"answer"`` (a final answer against
    #: ``reference["answer"]``: the math final-answer set); anything else has no built-in set.
    kind: ClassVar[str] = "other"
    #: For a continuous reward: the score at or above which a response counts as passing.
    #: ``rlvr verifiers audit`` then requires golden responses to reach it and wrong, hedged or
    #: hostile ones to stay below it (a little partial credit is fine). None: the binary rule, any
    #: credit above 0 counts. (Training's own notion is ``verifier.success_threshold``.)
    pass_threshold: ClassVar[float | None] = None
    #: False for verifiers whose score may change between calls (sampling judges, learned models):
    #: the runner then never serves them from its cache.
    cacheable: ClassVar[bool] = True
    #: True for verifiers that take microseconds on any input and cannot hang (plain parsing: no
    #: sympy, no user-given regex, no code): the runner scores them in the calling process, sparing
    #: the worker round trip (about 1 ms a batch), and so without a deadline.
    in_process: ClassVar[bool] = False
    #: True for verifiers that score a whole batch at once, ``score_batch(completions, references,
    #: contexts) -> list[Reward]`` (``contexts``: one dict of the :data:`CONTEXT_FIELDS` ``score``
    #: takes, per item): model graders that send a batch to a server or a device together. The runner
    #: calls it in the calling process, once per batch; the verifier bounds its own calls (deadlines,
    #: retries), since no worker deadline applies there. ``score`` must still score one item.
    batched: ClassVar[bool] = False

    def score(self, completion: str, reference: dict) -> Reward:  # pragma: no cover - interface
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
