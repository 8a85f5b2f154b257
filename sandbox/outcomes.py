"""Turn what a slot collected about one run into an :class:`ExecResult` or a :class:`TestReport`.

Two sources, trusted differently:

* the zygote's report (``done``): the run's wait status, whether pid 1 of the run had to end it
  at its deadline, its wall time. Written by processes the program never controls: trusted.
* the result pipe: lines ``<nonce> <json>`` from the harness inside the run. Only lines with this
  run's nonce count; a line without it, an unknown event, a repeated pass or a malformed line
  means something else wrote there, and then no test of the run counts as passed.

The OOM-kill counter of the slot's memory cgroup (read before and after) tells "killed by the
OOM killer" apart from other SIGKILLs.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, field

from rlvr.sandbox.limits import ExecResult, TestOutcome, TestReport


@dataclass
class RawRun:
    """Everything a slot gathered about one run (see ``sandbox.slot``)."""

    done: dict | None = None  # the zygote's report, None if none came
    stdout: bytes = b""
    stderr: bytes = b""
    truncated: bool = False
    records: bytes = b""
    records_overflow: bool = False
    oom_kills: int = 0  # OOM kills in the slot's cgroup during this run
    host_timeout: bool = False  # the host had to kill the whole slot
    error: str = ""  # a host-side failure (could not start or talk to the sandbox)
    wall_s: float = 0.0  # host-measured seconds for the whole call


@dataclass
class Records:
    """The harness's events, parsed and checked."""

    events: list[dict] = field(default_factory=list)
    tampered: bool = False
    why: str = ""


_EVENTS = {"setup", "pass", "fail", "end", "done", "uncaught"}


def parse_records(raw: bytes, nonce: str, overflow: bool = False) -> Records:
    """Split the result pipe into events; any line not written by the harness marks tampering."""
    out = Records()
    if overflow:
        out.tampered, out.why = True, "more data on the result channel than the harness writes"
    prefix = nonce.encode() + b" "
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:
        out.tampered, out.why = True, "a partial line on the result channel"
    passes: set[int] = set()
    for line in lines:
        if not line.startswith(prefix):
            out.tampered, out.why = True, "a line without this run's nonce on the result channel"
            continue
        try:
            event = json.loads(line[len(prefix):])
        except ValueError:
            out.tampered, out.why = True, "a malformed line on the result channel"
            continue
        if not isinstance(event, dict) or event.get("ev") not in _EVENTS:
            out.tampered, out.why = True, "an unknown event on the result channel"
            continue
        if event["ev"] == "pass":
            if event.get("i") in passes:
                out.tampered, out.why = True, "a test reported passed twice"
            passes.add(event.get("i"))
        out.events.append(event)
    return out


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _wait_parts(done: dict) -> tuple[int | None, int | None]:
    """(exit code, signal number) from the zygote's wait status."""
    status = done.get("wait")
    if status is None:
        return None, None
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    return os.WEXITSTATUS(status), None


def _infrastructure_failure(raw: RawRun) -> str:
    if raw.error:
        return raw.error
    if raw.host_timeout:
        return "the sandbox did not finish within its own deadline and was killed"
    if raw.done is None:
        return "the sandbox ended without reporting"
    if raw.done.get("error"):
        return str(raw.done["error"])
    return ""


