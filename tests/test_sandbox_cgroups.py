"""Sandbox pools leave no cgroup behind (issue 11 §4): not when closed, not when dropped without
``close()``, not when a verifier worker shuts down, and a tree whose owner died (SIGKILL, so no
clean-up ran) is swept by the next pool, also when the owner's pid has been reused since.

Needs a writable cgroup controller (root); skips without one. Runs with or without bubblewrap.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlvr.sandbox import Limits, SandboxPool, capabilities, cgroups

STRONG = capabilities()["isolation"] == "strong"
CONTROLLERS = cgroups.locate()
pytestmark = pytest.mark.skipif(not CONTROLLERS, reason="no writable cgroup controller on this machine (needs root)")


def trees_of(pid: int) -> list[Path]:
    """The sandbox cgroup directories (every controller) owned by process ``pid``."""
    return [p for c in CONTROLLERS.values() for p in c.base.glob(f"{cgroups.PREFIX}{pid}-*")]


def wait_until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_pool_dropped_without_close_removes_its_cgroups_and_sandboxes():
    p = SandboxPool(slots=1, allow_weak_isolation=not STRONG)
    assert p.execute("print(1)", limits=Limits(timeout_s=2)).stdout == "1\n"
    dirs = [c.base / p._tree.name for c in CONTROLLERS.values()]
    bwrap = p._slots[0].proc
    assert all(d.is_dir() for d in dirs)
    del p
    gc.collect()
    assert bwrap.poll() is not None, "the sandbox outlived its pool"
    assert not any(d.exists() for d in dirs), "a dropped pool left its cgroups behind"


def test_the_cgroup_name_records_the_owner_and_its_start_time():
    p = SandboxPool(slots=1, allow_weak_isolation=not STRONG)
    try:
        owner = cgroups.tree_owner(p._tree.name)
        assert owner == (os.getpid(), cgroups.start_time(os.getpid()))
    finally:
        p.close()


def test_a_tree_whose_owner_was_killed_is_swept_by_the_next_pool(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        from rlvr.sandbox import SandboxPool, Limits
        p = SandboxPool(slots=2, allow_weak_isolation={not STRONG})
        p.warm()
        assert p.execute("print(1)", limits=Limits(timeout_s=5)).stdout == "1\\n"
        print(p._tree.name, flush=True)
        time.sleep(60)
    """)
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        name = owner.stdout.readline().strip()
        assert name.startswith(cgroups.PREFIX), name
    finally:
        owner.send_signal(signal.SIGKILL)  # no atexit, no finalizer: only the sweep can clean up
        owner.wait()
    left = [c.base / name for c in CONTROLLERS.values()]
    assert all(d.is_dir() for d in left)
    # Its sandboxes die with it (parent-death signal), asynchronously: then the tree is empty.
    assert wait_until(lambda: all(cgroups._empty(d) for d in left))
    p = SandboxPool(slots=1, allow_weak_isolation=not STRONG)
    try:
        assert not any(d.exists() for d in left), "the next pool did not sweep the dead owner's tree"
    finally:
        p.close()


def test_a_tree_whose_owner_pid_was_reused_is_swept():
    """pid_max is 32768 on these machines: a dead owner's pid soon belongs to someone else."""
    base = next(iter(CONTROLLERS.values())).base
    alive = os.getppid()  # a live process, but not the one that made the tree (other start time)
    stale = base / f"{cgroups.PREFIX}{alive}-deadbeef-s1"
    stale.mkdir()
    (stale / "slot0").mkdir()
    mine = base / f"{cgroups.PREFIX}{os.getpid()}-cafe0000-s{cgroups.start_time(os.getpid())}"
    mine.mkdir()
    try:
        assert cgroups.remove_stale({"x": next(iter(CONTROLLERS.values()))}) >= 1
        assert not stale.exists()
        assert mine.exists(), "a live owner's tree was removed"
    finally:
        for d in (stale / "slot0", stale, mine):
            if d.exists():
                d.rmdir()


def test_verify_workers_remove_their_cgroups_when_the_runner_closes():
    from rlvr.verifiers.runner import VerifierRunner

    runner = VerifierRunner(workers=2, timeout_s=60)
    try:
        rewards = runner.score_batch("code", ["```python\ndef f():\n    return 1\n```"] * 4,
                                     [{"tests": ["assert f() == 1"]}] * 4,
                                     options={"allow_weak_isolation": not STRONG})
        assert [r.score for r in rewards] == [1.0] * 4
        workers = [w.proc.pid for w in runner._pool._all]
        assert any(trees_of(pid) for pid in workers), "the workers made no sandbox cgroups"
    finally:
        runner.close()
    # No sweep here: the workers themselves must have removed their trees on the way out.
    assert [t for pid in workers for t in trees_of(pid)] == []


@pytest.mark.skipif(any(c.version != 1 for c in CONTROLLERS.values()),
                    reason="runs the command in a cgroup of its own, which needs cgroup v1 controllers")
def test_rlvr_verify_leaves_no_cgroup_behind(tmp_path):
    """The issue's reproduction: one `rlvr verify` on a 3-line JSONL of code completions. It runs
    in a fresh cgroup of its own, so that its workers' trees (made below their own cgroup) can be
    told apart from other pools on the machine."""
    lines = [
        '{"completion": "```python\\ndef f(x):\\n    return 2 * x\\n```", "tests": ["assert f(2) == 4"]}',
        '{"completion": "```python\\ndef f(x):\\n    return 3 * x\\n```", "tests": ["assert f(2) == 4"]}',
        '{"completion": "```python\\ndef g(x):\\n    return x\\n```", "tests": ["assert g(1) == 1", "assert g(2) == 2"]}',
    ]
    data = tmp_path / "code.jsonl"
    data.write_text("\n".join(lines) + "\n")
    homes = {c.base / f"rlvr-test-{os.getpid()}-{os.urandom(3).hex()}" for c in CONTROLLERS.values()}
    for home in homes:
        home.mkdir()

    def enter() -> None:  # in the child, before exec
        for home in homes:
            (home / "cgroup.procs").write_text("0")

    try:
        options = [] if STRONG else ["--option", "allow_weak_isolation=true"]
        proc = subprocess.run([sys.executable, "-m", "rlvr.cli", "verify", "--verifier", "code", "--input", str(data),
                               "--workers", "2", *options], capture_output=True, text=True, timeout=300,
                              preexec_fn=enter)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "mean score     0.6667" in proc.stdout, proc.stdout
        made = [p.name for home in homes for p in home.iterdir() if p.is_dir()]
        assert made == [], f"rlvr verify left {made} behind"
    finally:
        for home in homes:
            for child in sorted(home.rglob("*"), reverse=True):  # what a failed run left
                if child.is_dir():
                    child.rmdir()
            home.rmdir()
