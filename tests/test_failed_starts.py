"""A start that fails costs nothing (issue 42, items 13, 16, 17): whatever stops a run before its first step
(a wrong model path, data file, option or device found while the run is built, a Ctrl-C during start-up)
leaves its folder as it found it, so the corrected command runs in the same folder; and ``--overwrite``
with a bad setting leaves the previous run intact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_user_errors import assert_one_line, run_cli, write_config

#: What a finished ``rlvr train`` leaves at the top of its folder (write_config draws the plot at the end only).
FINISHED = ["checkpoints", "completions.jsonl", "config.yaml", "final", "metrics.jsonl", "metrics.png", "summary.json"]


def _tree(folder: Path) -> dict[str, int]:
    """Every file under ``folder`` with its size: what a failed start must leave exactly as it was."""
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def finished_run(capsys, tmp_path, tiny_model) -> Path:
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_model, run)
    assert run_cli(capsys, "train", str(cfg))[0] == 0
    assert sorted(p.name for p in run.iterdir()) == FINISHED
    return run


# every kind of failed start: the override that breaks it, and what the one-line error says
FAILED_STARTS = {
    "model": (["model.path=/nonexistent/model"], "/nonexistent/model"),
    "data": (["data=[{task: custom, path: nope.jsonl, options: {answer_field: answer}}]"], "nope.jsonl"),
    "option": (["train.cpu_offload=true", "train.strategy=fsdp2"], "train.cpu_offload"),
}


@pytest.mark.parametrize("kind", sorted(FAILED_STARTS))
def test_overwrite_with_a_bad_setting_leaves_the_previous_run_intact(capsys, tmp_path, tiny_model, finished_run, kind):
    before = _tree(finished_run)
    overrides, named = FAILED_STARTS[kind]
    cfg = tmp_path / "c.yaml"
    code, _, err = run_cli(capsys, "train", str(cfg), *overrides, "--overwrite")
    assert code == 2
    assert_one_line(err, named)
    assert _tree(finished_run) == before  # config, metrics, checkpoints, final model and summary all kept
    assert not (finished_run / ".previous-run").exists()
    # the corrected command replaces it
    code, _, _ = run_cli(capsys, "train", str(cfg), "--overwrite")
    assert code == 0 and sorted(p.name for p in finished_run.iterdir()) == FINISHED


@pytest.mark.parametrize("kind", sorted(FAILED_STARTS))
def test_a_failed_start_leaves_nothing_and_the_corrected_command_runs_in_its_folder(capsys, tmp_path, tiny_model,
                                                                                    kind):
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_model, run)
    overrides, named = FAILED_STARTS[kind]
    code, _, err = run_cli(capsys, "train", str(cfg), *overrides)
    assert code == 2
    assert_one_line(err, named)
    assert not run.exists()  # the folder it made is gone again: no stub that blocks it
    code, _, _ = run_cli(capsys, "train", str(cfg))  # no --overwrite, no --resume needed
    assert code == 0 and sorted(p.name for p in run.iterdir()) == FINISHED


def test_a_failed_start_keeps_the_users_own_files(capsys, tmp_path, tiny_model):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    cfg = write_config(tmp_path / "c.yaml", tiny_model, run)
    assert run_cli(capsys, "train", str(cfg), "model.path=/nonexistent/model")[0] == 2
    assert [p.name for p in run.iterdir()] == ["notes.txt"]


def test_a_failed_start_without_out_leaves_no_empty_folder(capsys, tmp_path, tiny_model, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = write_config(tmp_path / "c.yaml", tiny_model)
    assert run_cli(capsys, "train", str(cfg), "model.path=/nonexistent/model")[0] == 2
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_ctrl_c_during_start_up_undoes_the_start(capsys, tmp_path, tiny_model, finished_run, monkeypatch):
    """A Ctrl-C while the models load: the start is undone (the replaced run is back) and the message says
    the folder is as it was, not to resume a run that has no checkpoint."""
    from rlvr.recipes import rl_run

    before = _tree(finished_run)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(rl_run, "load_run_policy", interrupted)
    code, _, err = run_cli(capsys, "train", str(tmp_path / "c.yaml"), "--overwrite")
    assert code == 130
    assert "aborted during start-up, before the first step" in err and "is as it was" in err
    assert _tree(finished_run) == before
    monkeypatch.undo()
    assert run_cli(capsys, "train", str(tmp_path / "c.yaml"), "--overwrite")[0] == 0


def test_a_run_that_fails_after_its_first_step_is_kept(capsys, tmp_path, tiny_model, finished_run, monkeypatch):
    """Past its first step the new run is the folder's run: --overwrite's old run is gone, and the new
    run's checkpoint resumes."""
    from rlvr.recipes import rl_run

    calls = {"n": 0}
    original = rl_run.RLRun.end_step

    def fail_on_second(self, step, metrics, **kwargs):
        original(self, step, metrics, **kwargs)
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom after step 2")

    monkeypatch.setattr(rl_run.RLRun, "end_step", fail_on_second)
    cfg = tmp_path / "c.yaml"
    with pytest.raises(RuntimeError, match="boom"):
        from rlvr.cli import main
        main(["--debug", "train", str(cfg), "train.steps=3", "checkpoint.every=1", "--overwrite"])
    assert not (finished_run / ".previous-run").exists()
    assert not (finished_run / "final").exists()  # the old run's final model went with it
    assert [json.loads(line)["step"] for line in (finished_run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    monkeypatch.undo()
    assert run_cli(capsys, "train", "--resume", str(finished_run))[0] == 0


def test_overrides_given_to_resume_are_kept_for_the_next_resume(capsys, tmp_path, tiny_model, finished_run):
    """Item 23: `--resume train.steps=2` ran to step 2, then a plain --resume must not go back to 1 step."""
    assert run_cli(capsys, "train", "--resume", str(finished_run), "train.steps=2")[0] == 0
    assert "steps: 2" in (finished_run / "config.yaml").read_text()
    code, out, _ = run_cli(capsys, "train", "--resume", str(finished_run))
    assert code == 0 and "resuming from step 2 of 2" in out


def test_overrides_may_stand_before_the_config_file(capsys, tmp_path, tiny_model):
    """Item 23: `rlvr train train.steps=1 model.path=M CFG` said "give a CONFIG file"."""
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", "/nonexistent/model", run)
    code, _, _ = run_cli(capsys, "train", "train.steps=1", f"model.path={tiny_model}", str(cfg))
    assert code == 0 and (run / "final").is_dir()


# ---------------------------------------------------------------------------------------------
# the quickstart: every stage checked before the first, nothing left by a start that fails
# ---------------------------------------------------------------------------------------------


def test_quickstart_refusals_come_before_anything_is_written(capsys, tmp_path):
    """Item 17 and 18: a device the machine lacks, a misspelt key of the RL stage, a task that takes no
    other algorithm: one line each, before the tiny model is built or SFT trains, and no folder."""
    import torch

    out = tmp_path / "q"
    cases = [(["--task", "tools", "--algorithm", "ppo"], "--task tools", "--algorithm ppo"),
             (["--task", "tools", "--reward-model"], "--task tools", "--reward-model"),
             (["train.stepz=3"], "train.stepz")]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], "--device=cuda", "no CUDA device"))
    for argv, *named in cases:
        code, _, err = run_cli(capsys, "quickstart", "--out", str(out), "--no-progress", *argv)
        assert code == 2, (argv, err)
        assert_one_line(err, *named)
        assert not out.exists(), argv


