"""Run untrusted code under OS isolation and resource limits (standard library only).

Secure by default and fast: each slot keeps a warm Python (a zygote) inside bubblewrap, and every
run is a fork of it in fresh pid/mount/ipc namespaces, in its own memory+pids cgroup, as an
unprivileged uid, under rlimits, Landlock, seccomp and an audit hook. See docs/sandbox.md.

    from rlvr.sandbox import execute, run_tests, Limits
    execute("print(sum(map(int, input().split())))", stdin="2 3").stdout        # '5\\n'
    report = run_tests("def add(a, b): return a + b", ["assert add(1, 2) == 3"])
    report.passed, report.total, report.per_test[0].status                     # 1, 1, 'passed'
    capabilities()["isolation"]                                                 # 'strong'

Outcomes come back through a pipe tagged with a per-run nonce, never through the program's
stdout or exit code, so printing "PASSED", exiting early or crashing cannot fake a pass.
"""

from __future__ import annotations

import os
import threading
from typing import Sequence

from rlvr.sandbox.detect import capabilities
from rlvr.sandbox.limits import ExecResult, Limits, TestOutcome, TestReport
from rlvr.sandbox.pool import IsolationError, SandboxPool

__all__ = [
    "ExecResult", "IsolationError", "Limits", "SandboxPool", "TestOutcome", "TestReport",
    "capabilities", "configure", "default_pool", "execute", "run_tests",
]

_default: SandboxPool | None = None
_default_options: dict = {}
_lock = threading.Lock()


def configure(**pool_options) -> None:
    """Set the options of the default pool (``SandboxPool`` keyword arguments, e.g.
    ``allow_weak_isolation=True`` or ``slots=4``); the next call starts a pool with them."""
    global _default, _default_options
    with _lock:
        old, _default, _default_options = _default, None, dict(pool_options)
    if old is not None:
        old.close()


def default_pool() -> SandboxPool:
    """The process-wide pool behind ``execute``/``run_tests`` (a new one after ``fork()``)."""
    global _default
    with _lock:
        if _default is None or _default._pid != os.getpid():
            _default = SandboxPool(**_default_options)
        return _default


def execute(code: str, *, stdin: str | bytes = "", limits: Limits = Limits()) -> ExecResult:
    """Run ``code`` as a sandboxed program; see :class:`ExecResult` for the statuses."""
    return default_pool().execute(code, stdin=stdin, limits=limits)


def run_tests(code: str, tests: Sequence[str], *, limits: Limits = Limits(), **options) -> TestReport:
    """Run ``code`` then each test snippet in a fresh namespace holding it; see :class:`TestReport`."""
    return default_pool().run_tests(code, tests, limits=limits, **options)
