"""Log-probabilities (and entropies) of target tokens from final hidden states, without the whole logits.

The logits of ``N`` tokens over a vocabulary ``V`` are an ``[N, V]`` float32 tensor that dominates a
long pass's memory: 16 rows of 1,024 tokens over SmolLM2's 49,152 words are 3.2 GB, over Qwen2.5's
151,936 words 10 GB, and the log-softmax and its gradient each take as much again. Here the tokens
run through the output layer a chunk at a time, so that at most ``chunk`` tokens' logits exist at once:

* the forward keeps, per token, the log-prob of its target ``z_y - logsumexp(z)`` (``z`` = logits /
  temperature) and, where asked, the entropy ``H = -sum_j p_j log p_j``;
* the backward recomputes a chunk's logits (the price of not keeping them: one more output-layer
  matmul) and applies the closed-form gradients
  ``d logp / dz = onehot(y) - p`` and ``d H / dz = -p * (log p + H)``, divided by the temperature;
* when the output layer is frozen (LoRA), no recomputation is needed: the only gradient is the
  hidden state's, ``g * (onehot(y) - p) @ W / T``, whose vector ``(onehot(y) - p) @ W / T`` (``[N,
  hidden]``, small) is computed in the forward while the chunk's ``p`` exists.

Values and gradients equal the whole-logits computation to float rounding (``tests/test_chunked_logprobs.py``);
logits are computed in the layer's dtype and upcast to at least float32 before the softmax, as the
whole-logits path does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlvr.algorithms.losses import entropy_from_log_probs


def token_logprobs(
    hidden: torch.Tensor,  # [N, H] final (normed) hidden states
    weight: torch.Tensor,  # [V, H] output layer
    bias: torch.Tensor | None,  # [V]
    targets: torch.Tensor,  # [N] token ids
    temperature: float = 1.0,
    chunk: int = 0,  # tokens per chunk; 0 (or >= N): all at once
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logp [N], entropy [N] | None)`` of ``targets`` under ``softmax(hidden @ weight.T + bias) / temperature``.

    The entropy carries a gradient only with ``entropy_grad``. With ``chunk`` 0 or at least ``N`` the
    logits are computed whole and differentiated by autograd (nothing recomputed: the fastest where
    they fit)."""
    if chunk <= 0 or chunk >= len(hidden):
        return _whole(hidden, weight, bias, targets, temperature, with_entropy, entropy_grad)
    if not (torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad
                                         or (bias is not None and bias.requires_grad))):
        with torch.no_grad():
            logp, entropy, _ = _chunked_forward(hidden, weight, bias, targets, temperature, chunk, with_entropy)
        return logp, entropy
    logp, entropy = _ChunkedLogProbs.apply(hidden, weight, bias, targets, float(temperature), int(chunk),
                                           bool(with_entropy), bool(entropy_grad))
    if not with_entropy:
        return logp, None
    return logp, (entropy if entropy_grad else entropy.detach())


def _accumulator(dtype: torch.dtype) -> torch.dtype:
    """The softmax's dtype: half precision goes up to float32, float64 stays."""
    return torch.promote_types(dtype, torch.float32)


def _scaled_logits(hidden, weight, bias, temperature: float) -> torch.Tensor:
    return scaled(F.linear(hidden, weight, bias), temperature)


def scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Logits upcast to the softmax's dtype and divided by the sampling temperature."""
    logits = logits.to(_accumulator(logits.dtype))
    return logits / temperature if temperature != 1.0 else logits


