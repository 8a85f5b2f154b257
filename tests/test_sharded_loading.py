"""Loading into FSDP2 shards (``rlvr/modeling/sharded_loading.py``): a rank's memory at load is its shards,
not the whole model, and the shards hold exactly the weights of the folder.

The finding this guards: the sharded policy (and its reference), then PPO's critic and ``rlvr train-rm``'s
reward model, were loaded whole onto every rank's device and sharded afterwards, so a rank's peak was the
whole float32 model (a 32B policy: ~131 GB a GPU). On the CPU a rank's device is its host memory, measured
here as the growth of its peak resident set (two ranks, spawned). That the sharded loads hold exactly the
weights of the unsharded ones is checked in this process, on a process group of one rank.
"""

from __future__ import annotations

import datetime
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from test_sharding import _free_port



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


@pytest.fixture(scope="module")
def large_model(tmp_path_factory):
    """:func:`_build`'s model, saved once for this module's two-rank tests: (its folder, its float32 MB)."""
    path = tmp_path_factory.mktemp("large") / "model"
    return path, _build(path) / 2**20


@pytest.mark.slow
def test_a_rank_loads_its_shards_not_the_whole_model_and_they_hold_the_folder_weights(large_model):
    path, whole_mb = large_model
    out, old = _spawn(path, old_way=False), _spawn(path, old_way=True)
    assert out["equal"]
    print(f"whole model {whole_mb:.0f} MB; peak growth at load: rank 0 {out[0]['grown_mb']:.0f} MB (it reads the "
          f"folder into host memory), rank 1 {out[1]['grown_mb']:.0f} MB (its shards: {out[1]['local_mb']:.0f} MB); "
          f"loaded whole then sharded, as before: rank 0 {old[0]:.0f} MB, rank 1 {old[1]:.0f} MB")
    assert out[1]["local_mb"] == pytest.approx(whole_mb / 2, rel=0.02)
    assert old[1] > 0.95 * whole_mb  # the finding: every rank held the whole model
    assert out[1]["grown_mb"] < 0.75 * whole_mb


