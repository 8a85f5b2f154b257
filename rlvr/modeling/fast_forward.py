"""rlvr's own forward pass for Llama-family causal LMs, built for rows that share a prompt.

It computes the function of the model's own (transformers) forward, on the module's own parameters
(gradients land on them) and with its own rotary embedding, without the per-row copies of a prompt
and the per-call machinery that cost a small model much of its step:

* **shared-prompt attention**: the G rows of a group attend to their prompt's keys and values, held
  once per prompt, never copied per row; a row's scores over its prompt and over its own tokens go
  through one softmax (the same function as attention over the concatenated keys), and the
  gradient of a prompt's keys sums over its rows inside the matmul;
* a training pass runs the prompts and their rows through each layer together
  (:func:`forward_prompts_and_rows`): one matmul per projection, attention per section;
* a preallocated key/value buffer for the rows' own tokens while decoding;
* masks as additive biases built once per call and shared by every layer (``finfo.min``, never
  ``-inf``: a padded query row then attends uniformly instead of producing NaN), their rows padded
  to a multiple of 16 keys so that torch's fused kernels read them in place;
* a finished row's padding is not computed, in training and while decoding (``needed``).

Fusing the q/k/v and gate/up projections into one matmul each was measured slower in the backward
on the CPU, and gained 2% of decoding only, so it is not done (``benchmarks/README.md``).

Supported: ``llama``, ``mistral`` and ``qwen2`` modules (SiLU MLP, no sliding window, no attention
dropout while training, no gradient checkpointing), plain or LoRA-wrapped. Every projection is a
``torch.nn.Linear`` or, under a peft LoRA wrapper (``PeftModelForCausalLM``, unwrapped here to its
transformers model), a LoRA ``Linear`` with at most one active plain adapter: no DoRA or other LoRA
variant, no adapter bias, no dropout while training (one prompt's dropout mask would be shared by its
rows). Such a projection is called as the module itself, so it computes ``base(x) + scaling * B(A(x))``
exactly as in the model's own forward, with its adapters disabled (a LoRA policy's reference pass) or
merged as peft has them, and gradients reach the adapter weights only; a decoding step computes the same
sum as one ``addmm`` (:func:`_linear`). Any other peft module (a
``modules_to_save`` copy, an adapter on the embeddings or output layer, another tuner, prompt learning)
is refused. :func:`supports` says whether a model qualifies, :func:`unsupported_reason` why not
(both in :mod:`rlvr.modeling.fast_forward_support`, and importable from here);
``model.forward: hf`` in a run's config turns this path off (:func:`use_model_forward`). Logits and
gradients agree with the model's own forward to float rounding (``tests/test_fast_forward.py``).

Row layout: rows ``[B = D * G]`` are grouped by prompt, ``G`` consecutive rows per prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from rlvr.modeling.fast_forward_support import (SUPPORTED_TYPES, model_forward_only, supports,  # noqa: F401
                                                training_with_checkpointing, transformers_model, unsupported_reason,
                                                use_model_forward)

# ---------------------------------------------------------------------------------------------
# Caches
# ---------------------------------------------------------------------------------------------


@dataclass
class PromptCache:
    """The prompts' keys and values, once per prompt, contiguous: each layer's keys transposed
    ``[D, kv_heads, d, W]`` and values ``[D, kv_heads, W, d]``, as the attention matmuls read them
    (a decoding step would otherwise copy them for every token)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_bias: torch.Tensor  # [D, 1, 1, 1, W]: 0 on real tokens, finfo.min on left padding
    lengths: torch.Tensor  # [D] real tokens per prompt: the position of its rows' first own token
    group: int  # G rows per prompt


