"""PyPI has unrelated packages named ``verifiers`` and ``tasks``: ours must win."""

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["rlvr", "verifiers", "sandbox", "tasks"])
def test_package_resolves_to_this_tree(name):
    module = importlib.import_module(name)
    assert Path(module.__file__).resolve().parent == ROOT / name


def test_reward_packages_import_without_torch():
    import subprocess
    import sys

    code = (
        "import sys, verifiers, sandbox, tasks; "
        "assert 'torch' not in sys.modules, 'torch was imported'; "
        "assert 'transformers' not in sys.modules, 'transformers was imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