def test_quickstart_resume_may_change_the_device_only(capsys, tmp_path, monkeypatch):
    """Item 17: a quickstart started with --device cuda resumes on the CPU with --resume --device cpu (it
    was refused), and the device it continues on is kept for the next resume."""
    import rlvr.recipes.quickstart as qs

    out = tmp_path / "q"
    out.mkdir()
    (out / "quickstart.json").write_text(json.dumps(dict(seed=3, steps=2, device="cuda", overrides=[],
                                                         algorithm="grpo", reward_model=False, task="arithmetic")))
    (out / "base_model").mkdir()
    seen = {}

    def stages(run_dir, configs, **settings):
        seen.update(settings, sft_device=configs["sft"].train.device, rl_device=configs["rl"].train.device)
        raise KeyboardInterrupt

    monkeypatch.setattr(qs, "_stages", stages)
    code, _, err = run_cli(capsys, "quickstart", "--resume", str(out), "--device", "cpu")
    assert code == 130 and f"rlvr quickstart --resume {out}" in err
    assert seen["device"] == seen["sft_device"] == seen["rl_device"] == "cpu" and seen["seed"] == 3
    assert json.loads((out / "quickstart.json").read_text())["device"] == "cpu"
    assert (out / "base_model").is_dir()  # a resumed quickstart's folder is never undone


