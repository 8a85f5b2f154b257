"""Data-parallel runs end to end: ``torchrun --nproc-per-node 2 -m rlvr train`` on the CPU (gloo), and
the pieces each rank uses (its share of the problems, the metrics reduction, the world-size checks)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from rlvr.config import RunConfig, build_config
from rlvr.run.ranks import check_world_size, reduce_metrics
from rlvr.rollout.sampler import ProblemSampler, RankSampler
from rlvr.run.runtime import Distributed
from rlvr.run.tracking import read_metrics
from rlvr.verifiers.errors import InvalidValueError


def _raw(model, out, **train):
    return {
        "out": str(out),
        "model": {"path": str(model)},
        "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
        "generation": {"max_new_tokens": 3},
        "optim": {"lr": 1e-3},
        "train": {"steps": 3, "prompts_per_step": 8, "group_size": 4, "micro_batch_size": 16, "threads": 1, **train},
        "eval": {"limit": 6, "at_end": False},  # an evaluation at the last step would draw from rank 0's RNG
        "checkpoint": {"every": 2},
        "log": {"progress": False, "plot_every": 0},
    }


def _torchrun(tmp_path, raw: dict, *args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    config = tmp_path / "config_in.yaml"
    config.write_text(yaml.safe_dump(raw))
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(torchrun), "--standalone", f"--nproc-per-node={nproc}", "-m", "rlvr", "train",
                           str(config), *args], capture_output=True, text=True, timeout=240, env=env)


@pytest.mark.slow
def test_two_ranks_under_torchrun_train_one_model_and_rank_0_alone_writes(tiny_model, tmp_path):
    out = tmp_path / "run"
    done = _torchrun(tmp_path, _raw(tiny_model, out, steps=3))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("run folder: ") == 2  # rank 0 alone: its first line and `rlvr train`'s last
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3]  # eval at start, then one line per step, rank 0 only
    assert records[1]["verify/status_ok"] + records[1].get("verify/status_error", 0) == 8 * 4  # summed over ranks
    summary = json.loads((out / "summary.json").read_text())
    checksums = summary["replicas"]["weights_checksums"]
    assert summary["replicas"]["world_size"] == 2 and len(checksums) == 2 and checksums[0] == checksums[1]
    assert (out / "final" / "config.json").is_file() and (out / "checkpoints" / "step_000003").is_dir()

    import torch

    state = torch.load(out / "checkpoints" / "step_000003" / "trainer_state.pt", weights_only=True)
    ranks = state["ranks"]
    assert len(ranks) == 2 and not torch.equal(ranks[0]["rng"]["torch"], ranks[1]["rng"]["torch"])  # seed + rank


@pytest.mark.slow
def test_a_two_rank_run_resumed_on_two_ranks_ends_where_an_uninterrupted_one_ends(tiny_model, tmp_path):
    """Each rank restores its own RNG and sampler state: the final weights match bit for bit."""
    out = tmp_path / "run"
    assert _torchrun(tmp_path, _raw(tiny_model, out, steps=3)).returncode == 0
    again = _torchrun(tmp_path, _raw(tiny_model, out, steps=4), "--resume", str(out))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from step 3 of 4" in again.stdout and "warning: resuming" not in again.stdout
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [0, 1, 2, 3, 4]
    resumed = json.loads((out / "summary.json").read_text())["replicas"]["weights_checksums"]
    whole = tmp_path / "whole"
    assert _torchrun(tmp_path, _raw(tiny_model, whole, steps=4)).returncode == 0
    assert resumed == json.loads((whole / "summary.json").read_text())["replicas"]["weights_checksums"]


@pytest.mark.slow
def test_ppo_under_torchrun_keeps_policy_and_critic_replicas_identical(tiny_model, tmp_path):
    """Two epochs of two minibatches, the adaptive KL controller and whitening over both ranks."""
    out = tmp_path / "run"
    raw = _raw(tiny_model, out, steps=2) | {"algorithm": {"preset": "ppo", "ppo_epochs": 2, "minibatches": 2,
                                                          "target_kl": 0.1}}
    done = _torchrun(tmp_path, raw)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [0, 1, 2]
    summary = json.loads((out / "summary.json").read_text())
    assert len(set(summary["replicas"]["weights_checksums"])) == 1
    assert (out / "final_critic").is_dir() and (out / "final" / "config.json").is_file()


def test_prompts_per_step_must_divide_among_the_ranks(tiny_model, tmp_path):
    config = build_config(RunConfig, _raw(tiny_model, tmp_path, prompts_per_step=7), [])
    check_world_size(config, 1)
    with pytest.raises(InvalidValueError, match=r"train\.prompts_per_step=7 is not divisible by the 2 ranks"):
        check_world_size(config, 2)


@pytest.mark.slow
def test_torchrun_refuses_prompts_per_step_not_divisible_by_the_ranks(tiny_model, tmp_path):
    done = _torchrun(tmp_path, _raw(tiny_model, tmp_path / "run", prompts_per_step=7))
    assert done.returncode != 0 and "train.prompts_per_step=7 is not divisible by the 2 ranks" in done.stderr
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_ranks_take_disjoint_whole_groups_of_the_same_draw(tiny_model):
    from rlvr.tasks import get_task

    problems = list(get_task("arithmetic", n=50))
    whole = ProblemSampler({"a": problems}, {"a": 1.0}, seed=3).next(8)
    shares = [RankSampler(ProblemSampler({"a": problems}, {"a": 1.0}, seed=3), rank, 2).next(4) for rank in (0, 1)]
    assert shares[0] == whole[0::2] and shares[1] == whole[1::2]
    one = ProblemSampler({"a": problems}, {"a": 1.0}, seed=3)
    assert RankSampler(one).next(8) == whole


def test_metrics_sum_counts_take_the_slowest_time_and_average_the_rest(monkeypatch):
    dist = Distributed(rank=0, world_size=2)
    ranks = [{"reward/mean": 0.2, "verify/status_ok": 10.0, "time/step": 1.0, "train/pg_loss": 0.1},
             {"reward/mean": 0.6, "verify/status_ok": 6.0, "verify/status_error": 2.0, "time/step": 3.0,
              "train/pg_loss": 0.3}]
    monkeypatch.setattr(Distributed, "gather", lambda self, obj: ranks)
    out = reduce_metrics(ranks[0], dist)
    assert out == pytest.approx({"reward/mean": 0.4, "verify/status_ok": 16.0, "verify/status_error": 2.0,
                                 "time/step": 3.0, "train/pg_loss": 0.4})
    assert reduce_metrics({"x": 1.0}, Distributed()) == {"x": 1.0}


def test_a_checkpoint_of_another_world_size_resumes_with_a_one_line_warning(capsys):
    from rlvr.run.ranks import restore_rank_state
    from rlvr.run.runtime import rng_state
    from rlvr.tasks import get_task

    problems = list(get_task("arithmetic", n=50))
    saved_by = ProblemSampler({"a": problems}, {"a": 1.0}, seed=3)
    saved_by.next(6)
    saved = [{"rng": rng_state(), "sampler": saved_by.state_dict()}] * 2  # two ranks, the same data position
    sampler = RankSampler(ProblemSampler({"a": problems}, {"a": 1.0}, seed=3))
    restore_rank_state(saved, Distributed(), sampler, seed=0, step=3)
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("warning: resuming a 2-rank checkpoint on 1 ranks")
    assert sampler.next(2) == saved_by.next(2)  # rank 0's data position
    restore_rank_state(saved[:1], Distributed(), sampler, seed=0, step=3)  # as many ranks: silent
    assert capsys.readouterr().out == ""


def _offline_torchrun(tmp_path, command: str, raw: dict, nproc: int) -> subprocess.CompletedProcess:
    config = tmp_path / f"{command}_{nproc}.yaml"
    config.write_text(yaml.safe_dump(raw))
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(torchrun), "--standalone", f"--nproc-per-node={nproc}", "-m", "rlvr", command,
                           str(config)], capture_output=True, text=True, timeout=240, env=env)


#: The offline recipes that take ``train.strategy: fsdp2`` (tested against one process as well).
SHARDED_COMMANDS = ("sft", "train-rm", "dpo")


@pytest.mark.slow
@pytest.mark.parametrize("command", ["dpo", "train-rm", "sft"])
def test_offline_recipes_on_two_ranks_match_one_process(tiny_model, tmp_path, command):
    """SFT, DPO and the reward model split each optimizer step's examples between the ranks and sum
    the gradients: two ranks end where one process on the whole batches ends (up to float rounding of
    the summed halves), with identical replicas, and rank 0 alone writes the run folder."""
    from safetensors.torch import load_file

    rows = [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)}
            for a in range(6) for b in range(6)]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    final, evaluations, losses = {}, {}, {}
    for nproc, strategy in [(1, "ddp"), (2, "ddp")] + [(2, "fsdp2")] * (command in SHARDED_COMMANDS):
        out = tmp_path / f"{command}-{nproc}-{strategy}"
        train = {"batch_size": 9, "micro_batch_size": 2, "threads": 1, "strategy": strategy}  # 5 + 4 rows a step
        raw = {"out": str(out), "model": {"path": str(tiny_model)}, "data": {"path": str(data), "eval_fraction": 0.25},
               "optim": {"lr": 3e-3}, "train": {"epochs": 2, **train}, "log": {"progress": False, "plot": False}}
        if command == "sft":  # the arithmetic suite's gold answers, evaluated every 2 steps
            raw.update(data={"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}, "limit": 60},
                       train={"steps": 6, **train}, eval={"every": 2, "limit": 10, "max_new_tokens": 3})
        if command == "train-rm":
            raw.update(head="logprob", checkpoint={"every": 0})
        done = _offline_torchrun(tmp_path, command, raw, nproc)
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads((out / "summary.json").read_text())
        if strategy == "fsdp2":
            assert "sharded over 2 ranks" in done.stdout and "replicas" not in summary
        elif nproc == 2:
            assert len(set(summary["replicas"]["weights_checksums"])) == 1
        if nproc == 2:
            assert done.stdout.count("run folder:") == 1  # rank 0 alone speaks and writes
        final[nproc, strategy] = load_file(str(out / "final" / "model.safetensors"))
        records = read_metrics(out / "metrics.jsonl")
        assert [r["step"] for r in records if "train/loss" in r] == list(range(1, summary["steps"] + 1))
        evaluations[nproc, strategy] = [{k: v for k, v in r.items() if k.startswith("eval/")} for r in records]
        losses[nproc, strategy] = [r["train/loss"] for r in records if "train/loss" in r]
    for name, tensor in final[1, "ddp"].items():
        assert torch.allclose(tensor, final[2, "ddp"][name], atol=2e-5), name
    if (2, "fsdp2") in final:
        # FSDP2 reduce-scatters each micro-batch's gradient (sums in another order than ddp's one flat sum): the
        # losses agree to float32 rounding, and AdamW, which divides by the root of tiny second moments,
        # turns that rounding into weight differences of up to ~1% of one step (lr 3e-3) after 6 steps
        assert losses[2, "fsdp2"] == pytest.approx(losses[2, "ddp"], rel=1e-5)
        for name, tensor in final[2, "ddp"].items():
            assert torch.allclose(tensor, final[2, "fsdp2"][name], atol=1e-4), name
        # sharded evaluation passes (sft, dpo: rank 0's whole copy generates) measure what the shards hold
        for sharded, whole in zip(evaluations[2, "fsdp2"], evaluations[2, "ddp"], strict=True):
            assert sharded == pytest.approx(whole, abs=1e-4)
