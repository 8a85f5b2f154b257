"""Verifier workers as Ray actors: the local pool's deadline and status semantics, on any node of a cluster.

:class:`RayWorkerPool` is the ``verifier.backend: ray`` twin of :class:`~verifiers.pool.WorkerPool`, with
the same :meth:`run` contract, so the runner's cache, duplicate folding, metrics and audit work unchanged
on top of it. Each actor is one Ray worker process holding the verifiers it has been sent (pickled,
once per actor); a code verifier's sandboxes run inside it, so every node that hosts actors needs
bubblewrap, and an actor that cannot isolate refuses the way the local sandbox does.

* **Deadline.** Items go to actors one call each, a few queued per actor (Ray runs an actor's calls in
  order; once an actor of a batch has died, one at a time, see below). An item's deadline starts when
  the actor is free for it; one that overruns is charged ``timeout`` and its actor is killed
  (``ray.kill``) and replaced. Items queued behind it had not started: they go back to the queue,
  uncharged.
* **Lost actors.** An actor that dies under an item (its node went away, the process was killed, the
  verifier crashed it) does not cost the item its score: the item is retried on another actor, up to
  ``max_retries`` times, and only then charged ``error`` with a message that says so. Nothing is ever
  scored 0 silently. (A dying process can take the reply of the call *before* the fatal one with it,
  so the head of its queue is not surely the culprit: after a death the batch queues one call per
  actor, and each death is then charged to the item that caused it.)
* **The cluster.** With ``address`` null the pool joins the cluster that ``RAY_ADDRESS`` or a running
  ``ray start`` names, and otherwise starts a local one (stopped again at :meth:`close`). The default
  size is one actor per ``num_cpus`` CPUs of the whole cluster, divided between the ranks of a
  torchrun (``WORLD_SIZE``), each of which has a pool of its own.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import time
from collections import deque
from typing import Any

from rlvr.verifiers.pool import STARTUP_TIMEOUT_S, BatchLoop, Workers, _failure

logger = logging.getLogger(__name__)
QUEUE_DEPTH = 4  # calls queued per actor: hides Ray's ~0.2 ms call latency, bounds the re-queue on a kill
MAX_STARTUP_FAILURES = 3


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError("verifier.backend 'ray' needs Ray: pip install 'rlvr[ray]' (or pip install ray); "
                          "backend 'local' needs nothing") from None
    return ray


class VerifierActor:
    """The body of one Ray actor (wrapped by ``ray.remote`` in :class:`RayWorkerPool`)."""

    def __init__(self, paths: list[str], memory_mb: int):
        # The driver's import path, where it exists here, so verifiers from the user's own modules
        # unpickle on a local cluster as they do in local workers (on other nodes: install them there).
        sys.path.extend(p for p in paths if p not in sys.path and os.path.isdir(p))
        from rlvr.verifiers._worker import limit_memory

        limit_memory(memory_mb)  # as a local worker's, before anything big is imported
        import rlvr.verifiers  # noqa: F401  (registers the built-ins)
        from rlvr.verifiers.math import symbolic

        symbolic.warm()  # sympy/math-verify imported now, not inside the first item's deadline
        self.instances: dict[str, Any] = {}

    def ready(self) -> int:
        return os.getpid()

    def score(self, spec: str, blob: bytes | None, item: tuple) -> tuple:
        """``("result", result_tuple)`` or ``("unportable", why)``."""
        from rlvr.verifiers._worker import score_item

        impl = self.instances.get(spec)
        if impl is None:
            if blob is None:
                return ("unportable", "the actor lost the verifier it was sent")
            try:
                impl = self.instances[spec] = pickle.loads(blob)
            except Exception as exc:
                return ("unportable", f"{type(exc).__name__}: {exc}")
        _item_id, completion, reference, context = item
        return ("result", score_item(impl, completion, reference, context))

    def close(self) -> None:
        from rlvr.verifiers._worker import _close_all

        _close_all(self.instances)


class Actor:
    """A handle, its readiness and the verifier specs it holds."""

    def __init__(self, handle: Any):
        self.handle = handle
        self.ready_ref = handle.ready.remote()
        self.ready = False
        self.dead = False
        self.started = time.monotonic()
        self.specs: set[str] = set()


class RayWorkerPool(Workers):
    """``size`` verifier actors (``None``: one per ``num_cpus`` CPUs of the cluster) shared by all threads
    of one :class:`~verifiers.runner.VerifierRunner`; :meth:`run` as :meth:`verifiers.pool.WorkerPool.run`."""

    def __init__(self, size: int | None, *, memory_mb: int = 4096, num_cpus: float = 1.0, address: str | None = None,
                 max_retries: int = 1):
        ray = self.ray = import_ray()
        if not num_cpus > 0:
            raise ValueError("num_cpus per verifier actor must be > 0")
        self.started_ray = not ray.is_initialized()
        if self.started_ray:
            ray.init(address=address, include_dashboard=False, configure_logging=False, log_to_driver=False)
        if size is None:  # the cluster's CPUs, divided between the torchrun ranks that share it
            ranks = int(os.environ.get("WORLD_SIZE", "1") or 1)
            size = max(1, int(ray.cluster_resources().get("CPU", 1) // num_cpus) // ranks)
        free = ray.available_resources().get("CPU", 0.0)
        if size * num_cpus > free:
            logger.warning("the verifier pool wants %d actors x %g CPUs but the Ray cluster has %g CPUs free: actors "
                           "that do not fit wait for resources, and items wait for them (see `ray status`)",
                           size, num_cpus, free)
        super().__init__(size)
        self.max_retries = int(max_retries)
        self.killed = 0  # actors killed at a deadline
        self.crashed = 0  # actors that died on their own
        self.retried = 0  # items run again because their actor died under them
        self._remote = ray.remote(num_cpus=num_cpus, max_restarts=0, max_task_retries=0)(VerifierActor)
        self._args = ([p if p else os.getcwd() for p in sys.path], int(memory_mb))
        self._fill()

    def _start(self) -> Actor:
        return Actor(self._remote.remote(*self._args))

    def _stop(self, actor: Actor) -> None:
        if not actor.dead:
            actor.dead = True
            try:
                self.ray.kill(actor.handle, no_restart=True)
            except Exception:
                pass

    def _batch(self, spec: str, blob: bytes, items: list[tuple], timeout_s: float) -> "_RayBatch":
        return _RayBatch(self, spec, blob, items, timeout_s)

    def close(self) -> None:
        """Stop every actor (letting idle ones close their verifiers' sandboxes first); stop the local
        Ray this pool started."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            everyone = list(self._all)
            self._cond.notify_all()
        closing = [a.handle.close.remote() for a in idle if a.ready]
        if closing:
            self.ray.wait(closing, num_returns=len(closing), timeout=3.0)
        for a in everyone:
            self.discard(a)
        if self.started_ray and self.ray.is_initialized():
            self.ray.shutdown()


class _Queue:
    """The calls an actor has been given in this batch, in the order it runs them."""

    __slots__ = ("items", "refs", "deadline")

    def __init__(self):
        self.items: deque = deque()
        self.refs: deque = deque()
        self.deadline = 0.0  # of the item at the head


class _RayBatch(BatchLoop):
    """One :meth:`RayWorkerPool.run` call: dispatch, wait, charge, over the actors it owns."""

    def __init__(self, pool: RayWorkerPool, spec: str, blob: bytes, items: list[tuple], timeout_s: float):
        self.pool = pool
        self.ray = pool.ray
        self.spec = spec
        self.blob = blob
        self.timeout_s = timeout_s
        self.pending: deque = deque(items)
        self.attempts: dict = {}
        self.results: dict = {}
        self.unportable: list = []
        self.note = ""
        self.queues: dict[Actor, _Queue] = {}
        self.startup_failures = 0
        self.depth = QUEUE_DEPTH  # 1 after a death (see the module docstring)

    def busy(self) -> int:
        return sum(len(q.items) for q in self.queues.values())

    def owned_count(self) -> int:
        return len(self.queues)

    def finish(self) -> None:
        keep = []
        for actor, queue in self.queues.items():
            if queue.items or actor.dead:  # unfinished calls (an exception above): do not reuse it
                self.pool.discard(actor)
            else:
                keep.append(actor)
        self.queues.clear()
        self.pool.release(keep)

    def _own(self, actors: list[Actor]) -> None:
        for actor in actors:
            self.queues[actor] = _Queue()

    def _replace(self, actor: Actor) -> None:
        queue = self.queues.pop(actor)
        self.pending.extendleft(reversed(queue.items))  # queued, never started: not charged
        self.pool.discard(actor)
        fresh = self.pool.spawn()
        if fresh is not None:
            self._own([fresh])

    def _dispatch(self) -> None:
        now = time.monotonic()
        for actor, queue in self.queues.items():
            while actor.ready and self.pending and len(queue.items) < self.depth:
                item = self.pending.popleft()
                blob = None if self.spec in actor.specs else self.blob
                actor.specs.add(self.spec)
                if not queue.items:
                    queue.deadline = now + self.timeout_s
                queue.items.append(item)
                queue.refs.append(actor.handle.score.remote(self.spec, blob, item))

    def _wait(self) -> None:
        heads = {q.refs[0]: a for a, q in self.queues.items() if q.refs}
        starting = {a.ready_ref: a for a in self.queues if not a.ready}
        deadlines = [q.deadline for q in self.queues.values() if q.items]
        deadlines += [a.started + STARTUP_TIMEOUT_S for a in starting.values()]
        refs = list(heads) + list(starting)
        if not refs:
            return
        timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        done, _ = self.ray.wait(refs, num_returns=1, timeout=timeout)
        if done:  # everything else that is ready too, in one go
            done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in done:
            if ref in starting:
                self._on_ready(starting[ref], ref)
            else:
                queue = self.queues.get(heads[ref])
                if queue is not None and queue.refs and queue.refs[0] == ref:  # not replaced meanwhile
                    self._on_result(heads[ref])

    def _on_ready(self, actor: Actor, ref: Any) -> None:
        try:
            self.ray.get(ref)
        except Exception as exc:
            self.startup_failures += 1
            if self.startup_failures >= MAX_STARTUP_FAILURES:
                self.queues.pop(actor)
                self.pool.discard(actor)
                self._fail_all("error", f"verifier actors fail to start ({type(exc).__name__}: {exc})"[:2000])
                return
            self._replace(actor)
            return
        actor.ready = True
        self.startup_failures = 0

    def _on_result(self, actor: Actor) -> None:
        queue = self.queues[actor]
        ref = queue.refs.popleft()
        item = queue.items.popleft()
        queue.deadline = time.monotonic() + self.timeout_s
        try:
            kind, payload = self.ray.get(ref)
        except self.ray.exceptions.RayActorError as exc:
            self._on_death(actor, item, exc)
            return
        except Exception as exc:  # the call itself failed (a serialisation error, say): this item only
            self.results[item[0]] = _failure("error", f"verifier actor call failed: {type(exc).__name__}: {exc}")
            return
        if kind == "result":
            self.results[item[0]] = payload
        else:  # the verifier cannot be rebuilt in an actor: the runner scores the rest in-process
            self.unportable += [item[0]] + [i[0] for q in self.queues.values() for i in q.items] + \
                [i[0] for i in self.pending]
            self.pending.clear()
            for q in self.queues.values():
                q.items.clear()
                q.refs.clear()
            self.note = payload

    def _on_death(self, actor: Actor, item: tuple, exc: Exception) -> None:
        self.pool.crashed += 1
        self.depth = 1
        tries = self.attempts[item[0]] = self.attempts.get(item[0], 0) + 1
        if tries > self.pool.max_retries:
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.results[item[0]] = _failure(
                "error", f"verifier actor died on this item {tries} times ({detail})")
        else:
            self.pool.retried += 1
            self.pending.appendleft(item)
        self._replace(actor)

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for actor, queue in list(self.queues.items()):
            if queue.items and actor.ready and now >= queue.deadline:
                item = queue.items.popleft()
                queue.refs.popleft()
                self.results[item[0]] = _failure(
                    "timeout", f"exceeded the {self.timeout_s:g} s deadline; verifier actor killed", self.timeout_s)
                self.pool.killed += 1
                self._replace(actor)
        for actor in [a for a in self.queues if not a.ready and now - a.started > STARTUP_TIMEOUT_S]:
            self.startup_failures += 1
            if self.startup_failures >= MAX_STARTUP_FAILURES:
                self._fail_all("error", f"verifier actors did not start within {STARTUP_TIMEOUT_S:g} s: the Ray "
                               "cluster may have no free CPUs for them (see `ray status`)")
                return
            self._replace(actor)

    def _fail_all(self, status: str, message: str) -> None:
        for actor, queue in list(self.queues.items()):
            self.pending.extend(queue.items)
            queue.items.clear()
            self.queues.pop(actor)
            self.pool.discard(actor)
        for item in self.pending:
            self.results.setdefault(item[0], _failure(status, message))
        self.pending.clear()
