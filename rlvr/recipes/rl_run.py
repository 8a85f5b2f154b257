"""What both RL recipes (``grpo.py``, ``ppo.py``) build and do around their own update.

    run = RLRun.start(config)      data and verifiers (checked before any model loads), tokenizer and
                                   prompts, the problem sampler, policy, reference, engine and its weight
                                   sync, a learned reward model, alarms
    run.restore(states, models)    a checkpoint (each rank's data position and RNG too), or a new run;
                                   then the evaluation at step 0
    run.rollout()                  problems -> groups -> rewards -> [P, G] reward tensors
    run.step_metrics(...)          what a step logs (rewards, lengths, verifier, times, the update's)
    run.end_step(step, metrics)    metrics over ranks, alarms, evaluation on schedule, then the
                                   common end of a step (log, progress, plot, checkpoint)
    run.finish(save_final)         summary.json: accuracy before -> after, alarms

The update between rollout and step_metrics is the recipe's own.
"""

from __future__ import annotations

import collections
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from rlvr import engines
from rlvr.engines import SamplingParams
from rlvr.engines.base import call_optional
from rlvr.engines.process import ProcessEngine
from rlvr.engines.weight_sync import start_engine
from rlvr.modeling.forward_choice import forward_note
from rlvr.modeling.loading import (Reference, check_model_folder, context_length, generation_copy, load_run_policy,
                                  load_tokenizer, needs_engine_copy, stop_token_ids)
from rlvr.recipes.scaffold import Run
from rlvr.recipes.step_metrics import progress_postfix, run_summary, step_metrics
from rlvr.recipes.update import UpdateSettings, overlong_warning
from rlvr.rollout.batch import SampleTensors, sample_tensors
from rlvr.rollout.chat import stop_token_warning
from rlvr.rollout.episodes import build_environments, episode_runner
from rlvr.rollout.evaluate import evaluate_suites
from rlvr.rollout.async_rollout import AsyncRollouts, staleness_metrics
from rlvr.rollout.groups import Group, RolloutStats, collect_groups, scored_groups, verifier_runner
from rlvr.rollout.process_scoring import build_process_scorer
from rlvr.rollout.reward_scoring import build_reward_scorer
from rlvr.rollout.scoring import Scorer
from rlvr.rollout.sampler import ProblemSampler, RankSampler
from rlvr.rollout.suites import (PromptEncoder, announce_suites, check_verifiers, drop_overlong_prompts,
                                 load_eval_suites, load_training_suites)
from rlvr.config.compatibility import check_compatibility
from rlvr.run.alarms import Alarms, VerifierErrors
from rlvr.run.completions_log import CompletionsLog
from rlvr.run.ranks import check_world_size, reduce_metrics, seed_ranks, sharded_run


@dataclass
class Rollout:
    """One step's samples: the groups, their reward tensors ``[P, G]`` and what collecting them cost."""

    groups: list[Group]
    samples: SampleTensors
    stats: RolloutStats
    error_frac: float  # of the samples whose verifier raised
    extra: dict[str, float] = field(default_factory=dict)  # asynchronous generation: the lag, the waits


