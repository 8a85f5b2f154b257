"""Off-policy corrections against hand-computed weights, losses and gradients; each is the plain loss
when the behaviour policy is the proximal one."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.algorithms.losses import policy_loss
from rlvr.algorithms.off_policy import OFF_POLICY_CORRECTIONS, decoupled, sequence_mask, token_tis

log = math.log


def _t(*rows):
    return torch.tensor([[log(p) for p in row] for row in rows], dtype=torch.float64)


def test_token_tis_truncates_each_ratio_at_the_cap():
    # rho = pi_prox / pi_behav = [0.5/0.25, 0.2/0.4, 0.9/0.3] = [2, 0.5, 3]
    weights, keep = token_tis(_t([0.5, 0.2, 0.9]), _t([0.25, 0.4, 0.3]), torch.ones(1, 3), cap=2.5)
    assert weights[0].tolist() == pytest.approx([2.0, 0.5, 2.5])
    assert keep.tolist() == [[1.0, 1.0, 1.0]]


def test_sequence_mask_drops_whole_sequences_by_their_geometric_mean_ratio():
    prox = _t([0.5, 0.2], [0.8, 0.8], [0.5, 0.5])
    behav = _t([0.25, 0.4], [0.2, 0.2], [0.25, 0.25])
    # geometric means: sqrt(2 * 0.5) = 1 (kept), 4 (> cap 2: dropped), 2 (= cap: kept)
    weights, keep = sequence_mask(prox, behav, torch.ones(3, 2), cap=2.0)
    assert weights.tolist() == [[1.0, 1.0]] * 3
    assert keep.tolist() == [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]
    # padding does not count: the second row's mean is over its one real token, rho = 1
    _, keep = sequence_mask(_t([0.5, 0.9]), _t([0.5, 0.1]), torch.tensor([[1.0, 0.0]]), cap=2.0)
    assert keep.tolist() == [[1.0, 1.0]]


def test_sequence_mask_bounds_the_ratio_on_both_sides():
    # geometric means 0.25 (< 1/cap = 0.5: the behaviour policy liked these tokens far more; dropped),
    # 0.5 (= 1/cap: kept) and 1 (kept)
    prox, behav = _t([0.1, 0.1], [0.25, 0.25], [0.3, 0.3]), _t([0.4, 0.4], [0.5, 0.5], [0.3, 0.3])
    _, keep = sequence_mask(prox, behav, torch.ones(3, 2), cap=2.0)
    assert keep.tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]


def test_decoupled_weights_by_the_ratio_and_masks_tokens_beyond_the_cap():
    # rho = [2, 0.5, 6]: the third is beyond cap 5, masked (not truncated to 5)
    weights, keep = decoupled(_t([0.5, 0.2, 0.6]), _t([0.25, 0.4, 0.1]), torch.ones(1, 3), cap=5.0)
    assert weights[0].tolist() == pytest.approx([2.0, 0.5, 0.0])
    assert keep.tolist() == [[1.0, 1.0, 0.0]]


@pytest.mark.parametrize("name", ["token_tis", "decoupled"])
def test_loss_and_gradient_against_hand_computed_values(name):
    # pi_theta = [0.55, 0.27], pi_prox = [0.5, 0.3]: r = [1.1, 0.9] (inside the clip), A = 1
    # pi_behav = [0.25, 0.6]: rho = [2, 0.5], within both caps: w = [2, 0.5]
    logp = _t([0.55, 0.27]).requires_grad_(True)
    prox, behav, mask = _t([0.5, 0.3]), _t([0.25, 0.6]), torch.ones(1, 2, dtype=torch.float64)
    weights, keep = OFF_POLICY_CORRECTIONS.get(name)(prox, behav, mask, cap=2.5)
    loss, _ = policy_loss(logp, prox, torch.tensor([1.0], dtype=torch.float64), mask * keep, agg="token_mean",
                          token_weights=weights)
    # l_t = -w_t * r_t * A, token mean over 2 tokens: (-2 * 1.1 - 0.5 * 0.9) / 2
    assert loss.item() == pytest.approx(-1.325)
    loss.backward()
    # d l_t / d logp_t = -w_t * r_t * A (r = exp(logp - prox)), / 2
    assert logp.grad[0].tolist() == pytest.approx([-1.1, -0.225])


@pytest.mark.parametrize("name", ["none", "token_tis", "seq_mask", "decoupled"])
def test_every_correction_is_the_plain_loss_when_the_behaviour_policy_is_the_proximal_one(name):
    torch.manual_seed(0)
    logp = torch.randn(4, 6, dtype=torch.float64).clamp(max=-0.01).requires_grad_(True)
    prox = logp.detach() + 0.05 * torch.randn(4, 6, dtype=torch.float64)  # a later epoch: pi_theta moved
    mask = (torch.rand(4, 6) > 0.2).double()
    advantages = torch.randn(4, dtype=torch.float64)
    plain, _ = policy_loss(logp, prox, advantages, mask, agg="token_mean")
    plain_grad, = torch.autograd.grad(plain, logp)
    weights, keep = OFF_POLICY_CORRECTIONS.get(name)(prox, prox.clone(), mask, cap=2.0)
    corrected, _ = policy_loss(logp, prox, advantages, mask * keep, agg="token_mean", token_weights=weights)
    corrected_grad, = torch.autograd.grad(corrected, logp)
    assert torch.equal(corrected, plain) and torch.equal(corrected_grad, plain_grad)


def test_a_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="cap must be >= 1"):
        token_tis(_t([0.5]), _t([0.5]), torch.ones(1, 1), cap=0.5)
