"""A pool of verifier worker processes with a hard per-item deadline.

Each worker is a fresh interpreter running :mod:`verifiers._worker` (spawned, never forked from the
trainer: the trainer has torch loaded and threads running, and a forked copy of that is both
heavy and unsafe). A batch is cut into small chunks; a worker answers item by item, and each item's
deadline starts when the worker begins it (when the chunk was sent, or when the previous item's
result arrived). An item that overruns is charged ``timeout``, its worker is killed with
``SIGKILL`` and replaced, and the rest of its chunk goes back to the queue. A worker that dies
(segfault, out of memory) charges ``error`` to the item it was running, likewise.

Any thread may call :meth:`WorkerPool.run`; each call owns the workers it uses until it returns,
so concurrent calls never share a worker, and nothing here relies on signals.
"""

from __future__ import annotations

import math
import os
import pickle
import selectors
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from rlvr.verifiers._worker import encode_frame

WORKER_COMMAND = [sys.executable, "-c", "from rlvr.verifiers._worker import main; main()"]  # tests may swap it
MAX_CHUNK = 32
STARTUP_TIMEOUT_S = 120.0
MAX_STARTUP_FAILURES = 3
STOP_GRACE_S = 3.0  # for idle workers to exit on their own at close() before they are killed


def worker_env(memory_mb: int) -> dict[str, str]:
    """The worker's environment: ours, plus a PYTHONPATH that finds this package and every module
    the parent can import (so a verifier defined in a user's module unpickles there too)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    paths = [root] + [p if p else os.getcwd() for p in sys.path]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["RLVR_VERIFIER_MEMORY_MB"] = str(int(memory_mb))
    env["RLVR_VERIFIER_PARENT"] = str(os.getpid())
    return env


class Worker:
    """One worker process and its two pipes (requests on its stdin, frames from its stdout)."""

    def __init__(self, env: dict[str, str]):
        self.proc = subprocess.Popen(list(WORKER_COMMAND), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     close_fds=True, start_new_session=True)
        self.fd = self.proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.buffer = bytearray()
        self.ready = False
        self.dead = False
        self.started = time.monotonic()
        self.specs: set[str] = set()  # verifier specs this worker has already received

    def send(self, message: object) -> bool:
        try:
            self.proc.stdin.write(encode_frame(message))
            self.proc.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def receive(self) -> list | None:
        """Complete frames available now; None when the worker has closed its end (it died)."""
        try:
            chunk = os.read(self.fd, 1 << 20)
        except BlockingIOError:
            return []
        except OSError:
            return None
        if not chunk:
            return None
        self.buffer += chunk
        frames = []
        while len(self.buffer) >= 4:
            size = int.from_bytes(self.buffer[:4], "big")
            if len(self.buffer) < 4 + size:
                break
            frames.append(pickle.loads(bytes(self.buffer[4: 4 + size])))
            del self.buffer[: 4 + size]
        return frames

    def kill(self) -> None:
        """SIGKILL, reap, close both pipes (idempotent)."""
        if self.dead:
            return
        self.dead = True
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def stop(self, grace_s: float = 1.0) -> None:
        """Close stdin so the worker exits on its own; kill it if it has not within ``grace_s``."""
        if self.dead:
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        self.kill()


class Workers:
    """The bookkeeping every pool of scoring workers shares, whatever a worker is (a local process
    here, a Ray actor in :mod:`verifiers.ray_pool`): at most ``size`` of them, idle ones handed to one
    batch at a time, lost ones respawned at the next :meth:`acquire`. Subclasses say how a worker
    starts (:meth:`_start`) and stops (:meth:`_stop`) and what runs one batch (:meth:`_batch`), then
    call :meth:`_fill`."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError("a worker pool needs at least one worker")
        self.size = size
        self._cond = threading.Condition()
        self._all: set = set()
        self._closed = False
        self._idle: list = []

    def _start(self):
        raise NotImplementedError

    def _stop(self, worker) -> None:
        raise NotImplementedError

    def _fill(self) -> None:
        self._idle = [self.spawn() for _ in range(self.size)]

    @property
    def closed(self) -> bool:
        return self._closed

    def alive(self) -> int:
        """Workers this pool holds now (busy or idle)."""
        with self._cond:
            return len(self._all)

    def spawn(self):
        """A new worker, counted in the pool (None once the pool is closed)."""
        with self._cond:
            if self._closed:
                return None
            worker = self._start()
            self._all.add(worker)
            return worker

    def discard(self, worker) -> None:
        self._stop(worker)
        with self._cond:
            self._all.discard(worker)

    def acquire(self, n: int, *, block: bool) -> list:
        """Up to ``n`` idle workers; with ``block``, wait until at least one is free (or the pool closes).

        Workers lost since the last call (failed starts, crashes whose replacement could not start)
        are respawned here, so the pool never shrinks for good."""
        with self._cond:
            while not self._closed and len(self._all) < self.size:
                worker = self._start()
                self._all.add(worker)
                self._idle.append(worker)
            while block and not self._idle and not self._closed:
                self._cond.wait()
            taken, self._idle = self._idle[:n], self._idle[n:]
            return taken

    def release(self, workers: list) -> None:
        with self._cond:
            if not self._closed:
                self._idle.extend(w for w in workers if not w.dead)
                self._cond.notify_all()
                return
        for w in workers:
            self.discard(w)

    def run(self, spec: str, blob: bytes, items: list[tuple], timeout_s: float) -> tuple[dict, list, str]:
        """Score ``items`` (``(item_id, completion, reference, context)``) with the pickled verifier ``blob``.

        Returns ``(results, unportable_ids, note)``: result tuples by item id, and the ids left
        unscored because the workers could not rebuild the verifier (``note`` says why).
        """
        batch = self._batch(spec, blob, items, timeout_s)
        try:
            batch.run()
        finally:
            batch.finish()
        return batch.results, batch.unportable, batch.note

    def _batch(self, spec: str, blob: bytes, items: list[tuple], timeout_s: float) -> "BatchLoop":
        raise NotImplementedError