@dataclass
class RowCache:
    """The rows' own keys and values while decoding: each layer's ``[D, kv_heads, G, capacity, d]``;
    and the LoRA projections' adapters as decoding reads them (:func:`_decoding_adapter`), made at the
    first step: the weights do not change while rows decode."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int = 0  # tokens written
    adapters: dict = field(default_factory=dict)  # id(LoRA projection) -> (A, (scaling * B)^T) | None

    @classmethod
    def empty(cls, prompts: PromptCache, capacity: int) -> "RowCache":
        """Buffers for up to ``capacity`` own tokens of each of the prompts' rows."""
        shape = prompts.values[0].shape
        buffer = (shape[0], shape[1], prompts.group, capacity, shape[3])
        like = prompts.values[0]
        n = len(prompts.values)
        return cls([like.new_empty(buffer) for _ in range(n)], [like.new_empty(buffer) for _ in range(n)])


# ---------------------------------------------------------------------------------------------
# The passes
# ---------------------------------------------------------------------------------------------


def encode_prompts(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, group: int,
                   states: bool = False) -> tuple[torch.Tensor, PromptCache]:
    """Run ``D`` left-padded prompts ``[D, W]``; returns the logits of each prompt's last position
    ``[D, V]`` (they predict its rows' first token; with ``states`` its final normed hidden state
    ``[D, hidden]`` instead, which the output layer turns into those logits) and the prompts'
    :class:`PromptCache`."""
    model = transformers_model(model)
    section, cache, positions = _prompt_section(_dtype(model), input_ids, attention_mask, group)
    hidden = _run(model, [section], [input_ids], [positions])
    num, width = input_ids.shape
    last = _final(model, hidden.view(num, width, -1)[:, -1], states)  # left padding: every prompt ends at column W - 1
    return last, cache


def forward_rows(model, input_ids: torch.Tensor, prompts: PromptCache, rows: RowCache | None = None,
                 needed: torch.Tensor | None = None) -> torch.Tensor:
    """Logits ``[B, L, V]`` of the rows' next ``L`` own tokens ``[B, L]`` on top of their prompts.

    Without ``rows`` the L tokens are all of a row's own tokens so far (a training pass: causal among
    themselves); with ``rows`` they follow the ``rows.length`` tokens already in its buffer, and are
    written there (decoding). ``needed`` ``[B, L]`` marks the tokens whose logits are wanted, a prefix
    of each row: the others (a finished row's padding) are not computed at all (padding-free
    projections and MLP) and get logits 0. While decoding, a token not needed writes zeros to its
    row's buffer: for a row that has finished, whose later logits are not wanted either."""
    model = transformers_model(model)
    section, positions = _rows_section(_dtype(model), input_ids, prompts, rows, needed)
    hidden = _run(model, [section], [input_ids], [positions])
    if rows is not None:
        rows.length += input_ids.shape[1]
    return section.tokens.unpack(_final(model, hidden))


def forward_prompts_and_rows(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, input_ids: torch.Tensor,
                             needed: torch.Tensor | None = None, states: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`encode_prompts`, then :func:`forward_rows` without a row buffer (a training pass), as
    one pass: ``(last [D, V], logits [B, L, V])`` for ``D`` prompts and ``B = D * G`` rows. The
    prompts' tokens and the rows' go through each layer's norms, projections and MLP together (one
    operator where two passes run two); attention runs per section, the rows' on the keys that the
    prompts' section has just computed in the same layer. With ``states``, final normed hidden states
    instead of logits (``[D, hidden]``, ``[B, L, hidden]``)."""
    model = transformers_model(model)
    num, width = prompt_ids.shape
    if len(input_ids) % num:
        raise ValueError(f"forward_prompts_and_rows: {len(input_ids)} rows for {num} prompts")
    dtype = _dtype(model)
    prompt_section, cache, prompt_positions = _prompt_section(dtype, prompt_ids, prompt_mask, len(input_ids) // num)
    rows_section, row_positions = _rows_section(dtype, input_ids, cache, None, needed)
    hidden = _run(model, [prompt_section, rows_section], [prompt_ids, input_ids], [prompt_positions, row_positions])
    prompt_hidden, row_hidden = hidden.split([num * width, rows_section.tokens.size])
    logits = _final(model, torch.cat([prompt_hidden.view(num, width, -1)[:, -1], row_hidden]), states)
    last, row_logits = logits.split([num, rows_section.tokens.size])
    return last, rows_section.tokens.unpack(row_logits)


@dataclass
class _Section:
    """Tokens of a pass that attend as one: prompts (``groups`` (D, 1), their keys and values kept in
    ``keep``), or rows (``groups`` (D, G)) on top of their ``prompt``'s keys, decoding into ``rows``."""

    groups: tuple[int, int]
    tokens: "_Tokens"
    own_bias: torch.Tensor | None  # additive mask among the section's own keys
    prompt: PromptCache | None = None
    rows: RowCache | None = None
    keep: PromptCache | None = None
    kernel_bias: torch.Tensor | None = None  # rows: the fused kernel's [D, 1, L, W + L], built by the first layer


