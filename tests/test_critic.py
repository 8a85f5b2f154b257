"""The critic side of PPO (rlvr/algorithms/critic.py) pinned against values computed by hand."""

import math

import pytest
import torch

from rlvr.algorithms.critic import (
    AdaptiveKLController,
    FixedKLController,
    clipped_value_loss_per_token,
    explained_variance,
    gae,
    masked_whiten,
    token_rewards,
)
from rlvr.algorithms.losses import aggregate

NAN = float("nan")


def assert_close(actual, expected):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=1e-6, rtol=1e-6)


# --- GAE ---------------------------------------------------------------------------------------


def test_gae_gamma_one_lambda_one_is_reward_to_go_minus_value():
    r = torch.tensor([[0.0, 0.5, 1.0]])
    v = torch.tensor([[0.2, 0.4, 0.6]])
    adv, ret = gae(r, v, torch.ones_like(r), gamma=1.0, lam=1.0)
    # reward-to-go: [0 + 0.5 + 1, 0.5 + 1, 1] = [1.5, 1.5, 1.0]; minus v -> [1.3, 1.1, 0.4]
    # (by deltas: d2 = 1 - 0.6 = 0.4, d1 = 0.5 + 0.6 - 0.4 = 0.7, d0 = 0 + 0.4 - 0.2 = 0.2;
    #  A2 = 0.4, A1 = 0.7 + 0.4 = 1.1, A0 = 0.2 + 1.1 = 1.3)
    assert_close(adv, [[1.3, 1.1, 0.4]])
    assert_close(ret, [[1.5, 1.5, 1.0]])


def test_gae_discounts_by_hand():
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 0.8]])
    adv, ret = gae(r, v, torch.ones_like(r), gamma=0.9, lam=0.5)
    # gamma * lam = 0.45; V after the last token = 0
    # d2 = 1 + 0.9*0   - 0.8 = 0.2       A2 = 0.2
    # d1 = 0 + 0.9*0.8 - 0.6 = 0.12      A1 = 0.12 + 0.45*0.2  = 0.21
    # d0 = 0 + 0.9*0.6 - 0.5 = 0.04      A0 = 0.04 + 0.45*0.21 = 0.1345
    assert_close(adv, [[0.1345, 0.21, 0.2]])
    assert_close(ret, [[0.1345 + 0.5, 0.21 + 0.6, 0.2 + 0.8]])


def test_gae_padding_garbage_changes_nothing():
    r = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1e6, NAN]])
    v = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, NAN, -1e6]])
    m = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    adv, ret = gae(r, v, m, gamma=0.9, lam=0.5)
    # short row alone: d1 = 1 - 0.6 = 0.4, d0 = 0.9*0.6 - 0.5 = 0.04; A1 = 0.4, A0 = 0.04 + 0.45*0.4 = 0.22
    assert_close(adv[1], [0.22, 0.4, 0.0, 0.0])
    assert_close(ret[1], [0.72, 1.0, 0.0, 0.0])
    short_adv, short_ret = gae(r[1:, :2], v[1:, :2], m[1:, :2], gamma=0.9, lam=0.5)
    assert_close(adv[1, :2], short_adv[0])
    assert_close(ret[1, :2], short_ret[0])
    full_adv, _ = gae(r[:1], v[:1], m[:1], gamma=0.9, lam=0.5)
    assert_close(adv[0], full_adv[0])  # the full row does not see its neighbour's padding


def test_gae_skips_a_hole_as_if_deleted():
    r = torch.tensor([[0.0, 7.0, 1.0]])
    v = torch.tensor([[0.5, 9.0, 0.6]])
    adv, _ = gae(r, v, torch.tensor([[1, 0, 1]]), gamma=0.9, lam=0.5)
    # same as the row [r = (0, 1), v = (0.5, 0.6)]: A = [0.22, 0.4] (see above), the hole gets 0
    assert_close(adv, [[0.22, 0.0, 0.4]])


def test_gae_bootstraps_from_last_values_at_truncation():
    r = torch.tensor([[0.0, 0.0, 5.0]])
    v = torch.tensor([[0.5, 0.6, 5.0]])
    m = torch.tensor([[1, 1, 0]])
    adv, ret = gae(r, v, m, gamma=0.9, lam=0.5, last_values=torch.tensor([0.8]))
    # V after the last real token is 0.8, not the padding's 5.0 nor 0:
    # d1 = 0 + 0.9*0.8 - 0.6 = 0.12      A1 = 0.12
    # d0 = 0 + 0.9*0.6 - 0.5 = 0.04      A0 = 0.04 + 0.45*0.12 = 0.094
    assert_close(adv, [[0.094, 0.12, 0.0]])
    assert_close(ret, [[0.594, 0.72, 0.0]])
    no_boot, _ = gae(r, v, m, gamma=0.9, lam=0.5)
    # without it: A1 = 0 - 0.6 = -0.6, A0 = 0.04 + 0.45*(-0.6) = -0.23
    assert_close(no_boot, [[-0.23, -0.6, 0.0]])


