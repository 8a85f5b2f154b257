"""The ``rlvr`` command line.

Each command lives beside the code it runs, in a module exposing ``add_parser(subparsers)`` that
registers its sub-parser and sets ``func``. This module only assembles them, and imports nothing
heavy: torch and transformers load inside the commands that need them, so ``rlvr --help`` and
``rlvr verify`` stay fast.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

# (module, its commands) in the order ``rlvr --help`` lists them.
COMMAND_MODULES = [
    "rlvr.commands.quickstart",
    "rlvr.commands.train",
    "rlvr.commands.sft",
    "rlvr.commands.preferences",
    "rlvr.commands.train_rm",
    "rlvr.commands.train_prm",
    "rlvr.commands.dpo",
    "rlvr.commands.eval",
    "rlvr.commands.tasks",
    "rlvr.commands.config",
    "rlvr.verifiers.cli",
]


DEBUG_HELP = ("show the full traceback of an error (also: RLVR_DEBUG=1); without it, a mistake in a config, a file, "
              "a name or an option is reported as one line that says what to fix")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlvr",
        description="Reinforcement learning from verifiable rewards. Run `rlvr CMD --help` for a command's options.",
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    subparsers = parser.add_subparsers(dest="command", metavar="CMD", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).add_parser(subparsers)
    for command in subparsers.choices.values():  # `rlvr CMD ... --debug` works too (SUPPRESS: keeps `rlvr --debug CMD`)
        for sub in _leaf_parsers(command):
            sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return parser


def _leaf_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser``, or the parsers of its own sub-commands (``rlvr verifiers list``, ``rlvr tasks show``)."""
    nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [leaf for a in nested for sub in a.choices.values() for leaf in _leaf_parsers(sub)] if nested else [parser]


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse with ``key=value`` overrides allowed anywhere (``rlvr train CFG --out DIR k=v``): argparse stops
    filling a positional list at the first flag, so what it leaves over joins ``overrides``. Anything else
    left over is a usage error shown with the sub-command's own usage."""
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    overrides = [x for x in extra if "=" in x and not x.startswith("-")]
    if hasattr(args, "overrides") and len(overrides) == len(extra):
        args.overrides = list(args.overrides or []) + overrides
        return args
    command = _command_parser(parser, args)
    command.error(f"unrecognized arguments: {' '.join(extra)}")
    raise AssertionError("unreachable")  # argparse's error() exits


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub-)command's own parser, for its usage line."""
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not actions or getattr(args, actions[0].dest, None) is None:
        return parser
    return _command_parser(actions[0].choices[getattr(args, actions[0].dest)], args)


def main(argv: list[str] | None = None) -> int:
    from rlvr.verifiers.errors import UserError

    parser = build_parser()
    args = parse(parser, argv)
    debug = args.debug or os.environ.get("RLVR_DEBUG", "") not in ("", "0")
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()
        return code
    except BrokenPipeError:  # the reader stopped reading (`rlvr tasks show gsm8k | head -1`): not an error
        with contextlib.suppress(OSError, ValueError, AttributeError):  # no more writes to the closed pipe,
            devnull = os.open(os.devnull, os.O_WRONLY)               # not even Python's flush at exit
            os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as exc:  # a training run's says where its checkpoint is and how to resume
        if _reports():
            print(f"rlvr {args.command}: {exc}" if str(exc) else "interrupted", file=sys.stderr)
        return 130
    except UserError as exc:
        if debug:
            raise
        if _reports():
            print(f"rlvr {args.command}: {exc}", file=sys.stderr)
            print("(rlvr --debug ... shows the traceback)", file=sys.stderr)
        return 2


def _reports() -> bool:
    """Whether this process prints a user error: under torchrun every rank meets the same one (a config, a
    folder, a model path), and rank 0 alone says it; the others only exit with its status."""
    return os.environ.get("RANK", "0") == "0"


if __name__ == "__main__":
    sys.exit(main())
