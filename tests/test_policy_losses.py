"""The sequence-level, clipped-weight, soft-gate, geometric-mean and covariance policy losses (gspo,
gspo_token, cispo, sapo, gmpo, clip_cov, kl_cov) and the importance-weight metrics, against values and
gradients computed by hand, and exactly equal to ``ppo_clip`` where their papers say they coincide."""

import math

import pytest
import torch

from rlvr.algorithms.losses import POLICY_LOSSES, policy_loss

LN = math.log
F64 = torch.float64


def _grad(loss_name, logp, old, advantages, mask, agg="seq_mean_token_mean", **clip):
    """(loss, d loss / d logp, stats) of ``policy_loss`` with ``loss_name``."""
    logp = logp.clone().requires_grad_(True)
    loss, stats = policy_loss(logp, old, advantages, mask, loss=loss_name, agg=agg, **clip)
    loss.backward()
    return loss.detach(), logp.grad, stats


# --- gspo ------------------------------------------------------------------------------------------------
# Row 0: A = +2, two real tokens with log-ratios (2e-4, -1e-4): log s0 = 5e-5, s0 = e^{5e-5}, inside
# [1 - 3e-4, 1 + 4e-4], so l0 = -2 s0. Row 1: A = -1, three real tokens with log-ratios (-1e-3, -2e-3, 0):
# s1 = e^{-1e-3} = 0.9990005 < 0.9997 with A < 0, clipped: l1 = max(0.9990005, 0.9997) = 0.9997, no gradient.
# Padding (row 0, token 2) has log-ratio 5: if it leaked into s0, s0 would be ~5.3 and clipped.
# seq_mean_token_mean: (mean of row 0's copies of l0 + mean of row 1's copies of l1) / 2 = (l0 + l1) / 2;
# d/d logp_0t = (1/2) * d l0/d logp_0t = (1/2) * (-2 s0 / 2) = -s0 / 2 on row 0's two tokens.
GSPO_OLD = torch.zeros(2, 3, dtype=F64)
GSPO_LOGP = torch.tensor([[2e-4, -1e-4, 5.0], [-1e-3, -2e-3, 0.0]], dtype=F64)
GSPO_MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=F64)
GSPO_ADV = torch.tensor([2.0, -1.0], dtype=F64)
PAPER_CLIP = dict(clip_low=3e-4, clip_high=4e-4)


def test_gspo_clips_the_geometric_mean_sequence_ratio_by_hand():
    s0 = math.exp(5e-5)
    loss_t, low, high = POLICY_LOSSES["gspo"](GSPO_LOGP, GSPO_OLD, GSPO_ADV, mask=GSPO_MASK, **PAPER_CLIP)
    torch.testing.assert_close(loss_t[0, :2], torch.tensor([-2 * s0, -2 * s0], dtype=F64), rtol=0, atol=1e-12)
    torch.testing.assert_close(loss_t[1], torch.full((3,), 0.9997, dtype=F64), rtol=0, atol=1e-12)
    assert low[1].all() and not low[0].any() and not high.any()  # the whole of row 1 is clipped below

    loss, grad, stats = _grad("gspo", GSPO_LOGP, GSPO_OLD, GSPO_ADV, GSPO_MASK, **PAPER_CLIP)
    assert loss.item() == pytest.approx((-2 * s0 + 0.9997) / 2, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[-s0 / 2, -s0 / 2, 0.0], [0.0, 0.0, 0.0]], dtype=F64),
                               rtol=0, atol=1e-12)
    assert stats.clip_frac_low == pytest.approx(3 / 5) and stats.clip_frac_high == 0.0


