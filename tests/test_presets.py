"""What makes each preset that preset, against values written out by hand (not read back from PRESETS):
its config, its advantage estimator (through the registry the recipe reads), and the loss one
micro-batch gets in the recipe's own ``policy_terms`` (aggregation, clip range, KL placement and
estimator, entropy bonus)."""

import math

import pytest
import torch

from rlvr.algorithms.advantages import ADVANTAGE_ESTIMATORS, gae
from rlvr.config import RunConfig, build_config
from rlvr.recipes import update
from rlvr.recipes.update import UpdateSettings, global_counts, policy_terms
from rlvr.rollout.batch import Batch

BASE = {"model": {"path": "some/model"}}

# The table of rlvr/config/run.py's docstring, written out again by hand.
EXPECTED = {
    "grpo": dict(advantage="grpo", policy_loss="ppo_clip", loss_agg="seq_mean_token_mean", clip_low=0.2, clip_high=0.2,
                 beta=0.04, kl_estimator="k3", kl_placement="loss", dynamic_sampling=False, overlong="none",
                 ppo_epochs=1, minibatches=1),
    "dr_grpo": dict(advantage="dr_grpo", policy_loss="ppo_clip", loss_agg="seq_mean_token_sum_norm", clip_low=0.2,
                    clip_high=0.2, beta=0.0, dynamic_sampling=False, overlong="none", ppo_epochs=1, minibatches=1),
    "dapo": dict(advantage="grpo", policy_loss="ppo_clip", loss_agg="token_mean", clip_low=0.2, clip_high=0.28,
                 beta=0.0, dynamic_sampling=True, overlong="soft", ppo_epochs=1, minibatches=1),
    "rloo": dict(advantage="rloo", policy_loss="ppo_clip", loss_agg="token_mean", clip_low=0.2, clip_high=0.2,
                 beta=0.05, kl_estimator="k1", kl_placement="reward", dynamic_sampling=False, overlong="none"),
    "reinforce_pp": dict(advantage="reinforce_pp", policy_loss="ppo_clip", loss_agg="token_mean", clip_low=0.2,
                         clip_high=0.2, beta=0.01, kl_estimator="k1", kl_placement="reward", dynamic_sampling=False),
    "gspo": dict(advantage="grpo", policy_loss="gspo", loss_agg="seq_mean_token_mean", clip_low=3e-4, clip_high=4e-4,
                 beta=0.0, dynamic_sampling=False, overlong="none", ppo_epochs=1, minibatches=1),
    "cispo": dict(advantage="grpo", policy_loss="cispo", loss_agg="token_mean", clip_low=1.0, clip_high=0.28,
                  beta=0.0, dynamic_sampling=False, overlong="none", ppo_epochs=1, minibatches=1),
    "gmpo": dict(advantage="grpo", policy_loss="gmpo", loss_agg="seq_mean_token_mean", clip_low=0.4, clip_high=0.4,
                 beta=0.0, dynamic_sampling=False, overlong="none", ppo_epochs=1, minibatches=1),
    "ppo": dict(advantage="gae", policy_loss="ppo_clip", loss_agg="token_mean", clip_low=0.2, clip_high=0.2, beta=0.05,
                kl_estimator="k1", kl_placement="reward", ppo_epochs=4, minibatches=4, lam=0.95, gamma=1.0,
                value_clip=0.2, whiten_advantages=True),
    "reinforce_baseline": dict(advantage="gae", policy_loss="vanilla", loss_agg="token_mean", beta=0.05,
                               kl_estimator="k1", kl_placement="reward", ppo_epochs=1, minibatches=1, lam=1.0,
                               gamma=1.0, value_clip=None),
}


def _algorithm(preset, *overrides):
    return build_config(RunConfig, BASE, [f"algorithm.preset={preset}", *overrides]).algorithm


@pytest.mark.parametrize("preset", sorted(EXPECTED))
def test_preset_config_is_the_documented_recipe(preset):
    a = _algorithm(preset)
    assert {key: getattr(a, key) for key in EXPECTED[preset]} == EXPECTED[preset]


# --- advantages: the estimator each critic-free preset names, through the recipe's registry ---------

