"""``countdown``: reach a target number from given numbers with + - * / (scored by the ``countdown`` verifier).

Two sources:

* **generated** (``train`` and ``dev`` by default; any split with ``source="generate"``): seeded
  draws of ``num_numbers`` numbers in ``[min_number, max_number]``; the target is the value of a
  random expression tree over *all* of them (random pairing, random operator) that lands on an
  integer in ``[min_target, max_target]``, so every problem is solvable whether the verifier
  asks for "at most once" or "exactly once", and that tree is the gold solution. The split of a
  problem is decided by a stable hash of its sorted numbers, independent of the seed: 10% test,
  5% dev, the rest train, so held-out number sets never appear in training. The number sets of
  the 256-problem file are never generated (:mod:`tasks._countdown_cd3`).
* **file** (``test`` by default; any split with ``source="file"`` or an explicit ``path``): the
  256-problem three-number set in ``../shared/data/countdown`` (``{"input": "30,100,93",
  "output": "23"}``), or any file / hub dataset with ``nums``/``numbers``/``input`` and
  ``target``/``output`` columns (e.g. ``Jiayi-Pan/Countdown-Tasks-3to4``). Every problem is
  solved on load (up to :data:`SOLVE_MAX_NUMBERS` numbers): an unsolvable row is bad data.

``Problem.solution`` is a solver's expression in ``<answer>`` tags; the reference is
``{"numbers": [...], "target": int}`` plus ``"use_all": True`` when the suite asks for every number.
"""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Iterable

from rlvr.tasks._countdown_cd3 import CD3_TEST_NUMBER_SETS
from rlvr.tasks.base import Problem, draw_distinct, hash_split
from rlvr.tasks.loading import DataError, LoadedSuite, Record, instruction_text, read_records, resolve_source
from rlvr.tasks.registry import register_task
from rlvr.verifiers.errors import InvalidValueError

INSTRUCTION = ("Show your reasoning, then give only the final expression inside <answer></answer> tags, "
               "for example <answer>(1 + 2) * 3</answer>.")
SOLVE_MAX_NUMBERS = 5  # the exhaustive solver's cost grows ~20x per extra number
GENERATE_MAX_NUMBERS = 8
TREE_TRIES = 32  # random expression trees tried per number set before drawing new numbers
_SOURCES = ("auto", "generate", "file")

Expr = tuple[str, int]  # (text, precedence: 1 for + -, 2 for * /, 3 for a number)


# --------------------------------------------------------------------------- the solver

def _combine(op: str, a: Expr, b: Expr) -> Expr:
    """``a op b`` with only the parentheses precedence requires (exact rationals: * and / associate)."""
    prec = 1 if op in "+-" else 2
    left = a[0] if a[1] >= prec else f"({a[0]})"
    right = b[0] if b[1] > prec or (b[1] == prec and op in "+*") else f"({b[0]})"
    return f"{left} {op} {right}", prec


def reachable(numbers: Iterable[int], memo: dict | None = None) -> dict[Fraction, Expr]:
    """Every value an expression using each of ``numbers`` exactly once reaches, with one such expression.

    Splits the multiset into two non-empty parts in every way, combines their reachable values
    with the four operators (both orders for - and /), memoised on the sorted sub-multiset.
    """
    memo = {} if memo is None else memo
    key = tuple(sorted(numbers))
    if key in memo:
        return memo[key]
    if len(key) == 1:
        memo[key] = {Fraction(key[0]): (str(key[0]), 3)}
        return memo[key]
    out: dict[Fraction, Expr] = {}
    n = len(key)
    for mask in range(1, 2 ** n - 1):
        if not mask & 1:  # the part holding element 0 is the left one: each unordered split once
            continue
        left = reachable([key[i] for i in range(n) if mask >> i & 1], memo)
        right = reachable([key[i] for i in range(n) if not mask >> i & 1], memo)
        for a, ea in left.items():
            for b, eb in right.items():
                out.setdefault(a + b, _combine("+", ea, eb))
                out.setdefault(a * b, _combine("*", ea, eb))
                out.setdefault(a - b, _combine("-", ea, eb))
                out.setdefault(b - a, _combine("-", eb, ea))
                if b:
                    out.setdefault(a / b, _combine("/", ea, eb))
                if a:
                    out.setdefault(b / a, _combine("/", eb, ea))
    memo[key] = out
    return out


