"""Multi-turn environments: what answers the model between its turns.

An episode starts from a problem's chat messages. After each assistant turn the trainer calls
``episode.step(text)`` with the turn's text; the :class:`EnvStep` it returns says what comes next:
messages to append (tool results, user feedback), a reward for the turn, and whether the episode is
over. An episode whose environment has nothing to say (no messages) ends there: the model has given
its final answer. The final reward still comes from the problem's verifier (or a learned reward
model) scoring the last assistant message, so every verifier works for multi-turn episodes as it is.

Environments never see token ids: the trainer tokenises what they return and appends it to the
episode's ids (``rlvr/rollout/episodes.py``), so nothing the model sampled is ever re-tokenised.

A suite names an environment per problem (``Problem.environment``) the way it names its verifier;
a run can set one for all problems (``environment.name``). Registering one::

    from rlvr.tasks.environments import EnvStep, register_environment

    @register_environment("guess")
    class Guess:
        name = "guess"  # tells the model "higher" or "lower", for up to three tries

        def episode(self, problem):
            return GuessEpisode(int(problem.reference["answer"]))

    class GuessEpisode:
        def __init__(self, target):
            self.target, self.tries = target, 0

        def step(self, text):
            self.tries += 1
            words = text.split()
            guess = int(words[-1]) if words and words[-1].lstrip("-").isdigit() else None
            if guess is None or guess == self.target or self.tries == 3:
                return EnvStep()                                   # nothing to add: the episode ends
            hint = "higher" if guess < self.target else "lower"
            return EnvStep(messages=[{"role": "user", "content": hint}])

Environment code may fail in any way without harming the run: an exception from ``episode()``,
``step()`` or ``close()``, a call that does not return within its deadline, or a reply that is not an
:class:`EnvStep` ends that episode alone as an ``error`` (masked from the loss, counted), and the
other episodes go on (``rlvr/rollout/episodes.py``, docs/environments.md "Faults").

Third-party packages register through the entry-point group ``rlvr.environments``, like verifiers.
Built in: ``tools`` runs the model's tool calls (:class:`ToolEnvironment`), ``python`` the fenced
python blocks it writes (:class:`PythonEnvironment`, ToRL's format).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from rlvr.tasks.base import Problem
from rlvr.tasks.tools import CALL_FORMATS, PythonTool, ToolSandboxError, call_tool, parse_tool_calls, tool_schema
from rlvr.verifiers.errors import InvalidValueError, PluginLoadError
from rlvr.verifiers.plugins import Registry, build_with_options, check_options, import_path, is_import_path


@dataclass
class EnvStep:
    """What the environment answers to one assistant turn.

    Attributes:
        messages: chat messages to append (``{"role": "tool"|"user", "content": ...}``, a tool's with
            its ``name``); none ends the episode (the model's turn was its final answer).
        reward: a reward for this turn, added to the verifier's score of the episode (0: none).
        done: the environment ends the episode now, whatever ``messages`` holds.
        tool_calls: tool calls the turn made; ``tool_errors`` of them failed (bad call, raising code,
            timeout); ``tool_latency_s`` the seconds each took (for the ``env/`` metrics).
    """

    messages: list[dict[str, str]] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    tool_calls: int = 0
    tool_errors: int = 0
    tool_latency_s: list[float] = field(default_factory=list)


class EnvironmentFailure(RuntimeError):
    """The environment itself failed (e.g. the sandbox could not run a tool): the episode is an
    ``error``, masked from the loss and counted, never a reward of 0, with this message as its reason.
    (Any other exception from an environment's code ends its episode the same way, its message
    prefixed with the call and the exception's type: ``step() raised ValueError: ...``.)"""


@runtime_checkable
class Episode(Protocol):
    """One episode's state; ``step`` is called after each assistant turn. An optional ``close()``
    is called once when the episode ends, however it ends (a failure or a timeout included)."""

    def step(self, text: str) -> EnvStep: ...


@runtime_checkable
class Environment(Protocol):
    """Starts episodes. An optional ``tool_schemas()`` lists the JSON schemas of its tools, which a
    chat template that takes ``tools`` renders into the prompt; an optional ``step_timeout_s``
    attribute says how long one call into its code may legitimately take (the episode runner waits
    the larger of it and ``environment.step_timeout_s``; past that, the episode is an ``error``)."""

    name: str

    def episode(self, problem: Problem) -> Episode: ...


ENTRY_POINT_GROUP = "rlvr.environments"
ENVIRONMENTS: Registry[Callable[..., Any]] = Registry("environment", entry_point_group=ENTRY_POINT_GROUP)


def register_environment(name: str, *, overwrite: bool = False) -> Callable:
    """Decorator registering an environment class (or factory) built as ``factory(**options)``."""
    return lambda factory: ENVIRONMENTS.register(name, factory, overwrite=overwrite)


def list_environments() -> list[str]:
    """Sorted names of every registered environment (built-in and plugins, none imported)."""
    return ENVIRONMENTS.names()


def check_environment(name: str, options: dict | None = None) -> Callable[..., Any]:
    """The factory of ``name`` after checking that it loads and takes every option in ``options``."""
    factory = ENVIRONMENTS.get(name)
    check_options(f"environment {name!r}", factory, dict(options or {}))
    return factory


def get_environment(name: str, **options: Any) -> Environment:
    """Build the environment ``name`` with ``options``; an unknown name lists the registered ones, an
    option it does not take lists the ones it does, and a value its constructor refuses (any
    exception: a plugin raises what it likes) is an :class:`OptionError` naming the environment."""
    return build_with_options(f"environment {name!r}", check_environment(name, options), options)


# ---------------------------------------------------------------------------------------------
# Tools
# ---------------------------------------------------------------------------------------------


@register_environment("tools")
class ToolEnvironment:
    """The model calls tools mid-answer; each call's result comes back as a ``tool`` message.

    Args:
        tools: the tools offered: ``python`` (code run in ``rlvr.sandbox``, :class:`PythonTool`) or
            ``"module:function"`` import paths of plain functions with type hints and a docstring
            (the convention of transformers' chat templates and TRL's ``tools``).
        call_format: how calls are written: ``json`` (``<tool_call>{"name": ..., "arguments": {...}}
            </tool_call>``, the Hermes/Qwen chat templates' format) or ``code`` (a fenced python
            block runs in the ``python`` tool: ToRL's format, for models without a tool format).
        max_calls_per_turn: calls run per turn; later ones are ignored.
        timeout_s, max_output_chars: every tool call's limits: seconds it may take (the ``python``
            tool's program is killed then; a typed tool's thread is abandoned, Python cannot kill
            it, and the call is an ``error:`` observation) and characters of its observation kept
            (head and tail).
        memory_mb, full_traceback: the ``python`` tool's memory limit per call (MiB) and whether it
            returns a whole traceback rather than its last line.

    A call's arguments are checked against the tool's type hints before it runs: a string for an
    ``int`` is an ``error:`` observation naming the argument and the type it must have.
    """

    name = "tools"
    #: seconds each call may take beyond ``timeout_s`` (the sandbox's start and teardown), for the
    #: step deadline this environment declares (:attr:`step_timeout_s`)
    CALL_SLACK_S = 5.0

    def __init__(self, tools: Sequence[str] = ("python",), call_format: str = "json", max_calls_per_turn: int = 4,
                 timeout_s: float = 5.0, memory_mb: int = 256, max_output_chars: int = 1000,
                 full_traceback: bool = False):
        if call_format not in CALL_FORMATS:
            raise InvalidValueError(f"environment tools: call_format must be one of {', '.join(CALL_FORMATS)}, "
                                    f"got {call_format!r}")
        if isinstance(max_calls_per_turn, bool) or not isinstance(max_calls_per_turn, int) or max_calls_per_turn < 1:
            raise InvalidValueError(f"environment tools: max_calls_per_turn must be an integer >= 1, got "
                                    f"{max_calls_per_turn!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
            raise InvalidValueError(f"environment tools: timeout_s must be a finite number of seconds > 0, got "
                                    f"{timeout_s!r}")
        if isinstance(max_output_chars, bool) or not isinstance(max_output_chars, int) or max_output_chars < 1:
            raise InvalidValueError(f"environment tools: max_output_chars must be an integer >= 1, got "
                                    f"{max_output_chars!r}")
        self.call_format, self.max_calls_per_turn = call_format, max_calls_per_turn
        self.timeout_s, self.max_output_chars = float(timeout_s), max_output_chars
        # The longest one step may legitimately take: every call at its deadline. The episode runner
        # waits for a step the larger of this and environment.step_timeout_s.
        self.step_timeout_s = max_calls_per_turn * (self.timeout_s + self.CALL_SLACK_S)
        self.tools: dict[str, Callable] = {}
        for spec in [tools] if isinstance(tools, str) else tools:
            tool = (PythonTool(timeout_s=timeout_s, memory_mb=memory_mb, max_output_chars=max_output_chars,
                               full_traceback=full_traceback) if spec == "python" else _import_tool(spec))
            self.tools[getattr(tool, "name", None) or tool.__name__] = tool
        if call_format == "code" and "python" not in self.tools:
            raise InvalidValueError("environment tools: call_format code runs fenced python blocks, so tools must "
                                    "include python")

    def tool_schemas(self) -> list[dict]:
        return [tool_schema(tool) for tool in self.tools.values()]

    def episode(self, problem: Problem) -> "ToolEpisode":
        return ToolEpisode(self)


@register_environment("python")
class PythonEnvironment(ToolEnvironment):
    """ToRL's tool-integrated reasoning: each fenced ```` ```python ```` block of a turn runs in
    ``rlvr.sandbox`` and what it prints comes back as a ``tool`` message; a turn without one is the
    final answer. :class:`ToolEnvironment` with ``tools=("python",), call_format="code"``; the other
    arguments are its own."""

    name = "python"

    def __init__(self, max_calls_per_turn: int = 1, timeout_s: float = 5.0, memory_mb: int = 256,
                 max_output_chars: int = 1000, full_traceback: bool = False):
        super().__init__(("python",), "code", max_calls_per_turn, timeout_s, memory_mb, max_output_chars,
                         full_traceback)


class ToolEpisode:
    """One episode of :class:`ToolEnvironment`: each turn's calls run in order, one ``tool`` message each."""

    def __init__(self, environment: ToolEnvironment):
        self.environment = environment

    def step(self, text: str) -> EnvStep:
        env = self.environment
        calls = parse_tool_calls(text, env.call_format)[: env.max_calls_per_turn]
        out = EnvStep(tool_calls=len(calls))
        for call in calls:
            try:
                result = call_tool(env.tools, call, timeout_s=env.timeout_s, max_output_chars=env.max_output_chars)
            except ToolSandboxError as exc:
                raise EnvironmentFailure(f"the sandbox could not run tool {call.name!r}: {exc}") from None
            out.messages.append({"role": "tool", "name": call.name or "unknown", "content": result.content})
            out.tool_errors += int(result.failed)
            out.tool_latency_s.append(result.latency_s)
        return out


def _import_tool(spec: str) -> Callable:
    """The function at ``"module:function"``, found as a verifier named by import path is (a module in
    the current folder included: :func:`rlvr.verifiers.plugins.import_path`)."""
    if not is_import_path(spec):
        raise InvalidValueError(f"environment tools: tool {spec!r} is neither 'python' nor a 'module:function' path")
    try:
        tool = import_path(spec, "tool")
    except PluginLoadError as exc:
        raise InvalidValueError(f"environment tools: {exc}") from None
    try:
        tool_schema(tool)  # a tool without type hints or a docstring fails here, naming what is missing
    except ValueError as exc:
        raise InvalidValueError(f"environment tools: {exc}") from None
    return tool