class WorkerPool(Workers):
    """``size`` worker processes shared by all threads of one :class:`~verifiers.runner.VerifierRunner`."""

    def __init__(self, size: int, *, memory_mb: int = 4096, max_chunk: int = MAX_CHUNK):
        super().__init__(size)
        self.max_chunk = max_chunk
        self.killed = 0  # workers killed at a deadline
        self.crashed = 0  # workers that died on their own
        self._env = worker_env(memory_mb)
        self._fill()

    def _start(self) -> Worker:
        return Worker(self._env)

    def _stop(self, worker: Worker) -> None:
        worker.kill()

    def _batch(self, spec: str, blob: bytes, items: list[tuple], timeout_s: float) -> "_Batch":
        return _Batch(self, spec, blob, items, timeout_s)

    def close(self) -> None:
        """Stop every worker. Workers busy in another thread's batch are killed; that batch returns
        ``error`` for its unfinished items."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            busy = [w for w in self._all if w not in idle]
            self._cond.notify_all()
        for w in busy:
            try:
                w.proc.kill()  # its batch sees EOF, reaps it and closes its pipes
            except OSError:
                pass
        # Idle workers exit on EOF, after closing what their verifiers hold (sandbox pools and
        # their cgroups): all of them at once, within one shared grace period.
        for w in idle:
            try:
                w.proc.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + STOP_GRACE_S
        for w in idle:
            w.stop(grace_s=max(0.0, deadline - time.monotonic()))
        with self._cond:
            self._all.difference_update(idle)


class BatchLoop:
    """The loop of one ``run()`` call, shared by the local and the Ray pool: take workers (at least one,
    waiting if need be; more while there is work for them), then dispatch, wait and charge deadlines
    until every item has a result. Subclasses hold ``pool`` and ``pending`` and say how many workers
    they own (:meth:`owned_count`) and how much work is in flight (:meth:`busy`)."""

    pool: Workers
    pending: deque

    def busy(self) -> int:
        raise NotImplementedError

    def owned_count(self) -> int:
        raise NotImplementedError

    def run(self) -> None:
        wanted = lambda: min(self.pool.size, len(self.pending) + self.busy())  # noqa: E731
        self._own(self.pool.acquire(max(1, wanted()), block=True))
        while self.pending or self.busy():
            if self.pool.closed or not self.owned_count():
                self._fail_all("error", "the verifier runner was closed")
                return
            if self.owned_count() < wanted():
                self._own(self.pool.acquire(wanted() - self.owned_count(), block=False))
            self._dispatch()
            self._wait()
            self._check_deadlines()


class _Flight:
    """The chunk a worker is working through, and the deadline of the item at its head."""

    __slots__ = ("items", "deadline")

    def __init__(self, items: list[tuple], deadline: float):
        self.items = deque(items)
        self.deadline = deadline


def _failure(status: str, message: str, latency_s: float = 0.0) -> tuple:
    return (0.0, status, {}, latency_s, {"error": message})


class _Batch(BatchLoop):
    """One :meth:`WorkerPool.run` call: an event loop over the worker processes it owns."""

    def __init__(self, pool: WorkerPool, spec: str, blob: bytes, items: list[tuple], timeout_s: float):
        self.pool = pool
        self.spec = spec
        self.blob = blob
        self.timeout_s = timeout_s
        self.pending: deque = deque(items)
        self.results: dict = {}
        self.unportable: list = []
        self.note = ""
        self.inflight: dict[Worker, _Flight] = {}
        self.owned: list[Worker] = []
        self.selector = selectors.DefaultSelector()
        self.startup_failures = 0

    # -- ownership
    def _own(self, workers: list[Worker]) -> None:
        for w in workers:
            self.owned.append(w)
            self.selector.register(w.fd, selectors.EVENT_READ, w)

    def _drop(self, w: Worker) -> None:
        if w in self.owned:
            self.owned.remove(w)
            self.selector.unregister(w.fd)
        self.inflight.pop(w, None)
        self.pool.discard(w)

    def _replace(self, w: Worker) -> None:
        self._drop(w)
        fresh = self.pool.spawn()
        if fresh is not None:
            self._own([fresh])

    def finish(self) -> None:
        keep = []
        for w in list(self.owned):
            self.selector.unregister(w.fd)
            if w in self.inflight or w.dead:  # unfinished work (an exception above): do not reuse it
                self.pool.discard(w)
            else:
                keep.append(w)
        self.owned.clear()
        self.selector.close()
        self.pool.release(keep)

    # -- loop
    def busy(self) -> int:
        return len(self.inflight)

    def owned_count(self) -> int:
        return len(self.owned)

    def _dispatch(self) -> None:
        idle = [w for w in self.owned if w.ready and w not in self.inflight]
        for w in idle:
            if not self.pending:
                return
            size = max(1, min(self.pool.max_chunk, math.ceil(len(self.pending) / (2 * len(self.owned)))))
            chunk = [self.pending.popleft() for _ in range(min(size, len(self.pending)))]
            blob = None if self.spec in w.specs else self.blob
            if w.send(("score", self.spec, blob, chunk)):
                w.specs.add(self.spec)
                self.inflight[w] = _Flight(chunk, time.monotonic() + self.timeout_s)
            else:
                self.pending.extendleft(reversed(chunk))
                self._on_death(w)

    def _wait(self) -> None:
        now = time.monotonic()
        deadlines = [f.deadline for f in self.inflight.values()]
        deadlines += [w.started + STARTUP_TIMEOUT_S for w in self.owned if not w.ready]
        timeout = max(0.0, min(deadlines) - now) if deadlines else 0.0
        for key, _ in self.selector.select(timeout):
            w = key.data
            frames = w.receive()
            if frames is None:
                self._on_death(w)
                continue
            for frame in frames:
                self._on_frame(w, frame)

    def _on_frame(self, w: Worker, frame: tuple) -> None:
        kind = frame[0]
        if kind == "ready":
            w.ready = True
            self.startup_failures = 0
        elif kind == "result":
            flight = self.inflight[w]
            item = flight.items.popleft()
            self.results[item[0]] = frame[2]
            flight.deadline = time.monotonic() + self.timeout_s
            if not flight.items:
                del self.inflight[w]
        elif kind == "unportable":
            flight = self.inflight.pop(w)
            self.unportable += [item[0] for item in flight.items] + [item[0] for item in self.pending]
            self.pending.clear()
            self.note = frame[2]

    def _on_death(self, w: Worker) -> None:
        try:
            code = w.proc.wait(timeout=1.0)  # it closed its pipe: it is exiting or gone
        except subprocess.TimeoutExpired:
            code = None
        flight = self.inflight.get(w)
        if flight is not None and flight.items:
            self.pool.crashed += 1
            item = flight.items.popleft()
            self.results[item[0]] = _failure("error", f"verifier worker died (exit code {code}) on this item")
            self.pending.extendleft(reversed(flight.items))
        elif not w.ready:
            self.startup_failures += 1
            if self.startup_failures >= MAX_STARTUP_FAILURES:
                self._drop(w)
                self._fail_all("error", f"verifier workers fail to start (exit code {code}; see stderr)")
                return
        self._replace(w)

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for w, flight in list(self.inflight.items()):
            if now >= flight.deadline:
                item = flight.items.popleft()
                self.results[item[0]] = _failure(
                    "timeout", f"exceeded the {self.timeout_s:g} s deadline; worker killed", self.timeout_s)
                self.pending.extendleft(reversed(flight.items))
                self.pool.killed += 1
                self._replace(w)
        for w in [w for w in self.owned if not w.ready and now - w.started > STARTUP_TIMEOUT_S]:
            self.startup_failures += 1
            self._replace(w)

    def _fail_all(self, status: str, message: str) -> None:
        for w, flight in list(self.inflight.items()):
            self.pending.extend(flight.items)
            self._drop(w)  # it is still busy with items nobody will read
        for item in self.pending:
            self.results.setdefault(item[0], _failure(status, message))
        self.pending.clear()
