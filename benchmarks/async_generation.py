"""The quickstart's GRPO stage, synchronous and with asynchronous generation at S = 1 and 2.

    python benchmarks/async_generation.py [--steps 400] [--rounds 2] [--staleness 1,2] [--out DIR]
                                          [--trainer-threads N] [--worker-threads N] [--set KEY=VALUE ...]
                                          [--sft FOLDER]

One SFT warm start (the quickstart's, seed 0) is trained by the packaged quickstart config for
``--steps`` steps, once synchronously and once per staleness, each in its own process, in alternating
rounds (the machine is shared and noisy). Prints, per setting: the median wall time per step after a
warm-up, its ratio to the synchronous run's, the phase split (generation in the worker, the trainer's
wait for samples, the update), the held-out greedy accuracy at the end, and the wall time until it
first reaches 0.6 (evaluated every 50 steps; the ratio to the synchronous run's time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]  # keep verifiers.py etc. from shadowing
sys.path.insert(0, str(_HERE.parent))

TARGET = 0.6
WARMUP = 5


def run_one(sft: Path, out: Path, steps: int, staleness: int | None, trainer_threads: int | None,
            worker_threads: int | None, extra: list[str] = ()) -> dict:
    """One GRPO run in its own process; its metrics, summarised."""
    overrides = [f"out={out}", f"model.path={sft}", f"train.steps={steps}", "eval.every=50", "checkpoint.every=0",
                 "checkpoint.at_end=false", "checkpoint.final_model=false", "log.progress=false", "log.plot=false",
                 *extra]
    if trainer_threads:
        overrides.append(f"train.threads={trainer_threads}")
    if staleness is not None:
        overrides.append(f"async_generation.max_staleness={staleness}")
        if worker_threads:
            overrides.append(f"async_generation.worker_threads={worker_threads}")
    config = Path(__file__).resolve().parents[1] / "rlvr" / "configs" / "quickstart.yaml"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rlvr.cli", "train", str(config), *overrides], check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps_ = [r for r in records if r["step"] > WARMUP and "time/step" in r]
    evals = [r for r in records if "eval/accuracy" in r]
    reached = next((r for r in evals if r["eval/accuracy"] >= TARGET), None)
    elapsed, seconds_at = 0.0, {}
    for r in records:  # wall time of training (steps only) up to each step
        elapsed += r.get("time/step", 0.0)
        seconds_at[r["step"]] = elapsed

    def median(key):
        values = [r[key] for r in steps_ if key in r]
        return statistics.median(values) if values else 0.0

    return {"step_s": median("time/step"), "generate_s": median("time/generate"), "update_s": median("time/update"),
            "wait_s": median("time/wait_for_samples"), "verify_s": median("time/verify"),
            "accuracy": evals[-1]["eval/accuracy"], "start": evals[0]["eval/accuracy"],
            "to_target_s": seconds_at[reached["step"]] if reached else None,
            "to_target_step": reached["step"] if reached else None, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=400, help="GRPO steps per run")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of all settings")
    parser.add_argument("--staleness", default="1,2", help="comma-separated max_staleness values beside synchronous")
    parser.add_argument("--trainer-threads", type=int, default=None, help="train.threads of every run (default auto)")
    parser.add_argument("--worker-threads", type=int, default=None, help="async_generation.worker_threads")
    parser.add_argument("--out", default=None, help="folder for the runs (default: a temporary one)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override of every run's config (repeatable), e.g. algorithm.off_policy=decoupled")
    parser.add_argument("--sft", default=None, help="an SFT warm start to reuse (default: build the quickstart's)")
    args = parser.parse_args()
    from benchmarks.vs_trl import build_sft_model

    root = Path(args.out or tempfile.mkdtemp(prefix="rlvr-async-"))
    sft = Path(args.sft) if args.sft else build_sft_model(root, seed=0, layers=2, threads=args.trainer_threads or 2)
    settings: list[int | None] = [None, *(int(s) for s in args.staleness.split(","))]
    results: dict = {s: [] for s in settings}
    for round_ in range(args.rounds):
        for s in settings:
            name = "sync" if s is None else f"S{s}"
            result = run_one(sft, root / f"{name}_r{round_}", args.steps, s, args.trainer_threads, args.worker_threads,
                             args.set)
            results[s].append(result)
            print(f"  round {round_ + 1} {name}: {result['step_s']:.3f} s/step, accuracy {result['start']:.3f} -> "
                  f"{result['accuracy']:.3f}", flush=True)

    def mean(s, key):
        values = [r[key] for r in results[s] if r[key] is not None]
        return sum(values) / len(values) if values else None

    base_step, base_target = mean(None, "step_s"), mean(None, "to_target_s")
    print(f"\nquickstart GRPO, {args.steps} steps, median s/step after {WARMUP} (mean of {args.rounds} rounds):")
    print(f"{'setting':<8}{'s/step':>8}{'ratio':>7}{'generate':>10}{'wait':>7}{'update':>8}{'verify':>8}"
          f"{'acc end':>9}{'to 0.6 s':>10}{'ratio':>7}")
    for s in settings:
        to_target = mean(s, "to_target_s")
        ratio = f"{to_target / base_target:.2f}" if to_target and base_target else "-"
        print(f"{'sync' if s is None else f'S={s}':<8}{mean(s, 'step_s'):>8.3f}{mean(s, 'step_s') / base_step:>7.2f}"
              f"{mean(s, 'generate_s'):>10.3f}{mean(s, 'wait_s'):>7.3f}{mean(s, 'update_s'):>8.3f}"
              f"{mean(s, 'verify_s'):>8.3f}{mean(s, 'accuracy'):>9.3f}"
              f"{(f'{to_target:.0f}' if to_target else '-'):>10}{ratio:>7}")


if __name__ == "__main__":
    main()
