"""Tool calling for multi-turn episodes: describe tools, parse the model's calls, run them.

A multi-turn environment (:mod:`rlvr.tasks.environments`) lets the model call tools between its
turns and feeds each result back as an observation. The pieces here need no tokenizer:

* :func:`tool_schema`: the OpenAI-style JSON schema of a Python callable, from its type hints and
  Google-style docstring (transformers' ``get_json_schema`` convention), for the chat template.
* :func:`parse_tool_calls`: the calls in a completion, in one of :data:`CALL_FORMATS`: ``"json"``
  (Hermes/Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) or ``"code"`` (ToRL:
  each ```` ```python ```` block calls ``python``). Malformed calls come back with ``error`` set.
* :class:`PythonTool`: the built-in ``python`` tool, running programs in :mod:`rlvr.sandbox`.
* :func:`call_tool`: runs one call; every failure of the *model* (unknown tool, arguments of the
  wrong name or type, a raising tool, a tool past its deadline, a crashing program) becomes an
  observation. Only :class:`ToolSandboxError`, a failure of the sandbox itself, propagates: then the
  episode is broken, not the answer.
* :func:`run_with_deadlines` (from :mod:`rlvr.verifiers.threads`): runs calls in daemon threads and
  stops waiting for each at its deadline (the episode runner runs environment steps with it,
  :func:`call_tool` typed tools).

Example::

    tools = {"python": PythonTool(timeout_s=2.0)}
    schemas = [tool_schema(tool) for tool in tools.values()]       # for the chat template
    calls = parse_tool_calls("Let me check.\\n```python\\nprint(6 * 7)\\n```", "code")
    assert calls == [ToolCall("python", {"code": "print(6 * 7)"})]
    # call_tool(tools, calls[0]) -> ToolResult(content="42", failed=False, latency_s=0.01)
    assert call_tool(tools, ToolCall("add", {"a": 1})).content == "error: unknown tool 'add'; available: python"
"""

from __future__ import annotations

import inspect
import json
import math
import re
import time
import types
import typing
from dataclasses import dataclass
from itertools import takewhile
from typing import Any, Callable, Literal, Union

from rlvr.sandbox import IsolationError, Limits, execute
from rlvr.verifiers.threads import Outcome, run_with_deadlines

__all__ = ["CALL_FORMATS", "Outcome", "PythonTool", "ToolCall", "ToolResult", "ToolSandboxError", "call_tool",
           "check_arguments", "parse_tool_calls", "run_with_deadlines", "tool_schema"]

CALL_FORMATS = ("json", "code")

