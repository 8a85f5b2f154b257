"""``rlvr sft``: supervised fine-tuning on gold completions."""

from __future__ import annotations

import argparse

from rlvr.commands import HelpFormatter
from rlvr.commands.run_args import add_run_arguments, load_run_config


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "sft", formatter_class=HelpFormatter,
        help="supervised fine-tuning on gold completions (loss on completion tokens only)",
        description="Fine-tune on gold completions: `data` is a list of sources, like `rlvr train`'s (one mapping is "
        "accepted too), each a task suite with solutions (task: NAME) or a JSONL file of {prompt, completion} or "
        "{messages} lines (task: null, path: FILE); their examples are pooled. key=value pairs override the config "
        "(data.0.path=FILE). Optional early stop when held-out "
        "greedy accuracy reaches eval.stop_at_accuracy; the final model is measured too. Writes config.yaml, "
        "metrics.jsonl, metrics.png, checkpoints/, final/, summary.json; Ctrl-C saves a checkpoint at the end of the "
        "step, and --resume continues from it.",
    )
    add_run_arguments(p, kind="sft", example="rlvr/configs/quickstart_sft.yaml")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlvr.config import SFTConfig
    from rlvr.recipes import sft

    config, resume = load_run_config(args, SFTConfig)
    summary = sft.train(config, resume=resume, overwrite=args.overwrite)
    if "rank" in summary:  # a torchrun rank other than 0: rank 0 reports
        return 0
    accuracy = summary["eval_accuracy"]
    print(f"SFT done after {summary['steps']} steps" + (f"; held-out greedy accuracy {accuracy:.3f}"
                                                         if accuracy is not None else "") + f"; model: {summary['model']}")
    return 0
