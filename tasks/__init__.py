"""Task suites: load problems, format prompts as chat messages, name their default verifier.

    from rlvr.tasks import get_task
    for problem in get_task("arithmetic", split="test", n=3):
        print(problem.prompt, problem.reference, problem.verifier)
"""

from rlvr.tasks.base import Problem, TaskSuite
from rlvr.tasks.registry import TASKS, get_task, list_tasks, register_task

# Built-in suites register themselves on import.
from rlvr.tasks import arithmetic as _arithmetic  # noqa: E402,F401
from rlvr.tasks import chain_arithmetic as _chain_arithmetic  # noqa: E402,F401
from rlvr.tasks import countdown as _countdown  # noqa: E402,F401
from rlvr.tasks import math_suites as _math_suites  # noqa: E402,F401
from rlvr.tasks import code_suites as _code_suites  # noqa: E402,F401
from rlvr.tasks import custom as _custom  # noqa: E402,F401
from rlvr.tasks import reasoning_gym as _reasoning_gym  # noqa: E402,F401
from rlvr.tasks import tool_arithmetic as _tool_arithmetic  # noqa: E402,F401

__all__ = ["Problem", "TASKS", "TaskSuite", "get_task", "list_tasks", "register_task"]
