"""``chain_arithmetic``: a chain of operations worked one step per line (the process-reward demonstration).

A problem starts at a number and applies ``steps`` operations in order (left to right, no precedence)::

    bare      7+5*3-4:
    instruct  Start at 7, add 5, multiply by 3, subtract 4. Write one operation per line (like 7+5=12)
              and end with the final result.

    gold solution (one line per step)     7+5=12
                                          12*3=36
                                          36-4=32          answer: 32 (the last step's result)

The default verifier is ``numeric`` (the last number of the completion is the answer). Because each
line states an intermediate result, every step can be checked by itself, which is what a process
reward model needs: :func:`label_steps` labels the steps of any completion (a model's sample), and
:func:`write_prm_data` writes labelled samples as the step-labelled JSONL ``rlvr train-prm`` reads.

Every problem belongs to one split, decided by a stable hash of its text (``7+5*3-4``): 10% ``test``,
5% ``dev``, the rest ``train``, whatever the seed, as in :mod:`rlvr.tasks.arithmetic`.
"""

from __future__ import annotations

import json
import operator
import random
import re
from pathlib import Path
from typing import Callable, Iterable

from rlvr.tasks.base import SPLIT_BUCKETS, Problem, ProblemList, draw_distinct, hash_split
from rlvr.tasks.registry import register_task
from rlvr.verifiers.errors import InvalidValueError

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_WORDS = {"+": "add {}", "-": "subtract {}", "*": "multiply by {}"}
_STYLES = ("bare", "instruct")
#: The instruct prompt's example of one written operation: fixed, never a step of the problem asked
#: (an example taken from the problem's own chain gave its first step away, and with one step its answer).
FORMAT_EXAMPLE = "7+5=12"
# One step as a line states it: "12*3=36" (spaces allowed; negative numbers as "-4").
_STEP = re.compile(r"^\s*(-?\d+)\s*([-+*])\s*(-?\d+)\s*=\s*(-?\d+)\s*$")


def split_of(text: str) -> str:
    """The split of the problem written ``text`` (``7+5*3-4``), from a stable hash (no seed)."""
    return hash_split(f"chain/{text}")


def chain_values(start: int, ops: Iterable[tuple[str, int]]) -> list[int]:
    """The running value after each operation, left to right: ``chain_values(7, [("+", 5), ("*", 3)])``
    is ``[12, 36]``."""
    values, value = [], start
    for op, operand in ops:
        value = _OPS[op](value, operand)
        values.append(value)
    return values


def gold_steps(start: int, ops: Iterable[tuple[str, int]]) -> list[str]:
    """The gold solution's steps: ``["7+5=12", "12*3=36", ...]``."""
    ops = list(ops)
    values = chain_values(start, ops)
    before = [start] + values[:-1]
    return [f"{a}{op}{b}={v}" for a, (op, b), v in zip(before, ops, values)]


