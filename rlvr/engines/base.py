"""What every generation engine takes and returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Literal, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    import torch

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``greedy=True`` ignores temperature/top_p/top_k and takes the argmax."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k truncation
    greedy: bool = False

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.greedy and self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {self.temperature} (use greedy=True)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")


@dataclass
class Completion:
    """One sampled continuation of a prompt.

    Attributes:
        token_ids: generated ids, including the end-of-sequence token when it was produced.
        text: decoded text without special tokens.
        logprobs: per generated token, log-probability under the sampling policy's full (tempered)
            distribution, ``log softmax(logits / temperature)``; len == len(token_ids).
        finish_reason: ``stop`` (produced EOS) or ``length`` (hit ``max_new_tokens``).
        loss_mask: for a multi-turn episode (``rlvr/rollout/episodes.py``): per token, 1 where the model
            sampled it, 0 where the environment wrote it (its log-prob is then 0); None: all sampled.
        episode: a multi-turn episode's record (:class:`rlvr.rollout.episodes.EpisodeRecord`: turns,
            tool calls, stop reason); ``text`` is then its last assistant message, which the verifier scores.
    """

    token_ids: list[int]
    text: str
    logprobs: list[float]
    finish_reason: FinishReason
    loss_mask: list[int] | None = None
    episode: Any = None


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
