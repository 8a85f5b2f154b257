"""The actor-critic recipe: PPO with a learned value function, and REINFORCE with a learned baseline.

One step, top to bottom:

    sample problems -> generate G completions each -> verify -> scores [N]
    -> trainer log-probs (pi_old), reference log-probs, critic values V(s_t)
    -> per-token rewards: the score at the last token, -beta * KL on every token
    -> GAE (gamma, lambda) -> advantages [N, T] (whitened over real tokens), returns = A + V_old
    -> ppo_epochs x minibatches: clipped-surrogate step on the policy, clipped-value step on the critic
    -> the KL controller moves beta -> the engine serves the new weights -> log -> evaluate, checkpoint

The loop has the shape of ``grpo.py``'s and shares its parts (rollout, verifiers, engines, the policy
loss of ``update.py``, checkpoints, tracking); what differs is here: the critic, per-token rewards and
GAE, and the two-optimizer update. Run it with ``rlvr train CONFIG.yaml algorithm.preset=ppo``.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import torch

from rlvr.algorithms.critic import (AdaptiveKLController, FixedKLController, clipped_value_loss_per_token,
                                    explained_variance, gae, masked_whiten, token_rewards)
from rlvr.algorithms.losses import KL_ESTIMATORS, aggregate
from rlvr.config import RunConfig
from rlvr.engines import SamplingParams
from rlvr.engines.base import call_optional
from rlvr.evaluate import evaluate_suites
from rlvr.models import Reference, context_length, load_run_policy, load_tokenizer, save_final_model
from rlvr.progress import make_progress
from rlvr.reward_scoring import build_reward_scorer
from rlvr.ranks import (open_tracker, reduce_metrics, replica_check, resume_or_start, save_run_checkpoint, seed_ranks,
                        start_run)
from rlvr.rollout import Batch, ProblemSampler, RankSampler, collate, collect_groups, sample_tensors, verifier_runner
from rlvr.runtime import Distributed, optimizer_from_config
from rlvr.step_metrics import progress_postfix, run_summary, step_metrics
from rlvr.suites import (PromptEncoder, announce_suites, check_verifiers, drop_overlong_prompts, load_eval_suites,
                         load_training_suites)
from rlvr.tracking import PLOT_PANELS, Alarms, VerifierErrors, plot_metrics
from rlvr.update import (Mismatch, TokenMeans, UpdateSettings, global_counts, masked_mean, no_grad_logprobs,
                         old_logprobs, policy_terms, reference_logprobs, rows_with_gradient)
from rlvr.value_model import ValueModel, build_critic, policy_parameters
from rlvr.weight_sync import start_engine

PPO_PANELS = PLOT_PANELS + [
    ("critic: explained variance", ["critic/explained_variance"]),
    ("critic: value loss", ["critic/value_loss"]),
    ("KL coefficient", ["train/kl_coef"]),
]


def train(config: RunConfig, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Train a policy and its critic with the configured actor-critic preset; returns the run summary.

    ``resume`` continues the run in ``config.out`` from its latest checkpoint (policy, critic, both
    optimizers, the KL coefficient); ``overwrite`` replaces a previous run there. Under ``torchrun``
    each rank trains on its share of the groups (see ``rlvr/ranks.py``).
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

    # ---- policy, critic, engine, optimizers, logging -----------------------------------------
    tokenizer = load_tokenizer(config.model.path)
    encode = PromptEncoder.for_suites(tokenizer, suites, eval_suites)  # each suite's chat_template
    context = context_length(config.model.path)
    suites = drop_overlong_prompts(suites, encode, context, gen.max_new_tokens, gen.overlong_prompts)
    eval_suites = drop_overlong_prompts(eval_suites, encode, context, config.eval.max_new_tokens or gen.max_new_tokens,
                                        gen.overlong_prompts)
    sampler = RankSampler(ProblemSampler(suites, weights, seed=t.seed), dist.rank, dist.world_size)
    policy = load_run_policy(config.model, device, checkpoint)
    critic = build_critic(policy, path=config.critic.path or config.model.path, dtype=config.model.dtype, device=device,
                          lora=config.model.lora.model_dump() if config.model.lora else None,
                          resume_from=checkpoint / "critic" if checkpoint else None,
                          gradient_checkpointing=config.model.gradient_checkpointing)
    reference = Reference(policy, needed=algo.beta > 0, path=config.model.path, dtype=config.model.dtype, device=str(device),
                          forward=config.model.forward)
    engine, sync = start_engine(config.engine, policy, tokenizer, dtype=config.model.dtype, context=context)
    scorer = build_reward_scorer(config, device, tokenizer)  # a learned reward model, when configured
    optimizer, scheduler, critic_optimizer, critic_scheduler = _optimizers(config, policy, critic)
    kl_ctl = AdaptiveKLController(algo.beta, algo.target_kl, algo.kl_horizon) if algo.target_kl else FixedKLController(algo.beta)
    sampling = SamplingParams(max_new_tokens=gen.max_new_tokens, temperature=gen.temperature, top_p=gen.top_p, top_k=gen.top_k)
    settings = UpdateSettings.from_config(config, dist)

    tracker = open_tracker(config, run_dir, dist)
    alarms = Alarms(config.log.alarm_patience, window=config.log.divergence_window)
    states = {"optimizer": optimizer, "scheduler": scheduler, "critic_optimizer": critic_optimizer,
              "critic_scheduler": critic_scheduler, "kl_controller": kl_ctl, "sampler": sampler, "alarms": alarms,
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

            # ---- 1. rollout: problems -> groups -> scores --------------------------------------
            groups, rollout = collect_groups(
                engine=engine, runner=runner, sampler=sampler, encode=encode, num_prompts=t.prompts_per_step // dist.world_size,
                group_size=t.group_size, sampling=sampling, verifier=config.verifier.name, reward_model=scorer,
                verifier_options=config.verifier.options, dynamic_sampling=False, max_resample_rounds=0,
            )
            error_frac = verifier_errors.update(step, [r for g in groups for r in g.rewards],
                                                lambda i: config.verifier.name or groups[i // t.group_size].problem.verifier)
            samples = sample_tensors(
                groups, on_failure=config.verifier.on_failure, success_threshold=config.verifier.success_threshold,
                overlong=algo.overlong, max_new_tokens=gen.max_new_tokens, overlong_buffer=algo.overlong_buffer,
                overlong_penalty=algo.overlong_penalty,
            )
            batch = collate(groups, engine.pad_id).to(device)
            keep = (samples.valid.float() * samples.loss_weight).flatten().to(device)
            batch.response_mask = batch.response_mask * keep[:, None]
            update_start = time.perf_counter()
            call_optional(engine, "sleep")  # an engine with a sleep mode frees its memory for the update

            # ---- 2. per-token rewards -> GAE advantages and returns -----------------------------
            seq_kl = critic_targets(batch, samples.scores.flatten().to(device), samples.truncated.flatten().to(device),
                                    policy=policy, critic=critic, reference=reference, beta=kl_ctl.value, s=settings)

            # ---- 3. policy and critic updates; the KL controller moves beta ---------------------
            update = update_actor_critic(policy, critic, batch, optimizer, critic_optimizer, settings)
            scheduler.step()
            critic_scheduler.step()
            update["train/kl_coef"] = kl_ctl.value
            kl_ctl.update(_mean_over_ranks(seq_kl, dist) if seq_kl is not None else 0.0, n_steps=dist.sum(len(batch)))

            # ---- 4. the engine serves the new weights, proven by the canary --------------------
            call_optional(engine, "wake_up")
            update.update(sync.push())
            step_end = time.perf_counter()

            # ---- 5. metrics, alarms ------------------------------------------------------------
            metrics = step_metrics(groups, samples, rollout, update, seq_kl.cpu() if seq_kl is not None else None,
                                   mixed=len(suites) > 1)
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
                progress.set_postfix(**progress_postfix(metrics), ev=f"{metrics['critic/explained_variance']:.2f}")
                progress.update(1)
            if config.log.plot and config.log.plot_every and step % config.log.plot_every == 0 and dist.is_main:
                plot_metrics(tracker.path, run_dir / "metrics.png", title=str(run_dir), panels=PPO_PANELS)
            if (config.checkpoint.every and step % config.checkpoint.every == 0) or (step == t.steps and config.checkpoint.at_end):
                save_run_checkpoint(run_dir, step, dist=dist, sampler=sampler, models={"policy": policy, "critic": critic},
                                    tokenizer=tokenizer, states=states, keep=config.checkpoint.keep,
                                    extra={"wall_s": wall_before + time.perf_counter() - started, "evaluations": evaluations})
            log_s = time.perf_counter() - log_start
    finally:
        if progress is not None:
            progress.close()
        runner.close()
        call_optional(engine, "close")

    # ---- the end: policy (without the critic's adapter), critic, plots, summary; rank 0 -------
    replicas = replica_check(dist, policy, critic)
    tracker.close()
    summary = run_summary(config, evaluations, alarms, wall_before + time.perf_counter() - started)
    if dist.is_main:
        if config.checkpoint.final_model:
            critic.save(run_dir / "final_critic")
            if critic.shares_policy_base:
                policy.delete_adapter("value")
            save_final_model(policy, tokenizer, run_dir / "final")
        if config.log.plot:
            plot_metrics(tracker.path, run_dir / "metrics.png", title=str(run_dir), panels=PPO_PANELS)
        (run_dir / "summary.json").write_text(json.dumps(summary | ({"replicas": replicas} if replicas else {}), indent=2))
    return summary


# ---------------------------------------------------------------------------------------------
# Rewards, values, advantages
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def critic_targets(batch: Batch, scores: torch.Tensor, truncated: torch.Tensor, *, policy, critic: ValueModel,
                   reference: Reference, beta: float, s: UpdateSettings) -> torch.Tensor | None:
    """Fill ``batch.old_logp``, ``ref_logp``, ``old_values``, ``advantages [N, T]`` and ``returns [N, T]``;
    return the per-sequence KL to the reference ``[N]`` (None without a reference).

        r_t = [t = last] * score - beta * KL_t          (KL_t by algorithm.kl_estimator, k1 = logp - ref_logp)
        A   = GAE(r, V_old; gamma, lam)  whitened over real tokens;   R = GAE advantages + V_old

    A truncated response (``algorithm.truncation``) keeps its score (``none``), earns none (``zero``),
    or earns none and takes the critic's value after its last token as the rest of its return
    (``bootstrap``). The KL in the reward uses the trainer's log-probs (one no-grad pass, reused as
    pi_old), never the engine's: it must measure the policy being trained.
    """
    algo, mask = s.algo, batch.response_mask
    kl = seq_kl = None
    if reference.needed:
        batch.ref_logp = reference_logprobs(reference, batch, s.micro_batch_size, s.temperature)
    if reference.needed and algo.kl_placement == "reward":
        batch.old_logp = no_grad_logprobs(policy, batch, s.micro_batch_size, s.temperature)
        kl = KL_ESTIMATORS[algo.kl_estimator](batch.old_logp, batch.ref_logp) * mask  # [N, T]
        seq_kl = kl.sum(dim=1)
    elif not s.single_pass:  # pi_old for the epochs: the engine's where it is exact, else one pass
        batch.old_logp = old_logprobs(policy, batch, s)
    values, after_last = [], []
    for start in range(0, len(batch), s.micro_batch_size):
        part = batch.select(torch.arange(start, min(start + s.micro_batch_size, len(batch)), device=mask.device))
        v, v_after = critic(part.input_ids, part.attention_mask, part.completion_len, with_bootstrap=True)
        values.append(v)
        after_last.append(v_after)
    batch.old_values = torch.cat(values) * mask  # [N, T]
    rewards = token_rewards(scores, mask, kl=kl, beta=beta, truncated=truncated,
                            truncation="none" if algo.truncation == "none" else "zero")
    last_values = torch.cat(after_last) * truncated.float() if algo.truncation == "bootstrap" else None
    advantages, batch.returns = gae(rewards, batch.old_values, mask, gamma=algo.gamma, lam=algo.lam,
                                    last_values=last_values)
    batch.advantages = whiten_over_ranks(advantages, mask, s.dist) if algo.whiten_advantages else advantages
    return seq_kl


def whiten_over_ranks(x: torch.Tensor, mask: torch.Tensor, dist: Distributed) -> torch.Tensor:
    """:func:`masked_whiten` with the mean and (unbiased) variance of every rank's real tokens, so that
    a data-parallel step whitens as one process would over the whole batch."""
    if dist.world_size == 1:
        return masked_whiten(x, mask)
    real, x = mask.bool(), x.to(torch.promote_types(x.dtype, torch.float32))
    n = dist.sum(float(real.sum()))
    mean = dist.sum(float(torch.where(real, x, 0.0).sum())) / max(n, 1.0)
    var = dist.sum(float(torch.where(real, (x - mean) ** 2, 0.0).sum())) / max(n - 1, 1.0)
    return torch.where(real, (x - mean) / math.sqrt(var + 1e-8), 0.0)


def _mean_over_ranks(values: torch.Tensor, dist: Distributed) -> float:
    """The mean of ``values`` over every rank's rows (the KL controller must move alike on all ranks)."""
    return dist.sum(float(values.sum())) / max(dist.sum(values.numel()), 1.0)