def test_gspo_unclipped_sequence_gradient_is_its_ratio_over_its_length():
    """Row 1 with A = +1: -min(s1, clip(s1)) = -s1 (s1 < 1 is never clipped for A > 0); each of its three
    tokens gets (1/2) * (-s1 / 3)."""
    s0, s1 = math.exp(5e-5), math.exp(-1e-3)
    loss, grad, _ = _grad("gspo", GSPO_LOGP, GSPO_OLD, torch.tensor([2.0, 1.0], dtype=F64), GSPO_MASK, **PAPER_CLIP)
    assert loss.item() == pytest.approx((-2 * s0 - s1) / 2, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[-s0 / 2, -s0 / 2, 0.0], [-s1 / 6] * 3], dtype=F64),
                               rtol=0, atol=1e-12)


def test_gspo_needs_the_mask():
    with pytest.raises(ValueError, match="needs the response mask"):
        POLICY_LOSSES["gspo"](GSPO_LOGP, GSPO_OLD, GSPO_ADV, **PAPER_CLIP)


# --- gspo_token ------------------------------------------------------------------------------------------


def _random_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(3, 5, generator=g, dtype=F64) * 2
    # log-ratios ~ +1e-3 (row 0, A > 0: clipped above at the paper's range), ~0 (row 1), ~ -1e-3 (row 2, A < 0:
    # clipped below), each with noise of 1e-5
    shift = torch.tensor([[1e-3], [0.0], [-1e-3]], dtype=F64)
    old = logp - shift + (torch.rand(3, 5, generator=g, dtype=F64) - 0.5) * 2e-5
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=F64)
    adv = torch.tensor([1.5, -0.5, -1.0], dtype=F64)
    return logp, old, adv, mask


def test_gspo_token_equals_gspo_in_value_and_gradient_with_one_advantage_per_sequence():
    logp, old, adv, mask = _random_batch()
    for clip in (PAPER_CLIP, dict(clip_low=0.2, clip_high=0.2)):  # some sequences clipped, then none
        seq_loss, seq_grad, seq_stats = _grad("gspo", logp, old, adv, mask, **clip)
        tok_loss, tok_grad, tok_stats = _grad("gspo_token", logp, old, adv, mask, **clip)
        assert torch.equal(tok_loss, seq_loss)  # the value of sg[s_i] * pi_t / sg[pi_t] is s_i exactly
        torch.testing.assert_close(tok_grad, seq_grad, rtol=1e-12, atol=1e-15)
        assert (tok_stats.clip_frac_low, tok_stats.clip_frac_high) == (seq_stats.clip_frac_low, seq_stats.clip_frac_high)
    stats = _grad("gspo", logp, old, adv, mask, **PAPER_CLIP)[2]
    assert stats.clip_frac_low > 0 and stats.clip_frac_high > 0  # the paper's range did clip, on both sides


