"""Off-policy corrections: train on samples drawn by an older (or merely different) policy.

Three policies meet in an off-policy update (AReaL's names):

    pi_behav   the policy that sampled the tokens (the engine's log-probs, ``Batch.engine_logp``); with
               asynchronous generation it lags the trainer by up to ``max_staleness`` versions
    pi_prox    the proximal policy the PPO clip is taken against: the trainer's weights when the batch
               is first used (``Batch.old_logp``, recomputed)
    pi_theta   the policy being differentiated

A correction turns ``rho_t = pi_prox(o_t) / pi_behav(o_t)`` into per-token weights (no gradient) that
multiply the per-token policy loss, and a mask of the tokens that still count:

    token_tis   w_t = min(rho_t, C)                         truncated importance sampling (Yao et al. 2025;
                                                            verl's token-level rollout correction)
    seq_mask    w_t = 1, and a sequence counts only when    sequence-level masking: a sequence whose
                1/C <= exp(mean_t log rho_t) <= C           geometric-mean ratio is out of bounds is
                                                            dropped whole (NeMo-RL, verl's sequence mode)
    decoupled   w_t = rho_t, and a token counts only when   AReaL's decoupled PPO: the clip is against
                rho_t <= C                                  pi_prox, the weight corrects for pi_behav;
                                                            tokens with a weight beyond the cap are
                                                            masked, not truncated

With ``L_t(theta) = policy_loss(pi_theta / pi_prox, A)`` (the clipped surrogate) the loss is
``aggregate(w_t * L_t, mask * keep)``. When the behaviour policy is the proximal one (a synchronous
step, staleness 0, an exact engine) every ``rho_t = 1``: the weights are 1 and nothing is masked, so
each correction is exactly the plain loss.

Each is registered in ``OFF_POLICY_CORRECTIONS`` (plugins: entry-point group rlvr.off_policy_corrections)
as ``(prox_logp [B, T], behav_logp [B, T], mask [B, T], *, cap) -> (weights [B, T], keep [B, T])``.
"""

from __future__ import annotations

from typing import Callable

import torch

from rlvr.verifiers.plugins import Registry

Correction = Callable[..., "tuple[torch.Tensor, torch.Tensor]"]
OFF_POLICY_CORRECTIONS: Registry[Correction] = Registry("off-policy correction",
                                                        entry_point_group="rlvr.off_policy_corrections")


def _log_ratio(prox_logp: torch.Tensor, behav_logp: torch.Tensor) -> torch.Tensor:
    """log rho_t = log pi_prox - log pi_behav, float32 at least, no gradient, clamped to [-20, 20] so
    that a token one policy finds impossible cannot overflow."""
    dtype = torch.promote_types(prox_logp.dtype, torch.float32)
    return (prox_logp.detach().to(dtype) - behav_logp.detach().to(dtype)).clamp(-20.0, 20.0)


@OFF_POLICY_CORRECTIONS.register("none")
def no_correction(prox_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor, *,
                  cap: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights 1, every token kept: the behaviour policy is taken to be the proximal one."""
    return torch.ones_like(mask, dtype=torch.float32), torch.ones_like(mask, dtype=torch.float32)


@OFF_POLICY_CORRECTIONS.register("token_tis")
def token_tis(prox_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor, *,
              cap: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance sampling per token: ``w_t = min(rho_t, cap)``; every token kept."""
    _check_cap(cap)
    weights = _log_ratio(prox_logp, behav_logp).exp().clamp(max=cap)
    return weights, torch.ones_like(weights)


@OFF_POLICY_CORRECTIONS.register("seq_mask")
def sequence_mask(prox_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor, *,
                  cap: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence-level masking: weights 1; a sequence is kept only when its geometric-mean ratio
    ``exp(sum_t m_t log rho_t / sum_t m_t)`` lies in ``[1/cap, cap]`` (a sequence without tokens is kept)."""
    _check_cap(cap)
    m = mask.to(torch.float32)
    mean_log = (_log_ratio(prox_logp, behav_logp) * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)  # [B]
    bound = float(torch.log(torch.tensor(cap)))
    kept = (mean_log.abs() <= bound + 1e-12).to(torch.float32)  # [B]
    return torch.ones_like(m), kept[:, None].expand_as(m).clone()


@OFF_POLICY_CORRECTIONS.register("decoupled")
def decoupled(prox_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor, *,
              cap: float = 5.0) -> tuple[torch.Tensor, torch.Tensor]:
    """AReaL's decoupled PPO: ``w_t = rho_t`` (the clip is against pi_prox in the policy loss); a token
    whose weight exceeds ``cap`` is masked out rather than truncated."""
    _check_cap(cap)
    weights = _log_ratio(prox_logp, behav_logp).exp()
    keep = (weights <= cap).to(torch.float32)
    return weights * keep, keep


def _check_cap(cap: float) -> None:
    if not cap >= 1.0:
        raise ValueError(f"an off-policy correction's cap must be >= 1 (a ratio bound), got {cap}")
