"""Score batches of completions: the one way the trainer calls verifiers.

This first version scores in the calling process, one item after another, and turns any
exception a verifier raises into ``status="error"``. The process pool with hard per-item
deadlines, the results cache and per-verifier latency metrics build on the same interface.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Sequence

from verifiers.base import Reward
from verifiers.registry import get_verifier


class VerifierRunner:
    """Scores ``(completion, reference)`` pairs with a named verifier.

    Example::

        runner = VerifierRunner()
        rewards = runner.score_batch("numeric", ["so 42"], [{"answer": "42"}])
        rewards[0].score  # 1.0
    """

    def __init__(self, *, workers: int = 0, timeout_s: float = 10.0):
        self.workers = workers
        self.timeout_s = timeout_s
        self._verifiers: dict[tuple, Any] = {}
        self._status: dict[str, Counter] = {}
        self._latency: dict[str, list[float]] = {}

    def _get(self, name: str, options: dict) -> Any:
        key = (name, tuple(sorted(options.items(), key=lambda kv: kv[0])))
        if key not in self._verifiers:
            self._verifiers[key] = get_verifier(name, **options)
        return self._verifiers[key]

    def score_batch(
        self,
        verifier: str,
        completions: Sequence[str],
        references: Sequence[dict],
        options: dict | None = None,
    ) -> list[Reward]:
        """One :class:`Reward` per completion, in order. Never raises for a verifier's failure."""
        if len(completions) != len(references):
            raise ValueError(f"{len(completions)} completions but {len(references)} references")
        impl = self._get(verifier, dict(options or {}))
        rewards = []
        for completion, reference in zip(completions, references):
            start = time.perf_counter()
            try:
                reward = impl.score(completion, reference)
            except Exception as exc:  # a broken verifier must not kill training
                reward = Reward(0.0, status="error", info={"error": repr(exc)})
            reward.latency_s = reward.latency_s or (time.perf_counter() - start)
            rewards.append(reward)
        self._record(verifier, rewards)
        return rewards

    def _record(self, verifier: str, rewards: list[Reward]) -> None:
        self._status.setdefault(verifier, Counter()).update(r.status for r in rewards)
        lat = self._latency.setdefault(verifier, [])
        lat.extend(r.latency_s for r in rewards)
        del lat[:-10_000]  # bounded memory: percentiles over the most recent items

    def metrics(self) -> dict[str, float]:
        """Status counts and p50/p95 latency per verifier, as flat ``verify/...`` metric names."""
        out: dict[str, float] = {}
        for name, counts in self._status.items():
            for status, n in counts.items():
                out[f"verify/{name}/{status}"] = float(n)
            lat = sorted(self._latency.get(name, []))
            if lat:
                out[f"verify/{name}/latency_p50_ms"] = 1e3 * lat[len(lat) // 2]
                out[f"verify/{name}/latency_p95_ms"] = 1e3 * lat[min(len(lat) - 1, int(0.95 * len(lat)))]
        return out

    def close(self) -> None:
        self._verifiers.clear()

    def __enter__(self) -> "VerifierRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
