"""The newer policy losses beside PPO's clipped surrogate, as pure functions registered in
:data:`rlvr.algorithms.losses.POLICY_LOSSES` (``algorithm.policy_loss``; the presets of the same names set
their clip ranges): GSPO's sequence ratio (``gspo``, ``gspo_token``), CISPO's clipped importance weight
(``cispo``), SAPO's soft gate (``sapo``), GMPO's geometric mean of clipped token ratios (``gmpo``), and
the covariance-selected gradient stop and KL penalty of Clip-Cov / KL-Cov (``clip_cov``, ``kl_cov``).

Each takes ``(logp [B, T], old_logp [B, T], advantages [B] or [B, T], *, clip_low, clip_high, dual_clip,
mask)`` and returns ``(loss_t [B, T], clipped_low, clipped_high)`` as the registry's contract says
(:data:`rlvr.algorithms.losses.PerTokenLoss`); ``rlvr.algorithms.losses.policy_loss`` reduces the loss and
counts the clipped tokens. Tested against values and gradients computed by hand (tests/test_policy_losses.py).
"""

from __future__ import annotations

import torch

from rlvr.algorithms.losses import POLICY_LOSSES, clipped_surrogate, sequence_log_ratio


@POLICY_LOSSES.register("gspo")
def gspo(
    logp: torch.Tensor,  # [B, T]
    old_logp: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B] per sequence (or [B, T])
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    dual_clip: float | None = None,
    *,
    mask: torch.Tensor | None = None,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", Qwen3): PPO's clipped surrogate
    on one importance ratio per *sequence*, the geometric mean of its token ratios,

        s_i = exp(1/|o_i| sum_t (logp_it - old_logp_it))          (over the masked tokens)
        l_i = -min(s_i * A_i, clip(s_i, 1 - clip_low, 1 + clip_high) * A_i)

    written on every token of sequence i, so that ``seq_mean_token_mean`` aggregation gives
    1/B sum_i l_i (use it: ``token_mean`` would weigh a sequence by its length). The gradient of l_i
    reaches each token of i as -A_i s_i / |o_i| * grad logp_it, or not at all when the sequence is
    clipped. Because s_i averages |o_i| log-ratios its spread is ~1/|o_i| of a token ratio's: the
    paper's clip range is 3e-4 / 4e-4, not 0.2. It is exactly :func:`clipped_surrogate` applied to
    the sequence ratio (dual clip included); the clip masks mark the whole of a clipped sequence.
    """
    seq_log_ratio = sequence_log_ratio(logp, old_logp, mask).unsqueeze(-1).expand_as(logp)
    return clipped_surrogate(seq_log_ratio, torch.zeros_like(logp), advantages, clip_low, clip_high, dual_clip)


@POLICY_LOSSES.register("gspo_token")
def gspo_token(
    logp: torch.Tensor,  # [B, T]
    old_logp: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B] or [B, T] (a per-token advantage is what this variant is for)
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    dual_clip: float | None = None,
    *,
    mask: torch.Tensor | None = None,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GSPO-token (the same paper): the token ratio ``s_it = sg[s_i] * pi_t / sg[pi_t]`` in PPO's
    clipped surrogate: its value is the sequence's s_i, its gradient is that of token t alone,

        l_it = -min(s_it * A_it, clip(s_it, 1 - clip_low, 1 + clip_high) * A_it)
        grad l_it = -A_it * s_i * grad logp_it      (0 where sequence i is clipped)

    With one advantage per sequence and ``seq_mean_token_mean`` it equals :func:`gspo` in value and
    gradient; on-policy (s_i = 1) with one advantage per sequence its gradient is ``ppo_clip``'s. It
    lets a per-token advantage (a critic's, a process reward's) use GSPO's sequence-level clipping.
    """
    seq_log_ratio = sequence_log_ratio(logp, old_logp, mask).detach().unsqueeze(-1)
    token_log_ratio = seq_log_ratio + (logp - logp.detach())  # value log s_i exactly; gradient d logp_t
    return clipped_surrogate(token_log_ratio, torch.zeros_like(logp), advantages, clip_low, clip_high, dual_clip)


