"""Asynchronous generation: the generator samples the next steps' groups while the trainer updates.

With ``async_generation.max_staleness`` S, the generations of steps t .. t + S are in flight on a
:class:`~rlvr.engines.process.ProcessEngine` when step t begins. Step t's problems are drawn, encoded
and submitted at step t - S, right after the weights of step t - S - 1 were published, and the
generator serves its queue in order, so step t trains on samples of the policy after step t - S - 1:

    step t:  submit step t + S  ->  take step t's samples (lag min(S, t - 1) updates)
             -> score -> update (the generator samples step t + 1 .. t + S meanwhile) -> publish

The lag is at most S by construction, never by luck: no group older than S versions is produced,
so none is ever dropped (``take`` raises if one were). At S = 0 each step submits and waits, handing
the trainer's RNG state (its device's) to the generator and back, which reproduces the synchronous
loop bit for bit; at S >= 1 each generation is seeded from ``(train.seed, step)``, so a run is reproducible
whatever the timing.

A checkpoint drains the queue into itself: the in-flight steps' samples are awaited and saved with
the problems they answer (the sampler's position is already past them), and a resumed run takes
them from there before it submits anything new: it trains on exactly the samples the uninterrupted
run would have.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

from rlvr.engines.base import Completion, SamplingParams
from rlvr.engines.process import ProcessEngine
from rlvr.rollout.episodes import EpisodeRecord
from rlvr.tasks.base import Problem


@dataclass
class Sampled:
    """One step's samples: its problems ``(suite, problem)``, their prompt ids, G completions each, the
    step at which they were submitted (sampled by the policy after the step before it), the worker's
    ``info`` (seconds, idle_s) and ``waited_s``, the trainer's wait for them."""

    drawn: list[tuple[str, Problem]]
    prompt_ids: list[list[int]]
    completions: list[list[Completion]]
    submitted_at: int
    info: dict[str, Any]
    waited_s: float = 0.0