def test_gae_carries_no_gradient():
    v = torch.tensor([[0.5, 0.6]], requires_grad=True)
    adv, ret = gae(torch.tensor([[0.0, 1.0]]), v, torch.ones(1, 2))
    assert not adv.requires_grad and not ret.requires_grad


# --- whitening ---------------------------------------------------------------------------------


def test_masked_whiten_by_hand_ignores_padding():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 4.0, -7.0]])
    m = torch.tensor([[1, 1, 0], [1, 1, 0]])
    # real tokens 1, 2, 3, 4: mean 2.5, deviations -1.5 -0.5 0.5 1.5, squares sum 2.25+0.25+0.25+2.25 = 5
    # unbiased variance 5 / (4 - 1) = 5/3
    std = math.sqrt(5 / 3)
    expected = torch.tensor([[-1.5, -0.5, 0.0], [0.5, 1.5, 0.0]]) / std
    out = masked_whiten(x, m)
    assert_close(out, expected)
    other_padding = x.clone()
    other_padding[:, 2] = torch.tensor([NAN, 1e9])
    assert_close(masked_whiten(other_padding, m), expected)
    real = out[m.bool()]
    assert abs(float(real.mean())) < 1e-6
    assert abs(float(real.var(correction=1)) - 1.0) < 1e-6  # the unbiased convention
    assert abs(float(real.var(correction=0)) - 0.75) < 1e-6  # biased would read (n-1)/n = 3/4


def test_masked_whiten_keep_mean_adds_the_mean_back():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    m = torch.tensor([[1, 1, 1, 0]])
    # real 1, 2, 3: mean 2, unbiased variance (1 + 0 + 1) / 2 = 1, so whitened = [-1, 0, 1]
    assert_close(masked_whiten(x, m), [[-1.0, 0.0, 1.0, 0.0]])
    assert_close(masked_whiten(x, m, shift_mean=False), [[1.0, 2.0, 3.0, 0.0]])
    assert_close(masked_whiten(x, torch.tensor([[0, 1, 0, 0]])), [[0.0, 0.0, 0.0, 0.0]])  # n = 1


# --- value loss and explained variance ---------------------------------------------------------


def test_clipped_value_loss_picks_the_larger_branch():
    values = torch.tensor([[0.5, 1.0, 0.9, 3.0]], requires_grad=True)
    old = torch.tensor([[0.4, 0.5, 0.5, 0.0]], requires_grad=True)
    ret = torch.tensor([[1.0, 0.0, 1.0, 9.0]], requires_grad=True)
    m = torch.tensor([[1, 1, 1, 0]])
    loss, clipped = clipped_value_loss_per_token(values, old, ret, m, clip=0.2)
    # t0: V 0.5 inside [0.2, 0.6]: both branches (0.5-1)^2 = 0.25          -> 0.5*0.25 = 0.125, unclipped
    # t1: V_clip 0.7: unclipped (1-0)^2 = 1.0 > clipped 0.7^2 = 0.49         -> 0.5*1.0  = 0.5,   unclipped
    # t2: V_clip 0.7: unclipped (0.9-1)^2 = 0.01 < clipped (0.7-1)^2 = 0.09  -> 0.5*0.09 = 0.045, clipped
    # t3: padding                                                           -> 0
    assert_close(loss, [[0.125, 0.5, 0.045, 0.0]])
    assert clipped.tolist() == [[False, False, True, False]]
    # the clipped branch is constant in V: exactly the clipped tokens get no gradient (d loss/dV = V - R)
    loss.sum().backward()
    assert_close(values.grad, [[-0.5, 1.0, 0.0, 0.0]])
    assert old.grad is None and ret.grad is None  # targets and the old critic are constants
    # reduction is the shared one: token_mean = (0.125 + 0.5 + 0.045) / 3
    assert abs(float(aggregate(loss.detach(), m, "token_mean")) - 0.67 / 3) < 1e-6