# ---------------------------------------------------------------------------------------------
# The update: policy step, then critic step, per minibatch
# ---------------------------------------------------------------------------------------------


def update_actor_critic(policy, critic: ValueModel, batch: Batch, optimizer, critic_optimizer,
                        s: UpdateSettings) -> dict[str, float]:
    """``ppo_epochs`` x ``minibatches``: a clipped-surrogate step of the policy, then a clipped-value step
    of the critic, on each minibatch; returns mean diagnostics.

        L_policy = policy_loss(logp, old_logp, A) [+ beta KL in the loss] [- c_H entropy]
        L_critic = value_coef * token_mean(1/2 max((V - R)^2, (clip(V, V_old +- c) - R)^2))

    With ``algorithm.early_stop_kl`` the step ends, before the optimizer steps on it, at the first
    minibatch (after the first) whose approximate KL to the rollout policy exceeds the bound.
    """
    algo = s.algo
    n = len(batch)
    minibatch_size = math.ceil(n / algo.minibatches)
    policy_params, critic_params = policy_parameters(policy, critic), critic.trainable_parameters()
    means, critic_means, mismatch = TokenMeans(), TokenMeans(), Mismatch()
    pg_total, value_total, grad_norms, critic_norms, stopped = 0.0, 0.0, [], [], 0.0
    for epoch in range(algo.ppo_epochs):
        order = torch.randperm(n) if not s.single_pass else torch.arange(n)
        for start in range(0, n, minibatch_size):
            minibatch = batch.select(order[start : start + minibatch_size].to(batch.input_ids.device))
            # -- the policy: gradients, then the KL check, then the step
            optimizer.zero_grad(set_to_none=False)
            pg_loss, approx_kl = _policy_gradients(policy, minibatch, s, means, mismatch if not grad_norms else None)
            if grad_norms and algo.early_stop_kl is not None and approx_kl > algo.early_stop_kl:
                stopped = 1.0  # far enough from the rollout policy: this minibatch's gradient is dropped
                break
            pg_total += pg_loss
            s.dist.sum_gradients(policy_params)
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(policy_params, s.grad_clip)))
            optimizer.step()
            # -- the critic
            critic_optimizer.zero_grad(set_to_none=False)
            value_total += _critic_gradients(critic, minibatch, s, critic_means)
            s.dist.sum_gradients(critic_params)
            critic_norms.append(float(torch.nn.utils.clip_grad_norm_(critic_params, s.grad_clip)))
            critic_optimizer.step()
        if stopped:
            break
    steps = len(grad_norms)
    out = means.means() | critic_means.means()
    real = batch.response_mask
    out.update({
        "train/pg_loss": pg_total / steps,
        "train/grad_norm": sum(grad_norms) / steps,
        "train/optimizer_steps": float(steps),
        "train/early_stopped": stopped,
        "critic/value_loss": value_total / steps,
        "critic/grad_norm": sum(critic_norms) / steps,
        "critic/explained_variance": explained_variance(batch.old_values, batch.returns, real),
        "critic/values_mean": masked_mean(batch.old_values, real),
        "critic/returns_mean": masked_mean(batch.returns, real),
        "critic/advantages_std": float(batch.advantages[real.bool()].std()) if real.sum() > 1 else 0.0,
    })
    out.update(mismatch.metrics())
    return out


