"""The algorithms pinned against hand-computed values (formulas as in ../shared/seeds/)."""

import math

import pytest
import torch

from rlvr.algorithms.advantages import (
    dr_grpo_advantages,
    gae,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from rlvr.algorithms.losses import (
    aggregate,
    clipped_surrogate,
    clipped_value_loss,
    entropy_from_logits,
    kl_k1,
    kl_k2,
    kl_k3,
    policy_loss,
)

GROUP = torch.tensor([[1.0, 0.0, 0.0, 1.0, 0.0]])  # one group of five: mean 0.4


# --- advantages --------------------------------------------------------------------------------


def test_grpo_zscore_by_hand():
    # deviations 0.6 / -0.4; unbiased variance (2*0.36 + 3*0.16) / 4 = 0.3
    std = math.sqrt(0.3)
    expected = torch.tensor([[0.6, -0.4, -0.4, 0.6, -0.4]]) / std
    torch.testing.assert_close(grpo_advantages(GROUP), expected, atol=1e-5, rtol=1e-5)


def test_dr_grpo_subtracts_mean_only():
    torch.testing.assert_close(dr_grpo_advantages(GROUP), torch.tensor([[0.6, -0.4, -0.4, 0.6, -0.4]]))


def test_rloo_leave_one_out_by_hand():
    # a correct sample's baseline is mean(0,0,1,0) = 0.25; a wrong one's is mean(1,0,1,0) = 0.5
    torch.testing.assert_close(rloo_advantages(GROUP), torch.tensor([[0.75, -0.5, -0.5, 0.75, -0.5]]))


def test_reinforce_pp_normalises_over_the_whole_batch():
    rewards = torch.tensor([[1.0, 1.0], [0.0, 0.0]])  # no variance inside a group, some across the batch
    adv = reinforce_pp_advantages(rewards)
    std = math.sqrt(4 * 0.25 / 3)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5], [-0.5, -0.5]]) / std, atol=1e-5, rtol=1e-5)
    assert grpo_advantages(rewards).abs().max() == 0  # group statistics see no signal here


def test_zero_variance_group_gets_zero_advantage():
    for fn in (grpo_advantages, dr_grpo_advantages, rloo_advantages):
        assert fn(torch.ones(2, 4)).abs().max() == 0


def test_invalid_samples_are_left_out_of_group_statistics():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 123.0]])
    valid = torch.tensor([[True, True, True, False]])
    adv = dr_grpo_advantages(rewards, valid)
    torch.testing.assert_close(adv, torch.tensor([[2 / 3, -1 / 3, -1 / 3, 0.0]]))
    assert grpo_advantages(rewards, valid)[0, 3] == 0
    torch.testing.assert_close(rloo_advantages(rewards, valid), torch.tensor([[1.0, -0.5, -0.5, 0.0]]))


def test_gae_lambda_zero_is_one_step_td_error():
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.2, 0.5, 0.7]])
    m = torch.ones_like(r)
    adv, ret = gae(r, v, m, gamma=0.9, lam=0.0)
    td = torch.tensor([[0.0 + 0.9 * 0.5 - 0.2, 0.0 + 0.9 * 0.7 - 0.5, 1.0 + 0.0 - 0.7]])
    torch.testing.assert_close(adv, td)
    torch.testing.assert_close(ret, td + v)