def test_gspo_token_gradient_by_hand():
    """grad l_it = -A_it * s_i on token t alone: with per-token advantages (2, -1) on row 0 of the gspo
    batch (s0 = e^{5e-5}, unclipped for both signs) and seq_mean_token_mean over 2 rows, 2 tokens:
    (-2 s0 / 4, +s0 / 4)."""
    s0 = math.exp(5e-5)
    adv = torch.tensor([[2.0, -1.0, 7.0], [0.0, 0.0, 0.0]], dtype=F64)
    _, grad, _ = _grad("gspo_token", GSPO_LOGP, GSPO_OLD, adv, GSPO_MASK, **PAPER_CLIP)
    torch.testing.assert_close(grad[0], torch.tensor([-2 * s0 / 4, s0 / 4, 0.0], dtype=F64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["gspo_token", "cispo"])
def test_on_policy_gradient_is_exactly_ppo_clips(name):
    """logp == old_logp (the batch's first pass) and one advantage per sequence: s_i = rho_t = 1, and
    gspo_token's and cispo's gradients are the clipped surrogate's, bit for bit."""
    logp, _, adv, mask = _random_batch(1)
    for agg in ("seq_mean_token_mean", "token_mean"):
        _, ppo_grad, _ = _grad("ppo_clip", logp, logp, adv, mask, agg=agg)
        _, grad, _ = _grad(name, logp, logp, adv, mask, agg=agg, clip_low=0.2, clip_high=0.28)
        assert torch.equal(grad, ppo_grad), (name, agg)


def test_on_policy_gspo_gradient_is_ppo_clips():
    """-A_i s_i / |o_i| / B per token, s_i = 1: the gradient of GRPO's seq_mean_token_mean clipped surrogate."""
    logp, _, adv, mask = _random_batch(2)
    _, ppo_grad, _ = _grad("ppo_clip", logp, logp, adv, mask)
    _, grad, _ = _grad("gspo", logp, logp, adv, mask, **PAPER_CLIP)
    torch.testing.assert_close(grad, ppo_grad, rtol=1e-14, atol=1e-16)


# --- cispo -----------------------------------------------------------------------------------------------
# Row 0 (A = +1): pi / pi_old = 0.5 / 0.25 = 2 and 0.5 / 0.625 = 0.8; row 1 (A = -2): 0.2 / 0.4 = 0.5.
# Padding (row 0 token 2, row 1 tokens 1-2) holds ratio e^3 and log-prob 0.
# clip_low 0.3, clip_high 0.28: weights (1.28 capped, 0.8), (0.7 capped); l_t = -w A logp_t.
# token_mean over 3 tokens: grad_t = -w_t A / 3 -> row 0 (-1.28 / 3, -0.8 / 3), row 1 (+1.4 / 3).
# PPO would give row 0 token 0 and row 1 token 0 no gradient at all.
CISPO_LOGP = torch.tensor([[LN(0.5), LN(0.5), 0.0], [LN(0.2), 0.0, 0.0]], dtype=F64)
CISPO_OLD = torch.tensor([[LN(0.25), LN(0.625), -3.0], [LN(0.4), -3.0, -3.0]], dtype=F64)
CISPO_MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=F64)
CISPO_ADV = torch.tensor([1.0, -2.0], dtype=F64)


def test_cispo_weights_are_clipped_and_every_token_keeps_its_gradient_by_hand():
    loss_t, low, high = POLICY_LOSSES["cispo"](CISPO_LOGP, CISPO_OLD, CISPO_ADV, clip_low=0.3, clip_high=0.28,
                                               mask=CISPO_MASK)
    expected = [-1.28 * LN(0.5), -0.8 * LN(0.5), 1.4 * LN(0.2)]
    torch.testing.assert_close(loss_t[CISPO_MASK.bool()], torch.tensor(expected, dtype=F64), rtol=0, atol=1e-12)
    m = CISPO_MASK.bool()
    assert (high & m).tolist() == [[True, False, False], [False, False, False]]
    assert (low & m).tolist() == [[False, False, False], [True, False, False]]

    loss, grad, stats = _grad("cispo", CISPO_LOGP, CISPO_OLD, CISPO_ADV, CISPO_MASK, agg="token_mean",
                              clip_low=0.3, clip_high=0.28)
    assert loss.item() == pytest.approx(sum(expected) / 3, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[-1.28 / 3, -0.8 / 3, 0.0], [1.4 / 3, 0.0, 0.0]], dtype=F64),
                               rtol=0, atol=1e-12)
    assert (stats.clip_frac_low, stats.clip_frac_high) == pytest.approx((1 / 3, 1 / 3))


def test_cispo_default_has_no_lower_bound():
    """clip_low 1 (the paper's, and the cispo preset's): row 1's weight stays 0.5, its gradient 2 * 0.5 / 3."""
    _, grad, stats = _grad("cispo", CISPO_LOGP, CISPO_OLD, CISPO_ADV, CISPO_MASK, agg="token_mean",
                           clip_low=1.0, clip_high=0.28)
    torch.testing.assert_close(grad, torch.tensor([[-1.28 / 3, -0.8 / 3, 0.0], [1.0 / 3, 0.0, 0.0]], dtype=F64),
                               rtol=0, atol=1e-12)
    assert stats.clip_frac_low == 0.0


# --- the mask reaches the loss; a plugin written before it still works -------------------------------------


