"""Offline direct preference optimisation (``rlvr dpo``): DPO, cDPO and IPO on preference pairs.

The policy is its own reward model, r(x, y) = beta * log pi(y|x) / pi_ref(y|x), trained with the
Bradley-Terry loss on the pairs (see :mod:`rlvr.algorithms.preference` for the variants):

    h = [log pi(y_w) - log pi_ref(y_w)] - [log pi(y_l) - log pi_ref(y_l)]     L = -log sigmoid(beta * h)

log pi(y|x) is the sum over the completion's tokens and its EOS (prompt tokens are context only).
The reference is the starting model: with LoRA, the same network with its adapters switched off;
with full fine-tuning, a frozen copy loaded from ``model.path`` (:class:`rlvr.modeling.loading.Reference`).
``dpo.nll_coef`` adds the chosen completion's NLL per token (RPO), which keeps the chosen
log-probabilities from falling with the rejected ones, DPO's known failure on verifiable tasks.

Under ``torchrun`` each rank takes every world-size-th pair of each optimizer step's batch (the loss
weighted by its share of the global batch) and the gradients are summed across ranks before the
step; rank 0 alone evaluates and writes the run folder (docs/scaling.md).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from rlvr.algorithms.preference import dpo_loss
from rlvr.config import DPOConfig
from rlvr.engines import SamplingParams
from rlvr.engines.weight_sync import evaluation_engine, refresh_evaluation_engine
from rlvr.modeling.forward_choice import forward_note
from rlvr.modeling.loading import Reference, load_run_policy, load_tokenizer, save_final_model
from rlvr.modeling.logprobs import collate_completions, completion_logprobs
from rlvr.recipes.pairs import fit_pairs, load_pairs, pair_steps
from rlvr.recipes.scaffold import Run
from rlvr.rollout.evaluate import evaluate
from rlvr.rollout.preferences import TokenizedPair
from rlvr.rollout.suites import PromptEncoder, load_suite
from rlvr.run.ranks import sharded_run
from rlvr.run.runtime import optimizer_from_config
from rlvr.verifiers.runner import VerifierRunner

PANELS = [
    ("DPO loss", ["train/loss", "eval/loss"]),
    ("implicit accuracy", ["train/accuracy", "eval/accuracy"]),
    ("implicit reward margin", ["train/margin", "eval/margin"]),
    ("implicit rewards beta*log(pi/pi_ref)", ["train/reward_chosen", "train/reward_rejected"]),
    ("completion log-prob", ["train/logp_chosen", "train/logp_rejected"]),
    ("gold accuracy (greedy)", ["eval/gold_accuracy"]),
]


def sequence_logps(model, pairs: Sequence[TokenizedPair], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log pi(y|x) [2N], completion tokens [2N])``: the chosen completions first, then the rejected."""
    prompts = [p.prompt for p in pairs] * 2
    completions = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    ids, attention, mask = collate_completions(prompts, completions, pad_id)
    device = next(model.parameters()).device
    mask = mask.to(device)
    logp, _ = completion_logprobs(model, ids.to(device), attention.to(device), mask.shape[1])  # [2N, T]
    return (logp * mask).sum(dim=1), mask.sum(dim=1)


def pair_loss(policy, reference: Reference, pairs: Sequence[TokenizedPair], pad_id: int, dpo) -> tuple[torch.Tensor, dict]:
    """The DPO loss of ``pairs`` (+ the chosen NLL with ``nll_coef``) and its stats."""
    n = len(pairs)
    with torch.no_grad(), reference.model() as ref:
        ref_logp, _ = sequence_logps(ref, pairs, pad_id)  # [2N]
    logp, tokens = sequence_logps(policy, pairs, pad_id)  # [2N]
    loss, stats = dpo_loss(logp[:n], logp[n:], ref_logp[:n], ref_logp[n:], beta=dpo.beta, loss=dpo.loss,
                           label_smoothing=dpo.label_smoothing)
    if dpo.nll_coef:
        nll = -logp[:n].sum() / tokens[:n].sum()  # per token of the chosen completions
        loss = loss + dpo.nll_coef * nll
        stats["nll_chosen"] = nll.item()
    return loss, {"loss": loss.item(), **stats}


