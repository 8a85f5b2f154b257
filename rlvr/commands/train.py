"""``rlvr train``: the RL recipes on any local model: critic-free (GRPO, Dr. GRPO, DAPO, RLOO, REINFORCE++)
or actor-critic (PPO, REINFORCE with a learned baseline), by ``algorithm.preset``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rlvr.commands import HelpFormatter


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "train", formatter_class=HelpFormatter,
        help="train a policy with GRPO / Dr. GRPO / DAPO / RLOO / REINFORCE++ / PPO / REINFORCE with a baseline",
        description="Train a policy with an RL recipe: algorithm.preset picks it (grpo, dr_grpo, dapo, rloo, reinforce_pp "
        "without a critic; ppo, reinforce_baseline with a learned critic, set in `critic:`). CONFIG is a YAML file "
        "(examples in rlvr/configs/); "
        "key=value pairs override it (e.g. algorithm.preset=dapo train.steps=200 model.lora.r=8). Unknown keys, wrong "
        "types and impossible combinations are rejected with the valid choices. The run folder gets the resolved "
        "config, metrics.jsonl, metrics.png, checkpoints/, final/ and summary.json.",
    )
    p.add_argument("config", nargs="?", help="YAML config file (optional with --resume: the run's own config.yaml)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, applied after the file")
    p.add_argument("--out", default=None, help="run folder (overrides the config's `out`; without either: a new "
                   "runs/<preset>-<timestamp>)")
    p.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue a run from its latest checkpoint (weights, optimizer, scheduler, RNG, data position)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run already in the run folder (its config, metrics, checkpoints, final model); "
                   "without it such a folder is refused")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlvr.config import RunConfig, load_config

    config_path, overrides = args.config, list(args.overrides)
    if config_path is not None and "=" in config_path and not Path(config_path).exists():
        overrides.insert(0, config_path)  # `rlvr train --resume DIR key=value`: no file given
        config_path = None
    if args.resume is not None:
        config_path = config_path or str(Path(args.resume) / "config.yaml")
        overrides.append(f"out={args.resume}")
    elif config_path is None:
        print("rlvr train: give a CONFIG file (or --resume RUN_DIR)", file=sys.stderr)
        return 2
    if args.out is not None:
        overrides.append(f"out={args.out}")
    config = load_config(RunConfig, config_path, overrides)  # a ConfigError is printed by rlvr.cli

    from rlvr.recipes import train

    summary = train(config, resume=args.resume is not None, overwrite=args.overwrite)
    if os.environ.get("RANK", "0") != "0":  # a torchrun rank other than 0: rank 0 reports
        return 0
    before, after = summary.get("accuracy_before"), summary.get("accuracy_after")
    if before is not None and after is not None:
        print(f"eval accuracy: {before:.3f} -> {after:.3f}")
    print(f"run folder: {summary['run_folder']}")
    return 0
