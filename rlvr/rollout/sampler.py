"""Which problems a step trains on: drawn from the training suites by weight, epoch by epoch, from
a position a checkpoint saves and restores; a data-parallel rank's share of them; and the examples
of an offline recipe's optimizer step."""

from __future__ import annotations

import random
from typing import Any, Sequence

import torch

from rlvr.tasks.base import Problem


class ProblemSampler:
    """Draws problems from several suites with sampling weights, epoch by epoch without replacement
    inside each suite, from a position that can be saved and restored (resume).

    Example::

        from rlvr.tasks import get_task

        problems = list(get_task("arithmetic", n=100))
        sampler = ProblemSampler({"arithmetic": problems}, {"arithmetic": 1.0}, seed=0)
        batch = sampler.next(32)          # [(suite name, Problem), ...]
        state = sampler.state_dict()      # goes into the checkpoint
        assert len(batch) == 32 and batch[0][0] == "arithmetic"
    """

    def __init__(self, suites: dict[str, Sequence[Problem]], weights: dict[str, float], seed: int = 0):
        empty = [name for name, problems in suites.items() if len(problems) == 0]
        if empty:
            raise ValueError(f"training suite(s) {empty} hold no problems")
        self.suites = {name: list(problems) for name, problems in suites.items()}
        self.names = list(self.suites)
        self.weights = [weights[name] for name in self.names]
        self.seed = seed
        self._rng = random.Random(f"sampler/{seed}")
        self._epoch = {name: 0 for name in self.names}
        self._position = {name: 0 for name in self.names}
        self._order = {name: self._permutation(name, 0) for name in self.names}

    def _permutation(self, name: str, epoch: int) -> list[int]:
        order = list(range(len(self.suites[name])))
        random.Random(f"sampler/{self.seed}/{name}/{epoch}").shuffle(order)
        return order

    def _take(self, name: str) -> Problem:
        if self._position[name] == len(self._order[name]):
            self._epoch[name] += 1
            self._position[name] = 0
            self._order[name] = self._permutation(name, self._epoch[name])
        index = self._order[name][self._position[name]]
        self._position[name] += 1
        return self.suites[name][index]

    def next(self, k: int) -> list[tuple[str, Problem]]:
        """The next ``k`` problems with the name of the suite each came from."""
        if len(self.names) == 1:
            names = self.names * k
        else:
            names = self._rng.choices(self.names, weights=self.weights, k=k)
        return [(name, self._take(name)) for name in names]

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self._rng.getstate(), "epoch": dict(self._epoch), "position": dict(self._position)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rng.setstate(state["rng"])
        self._epoch = dict(state["epoch"])
        self._position = dict(state["position"])
        self._order = {name: self._permutation(name, self._epoch[name]) for name in self.names}


class RankSampler:
    """One rank's share of a data-parallel run's problems: every rank draws the same ``k * world``
    problems from its own copy of the same :class:`ProblemSampler` (same seed, same position) and
    keeps every ``world``-th one from its rank on, so the ranks' whole groups partition the step's
    problems without any communication. On one process it is the sampler itself.

    With dynamic sampling, a rank's refill rounds draw again by themselves, so the ranks' positions
    may drift apart (still a valid draw for each rank); checkpoints therefore keep every rank's state.
    """

    def __init__(self, sampler: ProblemSampler, rank: int = 0, world_size: int = 1):
        self.sampler, self.rank, self.world_size = sampler, rank, world_size

    def next(self, k: int) -> list[tuple[str, Problem]]:
        return self.sampler.next(k * self.world_size)[self.rank :: self.world_size]

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)


def batch_indices(step: int, batch_size: int, n: int, seed: int) -> list[int]:
    """The pairs of optimizer step ``step`` (1-based): consecutive slices of a fresh shuffle per epoch,
    a pure function of the step, so a resumed run continues with the same data."""
    orders: dict[int, list[int]] = {}
    out = []
    for position in range((step - 1) * batch_size, step * batch_size):
        epoch, i = divmod(position, n)
        if epoch not in orders:
            orders[epoch] = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist()
        out.append(orders[epoch][i])
    return out


class ShuffledBatches:
    """Indices of a fixed set of ``n`` examples in shuffled passes, ``k`` at a time (SFT's batches), from a
    position a checkpoint saves: ``next(k)`` pops from the end of the current pass's order and starts a
    new shuffled pass when it runs out, mid-batch included."""

    def __init__(self, n: int, seed: int):
        self.n = n
        self._rng = random.Random(seed)
        self._order: list[int] = []

    def next(self, k: int) -> list[int]:
        picked = []
        while len(picked) < k:
            if not self._order:
                self._order = list(range(self.n))
                self._rng.shuffle(self._order)
            picked.append(self._order.pop())
        return picked

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self._rng.getstate(), "order": list(self._order)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rng.setstate(tuple(state["rng"]) if isinstance(state["rng"], list) else state["rng"])
        self._order = list(state["order"])
