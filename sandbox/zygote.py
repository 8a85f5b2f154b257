"""The zygote: a warm Python inside a slot's sandbox that forks one isolated run per request.

Runs *inside* the sandbox (started by ``sandbox.launch``), standard library only, no classes with
methods (see ``sandbox.pyguard``). Python start-up (45-75 ms here) costs more than every isolation
layer together, so the zygote pays it once, preimports the modules programs commonly use, and
then forks. One run is a small process tree::

    zygote Z (root in the sandbox; serves requests one at a time on the control socket;
     │         before each fork: setns back to its own pid namespace, unshare a new one)
     └─ I  pid 1 of the run's new pid namespace (root): unshares mount and ipc [and net]
         │   namespaces, mounts a private tmpfs on /tmp and /dev/shm and a fresh /proc, forks U,
         │   enforces the run's wall-clock deadline and reports U's wait status to Z through a
         │   pipe U never holds. When I exits, the kernel kills every process left in the
         │   namespace: daemons, setsid'ed children, fork bombs.
         └─ U  the run: stdio and the result pipe on fds 0-3, everything else closed; rlimits,
              unprivileged uid, no_new_privs, Landlock, seccomp, audit hook; then the harness.

Wire protocol (SOCK_SEQPACKET, one message each way per step):
  Z -> host at start:  {"ev":"ready", ...}
  host -> Z:           {"op":"run"} with fds [request memfd, stdin, stdout, stderr, results]
                       (request JSON: id, mode "exec"|"tests", code, tests, setup, keep_names,
                       guard_solution, nonce, limits)
  Z -> host:           {"ev":"done","id":N, "wait":status|null, "timed_out":bool, "wall_s":s,
                       "error":str|null}
"""

from __future__ import annotations

import ctypes
import fcntl
import gc
import json
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback

from . import guard, harness, pyguard  # relative: see harness.py

# Modules a typical solution or test imports: loading them once here makes them free per run.
PREIMPORTS = (
    "array", "bisect", "collections", "copy", "dataclasses", "datetime", "decimal", "enum",
    "fractions", "functools", "hashlib", "heapq", "itertools", "json", "math", "numbers",
    "operator", "random", "re", "statistics", "string", "subprocess", "textwrap", "typing",
    "unittest", "io", "threading", "queue", "abc", "contextlib", "cmath", "struct", "site",
)

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x08000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MS_REC, MS_PRIVATE = 1 << 14, 1 << 18
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
WORK_DIR = "/tmp"
RUN_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORK_DIR, "TMPDIR": WORK_DIR,
    "LANG": "C.UTF-8", "USER": "sandbox", "LOGNAME": "sandbox",
}
_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    _check(_libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                       data.encode() if data else None), f"mount {target}")


def _high(fd: int) -> int:
    """Move a long-lived fd above the numbers a run's stdio and result pipe are dup2'ed onto."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100)
    os.close(fd)
    return moved


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _show_python(view: dict) -> None:
    """Without bubblewrap, as root: let the runs' unprivileged uid reach the interpreter when it
    lives below a directory other users cannot traverse (pyenv in a 0700 /root). In a mount
    namespace of the zygote's own (runs inherit it): a tmpfs (mode 0755) on each such top
    directory, which also hides the rest of it, and the Python directories bind-mounted
    read-only at their own paths inside. ``view`` comes from ``sandbox.launch.python_view``."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount("none", "/", None, MS_REC | MS_PRIVATE, None)  # nothing mounted here reaches the host
    # Hold the directories before the tmpfs covers their path: bind from the held descriptor.
    held = {d: os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for d in view["dirs"]}
    umask = os.umask(0o022)  # the directories made in the tmpfs must be traversable
    try:
        for top in view["tops"]:
            _mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m,nr_inodes=4096")
        for directory, fd in held.items():
            os.makedirs(directory, mode=0o755, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", directory, None, MS_BIND | MS_REC, None)
            _mount("none", directory, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None)
    finally:
        os.umask(umask)
        for fd in held.values():
            os.close(fd)


# --- the server loop --------------------------------------------------------------------------

def main(config: dict) -> None:
    """Entry point called by the bootstrap that ``sandbox.launch`` passes to ``python -c``."""
    if config.get("python_view"):
        _show_python(config["python_view"])
    for name in PREIMPORTS:
        __import__(name)
    sys.modules["site"].setquit()  # exit()/quit() as in a normal interpreter (we run with -S)
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")
    ctl = socket.socket(fileno=config["ctl_fd"])
    abi = guard.landlock_abi() if config["landlock"] else 0
    ctx = {
        "config": config,
        "snap": pyguard.take_snapshot(),
        "seccomp": guard.build_seccomp_filter() if config["seccomp"] else None,
        "landlock": abi,
        "import_code": sys.modules["importlib._bootstrap_external"]._compile_bytecode.__code__,
        "own_pidns": _high(os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)),
    }
    gc.freeze()  # forked runs never scan (and so never copy-on-write) the zygote's objects
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)
    ctl.send(json.dumps({"ev": "ready", "pid": os.getpid(), "landlock": ctx["landlock"],
                         "seccomp": ctx["seccomp"] is not None}).encode())
    # From here on nobody reads our stdout/stderr: silence them so a stray write can never block.
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    while True:
        msg, fds, _, _ = socket.recv_fds(ctl, 1 << 16, 8)
        if not msg:
            os._exit(0)  # the host closed the socket
        op = json.loads(msg).get("op")
        if op == "exit":
            os._exit(0)
        if op == "run" and len(fds) == 5:
            ctl.send(json.dumps(_serve_one(fds, ctl.fileno(), ctx)).encode())
        else:
            for fd in fds:
                os.close(fd)
            ctl.send(json.dumps({"ev": "done", "id": None, "error": f"bad request {op!r}"}).encode())


