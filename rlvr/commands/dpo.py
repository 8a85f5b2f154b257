"""``rlvr dpo``: offline direct preference optimisation on preference pairs."""

from __future__ import annotations

import argparse

from rlvr.commands import HelpFormatter
from rlvr.commands.run_args import add_run_arguments, load_run_config


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "dpo", formatter_class=HelpFormatter,
        help="offline DPO (or cDPO, IPO) of a policy on preference pairs (prompt, chosen, rejected)",
        description="Fine-tune a policy on preference pairs with direct preference optimisation: the loss pushes "
        "beta * (log pi/pi_ref of chosen - log pi/pi_ref of rejected) up; the reference is the starting model (with "
        "LoRA: the same network with its adapters off). `data.path` is a JSONL/Parquet file (e.g. from `rlvr "
        "preferences`) or a hub dataset; dpo.loss picks sigmoid (DPO, cDPO with dpo.label_smoothing) or ipo. With "
        "eval.task set, greedy gold accuracy on that suite is measured before and after. key=value pairs override the "
        "config. Writes config.yaml, metrics.jsonl, metrics.png, checkpoints/, final/, summary.json; Ctrl-C saves a "
        "checkpoint at the end of the step, and --resume continues from it.",
    )
    add_run_arguments(p, kind="dpo", example="rlvr/configs/arithmetic_dpo.yaml")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlvr.config import DPOConfig
    from rlvr.recipes import dpo

    config, resume = load_run_config(args, DPOConfig)
    summary = dpo.train(config, resume=resume, overwrite=args.overwrite)
    if "rank" in summary:  # a torchrun rank other than 0: rank 0 reports
        return 0
    before, after = summary.get("gold_accuracy_before"), summary.get("gold_accuracy_after")
    if before is not None and after is not None:
        print(f"greedy gold accuracy: {before:.3f} -> {after:.3f}")
    if summary.get("implicit_accuracy") is not None:
        print(f"held-out implicit accuracy: {summary['implicit_accuracy']:.3f}")
    print(f"model: {summary['model']}")
    return 0