def test_a_policy_loss_without_a_mask_parameter_is_called_without_it(monkeypatch):
    calls = []

    def strict(logp, old_logp, advantages, clip_low, clip_high, dual_clip):  # the pre-mask contract, no **_
        calls.append((clip_low, clip_high, dual_clip))
        loss = -advantages.unsqueeze(-1) * torch.exp(logp - old_logp)
        never = torch.zeros_like(loss, dtype=torch.bool)
        return loss, never, never

    registry = POLICY_LOSSES.copy()
    registry.register("strict", strict)
    monkeypatch.setattr("rlvr.algorithms.losses.POLICY_LOSSES", registry)
    logp = torch.zeros(1, 2)
    loss, _ = policy_loss(logp, logp, torch.tensor([3.0]), torch.ones(1, 2), loss="strict", agg="token_mean")
    assert loss.item() == pytest.approx(-3.0) and calls == [(0.2, 0.2, None)]


# --- sapo ------------------------------------------------------------------------------------------------
# Row 0 (A = +1, tau_pos 1): ratios 0.5 / 0.25 = 2 and 1 (on-policy). Row 1 (A = -2, tau_neg 1.05): ratio 0.5.
# f(rho) = 4 / tau * sigmoid(tau (rho - 1)); l = -f A; d l / d logp = -A * 4 s (1 - s) * rho, s = sigmoid(tau (rho - 1)).
SAPO_LOGP = torch.tensor([[LN(0.5), LN(0.3)], [LN(0.2), 0.0]], dtype=F64)
SAPO_OLD = torch.tensor([[LN(0.25), LN(0.3)], [LN(0.4), 0.0]], dtype=F64)
SAPO_MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=F64)
SAPO_ADV = torch.tensor([1.0, -2.0], dtype=F64)


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def test_sapo_soft_gate_value_and_gradient_by_hand():
    s_far, s_neg = _sigmoid(1.0), _sigmoid(1.05 * (0.5 - 1.0))
    values = [-4 * s_far, -4 * 0.5, 2 * 4 / 1.05 * s_neg]
    grads = [-4 * s_far * (1 - s_far) * 2, -1.0, 2 * 4 * s_neg * (1 - s_neg) * 0.5]
    loss, grad, stats = _grad("sapo", SAPO_LOGP, SAPO_OLD, SAPO_ADV, SAPO_MASK, agg="token_mean")
    assert loss.item() == pytest.approx(sum(values) / 3, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[grads[0] / 3, grads[1] / 3], [grads[2] / 3, 0.0]], dtype=F64),
                               rtol=0, atol=1e-12)
    assert stats.capped_frac == 0.0 and stats.ratio_max == pytest.approx(2.0)  # a soft gate stops no token


def test_on_policy_sapo_gradient_is_ppo_clips():
    """At rho = 1 the gate's gradient weight is 4 * 1/2 * 1/2 * 1 = 1 for either temperature: REINFORCE's."""
    logp, _, adv, mask = _random_batch(3)
    for agg in ("seq_mean_token_mean", "token_mean"):
        _, ppo_grad, _ = _grad("ppo_clip", logp, logp, adv, mask, agg=agg)
        _, grad, _ = _grad("sapo", logp, logp, adv, mask, agg=agg)
        torch.testing.assert_close(grad, ppo_grad, rtol=1e-14, atol=1e-16)


# --- gmpo ------------------------------------------------------------------------------------------------
# Row 0 (A = +1): log-ratios (0.1, 0.6, -0.7): 0.6 is clipped to 0.4 (A > 0, above), -0.7 is kept (min with A > 0
# never clips below): mean c0 = -0.2 / 3, l0 = -e^{c0}. Row 1 (A = -1): (-0.5, 0.2, padding 3.0): -0.5 is clipped
# to -0.4 (A < 0, below): mean c1 = -0.1, l1 = +e^{-0.1}. seq_mean_token_mean: (l0 + l1) / 2; the unclipped tokens'
# gradient is -A e^{c_i} / |o_i| / 2: row 0 tokens 0 and 2 -e^{c0} / 6, row 1 token 1 +e^{-0.1} / 4.
GMPO_OLD = torch.zeros(2, 3, dtype=F64)
GMPO_LOGP = torch.tensor([[0.1, 0.6, -0.7], [-0.5, 0.2, 3.0]], dtype=F64)
GMPO_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=F64)
GMPO_ADV = torch.tensor([1.0, -1.0], dtype=F64)


