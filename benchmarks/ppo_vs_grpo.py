"""PPO (learned critic) against GRPO (group baseline) on the quickstart task, side by side.

    python benchmarks/ppo_vs_grpo.py [--steps 600] [--seed 0] [--out DIR] [--threads 1]

Builds the quickstart's tiny model and SFT model once, then runs the RL stage twice from that same
SFT model *at the same time*, one process per recipe with the same number of torch threads, so
both see the same machine (these machines are shared and noisy: runs made one after another are
not comparable). Both use their packaged quickstart configs (rlvr/configs/quickstart.yaml and
quickstart_ppo.yaml): 32 prompts x 8 samples per step, the same samples per step. GRPO runs without
the quickstart's solution guidance (``algorithm.guidance=none``), so that both learn from their own
samples only.

Prints greedy held-out accuracy before -> after, the evaluation curve, wall time and seconds per
step for each, and the PPO / GRPO ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from benchmarks.vs_trl import build_sft_model  # noqa: E402  (the quickstart's SFT warm start)

RECIPES = {"grpo": "quickstart.yaml", "ppo": "quickstart_ppo.yaml"}


def stage_command(recipe: str, model: Path, out: Path, seed: int, steps: int, threads: int) -> list[str]:
    import rlvr.configs

    config = Path(rlvr.configs.__file__).parent / RECIPES[recipe]
    return [sys.executable, "-m", "rlvr.cli", "train", str(config), f"model.path={model}",
            f"out={out}", f"train.seed={seed}", f"train.steps={steps}", f"train.threads={threads}",
            "log.progress=false", *(["algorithm.guidance=none"] if recipe == "grpo" else []), "--overwrite"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600, help="RL steps of each recipe (the PPO quickstart's 600)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each of the two runs")
    parser.add_argument("--out", default=None, help="folder for the models and both runs (default: a temporary one)")
    args = parser.parse_args()

    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ppo_vs_grpo-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"[1/2] tiny model + SFT -> {root}", flush=True)
    model = build_sft_model(root, seed=args.seed, layers=2, threads=args.threads)

    print(f"[2/2] GRPO and PPO side by side, {args.steps} steps each, {args.threads} thread(s) each", flush=True)
    started = time.perf_counter()
    runs = {name: subprocess.Popen(stage_command(name, model, root / name, args.seed, args.steps, args.threads),
                                   stdout=subprocess.DEVNULL, stderr=open(root / f"{name}.log", "w"))
            for name in RECIPES}
    for name, process in runs.items():
        if process.wait() != 0:
            sys.exit(f"{name} failed: see {root / (name + '.log')}")
    print(f"both done in {time.perf_counter() - started:.0f} s\n")

    results = {}
    for name in RECIPES:
        summary = json.loads((root / name / "summary.json").read_text())
        curve = {int(step): round(values["eval/accuracy"], 3) for step, values in summary["evaluations"].items()}
        results[name] = dict(before=summary["accuracy_before"], after=summary["accuracy_after"], wall_s=summary["wall_s"],
                             s_per_step=summary["wall_s"] / summary["steps"], curve=curve,
                             alarms=len(summary["alarms"]))
        r = results[name]
        print(f"{name:5s} accuracy {r['before']:.3f} -> {r['after']:.3f} ({r['after'] - r['before']:+.3f})  "
              f"wall {r['wall_s']:.0f} s ({r['s_per_step']:.3f} s/step)  alarms {r['alarms']}")
        print(f"      eval curve {curve}")
    g, p = results["grpo"], results["ppo"]
    print(f"\nPPO / GRPO: wall time x{p['wall_s'] / g['wall_s']:.2f}, accuracy gain "
          f"{p['after'] - p['before']:+.3f} vs {g['after'] - g['before']:+.3f}")
    (root / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
