"""Measure a policy on held-out problems: accuracy, pass@k (unbiased), verifier statuses, throughput.

The same function serves ``rlvr eval``, evaluation during training, and the quickstart's
before/after numbers.

What counts as correct, and what happens to samples the verifier could not score:

* a sample is correct when the verifier's verdict passes: status ``ok`` and the verifier's own score
  >= ``success_threshold`` (:func:`rlvr.rollout.groups.is_correct`). An episode's turn rewards shape
  the score (``mean_score``) but never decide pass/fail.
* ``accuracy`` and pass@k are over *all* samples, so a sample whose verification failed (``timeout``,
  ``error``) or that the verifier declined (``abstain``) counts as not correct: the number never
  rises because checks fail. It is never silent: the status counts, ``error_frac`` (timeout and
  error) and ``abstain_frac`` are reported beside it, ``scored_accuracy`` is the accuracy over the
  samples that were scored, and :meth:`EvalResult.status_warning` is a line that names the counts
  (and says the accuracy is meaningless when no sample was scored), which ``rlvr eval`` and a
  training run's evaluation print.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from rlvr.engines.base import Engine, SamplingParams
from rlvr.rollout.episodes import episode_metrics, episode_summary, settle_rewards, verifier_score
from rlvr.rollout.groups import is_correct
from rlvr.tasks.base import Problem
from rlvr.verifiers.base import STATUSES
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


#: Statuses of a verification that failed (``error_frac``); ``abstain`` (the verifier declined) is the other
#: status of a sample that was not scored.
FAILED_STATUSES = ("timeout", "error")


@dataclass
class EvalResult:
    """Aggregate and per-problem results of one evaluation (see the module docstring for what counts)."""

    accuracy: float  # correct samples / all samples (a sample not scored counts as not correct)
    mean_score: float  # mean reward over all samples (a sample not scored counts 0)
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
    first_error: str | None = None  # the first failed (timeout/error) sample's message, on one line: why
    correct_samples: int = 0

    @property
    def samples(self) -> int:
        return sum(self.status.values())

    @property
    def error_frac(self) -> float:
        """The share of samples whose verification failed (``timeout`` or ``error``)."""
        return sum(self.status[s] for s in FAILED_STATUSES) / self.samples if self.samples else 0.0

    @property
    def abstain_frac(self) -> float:
        """The share of samples the verifier declined to score (``abstain``)."""
        return self.status["abstain"] / self.samples if self.samples else 0.0

    @property
    def scored_accuracy(self) -> float | None:
        """Correct samples / samples with status ``ok``; None when no sample was scored."""
        scored = self.status["ok"]
        return self.correct_samples / scored if scored else None

    def status_warning(self, name: str) -> str | None:
        """One line when some samples were not scored (status other than ``ok``), naming the suite
        ``name``, the counts, and what the accuracy then means; None when every sample was scored."""
        unscored = {s: n for s, n in sorted(self.status.items()) if s != "ok" and n}
        if not unscored:
            return None
        counts = ", ".join(f"{s} {n}" for s, n in unscored.items())
        why = f"; first error: {self.first_error}" if self.first_error else ""
        if not self.status["ok"]:
            return (f"warning: eval {name}: none of the {self.samples} samples was scored ({counts}): "
                    f"accuracy {self.accuracy:.4f} is meaningless, it measures the verifier, not the model{why}")
        return (f"warning: eval {name}: {sum(unscored.values())} of {self.samples} samples were not scored "
                f"({counts}) and count as not correct: accuracy {self.accuracy:.4f} over all samples, "
                f"{self.scored_accuracy:.4f} over the {self.status['ok']} scored{why}")

    def summary(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy,
            "scored_accuracy": self.scored_accuracy,
            "mean_score": self.mean_score,
            **{f"pass@{k}": v for k, v in self.pass_at_k.items()},
            "problems": self.problems,
            "samples_per_problem": self.samples_per_problem,
            "status": dict(self.status),
            "error_frac": self.error_frac,
            "abstain_frac": self.abstain_frac,
            **({"first_error": self.first_error} if self.first_error else {}),
            "wall_s": self.wall_s,
            "tokens_per_s": self.generated_tokens / self.generate_s if self.generate_s else 0.0,
            "problems_per_s": self.problems / self.wall_s if self.wall_s else 0.0,
        }


def _one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, cut to ``limit`` characters (an error message may be a whole traceback)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


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
    with an environment are played as multi-turn episodes and their last assistant message is scored;
    their turn rewards add to the score, not to pass/fail. Samples the verifier did not score count as
    not correct and are reported (module docstring).
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
    first_error: str | None = None
    for first in range(0, len(problems), batch_prompts):
        chunk = list(problems[first : first + batch_prompts])
        t0 = time.perf_counter()
        if episodes is not None:
            groups = episodes.generate(engine, chunk, [encode(p) for p in chunk], samples, sampling)
        else:
            groups = engine.generate([encode(p) for p in chunk], samples, sampling)
        t1 = time.perf_counter()
        generate_s += t1 - t0
        rewards = _score_chunk(runner, chunk, groups, samples, verifier, verifier_options)
        verify_s += time.perf_counter() - t1
        for i, problem in enumerate(chunk):
            group_rewards = rewards[i]
            correct = [is_correct(r, success_threshold) for r in group_rewards]
            correct_counts.append(sum(correct))
            score_sum += sum(r.score for r in group_rewards if r.status == "ok")
            status.update(r.status for r in group_rewards)
            if first_error is None:
                first_error = next((_one_line(r.info.get("error") or r.status) for r in group_rewards
                                    if r.status in FAILED_STATUSES), None)
            tokens += sum(len(c.token_ids) for c in groups[i])
            played += [c for c in groups[i] if c.episode is not None]
            if keep_records:
                records.append(_record(problem, groups[i], group_rewards, sum(correct)))
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
        first_error=first_error,
        correct_samples=sum(correct_counts),
    )


def _score_chunk(runner: VerifierRunner, chunk: list[Problem], groups: list, samples: int, verifier: str | None,
                 verifier_options: dict | None) -> list[list]:
    """The rewards of each problem's ``samples`` completions, ``rewards[i][j]``: one batch per verifier
    (``verifier`` overrides each problem's own, with ``verifier_options``), settled against the
    completions (:func:`settle_rewards`)."""
    by_verifier: dict[str, list[int]] = {}
    for i, problem in enumerate(chunk):
        by_verifier.setdefault(verifier or problem.verifier, []).append(i)
    rewards: list = [None] * len(chunk)
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
    return rewards


def _record(problem: Problem, completions: list, rewards: list, correct: int) -> dict[str, Any]:
    """One problem's line of ``results.jsonl``: its completions, scores, statuses and what the verifier
    extracted; the errors of samples not scored, and each episode's summary, when there are any."""
    return {
        "id": problem.id,
        "correct": correct,
        "samples": len(completions),
        "completions": [c.text for c in completions],
        "scores": [r.score for r in rewards],
        "status": [r.status for r in rewards],
        "extracted": [r.info.get("extracted") for r in rewards],
        "finish_reason": [c.finish_reason for c in completions],
        **({"errors": [_one_line(r.info.get("error") or r.status) if r.status in FAILED_STATUSES else None
                       for r in rewards]}
           if any(r.status in FAILED_STATUSES for r in rewards) else {}),
        **({"episodes": [episode_summary(c.episode) for c in completions],
            "verifier_scores": [verifier_score(r) for r in rewards]}
           if any(c.episode is not None for c in completions) else {}),
    }


def evaluate_suites(engine: Engine, encode, suites: dict[str, Sequence[Problem]], runner: VerifierRunner, *,
                    eval_config, generation, verifier, episodes=None,
                    warn: Callable[[str], None] | None = None) -> dict[str, float]:
    """A training run's evaluation: per held-out suite ``eval/<suite>/accuracy`` and ``/mean_score``, what
    the verifier could not score (``/error_frac``, ``/abstain_frac``, ``/status_<status>`` counts, and
    ``/scored_accuracy`` when any sample was scored), and ``eval/accuracy`` (the suites' mean accuracy).
    A suite with samples not scored gets its :meth:`EvalResult.status_warning` line passed to ``warn``
    (default: printed). Reads an ``EvalConfig``, a ``GenerationConfig`` (sampling, and the token budget
    unless ``eval.max_new_tokens`` sets one) and a ``VerifierConfig``."""
    warn = warn or (lambda line: print(line, flush=True))
    sampling = SamplingParams(
        max_new_tokens=eval_config.max_new_tokens or generation.max_new_tokens,
        temperature=generation.temperature, top_p=generation.top_p, top_k=generation.top_k,
        greedy=eval_config.greedy, stop=tuple(generation.stop), include_stop=generation.include_stop,
    )
    metrics: dict[str, float] = {}
    accuracies = []
    for name, problems in suites.items():
        result = evaluate(engine, encode, problems, runner, sampling=sampling, samples=eval_config.samples,
                          ks=(1,), verifier=verifier.name, verifier_options=verifier.options,
                          success_threshold=1.0 if verifier.success_threshold is None else verifier.success_threshold,
                          episodes=episodes)
        metrics.update(status_metrics(f"eval/{name}", result))
        accuracies.append(result.accuracy)
        line = result.status_warning(name)
        if line:
            warn(line)
    metrics["eval/accuracy"] = sum(accuracies) / len(accuracies)
    return metrics


def status_metrics(prefix: str, result: EvalResult) -> dict[str, float]:
    """``<prefix>/accuracy``, ``/mean_score``, ``/error_frac``, ``/abstain_frac``, ``/status_<status>`` (a
    count, for every status) and ``/scored_accuracy`` (only when some sample was scored) of ``result``."""
    metrics = {f"{prefix}/accuracy": result.accuracy, f"{prefix}/mean_score": result.mean_score,
               f"{prefix}/error_frac": result.error_frac, f"{prefix}/abstain_frac": result.abstain_frac,
               **{f"{prefix}/status_{s}": float(result.status[s]) for s in STATUSES}}
    if result.scored_accuracy is not None:
        metrics[f"{prefix}/scored_accuracy"] = result.scored_accuracy
    return metrics
