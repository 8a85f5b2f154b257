"""The embedded default end to end: the README's first command must make the model better."""

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_quickstart_improves_held_out_accuracy(tmp_path):
    result = subprocess.run([sys.executable, "-m", "rlvr.cli", "quickstart", "--out", str(tmp_path), "--no-progress"],
                            capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["eval_problems"] >= 200 and summary["steps"] == 600
    assert summary["accuracy_after"] >= summary["accuracy_before"] + 0.15, summary
    assert "before GRPO" in result.stdout and "after" in result.stdout
    for name in ("config.yaml", "metrics.jsonl", "metrics.png", "final/model.safetensors", "sft/final/model.safetensors"):
        assert (tmp_path / name).is_file(), name
    assert list((tmp_path / "checkpoints").glob("step_*/trainer_state.pt"))