@torch.no_grad()
def evaluate_pairs(policy, reference: Reference, pairs: Sequence[TokenizedPair], pad_id: int, dpo,
                   batch_size: int) -> dict[str, float]:
    """Loss, implicit accuracy and margin over ``pairs`` (weighted by batch size)."""
    totals: dict[str, float] = {}
    for start in range(0, len(pairs), batch_size):
        batch = pairs[start : start + batch_size]
        _, stats = pair_loss(policy, reference, batch, pad_id, dpo)
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + value * len(batch)
    return {k: v / max(1, len(pairs)) for k, v in totals.items()}


def train(config: DPOConfig, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Offline DPO on preference pairs; see the module docstring. ``resume`` continues from the run's latest
    checkpoint, ``overwrite`` replaces a run already in ``config.out``."""
    with Run.start(config, "dpo", resume=resume, overwrite=overwrite) as run:
        config, dist, ev, dpo = run.config, run.dist, run.config.eval, run.config.dpo
        tokenizer = load_tokenizer(config.model.path)
        train_data, eval_data = load_pairs(config, tokenizer, main=dist.is_main)  # bad data fails before the model
        problems = load_suite(ev.task, path=ev.path, split=ev.split, options=ev.options, limit=ev.limit) \
            if ev.task and dist.is_main else []
        shard = sharded_run(config.train, dist)
        policy = load_run_policy(config.model, dist.device, run.checkpoint, shard=shard, offload=config.train.cpu_offload)
        if dist.is_main:
            print(f"forward: {forward_note(policy)}", flush=True)
        reference = Reference(policy, needed=True, path=config.model.path, dtype=config.model.dtype,
                              device=str(dist.device), forward=config.model.forward,
                              logits_chunk_mb=config.model.logits_chunk_mb)
        pad_id, total = tokenizer.pad_token_id, pair_steps(config.train, len(train_data))
        optimizer, scheduler = optimizer_from_config(policy.parameters(), config.optim, total)
        engine = evaluation_engine(policy, tokenizer, dtype=config.model.dtype, device=dist.device,
                                   needed=bool(problems))  # rank 0 measures gold accuracy
        encode = PromptEncoder(tokenizer)
        runner = VerifierRunner() if problems else None
        if runner is not None:
            run.cleanup(runner.close)
        run.panels = PANELS
        run.restore({"optimizer": optimizer, "scheduler": scheduler}, models={"policy": policy}, tokenizer=tokenizer)

        def measure() -> dict[str, float]:
            """Held-out implicit accuracy / margin / loss, and greedy gold accuracy on the eval suite (rank 0;
            a sharded policy's passes and weight gathering on every rank)."""
            if not (dist.is_main or shard):
                return {}
            out = {f"eval/{k}": v for k, v in evaluate_pairs(policy, reference, eval_data, pad_id, dpo,
                                                              ev.batch_size).items()} if eval_data else {}
            if ev.task:
                refresh_evaluation_engine(engine, policy)  # the engine's copy, if any (sharded: every rank gathers)
            if problems:
                out["eval/gold_accuracy"] = evaluate(engine, encode, problems, runner, sampling=SamplingParams(
                    max_new_tokens=ev.max_new_tokens, greedy=True, stop=tuple(ev.stop),
                    include_stop=ev.include_stop)).accuracy
            return out

        before, after = fit_pairs(run, train_data, lambda mb: pair_loss(policy, reference, mb, pad_id, dpo), policy,
                                  optimizer, scheduler, measure=measure, accuracy="accuracy")
        on_train = evaluate_pairs(policy, reference, train_data, pad_id, dpo, ev.batch_size) \
            if dist.is_main or shard else {}
        summary = {
            "steps": total, "train_pairs": len(train_data), "eval_pairs": len(eval_data),
            "train_implicit_accuracy": on_train.get("accuracy"), "train_margin": on_train.get("margin"),
            "implicit_accuracy": after.get("eval/accuracy"), "margin": after.get("eval/margin"),
            "logp_chosen_before": before.get("eval/logp_chosen"), "logp_chosen_after": after.get("eval/logp_chosen"),
            "gold_accuracy_before": before.get("eval/gold_accuracy"),
            "gold_accuracy_after": after.get("eval/gold_accuracy"), "model": str(run.run_dir / "final"),
        }
        return run.finish(summary, save_final=lambda out: save_final_model(policy, tokenizer, out), models=(policy,))
