"""Preference losses as pure functions: the Bradley-Terry reward-model loss, DPO and its variants,
and combiners for an ensemble of reward models.

Shapes: ``N`` preference pairs ``(prompt, chosen y_w, rejected y_l)``; ``M`` reward models.

Bradley-Terry (the reward model, InstructGPT):

    P(y_w > y_l | x) = sigmoid(r(x, y_w) - r(x, y_l))
    L_BT = -mean log sigmoid(r_w - r_l - m)          m: an optional per-pair margin (Llama 2)
           + c * mean((r_w + r_l)^2)                 optional reward centering: keeps scores near 0

DPO (Rafailov et al. 2023): the policy is its own reward model, r(x, y) = beta * log pi(y|x) / pi_ref(y|x):

    h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))      the log-ratio difference
    sigmoid (DPO):   L = -log sigmoid(beta * h)
    cDPO:            L = -(1 - eps) log sigmoid(beta * h) - eps log sigmoid(-beta * h)   (labels flipped w.p. eps)
    ipo (IPO):       L = (h - 1 / (2 * beta))^2

The variants are functions in the ``DPO_LOSSES`` registry (config field ``dpo.loss`` of
``rlvr dpo``); reward ensembles are in ``REWARD_ENSEMBLES``.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from rlvr.verifiers.plugins import Registry

# ---------------------------------------------------------------------------------------------
# Bradley-Terry reward-model loss
# ---------------------------------------------------------------------------------------------


def bradley_terry_loss(
    r_chosen: torch.Tensor,  # [N] scalar rewards of the preferred completions
    r_rejected: torch.Tensor,  # [N] of the dispreferred ones
    margin: torch.Tensor | float | None = None,  # [N] or scalar: how much better the chosen must score
    center_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``(loss, stats)``: the Bradley-Terry negative log-likelihood of the preferences, mean over pairs,
    plus ``center_coef * mean((r_w + r_l)^2)`` (reward centering; 0 = off).

    stats: ``pairwise_accuracy`` (fraction with r_w > r_l; ties count half), ``margin`` (mean r_w - r_l),
    ``reward_chosen``, ``reward_rejected`` (means).
    """
    diff = r_chosen - r_rejected  # [N]
    shifted = diff - margin if margin is not None else diff
    loss = -F.logsigmoid(shifted).mean()
    if center_coef:
        loss = loss + center_coef * ((r_chosen + r_rejected) ** 2).mean()
    with torch.no_grad():
        d = diff.detach().float()
        stats = {
            "pairwise_accuracy": ((d > 0).float() + 0.5 * (d == 0).float()).mean().item(),
            "margin": d.mean().item(),
            "reward_chosen": r_chosen.detach().float().mean().item(),
            "reward_rejected": r_rejected.detach().float().mean().item(),
        }
    return loss, stats


# ---------------------------------------------------------------------------------------------
# DPO and variants: per-pair loss of the log-ratio difference h [N]
# ---------------------------------------------------------------------------------------------

DPOLoss = Callable[..., torch.Tensor]
DPO_LOSSES: Registry[DPOLoss] = Registry("DPO loss", entry_point_group="rlvr.dpo_losses")


