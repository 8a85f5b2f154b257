"""``rlvr quickstart``."""

from __future__ import annotations

import argparse

from rlvr.commands import HelpFormatter
from rlvr.configs import load_packaged


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "quickstart", formatter_class=HelpFormatter,
        help="build a tiny model, SFT-bootstrap it, train it with GRPO, print accuracy before -> after",
        description="The embedded default run (4-8 minutes on an idle 2-core CPU): builds a tiny character-level "
        "model, SFT-bootstraps it on 3-digit addition, trains it with GRPO against the `numeric` verifier, and "
        "prints greedy accuracy on 500 held-out problems before and after. Writes a run folder with the resolved "
        "config, metrics.jsonl, plots, checkpoints and summary.json.",
    )
    p.add_argument("--out", default=None, help="run folder (default: runs/quickstart-<timestamp>)")
    p.add_argument("--seed", type=int, default=0, help="seed for the model, data order and sampling")
    p.add_argument("--algorithm", choices=["grpo", "ppo"], default="grpo",
                   help="the RL stage: grpo (group baselines, rlvr/configs/quickstart.yaml) or ppo (a learned critic, "
                   "rlvr/configs/quickstart_ppo.yaml)")
    p.add_argument("--reward-model", action="store_true",
                   help="RLHF with a learned reward: after SFT, preference pairs from the SFT model's samples, a reward "
                   "model on them (arithmetic_rm.yaml), then RL against it (arithmetic_grpo_rm.yaml, or "
                   "arithmetic_ppo_rm.yaml with --algorithm ppo); the exact verifier only watches (gold accuracy)")
    p.add_argument("--steps", type=int, default=None, help=f"RL steps (default: the packaged config's {load_packaged('quickstart.yaml')['train']['steps']})")
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress reports at all (without a terminal they are plain lines every few steps anyway)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier quickstart in --out (else refused)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="overrides of the RL stage's config, e.g. train.prompts_per_step=16")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlvr.quickstart import quickstart

    quickstart(args.out, seed=args.seed, steps=args.steps, device=args.device, progress=not args.no_progress,
               overrides=args.overrides, overwrite=args.overwrite, algorithm=args.algorithm,
               reward_model=args.reward_model)
    return 0
