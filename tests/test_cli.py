"""The command line: every command explains its options; bad configs fail with the key named."""

import subprocess
import sys

import pytest

from rlvr.cli import build_parser


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
