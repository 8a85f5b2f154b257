"""Train a Bradley-Terry reward model on preference pairs (``rlvr train-rm``).

    P(chosen > rejected | prompt) = sigmoid(r(x, y_w) - r(x, y_l)),   L = -log sigmoid(r_w - r_l - margin)

With the logprob head, ``loss.nll_coef`` adds the chosen completions' NLL per token: Bradley-Terry
fixes only differences of log-probs, and the anchor keeps the chosen answers likely (docs/reward-models.md).

The heads, loading and saving are in ``rlvr/modeling/reward_model.py``. Under ``torchrun`` each rank
scores every world-size-th pair of each optimizer step's batch (the loss weighted by its share of the
global batch), gradients are summed across ranks before the step, and rank 0 alone evaluates,
checkpoints and writes the run folder (docs/scaling.md).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from rlvr.algorithms.preference import bradley_terry_loss
from rlvr.config import RewardModelConfig
from rlvr.modeling.loading import load_tokenizer, shard_for_run
from rlvr.modeling.precision import weights_dtype
from rlvr.modeling.reward_model import HEADS, load_reward_backbone, save_reward_model
from rlvr.recipes.pairs import fit_pairs, load_pairs, pair_steps
from rlvr.recipes.scaffold import Run
from rlvr.rollout.preferences import TokenizedPair
from rlvr.run.ranks import sharded_run
from rlvr.run.runtime import optimizer_from_config
from rlvr.run.sharded_checkpoint import has_sharded_part

PANELS = [
    ("Bradley-Terry loss", ["train/loss", "eval/loss"]),
    ("pairwise accuracy", ["train/pairwise_accuracy", "eval/pairwise_accuracy"]),
    ("margin r_w - r_l", ["train/margin", "eval/margin"]),
    ("rewards", ["train/reward_chosen", "train/reward_rejected"]),
    ("gradient norm", ["train/grad_norm"]),
    ("learning rate", ["train/lr"]),
]


@torch.no_grad()
def evaluate_pairs(model, head: str, pairs: Sequence[TokenizedPair], pad_id: int, batch_size: int,
                   margin: float = 0.0) -> dict[str, float]:
    """Bradley-Terry loss, pairwise accuracy and mean margin over ``pairs`` (weighted by batch size)."""
    was_training = model.training
    model.eval()
    totals = {"loss": 0.0, "pairwise_accuracy": 0.0, "margin": 0.0}
    for start in range(0, len(pairs), batch_size):
        batch = pairs[start : start + batch_size]
        r = HEADS[head](model, [p.prompt for p in batch] * 2, [p.chosen for p in batch] + [p.rejected for p in batch], pad_id)
        loss, stats = bradley_terry_loss(r[: len(batch)], r[len(batch) :], margin or None)
        totals["loss"] += loss.item() * len(batch)
        totals["pairwise_accuracy"] += stats["pairwise_accuracy"] * len(batch)
        totals["margin"] += stats["margin"] * len(batch)
    model.train(was_training)
    return {k: v / max(1, len(pairs)) for k, v in totals.items()}


def train(config: RewardModelConfig, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Train a Bradley-Terry reward model; see the module docstring. ``resume`` continues from the run's
    latest checkpoint, ``overwrite`` replaces a run already in ``config.out``."""
    with Run.start(config, "rm", resume=resume, overwrite=overwrite) as run:
        config, dist, ev = run.config, run.dist, run.config.eval
        tokenizer = load_tokenizer(config.model.path)
        train_data, eval_data = load_pairs(config, tokenizer, main=dist.is_main)  # bad data fails before the model
        shard = sharded_run(config.train, dist)
        whole_checkpoint = run.checkpoint is not None and not has_sharded_part(run.checkpoint)
        full = config.model.lora is None  # all weights train: float32 master weights (rlvr/modeling/precision.py)
        weights = weights_dtype(config.model.dtype, trains_all_weights=shard or full)
        model = load_reward_backbone(config.model_copy(update={"model": config.model.model_copy(update={"dtype": weights})}),
                                     tokenizer, str(dist.device), run.checkpoint / "model" if whole_checkpoint else None,
                                     shard=shard, compute_dtype=config.model.dtype, offload=config.train.cpu_offload)
        model = shard_for_run(model, config.model.dtype, run.checkpoint, shard=shard, offload=config.train.cpu_offload,
                              master_weights=full)
        score, pad_id, margin = HEADS[config.head], tokenizer.pad_token_id, config.loss.margin
        nll_coef = config.loss.nll_coef
        total = pair_steps(config.train, len(train_data))
        optimizer, scheduler = optimizer_from_config(model.parameters(), config.optim, total)
        run.panels = PANELS
        run.restore({"optimizer": optimizer, "scheduler": scheduler}, models={"policy": model}, tokenizer=tokenizer)

        def held_out() -> dict[str, float]:
            """Loss, pairwise accuracy and margin on the held-out pairs (rank 0, or every rank of a sharded
            model, whose passes are collective; none without them)."""
            if not (eval_data and (dist.is_main or shard)):
                return {}
            return {f"eval/{k}": v for k, v in evaluate_pairs(model, config.head, eval_data, pad_id, ev.batch_size,
                                                               margin).items()}

        def pair_loss(mb: list[TokenizedPair]) -> tuple[torch.Tensor, dict]:
            """The Bradley-Terry loss of a micro-batch of pairs and its stats."""
            r = score(model, [p.prompt for p in mb] * 2, [p.chosen for p in mb] + [p.rejected for p in mb], pad_id)
            loss, stats = bradley_terry_loss(r[: len(mb)], r[len(mb) :], margin or None, config.loss.center_coef)
            if nll_coef:  # logprob head: r is the chosen completion's summed log-prob
                nll = -r[: len(mb)].sum() / sum(len(p.chosen) for p in mb)
                loss = loss + nll_coef * nll
                stats["nll_chosen"] = nll.item()
            return loss, {"loss": loss.item(), **stats}

        before, after = fit_pairs(run, train_data, pair_loss, model, optimizer, scheduler, measure=held_out,
                                  accuracy="pairwise_accuracy")
        summary = {
            "steps": total, "head": config.head, "train_pairs": len(train_data), "eval_pairs": len(eval_data),
            "pairwise_accuracy": after.get("eval/pairwise_accuracy"), "margin": after.get("eval/margin"),
            "eval_loss": after.get("eval/loss"), "pairwise_accuracy_before": before.get("eval/pairwise_accuracy"),
            "model": str(run.run_dir / "final") if config.checkpoint.final_model else None,
        }
        return run.finish(summary, save_final=lambda out: save_reward_model(model, tokenizer, out, config.head),
                          models=(model,))
