"""The critic-free recipe: GRPO, Dr. GRPO, DAPO, RLOO and REINFORCE++ as presets of one loop.

One step, top to bottom:

    sample problems -> generate G completions each -> verify -> rewards [P, G]
    -> (guidance: a gold solution into each group that got nothing right, if asked)
    -> (reference log-probs when beta > 0; KL in the reward if asked) -> advantages
    -> ppo_epochs x minibatches of clipped-surrogate updates (+ KL / entropy terms)
    -> the engine serves the new weights -> log, alarms -> evaluate, checkpoint

Run it with ``rlvr train CONFIG.yaml [key=value ...]`` or ``train(load_config(RunConfig, path))``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from rlvr.algorithms.advantages import ADVANTAGE_ESTIMATORS
from rlvr.algorithms.losses import KL_ESTIMATORS
from rlvr.config import RunConfig
from rlvr.engines import SamplingParams
from rlvr.engines.base import call_optional
from rlvr.evaluate import evaluate_suites
from rlvr.guidance import guide_with_solutions, policy_logprobs_of_rows, solution_encoder
from rlvr.models import Reference, context_length, load_run_policy, load_tokenizer, save_final_model
from rlvr.progress import make_progress
from rlvr.reward_scoring import build_reward_scorer
from rlvr.ranks import (open_tracker, reduce_metrics, replica_check, resume_or_start, save_run_checkpoint, seed_ranks,
                        start_run)
from rlvr.rollout import ProblemSampler, RankSampler, collate, collect_groups, sample_tensors, verifier_runner
from rlvr.runtime import optimizer_from_config
from rlvr.step_metrics import progress_postfix, run_summary, step_metrics
from rlvr.suites import (PromptEncoder, announce_suites, check_verifiers, drop_overlong_prompts, load_eval_suites,
                         load_training_suites)
from rlvr.tracking import Alarms, VerifierErrors, plot_metrics
from rlvr.update import UpdateSettings, no_grad_logprobs, reference_logprobs, update_policy
from rlvr.weight_sync import start_engine


def train(config: RunConfig, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Train a policy with the configured critic-free algorithm; returns the run summary.

    ``resume`` continues the run in ``config.out`` from its latest checkpoint; ``overwrite``
    replaces a previous run there (without either, a folder that holds a run is refused). Under
    ``torchrun`` each rank trains on its share of the groups (see ``rlvr/ranks.py``).
    """
    config, run_dir, dist, checkpoint = start_run(config, resume=resume, overwrite=overwrite)
    device, algo, gen, t = dist.device, config.algorithm, config.generation, config.train

    # ---- data and verifiers first: a wrong name or option fails before any model is loaded -----
    suites, weights = load_training_suites(config.data)
    eval_suites = load_eval_suites(config)
    check_verifiers(config.verifier.name, config.verifier.options,
                    [p for problems in [*suites.values(), *eval_suites.values()] for p in problems])
    if dist.is_main:
        announce_suites(config, suites, eval_suites)  # verifier, instruction, chat template of each suite
    runner = verifier_runner(config.verifier)

    # ---- models, engine, optimizer, logging --------------------------------------------------
    tokenizer = load_tokenizer(config.model.path)
    encode = PromptEncoder.for_suites(tokenizer, suites, eval_suites)  # each suite's chat_template
    context = context_length(config.model.path)
    suites = drop_overlong_prompts(suites, encode, context, gen.max_new_tokens, gen.overlong_prompts)
    eval_suites = drop_overlong_prompts(eval_suites, encode, context, _eval_max_new_tokens(config), gen.overlong_prompts)
    sampler = RankSampler(ProblemSampler(suites, weights, seed=t.seed), dist.rank, dist.world_size)
    policy = load_run_policy(config.model, device, checkpoint)
    reference = Reference(policy, needed=algo.beta > 0, path=config.model.path, dtype=config.model.dtype, device=str(device),
                          forward=config.model.forward)
    engine, sync = start_engine(config.engine, policy, tokenizer, dtype=config.model.dtype, context=context)
    scorer = build_reward_scorer(config, device, tokenizer)  # a learned reward model, when configured
    optimizer, scheduler = optimizer_from_config(policy.parameters(), config.optim, t.steps)
    sampling = SamplingParams(max_new_tokens=gen.max_new_tokens, temperature=gen.temperature, top_p=gen.top_p, top_k=gen.top_k)
    settings = UpdateSettings.from_config(config, dist)
    sample_options = dict(on_failure=config.verifier.on_failure, success_threshold=config.verifier.success_threshold,
                          overlong=algo.overlong, max_new_tokens=gen.max_new_tokens,
                          overlong_buffer=algo.overlong_buffer, overlong_penalty=algo.overlong_penalty)
    encode_solution = solution_encoder(tokenizer)

    tracker = open_tracker(config, run_dir, dist)
    alarms = Alarms(config.log.alarm_patience, window=config.log.divergence_window)
    states = {"optimizer": optimizer, "scheduler": scheduler, "sampler": sampler, "alarms": alarms,
              **({"reward_model": scorer} if scorer else {})}
    seed_ranks(t.seed, dist)  # before a resume, whose restored per-rank RNG state must win
    start_step, wall_before, evaluations = resume_or_start(config, run_dir, checkpoint, states, tracker, dist, sampler)
    started = time.perf_counter()
    if start_step == 0 and config.eval.at_start and eval_suites and dist.is_main:
        evaluations[0] = _evaluate(engine, encode, eval_suites, runner, config)
        tracker.log(0, evaluations[0])

    progress = make_progress(t.steps, algo.preset, initial=start_step, enabled=config.log.progress and dist.is_main)
    verifier_errors = VerifierErrors(config.verifier.max_error_frac, printer=progress.write if progress else print)
    log_s = 0.0  # time/log: the previous step's metrics line, progress, plot and checkpoint (none before the first)
    try:
        for step in range(start_step + 1, t.steps + 1):
            step_start = time.perf_counter()

            # ---- 1. rollout: problems -> groups -> rewards ------------------------------------
            groups, rollout = collect_groups(
                engine=engine, runner=runner, sampler=sampler, encode=encode, num_prompts=t.prompts_per_step // dist.world_size,
                group_size=t.group_size, sampling=sampling, verifier=config.verifier.name,
                verifier_options=config.verifier.options, reward_model=scorer,
                dynamic_sampling=algo.dynamic_sampling, max_resample_rounds=algo.max_resample_rounds,
            )
            rewards = [r for g in groups for r in g.rewards]
            error_frac = verifier_errors.update(
                step, rewards, lambda i: config.verifier.name or groups[i // t.group_size].problem.verifier)
            samples = sample_tensors(groups, **sample_options)  # the policy's own samples: what the step logs

            # ---- 1b. guidance: gold solutions into the groups that got nothing right (optional) --
            trained, guidance = groups, None
            if algo.guidance == "solution":
                guidance = guide_with_solutions(groups, runner, encode=encode_solution, verifier=config.verifier.name,
                                                options=config.verifier.options, max_new_tokens=gen.max_new_tokens,
                                                threshold=config.verifier.success_threshold, copies=algo.guidance_samples)
                trained = guidance.groups
            trained_samples = sample_tensors(trained, **sample_options) if guidance and guidance.rows else samples
            batch = collate(trained, engine.pad_id).to(device)
            update_start = time.perf_counter()
            call_optional(engine, "sleep")  # an engine with a sleep mode frees its memory for the update
            if guidance is not None:
                policy_logprobs_of_rows(policy, batch, guidance.rows, t.micro_batch_size, gen.temperature)

            # ---- 2. reference, rewards -> advantages ------------------------------------------
            scores = trained_samples.scores
            seq_kl = None
            if algo.beta > 0:
                batch.ref_logp = reference_logprobs(reference, batch, t.micro_batch_size, gen.temperature)
            if algo.beta > 0 and algo.kl_placement == "reward":  # with the trainer's log-probs, not the engine's
                batch.old_logp = no_grad_logprobs(policy, batch, t.micro_batch_size, gen.temperature)
                kl_tokens = KL_ESTIMATORS[algo.kl_estimator](batch.old_logp, batch.ref_logp) * batch.response_mask
                seq_kl = kl_tokens.sum(dim=1).view_as(scores).cpu()
                scores = scores - algo.beta * seq_kl
            advantages = ADVANTAGE_ESTIMATORS[algo.advantage](scores, trained_samples.valid)
            batch.advantages = advantages.flatten().to(device)
            keep = (trained_samples.valid.float() * trained_samples.loss_weight).flatten().to(device)
            batch.response_mask = batch.response_mask * keep[:, None]

            # ---- 3. policy update --------------------------------------------------------------
            update = update_policy(policy, batch, optimizer, settings)
            scheduler.step()

            # ---- 4. the engine serves the new weights, proven by the canary --------------------
            call_optional(engine, "wake_up")
            update.update(sync.push())
            step_end = time.perf_counter()

            # ---- 5. metrics, alarms ------------------------------------------------------------
            metrics = step_metrics(groups, samples, rollout, update, seq_kl, mixed=len(suites) > 1)
            metrics.update(guidance.metrics() if guidance is not None else {})
            metrics.update({
                "verify/error_frac": error_frac,
                "train/lr": scheduler.get_last_lr()[0],
                "time/generate": rollout.generate_s,
                "time/verify": rollout.verify_s,
                "time/update": step_end - update_start,
                "time/step": step_end - step_start,
                "time/log": log_s,
                "perf/tokens_per_s": rollout.generated_tokens / max(rollout.generate_s, 1e-9),
            })
            metrics = reduce_metrics(metrics, dist)  # every rank's alarms see the same numbers
            for message in alarms.update(step, metrics) if dist.is_main else ():
                (progress.write if progress is not None else print)(message)

            # ---- 6. evaluate (on schedule and after the last step), checkpoint ------------------
            periodic = config.eval.every and step % config.eval.every == 0
            if eval_suites and dist.is_main and (periodic or (step == t.steps and config.eval.at_end)):
                metrics.update(_evaluate(engine, encode, eval_suites, runner, config))
                evaluations[step] = {k: v for k, v in metrics.items() if k.startswith("eval/")}
            log_start = time.perf_counter()
            tracker.log(step, metrics)
            if progress is not None:
                progress.set_postfix(**progress_postfix(metrics))
                progress.update(1)
            if config.log.plot and config.log.plot_every and step % config.log.plot_every == 0 and dist.is_main:
                plot_metrics(tracker.path, run_dir / "metrics.png", title=str(run_dir))
            if (config.checkpoint.every and step % config.checkpoint.every == 0) or (step == t.steps and config.checkpoint.at_end):
                save_run_checkpoint(run_dir, step, dist=dist, sampler=sampler, models={"policy": policy},
                                    tokenizer=tokenizer, states=states, keep=config.checkpoint.keep,
                                    extra={"wall_s": wall_before + time.perf_counter() - started, "evaluations": evaluations})
            log_s = time.perf_counter() - log_start
    finally:
        if progress is not None:
            progress.close()
        runner.close()
        call_optional(engine, "close")

    # ---- the end: model, plots, summary (the final evaluation ran with the last step), rank 0 --
    replicas = replica_check(dist, policy)
    tracker.close()
    summary = run_summary(config, evaluations, alarms, wall_before + time.perf_counter() - started)
    if dist.is_main:
        if config.checkpoint.final_model:
            save_final_model(policy, tokenizer, run_dir / "final")
        if config.log.plot:
            plot_metrics(tracker.path, run_dir / "metrics.png", title=str(run_dir))
        (run_dir / "summary.json").write_text(json.dumps(summary | ({"replicas": replicas} if replicas else {}), indent=2))
    return summary


def _evaluate(engine, encode, eval_suites, runner, config: RunConfig) -> dict[str, float]:
    return evaluate_suites(engine, encode, eval_suites, runner, eval_config=config.eval,
                           generation=config.generation, verifier=config.verifier)


def _eval_max_new_tokens(config: RunConfig) -> int:
    return config.eval.max_new_tokens or config.generation.max_new_tokens