def _dtype(model) -> torch.dtype:
    """The dtype of the model's hidden states (its embedding's), which the attention biases take."""
    return model.model.embed_tokens.weight.dtype


def _prompt_section(dtype: torch.dtype, input_ids: torch.Tensor, attention_mask: torch.Tensor, group: int):
    """``(section, cache, positions)`` of ``D`` left-padded prompts ``[D, W]``; the pass fills the cache."""
    num, width = input_ids.shape
    real = attention_mask.bool()
    causal = torch.ones(width, width, dtype=torch.bool, device=input_ids.device).tril()
    allowed = causal[None] & real[:, None, :]  # [D, W queries, W keys]
    cache = PromptCache([], [], _bias(real, dtype).view(num, 1, 1, 1, width), attention_mask.sum(dim=1), group)
    section = _Section((num, 1), _Tokens(num, width), _bias(allowed, dtype).view(num, 1, 1, 1, width, width), keep=cache)
    return section, cache, (attention_mask.cumsum(dim=1) - 1).clamp(min=0)


def _rows_section(dtype: torch.dtype, input_ids: torch.Tensor, prompts: PromptCache, rows: RowCache | None,
                  needed: torch.Tensor | None):
    """``(section, positions)`` of rows ``[B, L]`` on top of their prompts."""
    num, group = len(prompts.lengths), prompts.group
    count, length = input_ids.shape
    if count != num * group:
        raise ValueError(f"forward_rows: {count} rows for {num} prompts x {group} rows each")
    start = rows.length if rows is not None else 0
    steps = torch.arange(start, start + length, device=input_ids.device)
    positions = prompts.lengths.repeat_interleave(group)[:, None] + steps  # [B, L]
    own_bias = None
    if length > 1:  # causal among the new tokens; every earlier own token is visible
        allowed = torch.ones(length, start + length, dtype=torch.bool, device=input_ids.device).tril(diagonal=start)
        own_bias = _bias(allowed, dtype)
    return _Section((num, group), _Tokens(count, length, needed), own_bias, prompt=prompts, rows=rows), positions


def _run(model, sections: list[_Section], ids: list[torch.Tensor], positions: list[torch.Tensor]) -> torch.Tensor:
    """The decoder over the sections' tokens ``ids`` at ``positions`` (``[B, L]`` grids), held flat one
    section after another; returns the final hidden states ``[N, hidden]``."""
    shapes = _Shapes(model)

    def flat(grids: list[torch.Tensor]) -> torch.Tensor:
        packed = [section.tokens.pack(grid) for section, grid in zip(sections, grids)]
        return packed[0] if len(packed) == 1 else torch.cat(packed)

    hidden = model.model.embed_tokens(flat(ids))
    cos, sin = _rotary(model, hidden, flat(positions))
    adapters = next((section.rows.adapters for section in sections if section.rows is not None), None)
    for index in range(len(shapes.layers)):
        hidden = _layer(shapes, index, hidden, cos, sin, sections, adapters)
    return hidden


