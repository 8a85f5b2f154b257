"""What every generation engine takes and returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, Sequence, runtime_checkable

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
    """

    token_ids: list[int]
    text: str
    logprobs: list[float]
    finish_reason: FinishReason


@runtime_checkable
class Engine(Protocol):
    """Generates groups of completions and serves the policy's latest weights.

    Example::

        from rlvr.engines import HFEngine, SamplingParams
        from rlvr.models import build_tiny_model, load_policy, load_tokenizer

        folder = build_tiny_model("tiny_model")               # or any local model folder
        policy, tokenizer = load_policy(folder), load_tokenizer(folder)
        engine = HFEngine(policy, tokenizer)
        groups = engine.generate([[1, 7, 14]], n=8, sampling=SamplingParams(max_new_tokens=5))
        assert len(groups) == 1 and len(groups[0]) == 8       # one prompt, a group of 8 completions
        # ... an optimizer step on policy ...
        engine.load_weights(policy)  # a no-op for the HF engine, which shares the module
    """

    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        """For each prompt (token ids), ``n`` completions: a list of groups in prompt order."""
        ...

    def load_weights(self, model) -> None:
        """Make the engine serve ``model``'s current weights."""
        ...
