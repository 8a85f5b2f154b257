"""The task contract: a :class:`Problem` is a chat prompt, a reference and the name of its verifier.

``tasks/`` never needs a tokenizer: prompts are lists of chat messages and the trainer applies the
model's chat template.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterator, Optional, Protocol, TypeVar, runtime_checkable

from rlvr.verifiers.errors import InvalidValueError

T = TypeVar("T")
C = TypeVar("C")

#: The generated suites' splits, as percent ranges of a stable hash of each problem's text.
SPLIT_BUCKETS = {"test": (0, 10), "dev": (10, 15), "train": (15, 100)}


@dataclass(frozen=True)
class Problem:
    """One problem of a task suite.

    Example::

        from rlvr.tasks import Problem
        from rlvr.verifiers import get_verifier

        problem = Problem(
            id="demo/0",                                              # unique within its suite
            prompt=[{"role": "user", "content": "What is 6 * 7? Put the answer in \\\\boxed{}."}],
            reference={"answer": "42"},                               # what the verifier checks against
            verifier="math",                                          # a registered verifier's name
            solution="6 * 7 = 42, so the answer is \\\\boxed{42}.",      # optional: a gold completion (SFT)
        )
        reward = get_verifier(problem.verifier).score(problem.solution, problem.reference)
        assert reward.score == 1.0

    Attributes:
        id: stable identifier, unique within its suite (e.g. ``"gsm8k/test/17"``).
        prompt: chat messages, ``[{"role": "system"|"user"|..., "content": str}, ...]``.
        reference: what the verifier checks against, e.g. ``{"answer": "42"}`` or ``{"tests": [...]}``.
        verifier: name of the registered verifier that scores completions of this problem.
        solution: a gold completion for supervised fine-tuning, where the suite has one.
        environment: name of the registered environment that answers the model between its turns
            (a multi-turn episode: ``rlvr.tasks.environments``); None: one completion, scored once.
        meta: free-form extras (difficulty, source, ...); never read by the trainer.
        suite: the loaded suite it belongs to, unique within a run (``train/<name>`` or ``eval/<name>``, set
            by the trainer's loader: :func:`rlvr.rollout.suites.load_suite`); "" for a problem built by
            hand. Not part of equality: the same problem in two suites compares equal.
    """

    id: str
    prompt: list[dict[str, str]]
    reference: dict[str, Any]
    verifier: str
    solution: str | None = None
    environment: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    suite: str = field(default="", compare=False)

    @property
    def key(self) -> tuple[str, str]:
        """``(suite, id)``: names this problem stably across copies, pickling and processes (ids are
        unique within a suite only: two suites, e.g. two ``custom`` files, may both hold ``custom/train/0``).
        What the trainer keeps per problem (its chat template, its tools, its place in a suite) is keyed by it."""
        return self.suite, self.id


def hash_split(text: str) -> str:
    """The split a problem written ``text`` belongs to, from a stable hash (no seed, no run state): the
    same text is in the same split for every seed, so held-out problems never leak into training."""
    bucket = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big") % 100
    return next(name for name, (lo, hi) in SPLIT_BUCKETS.items() if lo <= bucket < hi)


def draw_distinct(n: int, draw: Callable[[], C], build: Callable[[int, C], Optional[T]], *,
                  keep: Callable[[C], bool] = lambda _: True, key: Optional[Callable[[C], Hashable]] = None,
                  max_attempts: int, failure: str) -> list[T]:
    """``n`` items made by a generated suite: each candidate is ``draw()``, left out unless ``keep`` (e.g.
    of this split), and with ``key`` left out when an earlier candidate had its key; ``build(index,
    candidate)`` makes the item, or None to drop the candidate (its key stays used). Raises
    :class:`InvalidValueError` with ``failure`` after ``max_attempts`` draws (a space too small)."""
    seen: set[Hashable] = set()
    items: list[T] = []
    attempts = 0
    while len(items) < n:
        attempts += 1
        if attempts > max_attempts:
            raise InvalidValueError(failure)
        candidate = draw()
        if not keep(candidate):
            continue
        if key is not None:
            k = key(candidate)
            if k in seen:
                continue
            seen.add(k)
        item = build(len(items), candidate)
        if item is not None:
            items.append(item)
    return items


class ProblemList:
    """``len``, iteration and indexing over ``self._problems``, for suites that build their
    problems up front."""

    _problems: list[Problem]

    def __len__(self) -> int:
        return len(self._problems)

    def __iter__(self) -> Iterator[Problem]:
        return iter(self._problems)

    def __getitem__(self, index: int) -> Problem:
        return self._problems[index]


@runtime_checkable
class TaskSuite(Protocol):
    """An iterable of problems with a name and a default verifier.

    A suite is built as ``factory(path=..., split=..., **options)`` (``get_task`` passes ``path`` and
    ``split`` to every suite, so take both even when unused); ``splits`` lets ``rlvr tasks list``
    count each split.

    Example::

        from rlvr.tasks import Problem, get_task, register_task

        @register_task("squares")
        class Squares:
            name = "squares"
            default_verifier = "numeric"
            splits = ("train", "test")

            def __init__(self, path=None, split="train", n=100):
                self.items = range(n) if split == "train" else range(1000, 1000 + n)

            def __len__(self):
                return len(self.items)

            def __iter__(self):
                for k in self.items:
                    yield Problem(id=f"squares/{k}", prompt=[{"role": "user", "content": f"{k}^2="}],
                                  reference={"answer": str(k * k)}, verifier="numeric")

        suite = get_task("squares", split="test", n=3)
        assert len(suite) == 3 and next(iter(suite)).reference == {"answer": "1000000"}
    """

    name: str
    default_verifier: str

    def __iter__(self) -> Iterator[Problem]: ...

    def __len__(self) -> int: ...
