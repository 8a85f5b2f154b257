"""``rlvr train-prm``: a process reward model on step-labelled completions."""

from __future__ import annotations

import argparse

from rlvr.commands import HelpFormatter
from rlvr.commands.run_args import add_run_arguments, load_run_config


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "train-prm", formatter_class=HelpFormatter,
        help="train a process reward model on step-labelled completions (prompt, completions, labels)",
        description="Train a process reward model: p(step is good | prompt, steps so far), read at the last token of "
        "each step. `data.path` is a JSONL file in TRL's stepwise-supervision format, one "
        '{"prompt": ..., "completions": [step, ...], "labels": [true|false, ...]} a line (Math-Shepherd and PRM800K '
        "convert to it; rlvr.tasks.chain_arithmetic.write_prm_data writes one from labelled samples); the steps joined "
        "by `data.separator` are the completion. `model.path` is a causal LM (a new 2-label head goes on it) or a "
        "token-classification folder with 1 or 2 labels. Held-out step accuracy is measured at start, every "
        "eval.every steps and at the end. key=value pairs override the config. Writes config.yaml, metrics.jsonl, "
        "metrics.png, checkpoints/, final/ (loadable with AutoModelForTokenClassification or "
        "rlvr.modeling.prm.ProcessRewardModel), summary.json; Ctrl-C saves a checkpoint at the end of the step, and "
        "--resume continues from it.",
    )
    add_run_arguments(p, kind="prm", example="rlvr/configs/chain_prm.yaml")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlvr.config import PRMConfig
    from rlvr.recipes import train_prm

    config, resume = load_run_config(args, PRMConfig)
    summary = train_prm.train(config, resume=resume, overwrite=args.overwrite)
    if "rank" in summary:  # a torchrun rank other than 0: rank 0 reports
        return 0
    accuracy = summary["step_accuracy"]
    if accuracy is not None:
        print(f"held-out step accuracy: {summary['step_accuracy_before']:.3f} -> {accuracy:.3f} "
              f"({summary['eval_steps']} steps; always guessing the majority label: "
              f"{summary['majority_accuracy']:.3f})")
    print(f"process reward model: {summary['model']}")
    return 0
