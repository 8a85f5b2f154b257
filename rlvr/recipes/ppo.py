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

import math
from typing import Any

import torch

from rlvr.algorithms.critic import (AdaptiveKLController, FixedKLController, clipped_value_loss_per_token,
                                    explained_variance, gae, masked_whiten, token_rewards)
from rlvr.algorithms.losses import KL_ESTIMATORS, aggregate
from rlvr.config import RunConfig
from rlvr.modeling.loading import Reference, save_final_model, shard_for_run
from rlvr.modeling.logprobs import no_grad_logprobs, reference_logprobs
from rlvr.modeling.value_model import ValueModel, build_critic, policy_parameters
from rlvr.recipes.rl_run import RLRun
from rlvr.recipes.update import (Mismatch, TokenMeans, UpdateSettings, global_counts, masked_mean,
                                 old_logprobs, policy_terms, rows_with_gradient, zero_weight_pass)
from rlvr.rollout.batch import Batch, collate
from rlvr.rollout.process_scoring import step_reward_tensor
from rlvr.run.runtime import Distributed, full_norm, optimizer_from_config
from rlvr.run.sharded_checkpoint import has_sharded_part
from rlvr.run.sharding import is_sharded, whole_copy
from rlvr.run.tracking import PLOT_PANELS

PPO_PANELS = PLOT_PANELS + [
    ("critic: explained variance", ["critic/explained_variance"]),
    ("critic: value loss", ["critic/value_loss"]),
    ("KL coefficient", ["train/kl_coef"]),
]


