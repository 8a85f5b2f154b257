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

from pathlib import Path
from typing import Any

import torch

from rlvr.config import SFTConfig
from rlvr.engines import SamplingParams
from rlvr.engines.weight_sync import evaluation_engine, refresh_evaluation_engine
from rlvr.modeling.forward_choice import forward_note
from rlvr.modeling.loading import load_run_policy, load_tokenizer, save_final_model, stop_token_ids
from rlvr.modeling.logprobs import collate_completions, completion_logprobs
from rlvr.recipes.scaffold import Run
from rlvr.rollout.batch import trim_window
from rlvr.rollout.chat import Messages
from rlvr.rollout.env_tokens import message_encoder
from rlvr.rollout.episodes import build_environments, episode_runner, gold_episode_ids
from rlvr.rollout.evaluate import evaluate
from rlvr.rollout.sampler import ShuffledBatches
from rlvr.rollout.suites import PromptEncoder, load_suite
from rlvr.run.ranks import sharded_run
from rlvr.run.runtime import optimizer_from_config, optimizer_step
from rlvr.run.sharding import lockstep_passes
from rlvr.tasks.base import Problem
from rlvr.tasks.loading import check_text
from rlvr.verifiers.errors import InvalidValueError, MissingFileError
from rlvr.verifiers.files import jsonl_lines
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


def _tokenize(tokenizer, sources: list[tuple[list[tuple[Messages, Any]], str]], environment=None,
              stop_ids: list[int] | None = None) -> list[tuple[list[int], list[int], list[int] | None]]:
    """Prompt ids (each source's chat template, as the RL recipes encode prompts), completion ids + EOS,
    and the loss mask of a multi-turn solution (a list of messages after the prompt: its environment
    messages are encoded by ``environment.messages`` as episodes encode them, and carry no loss)."""
    out = []
    eos = tokenizer.eos_token_id
    for examples, chat_template in sources:
        encode = PromptEncoder(tokenizer, chat_template)
        texts = [c for _, c in examples if isinstance(c, str)]
        singles = iter(tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else [])
        messages = None
        for prompt, completion in examples:
            prompt_ids = encode(Problem("", list(prompt), {}, ""))
            if isinstance(completion, str):
                out.append((prompt_ids, next(singles) + [eos], None))
                continue
            messages = messages or message_encoder(tokenizer, environment.messages if environment else "auto",
                                                   chat_template, stop_ids or [eos])
            out.append((prompt_ids, *gold_episode_ids(completion, tokenizer, messages, eos)))
    return out


