"""``arithmetic``: seeded synthetic integer arithmetic (the quickstart's task).

Every possible problem ``a <op> b`` belongs to exactly one split, decided by a stable hash of its
text: 10% ``test``, 5% ``dev``, the rest ``train``. Held-out problems are therefore disjoint from
training ones for every seed and every size.

Styles:
    bare      ``7+345=``  (what a tiny character-level model reads)
    instruct  ``What is 7 + 345? Reply with the final number only.``
"""

from __future__ import annotations

import operator
import random

from rlvr.tasks.base import SPLIT_BUCKETS, Problem, ProblemList, draw_distinct, hash_split
from rlvr.tasks.registry import register_task
from rlvr.verifiers.errors import InvalidValueError

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_STYLES = ("bare", "instruct")
_ENUMERATE_LIMIT = 20_000  # problem spaces up to this size are listed rather than sampled


def split_of(a: int, op: str, b: int) -> str:
    """The split a problem belongs to, from a stable hash of its text (independent of any seed)."""
    return hash_split(f"{a}{op}{b}")


@register_task("arithmetic")
class Arithmetic(ProblemList):
    """Integer arithmetic with operands of 1..``max_digits`` digits.

    Args:
        split: ``train`` | ``dev`` | ``test`` (disjoint, see module docstring).
        n: number of problems (default 10,000 for train, 500 otherwise). Held-out splits hold
            distinct problems; train problems are drawn with replacement.
        seed: which problems are drawn; the split membership does not depend on it.
        max_digits: operands lie in [0, 10**max_digits - 1].
        ops: the operators to draw from, any of ``+ - *``.
        style: ``bare`` or ``instruct`` prompt.
    """

    name = "arithmetic"
    default_verifier = "numeric"
    splits = ("train", "dev", "test")

    def __init__(
        self,
        path: str | None = None,
        split: str = "train",
        *,
        n: int | None = None,
        seed: int = 0,
        max_digits: int = 3,
        ops: str = "+",
        style: str = "instruct",
    ):
        if split not in SPLIT_BUCKETS:
            raise InvalidValueError(f"arithmetic: unknown split {split!r}; valid splits: {', '.join(SPLIT_BUCKETS)}")
        if style not in _STYLES:
            raise InvalidValueError(f"arithmetic: unknown style {style!r}; valid styles: {', '.join(_STYLES)}")
        bad_ops = set(ops) - set(_OPS)
        if not ops or bad_ops:
            raise InvalidValueError(f"arithmetic: ops must be a non-empty string of {' '.join(_OPS)}, got {ops!r}")
        if max_digits < 1:
            raise InvalidValueError("arithmetic: max_digits must be >= 1")
        self.split, self.seed, self.max_digits, self.ops, self.style = split, seed, max_digits, ops, style
        self._explicit_n = n is not None
        self.n = n if n is not None else (10_000 if split == "train" else 500)
        self._problems = self._draw()

    def _draw(self) -> list[Problem]:
        rng = random.Random(f"arithmetic/{self.seed}/{self.split}")
        hi = 10**self.max_digits - 1
        if (hi + 1) ** 2 * len(self.ops) <= _ENUMERATE_LIMIT:
            return self._draw_from_enumeration(rng, hi)
        def draw() -> tuple[int, str, int]:
            a, b, op = rng.randint(0, hi), rng.randint(0, hi), rng.choice(self.ops)
            return a, op, b

        held_out = self.split != "train"  # train problems are drawn with replacement
        return draw_distinct(
            self.n, draw, lambda index, c: self._problem(index, *c), keep=lambda c: split_of(*c) == self.split,
            key=(lambda c: c) if held_out else None, max_attempts=200 * self.n + 10_000,
            failure=f"arithmetic: cannot draw {self.n} distinct {self.split} problems with max_digits={self.max_digits}")

    def _draw_from_enumeration(self, rng: random.Random, hi: int) -> list[Problem]:
        """Small problem spaces: list the split's problems and draw from them. A held-out split
        without an explicit ``n`` holds all of them when there are fewer than the default."""
        pool = [(a, op, b) for op in self.ops for a in range(hi + 1) for b in range(hi + 1) if split_of(a, op, b) == self.split]
        if self.split == "train":
            drawn = [rng.choice(pool) for _ in range(self.n)]
        else:
            if self.n > len(pool) and self._explicit_n:
                raise InvalidValueError(f"arithmetic: only {len(pool)} distinct {self.split} problems exist with "
                                 f"max_digits={self.max_digits} and ops={self.ops!r}; asked for n={self.n}")
            rng.shuffle(pool)
            drawn = pool[: self.n]
        return [self._problem(i, a, op, b) for i, (a, op, b) in enumerate(drawn)]

    def _problem(self, index: int, a: int, op: str, b: int) -> Problem:
        answer = str(_OPS[op](a, b))
        if self.style == "bare":
            content = f"{a}{op}{b}="
        else:
            content = f"What is {a} {op} {b}? Reply with the final number only."
        return Problem(
            id=f"arithmetic/{self.split}/{index}",
            prompt=[{"role": "user", "content": content}],
            reference={"answer": answer},
            verifier=self.default_verifier,
            solution=answer,
            meta={"a": a, "b": b, "op": op},
        )

