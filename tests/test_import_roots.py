"""The packages install under one name, ``rlvr``, and import without torch.

``verifiers`` is also the import name of PrimeIntellect's environments library (and PyPI has an
unrelated ``tasks``): installing this project must not put anything under those names.
"""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name, folder", [("rlvr", "rlvr"), ("rlvr.verifiers", "verifiers"),
                                          ("rlvr.sandbox", "sandbox"), ("rlvr.tasks", "tasks")])
def test_package_resolves_to_this_tree(name, folder):
    module = importlib.import_module(name)
    assert Path(module.__file__).resolve().parent == ROOT / folder


def _run_outside_checkout(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    # From the checkout's root the folders themselves are importable by their bare names; a user's
    # program runs elsewhere, so these checks do too.
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_reward_packages_import_without_torch(tmp_path):
    code = (
        "import sys, rlvr.verifiers, rlvr.sandbox, rlvr.tasks; "
        "assert 'torch' not in sys.modules, 'torch was imported'; "
        "assert 'transformers' not in sys.modules, 'transformers was imported'"
    )
    result = _run_outside_checkout(code, tmp_path)
    assert result.returncode == 0, result.stderr


def test_nothing_installed_under_a_bare_name(tmp_path):
    """No top-level ``verifiers``, ``tasks`` or ``sandbox`` of ours: either absent, or someone else's."""
    code = (
        "import importlib.util, json, sys; "
        "specs = {n: importlib.util.find_spec(n) for n in ('verifiers', 'tasks', 'sandbox')}; "
        "print(json.dumps({n: (s.origin if s else None) for n, s in specs.items()}))"
    )
    result = _run_outside_checkout(code, tmp_path)
    assert result.returncode == 0, result.stderr
    import json

    for name, origin in json.loads(result.stdout).items():
        assert origin is None or not Path(origin).resolve().is_relative_to(ROOT), (name, origin)


def test_beside_primeintellect_verifiers(tmp_path):
    """PrimeIntellect's ``verifiers`` (installed by .ci/run) and ours import side by side."""
    from importlib import metadata

    try:
        dist = metadata.distribution("verifiers")
    except metadata.PackageNotFoundError:
        pytest.skip("PrimeIntellect's verifiers is not installed (pip install verifiers; .ci/run installs it)")
    code = (  # their stack lives in verifiers.v1 (0.4.0); importing it proves their files are whole
        "import verifiers, verifiers.v1 as vf, rlvr.verifiers as ours; "
        "print(verifiers.__file__); print(ours.__file__); "
        "print(ours.get_verifier('numeric').score('so 42', {'answer': '42'}).score); "
        "print(hasattr(vf, 'Env'))"
    )
    result = _run_outside_checkout(code, tmp_path)
    assert result.returncode == 0, result.stderr
    theirs, ours, score, has_environment = result.stdout.split()
    assert Path(theirs).resolve().is_relative_to(Path(dist.locate_file("")).resolve())
    assert Path(ours).resolve().parent == ROOT / "verifiers"
    assert score == "1.0" and has_environment == "True"