def solve(numbers: list[int], target: int, use_all: bool = False) -> str | None:
    """An expression reaching ``target`` with each number at most once (exactly once with
    ``use_all``), preferring ones that use every number; None when there is none."""
    memo: dict = {}
    n = len(numbers)
    masks = [(1 << n) - 1] if use_all else sorted(range(1, 1 << n), key=lambda m: -bin(m).count("1"))
    for mask in masks:
        found = reachable([numbers[i] for i in range(n) if mask >> i & 1], memo).get(Fraction(target))
        if found is not None:
            return found[0]
    return None


def random_tree(numbers: list[int], rng: random.Random) -> tuple[Fraction, str]:
    """The value and text of a random expression using every number once: pair two random
    sub-expressions with a random operator until one is left (every tree shape can come out)."""
    items: list[tuple[Fraction, Expr]] = [(Fraction(x), (str(x), 3)) for x in numbers]
    while len(items) > 1:
        (a, ea) = items.pop(rng.randrange(len(items)))
        (b, eb) = items.pop(rng.randrange(len(items)))
        op = "+-*/"[rng.randrange(4)]
        if op == "/" and b == 0:
            op = "*"
        value = a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b
        items.append((value, _combine(op, ea, eb)))
    value, (text, _) = items[0]
    return value, text


def split_of(numbers: Iterable[int]) -> str:
    """The split of a number set, from a stable hash of its sorted numbers (independent of any seed)."""
    return hash_split(",".join(str(x) for x in sorted(numbers)))


# --------------------------------------------------------------------------- the suite

