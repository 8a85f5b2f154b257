"""Offline direct preference optimisation (``rlvr dpo``): DPO, cDPO and IPO on preference pairs.

The policy is its own reward model, r(x, y) = beta * log pi(y|x) / pi_ref(y|x), trained with the
Bradley-Terry loss on the pairs (see :mod:`rlvr.algorithms.preference` for the variants):

    h = [log pi(y_w) - log pi_ref(y_w)] - [log pi(y_l) - log pi_ref(y_l)]     L = -log sigmoid(beta * h)

log pi(y|x) is the sum over the completion's tokens and its EOS (prompt tokens are context only).
The reference is the starting model: with LoRA, the same network with its adapters switched off;
with full fine-tuning, a frozen copy loaded from ``model.path`` (:class:`rlvr.models.Reference`).
``dpo.nll_coef`` adds the chosen completion's NLL per token (RPO), which keeps the chosen
log-probabilities from falling with the rejected ones, DPO's known failure on verifiable tasks.

Under ``torchrun`` each rank takes every world-size-th pair of each optimizer step's batch (the loss
weighted by its share of the global batch) and the gradients are summed across ranks before the
step; rank 0 alone evaluates and writes the run folder (docs/scaling.md).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, Sequence

import torch

from rlvr.algorithms.preference import dpo_loss
from rlvr.config import save_config
from rlvr.offline_configs import DPOConfig
from rlvr.engines import HFEngine, SamplingParams
from rlvr.evaluate import evaluate
from rlvr.logprobs import completion_logprobs
from rlvr.models import Reference, context_length, load_policy, load_tokenizer, save_final_model
from rlvr.preferences import TokenizedPair, load_preference_data, tokenize_pairs
from rlvr.progress import make_progress
from rlvr.reward_model import batch_indices, collate_completions
from rlvr.ranks import backward_on_share, join_run, open_tracker, replica_check
from rlvr.runtime import optimizer_from_config
from rlvr.suites import PromptEncoder, load_suite
from rlvr.tracking import plot_metrics
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


def pair_loss(policy, reference: Reference, pairs: Sequence[TokenizedPair], pad_id: int, d) -> tuple[torch.Tensor, dict]:
    """The DPO loss of ``pairs`` (+ the chosen NLL with ``nll_coef``) and its stats."""
    n = len(pairs)
    with torch.no_grad(), reference.model() as ref:
        ref_logp, _ = sequence_logps(ref, pairs, pad_id)  # [2N]
    logp, tokens = sequence_logps(policy, pairs, pad_id)  # [2N]
    loss, stats = dpo_loss(logp[:n], logp[n:], ref_logp[:n], ref_logp[n:], beta=d.beta, loss=d.loss,
                           label_smoothing=d.label_smoothing)
    if d.nll_coef:
        nll = -logp[:n].sum() / tokens[:n].sum()  # per token of the chosen completions
        loss = loss + d.nll_coef * nll
        stats["nll_chosen"] = nll.item()
    return loss, {"loss": loss.item(), **stats}


@torch.no_grad()
def evaluate_pairs(policy, reference: Reference, pairs: Sequence[TokenizedPair], pad_id: int, d,
                   batch_size: int) -> dict[str, float]:
    """Loss, implicit accuracy and margin over ``pairs`` (weighted by batch size)."""
    totals: dict[str, float] = {}
    for start in range(0, len(pairs), batch_size):
        batch = pairs[start : start + batch_size]
        _, stats = pair_loss(policy, reference, batch, pad_id, d)
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + value * len(batch)
    return {k: v / max(1, len(pairs)) for k, v in totals.items()}


def train(config: DPOConfig, *, overwrite: bool = False) -> dict[str, Any]:
    """Offline DPO on preference pairs; see the module docstring. ``overwrite`` replaces a run already
    in ``config.out``."""
    config, run_dir, dist = join_run(config, "dpo", overwrite=overwrite)
    device = dist.device
    train_pairs, eval_pairs = load_preference_data(config.data, config.train.seed)  # bad data fails before any model
    ev, d, t = config.eval, config.dpo, config.train
    problems = load_suite(ev.task, path=ev.path, split=ev.split, options=ev.options, limit=ev.limit) if ev.task else []
    if dist.is_main:
        save_config(config, run_dir / "config.yaml")
    tokenizer = load_tokenizer(config.model.path)
    max_length = config.data.max_length or context_length(config.model.path)
    train_data = tokenize_pairs(tokenizer, train_pairs, max_length, "data.path")
    eval_data = tokenize_pairs(tokenizer, eval_pairs, max_length, "held-out pairs")
    if dist.is_main:
        print(f"{len(train_data)} training pairs, {len(eval_data)} held-out pairs", flush=True)
    lora = config.model.lora.model_dump() if config.model.lora is not None else None
    policy = load_policy(config.model.path, dtype=config.model.dtype, device=str(device), lora=lora,
                         gradient_checkpointing=config.model.gradient_checkpointing, forward=config.model.forward)
    reference = Reference(policy, needed=True, path=config.model.path, dtype=config.model.dtype, device=str(device),
                          forward=config.model.forward)
    pad_id = tokenizer.pad_token_id
    total_steps = max(1, math.ceil(t.epochs * len(train_data) / t.batch_size))
    optimizer, scheduler = optimizer_from_config(policy.parameters(), config.optim, total_steps)
    tracker = open_tracker(config, run_dir, dist)
    engine, encode = HFEngine(policy, tokenizer), PromptEncoder(tokenizer)
    runner = VerifierRunner() if problems and dist.is_main else None
    started = time.perf_counter()

    def measure() -> dict[str, float]:
        """Held-out implicit accuracy / margin / loss, and greedy gold accuracy on the eval suite (rank 0)."""
        if not dist.is_main:
            return {}
        out = {f"eval/{k}": v for k, v in evaluate_pairs(policy, reference, eval_data, pad_id, d, ev.batch_size).items()} \
            if eval_data else {}
        if problems:
            out["eval/gold_accuracy"] = evaluate(engine, encode, problems, runner, sampling=SamplingParams(
                max_new_tokens=ev.max_new_tokens, greedy=True)).accuracy
        return out

    before = measure()
    tracker.log(0, before)
    if dist.is_main and "eval/gold_accuracy" in before:
        print(f"greedy gold accuracy before DPO: {before['eval/gold_accuracy']:.3f}", flush=True)
    progress = make_progress(total_steps, "dpo", enabled=config.log.progress and dist.is_main)
    for step in range(1, total_steps + 1):
        # ---- one optimizer step over batch_size pairs, in micro-batches --------------------
        picked = [train_data[i] for i in batch_indices(step, t.batch_size, len(train_data), t.seed)]
        optimizer.zero_grad(set_to_none=True)
        sums = backward_on_share(picked, t.micro_batch_size, lambda mb: pair_loss(policy, reference, mb, pad_id, d),
                                 list(policy.parameters()), dist)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), config.optim.grad_clip))
        optimizer.step()
        scheduler.step()
        metrics = {f"train/{k}": v for k, v in sums.items()}
        metrics.update({"train/grad_norm": grad_norm, "train/lr": scheduler.get_last_lr()[0]})

        # ---- held-out pairs and gold accuracy -----------------------------------------------
        if ev.every and step % ev.every == 0 and step != total_steps:
            metrics.update(measure())
        tracker.log(step, metrics)
        if progress is not None:
            progress.set_postfix(loss=f"{sums['loss']:.3f}", acc=f"{sums['accuracy']:.2f}")
            progress.update(1)
    if progress is not None:
        progress.close()

    # ---- final evaluation, model, summary ------------------------------------------------------
    after = measure()
    tracker.log(total_steps, after)
    replicas = replica_check(dist, policy)
    if runner is not None:
        runner.close()
    tracker.close()
    if not dist.is_main:
        return {"steps": total_steps, "rank": dist.rank}
    on_train = evaluate_pairs(policy, reference, train_data, pad_id, d, ev.batch_size)
    final = save_final_model(policy, tokenizer, run_dir / "final")
    if config.log.plot:
        plot_metrics(tracker.path, run_dir / "metrics.png", title=f"DPO {run_dir}", panels=PANELS)
    summary = {
        "steps": total_steps, "train_pairs": len(train_data), "eval_pairs": len(eval_data),
        "train_implicit_accuracy": on_train["accuracy"], "train_margin": on_train["margin"],
        "implicit_accuracy": after.get("eval/accuracy"), "margin": after.get("eval/margin"),
        "logp_chosen_before": before.get("eval/logp_chosen"), "logp_chosen_after": after.get("eval/logp_chosen"),
        "gold_accuracy_before": before.get("eval/gold_accuracy"), "gold_accuracy_after": after.get("eval/gold_accuracy"),
        "wall_s": time.perf_counter() - started, "model": str(final),
        **({"replicas": replicas} if replicas else {}),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
