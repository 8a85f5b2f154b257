"""The real-model recipes (rlvr/configs/smollm2_arith*.yaml) start, train a step and evaluate on
SmolLM2-135M-Instruct itself, so a change that breaks a real pretrained model (its chat template, its
tokenizer, peft's wrapping of it) fails here, not in a user's first run.

The model folder: ``$RLVR_SMOLLM2``. ``.ci/run`` builds it offline in the background while the suite
runs (``../shared/tools/make_smollm2.sh``, a few minutes) and points the variable at it; the fixture
waits for that build. Without a folder (no variable, or no build tool) the tests skip, saying why.
The learning numbers (3 seeds, before -> after) are benchmarks/smollm2_recipe.py's, in docs/real-models.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

CONFIGS = Path(__file__).resolve().parents[1] / "rlvr" / "configs"
WAIT_FOR_BUILD_S = 900


@pytest.fixture(scope="module")
def smollm2() -> Path:
    """The SmolLM2-135M-Instruct folder, waiting for ``.ci/run``'s background build when one is running
    (it writes ``DIR.failed`` if it fails, and moves the finished folder to DIR in one step)."""
    folder = os.environ.get("RLVR_SMOLLM2")
    if not folder:
        pytest.skip("no SmolLM2-135M-Instruct folder: set RLVR_SMOLLM2 (build one offline with "
                    "../shared/tools/make_smollm2.sh DIR; .ci/run does)")
    path = Path(folder)
    deadline = time.monotonic() + WAIT_FOR_BUILD_S
    building = Path(f"{path}.building")
    while not (path / "config.json").is_file() and building.exists() and time.monotonic() < deadline:
        time.sleep(5)
    if not (path / "config.json").is_file():
        failed = Path(f"{path}.failed")
        why = f"its build failed (see {failed})" if failed.exists() else "no model there"
        pytest.skip(f"RLVR_SMOLLM2={path}: {why}")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["smollm2_arith.yaml", "smollm2_arith_lora.yaml"])
def test_the_recipe_starts_trains_a_step_and_evaluates(smollm2, recipe, tmp_path):
    """The packaged recipe as a user runs it (its chat template, options and algorithm), shortened to one
    step of 2 prompts x 4 samples and an evaluation of 8 held-out sums before and after."""
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "train", str(CONFIGS / recipe), f"model.path={smollm2}", f"out={out}",
         "train.steps=1", "train.prompts_per_step=2", "train.group_size=4", "eval.limit=8", "eval.every=0",
         "checkpoint.every=0", "log.progress=false", "log.plot_every=0"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 1
    for evaluation in summary["evaluations"].values():  # before (step 0) and after the step, every sum scored
        assert evaluation["eval/arithmetic/status_ok"] == 8, evaluation
    assert 0.0 <= summary["accuracy_before"] <= 1.0 and 0.0 <= summary["accuracy_after"] <= 1.0
    assert "chat_template auto" in result.stdout  # the model's own template renders the prompts
    step = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"train/loss"' in line]
    assert len(step) == 1 and step[0]["train/optimizer_steps"] == 1
    assert (out / "final" / "model.safetensors").is_file()  # (LoRA's merged into the weights, adapter/ beside)
    assert (out / "final" / "adapter").is_dir() == ("lora" in recipe)
