"""``rlvr train``: the RL recipes on any local model: critic-free (GRPO, Dr. GRPO, DAPO, RLOO, REINFORCE++)
or actor-critic (PPO, REINFORCE with a learned baseline), by ``algorithm.preset``."""

from __future__ import annotations

import argparse
import os

from rlvr.commands import HelpFormatter
from rlvr.commands.run_args import add_run_arguments, load_run_config


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "train", formatter_class=HelpFormatter,
        help="train a policy with GRPO / Dr. GRPO / DAPO / RLOO / REINFORCE++ / PPO / REINFORCE with a baseline",
        description="Train a policy with an RL recipe: algorithm.preset picks it (grpo, dr_grpo, dapo, rloo, reinforce_pp "
        "without a critic; ppo, reinforce_baseline with a learned critic, set in `critic:`). CONFIG is a YAML file "
        "(examples in rlvr/configs/); "
        "key=value pairs override it (e.g. algorithm.preset=dapo train.steps=200 model.lora.r=8). Unknown keys, wrong "
        "types and impossible combinations are rejected with the valid choices. The run folder gets the resolved "
        "config, metrics.jsonl, metrics.png, checkpoints/, final/ and summary.json. Ctrl-C (or SIGTERM) saves a checkpoint "
        "at the end of the step in progress and prints the command that resumes the run (Ctrl-C twice aborts at once).",
    )
    add_run_arguments(p, kind="<preset>", example="rlvr/configs/quickstart.yaml")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlvr.config import RunConfig
    from rlvr.recipes import train

    config, resume = load_run_config(args, RunConfig)
    summary = train(config, resume=resume, overwrite=args.overwrite)
    if os.environ.get("RANK", "0") != "0":  # a torchrun rank other than 0: rank 0 reports
        return 0
    before, after = summary.get("accuracy_before"), summary.get("accuracy_after")
    if before is not None and after is not None:
        print(f"eval accuracy: {before:.3f} -> {after:.3f}")
    print(f"run folder: {summary['run_folder']}")
    return 0
