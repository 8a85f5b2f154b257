"""Offline DPO: it raises the implicit reward margin on its pairs; the LoRA reference is the base model."""

import json
import random

import pytest
import torch

from rlvr.recipes import dpo
from rlvr.cli import main
from rlvr.config import ConfigError, build_config
from rlvr.config import DPOConfig
from rlvr.modeling.loading import Reference, load_policy, load_tokenizer
from rlvr.rollout.preferences import load_preferences, tokenize_pairs
from rlvr.run.tracking import read_metrics


def _pairs(path, n=96, seed=0):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append({"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + rng.choice([-1, 1, 10]))})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _config(tmp_path, model_path, data, **sections):
    raw = {"out": str(tmp_path / "dpo"), "model": {"path": str(model_path)}, "data": {"path": str(data), "eval_fraction": 0.2},
           "dpo": {"beta": 0.5}, "optim": {"lr": 3e-3}, "train": {"epochs": 6, "batch_size": 16, "threads": 1},
           "log": {"progress": False}}
    raw.update(sections)
    return build_config(DPOConfig, raw)


def test_dpo_raises_implicit_accuracy_and_margin(tiny_model, tmp_path):
    summary = dpo.train(_config(tmp_path, tiny_model, _pairs(tmp_path / "p.jsonl")))
    records = read_metrics(tmp_path / "dpo" / "metrics.jsonl")
    assert records[0]["eval/margin"] == pytest.approx(0.0, abs=1e-5)  # policy == reference at the start
    assert summary["train_implicit_accuracy"] >= 0.8 and summary["train_margin"] > 0.5
    losses = [r["train/loss"] for r in records if "train/loss" in r]
    assert losses[-1] < losses[0]
    assert (tmp_path / "dpo" / "final" / "model.safetensors").is_file() and (tmp_path / "dpo" / "metrics.png").is_file()


def test_lora_reference_is_the_base_model(tiny_model, tmp_path):
    config = _config(tmp_path, tiny_model, _pairs(tmp_path / "p.jsonl", n=48), model={
        "path": str(tiny_model), "lora": {"r": 4, "alpha": 8}}, dpo={"beta": 0.5, "loss": "ipo"}, eval={"task": None})
    summary = dpo.train(config)
    assert summary["train_margin"] > 0
    final = tmp_path / "dpo" / "final"
    assert (final / "adapter").is_dir()
    # the trained adapters, with adapters disabled, give exactly the base model's log-probs
    tokenizer = load_tokenizer(tiny_model)
    pairs = tokenize_pairs(tokenizer, load_preferences(str(tmp_path / "p.jsonl"), limit=8))
    policy = load_policy(tiny_model, lora={"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"},
                         adapter_path=final / "adapter")
    reference = Reference(policy, needed=True, path=tiny_model)
    base = load_policy(tiny_model).eval()
    with torch.no_grad(), reference.model() as ref:
        ref_logp, _ = dpo.sequence_logps(ref, pairs, tokenizer.pad_token_id)
        base_logp, _ = dpo.sequence_logps(base, pairs, tokenizer.pad_token_id)
    with torch.no_grad():
        policy_logp, _ = dpo.sequence_logps(policy, pairs, tokenizer.pad_token_id)
    assert torch.allclose(ref_logp, base_logp, atol=1e-5)
    assert not torch.allclose(policy_logp, base_logp, atol=1e-3)  # the adapters did move the policy


def test_gold_accuracy_before_and_after_with_an_eval_task(taught_model, tmp_path, capsys):
    """DPO with the chosen answers' NLL improves the model (docs/reward-models.md). On the taught model
    with these 64 pairs, greedy accuracy on 100 training-split problems went 0.47 -> 0.51-0.53 over four
    pair sets; at lr 1e-3 / one epoch it fell on three of four (0.47 -> 0.30-0.49: too large a step)."""
    data = _pairs(tmp_path / "p.jsonl", n=64)
    cfg = tmp_path / "dpo.yaml"
    cfg.write_text(json.dumps({
        "model": {"path": str(taught_model)}, "data": {"path": str(data)}, "dpo": {"beta": 0.1, "nll_coef": 1.0},
        "optim": {"lr": 3e-4}, "train": {"epochs": 2, "batch_size": 16, "threads": 1},
        "eval": {"task": "arithmetic", "split": "train", "options": {"style": "bare", "max_digits": 1}, "limit": 100,
                 "max_new_tokens": 3},
        "log": {"progress": False}}))
    assert main(["dpo", str(cfg), "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert 0 <= summary["gold_accuracy_before"] <= 1 and 0 <= summary["gold_accuracy_after"] <= 1
    assert summary["gold_accuracy_after"] > summary["gold_accuracy_before"]
    assert "greedy gold accuracy:" in capsys.readouterr().out
    assert any("train/nll_chosen" in r for r in read_metrics(tmp_path / "run" / "metrics.jsonl"))


def test_dpo_config_errors():
    base = {"model": {"path": "m"}, "data": {"path": "p.jsonl"}}
    with pytest.raises(ConfigError, match=r"dpo\.loss: unknown DPO loss 'ipoo'; valid DPO losses: ipo, sigmoid"):
        build_config(DPOConfig, base, ["dpo.loss=ipoo"])
    with pytest.raises(ConfigError, match=r"data\.path: set it"):
        build_config(DPOConfig, {"model": {"path": "m"}})
    with pytest.raises(ConfigError, match=r"dpo\.betaa: unknown key"):
        build_config(DPOConfig, base, ["dpo.betaa=1"])


@pytest.mark.slow
def test_end_to_end_pairs_then_reward_model_then_dpo(taught_model, tmp_path):
    """`rlvr preferences` -> `rlvr train-rm` (logprob head) -> `rlvr dpo` on 1-digit addition (~30 s)."""
    pairs = tmp_path / "pairs.jsonl"
    assert main(["preferences", "--model", str(taught_model), "--task", "arithmetic", "--task-option", "style=bare",
                 "--task-option", "max_digits=1", "--out", str(pairs), "--samples", "8", "--limit", "300",
                 "--max-new-tokens", "3", "--workers", "0", "--pairs-per-prompt", "2"]) == 0
    common = [f"model.path={taught_model}", f"data.path={pairs}", "train.threads=1", "log.progress=false"]
    rm_cfg, dpo_cfg = tmp_path / "rm.yaml", tmp_path / "dpo.yaml"
    rm_cfg.write_text(json.dumps({"head": "logprob", "optim": {"lr": 3e-4}, "train": {"epochs": 3, "batch_size": 32}}))
    assert main(["train-rm", str(rm_cfg), *common, "--out", str(tmp_path / "rm")]) == 0
    rm = json.loads((tmp_path / "rm" / "summary.json").read_text())
    train_loss = [r["train/loss"] for r in read_metrics(tmp_path / "rm" / "metrics.jsonl") if "train/loss" in r]
    epoch = len(train_loss) // 3
    assert sum(train_loss[-epoch:]) < 0.85 * sum(train_loss[:epoch])  # it learns its training pairs
    # Held out it stays well above chance (0.5). The taught model's log-probs already rank most pairs
    # (0.84-0.85 before training) and 3 epochs on ~460 pairs overfit some sampled sets: across sampling
    # and float-rounding changes the held-out accuracy ended between 0.74 and 0.89, its loss up or down.
    assert rm["pairwise_accuracy"] >= 0.7
    dpo_cfg.write_text(json.dumps({"dpo": {"beta": 0.1, "nll_coef": 1.0}, "optim": {"lr": 3e-4},
                                   "train": {"epochs": 2, "batch_size": 32},
                                   "eval": {"task": "arithmetic", "split": "train", "limit": 100, "max_new_tokens": 3,
                                            "options": {"style": "bare", "max_digits": 1}}}))  # 1-digit test: 9 problems
    assert main(["dpo", str(dpo_cfg), *common, "--out", str(tmp_path / "dpo")]) == 0
    summary = json.loads((tmp_path / "dpo" / "summary.json").read_text())
    # DPO ranks its training pairs (0.78 after 2 epochs on one sampled set). The held-out implicit accuracy is not asserted:
    # on ~60 pairs with margins of ~0.01 it moved between 0.56 and 0.7 with which pairs were sampled.
    assert summary["train_implicit_accuracy"] > 0.65
    # With the NLL term DPO improves the model (docs/reward-models.md): 0.47 -> 0.52-0.56 on seven
    # preference and training seeds (+0.05 to +0.09).
    assert summary["gold_accuracy_after"] >= summary["gold_accuracy_before"] + 0.03
