"""A Bradley-Terry reward model trained on preference pairs (``rlvr train-rm``), and its scorer.

    P(chosen > rejected | prompt) = sigmoid(r(x, y_w) - r(x, y_l)),   L = -log sigmoid(r_w - r_l - margin)

Two heads (config ``head``) give the scalar r(x, y):

* ``score`` (default): the causal-LM folder loaded as ``AutoModelForSequenceClassification`` with
  ``num_labels=1``: a new linear layer on the hidden state of the sequence's last real token (the
  EOS after the completion; transformers finds it as the last token that is not ``pad_token_id``,
  which is set from the tokenizer). With LoRA the head is trained in full (peft ``modules_to_save``).
  ``final/`` loads with ``AutoModelForSequenceClassification.from_pretrained``.
* ``logprob``: the causal LM itself, r(x, y) = sum_t log p(y_t | x, y_<t) over the completion and its
  EOS. No new weights: the model starts as a ranker already (it prefers what it would generate) and
  Bradley-Terry training sharpens it. ``final/`` is a causal-LM folder.

``final/reward_model.json`` names the head, so :class:`RewardModel` scores either kind the same way.

Under ``torchrun`` each rank scores every world-size-th pair of each optimizer step's batch (the loss
weighted by its share of the global batch), gradients are summed across ranks before the step, and
rank 0 alone evaluates, checkpoints and writes the run folder (docs/scaling.md).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from rlvr.algorithms.preference import bradley_terry_loss
from rlvr.checkpoint import restore_states, resume_checkpoint, save_checkpoint
from rlvr.config import save_config
from rlvr.offline_configs import RewardModelConfig
from rlvr.logprobs import completion_logprobs
from rlvr.models import check_model_folder, context_length, is_lora, load_policy, load_tokenizer, resolve_dtype
from rlvr.preferences import TokenizedPair, load_preference_data, tokenize_pairs
from rlvr.progress import make_progress
from rlvr.ranks import backward_on_share, join_run, open_tracker, replica_check
from rlvr.runtime import optimizer_from_config
from rlvr.tracking import plot_metrics

HEAD_FILE = "reward_model.json"
PANELS = [
    ("Bradley-Terry loss", ["train/loss", "eval/loss"]),
    ("pairwise accuracy", ["train/pairwise_accuracy", "eval/pairwise_accuracy"]),
    ("margin r_w - r_l", ["train/margin", "eval/margin"]),
    ("rewards", ["train/reward_chosen", "train/reward_rejected"]),
    ("gradient norm", ["train/grad_norm"]),
    ("learning rate", ["train/lr"]),
]

# ---------------------------------------------------------------------------------------------
# Scoring: (prompt ids, completion ids) -> r [N], one function per head
# ---------------------------------------------------------------------------------------------


def score_head_rewards(model, prompts: Sequence[list[int]], completions: Sequence[list[int]], pad_id: int) -> torch.Tensor:
    """Sequence-classification head: right-padded ``prompt + completion``; transformers reads the
    logit at the last token that is not padding.  -> [N] float32"""
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        attention[i, : len(s)] = 1
    device = next(model.parameters()).device
    return model(input_ids=ids.to(device), attention_mask=attention.to(device), use_cache=False).logits[:, 0].float()


def logprob_head_rewards(model, prompts: Sequence[list[int]], completions: Sequence[list[int]], pad_id: int) -> torch.Tensor:
    """Causal LM: sum of the completion tokens' log-probabilities (EOS included).  -> [N] float32"""
    ids, attention, mask = collate_completions(prompts, completions, pad_id)
    device = next(model.parameters()).device
    logp, _ = completion_logprobs(model, ids.to(device), attention.to(device), mask.shape[1])  # [N, T]
    return (logp * mask.to(device)).sum(dim=1)


HEADS: dict[str, Callable[..., torch.Tensor]] = {"score": score_head_rewards, "logprob": logprob_head_rewards}