_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}
_ARG_LINE = re.compile(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")  # "name (type): text" or "name: text"
_SECTION = re.compile(r"^(Args|Arguments|Parameters):\s*$")
_FENCE_OPEN = re.compile(r"```([^`\n]*)\n")  # ```info-string, then a newline
_FENCE_CLOSE = re.compile(r"^[ \t]*```", re.MULTILINE)


# --- schemas ------------------------------------------------------------------------------------

def tool_schema(function: Callable) -> dict:
    """``{"type": "function", "function": {"name", "description", "parameters"}}`` of a tool.

    Args:
        function: a function, or an object with ``__call__`` (named by its ``name`` attribute, else
            its class name lower-cased). Each argument needs a type hint (int, float, str, bool,
            list[X], dict, Optional[X], Literal[...]) and a line in the docstring's ``Args:``; the
            docstring's first paragraph describes the tool. Arguments without defaults are required.

    Raises:
        ValueError: naming the tool, when a hint or a description is missing or a type unsupported.
    """
    if inspect.isfunction(function) or inspect.ismethod(function):
        name, target = function.__name__, function
    else:
        name, target = getattr(function, "name", None) or type(function).__name__.lower(), function.__call__
    doc = inspect.getdoc(target)
    if not doc:
        raise ValueError(f"tool {name!r} has no docstring; describe it and its arguments (Google style)")
    description, arg_docs = _parse_docstring(doc)
    hints = typing.get_type_hints(target)
    params = list(inspect.signature(target).parameters.values())
    properties = {param.name: _property(name, param, hints, arg_docs) for param in params}
    required = [param.name for param in params if param.default is param.empty]
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def _property(tool: str, param: inspect.Parameter, hints: dict, arg_docs: dict[str, str]) -> dict:
    """The JSON schema of one argument of ``tool``; ValueError when it cannot have one."""
    if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
        raise ValueError(f"tool {tool!r}: *{param.name} arguments are not supported")
    if param.name not in hints:
        raise ValueError(f"tool {tool!r}: argument {param.name!r} has no type hint")
    if param.name not in arg_docs:
        raise ValueError(f"tool {tool!r}: argument {param.name!r} is not described in the docstring's Args section")
    try:
        return {**_json_type(hints[param.name]), "description": arg_docs[param.name]}
    except TypeError as e:
        raise ValueError(f"tool {tool!r}: argument {param.name!r}: {e}") from None


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(first paragraph, {argument: description}) of a Google-style docstring, lines joined by spaces."""
    lines = doc.splitlines()
    first = " ".join(line.strip() for line in takewhile(lambda line: line.strip() and not _SECTION.match(line), lines))
    args: dict[str, str] = {}
    start = next((i + 1 for i, line in enumerate(lines) if _SECTION.match(line.strip())), len(lines))
    section = list(takewhile(lambda line: not line.strip() or line[:1].isspace(), lines[start:]))
    indent = min((len(line) - len(line.lstrip()) for line in section if line.strip()), default=0)
    current = None
    for line in section:
        match = _ARG_LINE.match(line.strip()) if len(line) - len(line.lstrip()) == indent else None
        if match:
            current = match.group(1)
            args[current] = match.group(2)
        elif current and line.strip():  # a continuation line, indented deeper than the argument
            args[current] = f"{args[current]} {line.strip()}".strip()
    return first, args


def _json_type(hint: Any) -> dict:
    """The JSON-schema type of a type hint; TypeError when there is none."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType) and type(None) in args and len(args) == 2:
        return {**_json_type(next(a for a in args if a is not type(None))), "nullable": True}
    if origin is Literal:
        kinds = {_JSON_TYPES.get(type(value)) for value in args}
        if len(kinds) != 1 or None in kinds:
            raise TypeError(f"Literal values must share one of the types int, float, str, bool: {hint!r}")
        return {"type": kinds.pop(), "enum": list(args)}
    if origin is list or hint is list:
        return {"type": "array", "items": _json_type(args[0])} if args else {"type": "array"}
    if origin is dict or hint is dict:
        return {"type": "object"}
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    raise TypeError(f"unsupported type {hint!r} (use int, float, str, bool, list[X], dict, Optional[X], Literal)")


# --- parsing ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ToolCall:
    """One tool call found in a completion.

    Attributes:
        name: the tool's name ("" when a malformed call has none).
        arguments: keyword arguments for the tool ({} when malformed).
        error: None for a well-formed call, else a one-line reason shown to the model.
    """

    name: str
    arguments: dict
    error: str | None = None


def parse_tool_calls(text: str, call_format: str) -> list[ToolCall]:
    """The tool calls in one turn's completion, in order, malformed ones with ``error`` set.

    Args:
        text: the model's completion.
        call_format: ``"json"``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks
            (``"parameters"`` and JSON-string arguments accepted too); ``"code"``: each fenced
            ```` ```python ```` block is ``python(code=<body>)``. Else ValueError.
    """
    if call_format == "json":
        return _parse_json_calls(text)
    if call_format == "code":
        return _parse_code_calls(text)
    raise ValueError(f"unknown call_format {call_format!r}; valid: {', '.join(CALL_FORMATS)}")


def _parse_json_calls(text: str) -> list[ToolCall]:
    calls, pos = [], 0
    while (start := text.find("<tool_call>", pos)) >= 0:
        end = text.find("</tool_call>", start)
        if end < 0:  # generation stopped mid-call (length limit): the model must still be told
            calls.append(ToolCall("", {}, "unclosed <tool_call> (no </tool_call>)"))
            break
        calls.append(_json_call(text[start + len("<tool_call>"):end]))
        pos = end + len("</tool_call>")
    return calls


def _json_call(body: str) -> ToolCall:
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall("", {}, f"the tool call is not valid JSON: {e}")
    if not isinstance(call, dict):
        return ToolCall("", {}, 'the tool call must be a JSON object {"name": ..., "arguments": {...}}')
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall("", {}, 'the tool call has no "name"')
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):  # some templates and models send the arguments JSON-encoded
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as e:
            return ToolCall(name, {}, f"the arguments string is not valid JSON: {e}")
    if not isinstance(arguments, dict):
        return ToolCall(name, {}, '"arguments" must be a JSON object')
    return ToolCall(name, arguments)


