"""A GPU run's process group, on the CPU: every collective of every recipe finds a backend for its
tensor's device.

``init_process_group("nccl")`` maps only CUDA tensors to a backend, and rlvr's bookkeeping
collectives (counts, the lockstep pass count, the Ctrl-C vote, the object gathers of metrics and RNG
states) hold CPU numbers, so a multi-GPU run failed at its first step. A CPU machine has no NCCL, but
gloo can stand in for it under the same device map: ``"cuda:gloo"`` is plain NCCL's shape (no CPU
backend), and ``process_group_backend(cuda)`` with gloo for NCCL is the shape a GPU run makes now.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import yaml

from test_distributed import _free_port
from rlvr.run.runtime import Distributed, collective_device, process_group_backend


def test_a_gpu_run_maps_cpu_tensors_to_gloo_and_cuda_tensors_to_nccl():
    assert process_group_backend(torch.device("cuda", 0)) == "cpu:gloo,cuda:nccl"
    assert process_group_backend(torch.device("cpu")) == "gloo"


def _plain_nccl_shape(rank: int, world: int, port: int, out: dict) -> None:
    torch.distributed.init_process_group("cuda:gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                         world_size=world)
    try:
        torch.distributed.all_reduce(torch.ones(1))
    except RuntimeError as exc:
        out[rank] = str(exc)
    finally:
        torch.distributed.destroy_process_group()


def test_a_group_shaped_like_plain_nccl_has_no_backend_for_the_cpu_numbers_of_the_bookkeeping():
    """The finding, reproduced: the collective that every step of every recipe makes (a count on the
    CPU) fails on a group made as plain ``"nccl"``."""
    out = mp.Manager().dict()
    mp.spawn(_plain_nccl_shape, args=(2, _free_port(), out), nprocs=2, join=True)
    assert sorted(out.keys()) == [0, 1]
    assert "No backend type associated with device type cpu" in out[0]


def _gpu_shape(rank: int, world: int, port: int, out: dict) -> None:
    backend = process_group_backend(torch.device("cuda")).replace("nccl", "gloo")
    torch.distributed.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        dist = Distributed(rank=rank, world_size=world)
        out[rank] = {"sum": dist.sum(rank + 1.0), "gather": dist.gather({"rank": rank}),
                     "broadcast": dist.broadcast(f"from {rank}"), "device": str(collective_device())}
    finally:
        torch.distributed.destroy_process_group()


def test_the_bookkeeping_collectives_run_on_the_cpu_backend_of_a_gpu_shaped_group():
    out = mp.Manager().dict()
    mp.spawn(_gpu_shape, args=(2, _free_port(), out), nprocs=2, join=True)
    for rank in (0, 1):
        assert out[rank] == {"sum": 3.0, "gather": [{"rank": 0}, {"rank": 1}], "broadcast": "from 0", "device": "cpu"}


#: Runs every recipe in one torchrun job whose process group has a GPU run's device map, gloo standing in
#: for NCCL: a collective on a CPU tensor finds a backend only through the map's cpu entry, as on NCCL.
LAUNCHER = """
import json, sys, torch
import rlvr.run.runtime as runtime

real = runtime.process_group_backend
runtime.process_group_backend = lambda device: real(torch.device("cuda")).replace("nccl", "gloo")

from rlvr.config import DPOConfig, RewardModelConfig, RunConfig, SFTConfig, build_config
from rlvr.recipes import dpo, sft, train, train_rm

configs = json.loads(open(sys.argv[1]).read())
train(build_config(RunConfig, configs["grpo"]))
train(build_config(RunConfig, configs["ppo"]))
sft.train(build_config(SFTConfig, configs["sft"]))
train_rm.train(build_config(RewardModelConfig, configs["rm"]))
dpo.train(build_config(DPOConfig, configs["dpo"]))
group = torch.distributed.distributed_c10d._get_default_group()
print("device map:", sorted(d.type for d in group._device_types), flush=True)
"""


def _pairs(path: Path, n: int = 32) -> Path:
    rows = [{"prompt": f"{i % 10}+{i // 10}=", "chosen": str(i % 10 + i // 10), "rejected": str(i)} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow
def test_every_recipe_runs_two_ranks_on_a_gpu_shaped_process_group(tiny_model, tmp_path):
    """GRPO (FSDP2-sharded: the lockstep count), PPO with its critic, SFT, the reward model and DPO, each
    two steps on 2 ranks: every count, vote, gather and broadcast of a step on the GPU run's map."""
    from test_data_parallel import _raw

    pairs = _pairs(tmp_path / "pairs.jsonl")
    offline = {"model": {"path": str(tiny_model)}, "optim": {"lr": 1e-3}, "log": {"progress": False}}
    grpo = _raw(tiny_model, tmp_path / "grpo", steps=2, strategy="fsdp2")
    ppo = {**_raw(tiny_model, tmp_path / "ppo", steps=2), "algorithm": {"preset": "ppo"}}
    configs = {
        "grpo": grpo, "ppo": ppo,
        "sft": {**offline, "out": str(tmp_path / "sft"), "data": {"task": "arithmetic", "options": {"max_digits": 1}},
                "train": {"steps": 2, "batch_size": 8, "threads": 1}, "eval": {"every": 0, "limit": 4}},
        "rm": {**offline, "out": str(tmp_path / "rm"), "data": {"path": str(pairs), "eval_fraction": 0.25},
               "train": {"epochs": 1, "batch_size": 8, "threads": 1}},
        "dpo": {**offline, "out": str(tmp_path / "dpo"), "data": {"path": str(pairs), "eval_fraction": 0.25},
                "train": {"epochs": 1, "batch_size": 8, "threads": 1}, "eval": {"task": None}},
    }
    (tmp_path / "configs.json").write_text(json.dumps(configs))
    (tmp_path / "launch.py").write_text(LAUNCHER)
    torchrun = Path(sys.executable).parent / "torchrun"
    done = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node=2", str(tmp_path / "launch.py"),
                           str(tmp_path / "configs.json")], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("device map: ['cpu', 'cuda']") == 2
    for name in ("grpo", "ppo", "sft", "rm", "dpo"):
        assert (tmp_path / name / "summary.json").is_file(), name
