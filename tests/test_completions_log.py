"""``completions.jsonl``: a sample of each logged step's prompts, completions, rewards and verifier
statuses in the run folder (``rlvr/run/completions_log.py``), at ``log.completions_every`` steps, whole
groups up to ``log.completions_per_step`` samples, and no step twice after a resume."""

from __future__ import annotations

import json
import shutil

import yaml

from rlvr.cli import main
from rlvr.engines.base import Completion
from rlvr.rollout.groups import Group
from rlvr.run.completions_log import FILENAME, CompletionsLog
from rlvr.run.folder import RUN_FILES
from rlvr.tasks.base import Problem
from rlvr.verifiers.base import Reward


def group(index: int, size: int) -> Group:
    problem = Problem(id=f"demo/{index}", prompt=[{"role": "user", "content": f"{index}+1="}],
                      reference={"answer": str(index + 1)}, verifier="numeric")
    completions = [Completion(token_ids=[1, 2], text=f"{index + k}", logprobs=[0.0, 0.0], finish_reason="stop")
                   for k in range(size)]
    rewards = [Reward(score=float(k == 1), status="ok" if k else "error", info={"extracted": str(index + k)})
               for k in range(size)]
    return Group(suite="demo", problem=problem, prompt_ids=[5, 6], completions=completions, rewards=rewards)


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_whole_groups_up_to_the_limit_at_the_rate(tmp_path):
    log = CompletionsLog(tmp_path, every=2, per_step=5, done=0)
    groups = [group(i, 2) for i in range(4)]
    assert log.write(1, groups) == 4  # two whole groups of 2; a third would pass 5
    log.record(1, type("Rollout", (), {"groups": groups})())  # step 1 is not due at every=2: nothing
    log.record(2, type("Rollout", (), {"groups": [group(9, 8)]})())  # a first group larger than the limit: cut
    records = lines(tmp_path / FILENAME)
    assert [(r["step"], r["group"], r["sample"]) for r in records] == \
        [(1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)] + [(2, 0, k) for k in range(5)]
    first = records[1]
    assert first == {"step": 1, "group": 0, "sample": 1, "suite": "demo", "problem_id": "demo/0",
                     "prompt": [{"role": "user", "content": "0+1="}], "completion": "1", "reward": 1.0,
                     "status": "ok", "extracted": "1", "finish_reason": "stop", "tokens": 2}
    assert records[0]["status"] == "error"
    assert not CompletionsLog(tmp_path, every=0, per_step=5).due(3)  # log.completions_every: 0 = never


def test_a_resumed_log_drops_the_steps_after_the_checkpoint_and_other_ranks_write_nothing(tmp_path):
    log = CompletionsLog(tmp_path, every=1, per_step=2)
    for step in (1, 2, 3):
        log.write(step, [group(step, 2)])
    with (tmp_path / FILENAME).open("a") as f:
        f.write('{"step": 4, "gro')  # a torn last line from a crash
    CompletionsLog(tmp_path, every=1, per_step=2, done=2)  # resuming after the checkpoint of step 2
    assert [r["step"] for r in lines(tmp_path / FILENAME)] == [1, 1, 2, 2]
    other_rank = CompletionsLog(tmp_path, every=1, per_step=2, done=0, enabled=False)
    assert not other_rank.due(1) and [r["step"] for r in lines(tmp_path / FILENAME)] == [1, 1, 2, 2]
    assert FILENAME in RUN_FILES  # a folder holding one holds a run (refused, replaced by --overwrite)


def test_a_training_run_writes_it_and_a_resume_repeats_no_step(tmp_path, tiny_model, capsys):
    """A real GRPO run of 2 steps, its last checkpoint lost (a crash after step 2 was logged, before it was
    saved): the resumed run trains step 2 again and completions.jsonl holds it once."""
    run = tmp_path / "run"
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"path": str(tiny_model)}, "out": str(run),
        "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
        "generation": {"max_new_tokens": 3}, "train": {"steps": 2, "prompts_per_step": 2, "group_size": 2},
        "eval": {"at_start": False, "at_end": False}, "checkpoint": {"every": 1, "keep": 2},
        "log": {"progress": False, "plot": False, "completions_per_step": 3},
    }))
    assert main(["train", str(config)]) == 0
    records = lines(run / FILENAME)
    assert [(r["step"], r["group"]) for r in records] == [(1, 0), (1, 0), (2, 0), (2, 0)]  # whole groups of 2
    assert all(r["status"] == "ok" and r["completion"] is not None and "valid" in r for r in records)
    shutil.rmtree(run / "checkpoints" / "step_000002")
    assert main(["train", "--resume", str(run)]) == 0
    capsys.readouterr()
    assert [r["step"] for r in lines(run / FILENAME)] == [1, 1, 2, 2]
