"""rlvr's own forward pass for Llama-family causal LMs, built for rows that share a prompt.

It computes the function of the model's own (transformers) forward, on the module's own parameters
(gradients land on them) and with its own rotary embedding, without the per-row copies of a prompt
and the per-call machinery that cost a small model much of its step:

* **shared-prompt attention**: the G rows of a group attend to their prompt's keys and values, held
  once per prompt (``[D, kv_heads, W, d]``), never copied per row; a row's scores over its prompt and
  over its own tokens go through one softmax (the same function as attention over the concatenated
  keys), and the gradient of a prompt's keys sums over its rows inside the matmul;
* a preallocated key/value buffer for the rows' own tokens while decoding;
* masks as additive biases built once per call (``finfo.min``, never ``-inf``: a padded query row
  then attends uniformly instead of producing NaN);
* in a training pass, a finished row's padding is not computed (``forward_rows(needed=...)``).

Fusing the q/k/v and gate/up projections into one matmul each was measured slower in the backward
on the CPU and is not done (``benchmarks/README.md``).

Supported: plain ``llama``, ``mistral`` and ``qwen2`` modules (not peft-wrapped, every projection a
``torch.nn.Linear``, SiLU MLP, no sliding window, no attention dropout while training, no gradient
checkpointing). :func:`supports` says whether a model qualifies; ``model.forward: hf`` in a run's
config turns this path off (:func:`use_model_forward`). Logits agree with the model's own forward to
float rounding (``tests/test_fast_forward.py``).

Row layout: rows ``[B = D * G]`` are grouped by prompt, ``G`` consecutive rows per prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlvr.models import training_with_checkpointing

SUPPORTED_TYPES = ("llama", "mistral", "qwen2")
_OFF = "_rlvr_model_forward_only"  # the attribute use_model_forward sets on a module


def use_model_forward(model) -> None:
    """Make every pass over ``model`` use its own (transformers) forward (``model.forward: hf``)."""
    setattr(model, _OFF, True)


def supports(model) -> bool:
    """Whether :func:`encode_prompts` / :func:`forward_rows` can run ``model`` exactly."""
    if getattr(model, _OFF, False):
        return False
    from transformers import PreTrainedModel  # a peft wrapper is not one: its layers compute something else

    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if not isinstance(model, PreTrainedModel) or getattr(config, "model_type", None) not in SUPPORTED_TYPES:
        return False
    if not all(hasattr(inner, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    if getattr(config, "hidden_act", None) != "silu" or getattr(config, "pretraining_tp", 1) != 1:
        return False
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return False
    if (model.training and getattr(config, "attention_dropout", 0.0)) or training_with_checkpointing(model):
        return False
    if not hasattr(model, "lm_head") or type(model.lm_head) is not torch.nn.Linear:
        return False
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            if type(proj) is not torch.nn.Linear:  # a LoRA or quantised layer computes something else
                return False
        if hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# Caches
# ---------------------------------------------------------------------------------------------


@dataclass
class PromptCache:
    """The prompts' keys and values, once per prompt: each layer's ``[D, kv_heads, W, d]``."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_bias: torch.Tensor  # [D, 1, 1, 1, W]: 0 on real tokens, finfo.min on left padding
    lengths: torch.Tensor  # [D] real tokens per prompt: the position of its rows' first own token
    group: int  # G rows per prompt


@dataclass
class RowCache:
    """The rows' own keys and values while decoding: each layer's ``[D, kv_heads, G, capacity, d]``."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int = 0  # tokens written

    @classmethod
    def empty(cls, prompts: PromptCache, capacity: int) -> "RowCache":
        """Buffers for up to ``capacity`` own tokens of each of the prompts' rows."""
        shape = prompts.keys[0].shape
        buffer = (shape[0], shape[1], prompts.group, capacity, shape[3])
        like = prompts.keys[0]
        n = len(prompts.keys)
        return cls([like.new_empty(buffer) for _ in range(n)], [like.new_empty(buffer) for _ in range(n)])


