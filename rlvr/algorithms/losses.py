"""Policy-gradient losses, KL estimators, entropy and the clipped value loss, as pure functions.

Shapes: ``B`` sequences, ``T`` response tokens. ``mask [B, T]`` is 1 on tokens that count.
Per-token terms are reduced to a scalar by one of the aggregation modes in ``LOSS_AGGREGATIONS``;
the denominators can be given explicitly so that a loss summed over micro-batches equals the loss
of the whole minibatch (gradient accumulation stays exact).

Three registries make the pieces pluggable (config field in brackets; a plugin registers with the
decorator or an entry point in the group named):

    POLICY_LOSSES      [algorithm.policy_loss]   rlvr.policy_losses      ppo_clip, vanilla, gspo, gspo_token, cispo,
                                                                         sapo, gmpo, clip_cov, kl_cov
    LOSS_AGGREGATIONS  [algorithm.loss_agg]      rlvr.loss_aggregations  token_mean, seq_mean_token_mean, seq_mean_token_sum_norm
    KL_ESTIMATORS      [algorithm.kl_estimator]  rlvr.kl_estimators      k1, k2, k3
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import torch

from rlvr.algorithms.critic import clipped_value_loss_per_token
from rlvr.verifiers.plugins import Registry

Aggregation = Callable[..., torch.Tensor]
LOSS_AGGREGATIONS: Registry[Aggregation] = Registry("loss aggregation", entry_point_group="rlvr.loss_aggregations")

# ---------------------------------------------------------------------------------------------
# Aggregation: per-token values [B, T] -> scalar
# ---------------------------------------------------------------------------------------------


@LOSS_AGGREGATIONS.register("token_mean")
def token_mean(values: torch.Tensor, mask: torch.Tensor, *, num_seqs: float, num_tokens: float, max_len: int) -> torch.Tensor:
    """DAPO: every token of the batch weighs the same, sum_{i,t} x_it / sum_i |o_i|."""
    return (values * mask).sum() / max(num_tokens, 1.0)


@LOSS_AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(values: torch.Tensor, mask: torch.Tensor, *, num_seqs: float, num_tokens: float, max_len: int) -> torch.Tensor:
    """GRPO: mean over sequences of each sequence's token mean, 1/G sum_i 1/|o_i| sum_t x_it.

    Tokens of short answers weigh more than tokens of long ones (the length bias Dr. GRPO removes).
    """
    per_seq = (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    return per_seq.sum() / max(num_seqs, 1.0)


@LOSS_AGGREGATIONS.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(values: torch.Tensor, mask: torch.Tensor, *, num_seqs: float, num_tokens: float, max_len: int) -> torch.Tensor:
    """Dr. GRPO: token sums divided by a constant (the max response length), averaged over sequences,
    1/G sum_i 1/L_max sum_t x_it. Unbiased in length."""
    per_seq = (values * mask).sum(dim=1) / float(max_len)
    return per_seq.sum() / max(num_seqs, 1.0)



def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_seqs: float | None = None,
    num_tokens: float | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Reduce per-token ``values [B, T]`` with aggregation ``mode``.

    ``num_seqs``/``num_tokens`` default to this batch's own counts; pass the counts of the whole
    minibatch when ``values`` is one micro-batch of it. ``max_len`` defaults to ``T``.
    """
    fn = LOSS_AGGREGATIONS.get(mode)
    mask = mask.to(values.dtype)
    return fn(
        values,
        mask,
        num_seqs=float(values.shape[0]) if num_seqs is None else float(num_seqs),
        num_tokens=float(mask.sum().item()) if num_tokens is None else float(num_tokens),
        max_len=values.shape[1] if max_len is None else int(max_len),
    )


# ---------------------------------------------------------------------------------------------
# Clipped surrogate
# ---------------------------------------------------------------------------------------------


