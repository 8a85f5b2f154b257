"""The critic-free recipe: GRPO, Dr. GRPO, DAPO, RLOO and REINFORCE++ as presets of one loop.

One step, top to bottom:

    sample problems -> generate G completions each -> verify -> rewards [P, G]
    -> (reference log-probs when beta > 0; KL in the reward if asked) -> advantages
    -> ppo_epochs x minibatches of clipped-surrogate updates (+ KL / entropy terms)
    -> the engine serves the new weights -> log, alarms -> evaluate, checkpoint

Run it with ``rlvr train CONFIG.yaml [key=value ...]`` or ``train(load_config(RunConfig, path))``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from rlvr.algorithms.advantages import ADVANTAGE_ESTIMATORS
from rlvr.algorithms.losses import KL_ESTIMATORS, aggregate, policy_loss, truncated_importance_weights
from rlvr.checkpoint import load_trainer_state, resume_checkpoint, save_checkpoint
from rlvr.config import RunConfig, save_config
from rlvr.engines import SamplingParams, build_engine
from rlvr.evaluate import evaluate
from rlvr.logprobs import completion_logprobs
from rlvr.models import Reference, context_length, load_policy, load_tokenizer, save_final_model
from rlvr.rollout import Batch, ProblemSampler, collate, collect_groups, sample_tensors
from rlvr.progress import make_progress
from rlvr.run_folder import prepare_run_folder
from rlvr.runtime import build_optimizer, build_scheduler, quiet_transformers, resolve_device, seed_everything, set_threads, set_rng_state
from rlvr.suites import PromptEncoder, drop_overlong_prompts, load_eval_suites, load_training_suites
from rlvr.tracking import Alarms, Tracker, VerifierErrors, plot_metrics
from rlvr.verifiers.registry import get_verifier
from rlvr.verifiers.runner import VerifierRunner
from rlvr.weight_sync import EngineSync


def train(config: RunConfig, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Train a policy with the configured critic-free algorithm; returns the run summary.

    ``resume`` continues the run in ``config.out`` from its latest checkpoint; ``overwrite``
    replaces a previous run there (without either, a folder that holds a run is refused).
    """
    quiet_transformers()
    device = resolve_device(config.train.device)
    run_dir = prepare_run_folder(config.out, name=config.algorithm.preset, resume=resume, overwrite=overwrite)
    config = config.model_copy(update={"out": str(run_dir)})
    print(f"run folder: {run_dir}" + (" (resuming)" if resume else ""), flush=True)
    seed_everything(config.train.seed)
    set_threads(config.train.threads)
    algo, gen, t = config.algorithm, config.generation, config.train
    checkpoint = resume_checkpoint(run_dir) if resume else None

    # ---- data and verifiers first: a wrong name or option fails before any model is loaded -----
    suites, weights = load_training_suites(config.data)
    eval_suites = load_eval_suites(config)
    check_verifiers(config.verifier.name, config.verifier.options,
                    [p for problems in [*suites.values(), *eval_suites.values()] for p in problems])
    runner = VerifierRunner(workers=config.verifier.workers, timeout_s=config.verifier.timeout_s)

    # ---- models, engine, optimizer, logging --------------------------------------------------
    tokenizer = load_tokenizer(config.model.path)
    encode = PromptEncoder(tokenizer)
    context = context_length(config.model.path)
    suites = drop_overlong_prompts(suites, encode, context, gen.max_new_tokens, gen.overlong_prompts)
    eval_suites = drop_overlong_prompts(eval_suites, encode, context, _eval_max_new_tokens(config), gen.overlong_prompts)
    sampler = ProblemSampler(suites, weights, seed=t.seed)
    policy = _load_policy(config, device, checkpoint)
    reference = Reference(policy, needed=algo.beta > 0, path=config.model.path, dtype=config.model.dtype, device=str(device))
    engine, sync = _start_engine(config, policy, tokenizer, context)
    optimizer = build_optimizer(policy.parameters(), lr=config.optim.lr, weight_decay=config.optim.weight_decay, betas=config.optim.betas)
    scheduler = build_scheduler(optimizer, total=t.steps, warmup=config.optim.warmup_steps,
                                schedule=config.optim.schedule, min_ratio=config.optim.min_lr_ratio)
    sampling = SamplingParams(max_new_tokens=gen.max_new_tokens, temperature=gen.temperature, top_p=gen.top_p, top_k=gen.top_k)

    tracker = Tracker(run_dir, tensorboard=config.log.tensorboard, wandb=config.log.wandb,
                      wandb_project=config.log.wandb_project, config=config.model_dump(mode="json"))
    alarms = Alarms(config.log.alarm_patience)
    start_step, wall_before, evaluations = 0, 0.0, {}
    if checkpoint is not None:
        start_step, wall_before, evaluations = _restore(checkpoint, optimizer, scheduler, sampler, alarms)
        tracker.truncate(start_step)
        print(f"resuming from step {start_step} of {t.steps}")
    else:
        save_config(config, run_dir / "config.yaml")
    started = time.perf_counter()
    if start_step == 0 and config.eval.at_start and eval_suites:
        evaluations[0] = _evaluate_suites(engine, encode, eval_suites, runner, config)
        tracker.log(0, evaluations[0])

    progress = _progress_bar(config, start_step)
    verifier_errors = VerifierErrors(config.verifier.max_error_frac, printer=progress.write if progress else print)
    try:
        for step in range(start_step + 1, t.steps + 1):
            step_start = time.perf_counter()

            # ---- 1. rollout: problems -> groups -> rewards ------------------------------------
            groups, rollout = collect_groups(
                engine=engine, runner=runner, sampler=sampler, encode=encode, num_prompts=t.prompts_per_step,
                group_size=t.group_size, sampling=sampling, verifier=config.verifier.name,
                verifier_options=config.verifier.options,
                dynamic_sampling=algo.dynamic_sampling, max_resample_rounds=algo.max_resample_rounds,
            )
            rewards = [r for g in groups for r in g.rewards]
            error_frac = verifier_errors.update(
                step, rewards, lambda i: config.verifier.name or groups[i // t.group_size].problem.verifier)
            samples = sample_tensors(
                groups, on_failure=config.verifier.on_failure, success_threshold=config.verifier.success_threshold,
                overlong=algo.overlong, max_new_tokens=gen.max_new_tokens, overlong_buffer=algo.overlong_buffer,
                overlong_penalty=algo.overlong_penalty,
            )
            batch = collate(groups, engine.pad_id).to(device)
            update_start = time.perf_counter()
            _maybe_call(engine, "sleep")  # an engine with a sleep mode frees its memory for the update

            # ---- 2. reference, rewards -> advantages ------------------------------------------
            scores = samples.scores
            seq_kl = None
            if algo.beta > 0:
                batch.ref_logp = _reference_logprobs(reference, batch, t.micro_batch_size, gen.temperature)
            if algo.beta > 0 and algo.kl_placement == "reward":  # with the trainer's log-probs, not the engine's
                batch.old_logp = _no_grad_logprobs(policy, batch, t.micro_batch_size, gen.temperature)
                kl_tokens = KL_ESTIMATORS[algo.kl_estimator](batch.old_logp, batch.ref_logp) * batch.response_mask
                seq_kl = kl_tokens.sum(dim=1).view_as(scores).cpu()
                scores = scores - algo.beta * seq_kl
            advantages = ADVANTAGE_ESTIMATORS[algo.advantage](scores, samples.valid)
            batch.advantages = advantages.flatten().to(device)
            keep = (samples.valid.float() * samples.loss_weight).flatten().to(device)
            batch.response_mask = batch.response_mask * keep[:, None]

            # ---- 3. policy update --------------------------------------------------------------
            update = update_policy(policy, batch, optimizer, config)
            scheduler.step()

            # ---- 4. the engine serves the new weights, proven by the canary --------------------
            _maybe_call(engine, "wake_up")
            update.update(sync.push())
            step_end = time.perf_counter()

            # ---- 5. metrics, alarms ------------------------------------------------------------
            metrics = step_metrics(groups, samples, rollout, update, seq_kl, mixed=len(suites) > 1)
            metrics.update({
                "verify/error_frac": error_frac,
                "train/lr": scheduler.get_last_lr()[0],
                "time/generate": rollout.generate_s,
                "time/verify": rollout.verify_s,
                "time/update": step_end - update_start,
                "time/step": step_end - step_start,
                "perf/tokens_per_s": rollout.generated_tokens / max(rollout.generate_s, 1e-9),
            })
            for message in alarms.update(step, metrics):
                (progress.write if progress is not None else print)(message)

            # ---- 6. evaluate (on schedule and after the last step), checkpoint ------------------
            periodic = config.eval.every and step % config.eval.every == 0
            if eval_suites and (periodic or (step == t.steps and config.eval.at_end)):
                metrics.update(_evaluate_suites(engine, encode, eval_suites, runner, config))
                evaluations[step] = {k: v for k, v in metrics.items() if k.startswith("eval/")}
            tracker.log(step, metrics)
            if progress is not None:
                progress.set_postfix(reward=f"{metrics['reward/mean']:.3f}", acc=f"{metrics['reward/accuracy']:.3f}")
                progress.update(1)
            if config.log.plot_every and step % config.log.plot_every == 0:
                plot_metrics(tracker.path, run_dir / "metrics.png", title=str(run_dir))
            if (config.checkpoint.every and step % config.checkpoint.every == 0) or step == t.steps:
                save_checkpoint(
                    run_dir, step, model=policy, tokenizer=tokenizer, optimizer=optimizer, scheduler=scheduler,
                    keep=config.checkpoint.keep,
                    extra={"sampler": sampler.state_dict(), "alarms": alarms.state_dict(),
                           "wall_s": wall_before + time.perf_counter() - started, "evaluations": evaluations},
                )
    finally:
        if progress is not None:
            progress.close()
        runner.close()
        _maybe_call(engine, "close")

    # ---- the end: model, plots, summary (the final evaluation ran with the last step) ---------
    save_final_model(policy, tokenizer, run_dir / "final")
    plot_metrics(tracker.path, run_dir / "metrics.png", title=str(run_dir))
    tracker.close()
    summary = _summary(config, evaluations, alarms, wall_before + time.perf_counter() - started)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


# ---------------------------------------------------------------------------------------------
# The update
# ---------------------------------------------------------------------------------------------


def update_policy(policy, batch: Batch, optimizer: torch.optim.Optimizer, config: RunConfig) -> dict[str, float]:
    """``ppo_epochs`` passes of ``minibatches`` optimizer steps over ``batch``; returns mean diagnostics.

    When the batch is used exactly once (one epoch, one minibatch) the policy that sampled it is the
    policy being differentiated, so pi_old = pi_theta.detach() and no extra pass is made. Otherwise
    pi_old comes from the engine's sampling log-probs or from one recomputing pass before any step.
    Rows whose loss is exactly zero whatever the weights (see :func:`rows_with_gradient`) are not
    computed at all; the loss denominators still count them, so the gradient is unchanged.
    """
    algo, gen = config.algorithm, config.generation
    single_pass = algo.ppo_epochs == 1 and algo.minibatches == 1
    if not single_pass and batch.old_logp is None:
        batch.old_logp = _old_logprobs(policy, batch, config)
    n = len(batch)
    minibatch_size = math.ceil(n / algo.minibatches)
    params = [p for p in policy.parameters() if p.requires_grad]
    sums: dict[str, float] = {}
    weight_total = loss_total = pg_total = 0.0
    mismatch_sum = mismatch_weight = mismatch_max = 0.0
    grad_norms, computed_rows = [], 0
    for epoch in range(algo.ppo_epochs):
        order = torch.randperm(n) if not single_pass else torch.arange(n)
        for start in range(0, n, minibatch_size):
            minibatch = batch.select(order[start : start + minibatch_size].to(batch.input_ids.device))
            agg = dict(num_seqs=len(minibatch), num_tokens=float(minibatch.response_mask.sum()), max_len=gen.max_new_tokens)
            rows = rows_with_gradient(minibatch, config)
            computed_rows += len(rows)
            optimizer.zero_grad(set_to_none=False)  # zero tensors: a step with no active rows is a zero-gradient step
            for micro_rows in rows.split(config.train.micro_batch_size) if len(rows) else ():
                micro = minibatch.select(micro_rows)
                logp, entropy = completion_logprobs(
                    policy, micro.input_ids, micro.attention_mask, micro.completion_len, gen.temperature,
                    with_entropy=True, entropy_grad=algo.entropy_coef > 0,
                )
                old = logp.detach() if single_pass else micro.old_logp
                tis = truncated_importance_weights(old, micro.engine_logp, algo.tis_cap) if algo.tis_cap else None
                loss, stats = policy_loss(logp, old, micro.advantages, micro.response_mask, clip_low=algo.clip_low,
                                          clip_high=algo.clip_high, dual_clip=algo.dual_clip, agg=algo.loss_agg,
                                          loss=algo.policy_loss, token_weights=tis, **agg)
                pg_total += loss.item()
                w = float(micro.response_mask.sum())
                terms = {}
                if micro.ref_logp is not None:
                    kl = KL_ESTIMATORS[algo.kl_estimator](logp, micro.ref_logp)
                    terms["train/kl_ref"] = _masked_mean(kl, micro.response_mask)
                    if algo.kl_placement == "loss":
                        loss = loss + algo.beta * aggregate(kl, micro.response_mask, algo.loss_agg, **agg)
                if algo.entropy_coef > 0:
                    loss = loss - algo.entropy_coef * aggregate(entropy, micro.response_mask, algo.loss_agg, **agg)
                loss.backward()
                loss_total += loss.item()
                terms.update({
                    "train/entropy": _masked_mean(entropy, micro.response_mask),
                    "train/clip_frac_low": stats.clip_frac_low,
                    "train/clip_frac_high": stats.clip_frac_high,
                    "train/dual_clip_frac": stats.dual_clip_frac,
                    "train/ratio_mean": stats.ratio_mean,
                    "train/approx_kl_old": stats.approx_kl,
                })
                if tis is not None:
                    terms["train/tis_weight_mean"] = _masked_mean(tis, micro.response_mask)
                if not grad_norms:  # before any step: trainer-inference mismatch on the sampled tokens
                    gap = (logp.detach() - micro.engine_logp).abs() * micro.response_mask
                    mismatch_sum, mismatch_weight = mismatch_sum + float(gap.sum()), mismatch_weight + w
                    mismatch_max = max(mismatch_max, float(gap.max()) if gap.numel() else 0.0)
                for key, value in terms.items():
                    sums[key] = sums.get(key, 0.0) + value * w
                weight_total += w
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, config.optim.grad_clip)))
            optimizer.step()
    steps = len(grad_norms)
    out = {key: value / max(weight_total, 1e-9) for key, value in sums.items()}  # token-weighted means
    out.update({
        "train/loss": loss_total / steps,  # each optimizer step's full loss, averaged over the steps
        "train/pg_loss": pg_total / steps,
        "train/grad_norm": sum(grad_norms) / steps,
        "train/optimizer_steps": float(steps),
        "train/computed_rows_frac": computed_rows / (n * algo.ppo_epochs),
    })
    if mismatch_weight:
        out["mismatch/logprob_abs_diff_mean"] = mismatch_sum / mismatch_weight
        out["mismatch/logprob_abs_diff_max"] = mismatch_max
    return out