# ---------------------------------------------------------------------------------------------
# The two passes
# ---------------------------------------------------------------------------------------------


def encode_prompts(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, group: int) -> tuple[torch.Tensor, PromptCache]:
    """Run ``D`` left-padded prompts ``[D, W]``; returns the logits of each prompt's last position
    ``[D, V]`` (they predict its rows' first token) and the prompts' :class:`PromptCache`."""
    shapes = _Shapes(model)
    num, width = input_ids.shape
    lengths = attention_mask.sum(dim=1)
    positions = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    hidden = model.model.embed_tokens(input_ids)
    dtype = hidden.dtype
    real = attention_mask.bool()
    causal = torch.ones(width, width, dtype=torch.bool, device=input_ids.device).tril()
    allowed = causal[None] & real[:, None, :]  # [D, W queries, W keys]
    bias = _bias(allowed, dtype).view(num, 1, 1, 1, width, width)
    cache = PromptCache([], [], _bias(real, dtype).view(num, 1, 1, 1, width), lengths, group)
    tokens = _Tokens(num, width)
    cos, sin = _rotary(model, hidden, tokens.pack(positions))
    hidden = tokens.pack(hidden)
    for index in range(len(shapes.layers)):
        hidden = _layer(shapes, index, hidden, cos, sin, groups=(num, 1), tokens=tokens, prompt=None, rows=None,
                        own_bias=bias, keep=cache)
    last = _final_logits(model, hidden.view(num, width, -1)[:, -1])  # left padding: every prompt ends at column W - 1
    return last, cache


def forward_rows(model, input_ids: torch.Tensor, prompts: PromptCache, rows: RowCache | None = None,
                 needed: torch.Tensor | None = None) -> torch.Tensor:
    """Logits ``[B, L, V]`` of the rows' next ``L`` own tokens ``[B, L]`` on top of their prompts.

    Without ``rows`` the L tokens are all of a row's own tokens so far (a training pass: causal among
    themselves); with ``rows`` they follow the ``rows.length`` tokens already in its buffer, and are
    written there (decoding). ``needed`` ``[B, L]`` (training pass only) marks the tokens whose logits
    are wanted, a prefix of each row: the others (a finished row's padding) are not computed at all
    (padding-free projections and MLP) and get logits 0."""
    num, group = len(prompts.lengths), prompts.group
    count, length = input_ids.shape
    if count != num * group:
        raise ValueError(f"forward_rows: {count} rows for {num} prompts x {group} rows each")
    if needed is not None and rows is not None:
        raise ValueError("forward_rows: `needed` is for a training pass, not for decoding into `rows`")
    shapes = _Shapes(model)
    start = rows.length if rows is not None else 0
    steps = torch.arange(start, start + length, device=input_ids.device)
    positions = prompts.lengths.repeat_interleave(group)[:, None] + steps  # [B, L]
    tokens = _Tokens(count, length, needed)
    hidden = model.model.embed_tokens(tokens.pack(input_ids))
    own_bias = None
    if length > 1:  # causal among the new tokens; every earlier own token is visible
        allowed = torch.ones(length, start + length, dtype=torch.bool, device=input_ids.device).tril(diagonal=start)
        own_bias = _bias(allowed, hidden.dtype)
    cos, sin = _rotary(model, hidden, tokens.pack(positions))
    for index in range(len(shapes.layers)):
        hidden = _layer(shapes, index, hidden, cos, sin, groups=(num, group), tokens=tokens, prompt=prompts, rows=rows,
                        own_bias=own_bias, keep=None)
    if rows is not None:
        rows.length += length
    return tokens.unpack(_final_logits(model, hidden))


