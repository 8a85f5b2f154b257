"""The command line: every command explains its options; bad configs fail with the key named."""

import subprocess
import sys

import pytest

from rlvr.cli import build_parser
from rlvr.configs import load_packaged


def _subcommands(parser):
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return action.choices


def test_every_command_has_help_for_every_option():
    parser = build_parser()
    for name, sub in _subcommands(parser).items():
        for action in sub._actions:
            if action.dest in ("help",) or action.__class__.__name__ == "_SubParsersAction":
                continue
            assert action.help, f"rlvr {name}: option {action.dest} has no help"


def _all_parsers(parser, prefix="rlvr"):
    for name, sub in _subcommands(parser).items():
        yield f"{prefix} {name}", sub
        if any(a.__class__.__name__ == "_SubParsersAction" for a in sub._actions):
            yield from _all_parsers(sub, f"{prefix} {name}")


def test_help_states_defaults_once_and_never_none():
    for name, sub in _all_parsers(build_parser()):
        text = sub.format_help()
        assert "(default: None)" not in text and "(default: False)" not in text and "(default: [])" not in text, name
        for action in sub._actions:
            help_text = (sub._get_formatter()._get_help_string(action) or "").replace("%(default)s", str(action.default))
            assert help_text.count("(default") <= 1, (name, action.dest, help_text)


def test_quickstart_help_names_the_packaged_step_count():
    steps = load_packaged("quickstart.yaml")["train"]["steps"]
    quickstart = _subcommands(build_parser())["quickstart"]
    assert f"the packaged config's {steps})" in " ".join(quickstart.format_help().split())


def test_eval_verifies_under_a_deadline_by_default():
    args = build_parser().parse_args(["eval", "--model", "m", "--task", "arithmetic"])
    assert args.workers is None and args.timeout > 0  # None = one worker per core, each item under the deadline


@pytest.mark.parametrize("argv", [["--help"], ["quickstart", "--help"], ["train", "--help"], ["sft", "--help"]])
def test_help_exits_cleanly(argv):
    result = subprocess.run([sys.executable, "-m", "rlvr.cli", *argv], capture_output=True, text=True)
    assert result.returncode == 0 and "usage: rlvr" in result.stdout


def test_train_with_a_bad_key_names_it(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model: {path: x}\nalgorithm: {clip_hi: 0.3}\n")
    result = subprocess.run([sys.executable, "-m", "rlvr.cli", "train", str(config)], capture_output=True, text=True)
    assert result.returncode == 2
    assert "algorithm.clip_hi: unknown key" in result.stderr and "clip_high" in result.stderr


def test_train_without_config_or_resume_is_a_usage_error():
    result = subprocess.run([sys.executable, "-m", "rlvr.cli", "train"], capture_output=True, text=True)
    assert result.returncode == 2 and "CONFIG" in result.stderr


@pytest.mark.parametrize("content", ["", "\n\n"])
def test_verify_of_a_file_with_nothing_to_score_exits_1_in_one_line(tmp_path, capsys, content):
    """README: `rlvr verify` exits 1 when nothing is scored; an empty input scores nothing (and writes no output)."""
    from rlvr.cli import main

    source = tmp_path / "empty.jsonl"
    source.write_text(content)
    code = main(["verify", "--verifier", "numeric", "--input", str(source), "--workers", "0",
                 "--output", str(tmp_path / "scored.jsonl")])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1 and "nothing to score" in err and str(source) in err
    assert not (tmp_path / "scored.jsonl").exists()
