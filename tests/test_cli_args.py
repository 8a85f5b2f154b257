"""The training commands' arguments: flags and overrides in any order, one ``--resume [RUN_DIR]`` form for
every recipe, ``--debug`` after the command, usage errors with the command's own usage, an interrupted
run's one line, and ``rlvr quickstart --resume`` keeping the stages it finished."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.cli import build_parser, main, parse
from rlvr.commands.run_args import load_run_config
from rlvr.config import RewardModelConfig, RunConfig, SFTConfig, save_config
from rlvr.recipes.scaffold import RunInterrupted


def _args(*argv: str):
    return parse(build_parser(), list(argv))


def _config_file(tmp_path: Path, cls=SFTConfig, **raw) -> Path:
    from rlvr.config import build_config

    path = tmp_path / "cfg.yaml"
    save_config(build_config(cls, {"model": {"path": "m"}, **raw}), path)
    return path


@pytest.mark.parametrize("argv", [
    ["sft", "{cfg}", "--out", "{out}", "train.steps=7", "optim.lr=0.5"],
    ["sft", "{cfg}", "train.steps=7", "--out", "{out}", "optim.lr=0.5"],
    ["sft", "--out", "{out}", "{cfg}", "train.steps=7", "optim.lr=0.5"],
    ["sft", "{cfg}", "train.steps=7", "--overwrite", "optim.lr=0.5", "--out", "{out}"],
])
def test_flags_and_overrides_in_any_order(tmp_path, argv):
    """`rlvr train CFG --out DIR key=value` was rejected with the top-level usage."""
    cfg = _config_file(tmp_path)
    args = _args(*[a.format(cfg=cfg, out=tmp_path / "run") for a in argv])
    config, resume = load_run_config(args, SFTConfig)
    assert config.train.steps == 7 and config.optim.lr == 0.5 and config.out == str(tmp_path / "run") and not resume


def test_one_resume_form_for_every_recipe(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    save_config(RewardModelConfig(model={"path": "m"}, data={"path": "p.jsonl"}, out=str(run)), run / "config.yaml")
    for argv in (["train-rm", "--resume", str(run)], ["train-rm", "--resume", str(run), "train.epochs=2"],
                 ["train-rm", "--out", str(run), "--resume"], ["train-rm", str(run / "config.yaml"), "--resume"],
                 ["train-rm", "--resume", str(run / "config.yaml")]):
        config, resume = load_run_config(_args(*argv), RewardModelConfig)
        assert resume and config.out == str(run), argv
    config, _ = load_run_config(_args("train-rm", "--resume", str(run), "train.epochs=2"), RewardModelConfig)
    assert config.train.epochs == 2
    for command in ("train", "sft", "train-rm", "dpo", "quickstart"):
        assert "--resume" in build_parser()._subparsers._group_actions[0].choices[command].format_usage()


@pytest.mark.parametrize("argv, message", [
    (["sft", "--resume"], "--resume needs the run folder"),
    (["sft"], "give a CONFIG file (or --resume RUN_DIR to continue a run)"),
    (["sft", "--resume", "{run}", "--out", "{other}"], "name different run folders"),
])
def test_resume_mistakes_are_one_line(tmp_path, capsys, argv, message):
    code = main([a.format(run=tmp_path / "a", other=tmp_path / "b") for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_an_unknown_flag_shows_the_commands_own_usage(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["sft", "cfg.yaml", "--no-such-flag"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("usage: rlvr sft") and "--no-such-flag" in err


def test_debug_before_or_after_the_command():
    assert _args("--debug", "tasks", "list").debug and _args("tasks", "list", "--debug").debug
    assert _args("verifiers", "list", "--debug").debug and not _args("tasks", "list").debug


def test_an_interrupted_run_is_one_line_with_exit_130(tmp_path, capsys, monkeypatch):
    import rlvr.recipes.sft

    def interrupted(config, **_):
        raise RunInterrupted("interrupted after step 3: checkpoint X saved", "rlvr sft --resume R", run_dir=tmp_path,
                             step=3)

    monkeypatch.setattr(rlvr.recipes.sft, "train", interrupted)
    assert main(["sft", str(_config_file(tmp_path))]) == 130
    assert capsys.readouterr().err == ("rlvr sft: interrupted after step 3: checkpoint X saved; "
                                       "resume with: rlvr sft --resume R\n")


def test_quickstart_resume_keeps_finished_stages_and_continues_the_interrupted_one(tmp_path, monkeypatch, capsys):
    import rlvr.modeling.tiny
    import rlvr.recipes
    import rlvr.recipes.sft

    calls = []

    def build(path, seed):
        calls.append("build")
        Path(path).mkdir(parents=True)
        (Path(path) / "config.json").write_text("{}")

    def sft(config, **kwargs):
        calls.append(("sft", kwargs))
        summary = {"steps": 7, "eval_accuracy": 0.3}
        (Path(config.out)).mkdir(parents=True, exist_ok=True)
        (Path(config.out) / "summary.json").write_text(json.dumps(summary))
        return summary

    def rl(config, **kwargs):
        calls.append(("rl", kwargs, config.train.seed, config.train.steps))
        if not kwargs.get("resume"):
            step = Path(config.out) / "checkpoints" / "step_000003"
            step.mkdir(parents=True)
            (step / "trainer_state.pt").write_text("")
            raise RunInterrupted("interrupted after step 3: checkpoint C saved", f"rlvr train --resume {config.out}",
                                 run_dir=Path(config.out), step=3)
        return {"accuracy_before": 0.3, "accuracy_after": 0.6, "wall_s": 1.0, "alarms": [], "algorithm": "grpo"}

    monkeypatch.setattr(rlvr.modeling.tiny, "build_tiny_model", build)
    monkeypatch.setattr(rlvr.recipes.sft, "train", sft)
    monkeypatch.setattr(rlvr.recipes, "train", rl)
    out = tmp_path / "q"
    assert main(["quickstart", "--out", str(out), "--seed", "4", "--steps", "9", "--no-progress"]) == 130
    assert capsys.readouterr().err.endswith(f"interrupted after step 3: checkpoint C saved; resume with: "
                                            f"rlvr quickstart --resume {out}\n")
    assert main(["quickstart", "--resume", str(out), "--seed", "5"]) == 2  # its own settings, not new ones
    assert "leave out --seed" in capsys.readouterr().err
    calls.clear()
    assert main(["quickstart", "--resume", str(out), "--no-progress"]) == 0
    assert calls == [("rl", {"resume": True}, 4, 9)]  # no model built, no SFT: only the RL stage, resumed
    assert json.loads((out / "summary.json").read_text())["accuracy_after"] == 0.6


def test_the_train_command_resumes_from_the_runs_own_config(tmp_path, monkeypatch):
    import rlvr.recipes

    run = tmp_path / "run"
    run.mkdir()
    save_config(RunConfig(model={"path": "m"}, out=str(run)), run / "config.yaml")
    seen = {}
    monkeypatch.setattr(rlvr.recipes, "train", lambda config, **kw: seen.update(config=config, **kw) or
                        {"run_folder": str(run)})
    assert main(["train", "--resume", str(run), "train.steps=3"]) == 0
    assert seen["resume"] and seen["config"].out == str(run) and seen["config"].train.steps == 3
