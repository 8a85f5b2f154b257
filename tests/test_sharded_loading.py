"""Loading into FSDP2 shards (``rlvr/modeling/sharded_loading.py``): a rank's memory at load is its shards,
not the whole model, and the shards hold exactly the weights of the folder.

The finding this guards: the sharded policy (and its reference) was loaded whole onto every rank's device
and sharded afterwards, so a rank's peak was the whole float32 model (a 32B policy: ~131 GB a GPU).
On the CPU a rank's device is its host memory, measured here as the growth of its peak resident set.
"""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.multiprocessing as mp

from test_sharding import _free_port

pytestmark = pytest.mark.slow


def _build(path) -> int:
    """A llama-shaped model of ~60M parameters (~225 MB float32): large enough that a whole copy stands
    out of the process's other memory. Returns its float32 bytes."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: F401

    config = LlamaConfig(vocab_size=1024, hidden_size=512, intermediate_size=1376, num_hidden_layers=20,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    return sum(p.numel() for p in model.parameters()) * 4


def _memory_mb(field: str) -> float:
    """``VmRSS`` (resident now) or ``VmHWM`` (its peak since :func:`_reset_peak`) of this process, in MB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # "5" resets the peak resident set (Linux >= 4.0)
        f.write("5")


def _load_growth_mb(load) -> tuple[float, object]:
    """How far this process's resident memory peaked above where it stood, while ``load()`` ran."""
    import gc

    gc.collect()
    _reset_peak()
    before = _memory_mb("VmRSS")
    model = load()
    return _memory_mb("VmHWM") - before, model


def _rank(rank: int, world: int, port: int, path, old_way: bool, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    try:
        # everything either way imports, imported before the baseline: a module's code is not the model
        from torch.distributed.checkpoint import state_dict  # noqa: F401
        from torch.distributed.fsdp import fully_shard  # noqa: F401
        from transformers import AutoConfig, LlamaForCausalLM  # noqa: F401

        from rlvr.config import ModelConfig
        from rlvr.modeling.loading import load_policy, load_run_policy
        from rlvr.run.sharding import shard_model

        AutoConfig.from_pretrained(str(path))

        if old_way:  # as before: the whole model on every rank, then sharded
            out[rank], _ = _load_growth_mb(lambda: shard_model(load_policy(path)))
            return
        grown, policy = _load_growth_mb(lambda: load_run_policy(ModelConfig(path=str(path)), torch.device("cpu"), None,
                                                                  shard=True))
        whole = {k: v.full_tensor() for k, v in policy.state_dict().items()}  # a collective: every rank
        out[rank] = {"grown_mb": grown, "local_mb": sum(p.to_local().numel() for p in policy.parameters()) * 4 / 2**20}
        if rank == 0:
            from safetensors.torch import load_file

            saved = load_file(str(path / "model.safetensors"))
            out["equal"] = sorted(saved) == sorted(whole) and all(torch.equal(saved[k], whole[k]) for k in saved)
    finally:
        torch.distributed.destroy_process_group()


def _spawn(path, old_way: bool) -> dict:
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(2, _free_port(), path, old_way, out), nprocs=2)
        return dict(out)


def test_a_rank_loads_its_shards_not_the_whole_model_and_they_hold_the_folder_weights(tmp_path):
    path = tmp_path / "model"
    whole_mb = _build(path) / 2**20
    out, old = _spawn(path, old_way=False), _spawn(path, old_way=True)
    assert out["equal"]
    print(f"whole model {whole_mb:.0f} MB; peak growth at load: rank 0 {out[0]['grown_mb']:.0f} MB (it reads the "
          f"folder into host memory), rank 1 {out[1]['grown_mb']:.0f} MB (its shards: {out[1]['local_mb']:.0f} MB); "
          f"loaded whole then sharded, as before: rank 0 {old[0]:.0f} MB, rank 1 {old[1]:.0f} MB")
    assert out[1]["local_mb"] == pytest.approx(whole_mb / 2, rel=0.02)
    assert old[1] > 0.95 * whole_mb  # the finding: every rank held the whole model
    assert out[1]["grown_mb"] < 0.75 * whole_mb
