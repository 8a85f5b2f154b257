"""Tool calling (rlvr.tasks.tools): schemas from docstrings, parsing calls, the sandboxed python tool.

The PythonTool tests run real programs and need the sandbox (bubblewrap); they skip without it.
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Literal, Optional

import pytest

from rlvr.sandbox import capabilities
from rlvr.tasks.tools import (
    CALL_FORMATS, PythonTool, ToolCall, ToolResult, ToolSandboxError, call_tool, check_arguments, parse_tool_calls,
    run_with_deadlines, tool_schema,
)

CAPS = capabilities()


def sandboxed(test):
    """Marks for a test that runs programs. PythonTool uses the default pool, which refuses weak
    isolation, so ``capabilities()["usable"]`` alone is not enough: skip without the strong sandbox."""
    test = pytest.mark.skipif(not CAPS["usable"] or CAPS["isolation"] != "strong",
                              reason=f"needs the strong sandbox (apt-get install bubblewrap): {CAPS['missing']}")(test)
    return pytest.mark.bwrap(test)


# --- tool_schema --------------------------------------------------------------------------------

def search(query: str, limit: int, lang: Optional[str] = None, tags: list[str] | None = None,
           order: Literal["new", "old"] = "new", exact: bool = False, score: float = 0.5,
           filters: dict = {}) -> str:  # noqa: B006 (never mutated)
    """Search the documents.

    Ranked by relevance; this paragraph is not part of the description.

    Args:
        query: the words to look for,
            on two lines.
        limit (int): most results, counted in documents.
        lang: a language code.
        tags: only documents with all these tags.
        order: newest or oldest first.
        exact: match whole words only.
        score: lowest relevance kept, in [0, 1].
        filters: field -> value filters.

    Returns:
        The results, one a line.
    """
    return ""


def test_schema_of_a_documented_function():
    assert tool_schema(search) == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the documents.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "the words to look for, on two lines."},
                    "limit": {"type": "integer", "description": "most results, counted in documents."},
                    "lang": {"type": "string", "nullable": True, "description": "a language code."},
                    "tags": {"type": "array", "items": {"type": "string"}, "nullable": True,
                             "description": "only documents with all these tags."},
                    "order": {"type": "string", "enum": ["new", "old"], "description": "newest or oldest first."},
                    "exact": {"type": "boolean", "description": "match whole words only."},
                    "score": {"type": "number", "description": "lowest relevance kept, in [0, 1]."},
                    "filters": {"type": "object", "description": "field -> value filters."},
                },
                "required": ["query", "limit"],
            },
        },
    }


def test_schema_of_callable_objects_and_the_python_tool():
    class Lookup:
        def __call__(self, key: str) -> str:
            """Look a key up.

            Args:
                key: the key.
            """
            return key

    named = Lookup()
    named.name = "dictionary"
    assert tool_schema(Lookup())["function"]["name"] == "lookup"
    assert tool_schema(named)["function"]["name"] == "dictionary"
    assert tool_schema(named)["function"]["parameters"]["required"] == ["key"]
    assert tool_schema(PythonTool())["function"] == {
        "name": "python",
        "description": "Run a Python program and return what it prints.",
        "parameters": {"type": "object", "required": ["code"], "properties": {"code": {
            "type": "string", "description": "the complete Python program to run; print what you want to see."}}},
    }


def no_hint(x) -> int:
    """Nothing.

    Args:
        x: a value.
    """


def no_doc(x: int) -> int:
    pass


def undocumented_arg(x: int, y: int) -> int:
    """Nothing.

    Args:
        x: a value.
    """


def bad_type(x: set[int]) -> int:
    """Nothing.

    Args:
        x: a value.
    """


def bad_union(x: int | str) -> int:
    """Nothing.

    Args:
        x: a value.
    """


@pytest.mark.parametrize("function, problem", [
    (no_hint, "has no type hint"), (no_doc, "no docstring"), (undocumented_arg, "'y' is not described"),
    (bad_type, "unsupported type"), (bad_union, "unsupported type"),
])
def test_schema_errors_name_the_function_and_the_problem(function, problem):
    with pytest.raises(ValueError, match=problem) as info:
        tool_schema(function)
    assert repr(function.__name__) in str(info.value)


# --- parse_tool_calls ---------------------------------------------------------------------------

def test_parse_json_calls():
    text = ('I will look.\n<tool_call>\n{"name": "search", "arguments": {"query": "cats", "limit": 2}}\n</tool_call>\n'
            '<tool_call>{"name": "python", "parameters": {"code": "print(1)"}}</tool_call>'
            '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"dogs\\"}"}</tool_call>'
            '<tool_call>{"name": "now"}</tool_call> done')
    assert parse_tool_calls(text, "json") == [
        ToolCall("search", {"query": "cats", "limit": 2}),
        ToolCall("python", {"code": "print(1)"}),
        ToolCall("search", {"query": "dogs"}),
        ToolCall("now", {}),
    ]
    assert parse_tool_calls("no calls here ```python\nprint(1)\n```", "json") == []


@pytest.mark.parametrize("body, name, reason", [
    ('{"name": "f", "arguments": {"a": 1}', "", "not valid JSON"),
    ('["f", {}]', "", "must be a JSON object"),
    ('{"arguments": {"a": 1}}', "", 'no "name"'),
    ('{"name": 3, "arguments": {}}', "", 'no "name"'),
    ('{"name": "f", "arguments": [1, 2]}', "f", "must be a JSON object"),
    ('{"name": "f", "arguments": "{bad"}', "f", "not valid JSON"),
    ('{"name": "f", "arguments": "[1]"}', "f", "must be a JSON object"),
])
def test_parse_malformed_json_calls(body, name, reason):
    text = f'<tool_call>{body}</tool_call><tool_call>{{"name": "ok", "arguments": {{}}}}</tool_call>'
    bad, good = parse_tool_calls(text, "json")
    assert (bad.name, bad.arguments) == (name, {}) and reason in bad.error and "\n" not in bad.error
    assert good == ToolCall("ok", {})


def test_parse_unclosed_json_call():
    calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "g", "argu',
                             "json")
    assert calls[0] == ToolCall("f", {})
    assert len(calls) == 2 and calls[1].error and "unclosed" in calls[1].error


def test_parse_code_calls():
    text = ("Let me compute.\n```python\nx = 6 * 7\nprint(x)\n```\n```output\n42\n```\n"
            "Some notes:\n```text\nprint('not code')\n```\n"
            "```python\nprint('```')\n```\nand an unfinished one:\n```python\nprint(")
    assert parse_tool_calls(text, "code") == [
        ToolCall("python", {"code": "x = 6 * 7\nprint(x)"}),
        ToolCall("python", {"code": "print('```')"}),  # a ``` inside a line does not close the block
        ToolCall("python", {}, "unclosed ```python block (no closing ```)"),
    ]
    assert parse_tool_calls("plain text, `inline` code, ```text\nx\n```", "code") == []
    assert parse_tool_calls("```text\nnever closed", "code") == []


def test_parse_unknown_format():
    assert CALL_FORMATS == ("json", "code")
    with pytest.raises(ValueError, match="unknown call_format 'xml'; valid: json, code"):
        parse_tool_calls("<tool_call>{}</tool_call>", "xml")


# --- PythonTool ---------------------------------------------------------------------------------

@sandboxed
def test_python_prints():
    tool = PythonTool()
    assert tool("print(6*7)") == "42"
    assert tool.run("print(6*7)") == ("42", False)
    assert tool.run("x = 1") == ("(no output)", False)
    assert tool.run("import sys; print('out'); print('warn', file=sys.stderr)") == ("out\nwarn", False)


@sandboxed
def test_python_exception_shows_the_last_traceback_line():
    code = "import sys\nprint('before')\nprint('note', file=sys.stderr)\ndef f():\n    return 1 / 0\nf()"
    assert PythonTool().run(code) == ("before\nnote\nZeroDivisionError: division by zero", True)
    full, failed = PythonTool(full_traceback=True).run(code)
    assert failed and full.startswith("before\nnote\nTraceback (most recent call last):")
    assert 'line 5, in f' in full and full.endswith("ZeroDivisionError: division by zero")
    assert "harness" not in full  # the sandbox's own frame is hidden
    assert PythonTool().run("print('open") == ("SyntaxError: unterminated string literal (detected at line 1)", True)


@sandboxed
def test_python_timeout_is_an_observation_within_the_limit():
    tool = PythonTool(timeout_s=1)
    start = time.perf_counter()
    observation, failed = tool.run("import sys\nprint('started', flush=True)\nwhile True: pass")
    assert time.perf_counter() - start < 1 + 1
    assert (observation, failed) == ("started\nTimeoutError: the program ran longer than 1 s", True)


@sandboxed
def test_python_memory_and_signals_are_observations():
    tool = PythonTool(memory_mb=64)
    assert tool.run("blocks = []\nwhile True: blocks.append(bytearray(1 << 20))") == (
        "MemoryError: the program used more than 64 MiB", True)
    observation, failed = tool.run("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert failed and observation.startswith("the program was killed: ") and "\n" not in observation


@sandboxed
def test_python_has_no_network():
    observation, failed = PythonTool().run(
        'import socket\nsocket.create_connection(("1.1.1.1", 80), timeout=2)\nprint("connected")')
    assert failed and "connected" not in observation and "Error" in observation


@sandboxed
def test_python_cannot_read_host_files(tmp_path):
    token = secrets.token_hex(16)
    secret = tmp_path / "secret.txt"
    secret.write_text(token)
    observation, failed = PythonTool(full_traceback=True).run(f"print(open({str(secret.resolve())!r}).read())")
    assert token not in observation
    assert failed and "Error" in observation


@sandboxed
def test_python_calls_are_fast():
    tool = PythonTool()
    tool("pass")  # the pool's first start is not the cost of a call
    start = time.perf_counter()
    assert all(tool("print(1)") == "1" for _ in range(100))
    assert time.perf_counter() - start < 5.0


@sandboxed
def test_python_long_output_keeps_head_and_tail():
    tool = PythonTool(max_output_chars=100)
    observation = tool("print('HEAD' + 'x' * 5000 + 'TAIL')")
    assert observation.startswith("HEAD") and observation.endswith("TAIL")
    assert "... [4908 characters cut] ..." in observation
    marker = "\n... [4908 characters cut] ...\n"
    assert len(observation) == 100 + len(marker)


def test_python_tool_limits_are_checked_up_front():
    with pytest.raises(ValueError, match="max_output_chars"):
        PythonTool(max_output_chars=0)
    with pytest.raises(ValueError, match="timeout_s"):
        PythonTool(timeout_s=0)


# --- call_tool ----------------------------------------------------------------------------------

def add(a: int, b: int = 0) -> int:
    """Add two numbers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


