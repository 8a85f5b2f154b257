"""``rlvr sft``: supervised fine-tuning on gold completions."""

from __future__ import annotations

import argparse

from rlvr.commands import HelpFormatter


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "sft", formatter_class=HelpFormatter,
        help="supervised fine-tuning on gold completions (loss on completion tokens only)",
        description="Fine-tune on gold completions: `data` is a list of sources, like `rlvr train`'s (one mapping is "
        "accepted too), each a task suite with solutions (task: NAME) or a JSONL file of {prompt, completion} or "
        "{messages} lines (task: null, path: FILE); their examples are pooled. key=value pairs override the config "
        "(data.0.path=FILE). Optional early stop when held-out "
        "greedy accuracy reaches eval.stop_at_accuracy. Writes config.yaml, metrics.jsonl, metrics.png, final/, summary.json.",
    )
    p.add_argument("config", help="YAML config file")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, applied after the file")
    p.add_argument("--out", default=None, help="run folder (overrides the config's `out`; without either: a new "
                   "runs/sft-<timestamp>)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run already in the run folder; without it such a folder is refused")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlvr.config import load_config
    from rlvr.offline_configs import SFTConfig

    overrides = list(args.overrides) + ([f"out={args.out}"] if args.out else [])
    config = load_config(SFTConfig, args.config, overrides)  # a ConfigError is printed by rlvr.cli
    from rlvr import sft

    summary = sft.train(config, overwrite=args.overwrite)
    if "rank" in summary:  # a torchrun rank other than 0: rank 0 reports
        return 0
    print(f"SFT done after {summary['steps']} steps; model: {summary['model']}")
    return 0
