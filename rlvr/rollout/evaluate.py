"""Measure a policy on held-out problems: accuracy, pass@k (unbiased), verifier statuses, throughput.

The same function serves ``rlvr eval``, evaluation during training, and the quickstart's
before/after numbers.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from rlvr.engines.base import Engine, SamplingParams
from rlvr.rollout.episodes import episode_metrics, episode_summary, settle_rewards
from rlvr.tasks.base import Problem
from rlvr.verifiers.runner import VerifierRunner


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), for n samples of which c are correct.

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k / i), which never forms the huge binomials.
    """
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got {n}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


@dataclass
class EvalResult:
    """Aggregate and per-problem results of one evaluation."""

    accuracy: float  # mean over all samples of "correct"
    mean_score: float
    pass_at_k: dict[int, float]
    status: Counter
    problems: int
    samples_per_problem: int
    wall_s: float
    generate_s: float
    verify_s: float
    generated_tokens: int
    records: list[dict[str, Any]] = field(default_factory=list)
    episodes: dict[str, float] = field(default_factory=dict)  # env/ metrics of multi-turn episodes (none: {})

    def summary(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy,
            "mean_score": self.mean_score,
            **{f"pass@{k}": v for k, v in self.pass_at_k.items()},
            "problems": self.problems,
            "samples_per_problem": self.samples_per_problem,
            "status": dict(self.status),
            "wall_s": self.wall_s,
            "tokens_per_s": self.generated_tokens / self.generate_s if self.generate_s else 0.0,
            "problems_per_s": self.problems / self.wall_s if self.wall_s else 0.0,
        }


def evaluate(
    engine: Engine,
    encode: Callable[[Problem], list[int]],
    problems: Sequence[Problem],
    runner: VerifierRunner,
    *,
    sampling: SamplingParams,
    samples: int = 1,
    ks: Sequence[int] = (1,),
    verifier: str | None = None,
    verifier_options: dict | None = None,
    success_threshold: float = 1.0,
    batch_prompts: int = 64,
    keep_records: bool = False,
    progress: Callable[[int], None] | None = None,
    episodes=None,
) -> EvalResult:
    """Generate ``samples`` completions per problem, verify them, and aggregate.

    ``verifier`` overrides each problem's own verifier. ``progress(n_done)`` is called after each
    batch of prompts. With ``episodes`` (an :class:`rlvr.rollout.episodes.EpisodeRunner`), problems
    with an environment are played as multi-turn episodes and their last assistant message is scored.
    """
    bad_k = [k for k in ks if k > samples]
    if bad_k:
        raise ValueError(f"pass@k with k={bad_k} needs samples >= {max(bad_k)} (got samples={samples})")
    start = time.perf_counter()
    generate_s = verify_s = 0.0
    tokens = 0
    status: Counter = Counter()
    correct_counts: list[int] = []
    score_sum = 0.0
    records: list[dict[str, Any]] = []
    played = []  # the completions that were multi-turn episodes
    for first in range(0, len(problems), batch_prompts):
        chunk = list(problems[first : first + batch_prompts])
        t0 = time.perf_counter()
        if episodes is not None:
            groups = episodes.generate(engine, chunk, [encode(p) for p in chunk], samples, sampling)
        else:
            groups = engine.generate([encode(p) for p in chunk], samples, sampling)
        t1 = time.perf_counter()
        generate_s += t1 - t0
        by_verifier: dict[str, list[int]] = {}
        for i, problem in enumerate(chunk):
            by_verifier.setdefault(verifier or problem.verifier, []).append(i)
        rewards: dict[int, list] = {}
        for name, indices in by_verifier.items():
            flat = runner.score_batch(
                name,
                [c.text for i in indices for c in groups[i]],
                [chunk[i].reference for i in indices for _ in range(samples)],
                verifier_options if verifier else None,
                prompts=[chunk[i].prompt for i in indices for _ in range(samples)],
                finish_reasons=[c.finish_reason for i in indices for c in groups[i]],
            )
            for j, i in enumerate(indices):
                rewards[i] = settle_rewards(groups[i], flat[j * samples : (j + 1) * samples])
        verify_s += time.perf_counter() - t1
        for i, problem in enumerate(chunk):
            group_rewards = rewards[i]
            correct = [r.status == "ok" and r.score >= success_threshold for r in group_rewards]
            correct_counts.append(sum(correct))
            score_sum += sum(r.score for r in group_rewards)
            status.update(r.status for r in group_rewards)
            tokens += sum(len(c.token_ids) for c in groups[i])
            played += [c for c in groups[i] if c.episode is not None]
            if keep_records:
                records.append({
                    "id": problem.id,
                    "correct": sum(correct),
                    "samples": samples,
                    "completions": [c.text for c in groups[i]],
                    "scores": [r.score for r in group_rewards],
                    "status": [r.status for r in group_rewards],
                    "extracted": [r.info.get("extracted") for r in group_rewards],
                    "finish_reason": [c.finish_reason for c in groups[i]],
                    **({"episodes": [episode_summary(c.episode) for c in groups[i]]}
                       if any(c.episode is not None for c in groups[i]) else {}),
                })
        if progress is not None:
            progress(len(chunk))
    total = max(1, len(problems) * samples)
    return EvalResult(
        accuracy=sum(correct_counts) / total,
        mean_score=score_sum / total,
        pass_at_k={k: sum(pass_at_k(samples, c, k) for c in correct_counts) / max(1, len(correct_counts)) for k in ks},
        status=status,
        problems=len(problems),
        samples_per_problem=samples,
        wall_s=time.perf_counter() - start,
        generate_s=generate_s,
        verify_s=verify_s,
        generated_tokens=tokens,
        records=records,
        episodes=episode_metrics(played),
    )


def evaluate_suites(engine: Engine, encode, suites: dict[str, Sequence[Problem]], runner: VerifierRunner, *,
                    eval_config, generation, verifier, episodes=None) -> dict[str, float]:
    """A training run's evaluation: ``eval/<suite>/accuracy`` and ``/mean_score`` per held-out suite,
    and ``eval/accuracy`` (their mean). Reads an ``EvalConfig``, a ``GenerationConfig`` (sampling, and
    the token budget unless ``eval.max_new_tokens`` sets one) and a ``VerifierConfig``."""
    sampling = SamplingParams(
        max_new_tokens=eval_config.max_new_tokens or generation.max_new_tokens,
        temperature=generation.temperature, top_p=generation.top_p, top_k=generation.top_k,
        greedy=eval_config.greedy,
    )
    metrics: dict[str, float] = {}
    accuracies = []
    for name, problems in suites.items():
        result = evaluate(engine, encode, problems, runner, sampling=sampling, samples=eval_config.samples,
                          ks=(1,), verifier=verifier.name, verifier_options=verifier.options,
                          success_threshold=1.0 if verifier.success_threshold is None else verifier.success_threshold,
                          episodes=episodes)
        metrics[f"eval/{name}/accuracy"] = result.accuracy
        metrics[f"eval/{name}/mean_score"] = result.mean_score
        accuracies.append(result.accuracy)
    metrics["eval/accuracy"] = sum(accuracies) / len(accuracies)
    return metrics