@DPO_LOSSES.register("sigmoid")
def sigmoid_dpo(h: torch.Tensor, *, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """DPO, -log sigmoid(beta h); with ``label_smoothing`` eps > 0 it is cDPO: each label is taken as
    wrong with probability eps, -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h).  [N] -> [N]"""
    loss = -F.logsigmoid(beta * h)
    if label_smoothing:
        loss = (1 - label_smoothing) * loss - label_smoothing * F.logsigmoid(-beta * h)
    return loss


@DPO_LOSSES.register("ipo")
def ipo(h: torch.Tensor, *, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """IPO (Azar et al. 2023): (h - 1/(2 beta))^2, a squared loss that pulls the log-ratio difference
    to a finite target instead of pushing it to infinity (DPO's overfitting on deterministic
    preferences). ``label_smoothing`` does not apply.  [N] -> [N]"""
    return (h - 1.0 / (2.0 * beta)) ** 2


def dpo_loss(
    policy_chosen_logp: torch.Tensor,  # [N] sum over completion tokens of log pi(y_w | x)
    policy_rejected_logp: torch.Tensor,  # [N] log pi(y_l | x)
    ref_chosen_logp: torch.Tensor,  # [N] log pi_ref(y_w | x), no gradient
    ref_rejected_logp: torch.Tensor,  # [N] log pi_ref(y_l | x)
    beta: float,
    loss: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``(mean loss, stats)`` of the DPO variant ``loss`` (a name in ``DPO_LOSSES``).

    stats: the implicit rewards ``reward_chosen`` = mean beta (log pi(y_w) - log pi_ref(y_w)) and
    ``reward_rejected``, ``margin`` (their mean difference), ``accuracy`` (fraction of pairs whose
    implicit reward ranks the chosen first; ties count half), ``logp_chosen``, ``logp_rejected``.
    """
    chosen_ratio = policy_chosen_logp - ref_chosen_logp  # [N] log pi/pi_ref of y_w
    rejected_ratio = policy_rejected_logp - ref_rejected_logp  # [N] of y_l
    h = chosen_ratio - rejected_ratio  # [N]
    losses = DPO_LOSSES.get(loss)(h, beta=beta, label_smoothing=label_smoothing)  # [N]
    with torch.no_grad():
        r_w, r_l = beta * chosen_ratio.detach().float(), beta * rejected_ratio.detach().float()
        d = r_w - r_l
        stats = {
            "reward_chosen": r_w.mean().item(),
            "reward_rejected": r_l.mean().item(),
            "margin": d.mean().item(),
            "accuracy": ((d > 0).float() + 0.5 * (d == 0).float()).mean().item(),
            "logp_chosen": policy_chosen_logp.detach().float().mean().item(),
            "logp_rejected": policy_rejected_logp.detach().float().mean().item(),
        }
    return losses.mean(), stats


# ---------------------------------------------------------------------------------------------
# Ensembles of reward models: scores [M, N] -> one reward per sample [N]
# ---------------------------------------------------------------------------------------------

Ensemble = Callable[..., torch.Tensor]
REWARD_ENSEMBLES: Registry[Ensemble] = Registry("reward ensemble", entry_point_group="rlvr.reward_ensembles")


@REWARD_ENSEMBLES.register("mean")
def ensemble_mean(scores: torch.Tensor, **_: float) -> torch.Tensor:
    """The average of the M models' scores.  [M, N] -> [N]"""
    return scores.mean(dim=0)


@REWARD_ENSEMBLES.register("min")
def ensemble_min(scores: torch.Tensor, **_: float) -> torch.Tensor:
    """Worst-case optimisation (Coste et al. 2023): the lowest score, so the policy gains only where
    every model agrees; resists over-optimising one model's errors.  [M, N] -> [N]"""
    return scores.min(dim=0).values


@REWARD_ENSEMBLES.register("mean_minus_std")
def ensemble_mean_minus_std(scores: torch.Tensor, *, k: float = 1.0, **_: float) -> torch.Tensor:
    """Uncertainty-weighted: mean - k * std over models (population std, 0 for one model); samples the
    models disagree on are rewarded less.  [M, N] -> [N]"""
    return scores.mean(dim=0) - k * scores.std(dim=0, unbiased=False)


def combine_rewards(scores: torch.Tensor, how: str = "mean", **options: float) -> torch.Tensor:
    """Scores of M reward models ``[M, N]`` -> ``[N]`` with the combiner ``how`` from ``REWARD_ENSEMBLES``."""
    if scores.dim() != 2:
        raise ValueError(f"ensemble scores must be [M models, N samples], got shape {tuple(scores.shape)}")
    return REWARD_ENSEMBLES.get(how)(scores, **options)
