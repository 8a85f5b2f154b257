"""``rlvr preferences``: preference pairs from a task suite with an exact verifier."""

from __future__ import annotations

import argparse

from rlvr.commands import HelpFormatter, check_sampling


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "preferences", formatter_class=HelpFormatter,
        help="make preference pairs: sample completions per prompt, verify them, pair a passing with a failing one",
        description="Sample --samples completions per problem of a task suite from a model (hf engine), score them with "
        "each problem's verifier, and write JSONL lines {id, prompt, chosen, rejected}: chosen passes the verifier, "
        "rejected fails it, both answer the same prompt; completions cut off at --max-new-tokens are left out. "
        "Problems whose samples all pass or all fail give no pair. "
        "The file is the input of `rlvr train-rm` and `rlvr dpo` (data.path).",
    )
    p.add_argument("--model", required=True, help="local Hugging Face model folder that samples the completions")
    p.add_argument("--task", required=True, help="task suite name (see `rlvr tasks list`)")
    p.add_argument("--out", required=True, help="JSONL file to write (missing folders are created; an existing file is "
                   "refused, checked before any work, unless --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file (when the new one is complete)")
    p.add_argument("--samples", type=int, default=8, help="completions sampled per problem (G)")
    p.add_argument("--pairs-per-prompt", type=int, default=1,
                   help="at most this many distinct (passing, failing) pairs per problem")
    p.add_argument("--limit", type=int, default=None, help="use only the first N problems")
    p.add_argument("--split", default="train", help="suite split")
    p.add_argument("--path", default=None, help="local data file/folder or hub dataset name for the suite")
    p.add_argument("--task-option", action="append", default=[], metavar="k=v",
                   help="suite option (repeatable), e.g. style=bare")
    p.add_argument("--seed", type=int, default=0, help="sampling and pairing seed")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--max-new-tokens", type=int, default=64, help="generation budget per completion")
    p.add_argument("--workers", type=int, default=None,
                   help="verifier worker processes (default: one per core, at most 4; 0 = in this process)")
    p.add_argument("--batch-prompts", type=int, default=64, help="prompts generated together")
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlvr.commands.eval import _key_values
    from rlvr.rollout.preferences import build_preferences
    from rlvr.verifiers.errors import InvalidValueError
    from rlvr.verifiers.cli import check_number, check_runner_flags
    from rlvr.verifiers.files import check_output_file

    if args.pairs_per_prompt < 1:
        raise InvalidValueError("--pairs-per-prompt must be at least 1")
    check_sampling(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    check_runner_flags(args.workers, None)
    for flag, value in (("--limit", args.limit), ("--batch-prompts", args.batch_prompts)):
        check_number(flag, value, 1)
    check_output_file(args.out, flag="--out", overwrite=args.overwrite)  # before any work
    stats = build_preferences(
        args.model, args.task, args.out, samples=args.samples, limit=args.limit, seed=args.seed,
        temperature=args.temperature, max_new_tokens=args.max_new_tokens, split=args.split, path=args.path,
        options=_key_values(args.task_option, "--task-option"), pairs_per_prompt=args.pairs_per_prompt,
        device=args.device, workers=args.workers, batch_prompts=args.batch_prompts,
    )
    print(f"{stats['problems']} problems x {stats['samples']} samples: {stats['sample_accuracy']:.3f} of the samples pass; "
          f"{stats['truncated']} were cut off at --max-new-tokens (left out); {stats['prompts_with_pair']} problems "
          f"gave a pair; wrote {stats['pairs']} pairs to {stats['out']}")
    if not stats["pairs"]:
        print("no pairs: every problem's samples all passed or all failed (try more --samples, another --temperature, "
              "or a model that is right part of the time)")
    return 0