# Two groups of four. Group 1 [1, 0, 0, 0]: mean 0.25, deviations (0.75, -0.25, -0.25, -0.25), unbiased
# variance 0.75 / 3 = 0.25, std 0.5. Group 2 [1, 1, 0, 1]: mean 0.75, deviations (0.25, 0.25, -0.75, 0.25),
# std 0.5. The batch: mean 0.5, deviations +-0.5, unbiased variance 8 * 0.25 / 7 = 2/7.
REWARDS = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0]])
_Z = 0.5 / math.sqrt(2 / 7)  # 0.935414
ADVANTAGES = {
    "grpo": [[1.5, -0.5, -0.5, -0.5], [0.5, 0.5, -1.5, 0.5]],  # deviation / group std
    "dr_grpo": [[0.75, -0.25, -0.25, -0.25], [0.25, 0.25, -0.75, 0.25]],  # deviation only
    "dapo": [[1.5, -0.5, -0.5, -0.5], [0.5, 0.5, -1.5, 0.5]],  # GRPO's
    "gspo": [[1.5, -0.5, -0.5, -0.5], [0.5, 0.5, -1.5, 0.5]],  # GRPO's
    "cispo": [[1.5, -0.5, -0.5, -0.5], [0.5, 0.5, -1.5, 0.5]],  # GRPO's
    "gmpo": [[1.5, -0.5, -0.5, -0.5], [0.5, 0.5, -1.5, 0.5]],  # GRPO's
    "rloo": [[1.0, -1 / 3, -1 / 3, -1 / 3], [1 / 3, 1 / 3, -1.0, 1 / 3]],  # r_i - mean of the other three
    "reinforce_pp": [[_Z, -_Z, -_Z, -_Z], [_Z, _Z, -_Z, _Z]],  # (r - 0.5) / batch std
}


@pytest.mark.parametrize("preset", sorted(ADVANTAGES))
def test_preset_advantages_by_hand(preset):
    estimator = ADVANTAGE_ESTIMATORS[_algorithm(preset).advantage]
    torch.testing.assert_close(estimator(REWARDS, torch.ones_like(REWARDS, dtype=torch.bool)),
                               torch.tensor(ADVANTAGES[preset]), atol=1e-5, rtol=1e-5)


def test_an_invalid_sample_is_outside_every_statistic():
    """A masked sample (failed verification) gets 0 and changes no other sample's advantage."""
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0, 55.0], [1.0, 1.0, 0.0, 1.0, -9.0]])
    valid = torch.ones_like(rewards, dtype=torch.bool)
    valid[:, 4] = False
    for name, expected in ADVANTAGES.items():
        out = ADVANTAGE_ESTIMATORS[_algorithm(name).advantage](rewards, valid)
        torch.testing.assert_close(out[:, :4], torch.tensor(expected), atol=1e-5, rtol=1e-5, msg=name)
        assert (out[:, 4] == 0).all(), name


@pytest.mark.parametrize("preset, expected", [
    # r = (0, 0, 1) on three real tokens, V = (0.5, 0.5, 0.5), gamma 1:
    # deltas (0, 0, 0.5); lambda 1 (reinforce_baseline): A = return - V = (0.5, 0.5, 0.5);
    # lambda 0.95 (ppo): A2 = 0.5, A1 = 0.475, A0 = 0.45125
    ("ppo", [0.45125, 0.475, 0.5]),
    ("reinforce_baseline", [0.5, 0.5, 0.5]),
])
def test_critic_preset_gae_by_hand(preset, expected):
    a = _algorithm(preset)
    adv, ret = gae(torch.tensor([[0.0, 0.0, 1.0]]), torch.full((1, 3), 0.5), torch.ones(1, 3), gamma=a.gamma, lam=a.lam)
    torch.testing.assert_close(adv, torch.tensor([expected]))
    torch.testing.assert_close(ret, torch.tensor([expected]) + 0.5)


# --- the loss of one micro-batch, as the recipe computes it ------------------------------------------