def divide(a: int, b: int) -> float:
    """Divide.

    Args:
        a: the dividend.
        b: the divisor.
    """
    return a / b


class BrokenSandbox:
    def __call__(self, code: str) -> str:
        raise ToolSandboxError("bwrap exploded")


TOOLS = {"add": add, "divide": divide}


def test_call_tool_runs_a_tool():
    result = call_tool(TOOLS, ToolCall("add", {"a": 2, "b": 40}))
    assert isinstance(result, ToolResult)
    assert (result.content, result.failed) == ("42", False)  # a non-string result goes through str()
    assert result.latency_s > 0


@pytest.mark.parametrize("call, content", [
    (ToolCall("mul", {"a": 1}), "error: unknown tool 'mul'; available: add, divide"),
    (ToolCall("add", {"b": 1}), "error: bad arguments for 'add': missing a required argument: 'a'"),
    (ToolCall("add", {"a": 1, "c": 2}), "error: bad arguments for 'add': got an unexpected keyword argument 'c'"),
    (ToolCall("divide", {"a": 1, "b": 0}), "error: ZeroDivisionError: division by zero"),
    (ToolCall("", {}, "the tool call is not valid JSON"), "error: the tool call is not valid JSON"),
])
def test_call_tool_failures_are_observations(call, content):
    result = call_tool(TOOLS, call)
    assert (result.content, result.failed) == (content, True)
    assert result.latency_s > 0