def _serve_one(fds: list[int], ctl_fd: int, ctx: dict) -> dict:
    req_fd, stdin_fd, out_w, err_w, res_w = fds
    req = json.loads(_read_all(req_fd))
    os.close(req_fd)
    status_r, status_w = os.pipe()
    if ctx["config"]["unshare"] & CLONE_NEWPID:
        # unshare(CLONE_NEWPID) works once per "pid namespace for children": point that back at
        # our own namespace first, then ask for a fresh one; the next fork becomes its pid 1.
        _check(_libc.setns(ctx["own_pidns"], CLONE_NEWPID), "setns")
        _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ctl_fd)
            os.close(status_r)
            _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")
            _run_init(req, (stdin_fd, out_w, err_w, res_w), status_w, ctx)
        except BaseException:
            _report(status_w, {"error": "run init: " + traceback.format_exc(limit=-3)})
        os._exit(70)
    for fd in (stdin_fd, out_w, err_w, res_w, status_w):
        os.close(fd)  # only the run may hold the write ends, so EOF means "the run is over"
    _, status = os.waitpid(pid, 0)  # returns once every process of the run's namespace is gone
    raw = _read_all(status_r)
    os.close(status_r)
    try:
        report = json.loads(raw) if raw else {"error": f"the run's init ended with status {status} and no report"}
    except ValueError:
        report = {"error": f"unreadable run report {raw[:200]!r}"}
    report.update(ev="done", id=req.get("id"))
    return report


def _report(fd: int, report: dict) -> None:
    try:
        os.write(fd, json.dumps(report).encode())
    except OSError:
        pass


# --- I: pid 1 of the run ----------------------------------------------------------------------

def _prepare_work_dir(req: dict, config: dict) -> tuple[str, list[str]]:
    """Mount the run's private filesystems; returns (work dir, paths the run may write)."""
    limits, uid = req["limits"], config["uid"]
    flags = config["unshare"] & ~CLONE_NEWPID
    if flags:
        _check(_libc.unshare(flags), "unshare")
    if config["unshare"] & CLONE_NEWNS:
        owner = uid if uid is not None else 0
        opts = f"size={int(limits['memory_mb']) << 20},nr_inodes={config['max_inodes']},uid={owner},gid={owner}"
        _mount("none", "/", None, MS_REC | MS_PRIVATE, None)  # nothing we mount leaks out
        _mount("tmpfs", WORK_DIR, "tmpfs", MS_NOSUID | MS_NODEV, opts + ",mode=0700")
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, opts + ",mode=01777")
        if config["unshare"] & CLONE_NEWPID:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
        return WORK_DIR, [WORK_DIR, "/dev"]
    # Weak mode: no mount namespace, so a fresh directory that I removes afterwards.
    work = tempfile.mkdtemp(prefix="rlvr-run-", dir=WORK_DIR)
    if uid is not None:
        os.chown(work, uid, uid)
    return work, [work, "/dev/null", "/dev/zero", "/dev/full"]


