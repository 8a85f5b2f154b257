"""What the two recipes that learn from preference pairs (``train_rm.py``, ``dpo.py``) share: their
data, and their loop (held-out measurements at the start, on schedule and at the end around one
optimizer step over a batch of pairs)."""

from __future__ import annotations

import math
from typing import Callable

from rlvr.modeling.loading import context_length
from rlvr.rollout.preferences import TokenizedPair, load_preference_data, tokenize_pairs
from rlvr.rollout.sampler import batch_indices
from rlvr.run.ranks import backward_on_share
from rlvr.run.runtime import optimizer_step


def load_pairs(config, tokenizer, *, main: bool) -> tuple[list[TokenizedPair], list[TokenizedPair]]:
    """``(training, held-out)`` pairs of ``config.data``, tokenised as the trainer encodes rollouts; pairs
    longer than ``data.max_length`` (default: the model's context) are left out and counted."""
    train_pairs, eval_pairs = load_preference_data(config.data, config.train.seed)
    max_length = config.data.max_length or context_length(config.model.path)
    train_data = tokenize_pairs(tokenizer, train_pairs, max_length, "data.path")
    eval_data = tokenize_pairs(tokenizer, eval_pairs, max_length, "held-out pairs")
    if main:
        print(f"{len(train_data)} training pairs, {len(eval_data)} held-out pairs", flush=True)
    return train_data, eval_data


def fit_pairs(run, data: list[TokenizedPair], loss_of: Callable, model, optimizer, scheduler, *,
              measure: Callable[[], dict[str, float]], accuracy: str) -> tuple[dict, dict]:
    """The loop of a pair recipe on ``run`` (a :class:`rlvr.recipes.scaffold.Run`): ``measure()`` (the
    held-out ``eval/`` metrics, rank 0; every rank for a sharded model, whose passes are collective) before the first step of a new run, every ``eval.every`` steps
    and after the last; :func:`pair_step` in between. Returns the measurements ``(before, after)``; the
    progress bar shows the loss and the batch's ``train/<accuracy>``."""
    config = run.config
    total = pair_steps(config.train, len(data))
    if run.done == 0:
        run.evaluations[0] = measure()
        run.tracker.log(0, run.evaluations[0])
        if run.evaluations[0] and run.dist.is_main:
            print("before training: " + ", ".join(f"{k} {v:.3f}" for k, v in run.evaluations[0].items()), flush=True)
    for step in run.steps(total):
        metrics = pair_step(step, data, loss_of, model, optimizer, scheduler, config, run.dist)
        if (config.eval.every and step % config.eval.every == 0) or step == total:
            run.evaluations[step] = measure()
            metrics.update(run.evaluations[step])
        run.end_step(step, metrics, postfix={"loss": f"{metrics['train/loss']:.3f}",
                                             "acc": f"{metrics[f'train/{accuracy}']:.2f}"})
    return run.evaluations.get(0, {}), run.evaluations.get(total, {})


def pair_steps(train, pairs: int) -> int:
    """Optimizer steps of ``train.epochs`` passes over ``pairs`` pairs, ``train.batch_size`` a step."""
    return max(1, math.ceil(train.epochs * pairs / train.batch_size))


def pair_step(step: int, data: list[TokenizedPair], loss_of: Callable, model, optimizer, scheduler, config,
              dist) -> dict[str, float]:
    """One optimizer step over ``train.batch_size`` pairs (step ``step`` of shuffled passes over ``data``):
    ``loss_of(micro_batch) -> (mean loss, stats)`` over this rank's share in micro-batches, the
    gradients summed over ranks, clipped, stepped. Returns the ``train/`` metrics."""
    training = config.train
    picked = [data[i] for i in batch_indices(step, training.batch_size, len(data), training.seed)]
    optimizer.zero_grad(set_to_none=True)
    sums = backward_on_share(picked, training.micro_batch_size, loss_of, model, dist)
    grad_norm = optimizer_step(model.parameters(), optimizer, scheduler, config.optim.grad_clip)
    return {**{f"train/{k}": v for k, v in sums.items()}, "train/grad_norm": grad_norm,
            "train/lr": scheduler.get_last_lr()[0]}
