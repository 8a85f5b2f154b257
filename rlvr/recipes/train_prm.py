"""Train a process reward model on step-labelled completions (``rlvr train-prm``).

    p_k = p(good | prompt, steps 1..k), read at the last token t_k of step k
    L   = mean over the steps of a batch of CE(logits[t_k], label_k)        (cross-entropy at step ends only)

The model, its head and scoring are in ``rlvr/modeling/prm.py``; the data (TRL's stepwise-supervision
JSONL) in ``rlvr/rollout/step_data.py``. The loop is the pair recipes' (``rlvr/recipes/pairs.py``):
held-out measurements at the start, every ``eval.every`` steps and at the end, around one optimizer
step over ``train.batch_size`` examples. Held-out step accuracy (threshold ``eval.threshold``) is the
headline number of the summary, beside the accuracy of always guessing the held-out majority label.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from rlvr.config import PRMConfig
from rlvr.modeling.loading import context_length, load_tokenizer
from rlvr.modeling.prm import load_prm_backbone, save_prm, step_logits, step_loss, step_probabilities
from rlvr.recipes.pairs import fit_pairs, pair_steps
from rlvr.recipes.scaffold import Run
from rlvr.rollout.step_data import TokenizedSteps, load_step_data, tokenize_step_examples
from rlvr.run.runtime import optimizer_from_config

PANELS = [
    ("step cross-entropy", ["train/loss", "eval/loss"]),
    ("step accuracy", ["train/step_accuracy", "eval/step_accuracy", "eval/first_error_accuracy"]),
    ("gradient norm", ["train/grad_norm"]),
    ("learning rate", ["train/lr"]),
]


def batch_logits(model, batch: Sequence[TokenizedSteps], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits at every step end of ``batch`` and the steps' labels.  -> [S, C], [S]"""
    logits = step_logits(model, [e.prompt for e in batch], [e.completion for e in batch], [e.ends for e in batch], pad_id)
    labels = torch.tensor([label for e in batch for label in e.labels], device=logits.device)
    return logits, labels


def first_error(labels: Sequence[int]) -> int:
    """The index of the first bad step, or the number of steps when every step is good."""
    return next((k for k, label in enumerate(labels) if not label), len(labels))


@torch.no_grad()
def evaluate_steps(model, examples: Sequence[TokenizedSteps], pad_id: int, batch_size: int,
                   threshold: float = 0.5) -> dict[str, float]:
    """Over ``examples``: ``loss`` (mean step cross-entropy), ``step_accuracy`` (p(good) >= ``threshold``
    against the label, over all steps), ``first_error_accuracy`` (the first step predicted bad is the
    first bad step, or none is predicted bad in an all-good completion; over examples) and
    ``majority_accuracy`` (always guessing the more common label: the accuracy to beat)."""
    was_training = model.training
    model.eval()
    loss_sum, right, first_right, steps, good = 0.0, 0, 0, 0, 0
    for start in range(0, len(examples), batch_size):
        batch = examples[start : start + batch_size]
        logits, labels = batch_logits(model, batch, pad_id)
        loss_sum += step_loss(logits, labels).item() * len(labels)
        predicted = (step_probabilities(logits) >= threshold).long()
        right += (predicted == labels).sum().item()
        steps += len(labels)
        good += labels.sum().item()
        at = 0
        for example in batch:
            k = len(example.labels)
            first_right += first_error(predicted[at : at + k].tolist()) == first_error(example.labels)
            at += k
    model.train(was_training)
    if not steps:
        return {}
    return {"loss": loss_sum / steps, "step_accuracy": right / steps, "first_error_accuracy": first_right / len(examples),
            "majority_accuracy": max(good, steps - good) / steps}


def train(config: PRMConfig, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Train a process reward model; see the module docstring. ``resume`` continues from the run's latest
    checkpoint, ``overwrite`` replaces a run already in ``config.out``."""
    with Run.start(config, "prm", resume=resume, overwrite=overwrite) as run:
        config, dist, ev, data = run.config, run.dist, run.config.eval, run.config.data

        # ---- data: tokenised as the trainer encodes rollouts, before the model loads (bad data fails fast)
        tokenizer = load_tokenizer(config.model.path)
        train_examples, eval_examples = load_step_data(data, config.train.seed)
        max_length = data.max_length or context_length(config.model.path)
        train_data = tokenize_step_examples(tokenizer, train_examples, data.separator, max_length, "data.path")
        eval_data = tokenize_step_examples(tokenizer, eval_examples, data.separator, max_length, "held-out examples")
        if dist.is_main:
            print(f"{len(train_data)} training examples ({sum(len(e.ends) for e in train_data)} steps), "
                  f"{len(eval_data)} held-out examples ({sum(len(e.ends) for e in eval_data)} steps)", flush=True)

        # ---- model and optimizer (a resumed run loads its weights from the checkpoint)
        model = load_prm_backbone(config.model, tokenizer, str(dist.device),
                                  run.checkpoint / "model" if run.checkpoint is not None else None)
        pad_id = tokenizer.pad_token_id
        total = pair_steps(config.train, len(train_data))
        optimizer, scheduler = optimizer_from_config(model.parameters(), config.optim, total)
        run.panels = PANELS
        run.restore({"optimizer": optimizer, "scheduler": scheduler}, models={"policy": model}, tokenizer=tokenizer)

        def held_out() -> dict[str, float]:
            """The held-out ``eval/`` metrics (rank 0; none without held-out examples)."""
            if not (eval_data and dist.is_main):
                return {}
            return {f"eval/{k}": v for k, v in evaluate_steps(model, eval_data, pad_id, ev.batch_size,
                                                               ev.threshold).items()}

        def example_loss(mb: list[TokenizedSteps]) -> tuple[torch.Tensor, dict]:
            """Cross-entropy at the step ends of a micro-batch of examples, and its step accuracy."""
            logits, labels = batch_logits(model, mb, pad_id)
            loss = step_loss(logits, labels)
            accuracy = ((step_probabilities(logits) >= ev.threshold).long() == labels).float().mean().item()
            return loss, {"loss": loss.item(), "step_accuracy": accuracy}

        # ---- the loop: measure, (step, measure on schedule)*, measure
        before, after = fit_pairs(run, train_data, example_loss, model, optimizer, scheduler, measure=held_out,
                                  accuracy="step_accuracy")
        summary = {
            "steps": total, "train_examples": len(train_data), "eval_examples": len(eval_data),
            "eval_steps": sum(len(e.ends) for e in eval_data), "separator": data.separator,
            "step_accuracy": after.get("eval/step_accuracy"), "step_accuracy_before": before.get("eval/step_accuracy"),
            "first_error_accuracy": after.get("eval/first_error_accuracy"),
            "majority_accuracy": after.get("eval/majority_accuracy"), "eval_loss": after.get("eval/loss"),
            "model": str(run.run_dir / "final") if config.checkpoint.final_model else None,
        }
        return run.finish(summary, save_final=lambda out: save_prm(model, tokenizer, out, separator=data.separator),
                          models=(model,))
