"""Alarms: what watches a run's metrics for training that is silently not learning, a reward model
being over-optimised, and a verifier that fails."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rlvr.verifiers.errors import UserError


@dataclass(frozen=True)
class GoldWindow:
    """Means over ``steps`` consecutive steps (the last is ``step``) of the sampled gold score, the standard
    error of that mean (``se``) and a single step's (``step_se``, root mean square), and the proxy reward."""

    step: int
    gold: float
    se: float
    proxy: float
    steps: int = 1
    step_se: float = 0.0

    @classmethod
    def of(cls, rows: list[tuple[int, float, float, float]]) -> "GoldWindow":
        """The window of ``rows``, each ``(step, proxy, gold mean, gold standard error)``: the steps' samples
        are independent, so the window mean's standard error is sqrt(sum se^2) / k."""
        k = len(rows)
        squares = sum(r[3] ** 2 for r in rows)
        return cls(step=rows[-1][0], gold=sum(r[2] for r in rows) / k, se=math.sqrt(squares) / k,
                   proxy=sum(r[1] for r in rows) / k, steps=k, step_se=math.sqrt(squares / k))


def gold_fell(before: GoldWindow, now: GoldWindow, *, z: float = 3.5, min_drop: float = 0.03) -> bool:
    """Over-optimisation of a proxy: the gold of the window ``now`` fell below that of the steps just
    ``before`` it beyond noise while the proxy rose,

        before.gold - now.gold > max(z * sqrt(before.se^2 + before.step_se^2 / now.steps), min_drop)
        and now.proxy > before.proxy

    The noise of ``now`` is the one its steps would have if nothing had changed (the steps before it):
    its own standard error shrinks as its gold falls towards 0, which would make a fall look surer than
    it is. A gold that wobbles inside its noise, or falls together with the proxy (a policy that gets
    worse at everything, not one that games the reward model), does not fire it. ``z`` is high because
    the test is made at every step (docs/reward-models.md: no healthy run of the RLHF quickstart fires
    it, and a collapse still does 3-4 steps after the sampled gold turns down)."""
    noise = z * math.sqrt(before.se ** 2 + before.step_se ** 2 / now.steps)
    return before.gold - now.gold > max(noise, min_drop) and now.proxy > before.proxy


@dataclass(frozen=True)
class RankingWindow:
    """The reward model's pairwise accuracy on the policy's own samples pooled over consecutive steps (each
    step's pairs weighted by their number) and its standard error (the steps' samples are independent)."""

    accuracy: float
    se: float
    pairs: float
    proxy: float = 0.0  # the reward model's mean score over the same steps

    @classmethod
    def of(cls, rows: list[tuple[int, float, float, float, float]]) -> "RankingWindow":
        """The window of ``rows``, each ``(step, accuracy, standard error, pairs, proxy reward)``."""
        pairs, proxy = sum(r[3] for r in rows), sum(r[4] for r in rows) / max(1, len(rows))
        if not pairs:
            return cls(0.5, math.inf, 0.0, proxy)
        return cls(accuracy=sum(r[1] * r[3] for r in rows) / pairs,
                   se=math.sqrt(sum((r[2] * r[3]) ** 2 for r in rows)) / pairs, pairs=pairs, proxy=proxy)


def ranking_fell(before: RankingWindow, now: RankingWindow, *, z: float = 3.0, min_drop: float = 0.05) -> bool:
    """The reward model is being gamed: on the policy's own samples it now ranks wrong answers above right
    ones more often than not, after ranking them better before, while its score rose,

        now.accuracy < 0.5   and   before.accuracy - now.accuracy > max(z * sqrt(before.se^2 + now.se^2), min_drop)
                             and   now.proxy > before.proxy

    A policy that games its reward model makes new answers that the reward model likes and the verifier
    does not: the ranking on the policy's own samples turns before the verifier's mean score does,
    because it does not wait for the wrong answers to become the majority. A good reward model stays
    far above 0.5 on the policy's samples; a weak one's ranking is noisy from step to step, and a dip of
    it without a rising score is noise, not the policy finding what the reward model overrates."""
    noise = z * math.sqrt(before.se ** 2 + now.se ** 2)
    return now.accuracy < 0.5 and before.accuracy - now.accuracy > max(noise, min_drop) and now.proxy > before.proxy


