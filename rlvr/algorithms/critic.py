"""The critic side of PPO, as pure functions over tensors: per-token rewards, GAE, whitening, the
clipped value loss, explained variance, and the KL-coefficient controllers.

Shapes: ``B`` sequences, ``T`` response tokens. ``mask [B, T]`` is 1 on real response tokens and 0 on
padding; whatever padding holds (zeros, garbage, nan) never reaches a real position or a statistic.

One PPO step reads, in order (formulas as in ../shared/seeds/):

    rewards = token_rewards(scores, mask, kl=logp - ref_logp, beta=ctl.value)  # [B, T]
    adv, ret = gae(rewards, old_values, mask, gamma=1.0, lam=0.95)            # [B, T] each
    adv = masked_whiten(adv, mask)
    loss_t, clipped = clipped_value_loss_per_token(values, old_values, ret, mask)  # reduce: losses.aggregate
    ctl.update(mean_kl, n_steps=B)
"""

from __future__ import annotations

import math

import torch

TRUNCATION_MODES = ("none", "zero")


def _float(x: torch.Tensor) -> torch.Tensor:
    """Detached, and at least float32: statistics of bf16 tensors lose too many digits."""
    return x.detach().to(torch.promote_types(x.dtype, torch.float32))


# ---------------------------------------------------------------------------------------------
# Rewards and advantages
# ---------------------------------------------------------------------------------------------


def token_rewards(
    scores: torch.Tensor,  # [B] one score per sequence (verifier or reward model)
    mask: torch.Tensor,  # [B, T] 1 on real response tokens
    *,
    kl: torch.Tensor | None = None,  # [B, T] per-token KL estimate, e.g. k1 = logp - ref_logp
    beta: float = 0.0,
    truncated: torch.Tensor | None = None,  # [B] bool, True where generation hit the length limit
    truncation: str = "none",
    dense: torch.Tensor | None = None,  # [B, T] rewards earned on the way, e.g. a PRM's on each step's last token
) -> torch.Tensor:
    """Per-token reward of PPO-RLHF, ``[B, T]``, without gradient:

        r_t = dense_t - beta * kl_t                 on every real token (dense = 0 without one)
        r_t = score + dense_t - beta * kl_t          on the sequence's last real token

    Padding gets 0; a row without real tokens is all 0. ``truncation`` says what a truncated row
    (``truncated[b]`` True) earns at its end: ``"none"`` keeps its score, ``"zero"`` gives it no
    terminal score (the KL penalty still applies). To bootstrap instead (the answer is unfinished, so
    its return is the critic's estimate of what would follow), use ``"zero"`` here and pass
    ``last_values`` (the value after the last token, 0 for rows that ended) to :func:`gae`.
    """
    if truncation not in TRUNCATION_MODES:
        raise ValueError(f"unknown truncation {truncation!r}; valid: {', '.join(TRUNCATION_MODES)}")
    real = mask.bool()
    B, T = real.shape
    score = _float(scores).reshape(B)
    if truncated is not None and truncation == "zero":
        score = torch.where(truncated.bool().reshape(B), 0.0, score)
    positions = torch.arange(T, device=real.device)
    last = torch.where(real, positions, -1).max(dim=1).values  # [B], -1 for an empty row
    at_last = positions.unsqueeze(0) == last.unsqueeze(1)  # [B, T], one True per non-empty row
    rewards = torch.where(at_last, score.unsqueeze(1), 0.0)
    if dense is not None:
        rewards = rewards + torch.where(real, _float(dense), 0.0)
    if kl is not None and beta != 0.0:
        rewards = rewards - beta * torch.where(real, _float(kl), 0.0)
    return rewards