# Two rows: row 0 has A = +1 and 2 real tokens, row 1 has A = -1 and 1 real token (T = 3, L_max = 8).
# Ratios pi/pi_old on real tokens: row 0 (1.25, 1.0), row 1 (0.7); padding holds ratio 3 and a
# reference that disagrees, so any padding that leaks in changes the numbers.
#   ppo_clip, clip 0.2/0.2:   row 0 (-min(1.25, 1.2), -1) = (-1.2, -1.0); row 1 max(0.7, 0.8) = 0.8
#   ppo_clip, clip 0.2/0.28:  row 0 (-1.25, -1.0); row 1 0.8
#   vanilla (unclipped):      row 0 (-1.25, -1.0); row 1 0.7
# Reference pi_ref / pi on real tokens: row 0 (2, 1), row 1 0.25:
#   k3 = x - ln x - 1:  (1 - ln 2 = 0.306853, 0), (0.25 + ln 4 - 1 = 0.636294)
#   k1 = -ln x:         (-ln 2, 0), (ln 4)
LN = math.log
LOGP = [[LN(0.5), LN(0.5), LN(0.9)], [LN(0.35), LN(0.9), LN(0.9)]]
OLD = [[LN(0.4), LN(0.5), LN(0.3)], [LN(0.5), LN(0.3), LN(0.3)]]
REF = [[LN(1.0), LN(0.5), LN(0.1)], [LN(0.0875), LN(0.1), LN(0.1)]]
ENTROPY = [[1.0, 2.0, 9.0], [0.5, 9.0, 9.0]]
MASK = [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
K3 = (1 - LN(2), 0.0, 0.25 + LN(4) - 1)
K1 = (-LN(2), 0.0, LN(4))

# loss = policy loss aggregated [+ beta * KL aggregated the same way, only with KL in the loss]
#   grpo           seq_mean_token_mean: ((-1.2 - 1.0) / 2 + 0.8) / 2 = -0.15
#                  + 0.04 * ((0.306853 + 0) / 2 + 0.636294) / 2 = 0.04 * 0.394860 = 0.0157944
#   dr_grpo        seq_mean_token_sum_norm: ((-1.2 - 1.0) / 8 + 0.8 / 8) / 2 = -0.0875
#   dapo           token_mean, clip-higher: (-1.25 - 1.0 + 0.8) / 3
#   rloo, reinforce_pp, ppo   token_mean: (-1.2 - 1.0 + 0.8) / 3; their KL is in the reward, not here
#   reinforce_baseline        vanilla, token_mean: (-1.25 - 1.0 + 0.7) / 3
#   gspo           one ratio per sequence, the geometric mean: row 0 sqrt(1.25 * 1.0) = 1.118 > 1 + 4e-4 with
#                  A > 0, row 1 0.7 < 1 - 3e-4 with A < 0: both clipped, ((-1.0004) + 0.9997) / 2 = -0.00035
#   cispo          token_mean of -w A logp, w = clip(rho, 0, 1.28) = (1.25, 1.0), (0.7):
#                  (-1.25 ln 0.5 - ln 0.5 + 0.7 ln 0.35) / 3
#   gmpo           log-ratios within (-0.4, 0.4): row 0 exp((ln 1.25 + 0) / 2) = sqrt(1.25), row 1 0.7:
#                  seq_mean_token_mean (-sqrt(1.25) + 0.7) / 2
LOSSES = {
    "grpo": -0.15 + 0.04 * ((K3[0] + K3[1]) / 2 + K3[2]) / 2,
    "dr_grpo": -0.0875,
    "dapo": -1.45 / 3,
    "rloo": -1.4 / 3,
    "reinforce_pp": -1.4 / 3,
    "ppo": -1.4 / 3,
    "reinforce_baseline": -1.55 / 3,
    "gspo": (-1.0004 + 0.9997) / 2,
    "cispo": (-1.25 * math.log(0.5) - math.log(0.5) + 0.7 * math.log(0.35)) / 3,
    "gmpo": (-math.sqrt(1.25) + 0.7) / 2,
}


class _FixedLogprobs:
    """Stands in for the policy: completion_logprobs returns these tensors (a leaf with gradient)."""

    def __init__(self):
        self.logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
        self.entropy = torch.tensor(ENTROPY, dtype=torch.float64, requires_grad=True)


@pytest.fixture
def fixed_logprobs(monkeypatch):
    def completion_logprobs(policy, input_ids, attention_mask, completion_len, temperature=1.0, with_entropy=False,
                            entropy_grad=False):
        assert completion_len == 3 and len(input_ids) == 2
        return policy.logp, (policy.entropy if entropy_grad else policy.entropy.detach())

    monkeypatch.setattr(update, "completion_logprobs", completion_logprobs)
    return _FixedLogprobs()


def _micro(with_ref: bool) -> Batch:
    ids = torch.zeros(2, 4, dtype=torch.long)
    return Batch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=torch.tensor(MASK, dtype=torch.float64),
                 engine_logp=torch.tensor(OLD, dtype=torch.float64), advantages=torch.tensor([1.0, -1.0], dtype=torch.float64),
                 old_logp=torch.tensor(OLD, dtype=torch.float64),
                 ref_logp=torch.tensor(REF, dtype=torch.float64) if with_ref else None)


