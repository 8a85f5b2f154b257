"""Per-token log-probabilities of completions under a model, computed only where they are needed."""

from __future__ import annotations

import torch

from rlvr.algorithms.losses import entropy_from_log_probs


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

    Logits are kept for the last T + 1 positions only (the prompt's logits are never materialised),
    divided by the sampling temperature so that they match the distribution the engine sampled
    from, and upcast to float32 before the softmax. The entropy carries a gradient only when
    ``entropy_grad`` (an entropy bonus); as a metric it is computed without a graph.
    """
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)  # left padding shifts positions
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=completion_len + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1].float()  # [B, T, V]: position W-1+t predicts completion token t
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