def collate_completions(prompts: Sequence[list[int]], completions: Sequence[list[int]], pad_id: int):
    """``[left-padded prompt | right-padded completion]`` ids [N, W+T], attention mask, completion mask [N, T]."""
    width, length = max(len(p) for p in prompts), max(len(c) for c in completions)
    ids = torch.full((len(prompts), width + length), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros((len(prompts), length))
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ids[i, width - len(p) : width + len(c)] = torch.tensor(list(p) + list(c))
        attention[i, width - len(p) : width + len(c)] = 1
        mask[i, : len(c)] = 1
    return ids, attention, mask


class RewardModel:
    """A trained reward model (a ``rlvr train-rm`` run's ``final/``, or any one-label
    sequence-classification folder) that scores completions in batches of ``batch_size``:
    ``RewardModel(run / "final").score(prompt_ids_list, completion_ids_list)`` -> ``[N]`` rewards,
    with prompts encoded by :class:`rlvr.suites.PromptEncoder` and completions as generated
    (ending with EOS when the model stopped)."""

    def __init__(self, path: str | Path, device: str = "cpu", batch_size: int = 64, dtype: str = "float32"):
        folder = check_model_folder(path, "reward model")
        info = json.loads((folder / HEAD_FILE).read_text()) if (folder / HEAD_FILE).is_file() else {"head": "score"}
        self.head = info["head"]
        self.batch_size = batch_size
        self.tokenizer = tokenizer = load_tokenizer(folder)
        self.pad_id = tokenizer.pad_token_id
        if self.head == "logprob":
            self.model = load_policy(folder, dtype=dtype, device=device)
        else:
            from transformers import AutoModelForSequenceClassification

            self.model = AutoModelForSequenceClassification.from_pretrained(str(folder), dtype=resolve_dtype(dtype)).to(device)
            if self.model.config.pad_token_id is None:  # a folder from elsewhere: batches need it to find the last token
                self.model.config.pad_token_id = self.pad_id
        self.model.eval().requires_grad_(False)

    @torch.no_grad()
    def score(self, prompt_ids_list: Sequence[list[int]], completion_ids_list: Sequence[list[int]]) -> torch.Tensor:
        """r(x, y) for each (prompt ids, completion ids), completions ending with EOS as generated.  -> [N] on CPU"""
        out = [HEADS[self.head](self.model, prompt_ids_list[i : i + self.batch_size],
                                completion_ids_list[i : i + self.batch_size], self.pad_id).cpu()
               for i in range(0, len(prompt_ids_list), self.batch_size)]
        return torch.cat(out) if out else torch.zeros(0)


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------


def load_reward_backbone(config: RewardModelConfig, tokenizer, device: str, adapter_or_weights: Path | None = None):
    """The trainable reward model: the head's network over ``model.path``, LoRA or full.
    ``adapter_or_weights`` is a checkpoint's ``model/`` folder (resume)."""
    lora = config.model.lora.model_dump() if config.model.lora is not None else None
    dtype = config.model.dtype
    if config.head == "logprob":
        full = adapter_or_weights if adapter_or_weights is not None and lora is None else config.model.path
        return load_policy(full, dtype=dtype, device=device, lora=lora, adapter_path=adapter_or_weights if lora else None,
                           gradient_checkpointing=config.model.gradient_checkpointing, forward=config.model.forward)
    from transformers import AutoModelForSequenceClassification

    source = adapter_or_weights if adapter_or_weights is not None and lora is None else config.model.path
    model = AutoModelForSequenceClassification.from_pretrained(
        str(check_model_folder(source)), num_labels=1, dtype=resolve_dtype(dtype), pad_token_id=tokenizer.pad_token_id,
    ).to(device)  # pad_token_id: transformers scores the last non-pad token, and refuses batches without one
    if config.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if lora is not None:
        from peft import LoraConfig, PeftModel, get_peft_model

        if adapter_or_weights is not None:
            model = PeftModel.from_pretrained(model, str(adapter_or_weights), is_trainable=True)
        else:
            model = get_peft_model(model, LoraConfig(
                r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                target_modules=lora["target_modules"], task_type="SEQ_CLS", modules_to_save=["score"]))
    return model.train()


def save_reward_model(model, tokenizer, out: Path, head: str) -> Path:
    """``out``: a standalone folder (LoRA merged; adapters also under ``adapter/``) + ``reward_model.json``."""
    import copy

    if is_lora(model):
        model.save_pretrained(out / "adapter")
        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / HEAD_FILE).write_text(json.dumps({"head": head}))
    return out


# ---------------------------------------------------------------------------------------------
# Evaluation on held-out pairs
# ---------------------------------------------------------------------------------------------


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


def batch_indices(step: int, batch_size: int, n: int, seed: int) -> list[int]:
    """The pairs of optimizer step ``step`` (1-based): consecutive slices of a fresh shuffle per epoch,
    a pure function of the step, so a resumed run continues with the same data."""
    orders: dict[int, list[int]] = {}
    out = []
    for position in range((step - 1) * batch_size, step * batch_size):
        epoch, i = divmod(position, n)
        if epoch not in orders:
            orders[epoch] = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist()
        out.append(orders[epoch][i])
    return out


# ---------------------------------------------------------------------------------------------
# The recipe
# ---------------------------------------------------------------------------------------------


