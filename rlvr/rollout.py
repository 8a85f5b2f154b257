"""Problems -> groups of completions -> rewards -> a padded training batch.

One training step's data, in order:

    ProblemSampler.next(P)             P problems, drawn from the training suites by weight
    collect_groups(...)                G completions per problem from the engine, scored by the
                                       verifier runner (and by a learned reward model, when given;
                                       the verifier's rewards are then the gold watch); with dynamic
                                       sampling, groups whose rewards have zero spread are dropped
                                       and the batch refilled
    sample_tensors(groups, ...)        rewards / validity / correctness as [P, G] tensors, with
                                       overlong filtering or soft punishment applied
    collate(groups, pad_id)            a Batch: [prompt (left-padded) | completion (right-padded)]
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Sequence

import torch

from rlvr.engines.base import Completion, Engine, SamplingParams
from rlvr.tasks.base import Problem
from rlvr.verifiers.base import Reward
from rlvr.verifiers.runner import VerifierRunner


# ---------------------------------------------------------------------------------------------
# Drawing problems
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Generating and scoring groups
# ---------------------------------------------------------------------------------------------


@dataclass
class Group:
    """G completions of one problem and their rewards."""

    suite: str
    problem: Problem
    prompt_ids: list[int]
    completions: list[Completion]
    rewards: list[Reward] = field(default_factory=list)  # what training optimises
    gold: list[Reward] | None = None  # the verifier's rewards when a reward model scored ``rewards`` (logged only)


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
    return reward.status == "ok" and reward.score >= threshold


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
    """Fill ``group.rewards`` (see :func:`verify_groups`)."""
    for group, rewards in zip(groups, verify_groups(runner, groups, verifier, options)):
        group.rewards = rewards


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
    reward_model=None,
) -> tuple[list[Group], RolloutStats]:
    """Generate and score ``num_prompts`` groups of ``group_size``.

    With a ``reward_model`` (a :class:`rlvr.reward_scoring.RewardScorer`), the verifier's rewards move
    to ``group.gold`` (the gold watch, never optimised) and the reward model's take their place.

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
        completions = engine.generate(prompt_ids, group_size, sampling)
        stats.generate_s += time.perf_counter() - start
        groups = [Group(name, problem, ids, comps) for (name, problem), ids, comps in zip(drawn, prompt_ids, completions)]
        start = time.perf_counter()
        score_groups(runner, groups, verifier, verifier_options)
        stats.verify_s += time.perf_counter() - start
        if reward_model is not None:
            start = time.perf_counter()
            reward_model.score_groups(groups, runner)
            stats.reward_model_s += time.perf_counter() - start
        for group in groups:
            stats.generated_tokens += sum(len(c.token_ids) for c in group.completions)
            stats.status.update(r.status for r in group.rewards)
            stats.groups_seen += 1
            if not has_signal(group.rewards):
                stats.zero_variance_groups += 1
                if dynamic_sampling:
                    dropped.append(group)
                    continue
            kept.append(group)
        if not dynamic_sampling:
            break
    stats.dropped_groups = len(dropped)
    kept.extend(dropped[: num_prompts - len(kept)])
    return kept[:num_prompts], stats


# ---------------------------------------------------------------------------------------------
# Rewards as tensors
# ---------------------------------------------------------------------------------------------


@dataclass
class SampleTensors:
    """Per-sample quantities laid out ``[P, G]`` (prompt, sample)."""

    scores: torch.Tensor  # reward used for advantages (after failure handling and shaping)
    raw_scores: torch.Tensor  # the verifier's score as given
    valid: torch.Tensor  # bool: enters group statistics and the loss
    correct: torch.Tensor | None  # bool: the verifier passed it (see :func:`verdicts`); None: no pass/fail
    truncated: torch.Tensor  # bool: finish_reason == "length"
    lengths: torch.Tensor  # completion tokens
    loss_weight: torch.Tensor  # 0/1: overlong filtering masks truncated samples out of the loss


def overlong_soft_penalty(lengths: torch.Tensor, max_len: int, buffer: int, penalty: float) -> torch.Tensor:
    """DAPO soft overlong punishment (added to the reward):

        0                                      if L <= max_len - buffer
        -penalty * (L - (max_len - buffer)) / buffer   if max_len - buffer < L <= max_len
    """
    start = max_len - buffer
    return -penalty * ((lengths.float() - start).clamp(min=0) / buffer).clamp(max=1.0)


def verdicts(rewards: Sequence[Sequence[Reward]], threshold: float | None) -> torch.Tensor | None:
    """Pass/fail ``[P, G]`` of verifier rewards: status ok and score >= ``threshold``. Without a
    threshold only binary rewards (every ok score 0 or 1) pass or fail, at 1; continuous ones give
    None: no accuracy is logged rather than a fake one."""
    if threshold is None:
        if not {r.score for row in rewards for r in row if r.status == "ok"} <= {0.0, 1.0}:
            return None
        threshold = 1.0
    return torch.tensor([[is_correct(r, threshold) for r in row] for row in rewards])