def _policy_gradients(policy, minibatch: Batch, s: UpdateSettings, means: TokenMeans,
                      mismatch: Mismatch | None) -> tuple[float, float]:
    """Accumulate the policy loss's gradients over ``minibatch``'s micro-batches; returns the loss and
    the token-weighted approximate KL to the rollout policy (over all ranks: they must all stop
    together), both before any step on this minibatch."""
    agg = global_counts(minibatch, s.dist)
    pg_loss, kl = 0.0, TokenMeans()
    rows = rows_with_gradient(minibatch, s.algo)
    for micro_rows in rows.split(s.micro_batch_size) if len(rows) else ():
        micro = minibatch.select(micro_rows)
        part = policy_terms(policy, micro, s, **agg)
        part.loss.backward()
        pg_loss += part.pg_loss
        if mismatch is not None:
            mismatch.add(part.logp, micro)
        tokens = float(micro.response_mask.sum())
        means.add(part.terms, tokens)
        kl.add({"kl": part.terms["train/approx_kl_old"]}, tokens)
    return pg_loss, s.dist.sum(kl.sums.get("kl", 0.0)) / max(s.dist.sum(kl.weight), 1e-9)


def _critic_gradients(critic: ValueModel, minibatch: Batch, s: UpdateSettings, means: TokenMeans) -> float:
    """Accumulate the value loss's gradients over ``minibatch``'s micro-batches; returns the loss
    (without ``value_coef``)."""
    algo, real = s.algo, minibatch.response_mask
    agg = global_counts(minibatch, s.dist) | {"max_len": s.max_len}
    total = 0.0
    rows = (real.sum(dim=1) > 0).nonzero().squeeze(1)
    for micro_rows in rows.split(s.micro_batch_size) if len(rows) else ():
        micro = minibatch.select(micro_rows)
        values = critic(micro.input_ids, micro.attention_mask, micro.completion_len)  # [n, T]
        loss_t, clipped = clipped_value_loss_per_token(values, micro.old_values, micro.returns, micro.response_mask,
                                                       clip=algo.value_clip or math.inf)
        loss = aggregate(loss_t, micro.response_mask, "token_mean", **agg)
        (algo.value_coef * loss).backward()
        total += loss.item()
        means.add({"critic/value_clip_frac": masked_mean(clipped.float(), micro.response_mask)},
                  float(micro.response_mask.sum()))
    return total


def _optimizers(config: RunConfig, policy, critic: ValueModel):
    """``(optimizer, scheduler, critic_optimizer, critic_scheduler)``: the critic has its own learning
    rate (``critic.lr``, default ``optim.lr``), constant after the warm-up."""
    steps = config.train.steps
    optimizer, scheduler = optimizer_from_config(policy_parameters(policy, critic), config.optim, steps)
    critic_optimizer, critic_scheduler = optimizer_from_config(critic.trainable_parameters(), config.optim, steps,
                                                               lr=config.critic.lr, schedule="constant")
    return optimizer, scheduler, critic_optimizer, critic_scheduler


def _evaluate(engine, encode, eval_suites, runner, config: RunConfig) -> dict[str, float]:
    return evaluate_suites(engine, encode, eval_suites, runner, eval_config=config.eval,
                           generation=config.generation, verifier=config.verifier)
