"""Supervised fine-tuning on gold completions (stage 1 of the classic pipeline).

The loss is the mean negative log-likelihood of completion tokens only (prompt tokens are context,
never targets), with the end-of-sequence token appended so the model learns to stop. Data comes
from a task suite whose problems carry a ``solution``, or from a JSONL file of
``{"prompt": str | messages, "completion": str}`` or ``{"messages": [..., {"role": "assistant", ...}]}``.

Under ``torchrun`` every rank draws the same batch and trains on every world-size-th example of it,
the loss normalised by the whole batch's completion tokens; gradients are summed across ranks before
the step, and rank 0 alone evaluates (its early-stop decision is broadcast) and writes the run folder.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from rlvr.chat import Messages
from rlvr.config import save_config
from rlvr.offline_configs import SFTConfig
from rlvr.engines import HFEngine, SamplingParams
from rlvr.evaluate import evaluate
from rlvr.logprobs import completion_logprobs
from rlvr.models import load_policy, load_tokenizer, save_final_model
from rlvr.progress import make_progress
from rlvr.ranks import join_run, open_tracker, replica_check
from rlvr.runtime import optimizer_from_config
from rlvr.suites import PromptEncoder, load_suite
from rlvr.tracking import plot_metrics
from rlvr.tasks.base import Problem
from rlvr.tasks.loading import check_text
from rlvr.verifiers.files import jsonl_lines
from rlvr.verifiers.errors import InvalidValueError, MissingFileError
from rlvr.verifiers.runner import VerifierRunner


def load_sft_examples(data) -> list[tuple[Messages, str]]:
    """``(prompt messages, completion text)`` pairs from every source in ``data`` (a list of
    ``SFTDataConfig``, or one): a suite's gold solutions, or a JSONL file."""
    return [example for examples, _ in _load_sources(data) for example in examples]


def _load_sources(data) -> list[tuple[list[tuple[Messages, str]], str]]:
    """``(examples, chat_template)`` of each source in ``data``."""
    sources = []
    for source in data if isinstance(data, (list, tuple)) else [data]:
        examples: list[tuple[Messages, str]] = []
        if source.task is not None:
            problems = load_suite(source.task, path=source.path, split=source.split, options=source.options,
                                  limit=source.limit)
            missing = [p.id for p in problems if p.solution is None]
            if missing:
                raise InvalidValueError(
                    f"data: task {source.task!r} has no gold solution for {len(missing)} of {len(problems)} problems "
                    f"(e.g. {missing[0]}), so there is nothing to imitate; use a suite with solutions, or a JSONL file "
                    "of {prompt, completion} lines (task: null, path: FILE)")
            examples += [(p.prompt, p.solution) for p in problems]
        else:
            examples += _read_jsonl_examples(Path(source.path), source.limit)
        sources.append((examples, source.chat_template))
    return sources


def _read_jsonl_examples(path: Path, limit: int | None) -> list[tuple[Messages, str]]:
    if not path.is_file():
        raise MissingFileError(f"data.path: SFT data file {path} does not exist")
    examples = []
    for where, row, problem in jsonl_lines(path):
        if problem:
            raise InvalidValueError(f"{where}: {problem}")
        if "messages" in row:
            messages = row["messages"]
            if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict) \
                    or messages[-1].get("role") != "assistant":
                raise InvalidValueError(f"{where}: field 'messages' must be a list ending with an assistant message")
            prompt, completion = messages[:-1], messages[-1].get("content")
        elif "prompt" in row and "completion" in row:
            prompt, completion = row["prompt"], row["completion"]
            prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        else:
            raise InvalidValueError(f"{where}: needs fields 'prompt' and 'completion', or 'messages'")
        check_text(where, completion, "completion")
        for message in prompt if isinstance(prompt, list) else [None]:
            if not isinstance(message, dict):
                raise InvalidValueError(f"{where}: the prompt must be a string or a list of {{role, content}} messages")
            check_text(where, message.get("content"), "prompt")
        examples.append((prompt, completion))
        if limit is not None and len(examples) >= limit:
            break
    if not examples:
        raise InvalidValueError(f"{path}: no examples (the file is empty)")
    return examples


def _tokenize(tokenizer, sources: list[tuple[list[tuple[Messages, str]], str]]) -> list[tuple[list[int], list[int]]]:
    """Prompt ids (each source's chat template, as the RL recipes encode prompts) and completion ids + EOS."""
    pairs = []
    eos = tokenizer.eos_token_id
    for examples, chat_template in sources:
        encode = PromptEncoder(tokenizer, chat_template)
        completions = tokenizer([c for _, c in examples], add_special_tokens=False)["input_ids"]
        pairs += [(encode(Problem("", list(m), {}, "")), ids + [eos]) for (m, _), ids in zip(examples, completions)]
    return pairs


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


