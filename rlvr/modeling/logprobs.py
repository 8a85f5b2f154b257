"""Per-token log-probabilities of completions under a model, computed only where they are needed.

Rows that share a prompt (the G samples of a group; a DPO pair's chosen and rejected answers) share
its forward pass: the distinct prompts run once, their key/value cache is indexed out to the rows
(``index_select``, whose backward sums each row's gradient into its prompt), and only the
completions run per row. That is the same function of the weights as running every row whole, with
fewer tokens through the model (:func:`completion_logits`). Models that :mod:`rlvr.modeling.fast_forward`
supports run its shared-prompt forward for this (the prompts' keys are not even copied per row).

Where the logits are exactly the output layer applied to the decoder's final hidden states
(``output_head``: a plain ``Linear`` head and nothing after it, as a load-time probe measures:
:func:`probe_output_head`), the passes stop at those states and
:mod:`rlvr.modeling.chunked_logprobs` turns them into log-probs a chunk of tokens at a time, so the
whole ``[rows, tokens, vocabulary]`` logits never exist: at most ``model.logits_chunk_mb`` of them
(:func:`set_logits_chunk`) at once, and only for the completion tokens that are scored. A model that
post-processes its logits (Gemma 2/3's final soft-capping, Cohere's and Granite's scales) or wraps
its head (a LoRA or saved-module wrapper) computes them whole.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Sequence

import torch

from rlvr.modeling import fast_forward
from rlvr.modeling.chunked_logprobs import logits_logprobs, token_logprobs
from rlvr.modeling.fast_forward import training_with_checkpointing
from rlvr.modeling.precision import autocast
from rlvr.run.sharding import is_sharded

DEFAULT_LOGITS_CHUNK_MB = 256
_CHUNK = "_rlvr_logits_chunk_mb"  # the attribute set_logits_chunk sets on a model
_HEAD = "_rlvr_logits_are_head"  # the attribute probe_output_head sets on a (base) model: its verdict
# Relative difference of the decoder's states between two runs of the same forward: nothing but a
# GPU's nondeterministic reductions (an MoE's scatter-adds) may separate them
_STATES_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def collate_completions(prompts: Sequence[list[int]], completions: Sequence[list[int]], pad_id: int,
                        loss_masks: Sequence[list[int] | None] | None = None):
    """``[left-padded prompt | right-padded completion]`` ids [N, W+T], attention mask, completion mask [N, T]
    (1 on completion tokens, or ``loss_masks[i]`` where given: a multi-turn episode's environment tokens 0)."""
    width, length = max(len(p) for p in prompts), max(len(c) for c in completions)
    ids = torch.full((len(prompts), width + length), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros((len(prompts), length))
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ids[i, width - len(p) : width + len(c)] = torch.tensor(list(p) + list(c))
        attention[i, width - len(p) : width + len(c)] = 1
        given = loss_masks[i] if loss_masks is not None else None
        mask[i, : len(c)] = torch.tensor(given, dtype=mask.dtype) if given is not None else 1
    return ids, attention, mask


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

    A row equal to an earlier one (two samples of a group that drew the same completion) is not
    computed again: the distinct rows run once and their results are indexed out to the repeats, so
    a repeat's gradient adds into its row's (the same sum as computing it twice).
    """
    distinct = distinct_rows(input_ids, attention_mask)
    keep, inverse = distinct if distinct is not None else (slice(None), slice(None))
    try:
        with autocast(model):  # float32 master weights: the pass runs in the compute dtype (modeling/precision.py)
            logp, entropy = _logprobs(model, input_ids[keep], attention_mask[keep], completion_len, temperature,
                                      with_entropy, entropy_grad)
    finally:
        if is_sharded(model) and not torch.is_grad_enabled():
            model.reshard()  # FSDP2 keeps the root gathered for a backward; a pass without one must free it
    return logp[inverse], (entropy[inverse] if entropy is not None else None)


def set_logits_chunk(model, megabytes: float) -> None:
    """The most memory one chunk of float32 logits may take in ``model``'s log-prob passes
    (``model.logits_chunk_mb``); 0 computes each pass's logits whole."""
    if megabytes < 0:
        raise ValueError(f"model.logits_chunk_mb must be >= 0, got {megabytes}")
    setattr(model, _CHUNK, megabytes)


def chunk_tokens(model, vocab: int) -> int:
    """Tokens per chunk of logits under ``model``'s budget (0: no chunking)."""
    megabytes = getattr(model, _CHUNK, DEFAULT_LOGITS_CHUNK_MB)
    return max(1, int(megabytes * 2**20) // (4 * vocab)) if megabytes > 0 else 0


def output_head(model) -> torch.nn.Linear | None:
    """The output layer when a model's logits are exactly that layer applied to its decoder's final
    hidden states (a plain ``Linear``, not a LoRA or saved-module wrapper, and nothing after it, as
    :func:`probe_output_head` measured; a model never probed is probed now), else None."""
    base = _base(model)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if type(head) is not torch.nn.Linear:
        return None
    verdict = getattr(base, _HEAD, None)
    if verdict is None:
        verdict = probe_output_head(model)
    return head if verdict else None


def probe_output_head(model, tokens: int = 4) -> bool:
    """Whether ``model``'s logits are exactly its output layer applied to the states that
    :func:`completion_states` returns with ``states``; recorded on the model for :func:`output_head`.

    Two passes over ``tokens`` random tokens, in eval mode and without a graph: one whose output
    layer returns large random logits (std 64, past any soft-cap, not a multiple of any scale) and
    records its input, which must come out of the model unchanged (no post-processing, however small
    its effect on a random-init model's flat logits); one with the output layer off, whose states
    must be that recorded input (the model's forward reaches its head through the swapped module).
    A model that fails either, or cannot run them, computes its logits whole."""
    base = _base(model)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    verdict = False
    if type(head) is torch.nn.Linear:
        training = model.training
        model.eval()  # no dropout, no router noise: the two passes compute the same function
        try:
            with torch.no_grad():
                verdict = _head_parity(model, head, tokens)
        except Exception:  # a model that cannot run the probe keeps the always-correct whole logits
            verdict = False
        finally:
            model.train(training)
    setattr(base, _HEAD, verdict)
    return verdict


def _head_parity(model, head: torch.nn.Linear, tokens: int) -> bool:
    """:func:`probe_output_head`'s two passes over one row of ``tokens`` random ids."""
    generator = torch.Generator().manual_seed(0)
    vocab = min(getattr(getattr(_base(model), "config", None), "vocab_size", None) or head.out_features,
                head.out_features)
    ids = torch.randint(0, vocab, (1, tokens), generator=generator).to(head.weight.device)
    mask = torch.ones_like(ids)
    inputs = dict(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=False)
    seen, planted = [], []

    def plant(module, args, output):  # [1, keep, V] logits -> random ones; keep the head's input
        seen.append(args[0])
        planted.append((64 * torch.randn(output.shape, generator=generator)).to(output))
        return planted[-1]

    hook = head.register_forward_hook(plant)
    try:
        logits, _ = _model_pass(model, False, tokens - 1, **inputs)
    finally:
        hook.remove()
    if len(seen) != 1 or logits.shape != planted[0].shape or not torch.equal(logits.double(), planted[0].double()):
        return False  # the head ran otherwise than once, or its output was changed on the way out
    states, _ = _model_pass(model, True, tokens - 1, **inputs)
    if states.shape != seen[0].shape:
        return False
    difference = (states.double() - seen[0].double()).abs().max() / seen[0].double().abs().max().clamp(min=1e-12)
    return bool(difference <= _STATES_TOLERANCE.get(states.dtype, 1e-2))


def _base(model):
    """The transformers model under a peft wrapper (the model itself without one)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _logprobs(model, input_ids, attention_mask, completion_len, temperature, with_entropy, entropy_grad):
    targets = input_ids[:, -completion_len:]
    head = output_head(model)
    if head is not None:
        hidden = completion_states(model, input_ids, attention_mask, completion_len, states=True)  # [B, T, H]
        scored = attention_mask[:, -completion_len:].bool()  # only real completion tokens reach the output layer
        logp, entropy = token_logprobs(hidden[scored], head.weight, head.bias, targets[scored], temperature,
                                       chunk_tokens(model, head.out_features), with_entropy, entropy_grad)
        grid = scored.new_zeros(scored.shape, dtype=logp.dtype)  # 0 where a token is not scored
        return grid.masked_scatter(scored, logp), (grid.masked_scatter(scored, entropy) if with_entropy else None)
    # another architecture: whole logits [B, T, V]
    return logits_logprobs(completion_logits(model, input_ids, attention_mask, completion_len), targets, temperature,
                           with_entropy, entropy_grad)


def distinct_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(keep, inverse)`` when some rows repeat an earlier one (same ids, same mask): ``keep`` the
    first row of each distinct kind, in batch order, and ``inverse`` [B] each row's index in
    ``keep``. None when every row is distinct."""
    distinct, inverse = torch.unique(torch.cat([input_ids, attention_mask], dim=1), dim=0, return_inverse=True)
    if len(distinct) == len(input_ids):
        return None
    keep, rank = first_seen(inverse, len(distinct))
    return keep, rank[inverse]


def first_seen(inverse: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For ``torch.unique``'s ``inverse`` over ``count`` values (unique sorts them): ``(first, rank)``,
    the row where each value first appears, in row order, and each value's place in that order."""
    first = torch.full((count,), len(inverse), dtype=torch.long, device=inverse.device)
    first.scatter_reduce_(0, inverse, torch.arange(len(inverse), device=inverse.device), "amin")
    first, order = first.sort()
    rank = torch.empty_like(order)
    rank[order] = torch.arange(count, device=inverse.device)
    return first, rank


def prompt_index(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 completion_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(distinct, row_prompt)``: the distinct prompts of ``[prompt | completion]`` rows (ids and padding
    mask side by side, ``[P, 2W]``, sorted) and each row's index among them ``[B]``."""
    width = input_ids.shape[1] - completion_len
    prompts = torch.cat([input_ids[:, :width], attention_mask[:, :width]], dim=1)
    return torch.unique(prompts, dim=0, return_inverse=True)


def completion_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_len: int) -> torch.Tensor:
    """``[B, T, V]`` logits that predict the T completion tokens (position W - 1 + t predicts token t):
    :func:`completion_states` with ``states=False``."""
    return completion_states(model, input_ids, attention_mask, completion_len, states=False)


def completion_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_len: int,
                      states: bool) -> torch.Tensor:
    """``[B, T, V]`` logits that predict the T completion tokens, or with ``states`` the decoder's
    final hidden states ``[B, T, hidden]`` from which :func:`output_head` computes those logits.

    When rows share prompts (same ids, same padding; at most 3/4 of the rows' prompts distinct), the
    distinct prompts run once with a KV cache and the rows' completions run on top of their prompt's
    cache; otherwise (or where a cache cannot be used: a model training with gradient checkpointing)
    every row runs whole. On a model that :mod:`rlvr.modeling.fast_forward` supports, the rows run its
    shared-prompt forward instead, in any order and any number per prompt.
    """
    width = input_ids.shape[1] - completion_len
    distinct, row_prompt = prompt_index(input_ids, attention_mask, completion_len)
    # Two passes cost more fixed overhead than one: share only when it saves a quarter of the prompts.
    # A sharded model runs whole rows: one forward per pass on every rank (FSDP2's collectives pair up)
    if width == 0 or 4 * len(distinct) > 3 * len(input_ids) or training_with_checkpointing(model) \
            or is_sharded(model):
        return _whole_rows(model, input_ids, attention_mask, completion_len, states)
    if fast_forward.supports(model):
        _, rank = first_seen(row_prompt, len(distinct))  # prompts in row order: a batch of whole groups needs no reordering
        prompts = torch.empty_like(distinct).index_copy_(0, rank, distinct)
        return _fast_shared_prompts(model, prompts, rank[row_prompt], input_ids[:, width:], attention_mask[:, width:],
                                    completion_len, states)
    prompt_mask = distinct[:, width:]
    first, head = _model_pass(model, states, 1, input_ids=distinct[:, :width], attention_mask=prompt_mask,
                              position_ids=position_ids(prompt_mask), use_cache=True)
    first = first[row_prompt]  # [B, 1, V]: the prompt's last position predicts completion token 0
    if completion_len == 1:
        return first
    cache = output_cache(head)
    cache.reorder_cache(row_prompt)  # [distinct prompts] -> [B] rows; a differentiable index_select
    # The last completion token predicts nothing that is scored: the tail runs tokens 0 .. T-2.
    tail_ids = input_ids[:, width : width + completion_len - 1]
    prompt_len = attention_mask[:, :width].sum(dim=1, keepdim=True)
    tail_positions = prompt_len + torch.arange(completion_len - 1, device=input_ids.device)
    tail, _ = _model_pass(model, states, completion_len - 1, input_ids=tail_ids,
                          attention_mask=attention_mask[:, : width + completion_len - 1], position_ids=tail_positions,
                          use_cache=True, **{cache_argument(model): cache})
    return torch.cat([first, tail], dim=1)


def _model_pass(model, states: bool, keep: int, **inputs) -> tuple[torch.Tensor, object]:
    """The model's own forward: ``(the last keep positions' logits, or with states the final hidden
    states from which its output layer computes them; the output)``."""
    with _output_layer_off(model) if states else contextlib.nullcontext():
        out = model(**inputs, logits_to_keep=keep)
    return out.logits, out


@contextlib.contextmanager
def _output_layer_off(model):
    """Inside the ``with``, the model's output layer passes its input through: its forward returns the
    final hidden states as ``logits``. The whole forward still runs through the model's own entry
    point (a peft wrapper's, a sharded root's hooks), which a call to the decoder alone would skip."""
    base = _base(model)
    head = base.get_output_embeddings()
    base.set_output_embeddings(torch.nn.Identity())
    try:
        yield
    finally:
        base.set_output_embeddings(head)


def _fast_shared_prompts(model, prompts: torch.Tensor, row_prompt: torch.Tensor, completions: torch.Tensor,
                         completion_mask: torch.Tensor, completion_len: int, states: bool) -> torch.Tensor:
    """:func:`completion_logits` by :mod:`rlvr.modeling.fast_forward`: ``prompts`` ``[D, 2W]`` (ids | mask),
    ``row_prompt`` [B] each row's prompt, ``completions`` and their mask ``[B, T]``.

    The fast forward lays rows out as D groups of G (the most rows of any prompt); a prompt with
    fewer rows gets empty ones, which cost no projection (no token of theirs is needed). Completion
    token t runs only if token t + 1 is real (its logits predict that token): a row's padding is not
    computed either."""
    width = prompts.shape[1] // 2
    seen = torch.nn.functional.one_hot(row_prompt, len(prompts)).cumsum(dim=0)  # [B, D] rows so far per prompt
    group = int(seen[-1].max())
    slot = seen.gather(1, row_prompt[:, None]).squeeze(1) - 1  # earlier rows of the same prompt
    cell = row_prompt * group + slot  # [B] each row's place in the [D * G] layout
    cells = len(prompts) * group
    in_place = cells == len(row_prompt) and bool((cell == torch.arange(cells, device=cell.device)).all())
    if not in_place:
        completions = completions.new_zeros(cells, completions.shape[1]).index_copy_(0, cell, completions)
        completion_mask = completion_mask.new_zeros(cells, completion_mask.shape[1]).index_copy_(0, cell, completion_mask)
    if completion_len > 1:  # prompts and rows in one pass
        last, tail = fast_forward.forward_prompts_and_rows(model, prompts[:, :width], prompts[:, width:],
                                                           completions[:, : completion_len - 1],
                                                           needed=completion_mask[:, 1:completion_len].bool(),
                                                           states=states)
    else:  # the prompt's last position predicts the only token
        last, _ = fast_forward.encode_prompts(model, prompts[:, :width], prompts[:, width:], group, states)
        tail = last.new_zeros(cells, 0, last.shape[-1])
    first = last[:, None].expand(-1, group, -1).reshape(cells, 1, -1)  # backward: a sum over the group
    logits = torch.cat([first, tail], dim=1)
    return logits if in_place else logits[cell]


def _whole_rows(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_len: int,
                states: bool = False) -> torch.Tensor:
    out, _ = _model_pass(model, states, completion_len + 1, input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids(attention_mask), use_cache=False)
    return out[:, :-1]


def no_grad_logprobs(model, batch, micro_batch_size, temperature: float) -> torch.Tensor:
    """``[N, T]`` log-probs of a batch's completions without a graph (``batch``: a rollout ``Batch``, or
    anything with its ``input_ids``, ``attention_mask`` and ``completion_len``). ``micro_batch_size``:
    rows per pass, or a :class:`rlvr.rollout.batch.MicroBatching` (a row cap and a token budget). Each
    pass runs its rows cut to their own width (:func:`rlvr.rollout.batch.trim_window`); their log-probs
    fill the first columns of their rows, the rest (padding) is 0. The pass runs in inference mode (no
    autograd bookkeeping at all: ~7% of a small model's pass); its result is copied out as an ordinary
    tensor, which a later graph may use as a constant. A sharded model makes as many passes as the
    rank with the most micro-batches (``MicroBatching.passes``), repeating its first and discarding it."""
    from rlvr.rollout.batch import MicroBatching, trim_window  # not at the top: rlvr.rollout imports this module

    plan = micro_batch_size if isinstance(micro_batch_size, MicroBatching) else MicroBatching(micro_batch_size)
    length, response = batch.completion_len, getattr(batch, "response_mask", None)
    everything = torch.arange(len(batch), device=batch.input_ids.device)
    logp = None
    with torch.inference_mode():
        for rows in plan.passes(batch, everything, model):  # None: a sharded model repeats a pass, discarded
            mine = everything[:1] if rows is None else rows
            columns, own = trim_window(batch.attention_mask, length, mine, response)
            part, _ = completion_logprobs(model, batch.input_ids[mine, columns], batch.attention_mask[mine, columns],
                                          own, temperature)  # [n, own]
            if logp is None:
                logp = part.new_zeros(len(batch), length)  # [N, T]
            if rows is not None:
                logp[rows, :own] = part
    return logp.clone() if logp is not None else torch.zeros(0, length, device=batch.input_ids.device)


def reference_logprobs(reference, batch, micro_batch_size, temperature: float) -> torch.Tensor:
    """:func:`no_grad_logprobs` under the reference policy (a :class:`rlvr.modeling.loading.Reference`);
    ``micro_batch_size`` as there (rows, or a ``MicroBatching``)."""
    with reference.model() as ref_model:
        return no_grad_logprobs(ref_model, batch, micro_batch_size, temperature)


def output_cache(output):
    """The KV cache a forward with ``use_cache=True`` returned (``cache`` since transformers 5.24)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def cache_argument(model) -> str:
    """The forward argument that takes a KV cache: ``cache`` since transformers 5.24, else ``past_key_values``."""
    return _cache_argument_of(type(_base(model)))  # through a peft wrapper


@functools.cache
def _cache_argument_of(model_class) -> str:
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions of left-padded rows: each row's first real token is position 0."""
    return (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)  # left padding shifts positions