def _parse_code_calls(text: str) -> list[ToolCall]:
    calls, pos = [], 0
    while opening := _FENCE_OPEN.search(text, pos):
        # The closing fence must start a line, so a ``` inside a string of the code does not end it.
        closing = _FENCE_CLOSE.search(text, opening.end())
        is_python = opening.group(1).strip() == "python"
        if closing is None:
            if is_python:
                calls.append(ToolCall("python", {}, "unclosed ```python block (no closing ```)"))
            break
        if is_python:
            calls.append(ToolCall("python", {"code": text[opening.end():closing.start()].rstrip("\n")}))
        pos = closing.end()
    return calls


# --- the python tool ----------------------------------------------------------------------------

class ToolSandboxError(RuntimeError):
    """The sandbox could not run a tool's program: an environment failure, not the model's."""


class PythonTool:
    """The built-in ``python`` tool: runs the model's program in :mod:`rlvr.sandbox`.

    Each call is a fresh program (no state carries over) under its own limits. The observation is
    what it printed, stdout then stderr; of an uncaught exception only the last line
    (``ZeroDivisionError: division by zero``), as ToRL does, unless ``full_traceback``.

    Args:
        timeout_s: wall-clock seconds per call.
        memory_mb: MiB of memory per call, for the program's whole process tree.
        max_output_chars: characters of observation kept; longer ones keep their head and tail.
        full_traceback: show the whole traceback of an uncaught exception.
    """

    name = "python"

    def __init__(self, *, timeout_s: float = 5.0, memory_mb: int = 256, max_output_chars: int = 1000,
                 full_traceback: bool = False) -> None:
        if max_output_chars < 1:
            raise ValueError(f"max_output_chars must be >= 1, got {max_output_chars!r}")
        # A UTF-8 character is at most 4 bytes, so the sandbox keeps at least what we show; the
        # 64 KiB floor keeps a traceback that follows a burst of stderr.
        self.limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb,
                             max_output_bytes=max(4 * max_output_chars, 1 << 16))
        self.max_output_chars = max_output_chars
        self.full_traceback = full_traceback

    def __call__(self, code: str) -> str:
        """Run a Python program and return what it prints.

        Args:
            code: the complete Python program to run; print what you want to see.
        """
        return self.run(code)[0]

    def run(self, code: str) -> tuple[str, bool]:
        """Run ``code`` and return ``(observation, failed)``.

        ``failed`` is True when the program raised or exited non-zero, timed out, ran out of
        memory or was killed. Raises :class:`ToolSandboxError` when the sandbox itself failed.
        """
        try:
            result = execute(code, limits=self.limits)
        except IsolationError as e:  # the machine cannot sandbox at all: no program ran
            raise ToolSandboxError(str(e)) from e
        if result.status == "error":
            raise ToolSandboxError(result.detail or "the sandbox failed")
        head, traceback = _split_traceback(result.stderr) if result.exit_code != 0 else (result.stderr, "")
        parts = [result.stdout, head]
        if result.status == "ok":
            parts.append(traceback if self.full_traceback else _exception_lines(traceback))
        else:  # the status message says what went wrong better than a traceback's last line
            parts += [traceback if self.full_traceback else "", self._status_message(result.status, result.detail)]
        text = "\n".join(part.rstrip("\n") for part in parts if part.strip())
        failed = result.status != "ok" or result.exit_code != 0
        return _cut(text or "(no output)", self.max_output_chars), failed

    def _status_message(self, status: str, detail: str) -> str:
        if status == "timeout":
            return f"TimeoutError: the program ran longer than {self.limits.timeout_s:g} s"
        if status == "memory":
            return f"MemoryError: the program used more than {self.limits.memory_mb} MiB"
        return f"the program was killed: {detail or status}"