class Alarms:
    """Warns when training is silently not learning, after ``patience`` consecutive bad steps.

    Conditions (fractions of this step's groups or completions):
      zero_variance   >= 90% of groups have the same score for every sample (no signal; the spread
                      of the scores, so a continuous reward never counts as all-wrong)
      truncation      >= 50% of completions hit max_new_tokens
      no_extraction   >= 90% of completions had no answer the verifier could extract

    and, with a reward model, ``gold_vs_proxy``, on either of two signs: the verifier's mean score on the
    step's own samples (``gold/mean``, never optimised), averaged over the last ``window`` steps, fell
    below its mean over the ``reference`` steps before them beyond sampling noise while the reward
    model's score (``proxy/reward``) rose (:func:`gold_fell`); or the reward model's ranking of the
    policy's own samples (``proxy/pairwise_accuracy``) fell below chance from where it was over the
    same reference steps (:func:`ranking_fell`), which comes first. It fires once per stretch. ``best`` is the run's best gold window and ``new_best`` whether this step made it
    (the policy to keep when the run stops on this alarm).
    """

    THRESHOLDS = {
        "zero_variance": ("rollout/zero_variance_frac", 0.9,
                          "almost every group's samples score the same (all right or all wrong, for a binary reward): "
                          "no learning signal (make the task easier/harder, raise group_size)"),
        "truncation": ("response/truncation_rate", 0.5,
                       "most completions are cut off at max_new_tokens (raise generation.max_new_tokens)"),
        "no_extraction": ("verify/no_answer_frac", 0.9,
                          "the verifier finds no answer in almost every completion (check the prompt's answer format)"),
    }
    NAMES = (*THRESHOLDS, "gold_vs_proxy")

    def __init__(self, patience: int = 5, window: int = 2, reference: int = 10, z: float = 3.5, min_drop: float = 0.03,
                 ranking_z: float = 3.0, ranking_window: int = 3):
        self.patience, self.window, self.reference, self.z, self.min_drop = patience, window, reference, z, min_drop
        self.ranking_z, self.ranking_window = ranking_z, ranking_window
        self.streak = {name: 0 for name in self.THRESHOLDS}
        self.fired: list[tuple[int, str]] = []
        self.recent: list[tuple[int, float, float, float]] = []  # (step, proxy, gold, gold se) of the last steps
        self.ranked: list[tuple[int, float, float, float, float]] = []  # (step, pairwise accuracy, se, pairs, proxy)
        self.best: GoldWindow | None = None
        self.new_best = False
        self.diverging = False

    def update(self, step: int, metrics: dict[str, Any]) -> list[str]:
        """New alarm messages for this step (each fires once per streak)."""
        messages = []
        for name, (key, threshold, advice) in self.THRESHOLDS.items():
            value = metrics.get(key)
            if isinstance(value, (int, float)) and value >= threshold:
                self.streak[name] += 1
                if self.streak[name] == self.patience:
                    message = f"ALARM {name} at step {step}: {key}={value:.2f} for {self.patience} steps; {advice}"
                    messages.append(message)
                    self.fired.append((step, name))
            else:
                self.streak[name] = 0
        self.new_best = False
        proxy, gold = metrics.get("proxy/reward"), metrics.get("gold/mean")
        if isinstance(proxy, (int, float)) and isinstance(gold, (int, float)):
            self.recent = [*self.recent, (step, float(proxy), float(gold), float(metrics.get("gold/se", 0.0)))]
            self.recent = self.recent[-(self.reference + self.window):]
            if len(self.recent) >= self.window:
                now = GoldWindow.of(self.recent[-self.window:])
                if self.best is None or now.gold > self.best.gold:
                    self.best, self.new_best = now, True
                before = self.recent[:-self.window]
                gold_down = len(before) >= self.window and gold_fell(GoldWindow.of(before), now, z=self.z,
                                                                       min_drop=self.min_drop)
                ranking_down = self._ranking_fell(step, metrics)
                fell = gold_down or ranking_down is not None
                if fell and not self.diverging:
                    if gold_down:
                        ref = GoldWindow.of(before)
                        sign = (f"the verifier's score of the samples (gold/mean) fell from {ref.gold:.3f} (steps "
                                f"{before[0][0]}-{ref.step}) to {now.gold:.3f} (the last {self.window} steps) while the "
                                f"reward model's (proxy/reward) rose {ref.proxy:.3g} -> {now.proxy:.3g}")
                    else:
                        (first, ref), ranked = ranking_down
                        sign = (f"the reward model's ranking of the policy's own samples against the verifier "
                                f"(proxy/pairwise_accuracy) fell from {ref.accuracy:.3f} (steps {first}-"
                                f"{step - self.ranking_window}) to {ranked.accuracy:.3f} (the last {self.ranking_window} "
                                "steps): it now "
                                "prefers the policy's wrong answers to its right ones")
                    messages.append(
                        f"ALARM gold_vs_proxy at step {step}: {sign}: the policy is over-optimising the reward model "
                        "(log.stop_on: [gold_vs_proxy] ends the run here and keeps its best policy; or raise "
                        "algorithm.beta, or try reward_model.ensemble: min over several models)")
                    self.fired.append((step, "gold_vs_proxy"))
                self.diverging = fell
        return messages

    def _ranking_fell(self, step: int, metrics: dict[str, Any]):
        """``((first reference step, reference window), last window)`` when :func:`ranking_fell` holds
        for this step's ``proxy/pairwise_accuracy`` history, else None."""
        accuracy = metrics.get("proxy/pairwise_accuracy")
        if isinstance(accuracy, (int, float)):
            row = (step, float(accuracy), float(metrics.get("proxy/pairwise_se", 0.0)),
                   float(metrics.get("proxy/ranked_pairs", 0.0)), float(metrics.get("proxy/reward", 0.0)))
            self.ranked = [*self.ranked, row][-(self.reference + self.ranking_window):]
        k = self.ranking_window
        if len(self.ranked) < 2 * k or self.ranked[-1][0] != step:
            return None
        before, now = RankingWindow.of(self.ranked[:-k]), RankingWindow.of(self.ranked[-k:])
        return ((self.ranked[0][0], before), now) if ranking_fell(before, now, z=self.ranking_z) else None

    def state_dict(self) -> dict[str, Any]:
        return {"streak": dict(self.streak), "fired": list(self.fired), "recent": list(self.recent),
                "ranked": list(self.ranked), "best": list(vars(self.best).values()) if self.best else None,
                "diverging": self.diverging}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak.update(state["streak"])
        self.fired = [tuple(x) for x in state["fired"]]
        self.recent = [tuple(x) for x in state.get("recent", [])]
        self.ranked = [tuple(x) for x in state.get("ranked", []) if len(x) == 5]  # (earlier rows lacked the proxy)
        self.best = GoldWindow(*state["best"]) if state.get("best") else None
        self.diverging = state.get("diverging", False)


