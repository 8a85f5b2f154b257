"""The Hugging Face engine: ``transformers`` ``generate`` with a KV cache, sampling in-process.

It generates with the trainer's own policy module (``weight_sync = "shared"``), so there are no
weights to push after an update. Per-token log-probabilities are recorded while generating (the full
tempered distribution's log-softmax at the chosen token) without keeping every step's logits: at
most one ``[sequences, vocab]`` step is held at a time.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch

from rlvr.engines.base import Completion, SamplingParams, eos_token_ids


class _ChosenTokenLogprobs:
    """A logits processor that records log p(chosen token) at every step and changes nothing.

    ``generate`` calls it before the temperature/top-k/top-p warpers, so it sees the model's raw
    logits; the token chosen at step t is visible (as the last input id) at step t + 1.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.previous: torch.Tensor | None = None  # [N, V] log-softmax of the last step
        self.chosen: list[torch.Tensor] = []  # per step, [N]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.previous is not None:
            self.chosen.append(self.previous.gather(1, input_ids[:, -1:]).squeeze(1))
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """``[N, T_new]`` log-probabilities once generation is over (``last_tokens [N]``)."""
        assert self.previous is not None, "generate produced no tokens"
        self.chosen.append(self.previous.gather(1, last_tokens[:, None]).squeeze(1))
        return torch.stack(self.chosen, dim=1)


class HFEngine:
    """Generation with ``model.generate``; see :class:`rlvr.engines.base.Engine`.

    Args:
        model: a causal LM (plain or peft), the trainer's own policy module.
        tokenizer: its tokenizer (pad and eos tokens set).
        max_batch_size: sequences generated together (prompts x samples per call), bounds memory.
    """

    def __init__(self, model, tokenizer, *, max_batch_size: int = 256):
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]

    weight_sync = "shared"

    @torch.no_grad()
    def update_weights(self, named_tensors) -> None:
        """Copy ``(name, tensor)`` pairs into the engine's module (needed only when it is not the
        trainer's own module, which the trainer never pushes to); unknown names are an error."""
        params = dict(self.model.named_parameters(remove_duplicate=False))
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"HF engine: no parameter named {name!r} in the engine's model")
            if params[name].data_ptr() != tensor.data_ptr():
                params[name].copy_(tensor)

    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if sampling.greedy and n > 1:  # every greedy sample is the same: decode once, copy
            return [[replace(group[0]) for _ in range(n)] for group in self.generate(prompts, 1, sampling)]
        prompts_per_call = max(1, self.max_batch_size // n)
        groups: list[list[Completion]] = []
        for start in range(0, len(prompts), prompts_per_call):
            groups.extend(self._generate_chunk(prompts[start : start + prompts_per_call], n, sampling))
        return groups

    @torch.inference_mode()
    def _generate_chunk(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        from transformers import GenerationConfig, LogitsProcessorList

        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding: every prompt ends at the same column
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention_mask[i, width - len(p) :] = 1
        temperature = 1.0 if sampling.greedy else sampling.temperature
        recorder = _ChosenTokenLogprobs(temperature)
        config = GenerationConfig(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=not sampling.greedy,
            temperature=temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            num_return_sequences=n,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            use_cache=True,
        )
        was_training = self.model.training
        self.model.eval()
        try:
            sequences = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                generation_config=config,
                logits_processor=LogitsProcessorList([recorder]),
            )
        finally:
            self.model.train(was_training)
        new_tokens = sequences[:, width:].cpu()  # [len(prompts) * n, T_new], grouped by prompt
        logprobs = recorder.finish(sequences[:, -1]).cpu()
        return self._to_groups(new_tokens, logprobs, len(prompts), n, sampling.max_new_tokens)

    def _to_groups(self, new_tokens: torch.Tensor, logprobs: torch.Tensor, num_prompts: int, n: int, max_new: int) -> list[list[Completion]]:
        is_eos = torch.isin(new_tokens, torch.tensor(self.eos_ids))
        has_eos = is_eos.any(dim=1)
        first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, new_tokens.shape[1], dtype=torch.long))
        lengths = torch.where(has_eos, first_eos + 1, first_eos).tolist()
        ids = [row[:length] for row, length in zip(new_tokens.tolist(), lengths)]
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        completions = [
            Completion(token_ids=ids[k], text=texts[k], logprobs=logprobs[k, : lengths[k]].tolist(), finish_reason="stop" if has_eos[k] else "length")
            for k in range(len(ids))
        ]
        return [completions[i * n : (i + 1) * n] for i in range(num_prompts)]