def test_gmpo_geometric_mean_of_log_clipped_ratios_by_hand():
    c0 = math.exp(-0.2 / 3)
    loss_t, low, high = POLICY_LOSSES["gmpo"](GMPO_LOGP, GMPO_OLD, GMPO_ADV, mask=GMPO_MASK, clip_low=0.4,
                                              clip_high=0.4)
    assert high.tolist() == [[False, True, False], [False, False, False]]
    assert low.tolist() == [[False, False, False], [True, False, False]]
    loss, grad, stats = _grad("gmpo", GMPO_LOGP, GMPO_OLD, GMPO_ADV, GMPO_MASK, clip_low=0.4, clip_high=0.4)
    assert loss.item() == pytest.approx((-c0 + math.exp(-0.1)) / 2, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[-c0 / 6, 0.0, -c0 / 6], [0.0, math.exp(-0.1) / 4, 0.0]],
                                                  dtype=F64), rtol=0, atol=1e-12)
    assert stats.capped_frac == pytest.approx(2 / 5) and stats.seq_clip_frac == 0.0


# --- clip_cov, kl_cov ------------------------------------------------------------------------------------
# Four tokens, A = (2, 2 | -2, -2): mean A 0; logp (-0.1, -3.0 | -0.2, -0.3), mean -0.9. Centred products:
# (1.6, -4.2 | -1.4, -1.2). Only token (0, 0) lies in Clip-Cov's (1, 5), and it is also KL-Cov's top-1
# (max(1, int(ratio * 4)) = 1 token for both).
COV_LOGP = torch.tensor([[-0.1, -3.0], [-0.2, -0.3]], dtype=F64)
COV_MASK = torch.ones(2, 2, dtype=F64)
COV_ADV = torch.tensor([2.0, -2.0], dtype=F64)


def test_clip_cov_stops_the_gradient_of_the_high_covariance_token_by_hand():
    """On-policy ppo_clip gives each token -A / 4 (token_mean); Clip-Cov zeroes token (0, 0)'s loss and gradient."""
    loss, grad, stats = _grad("clip_cov", COV_LOGP, COV_LOGP, COV_ADV, COV_MASK, agg="token_mean")
    assert loss.item() == pytest.approx((0.0 - 2.0 + 2.0 + 2.0) / 4, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.5], [0.5, 0.5]], dtype=F64), rtol=0, atol=1e-12)
    assert stats.clip_frac_high == 0.25 and stats.clip_frac_low == 0.0


def test_kl_cov_penalises_the_top_covariance_token_by_hand():
    """Token (0, 0) off-policy by log-ratio 0.1: l = -2 e^{0.1} + 1 * |0.1|, gradient -2 e^{0.1} + 1; the other
    three are on-policy, l = -A, gradient -A; token_mean over 4."""
    old = COV_LOGP.clone()
    old[0, 0] -= 0.1
    loss, grad, stats = _grad("kl_cov", COV_LOGP, old, COV_ADV, COV_MASK, agg="token_mean")
    assert loss.item() == pytest.approx((-2 * math.exp(0.1) + 0.1 - 2.0 + 2.0 + 2.0) / 4, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[(-2 * math.exp(0.1) + 1) / 4, -0.5], [0.5, 0.5]], dtype=F64),
                               rtol=0, atol=1e-12)
    assert stats.clip_frac_high == 0.25


# --- the importance-weight and sequence-level metrics -----------------------------------------------------


