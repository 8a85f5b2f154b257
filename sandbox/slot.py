"""One slot: a zygote in its own sandbox and cgroup, serving one run at a time.

Start-up (~0.1-0.3 s, once): a SOCK_SEQPACKET socketpair is created, bwrap (or, in weak mode, the
bare interpreter) starts the zygote with an empty environment and one end of the socket; the
zygote's "ready" message arrives with SCM_CREDENTIALS, which gives its pid *as seen by the host*
(the kernel translates it out of the sandbox's pid namespace), and the host moves that pid into
the slot's cgroup before any run exists.

A run (~ms): the request travels in a memfd, stdin in another, and the write ends of three pipes
(stdout, stderr, results) go along as SCM_RIGHTS. The host then drains the three pipes while it
waits for the zygote's "done", so a flood can never fill a pipe and deadlock anything; output past
``max_output_bytes`` is cut by closing our read end (the program gets EPIPE). If the zygote does
not answer within the run's own budget plus a grace period, the host kills the whole slot (its
bwrap, and with it the sandbox's pid namespace) and starts a fresh one for the next run.

Who starts the sandbox matters: bwrap's ``--die-with-parent`` (and, without bwrap, the zygote
itself) uses ``PR_SET_PDEATHSIG``, which the kernel fires when the *thread* that forked the
process exits, not when the process does. A slot started lazily by a caller's worker thread
(a ``ThreadPoolExecutor`` that is shut down after a batch, ``asyncio.to_thread``) was SIGKILLed
when that thread ended, often in the middle of the next caller's run ("the sandbox process died
(exit status -9)", EPIPE or ECONNRESET on the control socket). Every sandbox process is therefore
forked by one long-lived daemon thread per process (``spawn``), which lives as long as the process:
"die with the parent" keeps its meaning (the host process dies, its sandboxes die) and nothing else.
"""

from __future__ import annotations

import array
import json
import os
import queue
import secrets
import selectors
import signal
import socket
import struct
import subprocess
import threading
import time
from concurrent.futures import Future

from rlvr.sandbox import launch
from rlvr.sandbox.detect import zygote_config
from rlvr.sandbox.cgroups import SlotCgroup
from rlvr.sandbox.limits import Limits
from rlvr.sandbox.outcomes import RawRun

START_TIMEOUT_S = 30.0  # bwrap + interpreter + preimports; generous for a loaded 2-core machine
GRACE_S = 3.0  # beyond the run's own budget before the host declares the sandbox stuck
UID_BASE, UID_SPAN = 1 << 30, 1 << 29  # run uids: random, far from system and user ranges


class SandboxStartError(RuntimeError):
    """The sandbox process did not come up (the message carries its stderr)."""


def run_budget(mode: str, n_tests: int, limits: Limits) -> float:
    """Seconds pid 1 of the run allows it (mirrors ``sandbox.zygote._run_init``)."""
    if mode == "tests":
        return limits.timeout_s * (n_tests + 1) + 0.5 + 0.02 * n_tests
    return limits.timeout_s


