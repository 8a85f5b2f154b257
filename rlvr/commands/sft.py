"""``rlvr sft``: supervised fine-tuning on gold completions."""

from __future__ import annotations

import argparse
import sys

from rlvr.commands import HelpFormatter


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "sft", formatter_class=HelpFormatter,
        help="supervised fine-tuning on gold completions (loss on completion tokens only)",
        description="Fine-tune on a task suite's gold solutions (data.task) or a JSONL file of prompt/completion pairs "
        "(data.task: null, data.path: FILE). key=value pairs override the config. Optional early stop when held-out "
        "greedy accuracy reaches eval.stop_at_accuracy. Writes config.yaml, metrics.jsonl, metrics.png, final/, summary.json.",
    )
    p.add_argument("config", help="YAML config file")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, applied after the file")
    p.add_argument("--out", default=None, help="run folder (overrides the config's `out`)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlvr.config import ConfigError, SFTConfig, load_config

    overrides = list(args.overrides) + ([f"out={args.out}"] if args.out else [])
    try:
        config = load_config(SFTConfig, args.config, overrides)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    from rlvr import sft

    summary = sft.train(config)
    print(f"SFT done after {summary['steps']} steps; model: {summary['model']}")
    return 0