def gae(
    rewards: torch.Tensor,  # [B, T] per-token rewards (see token_rewards)
    values: torch.Tensor,  # [B, T] V(s_t) from the critic at rollout time
    mask: torch.Tensor,  # [B, T] 1 on real response tokens
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
    last_values: torch.Tensor | None = None,  # [B] V after the last real token (bootstrap), else 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over real tokens. Returns ``(advantages, returns)``, ``[B, T]``:

        delta_t = r_t + gamma * V_{t+1} - V_t       V after the last real token = last_values[b] or 0
        A_t     = delta_t + gamma * lam * A_{t+1}    (A after the last real token = 0)
        R_t     = A_t + V_t                          the critic's regression target

    lam = 1 gives the Monte Carlo return minus the value, lam = 0 the one-step TD error. Padding gets
    A = R = 0. A masked position is not a step: its successor is the next real token, so a row with
    holes gives what the same row with the holes deleted gives. No gradient flows; the results are
    at least float32.
    """
    real = mask.bool()
    r = torch.where(real, _float(rewards), 0.0)
    v = torch.where(real, _float(values), 0.0)
    B, T = r.shape
    next_value = torch.zeros(B, dtype=v.dtype, device=v.device)
    if last_values is not None:
        next_value = _float(last_values).to(v.dtype).reshape(B)
    next_adv = torch.zeros_like(next_value)
    advantages = torch.zeros_like(r)
    for t in reversed(range(T)):  # a loop over time, vectorised over the batch
        delta = r[:, t] + gamma * next_value - v[:, t]
        adv_t = delta + gamma * lam * next_adv
        on = real[:, t]
        advantages[:, t] = torch.where(on, adv_t, 0.0)
        # past a masked position, carry the later real token's value and advantage unchanged
        next_value = torch.where(on, v[:, t], next_value)
        next_adv = torch.where(on, adv_t, next_adv)
    return advantages, torch.where(real, advantages + v, 0.0)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` with mean and variance over the real tokens of the whole batch.

    The variance is the unbiased one (divided by n - 1), as in the group and batch z-scores of
    advantages.py: after whitening the real tokens have mean 0 and ``torch.var`` (n - 1) equal to 1.
    With n = 1 the variance is taken as 0 and the token whitens to 0. ``shift_mean=False`` adds the
    mean back (scale only, as PPO implementations do for rewards). Padding is 0 in the result.
    ``[B, T] -> [B, T]``, at least float32; gradients flow to ``x`` as usual.
    """
    real = mask.bool()
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    n = real.sum()
    mean = torch.where(real, x, 0.0).sum() / n.clamp(min=1)
    var = torch.where(real, (x - mean) ** 2, 0.0).sum() / (n - 1).clamp(min=1)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(real, out, 0.0)


# ---------------------------------------------------------------------------------------------
# Value loss and its diagnostics
# ---------------------------------------------------------------------------------------------


def clipped_value_loss_per_token(
    values: torch.Tensor,  # [B, T] current critic predictions (with gradient)
    old_values: torch.Tensor,  # [B, T] predictions at rollout time
    returns: torch.Tensor,  # [B, T] regression targets (GAE returns)
    mask: torch.Tensor,  # [B, T]
    *,
    clip: float = 0.2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO value loss and where its clipped branch won, ``(loss_t [B, T], clipped [B, T] bool)``:

        V_clip = clip(V, V_old - c, V_old + c)
        loss_t = 1/2 * max((V - R)^2, (V_clip - R)^2)

    Like the policy clip this is pessimistic: a prediction that moved more than ``clip`` from its
    rollout-time value is scored at the worse of the two. ``clipped`` marks the tokens where the clipped
    branch is strictly larger; there V_clip is a constant, so their gradient is zero (the clip-fraction
    metric). Padding gets loss 0 and False. Reduce ``loss_t`` with ``losses.aggregate``.
    """
    real = mask.bool()
    old, target = old_values.detach(), returns.detach()
    v_clip = torch.clamp(values, old - clip, old + clip)
    unclipped_sq = (values - target) ** 2
    clipped_sq = (v_clip - target) ** 2
    loss = 0.5 * torch.maximum(unclipped_sq, clipped_sq)
    return torch.where(real, loss, 0.0), (clipped_sq > unclipped_sq) & real


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var[R - V] / Var[R]`` over real tokens: 1 for a perfect critic, 0 for one that predicts
    the mean, negative for one worse than that.

    Undefined (nan) when Var[R] is 0 or there are fewer than 2 real tokens: a critic cannot explain
    variance that is not there, and nan is not mistaken for a score (the trackers write it as null).
    The variance convention cancels in the ratio.
    """
    real = mask.bool()
    r = returns.detach().double()[real]
    v = values.detach().double()[real]
    if r.numel() < 2:
        return math.nan
    var_r = torch.var(r)
    if var_r <= 0:
        return math.nan
    return float(1.0 - torch.var(r - v) / var_r)


# ---------------------------------------------------------------------------------------------
# KL coefficient controllers (beta of the KL penalty in the reward)
# ---------------------------------------------------------------------------------------------


class FixedKLController:
    """beta stays what it was set to; ``update`` only returns it."""

    def __init__(self, init_beta: float):
        if init_beta < 0:
            raise ValueError(f"init_beta must be >= 0, got {init_beta}")
        self.value = float(init_beta)

    def update(self, current_kl: float, n_steps: int) -> float:
        return self.value

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Proportional control of beta towards a target KL (Ziegler et al. 2019, used for PPO-RLHF):

        e     = clip(current_kl / target - 1, -0.2, 0.2)
        beta <- beta * (1 + e * n_steps / horizon)

    KL above target raises beta, below lowers it; one update moves beta by at most 20% of
    ``n_steps / horizon`` (``n_steps`` and ``horizon`` in the same unit, e.g. samples). A non-finite
    KL leaves beta unchanged. ``state_dict`` holds only beta: target and horizon come from the config.
    """

    def __init__(self, init_beta: float, target: float, horizon: float):
        if init_beta < 0 or target <= 0 or horizon <= 0:
            raise ValueError(f"need init_beta >= 0, target > 0, horizon > 0; got {init_beta}, {target}, {horizon}")
        self.value = float(init_beta)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> float:
        kl = float(current_kl)
        if math.isfinite(kl):
            error = min(max(kl / self.target - 1.0, -0.2), 0.2)
            self.value *= 1.0 + error * n_steps / self.horizon
        return self.value

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])