@POLICY_LOSSES.register("cispo")
def cispo(
    logp: torch.Tensor,  # [B, T]
    old_logp: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B] or [B, T]
    clip_low: float = 1.0,
    clip_high: float = 0.28,
    *,
    mask: torch.Tensor | None = None,
    **_: object,  # dual_clip: the weight is bounded already
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax-M1, 2025): the importance weight is clipped and detached, the log-prob keeps its
    gradient on every token,

        w_t = sg[clip(rho_t, 1 - clip_low, 1 + clip_high)],  rho_t = exp(logp_t - old_logp_t)
        l_t = -w_t * A * logp_t,        grad l_t = -w_t * A * grad logp_t

    PPO drops a token whose ratio left the trust region (often a rare "fork" token such as "Wait");
    CISPO only caps its weight. ``clip_low`` 1 (the default) means no lower bound, as in the paper.
    On the batch's first pass (rho = 1, w = 1) the gradient is ``ppo_clip``'s. The returned masks are
    the tokens whose weight was capped below / above: diagnostics, their gradient is NOT stopped.
    The loss value itself (-w A logp) is not a surrogate of the objective; only its gradient is.
    """
    adv = advantages if advantages.dim() == logp.dim() else advantages.unsqueeze(-1)
    ratio = torch.exp(logp - old_logp)
    weight = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high).detach()
    counted_logp = logp if mask is None else torch.where(mask.bool(), logp, torch.zeros_like(logp))
    loss = -weight * adv * counted_logp
    capped_low = (ratio < 1.0 - clip_low).expand_as(loss)
    capped_high = (ratio > 1.0 + clip_high).expand_as(loss)
    return loss, capped_low, capped_high


#: SAPO's gate temperatures (Gao et al. 2025, the paper's and verl's defaults): a negative advantage's gate
#: decays faster, since a negative update spreads over the whole vocabulary.
SAPO_TAU_POS = 1.0
SAPO_TAU_NEG = 1.05


@POLICY_LOSSES.register("sapo")
def sapo(
    logp: torch.Tensor,  # [B, T]
    old_logp: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B] or [B, T]
    tau_pos: float = SAPO_TAU_POS,
    tau_neg: float = SAPO_TAU_NEG,
    **_: object,  # clip_low, clip_high, dual_clip, mask: the gate replaces the clip
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization", Qwen, arXiv 2511.20347): PPO's hard
    clip replaced by a smooth gate on the token ratio, with a temperature per advantage sign,

        tau_t = tau_pos if A > 0 else tau_neg                        (1.0 and 1.05, the paper's)
        f(rho) = 4 / tau * sigmoid(tau * (rho - 1))
        l_t = -f(rho_t) * A,     grad l_t = -A * 4 sigma (1 - sigma) rho_t * grad logp_t,  sigma = sigmoid(tau (rho_t - 1))

    The gradient weight 4 sigma (1 - sigma) rho is 1 at rho = 1 (on-policy it is the REINFORCE /
    ``ppo_clip`` gradient exactly) and decays smoothly as rho leaves 1, instead of dropping to 0 at a
    hard boundary. No token's gradient is stopped, so the clip masks are empty; ``clip_low``,
    ``clip_high`` and ``dual_clip`` are ignored (the temperatures: ``algorithm.loss_options``).
    """
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"sapo's temperatures tau_pos and tau_neg must be > 0, got {tau_pos} and {tau_neg}")
    adv = advantages if advantages.dim() == logp.dim() else advantages.unsqueeze(-1)
    ratio = torch.exp(logp - old_logp)
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    gate = 4.0 / tau * torch.sigmoid(tau * (ratio - 1.0))
    loss = -gate * adv
    never = torch.zeros_like(loss, dtype=torch.bool)
    return loss, never, never