class _Tokens:
    """The ``[B, L]`` token slots of a pass, held flat ``[N, ...]``: all ``B * L`` of them, or only
    the ``needed`` ones (projections, MLP and logits run on those; attention unpacks to the grid,
    where a row's missing tokens come after its needed ones and causal masking keeps them unseen)."""

    def __init__(self, count: int, length: int, needed: torch.Tensor | None = None):
        self.count, self.length = count, length
        self.index = None
        if needed is not None and not bool(needed.all()):
            self.index = needed.reshape(-1).nonzero().squeeze(1)
        self.size = count * length if self.index is None else len(self.index)  # N

    def pack(self, grid: torch.Tensor) -> torch.Tensor:
        """``[B, L, ...]`` -> ``[N, ...]``."""
        flat = grid.reshape(self.count * self.length, *grid.shape[2:])
        return flat if self.index is None else flat.index_select(0, self.index)

    def unpack(self, flat: torch.Tensor) -> torch.Tensor:
        """``[N, ...]`` -> ``[B, L, ...]``, zeros where a token was not computed."""
        if self.index is not None:
            full = flat.new_zeros(self.count * self.length, *flat.shape[1:])
            flat = full.index_copy(0, self.index, flat)  # its backward reads the computed rows only
        return flat.view(self.count, self.length, *flat.shape[1:])


# ---------------------------------------------------------------------------------------------
# One decoder layer
# ---------------------------------------------------------------------------------------------


class _Shapes:
    """The model's layer list and attention shapes, read once per pass."""

    def __init__(self, model):
        config = model.config
        self.layers = model.model.layers
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scale = self.head_dim ** -0.5


def _layer(w: _Shapes, index: int, hidden: torch.Tensor, cos, sin, sections: list[_Section],
           adapters: dict | None = None) -> torch.Tensor:
    """One decoder layer over the pass's tokens ``hidden [N, hidden]``, the sections' one after
    another: norms, projections and MLP over all of them at once, attention per section. ``adapters``:
    a decoding step's LoRA adapters (:attr:`RowCache.adapters`)."""
    layer = w.layers[index]
    heads, kv, dim = w.heads, w.kv_heads, w.head_dim
    attn = layer.self_attn
    x = _rms_norm(hidden, layer.input_layernorm)
    q = _rope(_linear(attn.q_proj, x, adapters).view(-1, heads, dim), cos, sin)
    k = _rope(_linear(attn.k_proj, x, adapters).view(-1, kv, dim), cos, sin)
    v = _linear(attn.v_proj, x, adapters).view(-1, kv, dim)
    if len(sections) == 1:
        out = _attention(w, index, q, k, v, sections[0])
    else:
        sizes = [section.tokens.size for section in sections]
        out = torch.cat([_attention(w, index, *qkv, section)
                         for *qkv, section in zip(q.split(sizes), k.split(sizes), v.split(sizes), sections)])
    hidden = hidden + _linear(attn.o_proj, out, adapters)
    mlp = layer.mlp
    x = _rms_norm(hidden, layer.post_attention_layernorm)
    up = F.silu(_linear(mlp.gate_proj, x, adapters)) * _linear(mlp.up_proj, x, adapters)
    return hidden + _linear(mlp.down_proj, up, adapters)


def _linear(proj, x: torch.Tensor, adapters: dict | None = None) -> torch.Tensor:
    """A projection of the tokens ``x [N, in]``: a plain ``Linear`` as ``F.linear`` (no module-call
    overhead); a LoRA one (:func:`_lora_projection_reason` vetted it) by its own forward, which adds
    ``scaling * B(A(x))`` to the base layer's output (none while its adapters are disabled or merged),
    except while decoding (``adapters``, a :class:`RowCache`'s): there the same sum is one ``addmm`` over
    the base layer's output with the adapters in ``x``'s dtype, ``scaling`` folded into ``B`` once per
    generation. peft's forward takes 7 operators per projection (casts to and from the float32 adapters,
    two matmuls, a scale, an add) and its module call; a decoding step of a small model is bound by
    that per-operator cost on a GPU, where LoRA decoded at half full fine-tuning's speed."""
    if type(proj) is torch.nn.Linear:
        return F.linear(x, proj.weight, proj.bias)
    if adapters is None or proj.disable_adapters or proj.merged:
        return proj(x)
    key = id(proj)
    if key not in adapters:
        adapters[key] = _decoding_adapter(proj, x.dtype)
    base = F.linear(x, proj.base_layer.weight, proj.base_layer.bias)
    if adapters[key] is None:  # no active adapter on this projection
        return base
    down, up = adapters[key]
    return torch.addmm(base, F.linear(x, down), up)


