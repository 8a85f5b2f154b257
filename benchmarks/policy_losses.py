"""GRPO against the newer policy losses (GSPO, CISPO, DAPO) on the quickstart task, seeds side by side.

    python benchmarks/policy_losses.py [--presets grpo,gspo,cispo,dapo] [--seeds 0,1,2] [--steps 300]
                                       [--eval-every 50] [--parallel 2] [--threads 1] [--out DIR]

For each seed: the quickstart's tiny model and SFT warm start (built once per seed, shared by every
preset), then the quickstart's RL stage (rlvr/configs/quickstart.yaml, its guidance and learning rate
included) once per preset, `algorithm.preset=NAME` the only change, as `rlvr train` runs it. Runs go
``--parallel`` at a time with ``--threads`` torch threads each, always a seed's presets together, so
the runs being compared share the machine (these machines are shared and noisy: a table of runs made
at different times would mostly measure the load).

Prints greedy held-out accuracy (500 test problems) at every evaluation for each preset and seed, the
mean gain over the SFT start at the last step, and wall time per run with its ratio to GRPO's, and
writes results.json. The presets set the papers' hyper-parameters (docs/training.md, Presets): GSPO
clip 3e-4 / 4e-4 on the sequence ratio, CISPO's clipped weight (no lower bound, upper 0.28), DAPO's
clip-higher, token-mean, dynamic sampling and soft overlong punishment; those three drop GRPO's KL
term (beta 0), as their papers do.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from benchmarks.jobs import run_jobs  # noqa: E402
from benchmarks.vs_trl import build_sft_model  # noqa: E402  (the quickstart's SFT warm start)


def stage_command(preset: str, model: Path, out: Path, seed: int, steps: int, threads: int,
                  eval_every: int) -> list[str]:
    import rlvr.configs

    config = Path(rlvr.configs.__file__).parent / "quickstart.yaml"
    return [sys.executable, "-m", "rlvr.cli", "train", str(config), f"model.path={model}", f"out={out}",
            f"algorithm.preset={preset}", f"train.seed={seed}", f"train.steps={steps}", f"train.threads={threads}",
            f"eval.every={eval_every}", "checkpoint.every=0", "log.progress=false", "log.plot_every=0", "--overwrite"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="grpo,gspo,cispo,dapo", help="algorithm presets to compare (first is "
                        "the reference of the wall-time ratios)")
    parser.add_argument("--seeds", default="0,1,2", help="seeds of the model, SFT start, data order and sampling")
    parser.add_argument("--steps", type=int, default=300, help="RL steps of each run")
    parser.add_argument("--eval-every", type=int, default=50, help="greedy accuracy on 500 test problems every N steps")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (a seed's presets run together)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each run")
    parser.add_argument("--out", default=None, help="folder for the models and runs (default: a temporary one)")
    args = parser.parse_args()
    presets, seeds = args.presets.split(","), [int(s) for s in args.seeds.split(",")]

    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="policy_losses-"))
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for seed in seeds:
        print(f"[seed {seed}] tiny model + SFT -> {root / f'seed{seed}'}", flush=True)
        model = build_sft_model(root / f"seed{seed}", seed=seed, layers=2, threads=args.threads)
        run_jobs([(f"{preset} seed {seed}",
                   stage_command(preset, model, root / f"seed{seed}" / preset, seed, args.steps, args.threads,
                                 args.eval_every),
                   root / f"seed{seed}" / f"{preset}.log") for preset in presets], args.parallel)
    print(f"all runs done in {time.perf_counter() - started:.0f} s\n")

    results: dict[str, dict[int, dict]] = {preset: {} for preset in presets}
    for preset in presets:
        for seed in seeds:
            summary = json.loads((root / f"seed{seed}" / preset / "summary.json").read_text())
            curve = {int(step): round(values["eval/accuracy"], 3) for step, values in summary["evaluations"].items()}
            results[preset][seed] = dict(before=summary["accuracy_before"], after=summary["accuracy_after"],
                                         wall_s=summary["wall_s"], curve=curve)

    steps = sorted({step for preset in presets for seed in seeds for step in results[preset][seed]["curve"]})
    print("greedy accuracy on 500 held-out problems, by step (seed: curve)")
    for preset in presets:
        for seed in seeds:
            curve = results[preset][seed]["curve"]
            print(f"  {preset:6s} seed {seed}: " + " ".join(f"{curve.get(s, float('nan')):.3f}" for s in steps))
    print("  steps:          " + " ".join(f"{s:5d}" for s in steps))
    reference = presets[0]
    print(f"\n| preset | gain at step {args.steps} per seed | mean gain | wall s per seed | wall / {reference} |")
    print("|---|---|---|---|---|")
    for preset in presets:
        rows = [results[preset][seed] for seed in seeds]
        gains = [r["after"] - r["before"] for r in rows]
        ratio = statistics.mean(r["wall_s"] / results[reference][seed]["wall_s"] for r, seed in zip(rows, seeds))
        gain_cells = " / ".join(f"{g:+.3f}" for g in gains)
        wall_cells = " / ".join(f"{r['wall_s']:.0f}" for r in rows)
        print(f"| {preset} | {gain_cells} | {statistics.mean(gains):+.3f} | {wall_cells} | {ratio:.2f} |")
    (root / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    print(f"\nresults: {root / 'results.json'}")


if __name__ == "__main__":
    main()
