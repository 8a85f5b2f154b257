"""What one RL step logs, and what a run's ``summary.json`` says, for both recipes.

Metric namespaces are those of ``rlvr/run/tracking.py``: ``reward/``, ``response/``, ``rollout/``,
``verify/``; the update adds ``train/`` and ``mismatch/``, the recipe ``time/``, ``perf/``, ``sync/``.
With a reward model, ``proxy/reward`` is its own score (before normalisation) and ``gold/`` the
verifier's (never optimised).
"""

from __future__ import annotations

import math
from typing import Any

from rlvr.rollout.episodes import episode_metrics, verifier_score


def step_metrics(groups, samples, rollout, update: dict[str, float], seq_kl, mixed: bool) -> dict[str, float]:
    """Everything one step logs (see the namespaces in ``rlvr/run/tracking.py``)."""
    raw, valid = samples.raw_scores, samples.valid
    lengths = samples.lengths.float()
    rewards = [r for g in groups for r in g.rewards]
    judged = [r for g in groups for r in g.verdicts]  # the verifier's
    verdict = "gold" if groups and groups[0].gold is not None else "reward"  # a learned score is no pass/fail
    metrics: dict[str, float] = {
        "reward/mean": float(raw[valid].mean()) if valid.any() else 0.0,
        "reward/std": float(raw[valid].std()) if valid.sum() > 1 else 0.0,
        "reward/shaped_mean": float(samples.scores[valid].mean()) if valid.any() else 0.0,
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/truncation_rate": float(samples.truncated.float().mean()),
        "rollout/zero_variance_frac": rollout.zero_variance_groups / max(1, rollout.groups_seen),
        "rollout/dropped_groups": float(rollout.dropped_groups),
        "rollout/rounds": float(rollout.rounds),
        "verify/masked_frac": float((~valid).float().mean()),
        "verify/latency_p50_ms": 1e3 * sorted(r.latency_s for r in judged)[len(judged) // 2] if judged else 0.0,
        "verify/latency_max_ms": 1e3 * max((r.latency_s for r in judged), default=0.0),
    }
    if samples.correct is not None:  # binary rewards, or verifier.success_threshold set
        metrics[f"{verdict}/accuracy"] = float(samples.correct.float().mean())
    if verdict == "gold":
        gold = [verifier_score(r) for r in judged if r.status == "ok"]
        if gold:
            metrics["gold/mean"] = sum(gold) / len(gold)
            metrics["gold/se"] = _clustered_se([[verifier_score(r) for r in g.gold if r.status == "ok"]
                                                for g in groups])
        scored = [r.components["rm"] for r in rewards if "rm" in r.components]  # unnormalised: its trend is real
        metrics["proxy/reward"] = sum(scored) / max(1, len(scored))
        ranked = proxy_pairwise_accuracy(groups)
        if ranked is not None:
            metrics["proxy/pairwise_accuracy"], metrics["proxy/pairwise_se"], metrics["proxy/ranked_pairs"] = ranked
        metrics["time/reward_model"] = rollout.reward_model_s
    for status, count in rollout.status.items():
        metrics[f"verify/status_{status}"] = float(count)
    reporting = [r for r in judged if "extracted" in r.info]
    if reporting:
        metrics["verify/no_answer_frac"] = sum(r.info["extracted"] is None for r in reporting) / len(reporting)
    components: dict[str, list[float]] = {}
    for r in rewards:
        for name, value in r.components.items():
            components.setdefault(name, []).append(value)
    for name, values in components.items():
        metrics[f"reward/{name}"] = sum(values) / len(values)
    if mixed and samples.correct is not None:  # several training suites: accuracy of each one drawn this step
        for suite in sorted({g.suite for g in groups}):
            rows = [i for i, g in enumerate(groups) if g.suite == suite]
            metrics[f"{verdict}/{suite}/accuracy"] = float(samples.correct[rows].float().mean())
    if seq_kl is not None:
        metrics["reward/kl_seq_mean"] = float(seq_kl.mean())
    metrics.update(episode_metrics([c for g in groups for c in g.completions]))  # multi-turn episodes: env/
    metrics.update(update)
    return metrics


def proxy_pairwise_accuracy(groups) -> tuple[float, float, float] | None:
    """How well the reward model ranks the policy's own samples: over the pairs of samples of one prompt
    that the verifier scores differently, the share the reward model orders the same way (a tie counts
    half), its standard error with each prompt as a cluster (its pairs share samples), and the number of
    such pairs; None when the step has none. A reward model being gamed rates the policy's new wrong
    answers above its right ones, so this falls as the policy moves."""
    per_group: list[tuple[float, int]] = []  # (agreements, pairs) of each prompt with a mixed pair
    for g in groups:
        if g.gold is None:
            continue
        rated = [(r.components["rm"], verifier_score(gold)) for r, gold in zip(g.rewards, g.gold)
                 if "rm" in r.components and gold.status == "ok"]
        agree, pairs = 0.0, 0
        for i, (proxy_i, gold_i) in enumerate(rated):
            for proxy_j, gold_j in rated[i + 1:]:
                if gold_i != gold_j:
                    pairs += 1
                    same = (proxy_i - proxy_j) * (gold_i - gold_j)
                    agree += 1.0 if same > 0 else 0.5 if same == 0 else 0.0
        if pairs:
            per_group.append((agree, pairs))
    total = sum(n for _, n in per_group)
    if not total:
        return None
    accuracy = sum(a for a, _ in per_group) / total
    k = len(per_group)  # the ratio estimator's cluster-robust standard error (0 with one prompt)
    se = math.sqrt(k / (k - 1) * sum((a - accuracy * n) ** 2 for a, n in per_group)) / total if k > 1 else 0.0
    return accuracy, se, float(total)


def _clustered_se(groups: list[list[float]]) -> float:
    """Standard error of the mean score over the groups' samples, with each group (one prompt) as a cluster:
    the samples of one prompt are not independent, the prompts are. 0 with fewer than two groups."""
    means = [sum(g) / len(g) for g in groups if g]
    if len(means) < 2:
        return 0.0
    mean = sum(means) / len(means)
    return math.sqrt(sum((m - mean) ** 2 for m in means) / (len(means) - 1) / len(means))


def run_summary(config, evaluations: dict, alarms) -> dict[str, Any]:
    """``summary.json`` of an RL run: accuracy before (step 0) and after (the last evaluation). With a
    reward model the evaluation's verifier is the gold, so these are also ``gold_accuracy_before/after``."""
    steps_done = sorted(evaluations)
    before = evaluations.get(0, {}).get("eval/accuracy")
    after = evaluations[steps_done[-1]].get("eval/accuracy") if steps_done and steps_done[-1] > 0 else None
    gold = {"gold_accuracy_before": before, "gold_accuracy_after": after} if config.reward_model is not None else {}
    return {
        "run_folder": config.out,
        "algorithm": config.algorithm.preset,
        "steps": config.train.steps,
        "accuracy_before": before,
        "accuracy_after": after,
        **gold,
        "evaluations": {str(k): v for k, v in evaluations.items()},
        "alarms": [{"step": s, "alarm": a} for s, a in alarms.fired],
    }


def progress_postfix(metrics: dict[str, float]) -> dict[str, str]:
    """The progress bar's numbers: mean reward, and accuracy (the gold's with a reward model) when logged;
    with multi-turn episodes, turns and tool calls per episode; with asynchronous generation, the lag."""
    accuracy = metrics.get("reward/accuracy", metrics.get("gold/accuracy"))
    episodes = {"turns": f"{metrics['env/turns']:.2f}", "calls": f"{metrics['env/tool_calls']:.2f}"} \
        if "env/turns" in metrics else {}
    lag = {"lag": f"{metrics['async/lag']:.0f}"} if "async/lag" in metrics else {}
    return {"reward": f"{metrics['reward/mean']:.3f}", **({"acc": f"{accuracy:.3f}"} if accuracy is not None else {}),
            **episodes, **lag}