def test_call_tool_sandbox_failure_propagates():
    with pytest.raises(ToolSandboxError, match="bwrap exploded"):
        call_tool({"python": BrokenSandbox()}, ToolCall("python", {"code": "print(1)"}))


@sandboxed
def test_call_tool_python_reports_failed_programs():
    tools = {"python": PythonTool()}
    assert call_tool(tools, ToolCall("python", {"code": "print(6*7)"})).content == "42"
    result = call_tool(tools, ToolCall("python", {"code": "1/0"}))
    assert (result.content, result.failed) == ("ZeroDivisionError: division by zero", True)
    result = call_tool(tools, ToolCall("python", {"source": "1/0"}))
    assert result.failed and result.content.startswith("error: bad arguments for 'python'")


# --- argument types and deadlines ---------------------------------------------------------------

@pytest.mark.parametrize("arguments, problem", [
    ({"query": "q", "limit": "3"}, "argument 'limit' must be an integer, got a string '3'"),
    ({"query": "q", "limit": True}, "argument 'limit' must be an integer, got a boolean true"),
    ({"query": "q", "limit": 3.0}, "argument 'limit' must be an integer, got a number 3.0"),
    ({"query": 7, "limit": 3}, "argument 'query' must be a string, got an integer 7"),
    ({"query": "q", "limit": 3, "score": "high"}, "argument 'score' must be a number, got a string 'high'"),
    ({"query": "q", "limit": 3, "order": "newest"}, "argument 'order' must be one of \"new\", \"old\""),
    ({"query": "q", "limit": 3, "tags": ["a", 1]}, "argument 'tags' must be an array whose items are each a string"),
    ({"query": "q", "limit": 3, "exact": 1}, "argument 'exact' must be a boolean (true/false), got an integer 1"),
    ({"query": "q", "limit": 3, "filters": []}, "argument 'filters' must be an object, got an array []"),
    ({"query": None, "limit": 3}, "argument 'query' must be a string, got null"),
])
def test_arguments_are_checked_against_the_type_hints(arguments, problem):
    assert check_arguments(search, arguments).startswith(problem)


def test_well_typed_arguments_pass():
    assert check_arguments(search, {"query": "q", "limit": 3, "score": 1, "lang": None, "tags": None,
                                    "order": "old", "exact": False, "filters": {"a": 1}}) is None  # an int is a number
    assert check_arguments(PythonTool().run, {"code": "print(1)"}) is None


def test_run_with_deadlines_keeps_order_bounds_concurrency_and_abandons_hung_calls():
    hang, lock, running, most = threading.Event(), threading.Lock(), [0], [0]

    def counted(value):
        def call():
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.05)
            with lock:
                running[0] -= 1
            return value
        return call

    def fails():
        raise SystemExit(3)  # even this is the call's outcome

    start = time.perf_counter()
    outcomes = run_with_deadlines([hang.wait, hang.wait, *[counted(k) for k in range(4)], fails], 0.3, workers=2)
    assert time.perf_counter() - start < 0.9  # two hung calls cost one deadline, not forever
    assert [o.timed_out for o in outcomes] == [True, True] + [False] * 5
    assert [o.value for o in outcomes[2:6]] == [0, 1, 2, 3] and isinstance(outcomes[6].error, SystemExit)
    assert most[0] <= 2  # the slots of abandoned calls went to the next ones, never more than workers at once
