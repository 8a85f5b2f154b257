"""A process reward model (PRM) in training: every step of every sample scored, in-process, in batches.

For one batch of groups (after the verifiers ran, as a learned reward model is scored):

    ends_i   = step ends of completion i      (the PRM's separator, on the tokens as generated)
    p_i      = PRM(prompt_i, completion_i)[ends_i]        probabilities that each step is right, [K_i]

then, by ``process_reward.use``:

* ``token`` (PPO's GAE, and REINFORCE++'s return-to-go: estimators that take a reward per token): the
  verifier's score stays the sequence's terminal reward, and step k adds ``coef * r_k`` on its last
  token (the result's ``steps``, :class:`~rlvr.rollout.scoring.StepScores`; laid out by
  :func:`step_reward_tensor`, read by ``rlvr/recipes/ppo.py`` and, for ``advantage: reinforce_pp``,
  ``rlvr/recipes/grpo.py``), ``r_k`` by ``step_reward``
  (:data:`rlvr.algorithms.process_rewards.STEP_REWARDS`): ``potential`` (the default: potential-based
  shaping, the sum is ``-baseline`` for every solution, so the PRM moves credit and cannot be gamed),
  ``delta`` (sums to ``p_K - baseline``) or ``shifted`` (``p_k - baseline``, whose sum grows with the
  number of steps: a policy learns to write fewer steps, or more).
* ``aggregate`` (the group estimators grpo, dr_grpo, rloo: one score per sample): ``a_i = min | last | mean (p_i)``
  and the reward is ``outcome_i + coef * a_i`` (``add``) or ``coef * a_i`` (``replace``). The
  verifier's rewards move to ``group.gold`` (accuracy and ``gold/`` are measured on them).

The ids are the trainer's own (the prompt as encoded, the completion as generated, with its EOS), so
the PRM must share the policy's tokenizer, as ``rlvr train-prm`` from the policy's base model makes it.
Metrics: ``prm/step_score`` (mean p over steps), ``prm/steps`` (steps per sample), ``prm/aggregate``
(mean of the per-sample aggregate), ``prm/wrong_step_frac`` (steps with p < 0.5), ``prm/no_step_frac``.
"""

from __future__ import annotations

from typing import Sequence

import torch

from rlvr.algorithms.process_rewards import STEP_REWARDS, aggregate_step_scores, step_token_rewards
from rlvr.modeling.prm import ProcessRewardModel, completion_step_ends
from rlvr.rollout.groups import Group
from rlvr.rollout.reward_scoring import check_same_tokenizer
from rlvr.rollout.scoring import ScoredGroups, Scorer, StepScores
from rlvr.verifiers.base import Reward

__all__ = ["ProcessRewardScorer", "StepScores", "build_process_scorer", "step_metrics", "step_reward_tensor",
           "step_rewards"]


