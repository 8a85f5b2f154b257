"""``rlvr train-rm``: a Bradley-Terry reward model on preference pairs."""

from __future__ import annotations

import argparse

from rlvr.commands import HelpFormatter
from rlvr.commands.run_args import add_run_arguments, load_run_config


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "train-rm", formatter_class=HelpFormatter,
        help="train a Bradley-Terry reward model on preference pairs (prompt, chosen, rejected)",
        description="Train a reward model r(x, y) so that sigmoid(r(x, chosen) - r(x, rejected)) is high: `data.path` is "
        "a JSONL/Parquet file (e.g. from `rlvr preferences`) or a hub dataset; `head` is score (a linear head on the "
        "last token, loadable with AutoModelForSequenceClassification) or logprob (the causal LM's own sequence "
        "log-probability). Held-out pairwise accuracy is measured at start, every eval.every steps and at the end. "
        "key=value pairs override the config. Writes config.yaml, metrics.jsonl, metrics.png, checkpoints/, final/, "
        "summary.json; Ctrl-C saves a checkpoint at the end of the step, and --resume continues from it.",
    )
    add_run_arguments(p, kind="rm", example="rlvr/configs/arithmetic_rm.yaml")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlvr.config import RewardModelConfig
    from rlvr.recipes import train_rm

    config, resume = load_run_config(args, RewardModelConfig)
    summary = train_rm.train(config, resume=resume, overwrite=args.overwrite)
    if "rank" in summary:  # a torchrun rank other than 0: rank 0 reports
        return 0
    accuracy = summary["pairwise_accuracy"]
    if accuracy is not None:
        print(f"held-out pairwise accuracy: {summary['pairwise_accuracy_before']:.3f} -> {accuracy:.3f} "
              f"({summary['eval_pairs']} pairs)")
    print(f"reward model: {summary['model']}")
    return 0