def train(config: RewardModelConfig, *, overwrite: bool = False, resume: bool = False) -> dict[str, Any]:
    """Train a Bradley-Terry reward model; see the module docstring. ``resume`` continues from the run's
    latest checkpoint, ``overwrite`` replaces a run already in ``config.out``."""
    config, run_dir, dist = join_run(config, "rm", resume=resume, overwrite=overwrite)
    device, main = dist.device, dist.is_main  # rank 0 alone evaluates and writes (docs/scaling.md)
    train_pairs, eval_pairs = load_preference_data(config.data, config.train.seed)  # bad data fails before any model
    if main:
        save_config(config, run_dir / "config.yaml")
    tokenizer = load_tokenizer(config.model.path)
    max_length = config.data.max_length or context_length(config.model.path)
    train_data = tokenize_pairs(tokenizer, train_pairs, max_length, "data.path")
    eval_data = tokenize_pairs(tokenizer, eval_pairs, max_length, "held-out pairs")
    if main:
        print(f"{len(train_data)} training pairs, {len(eval_data)} held-out pairs; head: {config.head}", flush=True)
    checkpoint = resume_checkpoint(run_dir) if resume else None
    model = load_reward_backbone(config, tokenizer, str(device), checkpoint / "model" if checkpoint else None)
    score = HEADS[config.head]
    pad_id, t, margin = tokenizer.pad_token_id, config.train, config.loss.margin
    total_steps = max(1, math.ceil(t.epochs * len(train_data) / t.batch_size))
    optimizer, scheduler = optimizer_from_config(model.parameters(), config.optim, total_steps)
    tracker = open_tracker(config, run_dir, dist)
    first_step, started, before = 1, time.perf_counter(), None
    if checkpoint is not None:
        state = restore_states(checkpoint, {"optimizer": optimizer, "scheduler": scheduler})
        first_step, before = state["step"] + 1, state.get("eval_before")
        tracker.truncate(state["step"])
        if main:
            print(f"resumed from {checkpoint} (step {state['step']})", flush=True)
    elif eval_data and main:
        before = evaluate_pairs(model, config.head, eval_data, pad_id, config.eval.batch_size, margin)
        tracker.log(0, {f"eval/{k}": v for k, v in before.items()})
        print(f"held-out pairwise accuracy before training: {before['pairwise_accuracy']:.3f}", flush=True)
    def pair_loss(mb: list[TokenizedPair]) -> tuple[torch.Tensor, dict]:
        """The Bradley-Terry loss of a micro-batch of pairs and its stats."""
        r = score(model, [p.prompt for p in mb] * 2, [p.chosen for p in mb] + [p.rejected for p in mb], pad_id)  # [2b]
        loss, stats = bradley_terry_loss(r[: len(mb)], r[len(mb) :], margin or None, config.loss.center_coef)
        return loss, {"loss": loss.item(), **stats}

    progress = make_progress(total_steps, "train-rm", initial=first_step - 1, enabled=config.log.progress and main)
    for step in range(first_step, total_steps + 1):
        # ---- one optimizer step: Bradley-Terry loss over batch_size pairs, in micro-batches ----
        picked = [train_data[i] for i in batch_indices(step, t.batch_size, len(train_data), t.seed)]
        optimizer.zero_grad(set_to_none=True)
        sums = backward_on_share(picked, t.micro_batch_size, pair_loss, list(model.parameters()), dist)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.grad_clip))
        optimizer.step()
        scheduler.step()
        metrics = {f"train/{k}": v for k, v in sums.items()}
        metrics.update({"train/grad_norm": grad_norm, "train/lr": scheduler.get_last_lr()[0]})

        # ---- held-out pairs, checkpoint ----------------------------------------------------
        if main and eval_data and config.eval.every and step % config.eval.every == 0 and step != total_steps:
            held = evaluate_pairs(model, config.head, eval_data, pad_id, config.eval.batch_size, margin)
            metrics.update({f"eval/{k}": v for k, v in held.items()})
        tracker.log(step, metrics)
        if progress is not None:
            progress.set_postfix(loss=f"{sums['loss']:.3f}", acc=f"{sums['pairwise_accuracy']:.2f}")
            progress.update(1)
        if main and config.checkpoint.every and step % config.checkpoint.every == 0 and step != total_steps:
            save_checkpoint(run_dir, step, models={"policy": model}, tokenizer=tokenizer,
                            states={"optimizer": optimizer, "scheduler": scheduler},
                            extra={"eval_before": before}, keep=config.checkpoint.keep)
    if progress is not None:
        progress.close()

    # ---- final evaluation, model, summary ------------------------------------------------------
    replicas = replica_check(dist, model)
    if not main:
        tracker.close()
        return {"steps": total_steps, "rank": dist.rank}
    after = evaluate_pairs(model, config.head, eval_data, pad_id, config.eval.batch_size, margin) if eval_data else None
    if after is not None:
        tracker.log(total_steps, {f"eval/{k}": v for k, v in after.items()})
    if config.checkpoint.at_end:
        save_checkpoint(run_dir, total_steps, models={"policy": model}, tokenizer=tokenizer,
                        states={"optimizer": optimizer, "scheduler": scheduler},
                        extra={"eval_before": before}, keep=config.checkpoint.keep)
    final = save_reward_model(model, tokenizer, run_dir / "final", config.head) if config.checkpoint.final_model else None
    tracker.close()
    if config.log.plot:
        plot_metrics(tracker.path, run_dir / "metrics.png", title=f"reward model {run_dir}", panels=PANELS)
    summary = {
        "steps": total_steps, "head": config.head, "train_pairs": len(train_data), "eval_pairs": len(eval_data),
        "pairwise_accuracy": after["pairwise_accuracy"] if after else None,
        "margin": after["margin"] if after else None, "eval_loss": after["loss"] if after else None,
        "pairwise_accuracy_before": before["pairwise_accuracy"] if before else None,
        "wall_s": time.perf_counter() - started, "model": str(final) if final else None,
        **({"replicas": replicas} if replicas else {}),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
