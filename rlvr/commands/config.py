"""``rlvr config show``: every config key of a recipe, with its type, default and description.

    rlvr config show                        # every key of `rlvr train` (RunConfig)
    rlvr config show generation             # one section
    rlvr config show train.steps            # one key
    rlvr config show --recipe sft optim     # another recipe's config class
    rlvr config show --json                 # one JSON object per key

The descriptions are the pydantic field descriptions of ``rlvr/config/``; the defaults are the effective
ones (an RL preset's algorithm values, a recipe's own optimizer defaults). Imports no torch.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import shutil
import textwrap
from typing import Any

from rlvr.commands import HelpFormatter
from rlvr.verifiers.errors import InvalidValueError

#: The recipe commands and the config class each loads (``module:Class``, imported when asked for).
RECIPES = {
    "train": "rlvr.config.run:RunConfig",
    "sft": "rlvr.config.offline:SFTConfig",
    "dpo": "rlvr.config.offline:DPOConfig",
    "train-rm": "rlvr.config.offline:RewardModelConfig",
    "train-prm": "rlvr.config.offline:PRMConfig",
}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "config", formatter_class=HelpFormatter,
        help="show every config key of a recipe: dotted name, type, default, description",
        description="Config discovery: `rlvr config show [KEY] [--recipe NAME]` prints every key a recipe's YAML config "
        "(or a key=value override) can set, with its type, its default and what it does.",
    )
    sub = p.add_subparsers(dest="config_command", metavar="SUBCMD", required=True)
    sp = sub.add_parser(
        "show", formatter_class=HelpFormatter, help="every key of a recipe's config, or of one section or key",
        description="Print every key of a recipe's config as a dotted name (what a key=value override spells; "
        f"entries of a list are {'N'}: data.N.task is data.0.task for the first), its type, its default and its "
        "description. KEY narrows it to a section (generation) or a key (train.steps).")
    sp.add_argument("key", nargs="?", default=None, metavar="KEY",
                    help="a section (e.g. generation) or a key (e.g. train.steps); default: every key")
    sp.add_argument("--recipe", choices=list(RECIPES), default="train",
                    help="the command whose config to show")
    sp.add_argument("--json", action="store_true", help="print one JSON object per key instead of text")
    sp.set_defaults(func=run_show)


def run_show(args: argparse.Namespace) -> int:
    from rlvr.config.keys import config_keys
    from rlvr.verifiers.plugins import import_target

    keys = config_keys(import_target(RECIPES[args.recipe]))
    if args.key is not None:
        keys = select(keys, args.key, args.recipe)
    if args.json:
        for key in keys:
            print(json.dumps({"key": key.path, "type": key.type, "default": None if key.section else key.default,
                              "description": key.description, "section": key.section}, default=str))
        return 0
    width = min(shutil.get_terminal_size((100, 20)).columns, 110)
    if args.key is None:
        print(f"# every key of `rlvr {args.recipe}`'s config: set it in the YAML file (nested) or as key=value")
    for key in keys:
        print(render(key, width))
    return 0


def select(keys: list, wanted: str, recipe: str) -> list:
    """The keys at or under ``wanted`` (list indices may be written as numbers: data.0.task); an unknown
    one is a one-line error naming the closest keys."""
    normal = re.sub(r"\.\d+(?=\.|$)", ".N", wanted.strip("."))
    chosen = [k for k in keys if k.path == normal or k.path.startswith(normal + ".")]
    if chosen:
        return chosen
    paths = [k.path for k in keys]
    close = difflib.get_close_matches(normal, paths, n=3, cutoff=0.6)
    leaf = normal.rsplit(".", 1)[-1]
    close += [p for p in paths if p.rsplit(".", 1)[-1] == leaf and p not in close][:3]
    top = sorted({p.split(".")[0] for p in paths})
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise InvalidValueError(f"rlvr {recipe}'s config has no key {wanted!r}; {hint}top-level keys: {', '.join(top)}")


def render(key, width: int = 100) -> str:
    """A key as two or more lines: ``path = default  (type)``, then its description, indented."""
    if key.section:
        kind = "list of sections" if key.type.startswith("list") else "section"
        head = f"{key.path}  ({kind}{', default null: unset' if key.default is None else ''})"
    else:
        preset = "; default set by algorithm.preset" if key.preset else ""
        head = f"{key.path} = {format_value(key.default)}  ({key.type}{preset})"
    lines = [head]
    if key.description:
        lines += textwrap.wrap(key.description, width=max(width - 4, 40), initial_indent="    ",
                               subsequent_indent="    ")
    return "\n".join(lines)


def format_value(value: Any) -> str:
    """A default as it is written in YAML: null, true, '' for the empty string, JSON for lists and maps."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else "''"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=str)
    try:
        from pydantic_core import PydanticUndefined

        if value is PydanticUndefined:
            return "(required)"
    except ImportError:  # pragma: no cover
        pass
    return str(value)