def train(config: SFTConfig, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Fine-tune on gold completions; stops early when held-out accuracy reaches ``eval.stop_at_accuracy``.
    ``resume`` continues the run in ``config.out`` from its latest checkpoint; ``overwrite`` replaces a
    previous run there (without either, a folder holding a run is refused)."""
    with Run.start(config, "sft", resume=resume, overwrite=overwrite) as run:
        config, dist, ev, training = run.config, run.dist, run.config.eval, run.config.train
        sources = _load_sources(config.data)  # bad data fails before any model is loaded
        first = config.data[0]
        eval_task = ev.task or first.task
        eval_problems = load_suite(eval_task, path=first.path if ev.task is None else None, split=ev.split,
                                   options=ev.options or first.options, limit=ev.limit) \
            if eval_task and (ev.every or ev.at_end) and dist.is_main else []
        tokenizer = load_tokenizer(config.model.path)
        shard = sharded_run(training, dist)
        model = load_run_policy(config.model, dist.device, run.checkpoint, shard=shard, offload=training.cpu_offload)
        if dist.is_main:
            print(f"forward: {forward_note(model)}", flush=True)
        data = _tokenize(tokenizer, sources, config.environment, stop_token_ids(config.model.path, tokenizer))
        optimizer, scheduler = optimizer_from_config(model.parameters(), config.optim, training.steps)
        engine = evaluation_engine(model, tokenizer, dtype=config.model.dtype, device=dist.device,
                                   needed=bool(eval_problems))  # rank 0 evaluates
        encode = PromptEncoder(tokenizer, first.chat_template)  # held-out prompts as the first source's
        environments = build_environments(config.environment, eval_problems)  # problems that play episodes
        episodes = episode_runner(config.environment, tokenizer, encode, stop_token_ids(config.model.path, tokenizer),
                                  environments, eval_problems)
        runner = VerifierRunner() if eval_problems else None
        if runner is not None:
            run.cleanup(runner.close)
        batches = ShuffledBatches(len(data), training.seed)
        run.restore({"optimizer": optimizer, "scheduler": scheduler, "batches": batches}, models={"policy": model},
                    tokenizer=tokenizer)

        def accuracy() -> float | None:
            """Greedy accuracy on the held-out problems (rank 0 measures; every rank gets it)."""
            refresh_evaluation_engine(engine, model)  # the engine's copy, if any (sharded: every rank gathers)
            result = evaluate(engine, encode, eval_problems, runner, episodes=episodes, sampling=SamplingParams(
                max_new_tokens=ev.max_new_tokens, greedy=True, stop=tuple(ev.stop),
                include_stop=ev.include_stop)).accuracy if eval_problems else None
            return dist.broadcast(result)

        step = run.done
        stop_rule = None if ev.stop_at_accuracy is None else f"eval accuracy {ev.stop_at_accuracy}"
        for step in run.steps(training.steps, until=stop_rule):
            # ---- one optimizer step over batch_size examples, in micro-batches -------------------
            picked = [data[i] for i in batches.next(training.batch_size)]
            ids, attention, mask = collate_completions([p for p, _, _ in picked], [c for _, c, _ in picked],
                                                       tokenizer.pad_token_id, [m for _, _, m in picked])
            total_tokens = float(mask.sum())  # the whole batch's, on every rank
            ids, attention, mask = (x[dist.rank :: dist.world_size].to(dist.device) for x in (ids, attention, mask))
            optimizer.zero_grad(set_to_none=True)
            loss_value, starts = 0.0, list(range(0, len(ids), training.micro_batch_size))
            for index in range(lockstep_passes(model, len(starts))):  # sharded: as many passes as any rank
                mine = index < len(starts)  # else a zero-weight pass on this rank's first micro-batch
                start = starts[index] if mine else 0
                part = torch.arange(start, min(start + training.micro_batch_size, len(ids)), device=ids.device)
                columns, length = trim_window(attention, mask.shape[1], part, mask)  # this micro-batch's own width
                logp, _ = completion_logprobs(model, ids[part, columns], attention[part, columns], length)
                loss = -(logp * mask[part, :length]).sum() / total_tokens * float(mine)
                loss.backward()
                loss_value += loss.item()
            if not shard:  # FSDP2 summed them in the backward
                dist.sum_gradients([p for p in model.parameters() if p.requires_grad])
            grad_norm = optimizer_step(model.parameters(), optimizer, scheduler, config.optim.grad_clip)
            metrics = {"train/loss": dist.sum(loss_value), "train/grad_norm": grad_norm,
                       "train/lr": scheduler.get_last_lr()[0]}

            # ---- held-out greedy accuracy, early stop -------------------------------------------
            if ev.every and step % ev.every == 0:
                run.evaluations[step] = {"eval/accuracy": accuracy()}
                metrics.update(run.evaluations[step])
                if ev.stop_at_accuracy is not None and metrics["eval/accuracy"] >= ev.stop_at_accuracy:
                    run.stop(f"eval.stop_at_accuracy {ev.stop_at_accuracy} reached")
            if step == training.steps and ev.at_end and step not in run.evaluations and eval_task:
                run.evaluations[step] = {"eval/accuracy": accuracy()}
                metrics.update(run.evaluations[step])
            run.end_step(step, metrics, postfix={"loss": f"{metrics['train/loss']:.3f}", **_accuracy_postfix(run)})

        final = run.evaluations.get(step, {}).get("eval/accuracy") if step in run.evaluations else None
        return run.finish({"steps": step, "eval_accuracy": final, "model": str(run.run_dir / "final")},
                          save_final=lambda out: save_final_model(model, tokenizer, out), models=(model,))


def _accuracy_postfix(run: Run) -> dict[str, str]:
    """The last measured held-out accuracy, for the progress bar."""
    last = run.evaluations[max(run.evaluations)]["eval/accuracy"] if run.evaluations else None
    return {"acc": f"{last:.3f}"} if last is not None else {}
