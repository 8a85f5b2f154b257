"""The ``rlvr`` command line.

Each command lives beside the code it runs, in a module exposing ``add_parser(subparsers)`` that
registers its sub-parser and sets ``func``. This module only assembles them, and imports nothing
heavy: torch and transformers load inside the commands that need them, so ``rlvr --help`` and
``rlvr verify`` stay fast.
"""

from __future__ import annotations

import argparse
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
    "rlvr.commands.dpo",
    "rlvr.commands.eval",
    "rlvr.commands.tasks",
    "rlvr.verifiers.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlvr",
        description="Reinforcement learning from verifiable rewards. Run `rlvr CMD --help` for a command's options.",
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error (also: RLVR_DEBUG=1); without it, a mistake in a "
                        "config, a file, a name or an option is reported as one line that says what to fix")
    subparsers = parser.add_subparsers(dest="command", metavar="CMD", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    from rlvr.verifiers.errors import UserError

    parser = build_parser()
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get("RLVR_DEBUG", "") not in ("", "0")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except UserError as exc:
        if debug:
            raise
        print(f"rlvr {args.command}: {exc}", file=sys.stderr)
        print("(rlvr --debug ... shows the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
