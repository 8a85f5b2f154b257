"""Supervised fine-tuning on gold completions (stage 1 of the classic pipeline).

The loss is the mean negative log-likelihood of completion tokens only (prompt tokens are context,
never targets), with the end-of-sequence token appended so the model learns to stop. Data comes
from a task suite whose problems carry a ``solution``, or from a JSONL file of
``{"prompt": str | messages, "completion": str}`` or ``{"messages": [..., {"role": "assistant", ...}]}``.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from rlvr.chat import Messages
from rlvr.config import SFTConfig, save_config
from rlvr.engines import HFEngine, SamplingParams
from rlvr.evaluate import evaluate
from rlvr.logprobs import completion_logprobs
from rlvr.models import load_policy, load_tokenizer, save_final_model
from rlvr.runtime import build_optimizer, build_scheduler, quiet_transformers, resolve_device, seed_everything, set_threads
from rlvr.suites import PromptEncoder, load_suite
from rlvr.tracking import Tracker, plot_metrics
from rlvr.tasks.base import Problem
from rlvr.verifiers.runner import VerifierRunner


def load_sft_examples(data) -> list[tuple[Messages, str]]:
    """``(prompt messages, completion text)`` pairs from a suite's solutions or a JSONL file."""
    if data.task is not None:
        problems = load_suite(data.task, path=data.path, split=data.split, options=data.options, limit=data.limit)
        missing = [p.id for p in problems if p.solution is None]
        if missing:
            raise ValueError(f"task {data.task!r} has no gold solution for {len(missing)} problems (e.g. {missing[0]}); "
                             "SFT needs a suite with solutions or a JSONL file")
        return [(p.prompt, p.solution) for p in problems]
    return _read_jsonl_examples(Path(data.path), data.limit)


def _read_jsonl_examples(path: Path, limit: int | None) -> list[tuple[Messages, str]]:
    if not path.is_file():
        raise FileNotFoundError(f"SFT data file {path} does not exist")
    examples = []
    for line_no, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{line_no}: not valid JSON ({exc})") from None
        if "messages" in row:
            messages = row["messages"]
            if not messages or messages[-1].get("role") != "assistant":
                raise ValueError(f"{path}:{line_no}: field 'messages' must end with an assistant message")
            examples.append((messages[:-1], messages[-1]["content"]))
        elif "prompt" in row and "completion" in row:
            prompt = row["prompt"]
            examples.append(([{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt, row["completion"]))
        else:
            raise ValueError(f"{path}:{line_no}: needs fields 'prompt' and 'completion', or 'messages'")
        if limit is not None and len(examples) >= limit:
            break
    if not examples:
        raise ValueError(f"{path}: no examples")
    return examples


def _tokenize(tokenizer, examples: list[tuple[Messages, str]]) -> list[tuple[list[int], list[int]]]:
    encode = PromptEncoder(tokenizer)
    completions = tokenizer([c for _, c in examples], add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    return [(encode(Problem("", list(m), {}, "")), ids + [eos]) for (m, _), ids in zip(examples, completions)]


def _collate(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[left-padded prompt | right-padded completion]`` ids, attention mask, completion mask."""
    width = max(len(p) for p, _ in pairs)
    length = max(len(c) for _, c in pairs)
    ids = torch.full((len(pairs), width + length), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros((len(pairs), length))
    for i, (p, c) in enumerate(pairs):
        ids[i, width - len(p) : width] = torch.tensor(p)
        ids[i, width : width + len(c)] = torch.tensor(c)
        attention[i, width - len(p) : width + len(c)] = 1
        mask[i, : len(c)] = 1
    return ids, attention, mask


def train(config: SFTConfig) -> dict[str, Any]:
    """Fine-tune on gold completions; stops early when held-out accuracy reaches ``eval.stop_at_accuracy``."""
    quiet_transformers()
    run_dir = Path(config.out)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(config, run_dir / "config.yaml")
    device = resolve_device(config.train.device)
    seed_everything(config.train.seed)
    set_threads(config.train.threads)
    tokenizer = load_tokenizer(config.model.path)
    lora = config.model.lora.model_dump() if config.model.lora is not None else None
    model = load_policy(config.model.path, dtype=config.model.dtype, device=str(device), lora=lora,
                        gradient_checkpointing=config.model.gradient_checkpointing)
    data = _tokenize(tokenizer, load_sft_examples(config.data))
    optimizer = build_optimizer(model.parameters(), lr=config.optim.lr, weight_decay=config.optim.weight_decay, betas=config.optim.betas)
    scheduler = build_scheduler(optimizer, total=config.train.steps, warmup=config.optim.warmup_steps,
                                schedule=config.optim.schedule, min_ratio=config.optim.min_lr_ratio)
    tracker = Tracker(run_dir)
    ev = config.eval
    eval_problems = []
    if ev.every:
        eval_problems = load_suite(ev.task or config.data.task, path=config.data.path if ev.task is None else None,
                                   split=ev.split, options=ev.options or config.data.options, limit=ev.limit)
    engine = HFEngine(model, tokenizer)
    encode = PromptEncoder(tokenizer)
    runner = VerifierRunner()
    rng = random.Random(config.train.seed)
    order: list[int] = []
    started = time.perf_counter()
    accuracy, step = None, 0
    progress = _progress(config)
    for step in range(1, config.train.steps + 1):
        # ---- one optimizer step over batch_size examples, in micro-batches -------------------
        picked = []
        while len(picked) < config.train.batch_size:
            if not order:
                order = list(range(len(data)))
                rng.shuffle(order)
            picked.append(data[order.pop()])
        ids, attention, mask = (t.to(device) for t in _collate(picked, tokenizer.pad_token_id))
        total_tokens = float(mask.sum())
        optimizer.zero_grad(set_to_none=True)
        loss_value = 0.0
        for start in range(0, len(picked), config.train.micro_batch_size):
            sl = slice(start, start + config.train.micro_batch_size)
            logp, _ = completion_logprobs(model, ids[sl], attention[sl], mask.shape[1])
            loss = -(logp * mask[sl]).sum() / total_tokens
            loss.backward()
            loss_value += loss.item()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.grad_clip))
        optimizer.step()
        scheduler.step()
        metrics = {"train/loss": loss_value, "train/grad_norm": grad_norm, "train/lr": scheduler.get_last_lr()[0]}

        # ---- held-out greedy accuracy, early stop -------------------------------------------
        if ev.every and step % ev.every == 0:
            result = evaluate(engine, encode, eval_problems, runner,
                              sampling=SamplingParams(max_new_tokens=ev.max_new_tokens, greedy=True))
            accuracy = result.accuracy
            metrics["eval/accuracy"] = accuracy
        tracker.log(step, metrics)
        if progress is not None:
            progress.update(1)
            progress.set_postfix(loss=f"{loss_value:.3f}", **({"acc": f"{accuracy:.3f}"} if accuracy is not None else {}))
        if ev.stop_at_accuracy is not None and accuracy is not None and accuracy >= ev.stop_at_accuracy:
            break
    if progress is not None:
        progress.close()
    runner.close()
    final = run_dir / "final"
    save_final_model(model, tokenizer, final)
    tracker.close()
    plot_metrics(tracker.path, run_dir / "metrics.png", title=f"SFT {run_dir}")
    summary = {"steps": step, "eval_accuracy": accuracy, "wall_s": time.perf_counter() - started, "model": str(final)}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _progress(config: SFTConfig):
    if not config.log.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=config.train.steps, desc="sft steps", dynamic_ncols=True)
