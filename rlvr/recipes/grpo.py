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

from typing import Any

from rlvr.algorithms.advantages import ADVANTAGE_ESTIMATORS, token_return_advantages
from rlvr.algorithms.losses import KL_ESTIMATORS
from rlvr.config import RunConfig
from rlvr.modeling.loading import save_final_model
from rlvr.modeling.logprobs import no_grad_logprobs, reference_logprobs
from rlvr.recipes.rl_run import RLRun
from rlvr.recipes.update import update_policy
from rlvr.rollout.batch import collate
from rlvr.rollout.guidance import guide_with_solutions, policy_logprobs_of_rows, solution_encoder
from rlvr.rollout.process_scoring import step_reward_tensor
from rlvr.run.runtime import optimizer_from_config


def train(config: RunConfig, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Train a policy with the configured critic-free algorithm; returns the run summary.

    ``resume`` continues the run in ``config.out`` from its latest checkpoint; ``overwrite``
    replaces a previous run there (without either, a folder that holds a run is refused). Under
    ``torchrun`` each rank trains on its share of the groups (see ``rlvr/run/ranks.py``).
    """
    with RLRun.start(config, resume=resume, overwrite=overwrite) as run:
        config, policy, engine = run.config, run.policy, run.engine
        algo, gen, training, device = config.algorithm, config.generation, config.train, run.dist.device
        optimizer, scheduler = optimizer_from_config(policy.parameters(), config.optim, training.steps)
        encode_solution = solution_encoder(run.tokenizer)
        run.restore({"optimizer": optimizer, "scheduler": scheduler}, models={"policy": policy})

        for step in run.steps(training.steps):
            # ---- 1. rollout: problems -> groups -> rewards [P, G] -------------------------------
            rollout = run.rollout(step, dynamic_sampling=algo.dynamic_sampling,
                                  max_resample_rounds=algo.max_resample_rounds)

            # ---- 1b. guidance: gold solutions into the groups that got nothing right (optional) --
            trained, trained_samples, guidance = rollout.groups, rollout.samples, None
            if algo.guidance == "solution":
                guidance = guide_with_solutions(rollout.groups, run.runner, encode=encode_solution,
                                                verifier=config.verifier.name, options=config.verifier.options,
                                                max_new_tokens=gen.max_new_tokens,
                                                threshold=config.verifier.success_threshold, copies=algo.guidance_samples)
                trained = guidance.groups
                trained_samples = run.tensors(trained) if guidance.rows else trained_samples
            batch = collate(trained, engine.pad_id).to(device)
            update_started = run.sleep_engine()
            if guidance is not None:
                policy_logprobs_of_rows(policy, batch, guidance.rows, run.settings.micro, gen.temperature)

            # ---- 2. reference, rewards -> advantages --------------------------------------------
            scores, seq_kl = trained_samples.scores, None
            if algo.beta > 0:
                batch.ref_logp = reference_logprobs(run.reference, batch, run.settings.micro, gen.temperature)
            if algo.beta > 0 and algo.kl_placement == "reward":  # with the trainer's log-probs, not the engine's
                batch.old_logp = no_grad_logprobs(policy, batch, run.settings.micro, gen.temperature)
                kl_tokens = KL_ESTIMATORS[algo.kl_estimator](batch.old_logp, batch.ref_logp) * batch.response_mask
                seq_kl = kl_tokens.sum(dim=1).view_as(scores).cpu()
                scores = scores - algo.beta * seq_kl
            if run.scorer is not None and run.scorer.token_level:  # REINFORCE++ with a PRM's step rewards: A [N, T]
                steps = step_reward_tensor(trained, batch.completion_len).to(device)
                batch.advantages = token_return_advantages(scores.flatten().to(device), steps, batch.response_mask,
                                                           trained_samples.valid.flatten().to(device),
                                                           all_sum=run.dist.sum_tensor)
            else:
                estimator = ADVANTAGE_ESTIMATORS[algo.advantage]  # batch statistics: over every rank's groups
                over_ranks = {"all_sum": run.dist.sum_tensor} if getattr(estimator, "over_the_batch", False) else {}
                batch.advantages = estimator(scores, trained_samples.valid, **over_ranks).flatten().to(device)
            keep = (trained_samples.valid.float() * trained_samples.loss_weight).flatten().to(device)
            batch.response_mask = batch.response_mask * keep[:, None]

            # ---- 3. policy update; 4. the engine serves the new weights --------------------------
            update = update_policy(policy, batch, optimizer, run.settings)
            scheduler.step()
            update.update(run.sync_engine())

            # ---- 5. log, alarms, evaluate, checkpoint -----------------------------------------
            metrics = run.step_metrics(rollout, update, seq_kl=seq_kl, lr=scheduler.get_last_lr()[0],
                                       update_started=update_started)
            metrics.update(guidance.metrics() if guidance is not None else {})
            run.end_step(step, metrics)

        return run.finish(save_final=lambda out: save_final_model(policy, run.tokenizer, out), models=(policy,))