def rows_with_gradient(minibatch: Batch, config: RunConfig) -> torch.Tensor:
    """Indices of the rows whose loss can be non-zero.

    A row with no unmasked token contributes nothing. Without a KL term in the loss and without an
    entropy bonus, a row with advantage 0 (e.g. every sample of a zero-variance group) contributes
    exactly 0 as well: -A * rho = 0 for any rho. Those rows are not computed.
    """
    algo = config.algorithm
    active = minibatch.response_mask.sum(dim=1) > 0
    kl_in_loss = algo.beta > 0 and algo.kl_placement == "loss"
    if not kl_in_loss and algo.entropy_coef == 0:
        active &= minibatch.advantages != 0
    return active.nonzero().squeeze(1)


def _old_logprobs(policy, batch: Batch, config: RunConfig) -> torch.Tensor:
    source = config.algorithm.old_logprobs
    if source == "auto":
        source = "engine" if config.engine.name == "hf" and config.model.dtype == "float32" else "recompute"
    if source == "engine":
        return batch.engine_logp
    return _no_grad_logprobs(policy, batch, config.train.micro_batch_size, config.generation.temperature)


@torch.no_grad()
def _no_grad_logprobs(model, batch: Batch, micro_batch_size: int, temperature: float) -> torch.Tensor:
    parts = []
    for start in range(0, len(batch), micro_batch_size):
        end = min(start + micro_batch_size, len(batch))
        logp, _ = completion_logprobs(model, batch.input_ids[start:end], batch.attention_mask[start:end],
                                      batch.completion_len, temperature)
        parts.append(logp)
    return torch.cat(parts)