def _decoding_adapter(proj, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A LoRA projection's one active adapter as decoding reads it: ``(A [r, in], (scaling * B)^T [r, out])``
    in ``dtype``; None where no adapter of this projection is active."""
    active = [name for name in proj.active_adapters if name in proj.lora_A]
    if not active:
        return None
    (name,) = active  # :func:`_lora_projection_reason` refused more than one
    down = proj.lora_A[name].weight.detach()
    up = (proj.lora_B[name].weight.detach() * proj.scaling[name]).t()
    return down.to(dtype), up.to(dtype)


def _attention(w: _Shapes, index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, section: _Section) -> torch.Tensor:
    """Attention of one section's tokens (``q [N, heads, d]``, ``k``/``v [N, kv_heads, d]``, rotated);
    returns ``[N, heads * d]``. It runs in the grouped layout ``[D, kv_heads, G, rep * L, d]`` (rep =
    heads per kv head), where a group's rows meet their prompt's keys in one matmul."""
    num, group = section.groups
    tokens, prompt, rows, own_bias = section.tokens, section.prompt, section.rows, section.own_bias
    count, length = tokens.count, tokens.length
    heads, kv, dim = w.heads, w.kv_heads, w.head_dim
    rep = heads // kv
    if tokens.index is not None:  # one scatter to the [B, L] grid for all three
        q, k, v = tokens.unpack(torch.cat([q, k, v], dim=1)).split([heads, kv, kv], dim=2)
    if _kernel_attention(section, q):
        return tokens.pack(_sdpa(w, index, q, k, v, section))
    # [B, L, n, d] -> [D, kv, G, n/kv * L, d]: a group's rows side by side under each kv head
    q = q.reshape(num, group, length, kv, rep, dim).permute(0, 3, 1, 4, 2, 5).reshape(num, kv, group, rep * length, dim)
    k = k.reshape(num, group, length, kv, dim).permute(0, 3, 1, 2, 4)  # [D, kv, G, L, d]
    v = v.reshape(num, group, length, kv, dim).permute(0, 3, 1, 2, 4)
    if section.keep is not None:  # prompts: G = 1, keep [D, kv, d, W] and [D, kv, W, d]
        section.keep.keys.append(k[:, :, 0].transpose(-1, -2).contiguous())
        section.keep.values.append(v[:, :, 0].contiguous())
    if rows is not None:  # decoding: the new tokens join the row buffer
        end = rows.length + length
        rows.keys[index][:, :, :, rows.length : end] = k
        rows.values[index][:, :, :, rows.length : end] = v
        k, v = rows.keys[index][:, :, :, :end], rows.values[index][:, :, :, :end]
    scores = torch.matmul(q, k.transpose(-1, -2)) * w.scale  # [D, kv, G, rep*L, S] own tokens
    if own_bias is not None:  # [L, S] or [D, 1, 1, 1, L, S]: the same for every head copy (rep)
        shape = scores.shape
        scores = (scores.view(*shape[:3], rep, length, shape[-1]) + own_bias).view(shape)
    if prompt is not None:
        past = torch.matmul(q.reshape(num, kv, group * rep * length, dim), prompt.keys[index])
        past = past.view(num, kv, group, rep * length, -1) * w.scale + prompt.key_bias
        scores = torch.cat([past, scores], dim=-1)
    probs = _softmax(scores).to(q.dtype)
    if prompt is not None:
        width = prompt.values[index].shape[2]
        out = torch.matmul(probs[..., width:], v)
        shared = torch.matmul(probs[..., :width].reshape(num, kv, group * rep * length, width), prompt.values[index])
        out = out + shared.view_as(out)
    else:
        out = torch.matmul(probs, v)
    # [D, kv, G, rep*L, d] -> [B, L, heads * d] -> the section's tokens
    return tokens.pack(out.view(num, kv, group, rep, length, dim).permute(0, 2, 4, 1, 3, 5).reshape(count, length, heads * dim))


def _kernel_attention(section: _Section, q: torch.Tensor) -> bool:
    """Whether a section's attention runs torch's fused kernel (:func:`_sdpa`) rather than the grouped
    matmuls: a training pass (no decoding buffer) on an accelerator, or long enough on the CPU that the
    full scores would cost more than the kernel (the grouped matmuls win on short rows, where their
    shared prompt keys save copies and the kernel's fixed cost dominates)."""
    if section.rows is not None:
        return False
    length = section.tokens.length
    keys = length + (section.prompt.values[0].shape[2] if section.prompt is not None else 0)
    return q.device.type != "cpu" or length * keys >= SDPA_MIN_SCORES


SDPA_MIN_SCORES = 128 * 128  # query x key positions per row from which the CPU runs the fused kernel


def _sdpa(w: _Shapes, index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, section: _Section) -> torch.Tensor:
    """:func:`_attention` by ``torch.nn.functional.scaled_dot_product_attention`` (flash or
    memory-efficient kernels: the ``[queries, keys]`` scores never exist whole): ``q [B, L, heads,
    d]``, ``k``/``v [B, L, kv_heads, d]`` (the grid, held flat); returns ``[B, L, heads * d]``.

    Prompts run in one call. Rows run one prompt's G rows per call: a row's keys are its prompt's
    then its own (copied per row: the kernels take one key sequence per batch entry), and the mask
    ``[1, 1, L, W + L]`` is the prompt's slice of one built per pass (:func:`_rows_kernel_bias`), shared
    by its rows, heads and every layer (a mask per row would cost G times the memory; a 5-d batch
    ``[D, G, ...]`` leaves the fused kernels for the math path, measured 2x slower and 2 GB hungrier at
    16 x 1,024 tokens)."""
    num, group = section.groups
    count, length = section.tokens.count, section.tokens.length
    heads, kv, dim = w.heads, w.kv_heads, w.head_dim
    q = q.view(count, length, heads, dim).transpose(1, 2)  # [B, n, L, d]
    k = k.view(count, length, kv, dim).transpose(1, 2)
    v = v.view(count, length, kv, dim).transpose(1, 2)
    own = section.own_bias  # [L, L], or [D, 1, 1, 1, L, L] for prompts
    if section.prompt is None:  # prompts (G = 1): keep [D, kv, d, W] and [D, kv, W, d], as the grouped path does
        section.keep.keys.append(k.transpose(-1, -2).contiguous())
        section.keep.values.append(v.contiguous())
        bias = own.view(num, 1, length, length) if own is not None else None
        return _kernel(w, q, k, v, bias).transpose(1, 2).reshape(count, length, heads * dim)
    keys, values = section.prompt.keys[index].transpose(-1, -2), section.prompt.values[index]  # [D, kv, W, d]
    bias = _rows_kernel_bias(section)  # [D, 1, L, W + L], the same tensor in every layer
    out = []
    for p in range(num):
        rows = slice(p * group, (p + 1) * group)
        out.append(_kernel(w, q[rows], _joined(w, keys[p], k[rows]), _joined(w, values[p], v[rows]), bias[p : p + 1]))
    return torch.cat(out).transpose(1, 2).reshape(count, length, heads * dim)


def _rows_kernel_bias(section: _Section) -> torch.Tensor:
    """The rows' mask for the fused kernel, ``[D, 1, L, W + L]``: prompt ``p``'s key padding, then
    causal among a row's own ``L`` tokens. Built by a pass's first layer and kept on the section for
    the others: a mask per layer per prompt (``[1, 1, L, W + L]``, 0.5 GB in bfloat16 at 16k tokens,
    each saved for the backward) adds up to an estimated 15 GB over 28 layers; this one exists once."""
    if section.kernel_bias is None:
        key_bias, own = section.prompt.key_bias, section.own_bias  # [D, 1, 1, 1, W], [L, L] | None
        num, width, length = key_bias.shape[0], key_bias.shape[-1], section.tokens.length
        bias = _aligned((num, 1, length, width + length), key_bias.dtype, key_bias.device)
        bias[..., :width] = key_bias.view(num, 1, 1, width)
        bias[..., width:] = own if own is not None else 0
        section.kernel_bias = bias
    return section.kernel_bias


def _joined(w: _Shapes, prompt: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """One prompt's keys (or values) ``[kv_heads, W, d]`` then its G rows' own ``[G, kv_heads, L, d]``,
    per query head: ``[G, heads, W + L, d]``, written in one copy (a concatenation then a
    ``repeat_interleave`` over the heads wrote the prompt's twice)."""
    group, kv, length, dim = own.shape
    rep, width = w.heads // kv, prompt.shape[1]
    both = torch.cat([prompt[None, :, None].expand(group, kv, rep, width, dim),
                      own[:, :, None].expand(group, kv, rep, length, dim)], dim=3)
    return both.view(group, kv * rep, width + length, dim)


def _kernel(w: _Shapes, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``softmax(q k^T * scale + bias) v`` for ``q [b, heads, L, d]`` and ``k``/``v [b, kv_heads, S, d]``
    (query heads h share key/value head h // (heads / kv_heads)) or already ``[b, heads, S, d]``."""
    if k.shape[1] < w.heads:
        k, v = k.repeat_interleave(w.heads // w.kv_heads, dim=1), v.repeat_interleave(w.heads // w.kv_heads, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype) if bias is not None else None,
                                          scale=w.scale)


def _softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the keys in at least float32. On the CPU, rows shorter than 16 are padded with
    masked keys first: torch's CPU softmax takes a scalar path below one vector's width and was
    measured 7-10x slower on 9-15 keys than on 16 (``benchmarks/README.md``)."""
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    keys = scores.shape[-1]
    if scores.device.type != "cpu" or keys >= _CPU_SOFTMAX_MIN:
        return torch.softmax(scores, dim=-1)
    padded = F.pad(scores, (0, _CPU_SOFTMAX_MIN - keys), value=torch.finfo(scores.dtype).min)
    return torch.softmax(padded, dim=-1)[..., :keys]


_CPU_SOFTMAX_MIN = 16


def _rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """Llama's RMSNorm, as transformers computes it (float32 statistics, weight times the cast-back)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


def _rotary(model, hidden: torch.Tensor, positions: torch.Tensor):
    """cos, sin ``[N, 1, d]`` of the tokens at ``positions [N]``, from the model's own rotary module
    (its scaling included)."""
    cos, sin = model.model.rotary_emb(hidden, positions[None])
    return cos[0].unsqueeze(1), sin[0].unsqueeze(1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _bias(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where attention is allowed, the dtype's most negative number where it is not (:func:`_aligned`)."""
    return _aligned(allowed.shape, dtype, allowed.device).fill_(0).masked_fill_(~allowed, torch.finfo(dtype).min)


def _aligned(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialised tensor whose last dimension is a slice of one padded to a multiple of 16: torch's
    fused attention kernels read a mask with such strides in place, and copy any other on every call."""
    keys = shape[-1]
    return torch.empty(*shape[:-1], -(-keys // 16) * 16, dtype=dtype, device=device)[..., :keys]


def _final(model, hidden: torch.Tensor, states: bool = False) -> torch.Tensor:
    """The logits of the last layer's hidden states, or with ``states`` the normed states themselves."""
    normed = _rms_norm(hidden, model.model.norm)
    return normed if states else model.lm_head(normed)