class Slot:
    """A zygote process plus its cgroup. Not thread-safe: the pool hands a slot to one caller."""

    def __init__(self, index: int, caps: dict, cgroup: SlotCgroup | None, *, use_bwrap: bool,
                 site_packages: bool = False):
        self.index = index
        self.caps = caps
        self.cgroup = cgroup
        self.use_bwrap = use_bwrap
        self.site_packages = site_packages
        self.uid = UID_BASE + secrets.randbelow(UID_SPAN) if caps["uid_drop"] else None
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.zygote_pid: int | None = None
        self.baseline = 0
        self.runs = 0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the zygote and wait for it to be ready (raises SandboxStartError)."""
        self.close()
        host_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        host_end.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        config = zygote_config(self.caps, child_end.fileno(), self.uid)
        if self.use_bwrap:
            argv = launch.bwrap_command(config, as_root=self.caps["root"], site_packages=self.site_packages)
        else:
            if self.uid is not None:  # runs drop to another uid: it must be able to read Python
                view = launch.python_view(site_packages=self.site_packages)
                if view["dirs"]:
                    config["python_view"] = view
            argv = launch.python_command(config, site_packages=self.site_packages)
        try:
            self.proc = spawn(lambda: subprocess.Popen(
                argv, pass_fds=[child_end.fileno()], env=launch.clean_env(), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, cwd="/"))
        finally:
            child_end.close()
        self.sock = host_end
        ready = self._await_ready()
        self.zygote_pid = ready["host_pid"]
        if self.cgroup is not None:
            self.cgroup.attach(self.zygote_pid)
            self.baseline = self.cgroup.memory_usage() or 0
        self.runs = 0

    def _await_ready(self) -> dict:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            remaining = deadline - time.monotonic()
            sel = selectors.DefaultSelector()
            sel.register(self.sock, selectors.EVENT_READ)
            ready = sel.select(max(0.0, min(remaining, 0.2)))
            sel.close()
            if ready:
                msg, anc, _, _ = self.sock.recvmsg(1 << 16, socket.CMSG_SPACE(12))
                if msg:
                    info = json.loads(msg)
                    info["host_pid"] = _sender_pid(anc)
                    if info.get("ev") == "ready" and info["host_pid"]:
                        return info
                raise SandboxStartError(f"zygote sent {msg[:200]!r} instead of ready; {self._stderr_text()}")
            if self.proc.poll() is not None or remaining <= 0:
                why = "exited" if self.proc.poll() is not None else "did not become ready in time"
                text = self._stderr_text()
                self.close()
                raise SandboxStartError(f"sandbox {why}: {text}")

    def _stderr_text(self) -> str:
        if self.proc is None or self.proc.stderr is None:
            return ""
        try:
            os.set_blocking(self.proc.stderr.fileno(), False)
            return (self.proc.stderr.read() or b"").decode(errors="replace").strip()[-2000:]
        except (OSError, ValueError):
            return ""

    # --- one run ------------------------------------------------------------------------------

    def run(self, request: dict, stdin: bytes, limits: Limits) -> RawRun:
        """Send one request and gather everything about it. Never raises for the program's sake."""
        start = time.perf_counter()
        if not self.alive:
            self.start()
        n_tests = len(request.get("tests") or ())
        if self.cgroup is not None:
            try:
                self.cgroup.set_limits(self.baseline + (limits.memory_mb << 20), limits.max_processes + 3)
            except OSError as exc:  # e.g. EBUSY: the slot holds more than the new limit
                self.kill()  # a fresh slot (and baseline) for the next run
                return RawRun(error=f"could not set the slot's cgroup limits: {exc!r}",
                              wall_s=time.perf_counter() - start)
        oom_before = self.cgroup.oom_kills() if self.cgroup is not None else 0
        ours, theirs = [], []
        try:
            for _ in range(3):
                r, w = os.pipe()
                ours.append(r)
                theirs.append(w)
            req_fd = _memfd("request", json.dumps(request).encode())
            stdin_fd = _memfd("stdin", stdin)
            theirs[:0] = [req_fd, stdin_fd]
            self.sock.sendmsg([b'{"op":"run"}'],
                              [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", theirs))])
        except OSError as exc:
            for fd in ours:
                os.close(fd)
            self.kill()
            return RawRun(error=f"could not send the run to the sandbox: {exc!r}", wall_s=time.perf_counter() - start)
        finally:
            for fd in theirs:
                os.close(fd)  # the run holds the only write ends now
        deadline = time.monotonic() + run_budget(request["mode"], n_tests, limits) + GRACE_S
        raw = self._collect(ours, limits, n_tests, deadline)
        if self.cgroup is not None:
            raw.oom_kills = self.cgroup.oom_kills() - oom_before
        self.runs += 1
        raw.wall_s = time.perf_counter() - start
        return raw

    def _collect(self, fds: list[int], limits: Limits, n_tests: int, deadline: float) -> RawRun:
        """Drain stdout, stderr and results until EOF on all and "done", or the deadline."""
        raw = RawRun()
        caps = [limits.max_output_bytes, limits.max_output_bytes, 4096 * (3 * n_tests + 8)]
        bufs = [bytearray(), bytearray(), bytearray()]
        sel = selectors.DefaultSelector()
        for i, fd in enumerate(fds):
            sel.register(fd, selectors.EVENT_READ, i)
        sel.register(self.sock, selectors.EVENT_READ, "ctl")
        open_fds = set(fds)
        try:
            while open_fds or raw.done is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raw.host_timeout = True
                    self.kill()
                    break
                for key, _ in sel.select(remaining):
                    if key.data == "ctl":
                        try:
                            msg = self.sock.recv(1 << 16)
                        except OSError as exc:  # ECONNRESET: it died with our request unread
                            msg, why = b"", f"{exc!r}, "
                        else:
                            why = ""
                        if not msg:  # the zygote died
                            raw.error = f"the sandbox process died ({why}{self._exit_text()})"
                            self.kill()
                            return self._finish(raw, bufs, fds, open_fds, sel)
                        raw.done = json.loads(msg)
                        sel.unregister(self.sock)
                        continue
                    i, fd = key.data, key.fd
                    chunk = os.read(fd, 1 << 16)
                    if chunk and len(bufs[i]) + len(chunk) <= caps[i]:
                        bufs[i] += chunk
                        continue
                    if chunk:  # over the cap: keep what fits and stop reading (writer gets EPIPE)
                        bufs[i] += chunk[: caps[i] - len(bufs[i])]
                        if i < 2:
                            raw.truncated = True
                        else:
                            raw.records_overflow = True
                    sel.unregister(fd)
                    os.close(fd)
                    open_fds.discard(fd)
        finally:
            sel.close()
        return self._finish(raw, bufs, fds, open_fds, None)

    @staticmethod
    def _finish(raw: RawRun, bufs, fds, open_fds, sel) -> RawRun:
        if sel is not None:
            sel.close()
        for fd in open_fds:
            os.close(fd)
        raw.stdout, raw.stderr, raw.records = bytes(bufs[0]), bytes(bufs[1]), bytes(bufs[2])
        return raw

    def _exit_text(self) -> str:
        code = self.proc.poll() if self.proc is not None else None
        return f"exit status {code}" if code is not None else "still running"

    # --- teardown -----------------------------------------------------------------------------

    def kill(self) -> None:
        """End the slot's whole sandbox now (bwrap, zygote and any run)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._release()

    def close(self) -> None:
        """Ask the zygote to exit, then make sure the sandbox is gone."""
        if self.sock is not None and self.alive:
            try:
                self.sock.send(b'{"op":"exit"}')
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def _release(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None
        self.zygote_pid = None


# --- the spawner thread ----------------------------------------------------------------------

_spawner_lock = threading.Lock()
_spawner: tuple[int, "queue.SimpleQueue"] | None = None  # (owner pid, job queue)


def spawn(start):
    """``start()`` (which forks a sandbox process) in this process's spawner thread; its result.

    The spawner is a daemon thread that never returns while the process lives, so the
    parent-death signal of what it forks fires only when the whole process ends (see the module
    docstring). Created lazily, and again in a forked child (threads do not survive fork)."""
    global _spawner
    with _spawner_lock:
        if _spawner is None or _spawner[0] != os.getpid():
            jobs: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_spawner_loop, args=(jobs,), name="sandbox-spawner", daemon=True).start()
            _spawner = (os.getpid(), jobs)
        jobs = _spawner[1]
    done: Future = Future()
    jobs.put((start, done))
    return done.result()


def _forget_spawner() -> None:
    global _spawner, _spawner_lock
    _spawner, _spawner_lock = None, threading.Lock()  # the lock may have been held at fork()


os.register_at_fork(after_in_child=_forget_spawner)


def _spawner_loop(jobs: "queue.SimpleQueue") -> None:
    while True:
        start, done = jobs.get()
        try:
            done.set_result(start())
        except BaseException as exc:  # handed to the caller, never ends this thread
            done.set_exception(exc)


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _sender_pid(ancillary: list) -> int | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= 12:
            return struct.unpack("3i", data[:12])[0]
    return None