def train(config: RunConfig, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Train a policy and its critic with the configured actor-critic preset; returns the run summary.

    ``resume`` continues the run in ``config.out`` from its latest checkpoint (policy, critic, both
    optimizers, the KL coefficient); ``overwrite`` replaces a previous run there. Under ``torchrun``
    each rank trains on its share of the groups (see ``rlvr/run/ranks.py``).
    """
    with RLRun.start(config, resume=resume, overwrite=overwrite) as run:
        config, policy, engine, dist = run.config, run.policy, run.engine, run.dist
        algo, training, device = config.algorithm, config.train, dist.device
        shard = is_sharded(policy)
        whole_checkpoint = run.checkpoint is not None and not has_sharded_part(run.checkpoint)
        critic = build_critic(policy, path=config.critic.path or config.model.path,
                              dtype="float32", device=device,  # its own body trains: float32 master weights
                              lora=config.model.lora.model_dump() if config.model.lora else None,
                              resume_from=run.checkpoint / "critic" if whole_checkpoint else None,
                              gradient_checkpointing=config.model.gradient_checkpointing,
                              shard=shard, compute_dtype=config.model.dtype, offload=training.cpu_offload)
        critic = shard_for_run(critic, config.model.dtype, run.checkpoint, shard=shard, offload=training.cpu_offload,
                               name="critic", layers=critic.body.layers if shard else None,
                               master_weights=not critic.shares_policy_base)
        optimizer, scheduler, critic_optimizer, critic_scheduler = _optimizers(config, policy, critic)
        kl_ctl = (AdaptiveKLController(algo.beta, algo.target_kl, algo.kl_horizon) if algo.target_kl
                  else FixedKLController(algo.beta))
        run.panels = PPO_PANELS
        run.restore({"optimizer": optimizer, "scheduler": scheduler, "critic_optimizer": critic_optimizer,
                     "critic_scheduler": critic_scheduler, "kl_controller": kl_ctl},
                    models={"policy": policy, "critic": critic})

        for step in run.steps(training.steps):
            # ---- 1. rollout: problems -> groups -> scores ---------------------------------------
            rollout = run.rollout(step)
            samples = rollout.samples
            batch = collate(rollout.groups, engine.pad_id).to(device)
            keep = (samples.valid.float() * samples.loss_weight).flatten().to(device)
            batch.response_mask = batch.response_mask * keep[:, None]
            update_started = run.sleep_engine()

            # ---- 2. per-token rewards -> GAE advantages and returns -----------------------------
            steps = (step_reward_tensor(rollout.groups, batch.completion_len).to(device)
                     if run.scorer is not None and run.scorer.token_level else None)  # a PRM's step rewards [N, T]
            seq_kl = critic_targets(batch, samples.scores.flatten().to(device), samples.truncated.flatten().to(device),
                                    policy=policy, critic=critic, reference=run.reference, beta=kl_ctl.value,
                                    settings=run.settings, step_rewards=steps)

            # ---- 3. policy and critic updates; the KL controller moves beta ---------------------
            update = update_actor_critic(policy, critic, batch, optimizer, critic_optimizer, run.settings)
            scheduler.step()
            critic_scheduler.step()
            update["train/kl_coef"] = kl_ctl.value
            kl_ctl.update(_mean_over_ranks(seq_kl, dist) if seq_kl is not None else 0.0, n_steps=dist.sum(len(batch)))

            # ---- 4. the engine serves the new weights; 5. log, alarms, evaluate, checkpoint -----
            update.update(run.sync_engine())
            metrics = run.step_metrics(rollout, update, seq_kl=seq_kl.cpu() if seq_kl is not None else None,
                                       lr=scheduler.get_last_lr()[0], update_started=update_started)
            run.end_step(step, metrics, postfix=_critic_postfix(metrics))

        return run.finish(save_final=lambda out: _save_final(policy, critic, run.tokenizer, out), models=(policy, critic))


def _save_final(policy, critic: ValueModel, tokenizer, out) -> None:
    """The critic beside the run's ``final/`` (as ``final_critic/``), then the policy without the critic's adapter.
    Sharded models are gathered to rank 0 first (every rank calls this; rank 0 writes)."""
    whole = whole_copy(critic) if is_sharded(critic) else critic
    if whole is not None:
        whole.save(out.parent / "final_critic")
    if critic.shares_policy_base:
        policy.delete_adapter("value")
    save_final_model(policy, tokenizer, out)


def _critic_postfix(metrics: dict[str, float]) -> dict[str, str]:
    """The progress bar's ``ev``: the critic's explained variance of the returns; ``-`` when the returns
    are constant (every sample of the step scored the same), which leaves nothing to explain."""
    ev = metrics["critic/explained_variance"]
    return {"ev": f"{ev:.2f}" if math.isfinite(ev) else "-"}


# ---------------------------------------------------------------------------------------------
# Rewards, values, advantages
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def critic_targets(batch: Batch, scores: torch.Tensor, truncated: torch.Tensor, *, policy, critic: ValueModel,
                   reference: Reference, beta: float, settings: UpdateSettings,
                   step_rewards: torch.Tensor | None = None) -> torch.Tensor | None:
    """Fill ``batch.old_logp``, ``ref_logp``, ``old_values``, ``advantages [N, T]`` and ``returns [N, T]``;
    return the per-sequence KL to the reference ``[N]`` (None without a reference).

        r_t = [t = last] * score + step_t - beta * KL_t   (KL_t by algorithm.kl_estimator, k1 = logp - ref_logp;
                                                           step_t: a PRM's reward on a step's last token, else 0)
        A   = GAE(r, V_old; gamma, lam)  whitened over real tokens;   R = GAE advantages + V_old

    A truncated response (``algorithm.truncation``) keeps its score (``none``), earns none (``zero``),
    or earns none and takes the critic's value after its last token as the rest of its return
    (``bootstrap``). The KL in the reward uses the trainer's log-probs (one no-grad pass, reused as
    pi_old), never the engine's: it must measure the policy being trained.
    """
    algo, mask = settings.algo, batch.response_mask
    kl = seq_kl = None
    if reference.needed:
        batch.ref_logp = reference_logprobs(reference, batch, settings.micro, settings.temperature)
    if reference.needed and algo.kl_placement == "reward":
        batch.old_logp = no_grad_logprobs(policy, batch, settings.micro, settings.temperature)
        kl = KL_ESTIMATORS[algo.kl_estimator](batch.old_logp, batch.ref_logp) * mask  # [N, T]
        seq_kl = kl.sum(dim=1)
    elif not settings.single_pass:  # pi_old for the epochs: the engine's where it is exact, else one pass
        batch.old_logp = old_logprobs(policy, batch, settings)
    values, after_last = mask.new_zeros(mask.shape), mask.new_zeros(len(batch))  # [N, T], [N]
    everything = torch.arange(len(batch), device=mask.device)
    for rows in settings.micro.passes(batch, everything, critic):  # None: a sharded critic repeats a pass, discarded
        part = batch.select(everything[:1] if rows is None else rows, trim=True)  # [n, W' + T']: its own width
        v, v_after = critic(part.input_ids, part.attention_mask, part.completion_len, with_bootstrap=True)
        if rows is not None:
            values[rows, : part.completion_len] = v  # back into the batch's T columns (the rest is padding)
            after_last[rows] = v_after
    if is_sharded(critic):
        critic.reshard()  # FSDP2 keeps the root gathered for a backward; these passes have none
    batch.old_values = values * mask  # [N, T]
    rewards = token_rewards(scores, mask, kl=kl, beta=beta, truncated=truncated,
                            truncation="none" if algo.truncation == "none" else "zero", dense=step_rewards)
    last_values = after_last * truncated.float() if algo.truncation == "bootstrap" else None
    advantages, batch.returns = gae(rewards, batch.old_values, mask, gamma=algo.gamma, lam=algo.lam,
                                    last_values=last_values)
    batch.advantages = whiten_over_ranks(advantages, mask, settings.dist) if algo.whiten_advantages else advantages
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
                        settings: UpdateSettings) -> dict[str, float]:
    """``ppo_epochs`` x ``minibatches``: a clipped-surrogate step of the policy, then a clipped-value step
    of the critic, on each minibatch; returns mean diagnostics.

        L_policy = policy_loss(logp, old_logp, A) [+ beta KL in the loss] [- c_H entropy]
        L_critic = value_coef * token_mean(1/2 max((V - R)^2, (clip(V, V_old +- c) - R)^2))

    With ``algorithm.early_stop_kl`` the step ends, before the optimizer steps on it, at the first
    minibatch (after the first) whose approximate KL to the rollout policy exceeds the bound.
    """
    algo = settings.algo
    n = len(batch)
    minibatch_size = math.ceil(n / algo.minibatches)
    policy_params = [p for group in optimizer.param_groups for p in group["params"]]  # as registered now: sharded
    critic_params = [p for group in critic_optimizer.param_groups for p in group["params"]]
    sharded = is_sharded(policy)
    means, critic_means, mismatch = TokenMeans(), TokenMeans(), Mismatch()
    pg_total, value_total, grad_norms, critic_norms, stopped = 0.0, 0.0, [], [], 0.0
    for epoch in range(algo.ppo_epochs):
        order = torch.randperm(n) if not settings.single_pass else torch.arange(n)
        for start in range(0, n, minibatch_size):
            minibatch = batch.select(order[start : start + minibatch_size].to(batch.input_ids.device))
            # -- the policy: gradients, then the KL check, then the step
            optimizer.zero_grad(set_to_none=False)
            pg_loss, approx_kl = _policy_gradients(policy, minibatch, settings, means, mismatch if not grad_norms else None)
            if grad_norms and algo.early_stop_kl is not None and approx_kl > algo.early_stop_kl:
                stopped = 1.0  # far enough from the rollout policy: this minibatch's gradient is dropped
                break
            pg_total += pg_loss
            if not sharded:  # FSDP2 summed them in the backward
                settings.dist.sum_gradients(policy_params)
            grad_norms.append(full_norm(torch.nn.utils.clip_grad_norm_(policy_params, settings.grad_clip)))
            optimizer.step()
            # -- the critic
            critic_optimizer.zero_grad(set_to_none=False)
            value_total += _critic_gradients(critic, minibatch, settings, critic_means)
            if not sharded:
                settings.dist.sum_gradients(critic_params)
            critic_norms.append(full_norm(torch.nn.utils.clip_grad_norm_(critic_params, settings.grad_clip)))
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


def _policy_gradients(policy, minibatch: Batch, settings: UpdateSettings, means: TokenMeans,
                      mismatch: Mismatch | None) -> tuple[float, float]:
    """Accumulate the policy loss's gradients over ``minibatch``'s micro-batches; returns the loss and
    the token-weighted approximate KL to the rollout policy (over all ranks: they must all stop
    together), both before any step on this minibatch."""
    agg = global_counts(minibatch, settings.dist)
    pg_loss, kl = 0.0, TokenMeans()
    rows = rows_with_gradient(minibatch, settings.algo)
    for micro_rows in settings.micro.passes(minibatch, rows, policy):
        if micro_rows is None:  # a sharded policy: another rank has more micro-batches than this one
            zero_weight_pass(policy, minibatch, settings, agg)
            continue
        micro = minibatch.select(micro_rows, trim=True)  # [n, W' + T']: this micro-batch's own width
        part = policy_terms(policy, micro, settings, **agg)
        part.loss.backward()
        pg_loss += part.pg_loss
        if mismatch is not None:
            mismatch.add(part.logp, micro)
        tokens = float(micro.response_mask.sum())
        means.add(part.terms, tokens)
        kl.add({"kl": part.terms["train/approx_kl_old"]}, tokens)
    return pg_loss, settings.dist.sum(kl.sums.get("kl", 0.0)) / max(settings.dist.sum(kl.weight), 1e-9)


def _critic_gradients(critic: ValueModel, minibatch: Batch, settings: UpdateSettings, means: TokenMeans) -> float:
    """Accumulate the value loss's gradients over ``minibatch``'s micro-batches; returns the loss
    (without ``value_coef``)."""
    algo, real = settings.algo, minibatch.response_mask
    agg = global_counts(minibatch, settings.dist) | {"max_len": settings.max_len}
    total = 0.0
    rows = (real.sum(dim=1) > 0).nonzero().squeeze(1)
    for micro_rows in settings.micro.passes(minibatch, rows, critic):
        if micro_rows is None:  # a sharded critic: another rank has more micro-batches than this one
            first = minibatch.select(torch.arange(1, device=real.device), trim=True)
            (critic(first.input_ids, first.attention_mask, first.completion_len).sum() * 0.0).backward()
            continue
        micro = minibatch.select(micro_rows, trim=True)  # [n, W' + T']: this micro-batch's own width
        values = critic(micro.input_ids, micro.attention_mask, micro.completion_len)  # [n, T']
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
