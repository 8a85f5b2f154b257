"""Errors a user can fix: the command line prints their message as one line, without a traceback.

They live in the lowest package that raises them (verifiers, and tasks above it, raise them for
unknown names, bad options and broken data), so every package can share them without importing
against the direction of ``sandbox <- verifiers <- tasks <- rlvr``.

A message names what is wrong (the file and line, the config field, the option) and the fix, e.g.
``data.0.task: unknown task 'gsm9k'; valid tasks: arithmetic, countdown, gsm8k, ...``.
``rlvr --debug CMD`` (or ``RLVR_DEBUG=1``) shows the traceback as well.
"""

from __future__ import annotations


class UserError(Exception):
    """Something the user can fix (a name, a file, an option, a folder); the message says what and how."""


class UnknownNameError(UserError, KeyError):
    """A name no registry knows; the message lists the valid ones. (A ``KeyError`` too, for callers
    that look names up like dictionary keys.)"""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0]) if self.args else ""


class OptionError(UserError, TypeError, ValueError):
    """An option a plugin does not take (the message lists the ones it does), or a value its
    constructor rejected. A ``TypeError`` and a ``ValueError`` too, as Python would raise either."""


class PluginLoadError(UserError, ImportError):
    """A plugin (or an optional built-in) whose module failed to import; says which and how to fix it."""


class InvalidValueError(UserError, ValueError):
    """A value the user gave (an option, a field, a line of a data file) that cannot be used."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder the user named that does not exist (the message says where it looked)."""


def invalid_text(value: str) -> str | None:
    """Why ``value`` cannot be used as text, or None when it can.

    JSON can spell a lone surrogate (``"\\ud800"``), and a file read with ``errors="surrogateescape"``
    turns bytes that are not UTF-8 into them; a tokenizer or a JSON writer later fails on such text
    with no hint of where it came from, so readers check it where they still know the file and line.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"is not valid Unicode: character {exc.start} is {value[exc.start]!r} (a lone surrogate, or a byte "
                "that is not UTF-8)")
    return None
