"""Sandbox speed: isolated programs per second and per-run overhead over a bare ``python -c``.

    python benchmarks/sandbox.py            # ~1 minute on a 2-core machine
    python benchmarks/sandbox.py --quick    # ~15 s

What it measures, side by side in one process:

* latency: the same small program run alternately as a bare ``python -c`` subprocess and through
  ``SandboxPool.execute`` (one slot), pairs interleaved so both see the same machine load; the
  median of each and the median per-run overhead (sandbox minus bare; negative means the sandbox
  is faster, since it forks a warm interpreter instead of starting one);
* throughput on all cores: N programs through a pool with one slot per core, against N bare
  ``python -c`` subprocesses run by as many threads; and N ``run_tests`` calls (a solution with
  three asserts, HumanEval/MBPP sized) through the same pool;
* every throughput figure is the median over ``--repeats`` alternating rounds;
* CPU time per run (this process plus every sandbox process, from /proc: the zygotes and all the
  runs they reaped), which does not depend on what else the machine is doing, and the rate it
  implies on idle cores.

The machines this project runs on are shared and noisy (other jobs run on the same cores): read
the load average printed with the results, and compare ratios rather than absolute numbers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlvr.sandbox import Limits, SandboxPool, capabilities  # noqa: E402

PROGRAM = "print(sum(i * i for i in range(1000)))"
SOLUTION = "def square_sum(n):\n    return sum(i * i for i in range(n))\n"
TESTS = ["assert square_sum(3) == 5", "assert square_sum(0) == 0", "assert square_sum(1000) == 332833500"]
# HumanEval-sized: one test that defines check(candidate) with a dozen asserts and calls it.
HE_TESTS = ["def check(candidate):\n" + "".join(f"    assert candidate({n}) == {sum(i * i for i in range(n))}\n"
                                                  for n in range(12))
            + "    assert abs(candidate(7) - 91) < 1e-9\n    assert candidate(2) in [1, 5]\ncheck(square_sum)\n"]
LIMITS = Limits(timeout_s=10)


def bare_run() -> float:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True)
    assert out.stdout == "332833500\n", out
    return time.perf_counter() - start


def sandbox_run(pool: SandboxPool) -> float:
    start = time.perf_counter()
    result = pool.execute(PROGRAM, limits=LIMITS)
    assert result.stdout == "332833500\n", result
    return time.perf_counter() - start


def latency(pool: SandboxPool, pairs: int) -> dict:
    """Interleaved bare/sandbox runs on one slot; medians in seconds."""
    bare, boxed = [], []
    for _ in range(pairs):
        bare.append(bare_run())
        boxed.append(sandbox_run(pool))
    deltas = [b - a for a, b in zip(bare, boxed)]
    return {"bare": statistics.median(bare), "sandbox": statistics.median(boxed),
            "overhead": statistics.median(deltas)}


def cpu_seconds(pool: SandboxPool) -> float:
    """CPU used so far by this process and by every slot's zygote and its reaped runs."""
    total = sum(os.times()[:2])
    tick = os.sysconf("SC_CLK_TCK")
    for slot in pool._slots:
        if slot.zygote_pid:
            fields = Path(f"/proc/{slot.zygote_pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime
    return total


def cpu_per_run(pool: SandboxPool, n: int) -> dict:
    """CPU seconds per execute() and per run_tests() call (all processes involved)."""
    out = {}
    for name, call in (("execute", lambda: pool.execute(PROGRAM, limits=LIMITS)),
                       ("run_tests", lambda: pool.run_tests(SOLUTION, TESTS, limits=LIMITS)),
                       ("guarded", lambda: pool.run_tests(SOLUTION, TESTS, limits=LIMITS, guard_solution=True)),
                       ("he", lambda: pool.run_tests(SOLUTION, HE_TESTS, limits=LIMITS)),
                       ("he_guarded", lambda: pool.run_tests(SOLUTION, HE_TESTS, limits=LIMITS, guard_solution=True))):
        before = cpu_seconds(pool)
        for _ in range(n):
            call()
        out[name] = (cpu_seconds(pool) - before) / n
    before = sum(os.times()[2:4])
    for _ in range(max(5, n // 4)):
        bare_run()
    out["bare"] = (sum(os.times()[2:4]) - before) / max(5, n // 4)
    return out


def throughput(pool: SandboxPool, n: int, workers: int, repeats: int) -> dict:
    """Programs per second: bare subprocesses vs sandbox executes vs sandbox run_tests calls."""
    rates = {"bare": [], "execute": [], "run_tests": [], "guarded": []}
    with ThreadPoolExecutor(workers) as threads:
        for _ in range(repeats):
            start = time.perf_counter()
            list(threads.map(lambda _: bare_run(), range(n)))
            rates["bare"].append(n / (time.perf_counter() - start))
            start = time.perf_counter()
            results = pool.execute_many([(PROGRAM, "")] * n, limits=LIMITS)
            rates["execute"].append(n / (time.perf_counter() - start))
            assert all(r.stdout == "332833500\n" for r in results)
            start = time.perf_counter()
            reports = pool.run_tests_many([(SOLUTION, TESTS)] * n, limits=LIMITS)
            rates["run_tests"].append(n / (time.perf_counter() - start))
            assert all(r.all_passed for r in reports)
            start = time.perf_counter()
            reports = pool.run_tests_many([(SOLUTION, TESTS)] * n, limits=LIMITS, guard_solution=True)
            rates["guarded"].append(n / (time.perf_counter() - start))
            assert all(r.all_passed for r in reports)
    return {k: statistics.median(v) for k, v in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs (~15 s)")
    parser.add_argument("--pairs", type=int, default=60, help="interleaved bare/sandbox latency pairs")
    parser.add_argument("--n", type=int, default=100, help="programs per throughput round")
    parser.add_argument("--repeats", type=int, default=3, help="throughput rounds (median reported)")
    parser.add_argument("--slots", type=int, default=os.cpu_count() or 1, help="concurrent sandboxes")
    args = parser.parse_args()
    if args.quick:
        args.pairs, args.n, args.repeats = 20, 40, 1
    caps = capabilities()
    print(f"isolation: {caps['isolation']}  (bwrap {caps['bwrap']['version'] or 'absent'}, cgroups "
          f"{', '.join(caps['cgroups']) or 'none'}, seccomp {caps['seccomp']}, landlock ABI {caps['landlock_abi']})")
    print(f"cores: {os.cpu_count()}   slots: {args.slots}   python: {sys.version.split()[0]}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}  (shared machine: medians, compare ratios)")
    with SandboxPool(slots=args.slots, allow_weak_isolation=True) as pool:
        pool.warm()
        for _ in range(5):  # warm the page cache and the slots
            sandbox_run(pool)
            bare_run()
        lat = latency(pool, args.pairs)
        thr = throughput(pool, args.n, args.slots, args.repeats)
        cpu = cpu_per_run(pool, args.n)
    ms = 1e3
    print()
    print(f"latency, one program, median of {args.pairs} interleaved pairs:")
    print(f"  bare python -c        {lat['bare'] * ms:8.1f} ms")
    print(f"  sandbox execute()     {lat['sandbox'] * ms:8.1f} ms   ratio sandbox/bare {lat['sandbox'] / lat['bare']:.2f}")
    print(f"  overhead per run      {lat['overhead'] * ms:+8.1f} ms   (sandbox minus bare, median of pairs; target <= +10 ms)")
    print()
    print(f"throughput on {args.slots} slots, median of {args.repeats} rounds of {args.n}:")
    print(f"  bare python -c        {thr['bare']:8.1f} programs/s")
    print(f"  sandbox execute()     {thr['execute']:8.1f} programs/s   ratio {thr['execute'] / thr['bare']:.2f}x bare")
    print(f"  sandbox run_tests()   {thr['run_tests']:8.1f} solutions/s ({len(TESTS)} tests each, "
          f"{thr['run_tests'] * len(TESTS):.0f} tests/s; target >= 40 programs/s)")
    print(f"  run_tests(guard_solution=True) {thr['guarded']:5.1f} solutions/s   (what the code verifier uses: "
          f"ratio {thr['guarded'] / thr['run_tests']:.2f} of unguarded)")
    print()
    cores = os.cpu_count() or 1
    print("CPU per run (all processes involved, independent of the machine's other load):")
    print(f"  bare python -c        {cpu['bare'] * ms:8.1f} ms CPU  -> {cores / cpu['bare']:6.0f} programs/s on {cores} idle cores")
    print(f"  sandbox execute()     {cpu['execute'] * ms:8.1f} ms CPU  -> {cores / cpu['execute']:6.0f} programs/s")
    print(f"  sandbox run_tests()   {cpu['run_tests'] * ms:8.1f} ms CPU  -> {cores / cpu['run_tests']:6.0f} solutions/s")
    print(f"  run_tests, guarded    {cpu['guarded'] * ms:8.1f} ms CPU  -> {cores / cpu['guarded']:6.0f} solutions/s")
    print(f"  HumanEval-style test  {cpu['he'] * ms:8.1f} ms CPU unguarded, {cpu['he_guarded'] * ms:.1f} ms guarded "
          f"(one check() with 14 asserts)")
    print(f"load average after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