class VerifierFailure(UserError):
    """Too many of a step's samples could not be verified: training on what is left would learn from
    a broken reward (masked or zero-scored samples), so the run stops."""


class VerifierErrors:
    """Watches verifier errors: prints the first traceback of the run once, and stops the run
    (:class:`VerifierFailure`) when more than ``max_frac`` of one step's samples errored.

    A verifier that raises on every sample used to train with loss 0 for the whole run and exit 0,
    showing only a misleading zero-variance alarm.
    """

    def __init__(self, max_frac: float, printer=print):
        self.max_frac = max_frac
        self.printer = printer
        self.shown = False

    def update(self, step: int, rewards: list, verifier_of) -> float:
        """The fraction of ``rewards`` with status ``error`` (raises past ``max_frac``).
        ``verifier_of(i)`` names the verifier of reward ``i``, for messages."""
        errors = [i for i, r in enumerate(rewards) if r.status == "error"]
        frac = len(errors) / max(1, len(rewards))
        if errors and not self.shown:
            self.shown = True
            first = rewards[errors[0]]
            detail = first.info.get("traceback") or first.info.get("error", "(no details)")
            self.printer(f"verifier {verifier_of(errors[0])!r} failed on {len(errors)} of {len(rewards)} samples at step "
                         f"{step} (shown once; counted every step as verify/error_frac). First error:\n{detail.rstrip()}")
        if errors and frac > self.max_frac:
            first = rewards[errors[0]]
            raise VerifierFailure(
                f"verifier {verifier_of(errors[0])!r} failed on {len(errors)} of {len(rewards)} samples at step {step} "
                f"({frac:.0%}), more than verifier.max_error_frac={self.max_frac:g}: "
                f"{' '.join(str(first.info.get('error', '(no details)')).split())}. Fix the "
                "verifier or its reference data (`rlvr verify` reproduces it offline), or raise verifier.max_error_frac")
        return frac
