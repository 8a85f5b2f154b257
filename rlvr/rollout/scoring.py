"""The contract of a learned scorer: a model that scores verified groups in-process, after the verifiers ran.

Two scorers implement it: :class:`rlvr.rollout.reward_scoring.RewardScorer` (a reward model, or an ensemble
of them) and :class:`rlvr.rollout.process_scoring.ProcessRewardScorer` (a process reward model). A run has
at most one (the config refuses both at once). Per batch of groups::

    groups (rewards = the verifier's)  --scorer.score(groups)-->  ScoredGroups(rewards, gold, steps)
                                       --ScoredGroups.apply(groups)-->  group.rewards, group.gold, group.steps

* ``rewards``: what training optimises, one sequence-level :class:`Reward` per completion (the same type a
  verifier returns: advantages and metrics downstream do not change);
* ``gold``: the verifier's rewards, when ``rewards`` replaced them (logged as ``gold/``, never optimised);
  None when ``rewards`` are the verifier's own (a token-level PRM keeps them as the terminal reward);
* ``steps``: a token-level scorer's per-step rewards (:class:`StepScores`), which the recipes lay on each
  step's last token (:func:`rlvr.rollout.process_scoring.step_reward_tensor`); None otherwise.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from rlvr.verifiers.base import Reward

if TYPE_CHECKING:
    from rlvr.rollout.groups import Group


@dataclass
class StepScores:
    """One completion's steps: the index of each step's last token, the PRM's probability that the step is
    right, and the reward trained on that token (``coef * r_k``, by ``process_reward.step_reward``)."""

    ends: list[int]
    scores: list[float]
    rewards: list[float]


@dataclass
class ScoredGroups:
    """What a :class:`Scorer` made of a batch of groups, per group and per completion (module docstring)."""

    rewards: list[list[Reward]]
    gold: list[list[Reward]] | None = None
    steps: list[list[StepScores]] | None = None

    def apply(self, groups: Sequence["Group"]) -> None:
        """Write this result into ``groups`` (the ones it was scored from, in the same order)."""
        for k, group in enumerate(groups):
            group.rewards = self.rewards[k]
            group.gold = self.gold[k] if self.gold is not None else None
            group.steps = self.steps[k] if self.steps is not None else None


class Scorer(ABC):
    """A learned scorer of verified groups (see the module docstring).

    Attributes:
        token_level: whether :meth:`score` returns per-step rewards (``ScoredGroups.steps``) that the
            recipe's per-token estimator (PPO's GAE, REINFORCE++) adds on each step's last token.
    """

    token_level: bool = False

    @abstractmethod
    def describe(self) -> str:
        """One line for the start of a run: what the training reward is."""

    @abstractmethod
    def score(self, groups: Sequence["Group"]) -> ScoredGroups:
        """Score ``groups``, whose ``rewards`` are the verifier's; the groups are left as they are."""

    def metrics(self) -> dict[str, float]:
        """The scorer's own metrics of the last batch it scored (e.g. ``prm/``). The default is none: the
        metrics of a sequence-level score (``proxy/``, ``gold/``) come from the groups themselves."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the scorer (e.g. running normalisation). The default is nothing: a
        scorer whose scores are a pure function of its frozen model keeps no state across batches."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; by default there is nothing to restore."""