def test_gae_lambda_one_is_monte_carlo_return_minus_value():
    r = torch.tensor([[0.1, -0.2, 1.0, 0.0]])
    v = torch.tensor([[0.3, 0.1, 0.4, 9.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # last position is padding: its value must not leak
    gamma = 0.9
    adv, _ = gae(r, v, m, gamma=gamma, lam=1.0)
    g2 = 1.0
    g1 = -0.2 + gamma * g2
    g0 = 0.1 + gamma * g1
    torch.testing.assert_close(adv, torch.tensor([[g0 - 0.3, g1 - 0.1, g2 - 0.4, 0.0]]))


# --- clipped surrogate: gradient zero exactly where the clipping mask says -----------------------


def _grad_of_loss(ratio: float, adv: float, clip_low=0.2, clip_high=0.2, dual_clip=None):
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    old = torch.zeros(1, 1)
    loss, low, high = clipped_surrogate(logp, old, torch.tensor([adv]), clip_low, clip_high, dual_clip)
    loss.sum().backward()
    return logp.grad.item(), loss.item(), bool(low.item()), bool(high.item())


@pytest.mark.parametrize(
    "ratio, adv, grad_zero, masked",
    [
        (1.1, +1.0, False, None),  # A > 0, inside the trust region: pushed up
        (1.5, +1.0, True, "high"),  # A > 0, rho > 1 + eps: already likely enough, gradient stopped
        (0.5, +1.0, False, None),  # A > 0, rho < 1 - eps: not clipped (can still increase)
        (0.9, -1.0, False, None),  # A < 0, inside: pushed down
        (0.5, -1.0, True, "low"),  # A < 0, rho < 1 - eps: already unlikely enough, gradient stopped
        (1.5, -1.0, False, None),  # A < 0, rho > 1 + eps: not clipped (can still decrease)
    ],
)
def test_clip_mask_matches_gradient(ratio, adv, grad_zero, masked):
    grad, loss, low, high = _grad_of_loss(ratio, adv)
    assert (grad == 0.0) is grad_zero
    if not grad_zero:  # d/dlogp of -A * rho is -A * rho
        assert grad == pytest.approx(-adv * ratio, rel=1e-5)
    assert low is (masked == "low") and high is (masked == "high")


def test_clip_values_by_hand():
    _, loss, _, _ = _grad_of_loss(1.5, +1.0)
    assert loss == pytest.approx(-1.2)  # -(1 + eps) * A
    _, loss, _, _ = _grad_of_loss(0.5, -1.0)
    assert loss == pytest.approx(0.8)  # -(1 - eps) * A


def test_clip_higher_is_asymmetric():
    grad, _, _, high = _grad_of_loss(1.25, +1.0, clip_low=0.2, clip_high=0.28)
    assert grad != 0 and not high
    grad, _, _, high = _grad_of_loss(1.30, +1.0, clip_low=0.2, clip_high=0.28)
    assert grad == 0 and high
    grad, _, low, _ = _grad_of_loss(0.79, -1.0, clip_low=0.2, clip_high=0.28)
    assert grad == 0 and low


def test_dual_clip_bounds_negative_advantage_loss():
    grad, loss, _, _ = _grad_of_loss(4.0, -1.0, dual_clip=3.0)
    assert loss == pytest.approx(3.0) and grad == 0.0
    grad, loss, _, _ = _grad_of_loss(2.0, -1.0, dual_clip=3.0)
    assert loss == pytest.approx(2.0) and grad == pytest.approx(2.0)
    grad, loss, _, _ = _grad_of_loss(4.0, +1.0, dual_clip=3.0)  # positive advantages are untouched
    assert loss == pytest.approx(-1.2) and grad == 0.0


def test_policy_loss_on_policy_gradient_is_reinforce():
    # ratio = 1 everywhere: the gradient of the loss is -A / |o| per token (seq_mean_token_mean)
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.1], [0.3, 0.3, 0.3]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, -2.0])
    loss, stats = policy_loss(logp, logp.detach(), adv, mask)
    loss.backward()
    expected = torch.tensor([[-1 / 2, -1 / 2, 0.0], [2 / 3, 2 / 3, 2 / 3]]) / 2
    torch.testing.assert_close(logp.grad, expected)
    assert stats.clip_frac_low == 0 and stats.clip_frac_high == 0 and stats.ratio_mean == pytest.approx(1.0)


# --- aggregation -------------------------------------------------------------------------------

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def test_aggregation_modes_by_hand():
    assert aggregate(VALUES, MASK, "token_mean").item() == pytest.approx(10 / 4)
    assert aggregate(VALUES, MASK, "seq_mean_token_mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(VALUES, MASK, "seq_mean_token_sum_norm", max_len=3).item() == pytest.approx((6 / 3 + 4 / 3) / 2)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_micro_batches_with_global_denominators_sum_to_the_whole(mode):
    whole = aggregate(VALUES, MASK, mode, max_len=8)
    parts = sum(
        aggregate(VALUES[i : i + 1], MASK[i : i + 1], mode, num_seqs=2, num_tokens=4, max_len=8) for i in range(2)
    )
    assert parts.item() == pytest.approx(whole.item())


def test_unknown_aggregation_lists_valid_modes():
    with pytest.raises(KeyError, match="unknown loss aggregation .sum.; valid loss aggregations: seq_mean_token_mean, seq_mean_token_sum_norm, token_mean"):
        aggregate(VALUES, MASK, "sum")


# --- KL, entropy, value loss -------------------------------------------------------------------


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert kl_k1(logp, ref).item() == pytest.approx(math.log(2))
    assert kl_k2(logp, ref).item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_k3(logp, ref).item() == pytest.approx(0.5 - math.log(0.5) - 1)


def test_k3_is_non_negative_and_zero_at_equality():
    g = torch.Generator().manual_seed(0)
    logp, ref = torch.randn(1000, generator=g) * 3, torch.randn(1000, generator=g) * 3
    assert (kl_k3(logp, ref) >= 0).all()
    assert kl_k3(logp, logp).abs().max() == 0
    assert torch.isfinite(kl_k3(torch.tensor([0.0]), torch.tensor([-1e4]))).all()


def test_k3_is_unbiased_for_the_true_kl():
    p = torch.tensor([0.7, 0.2, 0.1])
    q = torch.tensor([0.4, 0.4, 0.2])
    true_kl = (p * (p / q).log()).sum()
    samples = torch.multinomial(p, 200_000, replacement=True, generator=torch.Generator().manual_seed(1))
    estimate = kl_k3(p.log()[samples], q.log()[samples]).mean()
    assert estimate.item() == pytest.approx(true_kl.item(), abs=5e-3)


def test_entropy_from_logits():
    assert entropy_from_logits(torch.zeros(2, 8)).tolist() == pytest.approx([math.log(8)] * 2)
    assert entropy_from_logits(torch.tensor([[100.0, 0.0, 0.0]])).item() == pytest.approx(0.0, abs=1e-6)


def test_clipped_value_loss_by_hand():
    mask = torch.ones(1, 2)
    old = torch.tensor([[0.0, 0.0]])
    ret = torch.tensor([[1.0, 1.0]])
    new = torch.tensor([[0.5, 2.0]])
    # token 1: unclipped (0.5-1)^2=0.25, clipped (0.2-1)^2=0.64 -> 0.64 ; token 2: (2-1)^2=1, (0.2-1)^2=0.64 -> 1
    loss = clipped_value_loss(new, old, ret, mask, clip=0.2)
    assert loss.item() == pytest.approx(0.5 * (0.64 + 1.0) / 2)