def _terms(policy, preset, *overrides):
    # ppo_epochs 2: pi_old is the batch's old_logp (a single pass would make every ratio 1)
    config = build_config(RunConfig, BASE, [f"algorithm.preset={preset}", "algorithm.ppo_epochs=2",
                                            "generation.max_new_tokens=8", *overrides])
    s = UpdateSettings.from_config(config)
    micro = _micro(with_ref=config.algorithm.beta > 0)  # the recipes take reference log-probs exactly then
    return policy_terms(policy, micro, s, **global_counts(micro, s.dist)), config.algorithm


@pytest.mark.parametrize("preset", sorted(LOSSES))
def test_preset_loss_of_one_micro_batch_by_hand(fixed_logprobs, preset):
    out, algo = _terms(fixed_logprobs, preset)
    assert out.loss.item() == pytest.approx(LOSSES[preset], abs=1e-9)
    if algo.beta > 0:  # the KL metric uses the preset's estimator, whatever its placement
        kl = K3 if algo.kl_estimator == "k3" else K1
        assert out.terms["train/kl_ref"] == pytest.approx(sum(kl) / 3, abs=1e-9)
    else:
        assert "train/kl_ref" not in out.terms
    assert out.terms["train/entropy"] == pytest.approx((1.0 + 2.0 + 0.5) / 3)


def test_the_kl_in_the_loss_pulls_towards_the_reference(fixed_logprobs):
    """d(beta * KL)/d logp: k3' = 1 - pi_ref/pi per token, aggregated seq_mean_token_mean (grpo)."""
    out, _ = _terms(fixed_logprobs, "grpo", "algorithm.clip_high=10", "algorithm.clip_low=0.9")  # no clipping
    out.loss.backward()
    # policy part: -A * rho / |o_i| / 2 -> row 0: -(1.25, 1.0) / 4, row 1: 0.7 / 2
    # KL part: 0.04 * (1 - x) / |o_i| / 2 -> row 0: 0.04 * (-1, 0) / 4, row 1: 0.04 * 0.75 / 2
    expected = torch.tensor([[-1.25 / 4 - 0.01, -1.0 / 4, 0.0], [0.35 + 0.015, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(fixed_logprobs.logp.grad, expected)


def test_entropy_bonus_is_subtracted(fixed_logprobs):
    # dr_grpo (beta 0) with a bonus: -0.0875 - 0.01 * seq_mean_token_sum_norm(entropy) = -0.0875 - 0.01 * (3/8 + 0.5/8) / 2
    out, _ = _terms(fixed_logprobs, "dr_grpo", "algorithm.entropy_coef=0.01")
    assert out.loss.item() == pytest.approx(-0.0875 - 0.01 * (3.0 / 8 + 0.5 / 8) / 2, abs=1e-9)
    out.loss.backward()
    assert fixed_logprobs.entropy.grad[0, 0].item() == pytest.approx(-0.01 / 8 / 2)  # raising entropy lowers the loss
    assert fixed_logprobs.entropy.grad[0, 2].item() == 0.0  # padding


def test_policy_terms_report_the_importance_weight_metrics(fixed_logprobs):
    """gspo on the micro-batch above: real-token ratios (1.25, 1.0), (0.7) (padding's 3 does not count); both
    sequences are clipped whole, so every token is capped."""
    out, _ = _terms(fixed_logprobs, "gspo")
    assert out.terms["train/ratio_max"] == pytest.approx(1.25)
    assert out.terms["train/capped_frac"] == 1.0 and out.terms["train/seq_clip_frac"] == 1.0


def test_step_metrics_keep_the_largest_ratio_and_average_the_rest():
    means = update.TokenMeans()
    means.add({"train/ratio_max": 2.0, "train/capped_frac": 1.0}, 1.0)
    means.add({"train/ratio_max": 1.5, "train/capped_frac": 3.0}, 3.0)
    assert means.means() == {"train/ratio_max": 2.0, "train/capped_frac": 2.5}
