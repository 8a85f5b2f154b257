"""``train.strategy: fsdp2`` end to end under ``torchrun`` on the CPU (gloo): every rank holds half of
each parameter, gradient and optimizer state, and the run trains, checkpoints, resumes and saves as
a ``ddp`` run of as many ranks does (which ``test_distributed.py`` proves equal to one process on the
same batch). The ranks sample with their own streams, so a one-process run draws other completions:
the 2-rank ``ddp`` run is the reference that sees the same batch."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from test_data_parallel import _raw, _torchrun
from rlvr.config import RunConfig, build_config
from rlvr.run.tracking import read_metrics

pytestmark = pytest.mark.slow

#: One prompt per rank, micro-batches of 2 rows, no KL: a rank whose group scored alike has no row
#: to compute while the other has two micro-batches (the lockstep case).
LOCKSTEP = {"steps": 5, "prompts_per_step": 2, "micro_batch_size": 2}


def _config(model_path, out, *, strategy: str, algorithm: dict | None = None, **raw) -> dict:
    config = _raw(model_path, out, **LOCKSTEP, strategy=strategy)
    config["algorithm"] = {"beta": 0.0, **(algorithm or {})}
    config["checkpoint"] = {"every": 2}
    return {**config, **raw}


def _weights(run: Path, file: str = "model.safetensors") -> dict[str, torch.Tensor]:
    return load_file(str(run / "final" / file))


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.fixture(scope="module")
def ddp_run(taught_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp") / "run"
    done = _torchrun(out.parent, _config(taught_model, out, strategy="ddp"))
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def fsdp2_run(taught_model, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("fsdp2") / "run"
    done = _torchrun(out.parent, _config(taught_model, out, strategy="fsdp2"))
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done


def test_a_two_rank_fsdp2_run_ends_within_1e_5_of_the_ddp_run_through_lockstep_steps(ddp_run, fsdp2_run, taught_model):
    out, done = fsdp2_run
    assert "strategy: fsdp2, every parameter, gradient and optimizer state sharded over 2 ranks" in done.stdout
    fsdp2, ddp = read_metrics(out / "metrics.jsonl"), read_metrics(ddp_run / "metrics.jsonl")
    # one rank computed no row while the other computed its group (1 group per rank: the mean is 0.5)
    assert 0.5 in [r.get("train/computed_rows_frac") for r in fsdp2]
    assert [r.get("reward/mean") for r in fsdp2] == [r.get("reward/mean") for r in ddp]  # the same samples
    assert all(r["sync/canary_max_abs_diff"] < 1e-4 for r in fsdp2[1:])  # the HF engine's copy got every update
    moved = _max_difference(_weights(out), load_file(str(taught_model / "model.safetensors")))
    assert moved > 1e-3  # it trained
    assert _max_difference(_weights(out), _weights(ddp_run)) < 1e-5
    summary = json.loads((out / "summary.json").read_text())
    assert "replicas" not in summary  # shards are not replicas


def test_an_fsdp2_checkpoint_holds_each_ranks_shards_and_final_loads_with_from_pretrained(fsdp2_run):
    out, _ = fsdp2_run
    checkpoint = out / "checkpoints" / "step_000005"
    sharded = checkpoint / "sharded"
    for name in ("policy", "optimizer"):
        assert (sharded / name / ".metadata").is_file()
        assert len(list((sharded / name).glob("*.distcp"))) == 2  # one file per rank
    assert not (checkpoint / "model" / "model.safetensors").exists()  # the weights are the shards
    assert "optimizer" not in torch.load(checkpoint / "trainer_state.pt", weights_only=True)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(out / "final"))
    assert model.model.embed_tokens.weight.data_ptr() == model.lm_head.weight.data_ptr()  # ties kept


def _process_tree(pid: int) -> list[int]:
    """``pid`` and every process descended from it (from /proc): torchrun starts its workers in sessions of
    their own, so a signal to torchrun's process group does not reach them."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo.extend(children.get(tree[-1], []))
    return tree


