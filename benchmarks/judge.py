"""What the judge verifier itself costs around the judge model's time: HTTP calls per second at a
concurrency limit, against a judge that answers at once or after a fixed delay (a stand-in for the
model's generation time), and the cost of a sample served from the persistent cache.

    python benchmarks/judge.py [--samples 256] [--delay-ms 0 50] [--concurrency 1 8 32]

The stand-in server (tests/judge_server.py) runs in this process on 127.0.0.1, so the numbers are
the client's and the loopback's cost, an upper bound on the overhead a real server adds to its own
generation time. With a delay d and a limit c, the ideal is c / d calls per second; the table prints
the ratio measured / ideal.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlvr.verifiers.runner import VerifierRunner  # noqa: E402
from tests.judge_server import FakeJudgeServer  # noqa: E402


def run(samples: int, delay_s: float, concurrency: int, cache_dir: Path) -> tuple[float, float]:
    """(calls per second with a cold cache, samples per second served from the cache)."""
    completions = [f"The answer is {k}." for k in range(samples)]
    references = [{"answer": "7"}] * samples
    prompts = [[{"role": "user", "content": "What is 3 + 4?"}]] * samples
    with FakeJudgeServer(delay_s=delay_s) as judge:
        options = {"model": "bench", "base_url": judge.url, "max_concurrency": concurrency,
                   "cache_path": str(cache_dir / f"c{concurrency}-{delay_s}.sqlite")}
        with VerifierRunner(workers=1, cache_size=0) as runner:
            start = time.perf_counter()
            rewards = runner.score_batch("judge", completions, references, options, prompts=prompts)
            cold = time.perf_counter() - start
            assert all(r.status == "ok" for r in rewards) and judge.calls == samples
            start = time.perf_counter()
            runner.score_batch("judge", completions, references, options, prompts=prompts)
            warm = time.perf_counter() - start
            assert judge.calls == samples  # every sample came from the cache
    return samples / cold, samples / warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=256, help="distinct responses judged per setting")
    parser.add_argument("--delay-ms", type=float, nargs="+", default=[0.0, 50.0], help="the stand-in judge's time per call")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32], help="max_concurrency settings")
    args = parser.parse_args()
    print(f"{'delay ms':>8} {'max_conc':>8} {'calls/s':>9} {'vs ideal':>8} {'cached samples/s':>17}")
    with tempfile.TemporaryDirectory() as tmp:
        for delay_ms in args.delay_ms:
            for concurrency in args.concurrency:
                calls, cached = run(args.samples, delay_ms / 1e3, concurrency, Path(tmp))
                ideal = f"{calls / (concurrency / (delay_ms / 1e3)):.2f}" if delay_ms else "-"
                print(f"{delay_ms:>8g} {concurrency:>8d} {calls:>9.0f} {ideal:>8} {cached:>17.0f}")


if __name__ == "__main__":
    main()
