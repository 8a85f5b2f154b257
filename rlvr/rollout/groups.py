"""Problems -> groups of completions -> rewards.

    collect_groups(...)    G completions per problem from the engine, scored by the verifier runner
                           (and then by a learned scorer, when given: a reward model or a process reward
                           model, :class:`rlvr.rollout.scoring.Scorer`); with dynamic sampling, groups
                           whose rewards have zero spread are dropped and the batch refilled
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from rlvr.engines.base import Completion, Engine, SamplingParams
from rlvr.rollout.episodes import settle_rewards, verifier_score
from rlvr.rollout.sampler import ProblemSampler
from rlvr.rollout.scoring import Scorer, StepScores
from rlvr.tasks.base import Problem
from rlvr.verifiers.base import Reward
from rlvr.verifiers.runner import VerifierRunner


@dataclass
class Group:
    """G completions of one problem and their rewards.

    Attributes:
        rewards: per completion, the sequence-level reward training optimises: the verifier's, or a learned
            scorer's where it replaced them (a reward model; a process reward model in aggregate mode).
        gold: the verifier's rewards where a scorer replaced them in ``rewards`` (the gold watch: logged, never
            optimised); None where ``rewards`` are the verifier's own. :attr:`verdicts` is whichever holds them.
        steps: per completion, a token-level process reward model's :class:`~rlvr.rollout.scoring.StepScores`
            (each step's last token and the reward trained there); None otherwise.
    """

    suite: str
    problem: Problem
    prompt_ids: list[int]
    completions: list[Completion]
    rewards: list[Reward] = field(default_factory=list)
    gold: list[Reward] | None = None
    steps: list[StepScores] | None = None

    @property
    def verdicts(self) -> list[Reward]:
        """The verifier's rewards (pass/fail, accuracy): ``gold`` where a scorer replaced them, else ``rewards``."""
        return self.gold if self.gold is not None else self.rewards


@dataclass
class RolloutStats:
    """What collecting one batch cost and what it threw away."""

    generate_s: float = 0.0
    verify_s: float = 0.0
    reward_model_s: float = 0.0
    generated_tokens: int = 0
    rounds: int = 0
    dropped_groups: int = 0  # zero-variance groups removed by dynamic sampling
    zero_variance_groups: int = 0  # among all groups generated this step
    groups_seen: int = 0
    status: Counter = field(default_factory=Counter)


def is_correct(reward: Reward, threshold: float) -> bool:
    """Pass/fail by the verifier's verdict: status ok and the verifier's own score (not an episode's turn
    rewards, which only shape the trained reward: :func:`rlvr.rollout.episodes.verifier_score`) >= ``threshold``."""
    return reward.status == "ok" and verifier_score(reward) >= threshold


SIGNAL_EPS = 1e-6


def has_signal(rewards: Sequence[Reward]) -> bool:
    """Whether a group's scored rewards differ (spread above :data:`SIGNAL_EPS`): only then does a
    group baseline give any sample a non-zero advantage. Judged on the rewards themselves, not on
    thresholded accuracy, so that a continuous reward (0.3, 0.7, ...) is not taken for a group with
    nothing to learn, and binary rewards behave as before."""
    scores = [r.score for r in rewards if r.status == "ok"]
    return len(scores) > 1 and max(scores) - min(scores) > SIGNAL_EPS


def verifier_runner(section: Any) -> VerifierRunner:
    """The runner a run's ``verifier:`` config section describes (local processes or Ray actors)."""
    return VerifierRunner(workers=section.workers, timeout_s=section.timeout_s, backend=section.backend,
                          ray_address=section.ray_address, ray_num_cpus=section.ray_num_cpus)


def score_groups(runner: VerifierRunner, groups: list[Group], verifier: str | None, options: dict | None) -> None:
    """Fill ``group.rewards`` (see :func:`verify_groups`), with what multi-turn episodes add
    (:func:`rlvr.rollout.episodes.settle_rewards`)."""
    for group, rewards in zip(groups, verify_groups(runner, groups, verifier, options)):
        group.rewards = settle_rewards(group.completions, rewards)


def verify_groups(runner: VerifierRunner, groups: list[Group], verifier: str | None,
                  options: dict | None) -> list[list[Reward]]:
    """Each group's rewards from ``verifier`` (with ``options``), or from each problem's own verifier
    when ``verifier`` is None; one batched runner call per verifier name."""
    by_verifier: dict[str, list[tuple[int, int]]] = {}
    out: list[list[Reward]] = []
    for k, group in enumerate(groups):
        name = verifier or group.problem.verifier
        by_verifier.setdefault(name, []).extend((k, i) for i in range(len(group.completions)))
        out.append([None] * len(group.completions))  # type: ignore[list-item]
    for name, indices in by_verifier.items():
        items = [(groups[k], i) for k, i in indices]
        rewards = runner.score_batch(
            name,
            [g.completions[i].text for g, i in items],
            [g.problem.reference for g, i in items],
            options if verifier else None,
            prompts=[g.problem.prompt for g, i in items],
            finish_reasons=[g.completions[i].finish_reason for g, i in items],
        )
        for (k, i), reward in zip(indices, rewards):
            out[k][i] = reward
    return out


def scored_groups(drawn: Sequence[tuple[str, Problem]], prompt_ids: Sequence[list[int]],
                  completions: Sequence[list[Completion]], *, runner: VerifierRunner, verifier: str | None,
                  verifier_options: dict | None, scorer: Scorer | None, stats: RolloutStats) -> list[Group]:
    """The groups of ``drawn`` problems (``(suite, problem)``) and their ``completions``, scored by the
    verifier (and then by ``scorer``, when given), with what they cost and hold added to ``stats``."""
    groups = [Group(name, problem, list(ids), list(comps))
              for (name, problem), ids, comps in zip(drawn, prompt_ids, completions)]
    start = time.perf_counter()
    score_groups(runner, groups, verifier, verifier_options)
    stats.verify_s += time.perf_counter() - start
    if scorer is not None:
        start = time.perf_counter()
        scorer.score(groups).apply(groups)
        stats.reward_model_s += time.perf_counter() - start
    for group in groups:
        stats.generated_tokens += sum(len(c.token_ids) for c in group.completions)
        stats.status.update(r.status for r in group.rewards)
        stats.groups_seen += 1
        stats.zero_variance_groups += not has_signal(group.rewards)
    return groups


def collect_groups(
    *,
    engine: Engine,
    runner: VerifierRunner,
    sampler: ProblemSampler,
    encode: Callable[[Problem], list[int]],
    num_prompts: int,
    group_size: int,
    sampling: SamplingParams,
    verifier: str | None,
    verifier_options: dict | None,
    dynamic_sampling: bool,
    max_resample_rounds: int,
    scorer: Scorer | None = None,
    episodes=None,
) -> tuple[list[Group], RolloutStats]:
    """Generate and score ``num_prompts`` groups of ``group_size``.

    With ``episodes`` (an :class:`rlvr.rollout.episodes.EpisodeRunner`), a problem with an environment
    is played as a multi-turn episode: its completion holds every token after the prompt, the
    environment's ones masked from the loss, and its last assistant message is what gets scored.

    With a ``scorer`` (:class:`rlvr.rollout.scoring.Scorer`: a reward model or a process reward model), its
    result is written into the groups after the verifiers ran (:meth:`~rlvr.rollout.scoring.ScoredGroups.apply`):
    where its rewards replace the verifier's, those move to ``group.gold`` (the gold watch, never optimised).

    With ``dynamic_sampling`` (DAPO), groups whose rewards are all equal (all right or all wrong,
    for a binary reward: see :func:`has_signal`) carry no gradient signal under group baselines;
    they are dropped and more problems are drawn, for at
    most ``max_resample_rounds`` extra rounds. If the batch is still short, it is topped up with
    dropped groups so every step trains on the same number of sequences.
    """
    stats = RolloutStats()
    kept: list[Group] = []
    dropped: list[Group] = []
    while len(kept) < num_prompts and stats.rounds <= max_resample_rounds:
        stats.rounds += 1
        drawn = sampler.next(num_prompts - len(kept) if stats.rounds > 1 else num_prompts)
        prompt_ids = [encode(problem) for _, problem in drawn]
        start = time.perf_counter()
        if episodes is not None:
            completions = episodes.generate(engine, [problem for _, problem in drawn], prompt_ids, group_size, sampling)
        else:
            completions = engine.generate(prompt_ids, group_size, sampling)
        stats.generate_s += time.perf_counter() - start
        for group in scored_groups(drawn, prompt_ids, completions, runner=runner, verifier=verifier,
                                   verifier_options=verifier_options, scorer=scorer, stats=stats):
            if dynamic_sampling and not has_signal(group.rewards):
                dropped.append(group)
            else:
                kept.append(group)
        if not dynamic_sampling:
            break
    stats.dropped_groups = len(dropped)
    kept.extend(dropped[: num_prompts - len(kept)])
    return kept[:num_prompts], stats
