"""``reasoning_gym``: any procedural dataset of the `reasoning-gym` library as a suite.

    pip install reasoning-gym
    get_task("reasoning_gym", dataset="leg_counting", split="train", n=2000, seed=0)
    get_task("reasoning_gym", dataset="chain_sum", split="test", config={"min_terms": 3})

The library is an optional dependency, imported only when this suite (or its verifier) is used.

Splits: reasoning-gym generates item ``i`` of a dataset from ``(seed, i)``; a split is made by
keeping only the items whose question text hashes into the split's bucket (10% test, 5% dev,
85% train, as for ``arithmetic``), so ``train`` and ``test`` never share a question, for any seed.

Prompt: the library's default system prompt (answer inside ``<answer></answer>`` tags) and the
item's question as the user message. Reference: ``{"dataset", "config", "entry"}``: the item
itself, so that the ``reasoning_gym`` verifier can call the dataset's own ``score_answer`` (which
may give partial credit, and for some datasets a small credit, e.g. 0.01, for any answer).
``Problem.solution`` is the item's answer in tags, or None for the datasets whose items have no
single answer and are scored by checking validity (``boxnet``, ``graph_color``,
``propositional_logic``, ``rubiks_cube``, ``rush_hour`` in reasoning-gym 0.1.25).
"""

from __future__ import annotations

from typing import Any

from rlvr.tasks.base import SPLIT_BUCKETS, Problem, hash_split
from rlvr.tasks.loading import LoadedSuite
from rlvr.tasks.registry import register_task
from rlvr.verifiers.reasoning_gym import reasoning_gym_library
from rlvr.verifiers.errors import InvalidValueError

INSTALL_HINT = "the reasoning_gym suite needs the reasoning-gym library: pip install reasoning-gym"
# reasoning-gym seeds item i with Random(seed + i): seeds 0 and 1 would share all but one item, so
# our seed s becomes the library seed s * SEED_STRIDE (no run draws that many items)
SEED_STRIDE = 10**9


def _library():
    return reasoning_gym_library(INSTALL_HINT)


def split_of(question: str) -> str:
    """The split of a generated question, from a stable hash of its text."""
    return hash_split(question)


@register_task("reasoning_gym")
class ReasoningGym(LoadedSuite):
    """One reasoning-gym dataset (see the module docstring).

    Args:
        path: unused (the data is generated).
        split: ``train`` | ``dev`` | ``test`` (disjoint by question).
        dataset: the reasoning-gym dataset name (required; an unknown name lists the valid ones).
        n: problems (default 10,000 for train, 500 otherwise).
        seed: the generator seed (the library gets ``seed * 10**9``: its items are seeded with
            ``seed + index``, so neighbouring library seeds would give the same items).
        config: the dataset's own options (its config dataclass fields, e.g. difficulty ranges).
        system_prompt: the system message (None: the library's default answer-tag prompt;
            "" for none).
    """

    name = "reasoning_gym"
    default_verifier = "reasoning_gym"
    splits = ("train", "dev", "test")

    def __init__(self, path: str | None = None, split: str = "train", *, dataset: str | None = None,
                 n: int | None = None, seed: int = 0, config: dict[str, Any] | None = None,
                 system_prompt: str | None = None):
        self._check_split(split)
        rg = _library()
        from reasoning_gym.factory import DATASETS

        if not dataset:
            raise InvalidValueError("reasoning_gym: pass dataset=<name>; available: " + ", ".join(sorted(DATASETS)))
        if dataset not in DATASETS:
            raise InvalidValueError(f"reasoning_gym: unknown dataset {dataset!r}; available: {', '.join(sorted(DATASETS))}")
        if system_prompt is None:
            from reasoning_gym.utils import SYSTEM_PROMPTS

            system_prompt = SYSTEM_PROMPTS["default"]
        self.split, self.dataset, self.seed, self.config = split, dataset, seed, dict(config or {})
        self.n = n if n is not None else (10_000 if split == "train" else 500)
        self.skipped, self.errors = 0, []
        # enough items for the split's share of the hash space, with room for duplicates
        lo, hi = SPLIT_BUCKETS[split]
        budget = int(self.n * 100 / (hi - lo) * 1.5) + 1000
        source = rg.create_dataset(dataset, **{**self.config, "seed": seed * SEED_STRIDE, "size": budget})
        system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        problems: list[Problem] = []
        seen: set[str] = set()
        for index in range(budget):
            if len(problems) >= self.n:
                break
            entry = source[index]
            question = entry["question"]
            if question in seen or split_of(question) != split:
                continue
            seen.add(question)
            answer = entry.get("answer")
            problems.append(Problem(
                id=f"reasoning_gym/{dataset}/{split}/{len(problems)}",
                prompt=system + [{"role": "user", "content": question}],
                # the entry as generated: scorers compare metadata (tuples, grids) by type
                reference={"dataset": dataset, "config": dict(self.config), "entry": entry},
                verifier=self.default_verifier,
                solution=f"<answer>{answer}</answer>" if answer is not None else None,
                meta={"dataset": dataset, "index": index, "library_seed": seed * SEED_STRIDE},
            ))
        if len(problems) < self.n:
            raise InvalidValueError(f"reasoning_gym: {dataset} gave only {len(problems)} distinct {split} problems in "
                             f"{budget} draws (asked for n={self.n}); its problem space may be small: lower n")
        self._problems = problems
