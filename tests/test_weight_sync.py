"""Weights for an engine (iter_inference_weights), the sync canary, KL in the reward from the trainer's
log-probs, and truncated importance sampling. Runs without vLLM: an HF engine over its own copy of
the model stands in for an engine that holds its own weights."""

from __future__ import annotations

import copy
import json
import sys

import pytest
import torch

from rlvr import engines
from rlvr.algorithms.losses import policy_loss
from rlvr.algorithms.off_policy import token_tis
from rlvr.engines import HFEngine
from rlvr.modeling.loading import iter_inference_weights, load_policy, load_tokenizer
from rlvr.verifiers.errors import PluginLoadError
from rlvr.engines.weight_sync import EngineSync, StaleEngineError

LORA = dict(r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"])


class CopyEngine(HFEngine):
    """An HF engine over a private copy of the policy: it must be sent the weights, like vLLM."""

    def __init__(self, model, tokenizer, **options):
        from rlvr.modeling.loading import is_lora

        own = copy.deepcopy(model)
        super().__init__(own.merge_and_unload() if is_lora(own) else own, tokenizer, weight_sync="merged", **options)


def _perturb(model, scale=0.2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                size = float(p.std()) if p.numel() > 1 and float(p.std()) > 0 else 0.1  # LoRA B starts at 0
                p.add_(scale * size * torch.randn(p.shape, generator=gen))


def test_inference_weights_of_a_plain_model_are_its_parameters_with_the_tied_head(tiny_model):
    policy = load_policy(tiny_model)
    weights = dict(iter_inference_weights(policy))
    assert "lm_head.weight" in weights  # tied to the embeddings, sent anyway
    assert weights["lm_head.weight"].data_ptr() == policy.model.embed_tokens.weight.data_ptr()
    params = dict(policy.named_parameters())
    assert all(weights[name].data_ptr() == p.data_ptr() for name, p in params.items())  # no copies


def test_inference_weights_of_a_lora_policy_are_the_merged_model(tiny_model):
    policy = load_policy(tiny_model, lora=LORA)
    _perturb(policy)  # non-zero B, so the adapters change the output
    weights = dict(iter_inference_weights(policy))
    merged = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert set(weights) == set(merged)  # names of the base architecture: no base_model. / base_layer / lora_
    assert max(float((weights[k] - merged[k]).abs().max()) for k in merged) < 1e-6
    base_q = policy.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert not torch.allclose(weights["model.layers.0.self_attn.q_proj.weight"], base_q)  # the delta was added
    assert len([n for n, _ in policy.named_parameters() if "lora_" in n]) > 0  # the live model keeps its adapters


def test_inference_weights_as_an_adapter_are_peft_s_saved_tensors(tiny_model):
    policy = load_policy(tiny_model, lora=LORA)
    names = [name for name, _ in iter_inference_weights(policy, lora="adapter")]
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    with pytest.raises(ValueError, match="'merge' or 'adapter'"):
        next(iter_inference_weights(policy, lora="both"))


def test_the_canary_passes_for_a_synced_engine_and_stops_a_skipped_sync(tiny_model):
    policy, tokenizer = load_policy(tiny_model), load_tokenizer(tiny_model)
    sync = EngineSync(CopyEngine(policy, tokenizer), policy, tokenizer, max_len=256)
    first = sync.push()
    assert first["sync/canary_max_abs_diff"] < 1e-5 and first["sync/seconds"] >= 0
    _perturb(policy)  # an optimizer step...
    with pytest.raises(StaleEngineError, match="stale or wrong weights.*up to .* nats.*tolerance 0.001 for float32"):
        sync.check()  # ...whose weights never reached the engine
    assert sync.push()["sync/canary_max_abs_diff"] < 1e-5  # pushed: the engine follows again


def test_the_canary_catches_a_missed_step_smaller_than_the_tolerance(tiny_model):
    policy, tokenizer = load_policy(tiny_model), load_tokenizer(tiny_model)
    sync = EngineSync(CopyEngine(policy, tokenizer), policy, tokenizer, tolerance=0.5, max_len=256)
    sync.push()
    _perturb(policy, scale=0.002)
    with pytest.raises(StaleEngineError, match="stale weights: .* the engine's by 0, so the weight update did not"):
        sync.check()


def test_the_canary_follows_a_lora_policy(tiny_model):
    policy, tokenizer = load_policy(tiny_model, lora=LORA), load_tokenizer(tiny_model)
    sync = EngineSync(CopyEngine(policy, tokenizer), policy, tokenizer, max_len=256)
    sync.push()
    _perturb(policy)  # moves only the adapters (the base is frozen)
    with pytest.raises(StaleEngineError):
        sync.check()
    assert sync.push()["sync/canary_max_abs_diff"] < 1e-5


def test_a_shared_engine_gets_no_push_and_no_canary_and_is_exact(tiny_model):
    policy, tokenizer = load_policy(tiny_model), load_tokenizer(tiny_model)
    engine = HFEngine(policy, tokenizer)
    engine.update_weights = None  # would fail if called
    sync = EngineSync(engine, policy, tokenizer, max_len=256)
    _perturb(policy)
    assert sync.push() == {}  # nothing to send, nothing to prove: it generates with the trainer's module
    assert sync.check() < 1e-5  # (and it would pass)


def test_the_vllm_engine_without_vllm_gives_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "rlvr.engines.vllm", raising=False)
    registry = engines.ENGINES.copy()
    registry._loaded.pop("vllm", None)  # an earlier test in this process may have imported the real one
    with pytest.raises(PluginLoadError, match=r"engine 'vllm' needs a package that is not installed.*pip install 'rlvr\[vllm\]'"):
        registry.get("vllm")


def test_truncated_importance_weights_by_hand():
    old = torch.tensor([[-1.0, -2.0, -0.5]])
    engine = torch.tensor([[-1.0, -2.5, 0.5]])
    weights, _ = token_tis(old, engine, torch.ones(1, 3), cap=1.5)  # algorithm.off_policy: token_tis
    assert torch.allclose(weights, torch.tensor([[1.0, 1.5, torch.exp(torch.tensor(-1.0)).item()]]))
    logp = torch.zeros(1, 3, requires_grad=True)  # ratio 1 everywhere: per-token loss = -A
    loss, _ = policy_loss(logp, logp.detach(), torch.tensor([2.0]), torch.ones(1, 3), agg="token_mean",
                          token_weights=weights)
    assert loss.item() == pytest.approx(-2.0 * weights.mean().item())


@pytest.mark.slow
def test_kl_in_the_reward_uses_the_trainer_s_log_probs_and_a_wrong_engine_is_stopped(tiny_model, tmp_path, monkeypatch):
    """An engine whose sampling log-probs are off by 0.5 nats: the canary stops the run; with the
    canary off, KL in the reward is still exact (0 at the first step, where the policy is the
    reference), because it comes from the trainer's log-probs."""
    from rlvr.recipes import grpo
    from rlvr.config import RunConfig, build_config

    class OffEngine(HFEngine):
        def __init__(self, model, tokenizer, **options):  # takes pushes (of its own tensors, a no-op), so the
            super().__init__(model, tokenizer, weight_sync="merged", **options)  # canary checks it

        def generate(self, prompts, n, sampling):
            groups = super().generate(prompts, n, sampling)
            for group in groups:
                for c in group:
                    c.logprobs = [lp - 0.5 for lp in c.logprobs]
            return groups

    registry = engines.ENGINES.copy()
    registry.register("off_by_half")(OffEngine)
    monkeypatch.setattr(engines, "ENGINES", registry)

    def config(out, canary):
        return build_config(RunConfig, {
            "out": str(tmp_path / out), "model": {"path": str(tiny_model)},
            "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
            "engine": {"name": "off_by_half", "canary": canary}, "generation": {"max_new_tokens": 3},
            "algorithm": {"preset": "rloo", "kl_estimator": "k1"},  # beta 0.05, KL in the reward
            "train": {"steps": 1, "prompts_per_step": 2, "group_size": 4},
            "eval": {"at_start": False, "at_end": False}, "log": {"progress": False, "plot_every": 0},
        })

    with pytest.raises(StaleEngineError, match="stale or wrong weights"):
        grpo.train(config("checked", canary=True))
    grpo.train(config("unchecked", canary=False))
    step = [json.loads(line) for line in (tmp_path / "unchecked" / "metrics.jsonl").read_text().splitlines()][-1]
    assert step["reward/kl_seq_mean"] == pytest.approx(0.0, abs=1e-5)  # engine's would give 0.5 * length
