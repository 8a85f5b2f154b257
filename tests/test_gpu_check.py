"""The GPU acceptance script (``benchmarks/gpu_check.py``) runs every check's code in its dry mode: tiny
shapes on the CPU, so a renamed function or option cannot rot it between the sessions that have a GPU."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.mark.slow
def test_every_gpu_check_passes_its_dry_run_on_the_cpu(tmp_path):
    import gpu_check

    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--dry-run", "--out", str(out)]) == 0
    checks = json.loads(out.read_text())["checks"]
    assert sorted(checks) == sorted(gpu_check.CHECKS)
    assert all(row["ok"] for row in checks.values()), checks
    master = checks["master_weights"]
    assert master["bf16 master: moved"] > 0.99 and master["bf16 in place (old): moved"] < 0.2  # the finding, shown


def test_the_gpu_check_refuses_a_machine_without_cuda_unless_dry(capsys):
    import gpu_check
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit):
        gpu_check.main(["--smollm2", "somewhere"])
    assert "no CUDA device: use --dry-run" in capsys.readouterr().err
