"""The Hugging Face engine: the trainer's own policy module decodes with a KV cache, in-process.

It generates with the trainer's own policy module (``weight_sync = "shared"``), so there are no
weights to push after an update; or, for a sharded policy, with a whole copy that takes the weights
pushed after each update (``weight_sync = "merged"``). Each distinct prompt is prefilled once and its KV cache indexed out
to its n samples; then one token per step for every sequence still running, sampled as ``transformers``'
``generate`` samples (temperature, then top-k, then top-p), without its per-step machinery. The
log-probability of each chosen token under the full tempered distribution is recorded as it is
drawn, keeping no step's logits beyond the current one. With stop strings (``SamplingParams.stop``),
each step decodes the tail of every running row and ends the row at the token whose text completes
one (:class:`StopStrings`), so its ids end at the first token whose decoded prefix holds the string.
A model that :mod:`rlvr.modeling.fast_forward` supports decodes with its shared-prompt forward (a
prompt's keys held once, not per sample).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch

from rlvr.modeling import fast_forward
from rlvr.engines.base import Completion, SamplingParams, cut_at_stop, eos_token_ids, find_stop
from rlvr.modeling.logprobs import cache_argument, output_cache, position_ids


def sample_next(logits: torch.Tensor, sampling: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens [N], logp [N])``: the next token of each row and its log-probability under the
    tempered distribution (before top-k/top-p truncation: the distribution the policy defines).
    Greedy takes the argmax, with the untempered log-probability."""
    scores = logits.float()
    if sampling.greedy:
        tokens = scores.argmax(dim=-1)
        return tokens, torch.log_softmax(scores, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    scores = scores / sampling.temperature
    logp = torch.log_softmax(scores, dim=-1)
    if sampling.top_k and sampling.top_k < scores.shape[-1]:
        kth = scores.topk(sampling.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:  # keep the most likely tokens up to probability mass top_p (at least one)
        sorted_scores, order = scores.sort(dim=-1)  # ascending
        drop = sorted_scores.softmax(dim=-1).cumsum(dim=-1) <= 1 - sampling.top_p
        drop[:, -1] = False
        scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    tokens = draw(scores.softmax(dim=-1))
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


def draw(probs: torch.Tensor) -> torch.Tensor:
    """One index per row of ``probs [N, V]``, drawn with those probabilities by inverting the row's
    cumulative distribution (float64) at one uniform number. ``torch.multinomial`` draws an
    exponential number per vocabulary entry instead: on the CPU 135 us against 18 us for 64 rows of
    101 entries, 55 ms against 2 ms for 64 rows of 49,152 (``benchmarks/README.md``). An entry of
    probability 0 is never drawn: its cumulative value equals the one before it."""
    cdf = probs.cumsum(dim=-1, dtype=torch.float64)
    u = torch.rand(len(probs), 1, dtype=torch.float64, device=probs.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)


class StopStrings:
    """Which rows' generated text now holds a stop string, checked after every step.

    Only a row's last ``window`` tokens are decoded: a string of L characters, first completed by the
    newest token, lies within its last 4L + 2 tokens (every token but a skipped special one decodes to
    at least one byte, a character is at most 4 bytes, plus one token that may begin before it), so the
    check costs the same at every step rather than growing with the completion.
    """

    def __init__(self, tokenizer, stop: Sequence[str]):
        self.tokenizer, self.stop = tokenizer, tuple(stop)
        self.window = 4 * max(len(s) for s in self.stop) + 2

    def hits(self, tokens: list[torch.Tensor], candidates: torch.Tensor) -> torch.Tensor:
        """``[N] bool``: the rows among ``candidates`` (``[N] bool``) whose tokens so far (``tokens``,
        one ``[N]`` tensor per step) decode to a text that holds a stop string."""
        rows = candidates.nonzero().squeeze(1).tolist()
        hit = torch.zeros_like(candidates)
        if not rows:
            return hit
        tail = torch.stack(tokens[-self.window:], dim=1)[rows].tolist()
        texts = self.tokenizer.batch_decode(tail, skip_special_tokens=True)
        for row, text in zip(rows, texts):
            if find_stop(text, self.stop) is not None:
                hit[row] = True
        return hit


class HFEngine:
    """Generation with the trainer's own module and a KV cache (see the module docstring); the
    :class:`rlvr.engines.base.Engine` protocol.

    Args:
        model: a causal LM (plain or peft), the trainer's own policy module.
        tokenizer: its tokenizer (pad and eos tokens set).
        max_batch_size: sequences generated together (prompts x samples per call), bounds memory.
        weight_sync: ``shared`` (``model`` is the trainer's policy module) or ``merged`` (``model`` is
            a copy: it takes the full weights after every update, e.g. of an FSDP2-sharded policy).
    """

    def __init__(self, model, tokenizer, *, max_batch_size: int = 256, weight_sync: str = "shared"):
        if weight_sync not in ("shared", "merged"):
            raise ValueError(f"HF engine: weight_sync must be 'shared' or 'merged', got {weight_sync!r}")
        self.weight_sync = weight_sync
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]

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
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding: every prompt ends at the same column
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention_mask[i, width - len(p) :] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        was_training = self.model.training
        self.model.eval()
        try:
            tokens, logprobs, stopped = self._decode(input_ids, attention_mask, n, sampling)
        finally:
            self.model.train(was_training)
        return self._to_groups(tokens.cpu(), logprobs.cpu(), stopped.cpu(), len(prompts), n, sampling)

    def _decode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int,
                sampling: SamplingParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(tokens, logp, stopped)``: tokens and log-probs ``[P * n, T_new]`` grouped by prompt, rows
        that have finished carrying the pad id after their end-of-sequence token (or stop string's last
        token); ``stopped [P * n]`` the length of each row that a stop string ended, else 0."""
        if fast_forward.supports(self.model):
            step = self._fast_steps(input_ids, attention_mask, n, sampling.max_new_tokens)
        else:
            step = self._model_steps(input_ids, attention_mask, n)
        logits = next(step)
        eos = torch.tensor(self.eos_ids, device=input_ids.device)
        finished = torch.zeros(len(logits), dtype=torch.bool, device=input_ids.device)
        stopped = torch.zeros(len(logits), dtype=torch.long, device=input_ids.device)
        stop_strings = StopStrings(self.tokenizer, sampling.stop) if sampling.stop else None
        tokens, logprobs = [], []
        for index in range(sampling.max_new_tokens):
            token, logp = sample_next(logits, sampling)
            token = token.masked_fill(finished, self.pad_id)
            tokens.append(token)
            logprobs.append(logp)
            ended = torch.isin(token, eos)
            if stop_strings is not None:
                hit = stop_strings.hits(tokens, ~finished & ~ended)
                stopped.masked_fill_(hit, index + 1)
                ended |= hit
            finished |= ended
            if index + 1 == sampling.max_new_tokens or bool(finished.all()):
                break
            logits = step.send((token, ~finished))
        step.close()
        return torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1), stopped

    def _fast_steps(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int, max_new: int):
        """A generator of next-token logits ``[P * n, V]``: first after the prompts, then after each
        ``(token, running)`` sent in (:mod:`rlvr.modeling.fast_forward`); a row not running (it has finished)
        is not computed and gets logits 0."""
        last, prompts = fast_forward.encode_prompts(self.model, input_ids, attention_mask, n)
        rows = fast_forward.RowCache.empty(prompts, capacity=max_new)
        token, running = yield last.repeat_interleave(n, dim=0)
        while True:
            token, running = yield fast_forward.forward_rows(self.model, token[:, None], prompts, rows,
                                                             needed=running[:, None])[:, -1]

    def _model_steps(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int):
        """:meth:`_fast_steps` by the model's own forward and KV cache (each prompt's copied n times)."""
        positions = position_ids(attention_mask)
        prefill = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                             use_cache=True, logits_to_keep=1)
        rows = torch.arange(len(input_ids), device=input_ids.device).repeat_interleave(n)
        cache = output_cache(prefill)
        cache.reorder_cache(rows)  # each prompt's cache, once per sample
        attention_mask = attention_mask[rows]
        next_position = positions[rows, -1:] + 1
        token, _ = yield prefill.logits[rows, -1]
        while True:
            attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
            out = self.model(input_ids=token[:, None], attention_mask=attention_mask, position_ids=next_position,
                             use_cache=True, **{cache_argument(self.model): cache})
            next_position = next_position + 1
            token, _ = yield out.logits[:, -1]

    def _to_groups(self, new_tokens: torch.Tensor, logprobs: torch.Tensor, stopped: torch.Tensor, num_prompts: int,
                   n: int, sampling: SamplingParams) -> list[list[Completion]]:
        is_eos = torch.isin(new_tokens, torch.tensor(self.eos_ids))
        has_eos = is_eos.any(dim=1)
        first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, new_tokens.shape[1], dtype=torch.long))
        lengths = torch.where(has_eos, first_eos + 1, first_eos)
        lengths = torch.where(stopped > 0, stopped, lengths).tolist()  # a row ends at its EOS or its stop string
        ids = [row[:length] for row, length in zip(new_tokens.tolist(), lengths)]
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        strings: list[str | None] = [None] * len(ids)
        for k in stopped.nonzero().squeeze(1).tolist():
            texts[k], strings[k] = cut_at_stop(texts[k], sampling.stop, sampling.include_stop)
        completions = [
            Completion(token_ids=ids[k], text=texts[k], logprobs=logprobs[k, : lengths[k]].tolist(),
                       finish_reason="stop" if has_eos[k] or strings[k] is not None else "length",
                       stop_string=strings[k])
            for k in range(len(ids))
        ]
        return [completions[i * n : (i + 1) * n] for i in range(num_prompts)]