def train(config: SFTConfig, *, overwrite: bool = False) -> dict[str, Any]:
    """Fine-tune on gold completions; stops early when held-out accuracy reaches ``eval.stop_at_accuracy``.
    ``overwrite`` replaces a previous run in ``config.out`` (else a folder holding a run is refused)."""
    config, run_dir, dist = join_run(config, "sft", overwrite=overwrite)
    device, main = dist.device, dist.is_main
    sources = _load_sources(config.data)  # bad data fails before any model is loaded
    ev, first = config.eval, config.data[0]
    eval_problems = []
    if ev.every and main:
        eval_problems = load_suite(ev.task or first.task, path=first.path if ev.task is None else None,
                                   split=ev.split, options=ev.options or first.options, limit=ev.limit)
    if main:
        save_config(config, run_dir / "config.yaml")
    tokenizer = load_tokenizer(config.model.path)
    lora = config.model.lora.model_dump() if config.model.lora is not None else None
    model = load_policy(config.model.path, dtype=config.model.dtype, device=str(device), lora=lora,
                        gradient_checkpointing=config.model.gradient_checkpointing, forward=config.model.forward)
    data = _tokenize(tokenizer, sources)
    optimizer, scheduler = optimizer_from_config(model.parameters(), config.optim, config.train.steps)
    tracker = open_tracker(config, run_dir, dist)
    engine = HFEngine(model, tokenizer)
    encode = PromptEncoder(tokenizer, first.chat_template)  # held-out prompts as the first source's
    runner = VerifierRunner() if main else None
    rng = random.Random(config.train.seed)
    order: list[int] = []
    started = time.perf_counter()
    accuracy, step = None, 0
    progress = _progress(config) if main else None
    for step in range(1, config.train.steps + 1):
        # ---- one optimizer step over batch_size examples, in micro-batches -------------------
        picked = []
        while len(picked) < config.train.batch_size:
            if not order:
                order = list(range(len(data)))
                rng.shuffle(order)
            picked.append(data[order.pop()])
        ids, attention, mask = _collate(picked, tokenizer.pad_token_id)
        total_tokens = float(mask.sum())  # the whole batch's, on every rank
        ids, attention, mask = (t[dist.rank :: dist.world_size].to(device) for t in (ids, attention, mask))
        optimizer.zero_grad(set_to_none=True)
        loss_value = 0.0
        for start in range(0, len(ids), config.train.micro_batch_size):
            sl = slice(start, start + config.train.micro_batch_size)
            logp, _ = completion_logprobs(model, ids[sl], attention[sl], mask.shape[1])
            loss = -(logp * mask[sl]).sum() / total_tokens
            loss.backward()
            loss_value += loss.item()
        dist.sum_gradients([p for p in model.parameters() if p.requires_grad])
        loss_value = dist.sum(loss_value)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.grad_clip))
        optimizer.step()
        scheduler.step()
        metrics = {"train/loss": loss_value, "train/grad_norm": grad_norm, "train/lr": scheduler.get_last_lr()[0]}

        # ---- held-out greedy accuracy, early stop -------------------------------------------
        if ev.every and step % ev.every == 0:
            if main:
                result = evaluate(engine, encode, eval_problems, runner,
                                  sampling=SamplingParams(max_new_tokens=ev.max_new_tokens, greedy=True))
                accuracy = result.accuracy
                metrics["eval/accuracy"] = accuracy
            accuracy = dist.broadcast(accuracy)  # every rank stops at the same step
        tracker.log(step, metrics)
        if progress is not None:
            progress.set_postfix(loss=f"{loss_value:.3f}", **({"acc": f"{accuracy:.3f}"} if accuracy is not None else {}))
            progress.update(1)
        if ev.stop_at_accuracy is not None and accuracy is not None and accuracy >= ev.stop_at_accuracy:
            break
    if progress is not None:
        progress.close()
    replicas = replica_check(dist, model)
    tracker.close()
    if not main:
        return {"steps": step, "rank": dist.rank}
    runner.close()
    final = run_dir / "final"
    save_final_model(model, tokenizer, final)
    if config.log.plot:
        plot_metrics(tracker.path, run_dir / "metrics.png", title=f"SFT {run_dir}")
    summary = {"steps": step, "eval_accuracy": accuracy, "wall_s": time.perf_counter() - started, "model": str(final),
               **({"replicas": replicas} if replicas else {})}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _progress(config: SFTConfig):
    return make_progress(config.train.steps, "sft", enabled=config.log.progress)