class ProcessRewardScorer(Scorer):
    """A :class:`~rlvr.modeling.prm.ProcessRewardModel` turned into training rewards (module docstring).

    ``score(groups)``: token level, the verifier's rewards stay the rewards and each completion's
    :class:`StepScores` carry its step rewards; aggregate, the combined rewards replace them (the verifier's
    become the gold). It keeps no state across batches (a frozen model: nothing to checkpoint), and
    :meth:`metrics` are the last batch's ``prm/``.
    """

    def __init__(self, config, *, token_level: bool, device: str, dtype: str, tokenizer=None):
        self.config = config
        self.token_level = token_level
        self.prm = ProcessRewardModel(config.path, device=device, dtype=dtype, batch_size=config.batch_size)
        if tokenizer is not None:
            check_same_tokenizer(tokenizer, self.prm.tokenizer, config.path, field="process_reward.path",
                                 trained_by="`rlvr train-prm`")
        self.separator = config.separator if config.separator is not None else self.prm.separator
        self._metrics: dict[str, float] = {}

    def describe(self) -> str:
        section = self.config
        if self.token_level:
            how = (f"each step's reward {section.coef:g} * {section.step_reward} (baseline {section.baseline:g}) on its last token, plus "
                   "the verifier's score at the end")
        else:
            base = "the verifier's score + " if section.combine == "add" else ""
            how = f"{base}{section.coef:g} * {section.aggregate}(step scores) per sample"
        return f"process reward: the PRM {section.path} (steps split at {self.separator!r}): {how}"

    def score(self, groups: Sequence[Group]) -> ScoredGroups:
        """Score every step of every completion of ``groups`` (module docstring)."""
        section = self.config
        prompts = [g.prompt_ids for g in groups for _ in g.completions]
        completions = [list(comp.token_ids) for g in groups for comp in g.completions]
        ends = [completion_step_ends(self.prm.tokenizer, ids, self.separator) for ids in completions]
        scores = self.prm.score_steps(prompts, completions, ends)
        aggregate = aggregate_step_scores(scores, section.aggregate)  # [N]
        self._metrics = step_metrics(scores, aggregate)
        starts = [0]
        for g in groups:
            starts.append(starts[-1] + len(g.completions))
        rows = [range(a, b) for a, b in zip(starts, starts[1:])]  # each group's completions, in the flat lists
        outcome = [list(g.rewards) for g in groups]
        if self.token_level:
            steps = [[StepScores(ends[k], scores[k], step_rewards(scores[k], section)) for k in row] for row in rows]
            return ScoredGroups(rewards=outcome, steps=steps)
        rewards = [[self._combined(reward, float(aggregate[k])) for reward, k in zip(verified, row)]
                   for verified, row in zip(outcome, rows)]
        return ScoredGroups(rewards=rewards, gold=outcome)

    def metrics(self) -> dict[str, float]:
        """The last batch's ``prm/`` metrics (:func:`step_metrics`)."""
        return dict(self._metrics)

    def _combined(self, outcome: Reward, aggregate: float) -> Reward:
        """``outcome + coef * aggregate`` (add; an abstaining verifier adds nothing) or ``coef * aggregate``;
        a sample the verifier failed on stays failed (masked, as verifier.on_failure says)."""
        section = self.config
        components = {"prm": aggregate, **({"outcome": outcome.score} if outcome.status == "ok" else {})}
        if section.combine == "add" and outcome.failed:
            return Reward(0.0, status=outcome.status, components=components, info=outcome.info)
        base = outcome.score if (section.combine == "add" and outcome.status == "ok") else 0.0
        return Reward(base + section.coef * aggregate, components=components)


def step_metrics(scores: Sequence[Sequence[float]], aggregate: torch.Tensor) -> dict[str, float]:
    """``prm/`` metrics of one batch (see the module docstring)."""
    flat = [p for row in scores for p in row]
    n = max(1, len(scores))
    return {
        "prm/step_score": sum(flat) / len(flat) if flat else 0.0,
        "prm/steps": len(flat) / n,
        "prm/aggregate": float(aggregate.mean()) if len(aggregate) else 0.0,
        "prm/wrong_step_frac": sum(p < 0.5 for p in flat) / len(flat) if flat else 0.0,
        "prm/no_step_frac": sum(not row for row in scores) / n,
    }


def step_rewards(scores: Sequence[float], config) -> list[float]:
    """One completion's step rewards ``coef * r_k``: ``r`` by ``config.step_reward`` (potential, delta or
    shifted: :data:`rlvr.algorithms.process_rewards.STEP_REWARDS`) from its step ``scores`` and ``config.baseline``."""
    return [config.coef * r for r in STEP_REWARDS[config.step_reward](list(scores), config.baseline)]


def step_reward_tensor(groups: Sequence[Group], length: int) -> torch.Tensor:
    """``[N, length]``: each step's reward (:attr:`StepScores.rewards`, ``coef * r_k``) at the step's last
    token of each completion, in the order :func:`rlvr.rollout.batch.collate` lays the groups out; zero elsewhere."""
    steps = [s for g in groups for s in g.steps]
    return step_token_rewards([s.rewards for s in steps], [s.ends for s in steps], length)


def build_process_scorer(config, device, tokenizer) -> ProcessRewardScorer | None:
    """The run's :class:`ProcessRewardScorer`, or None when ``config.process_reward`` is not set."""
    from rlvr.config import CRITIC_PRESETS

    prm = config.process_reward
    if prm is None:
        return None
    takes_tokens = config.algorithm.preset in CRITIC_PRESETS or config.algorithm.advantage == "reinforce_pp"
    token_level = prm.use == "token" or (prm.use == "auto" and takes_tokens)
    return ProcessRewardScorer(prm, token_level=token_level, device=prm.device or str(device),
                               dtype=prm.dtype or config.model.dtype, tokenizer=tokenizer)