def sample_tensors(
    groups: list[Group],
    *,
    on_failure: str,
    success_threshold: float | None,
    overlong: str,
    max_new_tokens: int,
    overlong_buffer: int,
    overlong_penalty: float,
) -> SampleTensors:
    """Turn rewards into ``[P, G]`` tensors, applying failure handling and overlong treatment.

    A sample whose verification failed (timeout/error) is masked (``valid`` False: no advantage, no
    loss) when ``on_failure == "mask"``, or scored 0 when ``"zero"``. An ``abstain`` is always masked:
    the verifier gave no score to use.
    """
    raw = torch.tensor([[r.score for r in g.rewards] for g in groups], dtype=torch.float32)
    status = [[r.status for r in g.rewards] for g in groups]
    failed = torch.tensor([[s in ("timeout", "error") for s in row] for row in status])
    abstain = torch.tensor([[s == "abstain" for s in row] for row in status])
    valid = ~abstain & (~failed if on_failure == "mask" else torch.ones_like(failed))
    scores = torch.where(failed, torch.zeros_like(raw), raw)
    correct = verdicts([g.gold if g.gold is not None else g.rewards for g in groups], success_threshold)
    truncated = torch.tensor([[c.finish_reason == "length" for c in g.completions] for g in groups])
    lengths = torch.tensor([[len(c.token_ids) for c in g.completions] for g in groups])
    loss_weight = torch.ones_like(raw)
    if overlong == "soft":
        scores = scores + overlong_soft_penalty(lengths, max_new_tokens, overlong_buffer, overlong_penalty)
    elif overlong == "filter":
        loss_weight = (~truncated).float()
    return SampleTensors(scores, raw, valid, correct, truncated, lengths, loss_weight)


# ---------------------------------------------------------------------------------------------
# The padded batch
# ---------------------------------------------------------------------------------------------


@dataclass
class Batch:
    """Sequences laid out ``[left-padded prompt (W) | right-padded completion (T)]``.

    Every completion starts at column W, so the logits of the completion tokens are the model's
    last T + 1 positions (``logits_to_keep``) for every row.
    """

    input_ids: torch.Tensor  # [N, W + T]
    attention_mask: torch.Tensor  # [N, W + T]
    response_mask: torch.Tensor  # [N, T] 1 on completion tokens that enter the loss
    engine_logp: torch.Tensor  # [N, T] sampling log-probs from the engine
    advantages: torch.Tensor  # [N] per sequence (critic-free), or [N, T] per token (PPO's GAE)
    old_logp: torch.Tensor | None = None  # [N, T] pi_old when a batch is used more than once
    ref_logp: torch.Tensor | None = None  # [N, T] reference log-probs when beta > 0
    old_values: torch.Tensor | None = None  # [N, T] the critic's V(s_t) at rollout time (PPO)
    returns: torch.Tensor | None = None  # [N, T] the critic's regression targets (PPO)

    @property
    def completion_len(self) -> int:
        return self.response_mask.shape[1]

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(**{f.name: (v.to(device) if isinstance(v := getattr(self, f.name), torch.Tensor) else v) for f in fields(self)})

    def select(self, index: torch.Tensor) -> "Batch":
        return Batch(**{f.name: (v[index] if isinstance(v := getattr(self, f.name), torch.Tensor) else v) for f in fields(self)})

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def collate(groups: list[Group], pad_id: int) -> Batch:
    """Pad every (prompt, completion) pair of ``groups`` into one :class:`Batch` (advantages zero)."""
    rows = [(g.prompt_ids, c) for g in groups for c in g.completions]
    width = max(len(p) for p, _ in rows)
    length = max(1, max(len(c.token_ids) for _, c in rows))
    ids, attention, logps = [], [], []  # padded as lists, then one tensor each (not a tensor per row)
    for prompt, completion in rows:
        left, k = width - len(prompt), len(completion.token_ids)
        ids.append([pad_id] * left + list(prompt) + list(completion.token_ids) + [pad_id] * (length - k))
        attention.append([0] * left + [1] * (len(prompt) + k) + [0] * (length - k))
        logps.append(list(completion.logprobs) + [0.0] * (length - k))
    attention_mask = torch.tensor(attention, dtype=torch.long)
    return Batch(torch.tensor(ids, dtype=torch.long), attention_mask, attention_mask[:, width:].float(),
                 torch.tensor(logps, dtype=torch.float32), advantages=torch.zeros(len(rows)))
