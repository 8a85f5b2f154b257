"""Without bubblewrap, a Python that lives in a private directory (issue 11 §1).

The README's ``pip install -e '.[test]' && python -m pytest`` failed on a machine without
bubblewrap whose venv's base interpreter lived under a 0700 home (pyenv under /root): programs run
as an unprivileged uid, which could neither import a module the zygote had not preloaded
(``pathlib``) nor start ``sys.executable``. Now the zygote shows that directory to the runs in a
mount namespace of its own, and where it cannot (no namespaces), the pool refuses up front and
says what to do.

These build the situation themselves: a copy of the interpreter binary under a fresh 0700
directory, its ``lib`` a link to the real standard library (outside /tmp, which every run
covers with its own tmpfs), with ``launch.interpreter()`` pointing at it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

from rlvr.sandbox import IsolationError, Limits, SandboxPool, capabilities, launch

ROOT = os.geteuid() == 0
pytestmark = pytest.mark.skipif(not ROOT, reason="runs drop to another uid only as root; without root they run as "
                                                 "the caller, who can read its own Python")
LEGIT = (
    "import subprocess, sys, tempfile, pathlib, threading\n"   # pathlib: not preloaded by the zygote
    "print(subprocess.run([sys.executable, '-c', 'print(6*7)'], capture_output=True, text=True).stdout.strip())\n"
    "p = pathlib.Path(tempfile.mkdtemp()) / 'f.txt'; p.write_text('ok'); print(p.read_text())\n"
    "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
)


@pytest.fixture()
def private_python(monkeypatch):
    """``<0700 dir>/py/bin/pythonX.Y`` (a copy of the real binary) with ``py/lib`` linked to the
    real lib directory; ``launch.interpreter()`` returns it. Yields the 0700 directory."""
    real = Path(launch.interpreter())
    real_lib = Path(sys.base_prefix) / "lib"
    if not (real_lib / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "os.py").exists():
        pytest.skip(f"no standard library under {real_lib}")
    parent = "/var/tmp" if os.path.isdir("/var/tmp") else None
    home = Path(tempfile.mkdtemp(prefix="rlvr-private-home-", dir=parent))
    try:
        home.chmod(0o700)
        (home / "secret.txt").write_text("not for programs")
        prefix = home / "py"
        (prefix / "bin").mkdir(parents=True)
        binary = prefix / "bin" / real.name
        shutil.copy2(real, binary)
        (prefix / "lib").symlink_to(real_lib)
        monkeypatch.setattr(launch, "interpreter", lambda *, site_packages=False: str(binary))
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def weak_pool(**layers) -> SandboxPool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # weak isolation, on purpose
        return SandboxPool(slots=1, layers={"bwrap": False, **layers}, allow_weak_isolation=True)


def test_the_private_directories_are_found(private_python):
    view = launch.python_view()
    assert str(private_python / "py") in view["dirs"]
    assert str(private_python) in view["tops"] and view["unfixable"] == []
    (private_python / "py").chmod(0o700)  # the Python directory itself closed: a mount cannot help
    try:
        assert str(private_python / "py") in launch.python_view()["unfixable"]
    finally:
        (private_python / "py").chmod(0o755)


@pytest.mark.skipif(not capabilities()["per_run_namespaces"], reason="needs mount namespaces (root)")
def test_weak_isolation_runs_a_python_inside_a_0700_directory(private_python):
    p = weak_pool()
    try:
        r = p.execute(LEGIT + f"import os\nprint(sorted(os.listdir({str(private_python)!r})))\n",
                      limits=Limits(timeout_s=20))
        assert r.stdout.split("\n")[:3] == ["42", "ok", "thread"], r.stderr
        assert r.stdout.split("\n")[3] == "['py']", "the rest of the private directory must stay hidden"
        code = "import pathlib, subprocess, sys\ndef f():\n    return subprocess.run([sys.executable, '-c', 'print(5)'], " \
               "capture_output=True, text=True).stdout.strip()\n"
        report = p.run_tests(code, ["assert f() == '5'", "import fractions\nassert f() == '5'"], limits=Limits(timeout_s=20))
        assert report.all_passed, report.per_test
    finally:
        p.close()


def test_weak_isolation_refuses_a_private_python_it_cannot_show(private_python):
    with pytest.raises(IsolationError) as info:
        weak_pool(namespaces=False)
    message = str(info.value)
    assert str(private_python / "py") in message and "mode 0700" in message
    assert "apt-get install bubblewrap" in message and "chmod" in message


@pytest.mark.bwrap
@pytest.mark.skipif(not capabilities()["bwrap"]["works"], reason="needs bubblewrap (apt-get install bubblewrap)")
def test_bubblewrap_shows_a_private_python_too(private_python):
    p = SandboxPool(slots=1, allow_weak_isolation=capabilities()["isolation"] != "strong")
    try:
        r = p.execute(LEGIT, limits=Limits(timeout_s=20))
        assert r.stdout.split() == ["42", "ok", "thread"], r.stderr
    finally:
        p.close()
