"""The actor-critic recipe on the tiny model: the critic's layout and alignment, the targets, and
end-to-end runs (full and LoRA, resume, REINFORCE with a baseline, the CLI)."""

import json

import pytest
import torch

from rlvr.recipes import ppo
from rlvr.config import RunConfig, build_config
from rlvr.run.tracking import read_metrics


def _config(model, out, *overrides):
    raw = {
        "out": str(out),
        "model": {"path": str(model)},
        "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
        "generation": {"max_new_tokens": 3},
        "algorithm": {"preset": "ppo", "ppo_epochs": 2, "minibatches": 2},
        "optim": {"lr": 1e-3},
        "train": {"steps": 3, "prompts_per_step": 8, "group_size": 4, "micro_batch_size": 16},
        "eval": {"limit": 9},
        "checkpoint": {"every": 0},
        "log": {"progress": False, "plot_every": 0},
    }
    return build_config(RunConfig, raw, list(overrides))


LORA = "model.lora={r: 4, alpha: 8}"


def _batch(model_path, n_prompts=3, group=2, max_new_tokens=3):
    from rlvr.rollout.chat import encode_prompts
    from rlvr.engines import HFEngine, SamplingParams
    from rlvr.modeling.loading import load_policy, load_tokenizer
    from rlvr.rollout.groups import Group
    from rlvr.rollout.batch import collate

    policy, tokenizer = load_policy(model_path), load_tokenizer(model_path)
    prompts = encode_prompts(tokenizer, [[{"role": "user", "content": f"{i}+{i * 11}="}] for i in range(n_prompts)])
    torch.manual_seed(0)
    groups = HFEngine(policy, tokenizer).generate(prompts, group, SamplingParams(max_new_tokens=max_new_tokens))
    groups = [Group("s", None, p, g) for p, g in zip(prompts, groups)]
    return policy, tokenizer, collate(groups, tokenizer.pad_token_id), groups


# ---------------------------------------------------------------------------------------------
# The critic
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lora", [False, True])
def test_value_at_t_is_the_value_of_the_prefix_ending_before_token_t(taught_model, lora):
    """V[b, t] must be the head on the last hidden state of (prompt + first t completion tokens),
    whatever the left padding; the bootstrap value is that of the whole sequence."""
    from rlvr.modeling.loading import load_policy
    from rlvr.modeling.value_model import build_critic

    policy, _, batch, groups = _batch(taught_model)
    if lora:
        policy = load_policy(taught_model, lora=dict(r=4, alpha=8, dropout=0.0, target_modules="all-linear"))
    critic = build_critic(policy, path=taught_model, lora=dict(r=4, alpha=8, dropout=0.0, target_modules="all-linear"))
    torch.nn.init.normal_(critic.head.weight)  # a non-zero head, so positions are told apart
    with torch.no_grad():
        values, after = critic(batch.input_ids, batch.attention_mask, batch.completion_len, with_bootstrap=True)
    assert values.shape == batch.response_mask.shape
    rows = [(g.prompt_ids, c.token_ids) for g in groups for c in g.completions]
    for b, (prompt, completion) in enumerate(rows):
        for t in range(len(completion) + 1):
            ids = torch.tensor([prompt + completion[:t]])
            with torch.no_grad():
                alone = critic(ids, torch.ones_like(ids), 1, with_bootstrap=True)[1]  # value after the last token
            expected = values[b, t] if t < len(completion) else after[b]
            torch.testing.assert_close(expected, alone[0], rtol=1e-4, atol=1e-5)


