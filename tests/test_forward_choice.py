"""The forward a model runs is chosen at load, proven by a parity probe, and said with its reason."""

from __future__ import annotations

import pytest
import torch

from rlvr.modeling import fast_forward
from rlvr.modeling.forward_choice import choose_forward, forward_note, parity_probe
from rlvr.modeling.loading import load_policy


def test_a_supported_model_passes_the_probe_and_runs_rlvrs_forward(tiny_model):
    policy = load_policy(tiny_model)
    assert fast_forward.supports(policy)
    assert parity_probe(policy) < 1e-5
    assert forward_note(policy).startswith("rlvr's shared-prompt forward (load-time probe: max relative logit difference")
    assert policy.training  # the probe ran in eval mode and gave the mode back


def _wrong_rope(x, cos, sin):
    """A planted error: the interleaved (GPT-J) rotary convention where Llama rotates halves."""
    rotated = torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2)
    return x * cos + rotated * sin


def test_a_planted_error_in_the_fast_forward_is_caught_at_load_and_the_model_falls_back(tiny_model, monkeypatch):
    monkeypatch.setattr(fast_forward, "_rope", _wrong_rope)
    with pytest.warns(UserWarning, match="disagreed with it on the load-time probe"):
        policy = load_policy(tiny_model)
    assert not fast_forward.supports(policy)  # every later pass, and the HF engine, run the model's own forward
    assert "the model's own (transformers) forward: rlvr's disagreed" in forward_note(policy)


def test_in_bfloat16_the_config_probe_catches_what_rounding_hides_in_the_model(tiny_model, monkeypatch):
    """A random-init model spreads attention so evenly that the planted error moves its bfloat16
    logits by about their rounding; the float64 proxy of its config does not let it pass."""
    policy = load_policy(tiny_model, dtype="bfloat16")
    assert forward_note(policy).startswith("rlvr's")
    monkeypatch.setattr(fast_forward, "_rope", _wrong_rope)
    with pytest.warns(UserWarning, match="probe of this config, float64"):
        choose_forward(policy, "auto")
    assert not fast_forward.supports(policy)


def test_models_it_cannot_run_exactly_are_refused_with_the_reason(tiny_model):
    from peft import LoraConfig, get_peft_model
    from transformers import MistralConfig, MistralForCausalLM, Qwen3Config, Qwen3ForCausalLM

    small = dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
                 num_key_value_heads=2, pad_token_id=0)
    sliding = MistralForCausalLM(MistralConfig(sliding_window=16, **small))
    assert "sliding-window attention (window 16)" in fast_forward.unsupported_reason(sliding)
    assert "architecture 'qwen3'" in fast_forward.unsupported_reason(Qwen3ForCausalLM(Qwen3Config(**small)))
    lora = get_peft_model(load_policy(tiny_model), LoraConfig(r=2, lora_dropout=0.1, target_modules=["q_proj"])).train()
    assert "LoRA dropout 0.1 while training" in forward_note(lora)  # plain LoRA runs rlvr's (test_fast_forward.py)
    assert forward_note(load_policy(tiny_model, forward="hf")) == \
        "the model's own (transformers) forward (model.forward: hf)"
    checkpointed = load_policy(tiny_model, gradient_checkpointing=True).train()
    assert "gradient checkpointing while training" in forward_note(checkpointed)
    with pytest.raises(ValueError, match="model.forward must be 'auto' or 'hf'"):
        choose_forward(load_policy(tiny_model), "fast")


def test_a_run_says_which_forward_it_runs(tiny_model, tmp_path, capsys):
    from rlvr.config import SFTConfig, build_config
    from rlvr.recipes import sft

    sft.train(build_config(SFTConfig, {
        "out": str(tmp_path / "run"), "model": {"path": str(tiny_model)},
        "data": {"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}, "limit": 8},
        "train": {"steps": 1, "batch_size": 4}, "log": {"progress": False}, "eval": {"at_end": False},
    }))
    assert "forward: rlvr's shared-prompt forward (load-time probe" in capsys.readouterr().out


def test_the_load_time_probe_leaves_every_gpu_generator_alone(tiny_model, monkeypatch):
    """The probe's proxy model is seeded on the CPU generator only (restored after): reseeding the GPUs' made
    every CUDA run sample from seed 0 whatever ``train.seed`` said (found on an H100: the asynchronous
    generator's RNG hand-over made no difference)."""
    import torch

    from rlvr.modeling.loading import load_policy

    reseeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: reseeded.append(seed))
    monkeypatch.setattr(torch.cuda, "manual_seed", lambda seed: reseeded.append(seed))
    before = torch.get_rng_state()
    load_policy(tiny_model, forward="auto")
    assert reseeded == [] and torch.equal(torch.get_rng_state(), before)