def _run_init(req: dict, io_fds: tuple, status_w: int, ctx: dict) -> None:
    config, limits = ctx["config"], req["limits"]
    has_pidns = bool(config["unshare"] & CLONE_NEWPID)
    if not has_pidns:
        # Without a pid namespace, orphans of the run (double-forked, setsid'ed daemons) would be
        # re-parented to the host's init; as a subreaper this process inherits them instead, so
        # it can still kill the whole tree.
        _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "PR_SET_CHILD_SUBREAPER")
    work, writable = _prepare_work_dir(req, config)
    if req["mode"] == "tests":
        n = len(req["tests"])
        budget = float(limits["timeout_s"]) * (n + 1) + 0.5 + 0.02 * n  # setup + each test + forks
    else:
        budget = float(limits["timeout_s"])
    # kill(-1) from the run reaches only the run when it has its own pid namespace or its own uid.
    req["kill_all"] = has_pidns or config["uid"] is not None
    started_r, started_w = os.pipe()  # U writes "\0" here just before the program starts
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.close(started_r)
        try:
            _run_user(req, io_fds, ctx, budget, work, writable, started_w)
        except BaseException:
            _report(started_w, {"error": "could not start the run: " + traceback.format_exc(limit=-3)})
        os._exit(71)
    os.close(started_w)
    for fd in io_fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    ready, _, _ = select.select([pidfd], [], [], budget)
    timed_out = not ready
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    wall = time.perf_counter() - start
    if not has_pidns:
        _kill_descendants()
        shutil.rmtree(work, ignore_errors=True)
    started = _read_all(started_r)
    error = None
    if not started.startswith(b"\0"):
        error = json.loads(started).get("error") if started else f"the run died while starting (status {status})"
    _report(status_w, {"wait": status, "timed_out": timed_out, "wall_s": wall, "error": error})
    os._exit(0)  # as pid 1 of the run, taking every leftover process of the run with us


def _kill_descendants() -> None:
    """SIGKILL and reap every descendant of this (subreaper) process, until none is left.

    Killing the current children orphans their children, who are re-parented to us; repeat. A
    killed process cannot fork any more, so this ends (the pids cap bounds each round). Reaping
    never blocks: an orphan that just arrived is alive until the next round kills it."""
    me = os.getpid()
    while True:
        for child in _children(me):
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            return  # no child left, alive or dead
        time.sleep(0.001)  # SIGKILL is delivered asynchronously


def _children(pid: int) -> list[int]:
    """Live children of ``pid`` from /proc (the kernel's list, all threads' children)."""
    found: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return found


# --- U: the run itself ------------------------------------------------------------------------

def _run_user(req: dict, io_fds: tuple, ctx: dict, budget: float, work: str, writable: list[str],
              started_w: int) -> None:
    config, limits = ctx["config"], req["limits"]
    os.setsid()
    # Move the four fds out of the way first: a source must not be clobbered by an earlier dup2.
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in io_fds]
    for fd, target in zip(moved, (0, 1, 2, harness.RESULT_FD)):
        os.dup2(fd, target, inheritable=target != harness.RESULT_FD)
    os.environ.clear()
    os.environ.update(RUN_ENV, HOME=work, TMPDIR=work)
    # Built per run, after the mounts: Landlock skips rules on mount points that a later mount
    # covers, so a ruleset made once for /tmp would not reach the tmpfs mounted over it.
    landlock_fd = guard.landlock_ruleset(writable, ctx["landlock"]) if ctx["landlock"] else None
    guard.lock_down(dict(limits, cpu_s=budget), uid=config["uid"], landlock_fd=landlock_fd,
                    seccomp_program=ctx["seccomp"], cap_address_space=config["cap_address_space"])
    keep = sorted({0, 1, 2, harness.RESULT_FD, started_w})
    for low, high in zip(keep, keep[1:] + [1 << 20]):
        os.closerange(low + 1, high)  # the control socket, the ruleset, anything inherited
    os.chdir(work)  # after the uid switch: the work dir is private to the run's uid
    emit = harness.make_emitter(harness.RESULT_FD, req["nonce"])
    controls = pyguard.install_audit_hook(ctx["import_code"])
    for name in [n for n in sys.modules if n == "sandbox" or n.startswith("sandbox.")]:
        del sys.modules[name]  # the program must not find the harness by name
    os.write(started_w, b"\0")
    os.close(started_w)
    if req["mode"] == "exec":
        harness.run_program(req["code"], emit)
    else:
        harness.run_tests(req, emit, ctx["snap"], controls)