# ---------------------------------------------------------------------------------------------
# found before the policy loads; said once under torchrun
# ---------------------------------------------------------------------------------------------


def test_a_reward_model_path_and_a_missing_engine_package_fail_before_the_policy_loads(capsys, tmp_path, tiny_model,
                                                                                       monkeypatch):
    """Item 24: `reward_model.path=nope` and a missing vLLM were found only after the policy had loaded."""
    from rlvr.engines import ENGINES
    from rlvr.recipes import rl_run

    def never(*args, **kwargs):
        raise AssertionError("the policy was loaded before the check")

    monkeypatch.setattr(rl_run, "load_run_policy", never)
    cfg = write_config(tmp_path / "c.yaml", tiny_model, tmp_path / "run")
    code, _, err = run_cli(capsys, "train", str(cfg), "reward_model.path=/nonexistent/rm",
                           "reward_model.combine=replace")
    assert code == 2
    assert_one_line(err, "reward_model.path", "/nonexistent/rm")
    ENGINES.lazy("not_installed_engine", "rlvr_no_such_package.engine:Engine", install="pip install rlvr-no-such")
    try:
        code, _, err = run_cli(capsys, "train", str(cfg), "engine.name=not_installed_engine")
    finally:
        ENGINES._lazy.pop("not_installed_engine", None)
        ENGINES._failed.pop("not_installed_engine", None)
    assert code == 2
    assert_one_line(err, "not_installed_engine", "pip install rlvr-no-such")
    assert not (tmp_path / "run").exists()


def test_under_torchrun_rank_0_alone_prints_a_user_error(capsys, tmp_path, tiny_model, monkeypatch):
    cfg = write_config(tmp_path / "c.yaml", tiny_model, tmp_path / "run", verifier={"name": "mathh"})
    monkeypatch.setenv("RANK", "1")
    code, out, err = run_cli(capsys, "train", str(cfg))
    assert code == 2 and out == "" and err == ""
    monkeypatch.setenv("RANK", "0")
    code, _, err = run_cli(capsys, "train", str(cfg))
    assert code == 2 and "unknown verifier 'mathh'" in err


def test_sft_overwrite_with_a_missing_data_file_keeps_the_previous_run(capsys, tmp_path, tiny_model):
    """Item 16's second case: `rlvr sft ... data.path=nope.jsonl --overwrite` deleted the finished run."""
    import yaml

    run = tmp_path / "run"
    cfg = tmp_path / "sft.yaml"
    cfg.write_text(yaml.safe_dump({
        "out": str(run), "model": {"path": str(tiny_model)},
        "data": {"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}, "limit": 50},
        "train": {"steps": 1, "batch_size": 4, "threads": 1}, "eval": {"every": 0, "at_end": False},
        "checkpoint": {"every": 100}, "log": {"progress": False, "plot": False}}))
    assert run_cli(capsys, "sft", str(cfg))[0] == 0
    before = _tree(run)
    assert "final/config.json" in before
    code, _, err = run_cli(capsys, "sft", str(cfg),
                           "data={task: custom, path: nope.jsonl, options: {answer_field: answer}}", "--overwrite")
    assert code == 2 and "nope.jsonl" in err
    assert _tree(run) == before


def test_a_ppo_run_s_critic_is_part_of_the_run(tmp_path):
    """A PPO run writes its critic beside final/ (final_critic/): a folder holding one holds a run (refused
    without --overwrite), and --overwrite replaces it with the rest, so no critic of an older run is left
    beside a new run's policy."""
    from rlvr.run.folder import RunFolderError, prepare_run_folder

    (tmp_path / "final_critic").mkdir()
    (tmp_path / "final_critic" / "value_head.safetensors").write_text("old")
    with pytest.raises(RunFolderError):
        prepare_run_folder(tmp_path, name="ppo")
    assert "final_critic" in prepare_run_folder(tmp_path, name="ppo", overwrite=True).replacing
