"""The engine-trainer mismatch is corrected by default (issue 44): ``algorithm.off_policy: auto``
picks truncated importance sampling whenever the engine's log-probs are not the trainer's own
forward in the same precision, and ``mismatch/kl`` is logged every step.

Three levels: which correction ``auto`` resolves to for each engine / dtype / staleness; that the
correction makes the policy gradient of samples drawn by a *different* policy an estimate of the
trainer's own (a categorical policy, exact expectations); and a real run whose engine reports
log-probs shifted by a known amount, where every logged number is computed by hand.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlvr import engines
from rlvr.algorithms.losses import policy_loss
from rlvr.algorithms.off_policy import OFF_POLICY_CORRECTIONS
from rlvr.config import RunConfig, build_config
from rlvr.engines import HFEngine
from rlvr.recipes.update import UpdateSettings, engine_is_exact, resolve_off_policy

BASE = {"model": {"path": "unused"}, "data": [{"task": "arithmetic"}]}


@pytest.mark.parametrize("overrides, expected", [
    ([], "none"),  # the HF engine in float32, synchronous: its log-probs are the trainer's
    (["engine.name=vllm"], "token_tis"),  # vLLM's kernels
    (["model.dtype=bfloat16"], "token_tis"),  # half-precision decoding against float32 master weights
    (["async_generation.max_staleness=1"], "decoupled"),  # an older policy sampled
    (["engine.name=vllm", "algorithm.off_policy=none"], "none"),  # an explicit choice is kept
    (["algorithm.off_policy=seq_mask"], "seq_mask"),
])
def test_auto_corrects_exactly_when_the_engine_is_not_the_trainer(overrides, expected):
    config = build_config(RunConfig, BASE, overrides)
    assert config.algorithm.off_policy == next((o.split("=")[1] for o in overrides if "off_policy" in o), "auto")
    assert resolve_off_policy(config) == expected
    settings = UpdateSettings.from_config(config)
    assert settings.off_policy == expected
    assert settings.old_logprobs == ("engine" if engine_is_exact(config) else "recompute")


def test_truncated_importance_weights_turn_another_policy_s_samples_into_the_trainer_s_gradient():
    """Tokens drawn from a perturbed engine distribution q, scored by the trainer's p: the plain loss's
    expected gradient is E_q[-A grad log p] (biased); with token_tis weights min(p/q, C) it is
    E_p[-A grad log p], the on-policy gradient, whenever p/q <= C. Expectations are exact sums over
    the vocabulary, each token weighted by its engine probability."""
    torch.manual_seed(0)
    vocab = 6
    theta = torch.randn(vocab, dtype=torch.float64)
    engine_logits = theta + 0.5 * torch.randn(vocab, dtype=torch.float64)  # the engine's numerics differ
    q = engine_logits.softmax(0)
    p = theta.softmax(0)
    assert float((p / q).max()) < 2.0  # within the cap: TIS is exact in expectation
    advantage = torch.randn(vocab, dtype=torch.float64)

    def expected_gradient(correction: str) -> torch.Tensor:
        """sum_x q(x) * grad of the loss of one sampled token x: one row per vocabulary entry, the
        engine's probability q(x) folded into the weights, the aggregation a plain sum."""
        params = theta.clone().requires_grad_(True)
        tokens = params.log_softmax(0)[:, None]  # [V, 1]: the trainer's log-prob of each possible token
        mask = torch.ones(vocab, 1, dtype=torch.float64)
        weights, kept = OFF_POLICY_CORRECTIONS.get(correction)(tokens.detach(), q.log()[:, None], mask, cap=2.0)
        loss, _ = policy_loss(tokens, tokens.detach(), advantage, mask * kept.to(mask.dtype), agg="token_mean",
                              num_tokens=1.0, token_weights=weights.to(torch.float64) * q[:, None])
        (grad,) = torch.autograd.grad(loss, params)
        return grad

    params = theta.clone().requires_grad_(True)
    on_policy = torch.autograd.grad(-(params.softmax(0) * advantage).sum(), params)[0]  # grad of -E_p[A]
    plain, corrected = expected_gradient("none"), expected_gradient("token_tis")
    assert torch.allclose(corrected, on_policy, atol=1e-12)
    assert (plain - on_policy).norm() > 0.05 * on_policy.norm()  # the uncorrected estimate is biased


