"""Preference losses against hand-derived values: Bradley-Terry, DPO, cDPO, IPO, reward ensembles.

Numbers used below: sigmoid(1) = 0.731059, so -log sigmoid(1) = 0.313262; -log sigmoid(-1) = 1.313262;
-log sigmoid(0.5) = log(1 + e^-0.5) = 0.474077; -log sigmoid(-2) = log(1 + e^2) = 2.126928.
"""

import pytest
import torch

from rlvr.algorithms.preference import (
    DPO_LOSSES,
    REWARD_ENSEMBLES,
    bradley_terry_loss,
    combine_rewards,
    dpo_loss,
)
from rlvr.verifiers.errors import UnknownNameError

t = torch.tensor


def test_bradley_terry_one_pair():
    loss, stats = bradley_terry_loss(t([1.0]), t([0.0]))
    assert loss.item() == pytest.approx(0.313262, abs=1e-6)  # -log sigmoid(1 - 0)
    assert stats["pairwise_accuracy"] == 1.0 and stats["margin"] == pytest.approx(1.0)


def test_bradley_terry_two_pairs_accuracy_and_margin():
    loss, stats = bradley_terry_loss(t([1.0, 0.0]), t([0.0, 2.0]))  # differences 1 and -2
    assert loss.item() == pytest.approx((0.313262 + 2.126928) / 2, abs=1e-6)  # 1.220095
    assert stats["pairwise_accuracy"] == 0.5
    assert stats["margin"] == pytest.approx(-0.5)
    _, tie = bradley_terry_loss(t([1.0]), t([1.0]))
    assert tie["pairwise_accuracy"] == 0.5  # a tie counts half


def test_bradley_terry_margin_and_centering():
    loss, _ = bradley_terry_loss(t([1.0]), t([0.0]), margin=t([0.5]))
    assert loss.item() == pytest.approx(0.474077, abs=1e-6)  # -log sigmoid(1 - 0.5)
    loss, _ = bradley_terry_loss(t([1.0]), t([0.0]), center_coef=0.1)
    assert loss.item() == pytest.approx(0.313262 + 0.1 * 1.0, abs=1e-6)  # + 0.1 * (1 + 0)^2


def test_bradley_terry_gradient_raises_chosen_and_lowers_rejected():
    r_w, r_l = t([0.3], requires_grad=True), t([0.1], requires_grad=True)
    loss, _ = bradley_terry_loss(r_w, r_l)
    loss.backward()
    # dL/dr_w = -sigmoid(-(r_w - r_l)) = -sigmoid(-0.2) = -0.450166
    assert r_w.grad.item() == pytest.approx(-0.450166, abs=1e-6)
    assert r_l.grad.item() == pytest.approx(0.450166, abs=1e-6)


def _dpo(**kwargs):
    # log pi(y_w) = -1, log pi(y_l) = -3, log pi_ref = -2 for both: log-ratios +1 and -1, h = 2
    args = [t([-1.0], requires_grad=True), t([-3.0], requires_grad=True), t([-2.0]), t([-2.0])]
    loss, stats = dpo_loss(*args, **kwargs)
    loss.backward()
    return loss.item(), stats, args[0].grad.item(), args[1].grad.item()


def test_dpo_sigmoid_hand_values_and_gradient_direction():
    loss, stats, grad_w, grad_l = _dpo(beta=0.5)
    assert loss == pytest.approx(0.313262, abs=1e-6)  # -log sigmoid(0.5 * 2)
    assert stats["reward_chosen"] == pytest.approx(0.5) and stats["reward_rejected"] == pytest.approx(-0.5)
    assert stats["margin"] == pytest.approx(1.0) and stats["accuracy"] == 1.0
    # dL/dlogpi(y_w) = -beta * sigmoid(-beta h) = -0.5 * 0.268941
    assert grad_w == pytest.approx(-0.134471, abs=1e-6) and grad_l == pytest.approx(0.134471, abs=1e-6)


def test_cdpo_label_smoothing():
    loss, *_ = _dpo(beta=0.5, label_smoothing=0.1)
    assert loss == pytest.approx(0.9 * 0.313262 + 0.1 * 1.313262, abs=1e-6)  # 0.413262
    half, _, grad_w, _ = _dpo(beta=0.5, label_smoothing=0.5)
    assert half == pytest.approx(0.5 * (0.313262 + 1.313262), abs=1e-6)
    assert grad_w == pytest.approx(-0.5 * 0.5 * (0.268941 - 0.731059), abs=1e-6)  # eps=0.5 pulls h back to 0


def test_ipo_squared_loss_has_a_finite_target():
    loss, _, grad_w, _ = _dpo(beta=0.5, loss="ipo")
    assert loss == pytest.approx(1.0)  # (h - 1/(2*0.5))^2 = (2 - 1)^2
    assert grad_w == pytest.approx(2.0)  # 2 (h - 1): past its target, IPO pushes the chosen log-prob *down*
    at_target, _, grad_at_target, _ = _dpo(beta=0.25, loss="ipo")  # target 1/(2*0.25) = 2 = h
    assert at_target == pytest.approx(0.0) and grad_at_target == pytest.approx(0.0)


def test_dpo_variants_come_from_the_registry():
    assert {"sigmoid", "ipo"} <= set(DPO_LOSSES.names())
    with pytest.raises(UnknownNameError, match="valid"):
        dpo_loss(t([0.0]), t([0.0]), t([0.0]), t([0.0]), beta=0.1, loss="sigmoidd")


def test_reward_ensembles():
    scores = t([[1.0, 4.0], [3.0, 0.0]])  # [M=2 models, N=2 samples]
    assert combine_rewards(scores, "mean").tolist() == [2.0, 2.0]
    assert combine_rewards(scores, "min").tolist() == [1.0, 0.0]
    # population std over the models: [1, 2]
    assert combine_rewards(scores, "mean_minus_std").tolist() == [1.0, 0.0]
    assert combine_rewards(scores, "mean_minus_std", k=0.5).tolist() == [1.5, 1.0]
    assert combine_rewards(t([[5.0, 6.0]]), "mean_minus_std").tolist() == [5.0, 6.0]  # one model: no penalty
    assert {"min", "mean", "mean_minus_std"} <= set(REWARD_ENSEMBLES.names())
    with pytest.raises(ValueError, match=r"\[M models, N samples\]"):
        combine_rewards(t([1.0, 2.0]))
