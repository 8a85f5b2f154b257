"""Verifier throughput on the two backends: local worker processes vs Ray actors, same machine, same work.

    python benchmarks/verifier_backends.py              # ~2 minutes on a 2-core machine
    python benchmarks/verifier_backends.py --quick      # ~40 s
    python benchmarks/verifier_backends.py --ray-address auto   # actors on an existing cluster

For each verifier (``code``: a solution and three asserts run in the sandbox, HumanEval/MBPP sized;
``math``: MATH-style boxed answers through sympy/math-verify; ``numeric``: the cheapest there is, so
per-item overhead shows), N items are scored by a :class:`VerifierRunner` with ``--workers`` workers
on each backend (cache off, so every item is really scored), in batches of ``--batch`` as a training
step sends them. Rounds alternate local and Ray (both pools started and warmed before the first
timing) and the median items/s of each is printed with the ratio ``ray/local``. Without
``--ray-address`` a local Ray with as many CPUs as the machine is started for it.

These machines are shared and noisy: read the load average printed with the results and compare the
ratio, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlvr.sandbox import capabilities  # noqa: E402
from rlvr.verifiers.runner import VerifierRunner  # noqa: E402

SOLUTION = "```python\ndef square_sum(n):\n    return sum(i * i for i in range({k}) if i < n) + 0 * {k}\n```"
TESTS = ["assert square_sum(3) == 5", "assert square_sum(0) == 0", "assert square_sum(10) == 285"]


def workloads(n: int) -> dict[str, tuple[list[str], list[dict], dict]]:
    """Distinct items (no two alike, so nothing is folded) for each verifier."""
    weak = capabilities()["isolation"] != "strong"
    return {
        "code": ([SOLUTION.format(k=100 + i) for i in range(n)], [{"tests": TESTS}] * n,
                 {"allow_weak_isolation": weak}),
        "math": ([rf"so the answer is \boxed{{\frac{{{2 * i + 2}}}{{2}}}}" for i in range(n)],
                 [{"answer": str(i + 1)} for i in range(n)], {}),
        "numeric": ([f"the answer is {i}" for i in range(n)], [{"answer": str(i)} for i in range(n)], {}),
    }


def rate(runner: VerifierRunner, name: str, work: tuple, batch: int) -> float:
    completions, references, options = work
    start = time.perf_counter()
    for i in range(0, len(completions), batch):
        rewards = runner.score_batch(name, completions[i: i + batch], references[i: i + batch], options)
        bad = [r for r in rewards if r.status != "ok" or r.score != 1.0]
        if bad:
            raise SystemExit(f"{name}: an item was not scored 1.0 ({bad[0].status}: {bad[0].info})")
    return len(completions) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer items and rounds (~40 s)")
    parser.add_argument("--n", type=int, default=None, help="items per verifier per round (default 128; quick 48)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3; quick 2)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="workers on each backend")
    parser.add_argument("--batch", type=int, default=64, help="items per score_batch call (a training step's share)")
    parser.add_argument("--ray-address", default=None, help="Ray cluster to use (default: a local Ray)")
    args = parser.parse_args()
    n = args.n or (48 if args.quick else 128)
    rounds = args.rounds or (2 if args.quick else 3)
    work = workloads(n)

    import ray

    if args.ray_address is None:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, configure_logging=False, log_to_driver=False)
    else:
        ray.init(address=args.ray_address, configure_logging=False, log_to_driver=False)
    runners = {"local": VerifierRunner(workers=args.workers, timeout_s=30, cache_size=0),
               "ray": VerifierRunner(workers=args.workers, timeout_s=30, cache_size=0, backend="ray")}
    rates: dict[str, dict[str, list[float]]] = {name: {b: [] for b in runners} for name in work}
    try:
        for runner in runners.values():  # start every pool and each verifier in it outside the timing
            for name, (c, r, o) in work.items():
                runner.score_batch(name, c[: 2 * args.workers], r[: 2 * args.workers], o)
        for k in range(rounds):
            order = list(runners) if k % 2 == 0 else list(reversed(runners))
            for name in work:
                for backend in order:
                    rates[name][backend].append(rate(runners[backend], name, work[name], args.batch))
    finally:
        for runner in runners.values():
            runner.close()
        ray.shutdown()

    print(f"{n} items x {rounds} rounds, {args.workers} workers each, batches of {args.batch}, "
          f"sandbox isolation {capabilities()['isolation']}, load average {os.getloadavg()[0]:.2f}")
    print(f"{'verifier':<10}{'local items/s':>16}{'ray items/s':>14}{'ray/local':>11}")
    for name, by_backend in rates.items():
        local, on_ray = (statistics.median(by_backend[b]) for b in ("local", "ray"))
        print(f"{name:<10}{local:>16.1f}{on_ray:>14.1f}{on_ray / local:>11.2f}")


if __name__ == "__main__":
    main()