@dataclass
class PolicyLossStats:
    """Diagnostics of one policy-loss evaluation (means over masked tokens, detached)."""

    clip_frac_low: float  # share of tokens the loss clipped below (ppo_clip: A < 0 and ratio < 1 - clip_low)
    clip_frac_high: float  # share of tokens the loss clipped above (ppo_clip: A > 0 and ratio > 1 + clip_high)
    dual_clip_frac: float  # share of tokens where the dual clip bound was active
    ratio_mean: float
    approx_kl: float  # mean of k3(old || new): how far this pass has moved from the rollout policy
    ratio_max: float = 1.0  # the largest token ratio pi / pi_old (the tail the clip or cap has to hold)
    capped_frac: float = 0.0  # share of tokens the loss clipped or capped, either side (clip_frac_low + _high)
    seq_clip_frac: float = 0.0  # share of sequences every token of which was clipped (gspo: the clipped sequences)


PerTokenLoss = Callable[..., "tuple[torch.Tensor, torch.Tensor, torch.Tensor]"]
#: A policy loss maps ``(logp [B, T], old_logp [B, T], advantages [B] or [B, T], *, clip_low,
#: clip_high, dual_clip, mask)`` to ``(loss_t [B, T], clipped_low [B, T], clipped_high [B, T])``: the
#: per-token loss to minimise and boolean masks of the tokens it clipped (for ppo_clip and gspo the
#: tokens whose gradient it stopped; for cispo the tokens whose importance weight it capped). ``mask``
#: ``[B, T]`` marks the response tokens that count (a sequence-level loss averages over them). A loss
#: that ignores a hyperparameter takes ``**_`` for it; one without ``mask`` or ``**_`` in its signature
#: (a plugin written before ``mask`` was passed) is called without it.
POLICY_LOSSES: Registry[PerTokenLoss] = Registry("policy loss", entry_point_group="rlvr.policy_losses",
                                                 plural="policy losses")