def exec_result(raw: RawRun, nonce: str) -> ExecResult:
    """Map a finished ``execute`` run to an :class:`ExecResult` (statuses: see sandbox.limits)."""
    out, err = _decode(raw.stdout), _decode(raw.stderr)
    failure = _infrastructure_failure(raw)
    if failure:
        return ExecResult("error", None, out, err, raw.wall_s, detail=failure, truncated=raw.truncated)
    done = raw.done or {}
    wall = float(done.get("wall_s", raw.wall_s))
    code, sig = _wait_parts(done)
    records = parse_records(raw.records, nonce, raw.records_overflow)
    said_memory = any(e.get("ev") == "uncaught" and e.get("kind") == "memory" for e in records.events)
    if done.get("timed_out"):
        return ExecResult("timeout", -signal.SIGKILL, out, err, wall, "ran past timeout_s", raw.truncated)
    if sig is not None:
        if raw.oom_kills > 0 or said_memory:
            return ExecResult("memory", -sig, out, err, wall, "killed by the OOM killer (memory cap)", raw.truncated)
        return ExecResult("killed", -sig, out, err, wall, f"killed by signal {_signame(sig)}", raw.truncated)
    if said_memory or raw.oom_kills > 0:
        return ExecResult("memory", code, out, err, wall, "ran out of memory", raw.truncated)
    return ExecResult("ok", code, out, err, wall, "", raw.truncated)


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def test_report(raw: RawRun, nonce: str, n_tests: int) -> TestReport:
    """Map a finished ``run_tests`` run to a :class:`TestReport`."""
    out, err = _decode(raw.stdout), _decode(raw.stderr)
    failure = _infrastructure_failure(raw)
    if failure:
        status = "timeout" if raw.host_timeout else "error"
        per = [TestOutcome(False, "error", failure) for _ in range(n_tests)]
        return TestReport(0, n_tests, status, per, out, err, raw.wall_s, detail=failure)
    done = raw.done or {}
    records = parse_records(raw.records, nonce, raw.records_overflow)
    if records.tampered:
        per = [TestOutcome(False, "failed", f"tampering: {records.why}") for _ in range(n_tests)]
        return TestReport(0, n_tests, "ok", per, out, err, raw.wall_s, detail=records.why, tampered=True)
    per = _outcomes(records.events, done, raw.oom_kills, n_tests)
    passed = sum(o.passed for o in per)
    return TestReport(passed, n_tests, "ok", per, out, err, float(done.get("wall_s", raw.wall_s)))


def _outcomes(events: list[dict], done: dict, oom_kills: int, n: int) -> list[TestOutcome]:
    setup = next((e for e in events if e["ev"] == "setup"), None)
    passed = {e.get("i") for e in events if e["ev"] == "pass"}
    fails = {e.get("i"): e for e in events if e["ev"] == "fail"}
    ends = {e.get("i"): e for e in events if e["ev"] == "end"}
    run_gone = _why_run_ended(done, oom_kills, setup)
    per = []
    for i in range(n):
        end = ends.get(i, {})
        wall = float(end.get("wall_s", 0.0))
        if i in passed:
            per.append(TestOutcome(True, "passed", "", wall))
        elif i in fails:
            kind = {"memory": "memory", "rejected": "rejected"}.get(fails[i].get("kind"), "failed")
            per.append(TestOutcome(False, kind, str(fails[i].get("detail", "")), wall))
        elif end:
            per.append(_ended_without_report(end, oom_kills, wall))
        elif setup is not None and not setup.get("ok"):
            kind = "memory" if setup.get("kind") == "memory" else "not_run"
            per.append(TestOutcome(False, kind, f"the solution failed to load: {setup.get('detail', '')}"))
        else:
            per.append(TestOutcome(False, *run_gone))
    return per


def _ended_without_report(end: dict, oom_kills: int, wall: float) -> TestOutcome:
    kind, code = end.get("kind"), int(end.get("code", 0))
    if kind == "timeout":
        return TestOutcome(False, "timeout", "ran past timeout_s", wall)
    if kind == "signaled":
        if code == signal.SIGKILL and oom_kills > 0:
            return TestOutcome(False, "memory", "killed by the OOM killer (memory cap)", wall)
        return TestOutcome(False, "crashed", f"killed by signal {_signame(code)}", wall)
    return TestOutcome(False, "crashed", f"exited with code {code} before reporting a result", wall)


def _why_run_ended(done: dict, oom_kills: int, setup: dict | None) -> tuple[str, str]:
    """(status, detail) for tests that never started because the run process ended early."""
    code, sig = _wait_parts(done)
    phase = "the solution's top-level code" if setup is None else "the test harness"
    if done.get("timed_out") or sig == signal.SIGALRM:
        return "timeout", f"{phase} ran past timeout_s"
    if sig is not None:
        if sig == signal.SIGKILL and oom_kills > 0:
            return "memory", f"{phase} was killed by the OOM killer (memory cap)"
        return "crashed", f"{phase} was killed by signal {_signame(sig)}"
    return ("crashed" if setup is None else "not_run"), f"{phase} exited with code {code} before this test ran"
