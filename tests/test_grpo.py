"""End-to-end runs of the GRPO-family recipe on the tiny model (seconds each)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from rlvr.recipes import grpo
from rlvr.recipes.update import resolve_off_policy
from rlvr.config import RunConfig, build_config
from rlvr.run.tracking import read_metrics
from rlvr.verifiers import Reward, register_verifier


def _config(model, out, *overrides):
    raw = {
        "out": str(out),
        "model": {"path": str(model)},
        "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
        "generation": {"max_new_tokens": 3},
        "optim": {"lr": 1e-3},
        "train": {"steps": 3, "prompts_per_step": 8, "group_size": 4, "micro_batch_size": 16},
        "eval": {"limit": 9},
        "checkpoint": {"every": 0},
        "log": {"progress": False, "plot_every": 0},
    }
    return build_config(RunConfig, raw, list(overrides))


def test_short_run_writes_the_whole_run_folder(taught_model, tmp_path):
    summary = grpo.train(_config(taught_model, tmp_path, "algorithm.preset=grpo", "algorithm.beta=0"))
    assert (tmp_path / "config.yaml").is_file() and (tmp_path / "metrics.png").stat().st_size > 10_000
    resolved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert resolved["optim"]["grad_clip"] == 1.0 and resolved["algorithm"]["kl_estimator"] == "k3"
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3]  # eval at start, 3 steps; one line per step
    assert "eval/accuracy" in records[-1] and "train/loss" in records[-1]  # the final eval joins the last step
    step = records[1]
    for key in ["reward/mean", "reward/std", "reward/accuracy", "train/entropy", "response/length_mean",
                "response/length_max", "response/truncation_rate", "train/clip_frac_low", "train/clip_frac_high",
                "rollout/zero_variance_frac", "verify/status_ok", "verify/latency_p50_ms", "perf/tokens_per_s",
                "time/generate", "time/verify", "time/update", "train/grad_norm", "train/lr"]:
        assert key in step, key
    assert step["mismatch/logprob_abs_diff_mean"] < 1e-4  # the engine samples with exactly the trained weights
    assert step["mismatch/logprob_abs_diff_max"] < 1e-4
    assert "sync/seconds" not in step  # the HF engine shares the module: no push, no canary
    assert step["train/ratio_mean"] == pytest.approx(1.0)  # one pass: pi_old is pi_theta
    assert "train/kl_ref" not in step  # beta = 0: no reference pass at all
    assert (tmp_path / "checkpoints" / "step_000003" / "trainer_state.pt").is_file()
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["steps"] == 3 and 0 <= written["accuracy_before"] <= 1 and 0 <= written["accuracy_after"] <= 1
    assert summary["accuracy_after"] == written["accuracy_after"]


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.preset=grpo"],  # k3 KL in the loss, beta 0.04
        ["algorithm.preset=dr_grpo"],
        ["algorithm.preset=dapo", "algorithm.overlong_buffer=1"],
        ["algorithm.preset=rloo"],  # k1 KL in the reward
        ["algorithm.preset=reinforce_pp", "algorithm.entropy_coef=0.01"],
        ["algorithm.ppo_epochs=2", "algorithm.minibatches=2", "algorithm.dual_clip=3", "algorithm.old_logprobs=recompute"],
        ["algorithm.ppo_epochs=2", "algorithm.old_logprobs=recompute", "algorithm.off_policy=decoupled"],
    ],
    ids=["grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "ppo_epochs", "decoupled"],
)
def test_presets_and_multi_pass_updates_run(taught_model, tmp_path, overrides):
    config = _config(taught_model, tmp_path, "train.steps=2", "eval.at_start=false", "eval.at_end=false", *overrides)
    grpo.train(config)
    steps = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "train/loss" in r]
    assert len(steps) == 2 and all(torch.isfinite(torch.tensor(r["train/loss"])) for r in steps)
    if config.algorithm.beta > 0:
        assert all(r["train/kl_ref"] >= -1e-6 for r in steps)
    # the KL's placement shows: a per-sequence KL in the reward only where the preset puts it there,
    # a reference pass only with beta > 0 (the values: tests/test_presets.py, tests/test_recipe_masks.py)
    kl_in_reward = config.algorithm.beta > 0 and config.algorithm.kl_placement == "reward"
    assert all(("reward/kl_seq_mean" in r) == kl_in_reward and ("train/kl_ref" in r) == (config.algorithm.beta > 0)
               for r in steps)
    if config.algorithm.ppo_epochs * config.algorithm.minibatches > 1:
        assert all(r["train/optimizer_steps"] == config.algorithm.ppo_epochs * config.algorithm.minibatches for r in steps)
        assert any(abs(r["train/ratio_mean"] - 1) > 1e-6 for r in steps)  # later minibatches are off-policy
    if resolve_off_policy(config) != "none":  # pi_old recomputed, the HF engine exact in float32: rho = 1
        assert all(r["train/off_policy_weight_mean"] == pytest.approx(1.0, abs=1e-4) for r in steps)
        assert all(r["train/off_policy_kept_frac"] == 1.0 for r in steps)


def test_lora_policy_uses_disabled_adapters_as_reference(taught_model, tmp_path):
    config = _config(taught_model, tmp_path, "model.lora.r=4", "model.lora.target_modules=[q_proj, v_proj]",
                     "algorithm.beta=0.1", "train.steps=2", "eval.at_start=false")
    grpo.train(config)
    first = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "train/kl_ref" in r][0]
    assert first["train/kl_ref"] == pytest.approx(0.0, abs=1e-6)  # LoRA B starts at zero: policy == reference
    assert (tmp_path / "final" / "adapter" / "adapter_config.json").is_file()
    assert (tmp_path / "final" / "config.json").is_file()  # and a merged standalone copy


@register_verifier("test_flaky")
class Flaky:
    """Crashes on completions with an odd number of characters, otherwise scores like `numeric`."""

    name = "test_flaky"

    def score(self, completion, reference):
        if len(completion) % 2:
            raise RuntimeError("verifier crashed")
        return Reward(float(completion.strip() == reference["answer"]))


def test_failed_verifications_are_masked_and_counted(taught_model, tmp_path):
    grpo.train(_config(taught_model, tmp_path, "verifier.name=test_flaky", "train.steps=1", "eval.at_start=false", "eval.at_end=false"))
    (step,) = read_metrics(tmp_path / "metrics.jsonl")
    errors = step.get("verify/status_error", 0)
    assert errors > 0 and errors + step.get("verify/status_ok", 0) == 32
    assert step["verify/masked_frac"] == pytest.approx(errors / 32)


def _train_cli(*args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "rlvr.cli", "train", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, **kwargs)


def test_killed_run_resumes_to_the_same_weights(taught_model, tmp_path):
    """SIGKILL after a checkpoint, resume, and end bit-identical to an uninterrupted run. (Regression:
    the resumed run once copied its reference model from the resumed policy instead of the original.)"""
    overrides = ["train.steps=6", "checkpoint.every=2", "checkpoint.keep=2", "eval.at_start=false", "eval.at_end=false"]
    config = _config(taught_model, tmp_path / "whole", *overrides)
    grpo.train(config)  # the uninterrupted reference run

    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(yaml.safe_dump(_config(taught_model, tmp_path / "killed", *overrides).model_dump(mode="json")))
    proc = _train_cli(str(cfg_file))
    deadline = time.time() + 120
    while not (tmp_path / "killed" / "checkpoints" / "step_000002").exists():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.time() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "killed" / "final").exists()

    resumed = _train_cli("--resume", str(tmp_path / "killed"))
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read().decode()
    steps = [r["step"] for r in read_metrics(tmp_path / "killed" / "metrics.jsonl")]
    assert steps == [1, 2, 3, 4, 5, 6]  # lines written after the checkpoint were dropped, none repeated
    from safetensors.torch import load_file

    a = load_file(tmp_path / "whole" / "final" / "model.safetensors")
    b = load_file(tmp_path / "killed" / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_skipping_zero_advantage_rows_leaves_the_gradient_unchanged(taught_model):
    """Rows that cannot contribute are not computed; the gradient must equal the full computation."""
    from rlvr.rollout.chat import encode_prompts
    from rlvr.engines import HFEngine, SamplingParams
    from rlvr.recipes.update import rows_with_gradient
    from rlvr.modeling.logprobs import completion_logprobs
    from rlvr.modeling.loading import load_policy, load_tokenizer
    from rlvr.rollout.groups import Group
    from rlvr.rollout.batch import collate
    from rlvr.algorithms.losses import policy_loss

    policy, tokenizer = load_policy(taught_model), load_tokenizer(taught_model)
    prompts = encode_prompts(tokenizer, [[{"role": "user", "content": f"{i}+{i}="}] for i in range(4)])
    torch.manual_seed(0)
    groups = HFEngine(policy, tokenizer).generate(prompts, 4, SamplingParams(max_new_tokens=3))
    batch = collate([Group("s", None, p, g) for p, g in zip(prompts, groups)], tokenizer.pad_token_id)
    batch.advantages = torch.tensor([1.0, -1.0, 0.0, 0.0] * 2 + [0.0] * 8)
    batch.response_mask[1] = 0  # a masked sample
    config = _config(taught_model, "unused", "algorithm.beta=0")
    rows = rows_with_gradient(batch, config.algorithm)
    assert rows.tolist() == [0, 4, 5]

    def grads(index):
        policy.zero_grad()
        sub = batch.select(index)
        logp, _ = completion_logprobs(policy, sub.input_ids, sub.attention_mask, sub.completion_len)
        loss, _ = policy_loss(logp, logp.detach(), sub.advantages, sub.response_mask,
                              num_seqs=len(batch), num_tokens=float(batch.response_mask.sum()))
        loss.backward()
        return [p.grad.clone() for p in policy.parameters()]

    for full, skipped in zip(grads(torch.arange(len(batch))), grads(rows)):
        torch.testing.assert_close(full, skipped, rtol=1e-5, atol=1e-7)


def test_an_update_without_active_rows_steps_on_zero_gradients(taught_model):
    """The update writes gradients with its first backward (no zeroing pass); with no row to compute
    every parameter still gets a zero gradient (not None), so the optimizer steps as on zeros."""
    from rlvr.modeling.loading import load_policy
    from rlvr.rollout.batch import Batch
    from rlvr.run.runtime import build_optimizer
    from rlvr.recipes.update import UpdateSettings, update_policy

    config = _config(taught_model, "unused", "algorithm.beta=0")
    policy = load_policy(taught_model)
    ids = torch.tensor([[5, 6, 7, 8]] * 2)
    zeros = torch.zeros(2, 2)
    batch = Batch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=torch.ones(2, 2),
                  engine_logp=zeros, advantages=torch.zeros(2))
    optimizer = build_optimizer(policy.parameters(), lr=1e-3, weight_decay=0.0, betas=(0.9, 0.999))
    for p in policy.parameters():
        p.grad = torch.ones_like(p)  # stale gradients from elsewhere must not leak into the step
    out = update_policy(policy, batch, optimizer, UpdateSettings.from_config(config))
    assert out["train/computed_rows_frac"] == 0 and out["train/grad_norm"] == 0
    assert all(p.grad is not None and not p.grad.any() for p in policy.parameters())

def test_a_step_without_any_signal_is_a_zero_gradient_step(taught_model, tmp_path):
    """Regression: when every group has zero variance there are no rows to compute; the step must
    still run (an empty micro-batch once crashed the model's forward)."""
    grpo.train(_config(taught_model, tmp_path, "algorithm.beta=0", "generation.temperature=0.01", "train.steps=2",
                       "eval.at_start=false", "eval.at_end=false"))
    steps = read_metrics(tmp_path / "metrics.jsonl")
    assert len(steps) == 2 and any(r["train/computed_rows_frac"] == 0 for r in steps)