class AsyncRollouts:
    """Keeps ``max_staleness`` steps of generation in flight (see the module docstring).

    Args:
        engine: the generator.
        draw: ``k -> [(suite, problem)]``, the run's (rank's) problem sampler.
        suites: ``{name: problems}`` it draws from (a checkpoint names a problem by its suite and place).
        encode: problem -> prompt ids.
        num_prompts, group_size, sampling: what each step generates.
        max_staleness: S.
        seed: the run's seed (S >= 1 seeds each step's generation from it).
        episodes: the worker plays the problems as multi-turn episodes (``encode.template_of`` gives
            each prompt's chat template, for the environment's messages).
    """

    def __init__(self, engine: ProcessEngine, *, draw: Callable[[int], list[tuple[str, Problem]]],
                 encode: Callable[[Problem], list[int]], suites: dict[str, Sequence[Problem]], num_prompts: int,
                 group_size: int, sampling: SamplingParams, max_staleness: int, seed: int, episodes: bool = False):
        self.engine, self.draw, self.encode, self.suites, self.episodes = engine, draw, encode, suites, episodes
        # (suite name, problem id) -> the problem's place in its suite: a checkpoint names a problem by suite and
        # place; keyed by names, not objects, so that a copied or unpickled problem is found
        self._position = {(name, p.id): k for name, problems in suites.items() for k, p in enumerate(problems)}
        self.num_prompts, self.group_size, self.sampling = num_prompts, group_size, sampling
        self.max_staleness, self.seed = max_staleness, seed
        # step -> (drawn, prompt ids, ticket, the step it was submitted at, the weight publication it was submitted under)
        self._in_flight: dict[int, tuple[list[tuple[str, Problem]], list[list[int]], int, int, int]] = {}
        self._ready: dict[int, Sampled] = {}  # from a checkpoint

    def take(self, step: int, last_step: int) -> Sampled:
        """Step ``step``'s samples, after submitting every step up to ``step + max_staleness`` (at most
        ``last_step``) that is not in flight yet. Their lag, ``step - submitted_at``, is at most S."""
        for ahead in range(step, min(step + self.max_staleness, last_step) + 1):
            if ahead not in self._in_flight and ahead not in self._ready:
                self._submit(ahead, now=step)
        sampled = self._ready.pop(step) if step in self._ready else self._receive(step)
        if step - sampled.submitted_at > self.max_staleness:  # impossible by the schedule: never trained on
            raise RuntimeError(f"async generation: step {step}'s samples were submitted at step "
                               f"{sampled.submitted_at}, beyond max_staleness {self.max_staleness}")
        return sampled

    def _submit(self, step: int, now: int) -> None:
        drawn = self.draw(self.num_prompts)
        prompt_ids = [self.encode(problem) for _, problem in drawn]
        exact = self.max_staleness == 0  # continue the trainer's RNG stream, as the synchronous loop does
        problems = [problem for _, problem in drawn] if self.episodes else None
        ticket = self.engine.submit(prompt_ids, self.group_size, self.sampling,
                                    rng=self.engine.rng_state() if exact else None,
                                    seed=None if exact else _step_seed(self.seed, step), problems=problems,
                                    templates=[self.encode.template_of(p) for p in problems] if problems else None)
        self._in_flight[step] = (drawn, prompt_ids, ticket, now, self.engine.publications)

    def _receive(self, step: int) -> Sampled:
        drawn, prompt_ids, ticket, submitted_at, publication = self._in_flight.pop(step)
        start = time.perf_counter()
        completions, info = self.engine.result(ticket)
        waited = time.perf_counter() - start
        if info["publication"] != publication:  # the queue is served in order: the weights current at submission
            raise RuntimeError(f"async generation: step {step} was sampled by weight publication "
                               f"{info['publication']}, not {publication} as submitted")
        if self.max_staleness == 0:
            self.engine.set_rng_state(info["rng"])
        return Sampled(drawn, prompt_ids, completions, submitted_at,
                       {k: v for k, v in info.items() if k not in ("rng", "publication")}, waited)

    # ---- checkpoints --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The samples of every step in flight, awaited (the queue drained into the checkpoint), as plain
        data: problems by suite and place, completions as dicts."""
        for step in sorted(self._in_flight):
            self._ready[step] = self._receive(step)
        return {"ready": {step: {"drawn": [(name, self._position[name, problem.id]) for name, problem in s.drawn],
                                 "prompt_ids": s.prompt_ids, "submitted_at": s.submitted_at, "info": s.info,
                                 "completions": [[asdict(c) for c in group] for group in s.completions]}
                          for step, s in self._ready.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._ready = {int(step): Sampled(drawn=[(name, self.suites[name][k]) for name, k in saved["drawn"]],
                                          prompt_ids=saved["prompt_ids"], submitted_at=saved["submitted_at"],
                                          info=saved["info"],
                                          completions=[[_completion(c) for c in group]
                                                       for group in saved["completions"]])
                       for step, saved in state["ready"].items()}


def _completion(saved: dict[str, Any]) -> Completion:
    episode = saved.get("episode")
    return Completion(**{**saved, "episode": EpisodeRecord(**episode) if episode is not None else None})


def _step_seed(seed: int, step: int) -> int:
    """A generation seed for ``step`` of a run seeded ``seed`` (distinct per step, fixed per run)."""
    return (seed * 1_000_003 + step * 7_919) % (2**62)


def staleness_metrics(sampled: Sampled, lag: int, generate_s: float) -> dict[str, float]:
    """``async/`` metrics and the step's time split: the lag of its samples (updates between the policy
    that sampled them and the one they train), the trainer's wait for them, the generator's idle time
    before it began them, and the share of their generation the trainer did not wait for."""
    return {
        "async/lag": float(lag),
        "time/wait_for_samples": sampled.waited_s,
        "time/generator_idle": sampled.info.get("idle_s", 0.0),
        "async/overlap_frac": max(0.0, 1.0 - sampled.waited_s / generate_s) if generate_s > 0 else 0.0,
    }