_TRACEBACK = "Traceback (most recent call last):\n"
_HARNESS_FRAME = re.compile(r'^  File "<sandbox/harness\.py>".*\n', re.MULTILINE)


def _split_traceback(stderr: str) -> tuple[str, str]:
    """(what the program wrote to stderr itself, the uncaught exception's traceback or "")."""
    start = stderr.find(_TRACEBACK)
    if start < 0:
        return stderr, ""
    # The sandbox's own frame would only puzzle the model.
    return stderr[:start], _HARNESS_FRAME.sub("", stderr[start:])


def _exception_lines(traceback: str) -> str:
    """What follows a traceback's last indented (frame or source) line: the exception line, whole
    even when its message spans several lines."""
    lines = traceback.rstrip("\n").splitlines()
    last_indented = max((i for i, line in enumerate(lines) if line[:1].isspace()), default=0)
    return "\n".join(lines[last_indented + 1:])


def _cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters plus a marker in the middle, keeping its head and tail."""
    if len(text) <= limit:
        return text
    head = limit // 2
    return f"{text[:head]}\n... [{len(text) - limit} characters cut] ...\n{text[len(text) - (limit - head):]}"


# --- running calls ------------------------------------------------------------------------------

@dataclass
class ToolResult:
    """What one tool call gave back.

    Attributes:
        content: the observation shown to the model (``"error: ..."`` when the call failed).
        failed: True when the call was malformed, the tool unknown, the arguments wrong, the tool
            raised, or (for :class:`PythonTool`) the program failed.
        latency_s: wall-clock seconds the call took.
    """

    content: str
    failed: bool
    latency_s: float


def call_tool(tools: dict[str, Callable], call: ToolCall, *, timeout_s: float | None = None,
              max_output_chars: int | None = None) -> ToolResult:
    """Run one call from :func:`parse_tool_calls` with ``tools`` (by name); a failure of the model's
    making becomes an ``"error: ..."`` observation. Raises :class:`ToolSandboxError`, which is the
    environment's failure, not the model's.

    Args:
        timeout_s: seconds a typed tool (any tool but :class:`PythonTool`, whose sandbox has its own
            limit) may take; past them the call is an ``error:`` observation. The tool runs in a
            daemon thread that is abandoned at the deadline: Python cannot kill a thread, so a tool
            that never returns keeps its thread (and whatever it holds) until the process ends.
        max_output_chars: characters of a typed tool's observation (its result, or its exception's
            message) kept; longer ones keep their head and tail. :class:`PythonTool` cuts its own.
    """
    start = time.perf_counter()
    content, failed = _run_call(tools, call, timeout_s, max_output_chars)
    return ToolResult(content, failed, time.perf_counter() - start)


def _run_call(tools: dict[str, Callable], call: ToolCall, timeout_s: float | None,
              max_output_chars: int | None) -> tuple[str, bool]:
    if call.error is not None:
        return f"error: {call.error}", True
    tool = tools.get(call.name)
    if tool is None:
        return f"error: unknown tool {call.name!r}; available: {', '.join(sorted(tools))}", True
    # PythonTool.run also reports a failed program, which a plain return value cannot.
    target = tool.run if isinstance(tool, PythonTool) else tool
    try:
        inspect.signature(target).bind(**call.arguments)
    except TypeError as e:
        return f"error: bad arguments for {call.name!r}: {e}", True
    if (wrong := check_arguments(target, call.arguments)) is not None:
        return f"error: bad arguments for {call.name!r}: {wrong}", True
    if isinstance(tool, PythonTool):
        return tool.run(**call.arguments)  # raises ToolSandboxError; the sandbox enforces the limits

    def run() -> str:  # str() of a huge result runs in the tool's thread too, under its deadline
        output = target(**call.arguments)
        return output if isinstance(output, str) else str(output)

    [outcome] = run_with_deadlines([run], timeout_s)
    cap = max_output_chars or math.inf
    if outcome.timed_out:
        return f"error: tool {call.name!r} did not return within {timeout_s:g} s", True
    if isinstance(outcome.error, ToolSandboxError):
        raise outcome.error
    if outcome.error is not None:  # the model sees what went wrong and may retry, as in TRL
        return _cut(f"error: {type(outcome.error).__name__}: {_message(outcome.error)}", cap), True
    return _cut(outcome.value, cap), False


def _message(error: BaseException) -> str:
    """``str(error)``, or what says it could not be had (an exception's ``__str__`` is the tool's code too)."""
    try:
        return str(error)
    except Exception:
        return "(its message could not be read)"


# --- argument types -----------------------------------------------------------------------------

def check_arguments(function: Callable, arguments: dict) -> str | None:
    """Why ``arguments`` (JSON values, by name) do not match ``function``'s type hints, or None when
    they do: ``argument 'a' must be an integer, got a string '1'``. An int passes for a float (JSON
    writes ``2.0`` as ``2``); a bool is not an int; ``None`` passes only an ``Optional``. Arguments
    without a hint, and hints outside what :func:`tool_schema` supports, are not checked."""
    target = function if inspect.isfunction(function) or inspect.ismethod(function) else function.__call__
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # unresolvable annotations: nothing to check against
        return None
    for name, value in arguments.items():
        if name in hints and (expected := _mismatch(hints[name], value)) is not None:
            return f"argument {name!r} must be {expected}, got {_describe(value)}"
    return None


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "a boolean (true/false)",
               list: "an array", dict: "an object"}


def _mismatch(hint: Any, value: Any) -> str | None:
    """What ``hint`` expects, when ``value`` is not that; None when it is (or cannot be checked)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        wrong = [_mismatch(a, value) for a in args if a is not type(None)]
        if (value is None and type(None) in args) or None in wrong:
            return None
        return " or ".join(w for w in wrong if w) + (" or null" if type(None) in args else "")
    if origin is Literal:
        # 1 == True in Python: a value matches a Literal only with the same type as well
        return None if any(value == a and type(value) is type(a) for a in args) else \
            "one of " + ", ".join(json.dumps(a) for a in args)
    if origin is list or hint is list:
        if not isinstance(value, list):
            return _TYPE_WORDS[list]
        for k, item in enumerate(value):
            if args and (inner := _mismatch(args[0], item)) is not None:
                return f"an array whose items are each {inner} (item {k} is {_describe(item)})"
        return None
    if origin is dict or hint is dict:
        return None if isinstance(value, dict) else _TYPE_WORDS[dict]
    if hint is bool:
        return None if isinstance(value, bool) else _TYPE_WORDS[bool]
    if hint is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else _TYPE_WORDS[int]
    if hint is float:
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) else _TYPE_WORDS[float]
    if hint is str:
        return None if isinstance(value, str) else _TYPE_WORDS[str]
    return None


def _describe(value: Any) -> str:
    """``a string '1'``: a JSON value's type and a short view of it, for an error observation."""
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)
    if value is None:
        return kind
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"