@register_task("countdown")
class Countdown(LoadedSuite):
    """Countdown number puzzles (see the module docstring for the two sources).

    Args:
        path: a data file / folder / hub name (implies ``source="file"``); None: generate, or for
            ``test`` read ``countdown/countdown_cd3_test.jsonl`` from the project data.
        split: ``train`` | ``dev`` | ``test``.
        source: ``auto`` (file for ``test`` or when ``path`` is given, else generated),
            ``generate`` or ``file``.
        n: generated problems (default 10,000 for train, 500 otherwise). Distinct number sets.
        seed: which problems are drawn (split membership does not depend on it).
        num_numbers: numbers per generated problem (2 to 8).
        min_number, max_number: range of the generated numbers.
        min_target, max_target: range of the generated targets.
        use_all: require every number exactly once (prompt and reference say so).
        instruction: the answer-format instruction; system_prompt: an optional system message.
        on_error: ``raise`` or ``skip`` bad rows of a file (counted in ``skipped``).
        hub_split: the hub split to read (default ``train``).
    """

    name = "countdown"
    default_verifier = "countdown"
    splits = ("train", "dev", "test")

    def __init__(self, path: str | None = None, split: str = "train", *, source: str = "auto", n: int | None = None,
                 seed: int = 0, num_numbers: int = 3, min_number: int = 1, max_number: int = 100, min_target: int = 1,
                 max_target: int = 100, use_all: bool = False, instruction: str = INSTRUCTION,
                 system_prompt: str | None = None, on_error: str = "raise", hub_split: str = "train"):
        self._check_split(split)
        if source not in _SOURCES:
            raise InvalidValueError(f"countdown: source must be one of {', '.join(_SOURCES)}, got {source!r}")
        if source == "auto":
            source = "file" if (path is not None or split == "test") else "generate"
        self.split, self.source_kind, self.use_all = split, source, use_all
        self.instruction, self.system_prompt = instruction_text(instruction), system_prompt
        if source == "file":
            self.source = resolve_source(self.name, path, ("countdown/countdown_cd3_test.jsonl", "countdown_cd3_test.jsonl"),
                                         "Jiayi-Pan/Countdown-Tasks-3to4")
            self._load(read_records(self.source, hub_split=hub_split), self._from_record, on_error)
            return
        if not 2 <= num_numbers <= GENERATE_MAX_NUMBERS:
            raise InvalidValueError(f"countdown: num_numbers must be in 2..{GENERATE_MAX_NUMBERS}, got {num_numbers}")
        if not (0 <= min_number <= max_number and min_target <= max_target):
            raise InvalidValueError("countdown: need 0 <= min_number <= max_number and min_target <= max_target")
        self.source = "generated"
        self.n = n if n is not None else (10_000 if split == "train" else 500)
        self.skipped, self.errors = 0, []
        self._problems = self._generate(seed, num_numbers, min_number, max_number, min_target, max_target)

    def _generate(self, seed: int, count: int, lo: int, hi: int, tlo: int, thi: int) -> list[Problem]:
        rng = random.Random(f"countdown/{seed}/{self.split}")

        def build(index: int, numbers: list[int]) -> Problem | None:
            for _ in range(TREE_TRIES):
                value, text = random_tree(numbers, rng)
                if value.denominator == 1 and tlo <= value <= thi:
                    return self._problem(index, numbers, int(value), text)
            return None  # no tree reached a target in range: the number set is left out

        return draw_distinct(
            self.n, lambda: [rng.randint(lo, hi) for _ in range(count)], build,
            keep=lambda numbers: (split_of(numbers) == self.split
                                  and ",".join(map(str, sorted(numbers))) not in CD3_TEST_NUMBER_SETS),
            key=lambda numbers: tuple(sorted(numbers)), max_attempts=50 * self.n + 10_000,
            failure=f"countdown: cannot draw {self.n} distinct {self.split} problems from {count} numbers in "
                    f"[{lo}, {hi}] with targets in [{tlo}, {thi}]")

    def _from_record(self, record: Record) -> Problem:
        raw = record.get(("nums", "numbers", "input"), kind=(str, list))
        name = next(k for k in ("nums", "numbers", "input") if record.data.get(k) is not None)
        try:
            items = raw.split(",") if isinstance(raw, str) else list(raw)
            numbers = [int(str(x).strip()) for x in items]
        except ValueError:
            raise DataError(record.where, name, f"not a list of integers: {str(raw)[:60]!r}") from None
        if not numbers:
            raise DataError(record.where, name, "no numbers")
        text = record.get(("target", "output"))
        try:
            target = int(text)
        except ValueError:
            raise DataError(record.where, "target" if "target" in record.data else "output",
                            f"not an integer: {text[:40]!r}") from None
        expression = None
        if len(numbers) <= SOLVE_MAX_NUMBERS:
            expression = solve(numbers, target, self.use_all)
            if expression is None:
                rule = "every number exactly once" if self.use_all else "each number at most once"
                raise DataError(record.where, "target", f"no expression using {rule} of {numbers} reaches {target}")
        return self._problem(record.index, numbers, target, expression, where=record.where)

    def _problem(self, index: int, numbers: list[int], target: int, expression: str | None,
                 where: str | None = None) -> Problem:
        rule = "every number exactly once" if self.use_all else "each number at most once"
        user = (f"Using the numbers {numbers}, write an arithmetic expression that equals {target}. "
                f"You may use +, -, *, / and parentheses, and {rule}.")
        if self.instruction:
            user += f"\n\n{self.instruction}"
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        reference: dict = {"numbers": list(numbers), "target": target}
        if self.use_all:
            reference["use_all"] = True
        return Problem(
            id=f"countdown/{self.split}/{index}",
            prompt=messages + [{"role": "user", "content": user}],
            reference=reference,
            verifier=self.default_verifier,
            solution=f"<answer>{expression}</answer>" if expression is not None else None,
            meta={"source": where or "generated"},
        )