def test_a_lora_critic_is_a_value_adapter_on_the_policys_own_base(taught_model):
    from rlvr.modeling.loading import load_policy
    from rlvr.modeling.value_model import build_critic, policy_parameters

    lora = dict(r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    policy = load_policy(taught_model, lora=lora)
    policy_trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    critic = build_critic(policy, path=taught_model, lora=lora)
    torch.nn.init.normal_(critic.head.weight)  # gradients reach the adapter through a non-zero head
    # one copy of the base: the critic registers no transformer weights of its own
    assert [n for n, _ in critic.named_parameters()] == ["head.weight", "head.bias"]
    names = {id(p): n for n, p in policy.named_parameters()}
    assert {names[id(p)] for p in policy_parameters(policy, critic)} == policy_trainable  # the policy's own, unchanged
    critic_params = critic.trainable_parameters()
    assert all(".value." in names[id(p)] for p in critic_params[:-2]) and len(critic_params) == 2 * 2 * 2 + 2
    ids = torch.randint(3, 20, (2, 6))
    critic(ids, torch.ones_like(ids), 2).sum().backward()
    grads = {n for n, p in policy.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert grads and all(".value." in n for n in grads)  # the critic's backward reaches its adapter, not the policy's
    assert policy.active_adapter == "default"


def test_a_critic_started_from_a_reward_model_scores_a_whole_sequence_as_the_reward_model_does(taught_model, tmp_path):
    """critic.path = a one-label sequence-classification folder: its body and its score layer become
    the critic's, so the value after the last token is the reward model's score."""
    from transformers import AutoModelForSequenceClassification

    from rlvr.modeling.loading import load_policy
    from rlvr.modeling.value_model import build_critic

    rm = AutoModelForSequenceClassification.from_pretrained(taught_model, num_labels=1)
    torch.nn.init.normal_(rm.score.weight)
    rm.save_pretrained(tmp_path / "rm")
    critic = build_critic(load_policy(taught_model), path=tmp_path / "rm")
    torch.testing.assert_close(critic.head.weight, rm.score.weight)
    ids = torch.randint(3, 20, (3, 7))
    with torch.no_grad():
        _, whole = critic(ids, torch.ones_like(ids), 2, with_bootstrap=True)
        torch.testing.assert_close(whole, rm(input_ids=ids).logits.squeeze(-1), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Targets: per-token rewards, GAE, truncation
# ---------------------------------------------------------------------------------------------


class _ConstantCritic:
    """V = 0.5 at every state, 2.0 after the last token (to see bootstrapping)."""

    def __call__(self, input_ids, attention_mask, completion_len, with_bootstrap=False):
        values = torch.full((len(input_ids), completion_len), 0.5)
        return (values, torch.full((len(input_ids),), 2.0)) if with_bootstrap else values


@pytest.mark.parametrize("truncation", ["none", "zero", "bootstrap"])
def test_critic_targets_follow_the_truncation_rule(taught_model, tmp_path, truncation):
    from rlvr.modeling.loading import Reference
    from rlvr.recipes.update import UpdateSettings

    policy, _, batch, _ = _batch(taught_model)
    config = _config(taught_model, tmp_path, "algorithm.beta=0", "algorithm.whiten_advantages=false",
                     "algorithm.lam=1.0", f"algorithm.truncation={truncation}")
    n = len(batch)
    scores = torch.ones(n)
    truncated = torch.zeros(n, dtype=torch.bool)
    truncated[0] = True
    ppo.critic_targets(batch, scores, truncated, policy=policy, critic=_ConstantCritic(),
                       reference=Reference(policy, needed=False, path=taught_model), beta=0.0,
                       settings=UpdateSettings.from_config(config))
    mask = batch.response_mask.bool()
    # lambda = gamma = 1: the return at every real token is what the row earns at its end
    end = {"none": 1.0, "zero": 0.0, "bootstrap": 2.0}[truncation]
    torch.testing.assert_close(batch.returns[0][mask[0]], torch.full((int(mask[0].sum()),), end))
    torch.testing.assert_close(batch.returns[1][mask[1]], torch.ones(int(mask[1].sum())))  # ended: keeps its score
    torch.testing.assert_close(batch.advantages[mask], batch.returns[mask] - 0.5)  # A = R - V
    assert (batch.advantages[~mask] == 0).all() and (batch.returns[~mask] == 0).all()


def test_kl_in_the_reward_uses_the_trainers_logprobs_and_is_whitened_over_real_tokens(taught_model, tmp_path):
    from rlvr.modeling.loading import Reference
    from rlvr.recipes.update import UpdateSettings

    policy, _, batch, _ = _batch(taught_model)
    config = _config(taught_model, tmp_path)
    batch.engine_logp = batch.engine_logp - 0.5  # an engine whose log-probs are off must not leak into the KL
    reference = Reference(policy, needed=True, path=taught_model)  # the same weights: KL exactly 0
    seq_kl = ppo.critic_targets(batch, torch.arange(len(batch)).float(), torch.zeros(len(batch), dtype=torch.bool),
                                policy=policy, critic=_ConstantCritic(), reference=reference, beta=0.05,
                                settings=UpdateSettings.from_config(config))
    assert seq_kl.abs().max() < 1e-6
    real = batch.response_mask.bool()
    assert abs(float(batch.advantages[real].mean())) < 1e-5 and float(batch.advantages[real].std()) == pytest.approx(1, abs=1e-4)


# ---------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lora", [False, True])
def test_short_ppo_run_writes_the_run_folder_with_the_critic(taught_model, tmp_path, lora):
    from transformers import AutoModelForCausalLM

    summary = ppo.train(_config(taught_model, tmp_path, *([LORA] if lora else [])))
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    step = records[1]
    for key in ["critic/value_loss", "critic/explained_variance", "critic/value_clip_frac", "critic/values_mean",
                "critic/returns_mean", "train/approx_kl_old", "train/kl_coef", "train/kl_ref", "reward/kl_seq_mean",
                "train/clip_frac_low", "train/entropy", "reward/accuracy"]:
        assert key in step, key
    assert step["train/optimizer_steps"] == 4  # 2 epochs x 2 minibatches
    assert step["train/kl_coef"] == 0.05 and step["critic/values_mean"] == 0  # the head starts at zero
    assert records[2]["critic/values_mean"] != 0  # ... and learns
    checkpoint = tmp_path / "checkpoints" / "step_000003"
    assert (checkpoint / "critic" / "value_head.safetensors").is_file()
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=True)
    assert {"optimizer", "critic_optimizer", "kl_controller", "sampler"} <= set(state)
    AutoModelForCausalLM.from_pretrained(tmp_path / "final")  # the policy alone, loadable
    if lora:
        assert not (tmp_path / "final" / "adapter" / "value").exists()  # the critic's adapter is not the policy's
        assert (tmp_path / "final_critic" / "value").is_dir()
    assert summary["algorithm"] == "ppo" and 0 <= summary["accuracy_after"] <= 1
    assert (tmp_path / "metrics.png").stat().st_size > 10_000


@pytest.mark.parametrize("lora", [False, True])
def test_a_resumed_ppo_run_ends_where_the_whole_run_ends(taught_model, tmp_path, monkeypatch, lora):
    """Policy, critic, both optimizers, the KL coefficient and the RNG streams all come back."""
    extra = ["train.steps=4", "checkpoint.every=2", "algorithm.target_kl=0.01", "eval.at_start=false"] + ([LORA] if lora else [])
    ppo.train(_config(taught_model, tmp_path / "whole", *extra))

    real_update, calls = ppo.update_actor_critic, []

    def crash_at_step_3(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("killed")
        return real_update(*args, **kwargs)

    monkeypatch.setattr(ppo, "update_actor_critic", crash_at_step_3)
    with pytest.raises(RuntimeError, match="killed"):
        ppo.train(_config(taught_model, tmp_path / "killed", *extra))
    monkeypatch.setattr(ppo, "update_actor_critic", real_update)
    ppo.train(_config(taught_model, tmp_path / "killed", *extra), resume=True)

    whole, resumed = read_metrics(tmp_path / "whole" / "metrics.jsonl"), read_metrics(tmp_path / "killed" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    assert resumed[-1]["train/kl_coef"] == whole[-1]["train/kl_coef"] != 0.05  # the adaptive beta moved and came back
    from safetensors.torch import load_file

    for name in ["final/model.safetensors", "final_critic/value_head.safetensors"]:
        a, b = load_file(tmp_path / "whole" / name), load_file(tmp_path / "killed" / name)
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_reinforce_with_a_baseline_is_one_unclipped_pass(taught_model, tmp_path):
    ppo.train(_config(taught_model, tmp_path, "algorithm.preset=reinforce_baseline", "algorithm.ppo_epochs=1",
                      "algorithm.minibatches=1", "eval.at_start=false"))
    config = json.loads(json.dumps(__import__("yaml").safe_load((tmp_path / "config.yaml").read_text())))
    assert config["algorithm"]["policy_loss"] == "vanilla" and config["algorithm"]["lam"] == 1.0
    step = read_metrics(tmp_path / "metrics.jsonl")[0]
    assert step["train/optimizer_steps"] == 1 and step["train/ratio_mean"] == pytest.approx(1.0)
    assert step["critic/value_clip_frac"] == 0  # value_clip null: plain squared error


def test_rlvr_train_runs_ppo_when_the_preset_asks_for_it(taught_model, tmp_path, capsys):
    import yaml

    from rlvr.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(_config(taught_model, tmp_path / "run", "train.steps=1").model_dump(mode="json")))
    assert main(["train", str(cfg)]) == 0
    assert "critic/explained_variance" in read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]


def test_early_stop_on_kl_drops_the_minibatch_that_went_too_far(taught_model, tmp_path):
    """2 epochs x 2 minibatches: the first minibatch steps (the policy is the rollout policy, KL ~0);
    the second sees the moved policy, its KL exceeds a tiny bound, and the step ends there."""
    ppo.train(_config(taught_model, tmp_path, "algorithm.early_stop_kl=1e-4", "train.steps=2", "eval.at_start=false",
                      "eval.at_end=false"))
    for step in read_metrics(tmp_path / "metrics.jsonl"):
        assert step["train/early_stopped"] == 1 and step["train/optimizer_steps"] == 1
    ppo.train(_config(taught_model, tmp_path / "loose", "algorithm.early_stop_kl=10", "train.steps=1",
                      "eval.at_start=false", "eval.at_end=false"))
    step = read_metrics(tmp_path / "loose" / "metrics.jsonl")[0]
    assert step["train/early_stopped"] == 0 and step["train/optimizer_steps"] == 4


def test_the_progress_line_shows_a_dash_for_an_undefined_explained_variance():
    from rlvr.recipes.ppo import _critic_postfix

    assert _critic_postfix({"critic/explained_variance": float("nan")}) == {"ev": "-"}
    assert _critic_postfix({"critic/explained_variance": 0.4567}) == {"ev": "0.46"}
