"""``rlvr tasks list`` and ``rlvr tasks show``: the suites, their sizes, and the prompts a model sees.

    rlvr tasks list
    rlvr tasks show gsm8k -n 2 --split test
    rlvr tasks show humaneval --model runs/quickstart/final      # rendered with the model's chat template
    rlvr tasks show custom --path my.jsonl --option prompt_field=question --option answer_field=answer

Loads nothing heavy unless ``--model`` is given (then only the tokenizer, through transformers).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rlvr.commands import HelpFormatter
from rlvr.verifiers.errors import InvalidValueError

RULE = "-" * 78


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "tasks", formatter_class=HelpFormatter,
        help="list task suites, or show the formatted prompts and references of one",
        description="Task suites: `rlvr tasks list` for every registered suite with its splits, sizes and default "
        "verifier; `rlvr tasks show NAME` for the fully formatted prompts a model will see, with their references.",
    )
    sub = p.add_subparsers(dest="tasks_command", metavar="SUBCMD", required=True)

    lp = sub.add_parser("list", formatter_class=HelpFormatter, help="every suite: name, size per split, default verifier",
                        description="Every registered suite (built-in and rlvr.tasks plugins) with the number of problems "
                        "in each split (default options) and its default verifier. Suites whose data is missing say why.")
    lp.add_argument("--no-sizes", action="store_true", help="do not load the suites to count their problems (instant)")
    lp.set_defaults(func=run_list)

    sp = sub.add_parser("show", formatter_class=HelpFormatter, help="the formatted prompts of a suite's first problems, with references",
                        description="Print the first N problems of a suite: the chat messages, the prompt text exactly "
                        "as the model reads it (with --model: through that tokenizer's chat template; without: the plain "
                        "join used for models without a template), the reference the verifier checks, and the gold solution.")
    sp.add_argument("name", help="suite name (see `rlvr tasks list`)")
    sp.add_argument("-n", type=int, default=3, help="how many problems to print (default 3)")
    sp.add_argument("--split", default=None, help="split to read (default: test where the suite has one, else its first)")
    sp.add_argument("--path", default=None, help="local data file/folder or Hugging Face dataset name for the suite")
    sp.add_argument("--model", default=None, help="model folder or hub name whose tokenizer renders the prompts")
    sp.add_argument("--chat-template", default="auto", metavar="auto|none|PATH",
                    help="render as a training run's data[i].chat_template does: auto (the tokenizer's chat template), "
                    "none (raw prompts), or a Jinja template file (needs --model)")
    sp.add_argument("--option", "--task-option", dest="option", action="append", default=[], metavar="k=v",
                    help="suite option (repeatable; values parsed as YAML), e.g. --option style=bare")
    sp.add_argument("--max-chars", type=int, default=3000,
                    help="truncate each printed reference/solution to this many characters (0 = no limit)")
    sp.add_argument("--json", action="store_true", help="print one JSON object per problem instead of text")
    sp.set_defaults(func=run_show)


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """``["n=5", "ops=+-"]`` -> ``{"n": 5, "ops": "+-"}`` (values read as YAML scalars/lists/maps)."""
    import yaml

    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidValueError(f"--option {pair!r} is not of the form key=value")
        parsed = yaml.safe_load(value) if value.strip() else ""
        options[key.strip()] = value if parsed is None else parsed
    return options


# --------------------------------------------------------------------------- list

def _sizes(factory) -> str:
    """``"train 7,473, test 1,319"``, or why the suite cannot be counted with default options."""
    splits = getattr(factory, "splits", None)
    if splits == ():
        return "any split of your data (needs --path and a column mapping)"
    parts = []
    for split in splits or ("train", "test"):
        try:
            parts.append(f"{split} {len(factory(path=None, split=split)):,}")
        except Exception as exc:  # the reason goes into the table, not a traceback
            reason = str(exc).split(";")[0].split("\n")[0]  # the first clause, whole
            if "dataset=" in reason:
                reason = "needs --option dataset=NAME"
            if not parts and (splits is None or isinstance(exc, (ImportError, FileNotFoundError)) or "dataset=" in reason):
                return f"{', '.join(splits or ())}: {reason}"  # the same reason for every split
            parts.append(f"{split} ({reason})")
    return ", ".join(parts)


def run_list(args: argparse.Namespace) -> int:
    from rlvr.tasks import TASKS, list_tasks
    from rlvr.tasks.registry import task_factory

    rows, broken = [], []
    for name in list_tasks():
        ok, reason = TASKS.status(name)
        if not ok:
            rows.append((name, "-", "BROKEN: the plugin does not load (reason below)"))
            broken.append((name, reason))
            continue
        factory = task_factory(name)
        verifier = getattr(factory, "default_verifier", "?") if name != "custom" else "(option)"
        if args.no_sizes:
            sizes = ", ".join(getattr(factory, "splits", None) or ()) or "any"
        else:
            sizes = _sizes(factory)
        rows.append((name, verifier, sizes))
    width = max(len(r[0]) for r in rows) + 2
    vwidth = max(len(r[1]) for r in rows) + 2
    print(f"{'suite':<{width}}{'verifier':<{vwidth}}{'splits' if args.no_sizes else 'problems per split'}")
    for name, verifier, sizes in rows:
        print(f"{name:<{width}}{verifier:<{vwidth}}{sizes}")
    print_broken(broken)
    from rlvr.tasks.environments import list_environments

    print(f"\nenvironments (multi-turn episodes, docs/environments.md): {', '.join(list_environments())}")
    return 0


def print_broken(broken: list[tuple[str, str]]) -> None:
    """The full reason of every plugin that failed to load, after the table."""
    if broken:
        print(f"\n{len(broken)} broken plugin(s); using them fails until fixed:")
        for name, reason in broken:
            print(f"  {name}: {reason}")


# --------------------------------------------------------------------------- show

def _clip(text: str, limit: int) -> str:
    if limit and len(text) > limit:
        return text[:limit] + f"\n... [{len(text) - limit:,} more characters; --max-chars 0 shows all]"
    return text


def run_show(args: argparse.Namespace) -> int:
    from rlvr.rollout.chat import render_prompt, resolve_chat_template
    from rlvr.tasks.registry import task_factory

    try:
        template = resolve_chat_template(args.chat_template, where="--chat-template")
        if template.mode == "file" and not args.model:
            raise ValueError("--chat-template: a template file renders with a tokenizer's special tokens; pass --model")
        factory = task_factory(args.name)
        split = args.split
        if split is None:
            splits = getattr(factory, "splits", None) or ("train",)
            split = "test" if "test" in splits else splits[0]
        from rlvr.tasks import get_task

        suite = get_task(args.name, path=args.path, split=split, **parse_options(args.option))
    except (KeyError, ValueError, TypeError, FileNotFoundError, ImportError) as exc:
        print(f"rlvr tasks show: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 2

    tokenizer = None
    if args.model:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model)
    how = (template.describe(tokenizer) if template.mode != "auto"
           else f"chat template of {args.model}" if tokenizer is not None and getattr(tokenizer, "chat_template", None)
           else f"plain join ({args.model} has no chat template)" if tokenizer is not None
           else "plain join; pass --model for a chat template")

    problems = []
    for problem in suite:
        if len(problems) >= args.n:
            break
        problems.append(problem)
    if not args.json:
        print(f"{args.name} [{split}]: {len(suite):,} problems, verifier {getattr(suite, 'default_verifier', '?')}"
              + (f", {suite.skipped} bad rows skipped" if getattr(suite, "skipped", 0) else ""))
    for problem in problems:
        text = render_prompt(tokenizer, problem.prompt, template)
        if args.json:
            print(json.dumps({"id": problem.id, "messages": problem.prompt, "text": text, "reference": problem.reference,
                              "verifier": problem.verifier, "solution": problem.solution,
                              "environment": problem.environment}, default=repr, ensure_ascii=False))
            continue
        environment = f"   environment: {problem.environment}" if problem.environment else ""
        print(f"\n{'=' * 78}\n{problem.id}   verifier: {problem.verifier}{environment}")
        if tokenizer is None:
            print(f"{RULE}\nmessages:")
            for message in problem.prompt:
                print(f"  [{message.get('role', '?')}] {json.dumps(message['content'], ensure_ascii=False)}")
        print(f"{RULE}\nprompt text ({how}):\n{text}")
        reference = json.dumps(problem.reference, indent=2, default=repr, ensure_ascii=False)
        print(f"{RULE}\nreference:\n{_clip(reference, args.max_chars)}")
        if isinstance(problem.solution, list):  # a gold multi-turn episode: the turns after the prompt
            print(f"{RULE}\nsolution (an episode; the environment's turns are masked from the loss):")
            for message in problem.solution:
                print(f"  [{message.get('role', '?')}] {_clip(json.dumps(message['content'], ensure_ascii=False), args.max_chars)}")
        elif problem.solution is not None:
            print(f"{RULE}\nsolution:\n{_clip(problem.solution, args.max_chars)}")
    return 0