class RLRun(Run):
    """A run of an RL recipe: :class:`rlvr.recipes.scaffold.Run` plus the pieces both RL loops use."""

    @classmethod
    def start(cls, config, *, resume: bool = False, overwrite: bool = False) -> "RLRun":
        run = super().start(config, config.algorithm.preset, resume=resume, overwrite=overwrite,
                            check=lambda world_size: check_world_size(config, world_size))
        try:
            run._build()
        except BaseException:
            run.__exit__(*sys.exc_info())  # the verifier pool may be up already; the start is undone
            raise
        return run

    def _build(self) -> None:
        config, dist, gen = self.config, self.dist, self.config.generation

        # ---- data and verifiers first: a wrong name or option fails before any model is loaded -
        suites, weights = load_training_suites(config.data)
        eval_suites = load_eval_suites(config)
        problems = [p for named in (suites, eval_suites) for suite in named.values() for p in suite]
        check_verifiers(config.verifier.name, config.verifier.options, problems)
        environments = build_environments(config.environment, problems)  # multi-turn episodes, if any problem has one
        # the compatibility table again, with what only the data knows: whether its problems play episodes
        check_compatibility(config, "load", episodes=bool(environments))
        # every model folder and the engine's package too: a reward model's path or a missing vLLM was found
        # only after the policy had loaded
        check_model_folder(config.model.path)
        if config.reward_model is not None:
            for path in config.reward_model.members:
                check_model_folder(path, "reward_model.path" if config.reward_model.path else "reward_model.paths")
        if config.process_reward is not None:
            check_model_folder(config.process_reward.path, "process_reward.path")
        engines.check_engine(config.engine.name)  # an engine whose optional package is missing: its install hint
        if dist.is_main:
            announce_suites(config, suites, eval_suites)  # verifier, instruction, chat template of each suite
        self.runner = verifier_runner(config.verifier)
        self.cleanup(self.runner.close)

        # ---- prompts, policy, reference, engine, reward model ---------------------------------
        self.tokenizer = load_tokenizer(config.model.path)
        self.encode = PromptEncoder.for_suites(self.tokenizer, suites, eval_suites)  # each suite's chat_template
        stop_ids = stop_token_ids(config.model.path, self.tokenizer)
        warning = stop_token_warning(self.tokenizer, self.encode.templates(), stop_ids)  # a turn's end never stops it
        if warning and dist.is_main:
            print(warning, flush=True)
        self.episodes = episode_runner(config.environment, self.tokenizer, self.encode, stop_ids, environments,
                                       problems)
        context = context_length(config.model.path)
        new_tokens = config.environment.max_episode_tokens if self.episodes else gen.max_new_tokens
        knob = "environment.max_episode_tokens" if self.episodes else "generation.max_new_tokens"  # named in errors
        self.suites = drop_overlong_prompts(suites, self.encode, context, new_tokens, gen.overlong_prompts, knob=knob)
        self.eval_suites = drop_overlong_prompts(eval_suites, self.encode, context,
                                                 config.eval.max_new_tokens or new_tokens, gen.overlong_prompts,
                                                 knob="eval.max_new_tokens" if config.eval.max_new_tokens else knob)
        self.sampler = RankSampler(ProblemSampler(self.suites, weights, seed=config.train.seed), dist.rank,
                                   dist.world_size)
        shard = sharded_run(config.train, dist)
        self.policy = load_run_policy(config.model, dist.device, self.checkpoint, shard=shard,
                                      offload=config.train.cpu_offload)
        if dist.is_main:
            print(f"forward: {forward_note(self.policy)}", flush=True)
        self.reference = Reference(self.policy, needed=config.algorithm.beta > 0, path=config.model.path,
                                   dtype=config.model.dtype, device=str(dist.device), forward=config.model.forward,
                                   logits_chunk_mb=config.model.logits_chunk_mb)
        # the HF engine decodes from a whole copy in the compute dtype: it cannot decode from shards, and float32
        # master weights would read twice the bytes per token
        copy = generation_copy(self.policy, config.model.dtype, dist.device) \
            if config.engine.name == "hf" and needs_engine_copy(self.policy) else None
        self.sampling = SamplingParams(max_new_tokens=gen.max_new_tokens, temperature=gen.temperature, top_p=gen.top_p,
                                       top_k=gen.top_k, stop=tuple(gen.stop), include_stop=gen.include_stop)
        worker = self._generator_process()  # asynchronous generation: the HF engine in a process of its own
        self.engine, self.sync = start_engine(config.engine, self.policy, self.tokenizer, dtype=config.model.dtype,
                                              context=context, copy=copy, built=worker,
                                              deferred=bool(config.async_generation.max_staleness))
        self.cleanup(lambda: call_optional(self.engine, "close"))
        self.async_rollouts = None if worker is None else AsyncRollouts(
            worker, draw=self.sampler.next, encode=self.encode, suites=self.suites,
            num_prompts=config.train.prompts_per_step,
            group_size=config.train.group_size, sampling=self.sampling,
            max_staleness=config.async_generation.max_staleness, seed=config.train.seed,
            episodes=self.episodes is not None)
        # a learned reward model or a process reward model, if any (the config refuses both at once)
        self.scorer: Scorer | None = (build_reward_scorer(config, dist.device, self.tokenizer, self.runner)
                                      or build_process_scorer(config, dist.device, self.tokenizer))
        if self.scorer is not None and dist.is_main:
            print(self.scorer.describe(), flush=True)
        self.settings = UpdateSettings.from_config(config, dist, episodes=self.episodes is not None)
        warning = overlong_warning(config, self.settings.max_len)
        if dist.is_main and warning:
            print(warning, flush=True)
        if dist.is_main and config.algorithm.off_policy == "auto" and self.settings.off_policy != "none":
            print(f"off-policy correction: {self.settings.off_policy} (algorithm.off_policy: auto; the engine's "
                  f"log-probs are not the trainer's own: engine {config.engine.name}, {config.model.dtype}, "
                  f"max_staleness {config.async_generation.max_staleness}; mismatch/kl is logged every step)",
                  flush=True)
        self.alarms = Alarms(config.log.alarm_patience, window=config.log.gold_window,
                             reference=config.log.gold_reference)
        # with gold_vs_proxy in log.stop_on, the policy of the best gold window is kept to be the final one
        self.best_policy = BestPolicy(self.policy, config.log.gold_window) if "gold_vs_proxy" in config.log.stop_on \
            else None
        self.verifier_errors = VerifierErrors(config.verifier.max_error_frac, printer=self.write)

    def _generator_process(self) -> ProcessEngine | None:
        """The generator process of ``async_generation`` (None when it is off), on ``async_generation.device``
        or the trainer's device, in ``model.dtype``."""
        from rlvr.run.runtime import resolve_device

        config, section = self.config, self.config.async_generation
        if section.max_staleness is None:
            return None  # (several ranks were refused at start: rlvr/config/compatibility.py)
        # a device this machine lacks fails here, named, before a process is started for it
        device = self.dist.device if section.device is None else resolve_device(section.device,
                                                                                "async_generation.device")
        threads = section.worker_threads or (torch.get_num_threads() if section.max_staleness == 0
                                             else max(1, (os.cpu_count() or 2) // 2))
        if self.dist.is_main:
            print(f"async generation: max_staleness {section.max_staleness}, a generator process on {device} with "
                  f"{threads} thread(s) beside the trainer's {torch.get_num_threads()}", flush=True)
            if section.max_staleness > 0 and config.algorithm.off_policy == "none":  # (auto picks decoupled)
                print("warning: async generation trains on samples of an older policy without an off-policy "
                      "correction; algorithm.off_policy: decoupled recovered most of what staleness 1 cost the "
                      "quickstart (docs/async-generation.md)", flush=True)
        runner = self.episodes
        episodes = None if runner is None else {  # the worker plays them: its own runner with these settings
            "environments": runner.environments, "default": runner.default, "max_turns": runner.max_turns,
            "max_episode_tokens": runner.max_episode_tokens, "workers": runner.workers,
            "step_timeout_s": runner.step_timeout_s,
            "messages": config.environment.messages, "eos_ids": stop_token_ids(config.model.path, self.tokenizer)}
        return ProcessEngine(config.model.path, self.tokenizer, dtype=config.model.dtype, device=str(device),
                             rng_device=str(self.dist.device), threads=threads,
                             max_batch_size=config.engine.max_batch_size, timeout_s=section.timeout_s,
                             episodes=episodes)

    def restore(self, states: dict[str, Any], *, models: dict[str, Any]) -> int:
        """The recipe's ``states`` and ``models`` plus the run's own (data position, alarms, reward-model
        normalisation) from a checkpoint, or a new run; then the evaluation at step 0 of a new run."""
        own = {"sampler": self.sampler, "alarms": self.alarms, **({"reward_model": self.scorer} if self.scorer else {}),
               **({"async_rollouts": self.async_rollouts} if self.async_rollouts is not None else {}),
               **({"best_policy": self.best_policy} if self.best_policy is not None else {})}
        seed_ranks(self.config.train.seed, self.dist)  # before a resume, whose restored per-rank RNG state must win
        done = super().restore({**states, **own}, models=models, tokenizer=self.tokenizer, sampler=self.sampler)
        self.completions = CompletionsLog.for_run(self.run_dir, self.config.log, done=done, enabled=self.dist.is_main)
        if self.best_policy is not None:
            self.best_policy.push(done)  # the policy that samples the next step
        if done == 0 and self.config.eval.at_start and self.eval_suites and self.dist.is_main:
            self.evaluations[0] = self.evaluate()
            self.tracker.log(0, self.evaluations[0])
        return done

    # ---- a step -------------------------------------------------------------------------------

    def rollout(self, step: int, *, dynamic_sampling: bool = False, max_resample_rounds: int = 0) -> Rollout:
        """Problems -> groups of completions -> rewards -> reward tensors (see ``rlvr/rollout/``); with
        asynchronous generation, the step's samples come from the generator process's queue."""
        config, training = self.config, self.config.train
        if self.async_rollouts is not None:
            return self.completions.record(step, self._async_rollout(step))  # completions.jsonl, when due
        groups, stats = collect_groups(
            engine=self.engine, runner=self.runner, sampler=self.sampler, encode=self.encode,
            num_prompts=training.prompts_per_step // self.dist.world_size, group_size=training.group_size, sampling=self.sampling,
            verifier=config.verifier.name, verifier_options=config.verifier.options, scorer=self.scorer,
            dynamic_sampling=dynamic_sampling, max_resample_rounds=max_resample_rounds, episodes=self.episodes,
        )
        rollout = Rollout(groups, self.tensors(groups), stats, self._error_frac(step, groups),
                          extra=self.scorer.metrics() if self.scorer is not None else {})  # e.g. a PRM's prm/
        return self.completions.record(step, rollout)  # completions.jsonl, when due

    def _async_rollout(self, step: int) -> Rollout:
        """Step ``step``'s samples from the generator process (submitted up to S steps ago), scored now."""
        config = self.config
        sampled = self.async_rollouts.take(step, config.train.steps)
        stats = RolloutStats(rounds=1, generate_s=sampled.info["seconds"])
        groups = scored_groups(sampled.drawn, sampled.prompt_ids, sampled.completions, runner=self.runner,
                               verifier=config.verifier.name, verifier_options=config.verifier.options,
                               scorer=None, stats=stats)
        return Rollout(groups, self.tensors(groups), stats, self._error_frac(step, groups),
                       extra=staleness_metrics(sampled, step - sampled.submitted_at, stats.generate_s))

    def _error_frac(self, step: int, groups: list[Group]) -> float:
        """The share of the step's samples whose verifier raised (alarm past ``verifier.max_error_frac``)."""
        size = self.config.train.group_size
        return self.verifier_errors.update(step, [r for g in groups for r in g.rewards],
                                           lambda i: self.config.verifier.name or groups[i // size].problem.verifier)

    def tensors(self, groups: list[Group]) -> SampleTensors:
        """Reward tensors ``[P, G]`` of ``groups`` with the run's failure and overlong handling."""
        config, algo = self.config, self.config.algorithm
        return sample_tensors(groups, on_failure=config.verifier.on_failure,
                              success_threshold=config.verifier.success_threshold, overlong=algo.overlong,
                              max_new_tokens=self.settings.max_len, overlong_buffer=algo.overlong_buffer,
                              overlong_penalty=algo.overlong_penalty)

    def sleep_engine(self) -> float:
        """Free the engine's memory for the update (an engine with a sleep mode); returns the time the
        update starts."""
        started = time.perf_counter()
        call_optional(self.engine, "sleep")
        return started

    def sync_engine(self) -> dict[str, float]:
        """The engine serves the new weights, proven by the canary; returns the ``sync/`` metrics."""
        call_optional(self.engine, "wake_up")
        return self.sync.push()

    def step_metrics(self, rollout: Rollout, update: dict[str, float], *, seq_kl, lr: float,
                     update_started: float) -> dict[str, float]:
        """Everything a step logs: rewards, lengths, verifier statuses (of the policy's own samples),
        the update's diagnostics, the learning rate and where the time went."""
        step_end = time.perf_counter()
        stats = rollout.stats
        metrics = step_metrics(rollout.groups, rollout.samples, stats, update, seq_kl, mixed=len(self.suites) > 1)
        metrics.update({
            "verify/error_frac": rollout.error_frac,
            "train/lr": lr,
            "time/generate": stats.generate_s,
            "time/verify": stats.verify_s,
            "time/update": step_end - update_started,
            "time/step": step_end - self.step_started,
            "time/log": self.log_s,
            "perf/tokens_per_s": stats.generated_tokens / max(stats.generate_s, 1e-9),
            **rollout.extra,
        })
        return metrics

    def end_step(self, step: int, metrics: dict[str, float], *, postfix: dict[str, str] | None = None) -> None:
        """Metrics over ranks, alarms, the evaluation when due (every ``eval.every`` steps and after the
        last), then log, progress, plot and checkpoint."""
        metrics = reduce_metrics(metrics, self.dist)  # every rank's alarms see the same numbers and agree
        fired = len(self.alarms.fired)
        for message in self.alarms.update(step, metrics):
            if self.dist.is_main:
                self.write(message)
        if self.best_policy is not None:
            self.best_policy.push(step)
            if self.alarms.new_best:
                self.best_policy.keep_oldest()
        for _, name in self.alarms.fired[fired:]:
            if name in self.config.log.stop_on:
                self.stop(f"alarm {name} at step {step}")
        if self.stopped and self.best_policy is not None and self.best_policy.step is not None:
            self.best_policy.restore()  # the run ends on the policy of its best gold window
            self.sync.push()  # which the engine serves for the final evaluation
            metrics["train/final_policy_step"] = float(self.best_policy.step)  # the policy after this step
        ev = self.config.eval
        due = (ev.every and step % ev.every == 0) or (step == self.config.train.steps and ev.at_end) or self.stopped
        if self.eval_suites and self.dist.is_main and due:
            metrics.update(self.evaluate())
            self.evaluations[step] = {k: v for k, v in metrics.items() if k.startswith("eval/")}
        super().end_step(step, metrics, postfix={**progress_postfix(metrics), **(postfix or {})})

    def evaluate(self) -> dict[str, float]:
        """``eval/`` metrics of the current policy on every held-out suite."""
        return evaluate_suites(self.engine, self.encode, self.eval_suites, self.runner, eval_config=self.config.eval,
                               generation=self.config.generation, verifier=self.config.verifier, episodes=self.episodes)

    # ---- the end ------------------------------------------------------------------------------

    def finish(self, *, save_final: Callable, models: tuple) -> dict[str, Any]:
        """``summary.json``: accuracy before (step 0) and after (the last evaluation), the alarms, and which
        step's policy ``final/`` holds when a stop alarm brought back the best one."""
        self.sync.settle()  # asynchronous generation: the last publication's canary, checked before the end
        summary = run_summary(self.config, self.evaluations, self.alarms)
        if self.stopped and self.best_policy is not None and self.best_policy.step is not None:
            summary["final_policy_step"] = self.best_policy.step
        return super().finish(summary, save_final=save_final, models=models)


class BestPolicy:
    """The policy of the run's best gold window, kept for ``log.stop_on: [gold_vs_proxy]``: copies of the
    trainable parameters (LoRA: the adapters only) on the CPU. The samples of a window of ``window``
    steps ending at step t came from the policies after steps t - window .. t - 1, so the last
    ``window + 1`` policies are kept and the oldest of them is the one kept when the window is the best."""

    def __init__(self, policy, window: int):
        self.params = [p for p in policy.parameters() if p.requires_grad]
        self.recent: collections.deque = collections.deque(maxlen=window + 1)  # (step, parameters)
        self.step: int | None = None  # the step after which the kept policy was taken
        self.saved: list[torch.Tensor] | None = None

    def push(self, step: int) -> None:
        """The policy after ``step``'s update (0: the starting policy)."""
        self.recent.append((step, [p.detach().to("cpu", copy=True) for p in self.params]))

    def keep_oldest(self) -> None:
        self.step, self.saved = self.recent[0]

    @torch.no_grad()
    def restore(self) -> None:
        for p, saved in zip(self.params, self.saved):
            p.copy_(saved)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "saved": self.saved}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.saved = state["step"], state["saved"]