@POLICY_LOSSES.register("ppo_clip")
def clipped_surrogate(
    logp: torch.Tensor,  # [B, T] log pi_theta(o_t | ...)
    old_logp: torch.Tensor,  # [B, T] log pi_old, the policy that sampled the batch
    advantages: torch.Tensor,  # [B] per sequence, or [B, T] per token
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    **_: object,  # mask: every token's loss is its own
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO loss (to minimise) with asymmetric clipping and an optional dual clip.

        rho_t = exp(logp_t - old_logp_t)
        l_t   = -min(rho_t * A, clip(rho_t, 1 - clip_low, 1 + clip_high) * A)
        dual clip (A < 0 only):  l_t = min(l_t, -dual_clip * A)       (dual_clip > 1, e.g. 3)

    The gradient is exactly zero where (A > 0 and rho > 1 + clip_high) or (A < 0 and rho < 1 - clip_low),
    and, with dual clip, where A < 0 and rho > dual_clip. Returns ``(loss_t, clipped_low, clipped_high)``
    where the last two are boolean masks ``[B, T]`` of the gradient-stopped tokens.
    """
    adv = advantages if advantages.dim() == logp.dim() else advantages.unsqueeze(-1)
    ratio = torch.exp(logp - old_logp)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        bound = -adv * dual_clip
        loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
    clipped_low = (adv < 0) & (ratio < 1.0 - clip_low)
    clipped_high = (adv > 0) & (ratio > 1.0 + clip_high)
    return loss, clipped_low, clipped_high


@POLICY_LOSSES.register("vanilla")
def vanilla_policy_gradient(
    logp: torch.Tensor,  # [B, T]
    old_logp: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B] or [B, T]
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """REINFORCE with a baseline (the advantage), importance-weighted, never clipped:

        l_t = -rho_t * A,   rho_t = exp(logp_t - old_logp_t)

    On the batch's first pass rho = 1 and the gradient is -A * grad log pi, the classic policy
    gradient. With several passes nothing keeps rho near 1: use ``ppo_clip`` for that.
    """
    adv = advantages if advantages.dim() == logp.dim() else advantages.unsqueeze(-1)
    loss = -adv * torch.exp(logp - old_logp)
    never = torch.zeros_like(loss, dtype=torch.bool)
    return loss, never, never


def _sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``log s_i [B]``: the mean of ``logp - old_logp`` over each sequence's masked tokens, i.e. the log
    of the geometric mean of its token ratios (a sequence with no token gets 0, s_i = 1)."""
    if mask is None:
        raise ValueError("a sequence-level policy loss needs the response mask (mask=)")
    m = mask.bool()
    log_ratio = torch.where(m, logp - old_logp, torch.zeros_like(logp))  # padding may hold anything
    return log_ratio.sum(dim=1) / m.sum(dim=1).clamp(min=1).to(logp.dtype)


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
    seq_log_ratio = _sequence_log_ratio(logp, old_logp, mask).unsqueeze(-1).expand_as(logp)
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
    seq_log_ratio = _sequence_log_ratio(logp, old_logp, mask).detach().unsqueeze(-1)
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


#: The arguments every policy loss is called with; anything else a loss names is one of its options.
_LOSS_ARGUMENTS = ("logp", "old_logp", "advantages", "clip_low", "clip_high", "dual_clip", "mask")


def check_loss_options(name: str, options: dict) -> None:
    """ValueError unless every key of ``options`` is a parameter that policy loss ``name`` names (beyond
    :data:`_LOSS_ARGUMENTS`; a ``**kwargs`` catch-all does not count, so a misspelt option is caught)
    and the loss accepts their values: it is run once on a one-token batch with them."""
    fn = POLICY_LOSSES.get(name)
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check against
        return
    valid = [p.name for p in params if p.name not in _LOSS_ARGUMENTS and p.kind in
             (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"policy loss {name!r} has no option(s) {', '.join(unknown)}; its options: "
                         f"{', '.join(valid) or '(none)'}")
    one = torch.zeros(1, 1)
    extra = {"mask": torch.ones(1, 1)} if _takes_mask(fn) else {}
    try:
        fn(one, one, torch.ones(1), **extra, **options)
    except TypeError as exc:  # e.g. a string where a number goes
        raise ValueError(f"policy loss {name!r}: bad option value ({exc})") from None


#: The built-in losses whose dual clip bounds the sequence ratio (the rest that apply it: the token ratio).
_SEQUENCE_RATIO_LOSSES = ("gspo", "gspo_token")
#: The built-in losses that ignore ``dual_clip`` (their weight is bounded otherwise, or nothing is clipped).
_NO_DUAL_CLIP_LOSSES = ("vanilla", "cispo", "sapo", "gmpo", "kl_cov")


def _dual_clipped_ratio(loss: str, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
                        token_ratio: torch.Tensor) -> torch.Tensor | None:
    """The ratio ``[B, T]`` that loss ``loss``'s dual clip compares with ``dual_clip`` (for
    ``train/dual_clip_frac``): GSPO's sequence ratio on each of its tokens, the token ratio for
    ``ppo_clip`` / ``clip_cov`` and plugins, None for a loss that ignores the dual clip."""
    if loss in _NO_DUAL_CLIP_LOSSES:
        return None
    if loss in _SEQUENCE_RATIO_LOSSES:
        return _sequence_log_ratio(logp, old_logp, mask).exp().unsqueeze(-1).expand_as(logp)
    return token_ratio


def _takes_mask(fn: Callable) -> bool:
    """Whether policy loss ``fn`` accepts ``mask=`` (a parameter of that name, or ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: assume the documented contract
        return True
    return any(p.name == "mask" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _whole_sequence_share(flagged: torch.Tensor, mask: torch.Tensor) -> float:
    """The share of the sequences with at least one masked token whose masked tokens are all ``flagged``."""
    present = mask.any(dim=1)
    whole = present & (flagged.sum(dim=1) == mask.sum(dim=1))
    return float(whole.sum() / present.sum().clamp(min=1))


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "seq_mean_token_mean",
    loss: str = "ppo_clip",
    num_seqs: float | None = None,
    num_tokens: float | None = None,
    max_len: int | None = None,
    token_weights: torch.Tensor | None = None,
    options: dict | None = None,
) -> tuple[torch.Tensor, PolicyLossStats]:
    """The per-token policy loss ``loss`` (default: the clipped surrogate, :func:`clipped_surrogate`)
    reduced with aggregation ``agg``, and its diagnostics. ``token_weights`` (no gradient, e.g.
    :mod:`rlvr.algorithms.off_policy`) scale each token's loss before the reduction; ``options`` are
    the loss's own keyword options (``algorithm.loss_options``, e.g. SAPO's temperatures)."""
    per_token = POLICY_LOSSES.get(loss)
    extra = {"mask": mask} if _takes_mask(per_token) else {}
    loss_t, low, high = per_token(logp, old_logp, advantages, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip,
                                  **extra, **(options or {}))
    if token_weights is not None:
        loss_t = loss_t * token_weights.detach()
    total = aggregate(loss_t, mask, agg, num_seqs=num_seqs, num_tokens=num_tokens, max_len=max_len)
    with torch.no_grad():
        m = mask.bool()
        n = m.sum().clamp(min=1)
        adv = advantages if advantages.dim() == logp.dim() else advantages.unsqueeze(-1).expand_as(logp)
        ratio = torch.exp(logp - old_logp)
        clipped_ratio = _dual_clipped_ratio(loss, logp, old_logp, mask, ratio) if dual_clip is not None else None
        dual = (adv < 0) & (clipped_ratio > dual_clip) if clipped_ratio is not None else torch.zeros_like(m)
        stats = PolicyLossStats(
            clip_frac_low=float((low & m).sum() / n),
            clip_frac_high=float((high & m).sum() / n),
            dual_clip_frac=float((dual & m).sum() / n),
            ratio_mean=float((ratio * m).sum() / n),
            approx_kl=float((kl_k3(old_logp, logp) * m).sum() / n),
            ratio_max=float(ratio[m].max()) if m.any() else 1.0,
            capped_frac=float(((low | high) & m).sum() / n),
            seq_clip_frac=_whole_sequence_share((low | high) & m, m),
        )
    return total, stats


# ---------------------------------------------------------------------------------------------
# KL to the reference, entropy, value loss
# ---------------------------------------------------------------------------------------------


#: A KL estimator maps ``(logp [B, T], ref_logp [B, T])`` to a per-token estimate of KL(pi || pi_ref).
KL_ESTIMATORS: Registry[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = Registry(
    "KL estimator", entry_point_group="rlvr.kl_estimators")


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log(pi/pi_ref): unbiased for KL(pi || pi_ref) under samples of pi, but can be negative."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = (log(pi/pi_ref))^2 / 2: non-negative, low variance, biased (its gradient is that of KL)."""
    return 0.5 * (logp - ref_logp) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = pi_ref/pi - log(pi_ref/pi) - 1: unbiased and always >= 0 (GRPO's estimator).

    The log-ratio is clamped to [-20, 20] so a token the reference finds impossible cannot overflow.
    """
    log_ratio = torch.clamp(ref_logp - logp, -20.0, 20.0)
    return torch.exp(log_ratio) - log_ratio - 1.0


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position, H = -sum_v p_v log p_v.  [..., V] -> [...]"""
    return entropy_from_log_probs(torch.log_softmax(logits.float(), dim=-1))


def entropy_from_log_probs(log_probs: torch.Tensor) -> torch.Tensor:
    """The same entropy from already normalised log-probabilities (saves a second softmax)."""
    return -(log_probs.exp() * log_probs).sum(dim=-1)


def clipped_value_loss(
    values: torch.Tensor,  # [B, T] current critic predictions
    old_values: torch.Tensor,  # [B, T] predictions at rollout time
    returns: torch.Tensor,  # [B, T] regression targets (GAE returns)
    mask: torch.Tensor,
    clip: float = 0.2,
    agg: str = "token_mean",
) -> torch.Tensor:
    """PPO value loss:  1/2 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2), aggregated.

    Clipping keeps the critic from jumping further than ``clip`` from its rollout-time prediction.
    The per-token form (and which tokens took the clipped branch) is
    :func:`rlvr.algorithms.critic.clipped_value_loss_per_token`.
    """
    per_token, _ = clipped_value_loss_per_token(values, old_values, returns, mask, clip=clip)
    return aggregate(per_token, mask, agg)
