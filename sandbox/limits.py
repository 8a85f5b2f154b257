"""What a run may use (:class:`Limits`) and what comes back (:class:`ExecResult`, :class:`TestReport`).

Statuses, from the caller's point of view:

=========== ==========================================================================================
ExecResult  meaning
=========== ==========================================================================================
ok          the program ran to its end; ``exit_code`` says how (a raising program exits 1: still "ok")
timeout     it ran past ``timeout_s`` and was killed with everything it started
memory      it ran out of its memory cap (killed by the OOM killer, or MemoryError)
killed      it died from a signal (segfault, SIGKILL, CPU-seconds rlimit, ...)
error       the *sandbox* could not run it (start-up failure, broken isolation); says nothing about
            the program
=========== ==========================================================================================

A :class:`TestReport`'s ``status`` is about the harness, not the solution: ``ok`` means every test
has a meaningful outcome (passed or not), ``error``/``timeout`` mean the sandbox failed and the
outcomes carry no information. Per test, :class:`TestOutcome.status` is one of ``passed``,
``failed`` (raised, including a failed assert), ``timeout``, ``memory``, ``crashed`` (the process
died or exited before reporting), ``rejected`` (with ``guard_solution``: the test met an object
made to fake comparisons, or compared something that is not plain data),
``not_run`` (the solution itself failed to load, or a previous step took the run down), ``error``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

@dataclass(frozen=True)
class Limits:
    """Resource limits of one run. Defaults are safe for untrusted code.

    Attributes:
        timeout_s: wall-clock seconds for the whole ``execute()`` call, and for each test of
            ``run_tests()`` (the solution's own top-level code gets one more such budget).
        memory_mb: MiB of memory for the run's whole process tree together (a cgroup), including
            files it writes to its work dir (a tmpfs).
        max_processes: processes and threads alive at once in the run (a pids cgroup, and
            RLIMIT_NPROC on the run's own uid).
        max_output_bytes: bytes kept of stdout and of stderr, each; past it the stream is closed
            (the program gets EPIPE) and the result is marked truncated.
        max_file_bytes: largest single file the run may write (RLIMIT_FSIZE).
        max_open_files: file descriptors per process (RLIMIT_NOFILE).
    """

    timeout_s: float = 10.0
    memory_mb: int = 512
    max_processes: int = 64
    max_output_bytes: int = 1 << 20
    max_file_bytes: int = 64 << 20
    max_open_files: int = 256

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"Limits.timeout_s must be > 0, got {self.timeout_s!r}")
        if self.memory_mb < 16:
            raise ValueError(f"Limits.memory_mb must be >= 16 (Python needs ~10 MiB), got {self.memory_mb!r}")
        if self.max_processes < 1:
            raise ValueError(f"Limits.max_processes must be >= 1, got {self.max_processes!r}")
        for name in ("max_output_bytes", "max_file_bytes", "max_open_files"):
            if getattr(self, name) < 1:
                raise ValueError(f"Limits.{name} must be >= 1, got {getattr(self, name)!r}")

    def wire(self) -> dict:
        """The plain-dict form sent to the zygote."""
        return {
            "timeout_s": float(self.timeout_s), "memory_mb": int(self.memory_mb),
            "max_processes": int(self.max_processes), "max_output_bytes": int(self.max_output_bytes),
            "max_file_bytes": int(self.max_file_bytes), "max_open_files": int(self.max_open_files),
        }


@dataclass
class ExecResult:
    """Outcome of :func:`sandbox.execute`.

    ``exit_code`` is the program's exit status, or ``-N`` when signal N ended it, or None when it
    never ran. ``stdout``/``stderr`` are decoded as UTF-8 (invalid bytes replaced), each cut at
    ``Limits.max_output_bytes``. ``wall_s`` is the program's own wall-clock time in seconds.
    ``detail`` says why a status is not ``ok``.
    """

    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    wall_s: float
    detail: str = ""
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """True when the program ran to its end and exited 0."""
        return self.status == "ok" and self.exit_code == 0


@dataclass
class TestOutcome:
    """One test of :func:`sandbox.run_tests`: passed only if it ran to its end without raising."""

    __test__ = False  # not a pytest test class

    passed: bool
    status: str
    detail: str = ""
    wall_s: float = 0.0


@dataclass
class TestReport:
    """Outcome of :func:`sandbox.run_tests`; ``per_test`` is in the order of ``tests``.

    ``tampered`` is True when something other than the harness wrote to the result channel (then
    every test counts as failed). ``stdout``/``stderr`` hold what the solution and tests printed.
    """

    __test__ = False

    passed: int
    total: int
    status: str
    per_test: list[TestOutcome] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    wall_s: float = 0.0
    detail: str = ""
    tampered: bool = False

    @property
    def fraction(self) -> float:
        """Passed / total (0.0 for an empty test list)."""
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        return self.status == "ok" and self.total > 0 and self.passed == self.total
