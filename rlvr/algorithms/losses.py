"""Policy-gradient losses, KL estimators, entropy and the clipped value loss, as pure functions.

Shapes: ``B`` sequences, ``T`` response tokens. ``mask [B, T]`` is 1 on tokens that count.
Per-token terms are reduced to a scalar by one of the aggregation modes in ``LOSS_AGGREGATIONS``;
the denominators can be given explicitly so that a loss summed over micro-batches equals the loss
of the whole minibatch (gradient accumulation stays exact).

Three registries make the pieces pluggable (config field in brackets; a plugin registers with the
decorator or an entry point in the group named):

    POLICY_LOSSES      [algorithm.policy_loss]   rlvr.policy_losses      ppo_clip, vanilla; gspo, gspo_token, cispo,
                                                                         sapo, gmpo, clip_cov, kl_cov (the
                                                                         last seven: policy_loss_variants.py)
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


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``log s_i [B]``: the mean of ``logp - old_logp`` over each sequence's masked tokens, i.e. the log
    of the geometric mean of its token ratios (a sequence with no token gets 0, s_i = 1)."""
    if mask is None:
        raise ValueError("a sequence-level policy loss needs the response mask (mask=)")
    m = mask.bool()
    log_ratio = torch.where(m, logp - old_logp, torch.zeros_like(logp))  # padding may hold anything
    return log_ratio.sum(dim=1) / m.sum(dim=1).clamp(min=1).to(logp.dtype)


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
        return sequence_log_ratio(logp, old_logp, mask).exp().unsqueeze(-1).expand_as(logp)
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


# The newer policy losses (gspo, gspo_token, cispo, sapo, gmpo, clip_cov, kl_cov) register in POLICY_LOSSES
# on import; they live in their own module, which imports this one.
from rlvr.algorithms import policy_loss_variants  # noqa: E402,F401
