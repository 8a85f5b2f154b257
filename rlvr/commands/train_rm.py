"""``rlvr train-rm``: a Bradley-Terry reward model on preference pairs."""

from __future__ import annotations

import argparse

from rlvr.commands import HelpFormatter


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "train-rm", formatter_class=HelpFormatter,
        help="train a Bradley-Terry reward model on preference pairs (prompt, chosen, rejected)",
        description="Train a reward model r(x, y) so that sigmoid(r(x, chosen) - r(x, rejected)) is high: `data.path` is "
        "a JSONL/Parquet file (e.g. from `rlvr preferences`) or a hub dataset; `head` is score (a linear head on the "
        "last token, loadable with AutoModelForSequenceClassification) or logprob (the causal LM's own sequence "
        "log-probability). Held-out pairwise accuracy is measured at start, every eval.every steps and at the end. "
        "key=value pairs override the config. Writes config.yaml, metrics.jsonl, metrics.png, checkpoints/, final/, "
        "summary.json.",
    )
    p.add_argument("config", help="YAML config file (e.g. rlvr/configs/arithmetic_rm.yaml)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, applied after the file")
    p.add_argument("--out", default=None, help="run folder (overrides the config's `out`; without either: a new "
                   "runs/rm-<timestamp>)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run already in the run folder; without it such a folder is refused")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in the run folder from its latest checkpoint")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlvr.config import load_config
    from rlvr.offline_configs import RewardModelConfig

    overrides = list(args.overrides) + ([f"out={args.out}"] if args.out else [])
    config = load_config(RewardModelConfig, args.config, overrides)  # a ConfigError is printed by rlvr.cli
    from rlvr import reward_model

    summary = reward_model.train(config, overwrite=args.overwrite, resume=args.resume)
    if "rank" in summary:  # a torchrun rank other than 0: rank 0 reports
        return 0
    accuracy = summary["pairwise_accuracy"]
    if accuracy is not None:
        print(f"held-out pairwise accuracy: {summary['pairwise_accuracy_before']:.3f} -> {accuracy:.3f} "
              f"({summary['eval_pairs']} pairs)")
    print(f"reward model: {summary['model']}")
    return 0