@register_task("chain_arithmetic")
class ChainArithmetic(ProblemList):
    """Chains of ``steps`` integer operations on small numbers, worked one step per line.

    Args:
        split: ``train`` | ``dev`` | ``test`` (disjoint, see the module docstring).
        n: number of problems (default 10,000 for train, 500 otherwise). Held-out splits hold
            distinct problems; train problems are drawn with replacement.
        seed: which problems are drawn; the split membership does not depend on it.
        steps: operations per problem (>= 1).
        max_operand: the start and every operand lie in [1, max_operand].
        ops: the operators to draw from, any of ``+ - *``.
        style: ``bare`` (``7+5*3-4:``, what a tiny character-level model reads) or ``instruct``.
    """

    name = "chain_arithmetic"
    default_verifier = "numeric"
    splits = ("train", "dev", "test")

    def __init__(self, path: str | None = None, split: str = "train", *, n: int | None = None, seed: int = 0,
                 steps: int = 3, max_operand: int = 9, ops: str = "+-*", style: str = "bare"):
        if split not in SPLIT_BUCKETS:
            raise InvalidValueError(f"chain_arithmetic: unknown split {split!r}; valid splits: {', '.join(SPLIT_BUCKETS)}")
        if style not in _STYLES:
            raise InvalidValueError(f"chain_arithmetic: unknown style {style!r}; valid styles: {', '.join(_STYLES)}")
        if not ops or set(ops) - set(_OPS):
            raise InvalidValueError(f"chain_arithmetic: ops must be a non-empty string of {' '.join(_OPS)}, got {ops!r}")
        if steps < 1:
            raise InvalidValueError(f"chain_arithmetic: steps must be >= 1, got {steps}")
        if max_operand < 1:
            raise InvalidValueError(f"chain_arithmetic: max_operand must be >= 1, got {max_operand}")
        self.split, self.seed, self.steps, self.max_operand, self.ops, self.style = \
            split, seed, steps, max_operand, ops, style
        self.n = n if n is not None else (10_000 if split == "train" else 500)
        self._problems = self._draw()

    def _draw(self) -> list[Problem]:
        rng = random.Random(f"chain_arithmetic/{self.seed}/{self.split}")
        space = self.max_operand ** (self.steps + 1) * len(set(self.ops)) ** self.steps

        def draw() -> tuple[str, int, list[tuple[str, int]]]:
            start = rng.randint(1, self.max_operand)
            chain = [(rng.choice(self.ops), rng.randint(1, self.max_operand)) for _ in range(self.steps)]
            return f"{start}" + "".join(f"{op}{b}" for op, b in chain), start, chain

        return draw_distinct(
            self.n, draw, lambda index, c: self._problem(index, c[1], c[2], c[0]),
            keep=lambda c: split_of(c[0]) == self.split, key=(lambda c: c[0]) if self.split != "train" else None,
            max_attempts=200 * self.n + 10_000,
            failure=f"chain_arithmetic: cannot draw {self.n} distinct {self.split} problems from {space} (raise "
                    "max_operand or steps, or lower n: the suite option n, `--task-option n=N` in rlvr eval)")

    def _problem(self, index: int, start: int, chain: list[tuple[str, int]], text: str) -> Problem:
        if self.style == "bare":
            content = f"{text}:"
        else:
            words = ", ".join(_WORDS[op].format(b) for op, b in chain)
            content = (f"Start at {start}, {words}. Write one operation per line (like {FORMAT_EXAMPLE}) "
                       "and end with the final result.")
        steps = gold_steps(start, chain)
        return Problem(
            id=f"chain_arithmetic/{self.split}/{index}",
            prompt=[{"role": "user", "content": content}],
            reference={"answer": str(chain_values(start, chain)[-1])},
            verifier=self.default_verifier,
            solution="\n".join(steps),
            meta={"start": start, "ops": [[op, b] for op, b in chain]},
        )


# ---------------------------------------------------------------------------------------------
# Step labels: which steps of a completion are right
# ---------------------------------------------------------------------------------------------


def split_steps(text: str, separator: str = "\n") -> list[str]:
    """The steps of a completion: its text between separators, blank pieces left out (the steps
    :func:`rlvr.algorithms.process_rewards.step_end_indices` finds in its tokens)."""
    return [piece for piece in text.split(separator) if piece.strip()]


def label_steps(problem: Problem, completion: str, separator: str = "\n") -> list[bool]:
    """One label per step of ``completion`` (:func:`split_steps`): is the step right?

    Step k is right when it reads ``a<op>b=c`` with ``a`` the true value before operation k, ``<op>b``
    the problem's k-th operation and ``c`` the true value after it, and every step before it is right
    (Math-Shepherd's rule: a step is good while the right answer can still be reached from it; once a
    value is wrong, the chain is wrong from there on, however sound its later arithmetic). A step past
    the problem's last operation is wrong, and so is a completion's last step when operations remain:
    the last step states the answer, and it is not the answer. So every step is right exactly when the
    completion works the whole chain correctly."""
    start, chain = problem.meta["start"], [(op, b) for op, b in problem.meta["ops"]]
    values = chain_values(start, chain)
    before = [start] + values[:-1]
    steps = split_steps(completion, separator)
    labels: list[bool] = []
    for k, step in enumerate(steps):
        match = _STEP.match(step)
        right = (bool(labels) and labels[-1]) or k == 0
        right = right and k < len(chain) and match is not None and (
            int(match.group(1)), match.group(2), int(match.group(3)), int(match.group(4))
        ) == (before[k], chain[k][0], chain[k][1], values[k])
        if k == len(steps) - 1 and k < len(chain) - 1:
            right = False  # the completion stops before the last operation: its answer is not the answer
        labels.append(right)
    return labels


def write_prm_data(samples: Iterable[tuple[Problem, str]], path: str | Path, *, separator: str = "\n",
                   label: Callable[[Problem, str, str], list[bool]] = label_steps) -> int:
    """Write ``(problem, completion text)`` samples as step-labelled JSONL, the input of ``rlvr train-prm``:
    one line per sample, ``{"id", "prompt": chat messages, "completions": [step, ...], "labels": [bool, ...]}``
    (TRL's stepwise-supervision format; the steps joined by ``separator`` are the completion). Samples
    without a step are left out. Returns the number of lines written."""
    rows = []
    for problem, completion in samples:
        steps = split_steps(completion, separator)
        if steps:
            rows.append({"id": problem.id, "prompt": list(problem.prompt), "completions": steps,
                         "labels": label(problem, completion, separator)})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return len(rows)
