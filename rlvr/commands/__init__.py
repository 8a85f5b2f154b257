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


def check_sampling(*, max_new_tokens: int, temperature: float, top_p: float = 1.0, greedy: bool | None = None) -> None:
    """The sampling flags of a command, checked before any model is loaded; the messages name the
    flags (the engine's own checks name the Python API's fields). ``greedy`` None: the command has
    no ``--greedy``."""
    from rlvr.verifiers.cli import check_number
    from rlvr.verifiers.errors import InvalidValueError

    check_number("--max-new-tokens", max_new_tokens, 1)
    if not 0 < top_p <= 1:
        raise InvalidValueError(f"--top-p must lie in (0, 1], got {top_p:g}")
    if not greedy and not temperature > 0:
        hint = "; for greedy decoding use --greedy" if greedy is not None else ""
        raise InvalidValueError(f"--temperature must be > 0{' when sampling' if hint else ''}, got {temperature:g}{hint}")