# ---------------------------------------------------------------------------------------------
# PPO's critic and the reward model: the sharded load equals the unsharded one (one rank, in-process)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_rank():
    """A gloo process group of one rank (FSDP2 on a mesh of one shards and loads as over many)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def _whole_state(model) -> dict[str, torch.Tensor]:
    """``model``'s state dict as plain tensors (a sharded one's gathered)."""
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in model.state_dict().items()}


def _assert_same_state(sharded, whole) -> None:
    from rlvr.run.sharding import is_sharded

    assert is_sharded(sharded) and not is_sharded(whole)
    got, want = _whole_state(sharded), _whole_state(whole)
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[k], want[k]) for k in want), [k for k in want if not torch.equal(got[k], want[k])]
    trainable = lambda model: sorted(n for n, p in model.named_parameters() if p.requires_grad)  # noqa: E731
    assert trainable(sharded) == trainable(whole)


@pytest.fixture(scope="module")
def reward_folder(tiny_model, tmp_path_factory):
    """The tiny model saved as a one-label sequence classifier (a reward model's folder; its score layer random)."""
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(1)
    folder = tmp_path_factory.mktemp("rm") / "model"
    AutoModelForSequenceClassification.from_pretrained(str(tiny_model), num_labels=1).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("start", ["policy folder", "reward model folder", "resumed"])
def test_a_sharded_critic_holds_the_weights_of_the_unsharded_one(one_rank, tiny_model, reward_folder, tmp_path, start):
    """PPO's critic with its own body, loaded into shards, holds what ``build_critic`` loads whole: the
    body, and a zero head, a reward model's score layer, or a saved critic's head."""
    from rlvr.modeling.loading import load_policy
    from rlvr.modeling.value_model import build_critic

    policy = load_policy(tiny_model)
    path, resume_from = (reward_folder if start == "reward model folder" else tiny_model), None
    if start == "resumed":
        saved = build_critic(policy, path=tiny_model)
        with torch.no_grad():
            saved.head.weight.normal_()
            saved.body.norm.weight.add_(1.0)
        resume_from = saved.save(tmp_path / "critic")
    whole = build_critic(policy, path=path, resume_from=resume_from)
    sharded = build_critic(policy, path=path, resume_from=resume_from, shard=True, gradient_checkpointing=True)
    _assert_same_state(sharded, whole)
    assert sharded.body.is_gradient_checkpointing and sharded.training
    if start != "policy folder":
        assert whole.head.weight.abs().sum() > 0  # the head that was carried over is not the zero start


@pytest.mark.parametrize("lora, head", [(None, "score"), ("new", "score"), ("saved", "score"), ("new", "logprob")])
def test_a_sharded_reward_model_holds_the_weights_of_the_unsharded_one(one_rank, tiny_model, tmp_path, lora, head):
    """``rlvr train-rm``'s model loaded into shards holds what it loads whole (``from_pretrained``): the
    body, the new score head's and new adapters' initialisation (rank 0's, seeded alike here), or the
    saved adapters of a checkpoint, which stay trainable."""
    from rlvr.config import RewardModelConfig, build_config
    from rlvr.modeling.loading import load_tokenizer
    from rlvr.modeling.reward_model import load_reward_backbone

    raw = {"model": {"path": str(tiny_model)}, "data": {"path": str(tmp_path / "pairs.jsonl")}, "head": head}
    if lora is not None:
        raw["model"]["lora"] = {"r": 4, "target_modules": ["q_proj", "v_proj"]}
    config, tokenizer = build_config(RewardModelConfig, raw), load_tokenizer(tiny_model)
    adapter = None
    if lora == "saved":
        torch.manual_seed(2)
        adapter = tmp_path / "adapter"
        load_reward_backbone(config, tokenizer, "cpu").save_pretrained(adapter)

    def load(**shard):
        torch.manual_seed(0)
        return load_reward_backbone(config, tokenizer, "cpu", adapter, **shard)

    whole, sharded = load(), load(shard=True)
    _assert_same_state(sharded, whole)
    if lora is not None:
        assert any("lora_" in n for n, p in sharded.named_parameters() if p.requires_grad)


def test_a_sharded_policy_resumes_its_saved_adapters_trainable(one_rank, tiny_model, tmp_path):
    """The policy from a whole checkpoint's saved LoRA adapters: the sharded load holds ``load_policy``'s
    weights and its adapters train (a saved adapter config says ``inference_mode: true``)."""
    from rlvr.modeling.loading import load_policy
    from rlvr.modeling.sharded_loading import load_sharded

    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    load_policy(tiny_model, lora=lora).save_pretrained(tmp_path / "adapter")
    options = dict(dtype="float32", lora=lora, adapter_path=tmp_path / "adapter")
    _assert_same_state(load_sharded(tiny_model, device="cpu", **options), load_policy(tiny_model, **options))


# ---------------------------------------------------------------------------------------------
# PPO's critic and the reward model: a rank's memory at load (two ranks)
# ---------------------------------------------------------------------------------------------


def _critic_and_reward_rank(rank: int, world: int, port: int, path, out: dict) -> None:
    """One rank: PPO's critic, then the reward model, each loaded into shards from the causal LM at ``path``;
    each one's peak growth at load and its shards, and whether the gathered body is the folder's."""
    import ctypes
    import gc
    from types import SimpleNamespace

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    try:
        from safetensors.torch import load_file
        from torch.distributed.checkpoint import state_dict  # noqa: F401
        from torch.distributed.fsdp import fully_shard  # noqa: F401
        from transformers import AutoConfig, LlamaForSequenceClassification, LlamaModel  # noqa: F401

        from rlvr.config import RewardModelConfig, build_config
        from rlvr.modeling.reward_model import load_reward_backbone
        from rlvr.modeling.value_model import build_critic

        policy = SimpleNamespace(config=AutoConfig.from_pretrained(str(path)))  # build_critic reads its hidden size
        config = build_config(RewardModelConfig, {"model": {"path": str(path)}, "data": {"path": "unused.jsonl"}})
        loads = {"critic": (lambda: build_critic(policy, path=path, shard=True), "body."),
                 "reward model": (lambda: load_reward_backbone(config, SimpleNamespace(pad_token_id=0), "cpu",
                                                               shard=True), "model.")}
        for name, (load, prefix) in loads.items():
            grown, model = _load_growth_mb(load)
            whole = {k: v.full_tensor() for k, v in model.state_dict().items()}  # a collective: every rank
            out[rank, name] = {"grown_mb": grown, "whole_mb": sum(v.numel() for v in whole.values()) * 4 / 2**20,
                               "local_mb": sum(p.to_local().numel() for p in model.parameters()) * 4 / 2**20}
            if rank == 0:
                body = {k: v for k, v in load_file(str(path / "model.safetensors")).items() if k.startswith("model.")}
                out[name] = all(torch.equal(whole[prefix + k[len("model."):]], v) for k, v in body.items())
            del model, whole
            gc.collect()
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # the freed pages back to the system: the next load starts afresh
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_the_critic_and_the_reward_model_load_into_shards_not_whole_on_each_rank(large_model):
    """PPO's critic (its own body and head) and the reward model (a score head) under fsdp2: rank 1's memory
    at load grows by its shards, not by the whole model, and the shards hold the folder's weights."""
    path = large_model[0]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_critic_and_reward_rank, args=(2, _free_port(), path, out), nprocs=2)
        out = dict(out)
    for name in ("critic", "reward model"):
        print(f"{name}: whole {out[1, name]['whole_mb']:.0f} MB; peak growth at load: rank 0 "
              f"{out[0, name]['grown_mb']:.0f} MB, rank 1 {out[1, name]['grown_mb']:.0f} MB (its shards: "
              f"{out[1, name]['local_mb']:.0f} MB)")
    for name in ("critic", "reward model"):
        whole_mb = out[1, name]["whole_mb"]
        assert out[name]  # the gathered shards hold the folder's body
        assert out[1, name]["local_mb"] == pytest.approx(whole_mb / 2, rel=0.02)
        assert out[1, name]["grown_mb"] < 0.75 * whole_mb