@POLICY_LOSSES.register("gmpo")
def gmpo(
    logp: torch.Tensor,  # [B, T]
    old_logp: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B] per sequence ([B, T]: its masked mean per sequence is used)
    clip_low: float = 0.4,
    clip_high: float = 0.4,
    *,
    mask: torch.Tensor | None = None,
    **_: object,  # dual_clip
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization"): maximise the geometric mean of
    the token ratios of a sequence, each clipped *in log space*, times the sequence's advantage,

        c_it = sg(A_i) * min(sg(A_i) * (logp_it - old_logp_it), sg(A_i) * clip(logp_it - old_logp_it, -clip_low, clip_high))
        l_i  = -A_i * exp(1/|o_i| sum_t c_it)          (sg = sign; over the masked tokens)

    written on every token of sequence i (aggregate with ``seq_mean_token_mean``, one term per
    sequence). The gradient reaches token t as -A_i exp(mean c_i) / |o_i| * grad logp_it, or not at
    all where its log-ratio was clipped (in the advantage's direction, as in PPO). ``clip_low`` and
    ``clip_high`` are bounds on the log-ratio: the paper's (-0.4, 0.4), i.e. ratios in (e^-0.4, e^0.4),
    wider than PPO's because a geometric mean is less sensitive to one outlying token. The clip
    masks are the tokens whose log-ratio was clipped (their gradient is stopped).
    """
    if mask is None:
        raise ValueError("a sequence-level policy loss needs the response mask (mask=)")
    m = mask.bool()
    count = m.sum(dim=1).clamp(min=1).to(logp.dtype)
    if advantages.dim() == logp.dim():
        seq_adv = torch.where(m, advantages, torch.zeros_like(advantages)).sum(dim=1) / count
    else:
        seq_adv = advantages
    sign = torch.sign(seq_adv).unsqueeze(-1)
    log_ratio = torch.where(m, logp - old_logp, torch.zeros_like(logp)).clamp(-20.0, 20.0)
    clipped_log_ratio = torch.clamp(log_ratio, -clip_low, clip_high)
    kept = sign * torch.minimum(sign * log_ratio, sign * clipped_log_ratio)
    seq_ratio = torch.exp(kept.sum(dim=1) / count)
    loss = (-seq_adv * seq_ratio).unsqueeze(-1).expand_as(logp)
    clipped_low = m & (sign < 0) & (log_ratio < -clip_low)
    clipped_high = m & (sign > 0) & (log_ratio > clip_high)
    return loss, clipped_low, clipped_high


#: The covariance methods' settings (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for
#: Reasoning Language Models", the paper's and verl's defaults): Clip-Cov detaches a random CLIP_COV_RATIO of
#: the tokens whose covariance lies in (CLIP_COV_LOW, CLIP_COV_HIGH); KL-Cov puts a KL penalty of weight
#: KL_COV_COEF on the KL_COV_RATIO of the tokens with the largest covariance.
CLIP_COV_RATIO = 2e-4
CLIP_COV_LOW = 1.0
CLIP_COV_HIGH = 5.0
KL_COV_RATIO = 2e-3
KL_COV_COEF = 1.0


def token_covariance(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` each masked token's centred product ``(A_t - mean A) * (logp_t - mean logp)`` (means over
    the masked tokens of the batch, detached): its contribution to Cov(A, log pi), which drives the
    entropy down when positive (Cui et al. 2025). Unmasked tokens get -inf (never selected)."""
    m = mask.bool()
    adv = (advantages if advantages.dim() == logp.dim() else advantages.unsqueeze(-1).expand_as(logp)).detach()
    lp = logp.detach()
    n = m.sum().clamp(min=1)
    adv_mean = torch.where(m, adv, torch.zeros_like(adv)).sum() / n
    logp_mean = torch.where(m, lp, torch.zeros_like(lp)).sum() / n
    cov = (adv - adv_mean) * (lp - logp_mean)
    return torch.where(m, cov, torch.full_like(cov, float("-inf")))


@POLICY_LOSSES.register("clip_cov")
def clip_cov(
    logp: torch.Tensor,  # [B, T]
    old_logp: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B] or [B, T]
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    *,
    mask: torch.Tensor | None = None,
    ratio: float = CLIP_COV_RATIO,
    cov_low: float = CLIP_COV_LOW,
    cov_high: float = CLIP_COV_HIGH,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clip-Cov (Cui et al. 2025): ``ppo_clip``, and the gradient of a few high-covariance tokens stopped,

        cov_t = (A_t - mean A) (logp_t - mean logp)            (:func:`token_covariance`)
        candidates = tokens with cov_low < cov_t < cov_high that ppo_clip did not clip already
        pick max(1, int(ratio * masked tokens)) of them at random (torch's RNG); l_t = 0 there

    Those tokens (a confident token with a positive advantage, or an unlikely one with a negative one)
    are what collapses the policy's entropy. Paper's settings: ratio 2e-4, bounds (1, 5). The counts
    and means are over this micro-batch. The clip masks include the picked tokens (by advantage sign).
    """
    if mask is None:
        raise ValueError("clip_cov needs the response mask (mask=)")
    if not (0 < ratio <= 1 and cov_low < cov_high):
        raise ValueError(f"clip_cov needs 0 < ratio <= 1 and cov_low < cov_high, got ratio {ratio}, bounds "
                         f"({cov_low}, {cov_high})")
    loss, low, high = clipped_surrogate(logp, old_logp, advantages, clip_low, clip_high, dual_clip)
    m = mask.bool()
    cov = token_covariance(logp, advantages, mask)
    candidates = m & ~low & ~high & (cov > cov_low) & (cov < cov_high)
    picked = torch.zeros_like(m)
    index = candidates.flatten().nonzero().squeeze(-1)
    if index.numel():
        count = max(int(ratio * float(m.sum())), 1)
        chosen = index[torch.randperm(index.numel(), device=index.device)[:count]]
        picked.view(-1)[chosen] = True
    loss = torch.where(picked, torch.zeros_like(loss), loss)
    adv = advantages if advantages.dim() == logp.dim() else advantages.unsqueeze(-1)
    return loss, low | (picked & (adv < 0)), high | (picked & (adv > 0))


@POLICY_LOSSES.register("kl_cov")
def kl_cov(
    logp: torch.Tensor,  # [B, T]
    old_logp: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B] or [B, T]
    *,
    mask: torch.Tensor | None = None,
    ratio: float = KL_COV_RATIO,
    coef: float = KL_COV_COEF,
    **_: object,  # clip_low, clip_high, dual_clip: KL-Cov does not clip
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KL-Cov (Cui et al. 2025): the unclipped importance-weighted policy gradient, plus a KL penalty on
    the tokens of largest covariance,

        l_t = -rho_t A_t + coef * |logp_t - old_logp_t|    on the top max(1, int(ratio * masked tokens))
        l_t = -rho_t A_t                                     elsewhere

    (cov as in :func:`clip_cov`; the paper's ratio 2e-3, coef 1). On a batch's first pass the penalty's
    value is 0 and its (sub)gradient is taken as 0, so the gradient is REINFORCE's; it pulls the
    selected tokens back to pi_old from the second pass on. The ``clipped_high`` mask marks the
    penalised tokens (nothing is clipped; ``clipped_low`` is empty).
    """
    if mask is None:
        raise ValueError("kl_cov needs the response mask (mask=)")
    if not (0 < ratio <= 1 and coef >= 0):
        raise ValueError(f"kl_cov needs 0 < ratio <= 1 and coef >= 0, got ratio {ratio}, coef {coef}")
    adv = advantages if advantages.dim() == logp.dim() else advantages.unsqueeze(-1)
    log_ratio = logp - old_logp
    loss = -adv * torch.exp(log_ratio)
    m = mask.bool()
    cov = token_covariance(logp, advantages, mask).flatten()
    penalised = torch.zeros_like(m)
    if m.any():
        count = max(int(ratio * float(m.sum())), 1)
        penalised.view(-1)[torch.topk(cov, min(count, int(m.sum()))).indices] = True
    loss = torch.where(penalised, loss + coef * log_ratio.abs(), loss)
    return loss, torch.zeros_like(penalised), penalised
