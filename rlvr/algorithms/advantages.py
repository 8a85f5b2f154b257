"""Advantage estimators: how much better each sample did than a baseline.

Critic-free estimators take scalar rewards laid out by group, ``rewards [P, G]`` (P prompts, G
samples each), plus ``valid [P, G]``: samples whose verification failed are excluded from every
statistic and get advantage 0. Each returns ``advantages [P, G]``, one value per sequence that the
loss broadcasts over its tokens.

The critic-free estimators are registered in ``ADVANTAGE_ESTIMATORS`` (config field
``algorithm.advantage``); a plugin adds one with ``@ADVANTAGE_ESTIMATORS.register("name")`` or an
``rlvr.advantage_estimators`` entry point, as a function ``(rewards [P, G], valid [P, G]) -> [P, G]``.

``gae``, the actor-critic estimator over per-token rewards and values ``[B, T]``, lives with the
rest of the critic's arithmetic in :mod:`rlvr.algorithms.critic` and is re-exported here.
"""

from __future__ import annotations

from typing import Callable

import torch

from rlvr.algorithms.critic import gae  # noqa: F401  (re-exported: an advantage estimator)
from rlvr.verifiers.plugins import Registry

GroupEstimator = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]
ADVANTAGE_ESTIMATORS: Registry[GroupEstimator] = Registry(
    "advantage estimator", entry_point_group="rlvr.advantage_estimators")

EPS = 1e-6

#: Adds a tensor of statistics over the ranks of a data-parallel step (``Distributed.sum_tensor``); an
#: estimator that normalises over the whole batch takes it as ``all_sum`` (see :func:`over_the_batch`).
AllSum = Callable[[torch.Tensor], torch.Tensor]


def _local(stats: torch.Tensor) -> torch.Tensor:
    return stats  # one process holds the whole batch


def over_the_batch(estimator):
    """Mark an estimator whose statistics span the whole batch, not one group: it takes ``all_sum``, and a
    data-parallel step passes the ranks' sum, so every rank normalises by the whole batch's statistics
    and two ranks give each sample the advantage one process gives it. (Group estimators need nothing:
    whole groups stay on one rank.)"""
    estimator.over_the_batch = True
    return estimator


def batch_z_score(values: torch.Tensor, real: torch.Tensor, all_sum: AllSum = _local) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` over the ``real`` entries of the whole batch (unbiased std), 0 elsewhere.
    The sums are float64 and added over ranks by ``all_sum``: the count and total first, then the squared
    deviations from the global mean (two passes, as one process computes them)."""
    x = values.double()
    n, total = all_sum(torch.stack([real.sum().double(), (x * real).sum()]))
    mean = total / n.clamp(min=1)
    square = all_sum((((x - mean) ** 2) * real).sum().reshape(1))[0]
    std = (square / (n - 1).clamp(min=1)).sqrt()
    adv = ((x - mean) / (std + EPS)).to(values.dtype)
    return torch.where(real, adv, torch.zeros_like(adv))


def _masked_group_mean(rewards: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group mean over valid samples and the number of valid samples, both ``[P, 1]``."""
    count = valid.sum(dim=1, keepdim=True)
    mean = (rewards * valid).sum(dim=1, keepdim=True) / count.clamp(min=1)
    return mean, count


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantages(rewards: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """GRPO group z-score:  A_i = (r_i - mean_g(r)) / (std_g(r) + eps).

    std is the unbiased (n-1) sample standard deviation, as in the GRPO paper's reference code. A
    group whose rewards are all equal has A = 0 for every sample (no signal, no update).
    """
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    r = rewards.float()
    mean, count = _masked_group_mean(r, valid)
    var = (((r - mean) ** 2) * valid).sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)
    adv = (r - mean) / (var.sqrt() + EPS)
    return torch.where(valid, adv, torch.zeros_like(adv))


@ADVANTAGE_ESTIMATORS.register("dr_grpo")
def dr_grpo_advantages(rewards: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Dr. GRPO: A_i = r_i - mean_g(r). No division by the group std, which would up-weight
    groups that are nearly all right or all wrong (the "question difficulty" bias)."""
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    r = rewards.float()
    mean, _ = _masked_group_mean(r, valid)
    return torch.where(valid, r - mean, torch.zeros_like(r))


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo_advantages(rewards: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """RLOO leave-one-out baseline: A_i = r_i - mean_{j != i} r_j = n/(n-1) * (r_i - mean_g(r)).

    The baseline excludes the sample itself, so the estimate stays unbiased. A group with a single
    valid sample has no baseline and gets A = 0.
    """
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    r = rewards.float()
    total = (r * valid).sum(dim=1, keepdim=True)
    count = valid.sum(dim=1, keepdim=True)
    baseline = (total - r) / (count - 1).clamp(min=1)
    adv = torch.where(count > 1, r - baseline, torch.zeros_like(r))
    return torch.where(valid, adv, torch.zeros_like(adv))


@ADVANTAGE_ESTIMATORS.register("reinforce_pp")
@over_the_batch
def reinforce_pp_advantages(rewards: torch.Tensor, valid: torch.Tensor | None = None, *,
                            all_sum: AllSum = _local) -> torch.Tensor:
    """REINFORCE++: rewards z-scored over the whole batch, A_i = (r_i - mean_B(r)) / (std_B(r) + eps).

    The global baseline and scale are steadier than per-group statistics when groups are small.
    ``all_sum`` adds the batch statistics over the ranks that each hold a part of the batch.
    """
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    return batch_z_score(rewards.float(), valid, all_sum)


def token_return_advantages(scores: torch.Tensor, dense: torch.Tensor, mask: torch.Tensor,
                            valid: torch.Tensor | None = None, *, all_sum: AllSum = _local) -> torch.Tensor:
    """REINFORCE++ with rewards on the way (a PRM's step rewards): each token's return-to-go, z-scored
    over the batch's real tokens, ``[N, T]``:

        G_t = score + sum_{s >= t} dense_s          (gamma = 1; dense summed over real tokens only)
        A_t = (G_t - mean_B(G)) / (std_B(G) + eps)  mean and std over the real tokens of valid samples

    A token is credited with the step rewards still ahead of it, so the tokens of a step judged wrong
    (and the steps before it) carry its penalty and the steps after it do not. With ``dense = 0`` every
    token of a sample has the same return, the sequence-level estimator weighted by length.
    ``scores [N]``, ``dense [N, T]``, ``mask [N, T]`` (1 on real response tokens), ``valid [N]``;
    ``all_sum`` as in :func:`reinforce_pp_advantages`.
    """
    real = mask.bool()
    if valid is not None:
        real = real & valid.bool().reshape(-1, 1)
    d = torch.where(mask.bool(), dense.float(), 0.0)
    to_go = d.flip(1).cumsum(dim=1).flip(1)  # [N, T] sum_{s >= t} dense_s
    g = scores.float().reshape(-1, 1) + to_go
    return batch_z_score(g, real, all_sum)
