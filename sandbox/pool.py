"""The pool: N warm slots, a concurrency limit, and the public calls on top of them.

``SandboxPool`` checks the machine's isolation once (``sandbox.capabilities``) and refuses to
exist when it is weaker than "no network + whole-tree kill + memory cap + read-only host view +
unprivileged uid", unless ``allow_weak_isolation=True`` (then it warns, loudly, once). Slots start
lazily on first use (``warm()`` starts them all now), and each call borrows one slot for the
length of one run, so at most ``slots`` runs execute at once; more callers wait their turn. Batch
helpers fan out over threads; the ``a*`` coroutines run a call in a worker thread so an asyncio
trainer can await rewards.

The module-level ``execute``/``run_tests`` in ``sandbox/__init__.py`` use one default pool per
process (re-created after ``fork()``, since a child must not share the parent's zygotes).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import secrets
import threading
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Sequence

from rlvr.sandbox import detect as _caps
from rlvr.sandbox import cgroups, launch, outcomes
from rlvr.sandbox.limits import ExecResult, Limits, TestReport
from rlvr.sandbox.slot import SandboxStartError, Slot

log = logging.getLogger("sandbox")

LAYERS = ("bwrap", "cgroups", "namespaces")


class IsolationError(RuntimeError):
    """The machine cannot give the isolation asked for (see ``capabilities()['missing']``)."""


class SandboxPool:
    """Warm sandbox slots behind ``execute`` / ``run_tests``.

    Args:
        slots: how many runs may execute at once (default: the number of CPUs).
        allow_weak_isolation: accept a machine without the full isolation (warns loudly).
        site_packages: let programs import third-party packages (numpy, ...). Off by default:
            extension modules can hand a program raw memory access, see docs/sandbox.md.
        layers: switch layers off by name (``{"bwrap": False}``, ``"cgroups"``, ``"namespaces"``),
            for tests and benchmarks; anything switched off makes the isolation weak.

    Example::

        pool = SandboxPool(slots=2)
        pool.execute("print(input()[::-1])", stdin="abc").stdout   # 'cba\\n'
        pool.run_tests("def f(x): return 2 * x", ["assert f(2) == 4"]).passed   # 1
        pool.close()
    """

    def __init__(self, slots: int | None = None, *, allow_weak_isolation: bool = False,
                 site_packages: bool = False, layers: dict | None = None):
        switches = {name: True for name in LAYERS}
        for name, on in (layers or {}).items():
            if name not in switches:
                raise ValueError(f"unknown layer {name!r}; layers: {', '.join(LAYERS)}")
            switches[name] = bool(on)
        caps = dict(_caps.probe(switches["bwrap"], switches["cgroups"], switches["namespaces"]))
        if not caps["usable"]:
            raise IsolationError("the sandbox needs Linux >= 5.3 and Python >= 3.9 (os.pidfd_open)")
        if caps["isolation"] != "strong":
            message = "sandbox isolation is WEAK: " + "; ".join(caps["missing"])
            if not allow_weak_isolation:
                raise IsolationError(message + ". Fix the machine (see docs/sandbox.md) or pass "
                                     "allow_weak_isolation=True to accept the risk.")
            warnings.warn(message + " -- running untrusted code anyway because allow_weak_isolation=True",
                          RuntimeWarning, stacklevel=2)
            log.warning("%s (allow_weak_isolation=True)", message)
        if caps["uid_drop"] and not caps["bwrap"]["works"]:
            _check_python_is_reachable(caps, site_packages)
        self.caps = caps
        self.size = max(1, int(slots or os.cpu_count() or 1))
        self._tree = None
        if switches["cgroups"] and caps["cgroups"]:
            self._tree = cgroups.CgroupTree(cgroups.locate())
        self._slots = [Slot(i, caps, self._tree.slot(i) if self._tree else None,
                            use_bwrap=caps["bwrap"]["works"], site_packages=site_packages)
                       for i in range(self.size)]
        self._idle: queue.LifoQueue[Slot] = queue.LifoQueue()
        for slot in reversed(self._slots):
            self._idle.put(slot)
        self._closed = False
        self._pid = os.getpid()
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        # Runs at close(), when the pool is garbage-collected without close() (a verifier dropped
        # by its owner, a worker returning from main()), and at interpreter exit: its processes
        # and cgroups must not outlive it. It holds the slots and the tree, never the pool.
        self._resources = {"executor": None}
        self._finalizer = weakref.finalize(self, _shut_down, self._slots, self._tree, self._pid, self._resources)

    # --- public calls -----------------------------------------------------------------------------

    def execute(self, code: str, *, stdin: str | bytes = "", limits: Limits = Limits()) -> ExecResult:
        """Run ``code`` as a program (``python solution.py``) with ``stdin``; see ``ExecResult``."""
        _check_text("code", code)
        data = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
        nonce = secrets.token_hex(16)
        request = {"mode": "exec", "code": code, "nonce": nonce, "limits": limits.wire()}
        raw = self._run(request, data, limits)
        return outcomes.exec_result(raw, nonce)

    def run_tests(self, code: str, tests: Sequence[str], *, limits: Limits = Limits(), setup: str = "",
                  keep_names: Iterable[str] = (), guard_solution: bool = False) -> TestReport:
        """Run ``code``, then each of ``tests`` in a fresh copy of its namespace; see ``TestReport``.

        ``setup`` runs before the solution in the same namespace (e.g. the dataset's imports).
        ``keep_names``: names the tests call on purpose even though they shadow a builtin or a
        standard module (otherwise the tests see the real builtin). ``guard_solution``: the tests'
        comparisons compare plain data (copies made of builtin types), every value a call in a
        test returns is checked, and an object made to fake comparisons (``__eq__`` always
        True, an int subclass with a lying ``__eq__``) fails its test as ``rejected``; the
        solution's functions are wrapped so that after every call the standard modules are
        restored (patches made inside a call cannot fake the test's next assertions). See
        docs/sandbox.md, "Comparisons compare plain data".
        """
        _check_text("code", code)
        tests = list(tests)
        for i, test in enumerate(tests):
            _check_text(f"tests[{i}]", test)
        _check_text("setup", setup)
        nonce = secrets.token_hex(16)
        request = {"mode": "tests", "code": code, "tests": tests, "setup": setup, "nonce": nonce,
                   "keep_names": sorted(set(keep_names)), "guard_solution": bool(guard_solution),
                   "limits": limits.wire()}
        raw = self._run(request, b"", limits)
        return outcomes.test_report(raw, nonce, len(tests))

    def execute_many(self, programs: Sequence[tuple[str, str]], *, limits: Limits = Limits()) -> list[ExecResult]:
        """``execute`` for each ``(code, stdin)``, ``slots`` at a time; results in input order."""
        return list(self._fan_out(lambda item: self.execute(item[0], stdin=item[1], limits=limits), programs))

    def run_tests_many(self, items: Sequence[tuple[str, Sequence[str]]], *, limits: Limits = Limits(),
                       **options) -> list[TestReport]:
        """``run_tests`` for each ``(code, tests)``, ``slots`` at a time; results in input order."""
        return list(self._fan_out(lambda item: self.run_tests(item[0], item[1], limits=limits, **options), items))

    async def aexecute(self, code: str, **kwargs) -> ExecResult:
        """``execute`` without blocking the event loop."""
        return await asyncio.to_thread(self.execute, code, **kwargs)

    async def arun_tests(self, code: str, tests: Sequence[str], **kwargs) -> TestReport:
        """``run_tests`` without blocking the event loop."""
        return await asyncio.to_thread(self.run_tests, code, tests, **kwargs)

    def warm(self) -> None:
        """Start every slot now (in parallel) instead of on first use."""
        def start(slot: Slot) -> None:
            if not slot.alive:
                slot.start()

        list(self._fan_out(start, self._slots))

    def close(self) -> None:
        """Stop every slot and remove the pool's cgroups. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._finalizer()

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------------------

    def _run(self, request: dict, stdin: bytes, limits: Limits) -> outcomes.RawRun:
        if self._closed:
            raise RuntimeError("this SandboxPool is closed")
        if os.getpid() != self._pid:
            raise RuntimeError("a SandboxPool cannot be used after fork(); create one in the child")
        slot = self._idle.get()
        try:
            try:
                if not slot.alive:
                    slot.start()
            except (SandboxStartError, OSError) as exc:
                return outcomes.RawRun(error=f"the sandbox could not start: {exc}")
            return slot.run(request, stdin, limits)
        finally:
            self._idle.put(slot)

    def _fan_out(self, fn, items):
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=self.size, thread_name_prefix="sandbox")
                self._resources["executor"] = self._executor
        return self._executor.map(fn, items)


def _check_python_is_reachable(caps: dict, site_packages: bool) -> None:
    """Without bubblewrap, runs drop to an unprivileged uid that must still read the interpreter
    and its standard library (every module a program imports after start-up, the interpreter a
    program runs with ``subprocess``). Below a 0700 directory (pyenv or conda in a home) the
    zygote shows it to them in a mount namespace (``sandbox.zygote._show_python``); where that
    cannot work, refuse now with what to do, instead of failing in every run."""
    view = launch.python_view(site_packages=site_packages)
    if view["unfixable"]:
        why = "; ".join(f"{d} ({_mode(d)})" for d in view["unfixable"]) + ": other users cannot read it"
    elif view["dirs"] and not caps["per_run_namespaces"]:
        placed = [f"{d} is inside {top} ({_mode(top)})" for d in view["dirs"] for top in view["tops"]
                  if Path(d).is_relative_to(top)]
        why = ("; ".join(placed) + ": other users cannot traverse it, and with namespaces switched off "
               "the sandbox has no mount namespace to show it to them")
    else:
        return
    raise IsolationError(
        f"the sandbox's Python is out of reach of the unprivileged uid that runs programs: {why}. "
        "Programs could not import modules or start the interpreter. Fix one of: install bubblewrap "
        "(apt-get install bubblewrap); use a Python installed outside a private directory (e.g. "
        "/usr/bin/python3, or pyenv/conda outside a 0700 home); or make it reachable (chmod o+rx on "
        "the Python directory and o+x on its parents)")


def _mode(path: str) -> str:
    try:
        return f"mode {os.stat(path).st_mode & 0o7777:04o}"
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


def _check_text(name: str, value) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")


def _shut_down(slots: list, tree, owner_pid: int, resources: dict) -> None:
    """Stop the slots and remove the cgroups of a pool (its finalizer: see SandboxPool.__init__)."""
    if os.getpid() != owner_pid:
        return  # a forked child does not own these processes
    for slot in slots:
        try:
            slot.close()
        except Exception:  # interpreter shutdown: best effort, the rest must still go
            pass
    if resources.get("executor") is not None:
        resources["executor"].shutdown(wait=False)
    if tree is not None:
        try:
            tree.destroy()
        except Exception:
            pass
