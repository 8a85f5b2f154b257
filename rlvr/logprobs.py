"""Per-token log-probabilities of completions under a model, computed only where they are needed.

Rows that share a prompt (the G samples of a group; a DPO pair's chosen and rejected answers) share
its forward pass: the distinct prompts run once, their key/value cache is indexed out to the rows
(``index_select``, whose backward sums each row's gradient into its prompt), and only the
completions run per row. That is the same function of the weights as running every row whole, with
fewer tokens through the model (:func:`completion_logits`). Models that :mod:`rlvr.fast_forward`
supports run its shared-prompt forward for this (the prompts' keys are not even copied per row).
"""

from __future__ import annotations

import functools
import inspect

import torch

from rlvr import fast_forward
from rlvr.algorithms.losses import entropy_from_log_probs
from rlvr.models import training_with_checkpointing


def completion_logprobs(
    model,
    input_ids: torch.Tensor,  # [B, W + T] left-padded prompt | right-padded completion
    attention_mask: torch.Tensor,  # [B, W + T]
    completion_len: int,  # T
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logp [B, T], entropy [B, T] | None)`` of the completion tokens.

    Logits are kept for the completion's positions only (the prompt's logits are never materialised),
    divided by the sampling temperature so that they match the distribution the engine sampled
    from, and upcast to float32 before the softmax. The entropy carries a gradient only when
    ``entropy_grad`` (an entropy bonus); as a metric it is computed without a graph.
    """
    logits = completion_logits(model, input_ids, attention_mask, completion_len).float()  # [B, T, V]
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, -completion_len:]
    log_probs = torch.log_softmax(logits, dim=-1)  # [B, T, V], shared by logp and the entropy
    logp = torch.gather(log_probs, 2, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy and entropy_grad:
        entropy = entropy_from_log_probs(log_probs)
    elif with_entropy:  # a metric only: no graph through the [B, T, V] softmax
        with torch.no_grad():
            entropy = entropy_from_log_probs(log_probs.detach())
    return logp, entropy


def completion_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_len: int) -> torch.Tensor:
    """``[B, T, V]`` logits that predict the T completion tokens (position W - 1 + t predicts token t).

    When rows share prompts (same ids, same padding; at most 3/4 of the rows' prompts distinct), the
    distinct prompts run once with a KV cache and the rows' completions run on top of their prompt's
    cache; otherwise (or where a cache cannot be used: a model training with gradient checkpointing)
    every row runs whole. Rows in equal runs of one prompt (a group's G samples, a DPO pair) on a
    model that :mod:`rlvr.fast_forward` supports run its shared-prompt forward instead.
    """
    width = input_ids.shape[1] - completion_len
    prompts = torch.cat([input_ids[:, :width], attention_mask[:, :width]], dim=1)
    distinct, row_prompt = torch.unique(prompts, dim=0, return_inverse=True)
    # Two passes cost more fixed overhead than one: share only when it saves a quarter of the prompts.
    if width == 0 or 4 * len(distinct) > 3 * len(input_ids) or training_with_checkpointing(model):
        return _whole_rows(model, input_ids, attention_mask, completion_len)
    order = _group_order(row_prompt, len(distinct))
    if order is not None and fast_forward.supports(model):
        return _fast_shared_prompts(model, distinct[order], input_ids[:, width:], attention_mask[:, width:], completion_len)
    prompt_mask = distinct[:, width:]
    head = model(input_ids=distinct[:, :width], attention_mask=prompt_mask, position_ids=position_ids(prompt_mask),
                 use_cache=True, logits_to_keep=1)
    first = head.logits[row_prompt]  # [B, 1, V]: the prompt's last position predicts completion token 0
    if completion_len == 1:
        return first
    cache = output_cache(head)
    cache.reorder_cache(row_prompt)  # [distinct prompts] -> [B] rows; a differentiable index_select
    # The last completion token predicts nothing that is scored: the tail runs tokens 0 .. T-2.
    tail_ids = input_ids[:, width : width + completion_len - 1]
    prompt_len = attention_mask[:, :width].sum(dim=1, keepdim=True)
    tail_positions = prompt_len + torch.arange(completion_len - 1, device=input_ids.device)
    tail = model(input_ids=tail_ids, attention_mask=attention_mask[:, : width + completion_len - 1],
                 position_ids=tail_positions, use_cache=True, **{cache_argument(model): cache})
    return torch.cat([first, tail.logits], dim=1)


def _group_order(row_prompt: torch.Tensor, num_prompts: int) -> torch.Tensor | None:
    """The distinct prompts in row order when rows come in equal runs of one prompt each (G
    samples of a group; a DPO pair), else None."""
    if len(row_prompt) % num_prompts:
        return None
    runs = row_prompt.view(num_prompts, -1)
    if not bool((runs == runs[:, :1]).all()) or len(torch.unique(runs[:, 0])) != num_prompts:
        return None
    return runs[:, 0]


def _fast_shared_prompts(model, prompts: torch.Tensor, completions: torch.Tensor, completion_mask: torch.Tensor,
                         completion_len: int) -> torch.Tensor:
    """:func:`completion_logits` by :mod:`rlvr.fast_forward`: ``prompts`` ``[D, 2W]`` (ids | mask) in
    row order, ``completions`` and their mask ``[B, T]``. Completion token t runs only if token t + 1
    is real (its logits predict that token): a row's padding is not computed."""
    width = prompts.shape[1] // 2
    group = len(completions) // len(prompts)
    last, cache = fast_forward.encode_prompts(model, prompts[:, :width], prompts[:, width:], group)
    first = last[:, None].expand(-1, group, -1).reshape(len(completions), 1, -1)  # backward: a sum over the group
    if completion_len == 1:
        return first
    tail = fast_forward.forward_rows(model, completions[:, : completion_len - 1], cache,
                                     needed=completion_mask[:, 1:completion_len].bool())
    return torch.cat([first, tail], dim=1)


def _whole_rows(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_len: int) -> torch.Tensor:
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                logits_to_keep=completion_len + 1, use_cache=False)
    return out.logits[:, :-1]


def output_cache(output):
    """The KV cache a forward with ``use_cache=True`` returned (``cache`` since transformers 5.24)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def cache_argument(model) -> str:
    """The forward argument that takes a KV cache: ``cache`` since transformers 5.24, else ``past_key_values``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # through a peft wrapper
    return _cache_argument_of(type(base))


@functools.cache
def _cache_argument_of(model_class) -> str:
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions of left-padded rows: each row's first real token is position 0."""
    return (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)  # left padding shifts positions