def logits_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False,
                    entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logp [...], entropy [...] | None)`` of ``targets [...]`` from whole logits ``[..., V]`` (in the
    model's dtype: upcast and divided by the temperature here); the entropy carries a gradient only
    with ``entropy_grad``."""
    log_probs = torch.log_softmax(scaled(logits, temperature), dim=-1)  # shared by logp and the entropy
    logp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return logp, None
    if entropy_grad:
        return logp, entropy_from_log_probs(log_probs)
    with torch.no_grad():  # a metric only: no graph through the [..., V] softmax
        return logp, entropy_from_log_probs(log_probs)


def _whole(hidden, weight, bias, targets, temperature, with_entropy, entropy_grad):
    return logits_logprobs(F.linear(hidden, weight, bias), targets, temperature, with_entropy, entropy_grad)


def _chunked_forward(hidden, weight, bias, targets, temperature, chunk, with_entropy, frozen_grads=None):
    """Log-probs and entropies chunk by chunk. With ``frozen_grads`` (``"logp"`` or ``"logp+entropy"``)
    also the per-token vectors ``d logp / d hidden`` (and ``d H / d hidden``), for a frozen output layer."""
    count = len(hidden)
    acc = _accumulator(hidden.dtype)
    logp = hidden.new_empty(count, dtype=acc)
    entropy = hidden.new_empty(count, dtype=acc) if with_entropy or frozen_grads == "logp+entropy" else None
    vectors = []
    for start in range(0, count, chunk):
        end = min(start + chunk, count)
        log_probs = torch.log_softmax(_scaled_logits(hidden[start:end], weight, bias, temperature), dim=-1)
        logp[start:end] = log_probs.gather(1, targets[start:end, None]).squeeze(1)
        probs = log_probs.exp() if entropy is not None or frozen_grads else None
        if entropy is not None:
            entropy[start:end] = -(probs * log_probs).sum(-1)
        if frozen_grads:
            d_logp = _logp_grad(probs, targets[start:end]) / temperature
            parts = [d_logp.to(weight.dtype) @ weight]
            if frozen_grads == "logp+entropy":
                d_entropy = _entropy_grad(probs, log_probs, entropy[start:end]) / temperature
                parts.append(d_entropy.to(weight.dtype) @ weight)
            vectors.append(parts)
    if frozen_grads:
        vectors = [torch.cat(column) for column in zip(*vectors)]
    return logp, entropy, vectors


def _logp_grad(probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``d log p_y / d z = onehot(y) - p``, ``[n, V]``."""
    grad = -probs
    grad[torch.arange(len(targets), device=targets.device), targets] += 1.0
    return grad


def _entropy_grad(probs: torch.Tensor, log_probs: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
    """``d H / d z = -p * (log p + H)``, ``[n, V]``."""
    return -probs * (log_probs + entropy[:, None])


class _ChunkedLogProbs(torch.autograd.Function):
    """:func:`token_logprobs` over chunks, its backward recomputing each chunk's logits (or, for a
    frozen output layer, reading the hidden-state gradient vectors the forward computed)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk, with_entropy, entropy_grad):
        frozen = not weight.requires_grad and (bias is None or not bias.requires_grad)
        ctx.frozen, ctx.temperature, ctx.chunk, ctx.entropy_grad = frozen, temperature, chunk, entropy_grad
        mode = ("logp+entropy" if entropy_grad else "logp") if frozen else None
        logp, entropy, vectors = _chunked_forward(hidden, weight, bias, targets, temperature, chunk,
                                                  with_entropy or entropy_grad, mode)
        if entropy is None:
            entropy = logp.new_zeros(0)
        if frozen:
            ctx.save_for_backward(*vectors)
        else:
            ctx.save_for_backward(hidden, weight, bias, targets)
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        ctx.set_materialize_grads(False)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        if not ctx.entropy_grad:
            grad_entropy = None
        if ctx.frozen:
            d_logp, *d_entropy = ctx.saved_tensors
            grad_hidden = None
            if grad_logp is not None:
                grad_hidden = grad_logp.to(d_logp.dtype)[:, None] * d_logp
            if grad_entropy is not None:
                term = grad_entropy.to(d_entropy[0].dtype)[:, None] * d_entropy[0]
                grad_hidden = term if grad_hidden is None else grad_hidden + term
            return grad_hidden, None, None, None, None, None, None, None
        hidden, weight, bias, targets = ctx.saved_tensors
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        acc = _accumulator(hidden.dtype)
        grad_hidden = torch.empty_like(hidden) if needs_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) if needs_weight else None
        grad_bias = torch.zeros(bias.shape, dtype=acc, device=bias.device) if needs_bias else None
        for start in range(0, len(hidden), ctx.chunk):
            end = min(start + ctx.chunk, len(hidden))
            h = hidden[start:end]
            log_probs = torch.log_softmax(_scaled_logits(h, weight, bias, ctx.temperature), dim=-1)
            probs = log_probs.exp()
            grad_z = torch.zeros_like(probs)
            if grad_logp is not None:
                grad_z += grad_logp[start:end, None].to(acc) * _logp_grad(probs, targets[start:end])
            if grad_entropy is not None:
                entropy = -(probs * log_probs).sum(-1)
                grad_z += grad_entropy[start:end, None].to(acc) * _entropy_grad(probs, log_probs, entropy)
            if ctx.temperature != 1.0:
                grad_z /= ctx.temperature
            grad_logits = grad_z.to(weight.dtype)
            if needs_hidden:
                grad_hidden[start:end] = grad_logits @ weight
            if needs_weight:
                grad_weight += (grad_logits.T @ h).to(acc)
            if needs_bias:
                grad_bias += grad_z.sum(0)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None