def test_the_policy_loss_applies_the_weights_the_correction_returns():
    """What the test above assumes of ``policy_loss``: each token's loss is scaled by its weight before
    the aggregation (a sum over tokens here), with gradient -A * w * grad log p per token."""
    logp = torch.tensor([[-1.0], [-2.0], [-0.5]], requires_grad=True)
    engine = torch.tensor([[-1.3], [-1.0], [-0.5]])
    weights, _ = OFF_POLICY_CORRECTIONS.get("token_tis")(logp.detach(), engine, torch.ones(3, 1), cap=2.0)
    assert torch.allclose(weights.squeeze(1), torch.tensor([math.exp(0.3), math.exp(-1.0), 1.0]))
    advantages = torch.tensor([1.0, -2.0, 0.5])
    loss, _ = policy_loss(logp, logp.detach(), advantages, torch.ones(3, 1), agg="token_mean", num_tokens=1.0,
                          token_weights=weights)
    loss.backward()
    assert torch.allclose(logp.grad.squeeze(1), -advantages * weights.squeeze(1))


class ShiftedEngine(HFEngine):
    """The HF engine reporting every sampled token's log-prob 0.3 nats *below* the trainer's: an engine
    whose numerics differ from the trainer's by a known amount (no weights of its own: no canary)."""

    SHIFT = 0.3

    def generate(self, prompts, n, sampling):
        groups = super().generate(prompts, n, sampling)
        for group in groups:
            for completion in group:
                completion.logprobs = [lp - self.SHIFT for lp in completion.logprobs]
        return groups


def test_a_run_with_a_mismatched_engine_is_corrected_and_logs_the_mismatch(tiny_model, tmp_path, monkeypatch):
    """rho = pi_trainer / pi_engine = e^0.3 on every token: auto weights each token by e^0.3 (under the
    cap 2), so the gradient is e^0.3 times the uncorrected one, and mismatch/kl = e^0.3 - 1 - 0.3."""
    from rlvr.recipes import grpo

    registry = engines.ENGINES.copy()
    registry.register("shifted")(ShiftedEngine)
    monkeypatch.setattr(engines, "ENGINES", registry)

    def first_step(name: str, off_policy: str) -> dict:
        grpo.train(build_config(RunConfig, {
            "out": str(tmp_path / name), "model": {"path": str(tiny_model)},
            "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
            "verifier": {"name": "repetition", "options": {"n": 1, "unit": "chars"}},  # rewards that vary
            "engine": {"name": "shifted"}, "generation": {"max_new_tokens": 8},
            "algorithm": {"preset": "grpo", "beta": 0.0, "off_policy": off_policy},
            "optim": {"grad_clip": 1e6},
            "train": {"steps": 1, "prompts_per_step": 4, "group_size": 4, "threads": 1},
            "eval": {"at_start": False, "at_end": False}, "log": {"progress": False, "plot_every": 0},
        }))
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines if "train/grad_norm" in json.loads(line)][0]

    corrected, plain = first_step("auto", "auto"), first_step("none", "none")
    shift = ShiftedEngine.SHIFT
    for step in (corrected, plain):  # the mismatch is measured whatever the correction
        assert step["mismatch/logprob_abs_diff_mean"] == pytest.approx(shift, abs=1e-4)
        assert step["mismatch/kl"] == pytest.approx(math.exp(shift) - 1 - shift, abs=1e-4)
    assert corrected["train/off_policy_weight_mean"] == pytest.approx(math.exp(shift), abs=1e-4)
    assert corrected["train/off_policy_kept_frac"] == 1.0
    assert "train/off_policy_weight_mean" not in plain
    assert plain["train/grad_norm"] > 0
    assert corrected["train/grad_norm"] == pytest.approx(math.exp(shift) * plain["train/grad_norm"], rel=1e-4)


def test_a_soft_overlong_ramp_over_most_of_the_budget_is_warned_about():
    """The dapo preset on the quickstart's 5-token answers (buffer 4) punished every 4-digit sum and
    collapsed; a buffer under half the budget, or no soft punishment, is quiet."""
    from rlvr.recipes.update import overlong_warning

    dapo = build_config(RunConfig, BASE, ["algorithm.preset=dapo", "generation.max_new_tokens=5"])
    warning = overlong_warning(dapo, 5)
    assert "longer than 1 of its 5 tokens" in warning and "algorithm.overlong: none" in warning
    assert overlong_warning(build_config(RunConfig, BASE, ["algorithm.preset=dapo", "generation.max_new_tokens=64"]),
                            64) is None
    assert overlong_warning(build_config(RunConfig, BASE, ["generation.max_new_tokens=5"]), 5) is None
