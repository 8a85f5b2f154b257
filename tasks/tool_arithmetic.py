"""``tool_arithmetic``: arithmetic to be done with the ``python`` tool (the tool quickstart's task).

The problems of :mod:`rlvr.tasks.arithmetic` (same splits, same seeds), played in the ``python``
environment: the model may write a fenced python block, reads what it prints, then answers. Three-digit
multiplication is out of the tiny model's reach without the tool (its greedy accuracy stays near 0)
and a copy task with it, which makes the tool's worth measurable on a CPU.

Each problem's gold solution is a whole episode (for SFT)::

    [{"role": "assistant", "content": "```python\\nprint(347*829)\\n```"},
     {"role": "tool", "name": "python", "content": "287663"},
     {"role": "assistant", "content": "287663"}]
"""

from __future__ import annotations

from dataclasses import replace

from rlvr.tasks.arithmetic import Arithmetic
from rlvr.tasks.base import Problem, ProblemList
from rlvr.tasks.registry import register_task

_INSTRUCTION = ("You may run Python: write a ```python block that prints what you need, and you will see its output. "
                "Reply with the final number only.")


@register_task("tool_arithmetic")
class ToolArithmetic(ProblemList):
    """:class:`~rlvr.tasks.arithmetic.Arithmetic` problems (same options, multiplication by default) in
    the ``python`` environment, each with a gold tool-use episode as its solution.

    Args:
        split, n, seed, max_digits, ops: as ``arithmetic``'s.
        style: ``bare`` (``347*829=``, what the tiny model reads) or ``instruct`` (the question, and how
            to call the tool).
    """

    name = "tool_arithmetic"
    default_verifier = "numeric"
    default_environment = "python"
    splits = Arithmetic.splits

    def __init__(self, path: str | None = None, split: str = "train", *, n: int | None = None, seed: int = 0,
                 max_digits: int = 3, ops: str = "*", style: str = "bare"):
        base = Arithmetic(split=split, n=n, seed=seed, max_digits=max_digits, ops=ops, style=style)
        self._problems = [self._with_tool(problem, style) for problem in base]

    def _with_tool(self, problem: Problem, style: str) -> Problem:
        a, op, b = problem.meta["a"], problem.meta["op"], problem.meta["b"]
        prompt = problem.prompt if style == "bare" else [
            {"role": "user", "content": f"What is {a} {op} {b}? {_INSTRUCTION}"}]
        answer = problem.reference["answer"]
        episode = [{"role": "assistant", "content": f"```python\nprint({a}{op}{b})\n```"},
                   {"role": "tool", "name": "python", "content": answer},
                   {"role": "assistant", "content": answer}]
        return replace(problem, id=problem.id.replace("arithmetic/", "tool_arithmetic/", 1), prompt=prompt,
                       solution=episode, environment=self.default_environment)