def test_kill_9_during_an_fsdp2_run_then_resume_ends_bit_identical(fsdp2_run, taught_model, tmp_path):
    """SIGKILL to every process of a run once its step-2 checkpoint is written; ``--resume`` from that checkpoint
    ends where the uninterrupted 5-step run ended."""
    out = tmp_path / "run"
    config = tmp_path / "config_in.yaml"
    killed = _config(taught_model, out, strategy="fsdp2", checkpoint={"every": 2, "keep": 50})
    # 50 steps: still running when the step-2 checkpoint appears (5 steps of this tiny run can end within one
    # poll); the learning rate is constant, so its first steps are the 5-step run's
    killed["train"] = {**killed["train"], "steps": 50}
    config.write_text(yaml.safe_dump(killed))
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([str(torchrun), "--standalone", "--nproc-per-node=2", "-m", "rlvr", "train", str(config)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 200
        while not (out / "checkpoints" / "step_000002" / "trainer_state.pt").is_file():
            assert process.poll() is None and time.monotonic() < deadline, "the run ended before its first checkpoint"
            time.sleep(0.05)
    finally:
        for pid in _process_tree(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait()
    for later in (out / "checkpoints").iterdir():  # the run went on for a few steps: resume from step 2's
        if later.name != "step_000002":
            shutil.rmtree(later)
    assert not (out / "final").exists()
    again = _torchrun(tmp_path, _config(taught_model, out, strategy="fsdp2"), "--resume", str(out))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from step" in again.stdout and "warning: resuming" not in again.stdout
    assert _max_difference(_weights(out), _weights(fsdp2_run[0])) == 0.0


def test_a_two_rank_fsdp2_checkpoint_resumes_on_one_process(fsdp2_run, tmp_path):
    """Issue 42 item 14: one process (which runs unsharded) resumed it with "holds no state for optimizer ...
    start the run again with --overwrite"; DCP reshards the policy and its optimizer on load."""
    from rlvr.cli import main

    out = tmp_path / "run"
    shutil.copytree(fsdp2_run[0], out)
    shutil.rmtree(out / "final")
    assert main(["train", "--resume", str(out), "train.steps=6", "train.threads=1"]) == 0
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")][-2:] == [5, 6]
    # the optimizer continued from the shards' moments, not from zero: its step count went on from 5
    state = torch.load(out / "checkpoints" / "step_000006" / "trainer_state.pt", weights_only=True)
    assert {int(v["step"]) for v in state["optimizer"]["state"].values()} == {6}


def test_lora_under_fsdp2_trains_the_ddp_adapters(taught_model, tmp_path):
    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    runs = {}
    for strategy in ("ddp", "fsdp2"):
        out = tmp_path / strategy
        raw = _config(taught_model, out, strategy=strategy, model={"path": str(taught_model), "lora": lora},
                      optim={"lr": 1e-2})
        done = _torchrun(tmp_path, raw)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[strategy] = out
    adapter = "adapter/adapter_model.safetensors"
    assert _max_difference(_weights(runs["fsdp2"], adapter), _weights(runs["ddp"], adapter)) < 1e-5
    assert _max_difference(_weights(runs["fsdp2"]), _weights(runs["ddp"])) < 1e-5  # the merged final model


def test_a_sharded_reference_gives_the_ddp_kl(taught_model, tmp_path):
    """Full fine-tuning with beta > 0: the reference model is sharded too, its passes in lockstep."""
    finals = {}
    for strategy in ("ddp", "fsdp2"):
        out = tmp_path / strategy
        done = _torchrun(tmp_path, _config(taught_model, out, strategy=strategy, algorithm={"beta": 0.1},
                                           train={**LOCKSTEP, "steps": 3, "strategy": strategy, "threads": 1,
                                                  "group_size": 4}))
        assert done.returncode == 0, done.stderr[-3000:]
        finals[strategy] = out
    kl = {s: [r.get("train/kl_ref") for r in read_metrics(out / "metrics.jsonl")] for s, out in finals.items()}
    assert kl["fsdp2"][-1] > 0 and kl["fsdp2"] == pytest.approx(kl["ddp"], abs=1e-6)
    assert _max_difference(_weights(finals["fsdp2"]), _weights(finals["ddp"])) < 1e-5


def test_cpu_offload_needs_fsdp2(tiny_model):
    with pytest.raises(ValueError, match="train.cpu_offload needs train.strategy: fsdp2"):
        build_config(RunConfig, {"model": {"path": str(tiny_model)}, "train": {"cpu_offload": True}})


def test_ppo_under_fsdp2_shards_the_critic_ends_within_1e_5_of_ddp_and_resumes_bit_identical(taught_model, tmp_path):
    """PPO (2 epochs x 2 minibatches): policy and critic sharded, the critic's value passes and
    updates in lockstep, its weights and optimizer in the sharded checkpoint."""
    ppo = {"preset": "ppo", "ppo_epochs": 2, "minibatches": 2}
    train = {**LOCKSTEP, "prompts_per_step": 4, "threads": 1, "group_size": 4}
    runs = {}
    for strategy in ("ddp", "fsdp2"):
        out = tmp_path / strategy
        done = _torchrun(tmp_path, _config(taught_model, out, strategy=strategy, algorithm=ppo,
                                           train={**train, "strategy": strategy}))
        assert done.returncode == 0, done.stderr[-3000:]
        runs[strategy] = out
    assert sorted(p.name for p in (runs["fsdp2"] / "checkpoints" / "step_000005" / "sharded").iterdir()) == \
        ["critic", "critic_optimizer", "optimizer", "policy"]
    critic = "../final_critic/model.safetensors"
    for file in ("model.safetensors", critic, "../final_critic/value_head.safetensors"):
        assert _max_difference(_weights(runs["fsdp2"], file), _weights(runs["ddp"], file)) < 1e-5, file
    resumed = tmp_path / "resumed"
    first = _config(taught_model, resumed, strategy="fsdp2", algorithm=ppo, train={**train, "strategy": "fsdp2", "steps": 3})
    assert _torchrun(tmp_path, first).returncode == 0
    again = _torchrun(tmp_path, _config(taught_model, resumed, strategy="fsdp2", algorithm=ppo,
                                        train={**train, "strategy": "fsdp2"}), "--resume", str(resumed))
    assert again.returncode == 0, again.stderr[-3000:]
    for file in ("model.safetensors", critic):
        assert _max_difference(_weights(resumed, file), _weights(runs["fsdp2"], file)) == 0.0, file


def test_fsdp2_refuses_a_lora_critic_naming_the_fields(tiny_model, tmp_path):
    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    raw = _config(tiny_model, tmp_path / "run", strategy="fsdp2", algorithm={"preset": "ppo", "minibatches": 1},
                  model={"path": str(tiny_model), "lora": lora})
    done = _torchrun(tmp_path, raw)
    assert done.returncode != 0
    assert "train.strategy: fsdp2 with model.lora cannot train the ppo preset's critic" in done.stdout + done.stderr