class _Tokens:
    """The ``[B, L]`` token slots of a pass, held flat ``[N, ...]``: all ``B * L`` of them, or only
    the ``needed`` ones (projections, MLP and logits run on those; attention unpacks to the grid,
    where a row's missing tokens come after its needed ones and causal masking keeps them unseen)."""

    def __init__(self, count: int, length: int, needed: torch.Tensor | None = None):
        self.count, self.length = count, length
        self.index = None
        if needed is not None and not bool(needed.all()):
            self.index = needed.reshape(-1).nonzero().squeeze(1)

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


def _layer(w: _Shapes, index: int, hidden: torch.Tensor, cos, sin, *, groups: tuple[int, int], tokens: _Tokens,
           prompt: PromptCache | None, rows: RowCache | None, own_bias, keep: PromptCache | None) -> torch.Tensor:
    """One decoder layer over the pass's tokens ``hidden [N, hidden]``. Attention runs in the grouped
    layout ``[D, kv_heads, G, rep * L, d]`` (rep = heads per kv head), where a group's rows meet their
    prompt's keys in one matmul."""
    layer = w.layers[index]
    num, group = groups
    count, length = tokens.count, tokens.length
    heads, kv, dim = w.heads, w.kv_heads, w.head_dim
    rep = heads // kv
    attn = layer.self_attn
    x = _rms_norm(hidden, layer.input_layernorm)
    q = _rope(F.linear(x, attn.q_proj.weight, attn.q_proj.bias).view(-1, heads, dim), cos, sin)
    k = _rope(F.linear(x, attn.k_proj.weight, attn.k_proj.bias).view(-1, kv, dim), cos, sin)
    v = F.linear(x, attn.v_proj.weight, attn.v_proj.bias).view(-1, kv, dim)
    if tokens.index is not None:  # one scatter to the [B, L] grid for all three
        q, k, v = tokens.unpack(torch.cat([q, k, v], dim=1)).split([heads, kv, kv], dim=2)
    # [B, L, n, d] -> [D, kv, G, n/kv * L, d]: a group's rows side by side under each kv head
    q = q.reshape(num, group, length, kv, rep, dim).permute(0, 3, 1, 4, 2, 5).reshape(num, kv, group, rep * length, dim)
    k = k.reshape(num, group, length, kv, dim).permute(0, 3, 1, 2, 4)  # [D, kv, G, L, d]
    v = v.reshape(num, group, length, kv, dim).permute(0, 3, 1, 2, 4)
    if keep is not None:  # the prompt pass: G = 1, keep [D, kv, W, d]
        keep.keys.append(k[:, :, 0])
        keep.values.append(v[:, :, 0])
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
        past = torch.matmul(q.reshape(num, kv, group * rep * length, dim), prompt.keys[index].transpose(-1, -2))
        past = past.view(num, kv, group, rep * length, -1) * w.scale + prompt.key_bias
        scores = torch.cat([past, scores], dim=-1)
    probs = _softmax(scores).to(hidden.dtype)
    if prompt is not None:
        width = prompt.keys[index].shape[2]
        out = torch.matmul(probs[..., width:], v)
        shared = torch.matmul(probs[..., :width].reshape(num, kv, group * rep * length, width), prompt.values[index])
        out = out + shared.view_as(out)
    else:
        out = torch.matmul(probs, v)
    # [D, kv, G, rep*L, d] -> [B, L, heads * d] -> the pass's tokens
    out = tokens.pack(out.view(num, kv, group, rep, length, dim).permute(0, 2, 4, 1, 3, 5).reshape(count, length, heads * dim))
    hidden = hidden + F.linear(out, attn.o_proj.weight, attn.o_proj.bias)
    mlp = layer.mlp
    x = _rms_norm(hidden, layer.post_attention_layernorm)
    up = F.silu(F.linear(x, mlp.gate_proj.weight, mlp.gate_proj.bias)) * F.linear(x, mlp.up_proj.weight, mlp.up_proj.bias)
    return hidden + F.linear(up, mlp.down_proj.weight, mlp.down_proj.bias)


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
    """0 where attention is allowed, the dtype's most negative number where it is not."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def _final_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    return model.lm_head(_rms_norm(hidden, model.model.norm))