def test_explained_variance_by_hand():
    ret = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    m = torch.tensor([[1, 1, 1, 0]])
    assert explained_variance(ret.clone(), ret, m) == 1.0  # a perfect critic
    # V = [1, 2, 2]: R - V = [0, 0, 1], Var = ((1/3)^2*2 + (2/3)^2) / 2 = 1/3; Var R = (1 + 0 + 1) / 2 = 1
    assert abs(explained_variance(torch.tensor([[1.0, 2.0, 2.0, -4.0]]), ret, m) - 2 / 3) < 1e-9
    assert abs(explained_variance(torch.full((1, 4), 2.0), ret, m)) < 1e-9  # predicting the mean: 0
    assert math.isnan(explained_variance(ret, torch.full((1, 4), 0.3), m))  # Var R = 0: undefined


# --- rewards -----------------------------------------------------------------------------------


def test_token_rewards_score_at_last_real_token_minus_beta_kl():
    scores = torch.tensor([1.0, 0.5, 2.0, 3.0])
    m = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]])
    kl = torch.tensor([[0.2, -0.1, 0.3], [0.5, NAN, 9.0], [0.1, 0.4, 9.0], [1.0, 1.0, 1.0]])
    out = token_rewards(scores, m, kl=kl, beta=0.1)
    # row 0 (3 tokens): [-0.02, +0.01, 1.0 - 0.03]; row 1 (1 token): [0.5 - 0.05, 0, 0]
    # row 2 (2 tokens): [-0.01, 2.0 - 0.04, 0];       row 3 (no tokens): nothing to reward
    expected = [[-0.02, 0.01, 0.97], [0.45, 0.0, 0.0], [-0.01, 1.96, 0.0], [0.0, 0.0, 0.0]]
    assert_close(out, expected)
    assert_close(token_rewards(scores, m), [[0, 0, 1.0], [0.5, 0, 0], [0, 2.0, 0], [0, 0, 0]])


def test_token_rewards_truncation_modes():
    scores = torch.tensor([1.0, 2.0])
    m = torch.tensor([[1, 1, 0], [1, 1, 1]])
    kl = torch.tensor([[0.1, 0.2, 0.0], [0.1, 0.2, 0.3]])
    truncated = torch.tensor([False, True])
    kept = token_rewards(scores, m, kl=kl, beta=0.1, truncated=truncated, truncation="none")
    zeroed = token_rewards(scores, m, kl=kl, beta=0.1, truncated=truncated, truncation="zero")
    # row 0 ended: [-0.01, 1 - 0.02, 0] in both; row 1 truncated: [-0.01, -0.02, 2 - 0.03] or [.., -0.03]
    assert_close(kept, [[-0.01, 0.98, 0.0], [-0.01, -0.02, 1.97]])
    assert_close(zeroed, [[-0.01, 0.98, 0.0], [-0.01, -0.02, -0.03]])
    with pytest.raises(ValueError, match="none, zero"):
        token_rewards(scores, m, truncation="bootstrap")


# --- KL controllers ----------------------------------------------------------------------------


def test_adaptive_kl_controller_by_hand():
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    # KL 6.6: e = 6.6/6 - 1 = 0.1 (inside the clip); beta = 0.1 * (1 + 0.1 * 1000/10000) = 0.101
    assert abs(ctl.update(6.6, n_steps=1000) - 0.101) < 1e-12
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    # KL 9: e = 0.5 clipped to 0.2; beta = 0.1 * (1 + 0.2 * 0.1) = 0.102
    assert abs(ctl.update(9.0, n_steps=1000) - 0.102) < 1e-12
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    # KL 3: e = -0.5 clipped to -0.2; beta = 0.1 * (1 - 0.02) = 0.098
    assert abs(ctl.update(3.0, n_steps=1000) - 0.098) < 1e-12
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    # a whole horizon at a huge KL: never more than +20%
    assert abs(ctl.update(1e6, n_steps=10000) - 0.12) < 1e-12
    assert ctl.update(NAN, n_steps=10000) == ctl.value  # a non-finite KL changes nothing


def test_kl_controllers_resume_from_state_dict():
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    ctl.update(9.0, n_steps=1000)
    resumed = AdaptiveKLController(0.5, target=6.0, horizon=10000)
    resumed.load_state_dict(ctl.state_dict())
    assert resumed.value == ctl.value
    assert resumed.update(9.0, 1000) == ctl.update(9.0, 1000)
    fixed = FixedKLController(0.05)
    assert fixed.update(100.0, n_steps=10**6) == 0.05 and fixed.value == 0.05
    other = FixedKLController(0.0)
    other.load_state_dict(fixed.state_dict())
    assert other.value == 0.05
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, target=0.0, horizon=10000)
