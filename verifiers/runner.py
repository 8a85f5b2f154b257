"""Score batches of completions: the one way the trainer calls verifiers.

:class:`VerifierRunner` adds to a verifier what training needs around it:

* **a hard per-item deadline** (``workers > 0``): items are scored in a pool of worker processes
  (:mod:`verifiers.pool`); an item that overruns is killed with its worker, which is replaced, and
  the item gets ``status="timeout"``. No signals are involved, so it behaves the same from any
  thread. A verifier that declares ``batched = True`` (``judge``) gets the whole batch at once, in the
  calling process, and bounds its own calls. A verifier that declares ``in_process = True`` (``numeric``, ``repetition``, ``length``
  in overlong mode: microseconds on any input) is scored in the calling thread anyway. With
  ``workers=0`` items are scored in the calling thread: no process overhead, but **no deadline** —
  a pathological answer can stall the caller. Use it only for cheap verifiers you trust
  that do not declare ``in_process`` themselves (e.g. ``format`` with your own patterns).
* **a results cache** keyed by (verifier, options, completion, reference), bounded (LRU), and
  duplicates inside a batch are scored once; a reward served from the cache has
  ``info["cached"] = True``;
* **metrics** per verifier: status counts, p50/p95 latency (over the last 10,000 scored items),
  cache hits.

It never raises because a verifier failed: such items come back with ``status="error"`` or
``"timeout"``. It does raise for configuration errors (an unknown verifier or option).

A verifier is shipped to the workers pickled; one that cannot be (defined in ``__main__``, holding
an open handle) is scored in the calling thread instead, with a one-time warning.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
import weakref
from collections import Counter, deque
from typing import Any, Sequence

from rlvr.verifiers.base import Reward, coerce_reward, context_fields, error_reward, score_sample
from rlvr.verifiers.cache import RewardCache, copy_reward, item_key, spec_key
from rlvr.verifiers.pool import WorkerPool
from rlvr.verifiers.registry import get_verifier

logger = logging.getLogger(__name__)
LATENCY_WINDOW = 10_000
#: A reward this far from zero is almost surely a verifier's bug (a count, a unit slip, 1e9 for
#: "very good"); one of them dominates every advantage of its batch. Warned about once per verifier.
IMPLAUSIBLE_REWARD = 1e4
BACKENDS = ("local", "ray")


def default_workers() -> int:
    """The default pool size: one worker per core, at most four."""
    return max(1, min(4, os.cpu_count() or 1))


class VerifierRunner:
    """Scores ``(completion, reference)`` pairs with a named verifier.

    Args:
        workers: worker processes. ``None`` (the default) = :func:`default_workers` (one per core,
            at most 4), started on first use; ``0`` = score in the calling thread, *without* a
            deadline (see the module docstring).
        timeout_s: the hard deadline per item, in seconds (with ``workers > 0``).
        cache_size: results kept in the LRU cache (0 disables it).
        memory_mb: data-segment limit of each worker process (a runaway answer fails with an
            error instead of eating the machine's memory); 0 = no limit.
        backend: ``"local"`` (worker processes on this machine) or ``"ray"`` (Ray actors anywhere in a
            cluster, :mod:`verifiers.ray_pool`: same deadline and statuses; an actor lost under an item
            retries it). With ``"ray"``, ``workers=None`` means one actor per ``ray_num_cpus`` CPUs of
            the cluster (divided between torchrun's ranks), and ``workers=0`` is refused.
        ray_address: the cluster to join (``None``: ``RAY_ADDRESS``, a running ``ray start``, or else a
            local Ray started for this runner).
        ray_num_cpus: CPUs Ray reserves for each verifier actor.

    Example::

        with VerifierRunner(workers=2, timeout_s=5) as runner:
            rewards = runner.score_batch("math", ["so \\\\boxed{42}"], [{"answer": "42"}])
            rewards[0].score  # 1.0
            runner.metrics()  # {"verify/math/ok": 1.0, "verify/math/latency_p50_ms": ..., ...}
    """

    def __init__(self, *, workers: int | None = None, timeout_s: float = 10.0, cache_size: int = 50_000,
                 memory_mb: int = 4096, backend: str = "local", ray_address: str | None = None,
                 ray_num_cpus: float = 1.0):
        if backend not in BACKENDS:
            raise ValueError(f"unknown verifier backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
        self.backend = backend
        if backend == "ray":
            if workers is not None and int(workers) < 1:
                raise ValueError("the ray backend needs workers >= 1 (or null: one actor per CPU of the cluster); "
                                 "workers 0 means scoring in this process, which is the local backend")
            self.workers = None if workers is None else int(workers)
        else:
            self.workers = default_workers() if workers is None else int(workers)
            if self.workers < 0:
                raise ValueError("workers must be >= 0")
        self.ray_address = ray_address
        self.ray_num_cpus = float(ray_num_cpus)
        if not timeout_s > 0:
            raise ValueError("timeout_s must be > 0")
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.cache = RewardCache(cache_size)
        self._pool: Any = None  # a WorkerPool, or a RayWorkerPool with the ray backend
        self._finalizer: weakref.finalize | None = None
        self._lock = threading.Lock()
        self._impls: dict[str, Any] = {}
        self._blobs: dict[str, bytes | None] = {}
        self._in_process: set[str] = set()
        self._status: dict[str, Counter] = {}
        self._latency: dict[str, deque] = {}
        self._hits: Counter = Counter()
        self._warned_huge: set[str] = set()

    # ------------------------------------------------------------------ scoring
    def score_batch(
        self,
        verifier: str,
        completions: Sequence[str],
        references: Sequence[dict],
        options: dict | None = None,
        *,
        prompts: Sequence[list | None] | None = None,
        finish_reasons: Sequence[str | None] | None = None,
    ) -> list[Reward]:
        """One :class:`Reward` per completion, in order. Never raises for a verifier's failure.

        ``prompts`` (chat messages) and ``finish_reasons`` (``"stop"`` / ``"length"``), one per
        completion, reach verifiers whose ``score`` takes them (see :data:`CONTEXT_FIELDS`).
        """
        n = len(completions)
        if len(references) != n or (prompts is not None and len(prompts) != n) or \
                (finish_reasons is not None and len(finish_reasons) != n):
            raise ValueError(f"{n} completions but {len(references)} references"
                             + (f", {len(prompts)} prompts" if prompts is not None else "")
                             + (f", {len(finish_reasons)} finish reasons" if finish_reasons is not None else ""))
        opts = dict(options or {})
        spec = spec_key(verifier, opts)
        impl = self._impl(spec, verifier, opts)
        wanted = context_fields(impl)
        given = {"prompt": prompts, "finish_reason": finish_reasons}
        columns = {field: given[field] for field in wanted if given[field] is not None}
        cacheable = bool(getattr(impl, "cacheable", True)) and self.cache.max_items > 0
        out: list[Reward | None] = [None] * len(completions)
        keys: list[bytes | None] = [None] * len(completions)
        first: dict[bytes, int] = {}
        duplicates: list[tuple[int, int]] = []
        work: list[tuple[int, str, dict]] = []
        hits = 0
        for i, (completion, reference) in enumerate(zip(completions, references)):
            completion = completion if isinstance(completion, str) else str(completion)
            context = {field: values[i] for field, values in columns.items()}
            if cacheable:
                keys[i] = key = item_key(spec, completion, reference, context)
                cached = self.cache.get(key)
                if cached is not None:
                    cached.info["cached"] = True  # latency_s stays the original scoring time
                    out[i] = cached
                    hits += 1
                    continue
                if key in first:  # the same item twice in one batch: score it once
                    duplicates.append((i, first[key]))
                    continue
                first[key] = i
            work.append((i, completion, reference, context))
        computed = self._compute(spec, impl, work)
        for i, reward in computed.items():
            out[i] = reward
            if cacheable:
                self.cache.put(keys[i], reward)
        for i, j in duplicates:
            out[i] = copy_reward(out[j])
        self._record(verifier, out, [computed[i].latency_s for i in computed], hits)
        return out  # type: ignore[return-value]

    def _impl(self, spec: str, name: str, options: dict) -> Any:
        with self._lock:
            impl = self._impls.get(spec)
        if impl is None:
            impl = get_verifier(name, **options)  # unknown names/options raise here, loudly
            with self._lock:
                impl = self._impls.setdefault(spec, impl)
        return impl

    def _compute(self, spec: str, impl: Any, work: list[tuple[int, str, dict, dict]]) -> dict[int, Reward]:
        if not work:
            return {}
        if getattr(impl, "batched", False):
            return _score_batch_here(impl, work)
        if self.workers == 0 or spec in self._in_process or getattr(impl, "in_process", False):
            return {i: _score_here(impl, c, r, x) for i, c, r, x in work}
        blob = self._blob(spec, impl)
        if blob is None:
            return {i: _score_here(impl, c, r, x) for i, c, r, x in work}
        results, unportable, note = self._get_pool().run(spec, blob, work, self.timeout_s)
        rewards = {i: _from_tuple(t) for i, t in results.items()}
        if unportable:
            self._go_in_process(spec, f"the worker could not rebuild it ({note})")
            by_id = {i: (c, r, x) for i, c, r, x in work}
            rewards.update({i: _score_here(impl, *by_id[i]) for i in unportable})
        return rewards

    def _blob(self, spec: str, impl: Any) -> bytes | None:
        if spec not in self._blobs:
            try:
                blob = pickle.dumps(impl, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                blob = None
                self._go_in_process(spec, f"it cannot be pickled ({type(exc).__name__}: {exc})")
            if blob is not None and getattr(type(impl), "__module__", "") == "__main__":
                blob = None  # a fresh worker cannot import the parent's __main__
                self._go_in_process(spec, "it is defined in __main__")
            self._blobs[spec] = blob
        return self._blobs[spec]

    def _go_in_process(self, spec: str, why: str) -> None:
        if spec not in self._in_process:
            self._in_process.add(spec)
            logger.warning("verifier %s is scored in the calling process without a deadline: %s",
                           spec.split("\0")[0], why)

    def _get_pool(self) -> Any:
        with self._lock:
            if self._pool is None or self._pool.closed:
                if self.backend == "ray":
                    from rlvr.verifiers.ray_pool import RayWorkerPool  # Ray is imported only when asked for

                    self._pool = RayWorkerPool(self.workers, memory_mb=self.memory_mb, num_cpus=self.ray_num_cpus,
                                               address=self.ray_address)
                else:
                    self._pool = WorkerPool(self.workers, memory_mb=self.memory_mb)
                self._finalizer = weakref.finalize(self, self._pool.close)
            return self._pool

    # ------------------------------------------------------------------ metrics
    def _record(self, verifier: str, rewards: list, latencies: list[float], hits: int) -> None:
        huge = next((r.score for r in rewards if abs(r.score) > IMPLAUSIBLE_REWARD), None)
        if huge is not None and verifier not in self._warned_huge:
            self._warned_huge.add(verifier)
            logger.warning("verifier %s returned a reward of %g: rewards beyond +-%g are almost surely a bug in the "
                           "verifier, and one of them dominates its whole batch's advantages", verifier, huge,
                           IMPLAUSIBLE_REWARD)
        with self._lock:
            self._status.setdefault(verifier, Counter()).update(r.status for r in rewards)
            self._latency.setdefault(verifier, deque(maxlen=LATENCY_WINDOW)).extend(latencies)
            self._hits[verifier] += hits

    def metrics(self) -> dict[str, float]:
        """Cumulative status counts, cache hits and p50/p95 latency per verifier, as flat
        ``verify/<name>/<status>``, ``verify/<name>/cache_hits``, ``verify/<name>/latency_p50_ms``,
        ``verify/<name>/latency_p95_ms`` metric names."""
        out: dict[str, float] = {}
        with self._lock:
            for name, counts in self._status.items():
                for status, n in counts.items():
                    out[f"verify/{name}/{status}"] = float(n)
                out[f"verify/{name}/cache_hits"] = float(self._hits[name])
                lat = sorted(self._latency.get(name, ()))
                if lat:
                    out[f"verify/{name}/latency_p50_ms"] = 1e3 * lat[len(lat) // 2]
                    out[f"verify/{name}/latency_p95_ms"] = 1e3 * lat[min(len(lat) - 1, int(0.95 * len(lat)))]
        return out

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop the worker processes (a later :meth:`score_batch` starts new ones)."""
        with self._lock:
            finalizer, self._finalizer, self._pool = self._finalizer, None, None
        if finalizer is not None:
            finalizer()

    def __enter__(self) -> "VerifierRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _score_here(impl: Any, completion: str, reference: dict, context: dict | None = None) -> Reward:
    start = time.perf_counter()
    try:
        reward = coerce_reward(score_sample(impl, completion, reference, context))
    except Exception as exc:  # a broken verifier must not kill training
        reward = error_reward(exc)
    if not reward.latency_s:
        reward.latency_s = time.perf_counter() - start
    return reward


def _score_batch_here(impl: Any, work: list[tuple[int, str, dict, dict]]) -> dict[int, Reward]:
    """A batched verifier's rewards for ``work``, in one call (an exception is every item's error)."""
    start = time.perf_counter()
    try:
        values = impl.score_batch([c for _, c, _, _ in work], [r for _, _, r, _ in work], [x for _, _, _, x in work])
        if len(values) != len(work):
            raise RuntimeError(f"score_batch returned {len(values)} rewards for {len(work)} items")
        rewards = [coerce_reward(v) for v in values]
    except Exception as exc:  # a broken verifier must not kill training
        rewards = [error_reward(exc) for _ in work]
    share = (time.perf_counter() - start) / len(work)
    for reward in rewards:
        reward.latency_s = reward.latency_s or share
    return {i: reward for (i, _, _, _), reward in zip(work, rewards)}


def _from_tuple(t: tuple) -> Reward:
    score, status, components, latency_s, info = t
    try:
        return Reward(score, status, components, latency_s, info)
    except (ValueError, TypeError) as exc:
        return Reward(0.0, "error", latency_s=latency_s, info={"error": f"invalid reward from verifier: {exc}"})