def _reference_logprobs(reference: Reference, batch: Batch, micro_batch_size: int, temperature: float) -> torch.Tensor:
    with reference.model() as ref_model:
        return _no_grad_logprobs(ref_model, batch, micro_batch_size, temperature)


def _start_engine(config: RunConfig, policy, tokenizer, context: int | None):
    """The configured engine, given the policy's weights and checked by the canary once."""
    engine = build_engine(config.engine.name, policy, tokenizer, max_batch_size=config.engine.max_batch_size,
                          **config.engine.options)
    sync = EngineSync(engine, policy, tokenizer, dtype=config.model.dtype, tolerance=config.engine.canary_tolerance,
                      canary=config.engine.canary, max_len=context)
    try:
        sync.push()  # a resumed or LoRA policy differs from the folder the engine loaded
    except BaseException:
        _maybe_call(engine, "close")
        raise
    return engine, sync


def _maybe_call(engine, method: str) -> None:
    """Call an optional engine method (``sleep``, ``wake_up``, ``close``) when the engine has it."""
    function = getattr(engine, method, None)
    if callable(function):
        function()


def check_verifiers(override: str | None, options: dict, problems) -> None:
    """Every verifier the run will call exists and accepts its options: each is built once here,
    before any model is loaded (an unknown name lists the registered ones, a bad option the valid ones)."""
    for name in {override} if override else {p.verifier for p in problems}:
        get_verifier(name, **(options if override else {}))


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values.detach() * mask).sum() / mask.sum().clamp(min=1))


