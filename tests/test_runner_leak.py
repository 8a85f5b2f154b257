"""100,000 items through the worker pool, with killed workers along the way: no leaked processes,
file descriptors or memory."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rlvr.verifiers import Reward, Verifier, register_verifier
from rlvr.verifiers.runner import VerifierRunner


@register_verifier("test_leak")
class LeakProbe(Verifier):
    """Cheap: 1.0 when the completion equals the answer; "hang" spins until killed."""

    def score(self, completion: str, reference: dict) -> Reward:
        if completion == "hang":
            while True:
                pass
        return Reward(float(completion == reference["answer"]))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker_count() -> int:
    me = str(os.getpid())
    n = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            n += fields[1] == me and fields[0] != "Z" and b"rlvr.verifiers._worker" in cmdline
    return n


@pytest.mark.slow
def test_100k_items_leak_nothing():
    baseline_workers = worker_count()
    runner = VerifierRunner(workers=2, timeout_s=0.5, cache_size=1_000)
    runner.score_batch("test_leak", ["warm"], [{"answer": "warm"}])
    fds, rss = open_fds(), rss_mb()
    total, batch, start = 100_000, 2_000, time.perf_counter()
    for b in range(total // batch):
        completions = [str(b * batch + i) for i in range(batch)]
        references = [{"answer": c} for c in completions]
        if b % 10 == 5:  # five workers killed at their deadline along the way
            completions[7] = "hang"
        rewards = runner.score_batch("test_leak", completions, references)
        assert len(rewards) == batch
        assert sum(r.status == "ok" and r.score == 1.0 for r in rewards) == batch - (b % 10 == 5)
    elapsed = time.perf_counter() - start
    metrics = runner.metrics()
    assert metrics["verify/test_leak/timeout"] == 5.0
    assert metrics["verify/test_leak/ok"] == total - 5 + 1
    assert worker_count() - baseline_workers == 2
    assert open_fds() == fds, "file descriptors leaked"
    assert rss_mb() - rss < 64, f"memory grew by {rss_mb() - rss:.0f} MiB"
    assert len(runner.cache) == 1_000
    runner.close()
    assert worker_count() == baseline_workers
    assert open_fds() <= fds - 4  # the two workers' pipes are closed too
    print(f"\n100k items: {total / elapsed:,.0f} items/s with 2 workers, 5 kills, fds stable at {fds}")
