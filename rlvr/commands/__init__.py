"""One module per command group of the ``rlvr`` command line (see ``rlvr/cli.py``)."""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help when it has a default worth saying.

    Unlike ``argparse.ArgumentDefaultsHelpFormatter`` it stays quiet for ``None``, ``False`` and
    empty lists (they mean "not given", which the help text explains), and for help that already
    names its default.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        default = action.default
        unsaid = default is None or default is False or default == [] or default == argparse.SUPPRESS
        if "default" in help_text or unsaid:
            return help_text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return f"{help_text} (default: %(default)s)"
        return help_text