def test_stats_ratio_max_capped_and_sequence_clip_fractions():
    """The gspo batch: the largest real token ratio is e^{2e-4} (padding's e^5 does not count), 3 of 5 tokens are
    capped (all of row 1), and 1 of 2 sequences is clipped whole."""
    _, _, stats = _grad("gspo", GSPO_LOGP, GSPO_OLD, GSPO_ADV, GSPO_MASK, **PAPER_CLIP)
    assert stats.ratio_max == pytest.approx(math.exp(2e-4), abs=1e-12)
    assert stats.capped_frac == pytest.approx(3 / 5) and stats.seq_clip_frac == 0.5
    _, _, token_stats = _grad("cispo", CISPO_LOGP, CISPO_OLD, CISPO_ADV, CISPO_MASK, clip_low=0.3, clip_high=0.28)
    assert token_stats.capped_frac == pytest.approx(2 / 3) and token_stats.seq_clip_frac == 0.5  # row 1: one token, capped


def test_gspo_dual_clip_fraction_counts_sequence_ratios():
    """Row 1 (A = -1): token ratios (e^2, e^-2), sequence ratio e^0 = 1. ppo_clip's dual clip (3) binds the
    first token; GSPO's compares the sequence ratio, which is below 3, so no token counts. Row 0 (A = -1)
    has token ratios (e^1.5, e^1.5): sequence ratio e^1.5 = 4.48 > 3, both its tokens count for both."""
    old = torch.zeros(2, 2, dtype=F64)
    logp = torch.tensor([[1.5, 1.5], [2.0, -2.0]], dtype=F64)
    mask, adv = torch.ones(2, 2, dtype=F64), torch.tensor([-1.0, -1.0], dtype=F64)
    _, _, token = _grad("ppo_clip", logp, old, adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    _, _, sequence = _grad("gspo", logp, old, adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    _, _, ignored = _grad("cispo", logp, old, adv, mask, clip_low=1.0, clip_high=0.28, dual_clip=3.0)
    assert token.dual_clip_frac == pytest.approx(3 / 4)
    assert sequence.dual_clip_frac == pytest.approx(2 / 4)
    assert ignored.dual_clip_frac == 0.0  # cispo ignores the dual clip


def test_loss_options_reach_the_loss_and_are_checked_by_name_and_value():
    """algorithm.loss_options: SAPO's temperature changes the gate (tau_pos 2 at rho = 2: 4/2 sigmoid(2));
    a misspelt option, an option of another loss and a bad value are refused when the config loads."""
    from rlvr.config import ConfigError, RunConfig, build_config

    logp, old = torch.tensor([[LN(2.0)]], dtype=F64), torch.zeros(1, 1, dtype=F64)
    loss, _ = policy_loss(logp, old, torch.tensor([1.0], dtype=F64), torch.ones(1, 1, dtype=F64), loss="sapo",
                          agg="token_mean", options={"tau_pos": 2.0})
    assert loss.item() == pytest.approx(-4 / 2 * _sigmoid(2.0), abs=1e-12)
    base = {"model": {"path": "unused"}, "data": [{"task": "arithmetic"}]}
    config = build_config(RunConfig, base, ["algorithm.policy_loss=kl_cov", "algorithm.loss_options={ratio: 0.01, coef: 0.5}"])
    assert config.algorithm.loss_options == {"ratio": 0.01, "coef": 0.5}
    for overrides, message in [
        (["algorithm.policy_loss=sapo", "algorithm.loss_options={tau_poss: 2}"], "has no option.*tau_poss.*tau_pos, tau_neg"),
        (["algorithm.loss_options={ratio: 0.01}"], "policy loss 'ppo_clip' has no option"),
        (["algorithm.policy_loss=sapo", "algorithm.loss_options={tau_neg: 0}"], "must be > 0"),
        (["algorithm.policy_loss=clip_cov", "algorithm.loss_options={cov_low: 5, cov_high: 1}"], "cov_low < cov_high"),
    ]:
        with pytest.raises(ConfigError, match=f"algorithm.loss_options: .*{message}"):
            build_config(RunConfig, base, overrides)