# ---------------------------------------------------------------------------------------------
# Metrics, evaluation, the end of a run
# ---------------------------------------------------------------------------------------------


def step_metrics(groups, samples, rollout, update: dict[str, float], seq_kl, mixed: bool) -> dict[str, float]:
    """Everything one step logs (see the namespaces in ``rlvr/tracking.py``)."""
    raw, valid = samples.raw_scores, samples.valid
    lengths = samples.lengths.float()
    rewards = [r for g in groups for r in g.rewards]
    metrics: dict[str, float] = {
        "reward/mean": float(raw[valid].mean()) if valid.any() else 0.0,
        "reward/std": float(raw[valid].std()) if valid.sum() > 1 else 0.0,
        "reward/accuracy": float(samples.correct.float().mean()),
        "reward/shaped_mean": float(samples.scores[valid].mean()) if valid.any() else 0.0,
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/truncation_rate": float(samples.truncated.float().mean()),
        "rollout/zero_variance_frac": rollout.zero_variance_groups / max(1, rollout.groups_seen),
        "rollout/dropped_groups": float(rollout.dropped_groups),
        "rollout/rounds": float(rollout.rounds),
        "verify/masked_frac": float((~valid).float().mean()),
        "verify/latency_p50_ms": 1e3 * sorted(r.latency_s for r in rewards)[len(rewards) // 2] if rewards else 0.0,
        "verify/latency_max_ms": 1e3 * max((r.latency_s for r in rewards), default=0.0),
    }
    for status, count in rollout.status.items():
        metrics[f"verify/status_{status}"] = float(count)
    reporting = [r for r in rewards if "extracted" in r.info]
    if reporting:
        metrics["verify/no_answer_frac"] = sum(r.info["extracted"] is None for r in reporting) / len(reporting)
    components: dict[str, list[float]] = {}
    for r in rewards:
        for name, value in r.components.items():
            components.setdefault(name, []).append(value)
    for name, values in components.items():
        metrics[f"reward/{name}"] = sum(values) / len(values)
    if mixed:  # several training suites: accuracy of each one drawn this step
        for suite in sorted({g.suite for g in groups}):
            rows = [i for i, g in enumerate(groups) if g.suite == suite]
            metrics[f"reward/{suite}/accuracy"] = float(samples.correct[rows].float().mean())
    if seq_kl is not None:
        metrics["reward/kl_seq_mean"] = float(seq_kl.mean())
    metrics.update(update)
    return metrics


def _eval_max_new_tokens(config: RunConfig) -> int:
    return config.eval.max_new_tokens or config.generation.max_new_tokens


def _evaluate_suites(engine, encode, eval_suites, runner, config: RunConfig) -> dict[str, float]:
    sampling = SamplingParams(
        max_new_tokens=_eval_max_new_tokens(config),
        temperature=config.generation.temperature, top_p=config.generation.top_p, top_k=config.generation.top_k,
        greedy=config.eval.greedy,
    )
    metrics: dict[str, float] = {}
    accuracies = []
    for name, problems in eval_suites.items():
        result = evaluate(engine, encode, problems, runner, sampling=sampling, samples=config.eval.samples,
                          ks=(1,), verifier=config.verifier.name, verifier_options=config.verifier.options,
                          success_threshold=config.verifier.success_threshold)
        metrics[f"eval/{name}/accuracy"] = result.accuracy
        metrics[f"eval/{name}/mean_score"] = result.mean_score
        accuracies.append(result.accuracy)
    metrics["eval/accuracy"] = sum(accuracies) / len(accuracies)
    return metrics


def _progress_bar(config: RunConfig, start_step: int):
    return make_progress(config.train.steps, config.algorithm.preset, initial=start_step, enabled=config.log.progress)


def _restore(checkpoint: Path, optimizer, scheduler, sampler: ProblemSampler, alarms: Alarms) -> tuple[int, float, dict]:
    """Load a checkpoint's trainer state into the run's objects; ``(step, wall_s, evaluations)``."""
    state = load_trainer_state(checkpoint)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    sampler.load_state_dict(state["sampler"])
    alarms.load_state_dict(state["alarms"])
    set_rng_state(state["rng"])
    return state["step"], state["wall_s"], dict(state["evaluations"])


def _load_policy(config: RunConfig, device: torch.device, checkpoint: Path | None):
    lora = config.model.lora.model_dump() if config.model.lora is not None else None
    if checkpoint is None:
        path, adapter = config.model.path, None
    elif lora is None:
        path, adapter = checkpoint / "model", None
    else:
        path, adapter = config.model.path, checkpoint / "model"
    return load_policy(path, dtype=config.model.dtype, device=str(device), lora=lora,
                       gradient_checkpointing=config.model.gradient_checkpointing, adapter_path=adapter)


def _summary(config: RunConfig, evaluations: dict, alarms: Alarms, wall_s: float) -> dict[str, Any]:
    steps_done = sorted(evaluations)
    before = evaluations.get(0, {}).get("eval/accuracy")
    after = evaluations[steps_done[-1]].get("eval/accuracy") if steps_done and steps_done[-1] > 0 else None
    return {
        "run_folder": config.out,
        "algorithm": config.algorithm.preset,
        "steps": config.train.steps,
        "accuracy_before": before,
        "accuracy_after": after,
        "wall_s": wall_s,
        "evaluations": {str(k): v for k, v in evaluations.items()},
        "alarms": [{"step": s, "alarm": a} for s, a in alarms.fired],
    }
