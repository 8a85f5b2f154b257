"""The pieces of a sharded run that need no second rank: a one-rank process group in this process
shards a model as ``torch.distributed`` would over many (``fully_shard`` on a mesh of one), so its
whole copies, the weights pushed into the HF engine's copy, and the DCP checkpoint of its model and
optimizer can be checked here, in-process. Two-rank runs are in tests/test_fsdp2.py."""

from __future__ import annotations

import socket

import pytest
import torch

from rlvr.engines import HFEngine
from rlvr.modeling.loading import generation_copy, iter_inference_weights, load_policy, load_tokenizer
from rlvr.run.checkpoint import save_checkpoint, temporary_folder
from rlvr.run.sharded_checkpoint import SHARDED, ShardedParts, has_sharded_part, load_sharded_optimizer
from rlvr.run.sharding import is_sharded, shard_model, whole_copy


@pytest.fixture(scope="module", autouse=True)
def one_rank():
    """A gloo process group of one rank for this module's tests, destroyed after them."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def _sharded(tiny_model, **lora):
    model = load_policy(tiny_model, **lora)
    whole = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return shard_model(model), whole


def _plain(state: dict) -> dict[str, torch.Tensor]:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in state.items()}


def test_a_whole_copy_of_a_sharded_model_has_its_weights_and_ties(tiny_model):
    model, whole = _sharded(tiny_model)
    assert is_sharded(model) and hasattr(model.model.embed_tokens.weight, "full_tensor")
    copy = whole_copy(model)
    assert not is_sharded(copy)
    state = copy.state_dict()
    assert sorted(state) == sorted(whole)
    for name, tensor in whole.items():
        assert torch.equal(state[name], tensor), name
    assert copy.lm_head.weight is copy.model.embed_tokens.weight  # tie_word_embeddings kept
    rotary = copy.model.rotary_emb.inv_freq  # a buffer outside the state dict: real, not meta
    assert rotary.device.type == "cpu" and torch.equal(rotary, model.model.rotary_emb.inv_freq)


def test_the_hf_engine_copy_starts_at_zero_and_takes_the_gathered_weights(tiny_model):
    model, whole = _sharded(tiny_model)
    copy = generation_copy(model, "float32", torch.device("cpu"))
    assert all(float(p.abs().sum()) == 0 for p in copy.parameters()) and not any(p.requires_grad for p in copy.parameters())
    engine = HFEngine(copy, load_tokenizer(tiny_model), weight_sync="merged")
    engine.update_weights(iter_inference_weights(model))
    for name, tensor in copy.state_dict().items():
        assert torch.equal(tensor, whole[name]), name


def test_a_lora_policy_s_engine_copy_is_the_merged_base(tiny_model):
    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    model, _ = _sharded(tiny_model, lora=lora)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.01)  # a non-zero delta to merge
    copy = generation_copy(model, "float32", torch.device("cpu"))
    assert not any("lora" in name for name in copy.state_dict())
    HFEngine(copy, load_tokenizer(tiny_model), weight_sync="merged").update_weights(iter_inference_weights(model))
    expected = dict(iter_inference_weights(model))
    q = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(copy.state_dict()[q], expected[q])
    assert not torch.equal(expected[q], _plain(model.state_dict())[f"base_model.model.{q.replace('.weight', '.base_layer.weight')}"])


def test_a_dcp_checkpoint_restores_model_and_adamw_state_bit_identical(tiny_model, tmp_path):
    model, _ = _sharded(tiny_model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(3, 50, (2, 6))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    parts = ShardedParts.of({"policy": model}, {"optimizer": optimizer, "scheduler": object()})
    assert list(parts.models) == ["policy"] and list(parts.optimizers) == ["optimizer"]
    folder = temporary_folder(tmp_path, 3)
    parts.save(folder / SHARDED)
    checkpoint = save_checkpoint(tmp_path, 3, models={}, tokenizer=load_tokenizer(tiny_model), states={}, extra={},
                                 started=True)  # the sharded part written first is kept and renamed with the rest
    assert has_sharded_part(checkpoint) and (checkpoint / SHARDED / "policy" / ".metadata").is_file()

    again, _ = _sharded(tiny_model)
    from rlvr.run.sharded_checkpoint import load_sharded_model

    load_sharded_model(again, checkpoint / SHARDED / "policy")
    fresh = torch.optim.AdamW(again.parameters(), lr=1e-2)
    load_sharded_optimizer(again, fresh, checkpoint / SHARDED / "optimizer")
    for (name, a), b in zip(_plain(model.state_dict()).items(), _plain(again.state_dict()).values()):
        assert torch.equal(a, b), name
    for p, q in zip(model.parameters(), again.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            a, b = optimizer.state[p][key], fresh.state[q][key]
            assert torch.equal(_plain({"x": a})["x"], _plain({"x": b})["x"]), key


def test_a_checkpoint_folder_without_shards_is_refused_with_the_reason(tmp_path, tiny_model):
    model, _ = _sharded(tiny_model)
    from rlvr.run.folder import RunFolderError
    from rlvr.run.sharded_checkpoint import load_sharded_model

    with pytest.raises(RunFolderError, match="no sharded checkpoint here"):
        load_sharded_model(model, tmp_path / "missing")
