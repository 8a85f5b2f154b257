"""What every generation engine takes and returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Literal, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    import torch

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``greedy=True`` ignores temperature/top_p/top_k and takes the argmax.

    ``stop``: strings that end a completion as soon as its decoded text contains one (``finish_reason``
    ``stop``, like an end-of-sequence token). Its ``token_ids`` end with the token that completed the
    string (the model learns to stop by emitting it); ``include_stop`` keeps the string at the end of
    its ``text`` (default: a verifier's format check wants the closing ``</answer>``) or cuts it off.
    The text ends exactly at the string's end: what the last token decoded to beyond it is dropped.
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k truncation
    greedy: bool = False
    stop: tuple[str, ...] = ()
    include_stop: bool = True

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.greedy and self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {self.temperature} (use greedy=True)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        object.__setattr__(self, "stop", tuple(self.stop))  # a list from a config is hashable and frozen too
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {list(self.stop)!r}")


def find_stop(text: str, stop: Sequence[str]) -> tuple[int, str] | None:
    """``(end, string)``: where the earliest-ending stop string in ``text`` ends, and which; None when
    ``text`` holds none. Earliest end, not earliest start: it is the one generation met first."""
    best = None
    for string in stop:
        start = text.find(string)
        if start >= 0 and (best is None or start + len(string) < best[0]):
            best = (start + len(string), string)
    return best


def stop_prefix_length(tokenizer, ids: Sequence[int], stop: Sequence[str]) -> int:
    """The length of the shortest prefix of ``ids`` whose decoded text holds a stop string (``len(ids)``
    when none does): the ids a completion keeps, nothing after the token that completed the string.
    A binary search (a prefix's text holds the string once a shorter one does)."""
    if find_stop(tokenizer.decode(list(ids), skip_special_tokens=True), stop) is None:
        return len(ids)
    low, high = 1, len(ids)  # the answer lies in [low, high]
    while low < high:
        middle = (low + high) // 2
        if find_stop(tokenizer.decode(list(ids[:middle]), skip_special_tokens=True), stop) is None:
            low = middle + 1
        else:
            high = middle
    return low


def cut_at_stop(text: str, stop: Sequence[str], include_stop: bool) -> tuple[str, str | None]:
    """``(text, string)``: ``text`` ended at its first stop string (kept or cut per ``include_stop``),
    and that string; ``(text, None)`` unchanged when it holds none."""
    found = find_stop(text, stop)
    if found is None:
        return text, None
    end, string = found
    return text[: end if include_stop else end - len(string)], string


@dataclass
class Completion:
    """One sampled continuation of a prompt.

    Attributes:
        token_ids: generated ids, including the end-of-sequence token when it was produced.
        text: decoded text without special tokens.
        logprobs: per generated token, log-probability under the sampling policy's full (tempered)
            distribution, ``log softmax(logits / temperature)``; len == len(token_ids).
        finish_reason: ``stop`` (produced EOS or a stop string) or ``length`` (hit ``max_new_tokens``).
        loss_mask: for a multi-turn episode (``rlvr/rollout/episodes.py``): per token, 1 where the model
            sampled it, 0 where the environment wrote it (its log-prob is then 0); None: all sampled.
        episode: a multi-turn episode's record (:class:`rlvr.rollout.episodes.EpisodeRecord`: turns,
            tool calls, stop reason); ``text`` is then its last assistant message, which the verifier scores.
        stop_string: the :attr:`SamplingParams.stop` string that ended it; None: it did not end on one.
    """

    token_ids: list[int]
    text: str
    logprobs: list[float]
    finish_reason: FinishReason
    loss_mask: list[int] | None = None
    episode: Any = None
    stop_string: str | None = None


#: How an engine gets the policy's weights after an optimizer step (its ``weight_sync`` attribute):
#: ``shared`` it generates with the trainer's own module, nothing is pushed; ``merged`` it takes the
#: full weights, LoRA merged in; ``adapter`` it takes a LoRA policy's adapter tensors only (the full
#: weights when the policy has no LoRA). See :func:`rlvr.modeling.loading.iter_inference_weights`.
WeightSync = Literal["shared", "merged", "adapter"]


@runtime_checkable
class Engine(Protocol):
    """Generates groups of completions and serves the policy's latest weights.

    Besides the two methods, an engine has ``pad_id`` (the id collation pads with) and
    ``weight_sync`` (:data:`WeightSync`). It may also have ``sleep()`` / ``wake_up()`` (free its
    memory while the trainer updates, then take it back) and ``close()`` (release everything); the
    trainer calls them when they exist.

    Example::

        from rlvr.engines import HFEngine, SamplingParams
        from rlvr.modeling.tiny import build_tiny_model
        from rlvr.modeling.loading import iter_inference_weights, load_policy, load_tokenizer

        folder = build_tiny_model("tiny_model")               # or any local model folder
        policy, tokenizer = load_policy(folder), load_tokenizer(folder)
        engine = HFEngine(policy, tokenizer)
        groups = engine.generate([[1, 7, 14]], n=8, sampling=SamplingParams(max_new_tokens=5))
        assert len(groups) == 1 and len(groups[0]) == 8       # one prompt, a group of 8 completions
        # ... an optimizer step on policy ...
        if engine.weight_sync != "shared":                    # the HF engine shares the module
            engine.update_weights(iter_inference_weights(policy))
    """

    pad_id: int
    weight_sync: WeightSync

    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        """For each prompt (token ids), ``n`` completions: a list of groups in prompt order."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]]) -> None:
        """Serve these weights from now on: ``(name, tensor)`` pairs in the format ``weight_sync``
        asks for, consumed one at a time (the caller never builds a full copy)."""
        ...


def eos_token_ids(model, tokenizer) -> list[int]:
    """The ids that end a completion: the model's generation config's, plus the tokenizer's."""
    config = getattr(model, "generation_config", None)
    eos = config.eos_token_id if config is not None else None
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
        eos.append(tokenizer.eos_token_id)
    if not eos:
        raise ValueError("the model has no end-of-sequence token: set generation_config.eos_token_id")
    return eos


def call_optional(engine, method: str) -> None:
    """Call an optional engine method (``sleep``, ``wake_up``, ``close``) when the engine has it."""
    function = getattr(engine, method, None)
    if callable(function):
        function()
