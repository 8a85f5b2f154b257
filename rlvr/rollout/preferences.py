"""Preference pairs ``(prompt, chosen, rejected)``: reading them, tokenising them, and making them from
a task suite with an exact verifier.

Reading (:func:`load_preferences`): a JSONL or Parquet file, or a hub dataset through ``datasets``,
with a column mapping when the fields have other names. The prompt is a string (one user message)
or chat messages ``[{role, content}, ...]``; chosen and rejected are strings, or assistant messages
whose contents are joined. Without a prompt field, chosen and rejected may be whole conversations
that share every message but the last (the prompt is that shared part). Every complaint names the
file, the line (or row) and the field.

Tokenising (:func:`tokenize_pairs`) is the trainer's own: the prompt goes through the model's chat
template exactly as :class:`rlvr.rollout.suites.PromptEncoder` renders a task prompt, and a completion is
its ids followed by EOS. A reward model trained on these ids therefore scores what the policy
generates during RL the same way.

Making pairs (:func:`build_preferences`, ``rlvr preferences``): sample G completions per prompt,
verify them, and pair a passing completion with a failing one of the same prompt.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from rlvr.tasks.base import Problem
from rlvr.tasks.loading import (
    DataError,
    Record,
    _parquet_rows,
    _read_jsonl,
    _read_rows,
    check_text,
    looks_like_hub_name,
    read_records,
)
from rlvr.verifiers.errors import InvalidValueError, MissingFileError

FIELDS = ("prompt", "chosen", "rejected")


@dataclass(frozen=True)
class PreferencePair:
    """One preference: ``chosen`` is the better reply to ``prompt`` than ``rejected``."""

    prompt: list[dict[str, str]]  # chat messages
    chosen: str
    rejected: str
    where: str = ""  # file:line of the pair, for messages


@dataclass(frozen=True)
class TokenizedPair:
    prompt: list[int]  # chat-templated prompt ids
    chosen: list[int]  # completion ids + EOS
    rejected: list[int]


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


def load_preferences(path: str, *, format: str = "auto", columns: dict[str, str] | None = None, split: str = "train",
                     limit: int | None = None, field: str = "data.path") -> list[PreferencePair]:
    """The pairs of a JSONL / Parquet file or a hub dataset (``format`` ``auto`` goes by the suffix).
    ``columns`` maps ``prompt``/``chosen``/``rejected`` to the data's field names."""
    names = {key: (columns or {}).get(key, key) for key in FIELDS}
    pairs = [_pair(record, names) for record in _records(path, format, split, field, limit)]
    if not pairs:
        raise InvalidValueError(f"{field}: {path} holds no preference pairs")
    return pairs


def _records(path: str, format: str, split: str, field: str, limit: int | None):
    local = Path(path).expanduser()
    if format != "hub" and not local.is_file():
        if format != "auto" or not looks_like_hub_name(path):
            raise MissingFileError(f"{field}: preference file {path} does not exist")
    if format == "jsonl":
        records = _read_jsonl(str(local))
    elif format == "parquet":
        records = _read_rows(str(local), _parquet_rows(str(local)), "row")
    else:  # auto: by suffix, else a hub dataset; hub: always a hub dataset
        records = read_records(str(local) if format == "auto" and local.is_file() else path, hub_split=split) \
            if format == "auto" else _read_rows(f"{path}[{split}]", _hub_rows(path, split), "row")
    return itertools.islice(records, limit)


def _hub_rows(name: str, split: str):
    from rlvr.tasks.loading import _hub_rows as rows

    return rows(name, split, None)


def _pair(record: Record, names: dict[str, str]) -> PreferencePair:
    if record.error is not None:
        raise DataError(record.where, None, record.error)
    # an empty reply is a reply (a model that stops at once): allowed, unlike a missing one
    chosen = record.get(names["chosen"], kind=(str, list), allow_empty=True)
    rejected = record.get(names["rejected"], kind=(str, list), allow_empty=True)
    prompt = record.get(names["prompt"], kind=(str, list), required=False)
    if prompt is None:  # whole conversations: the prompt is what chosen and rejected share
        if not (isinstance(chosen, list) and isinstance(rejected, list) and len(chosen) > 1
                and chosen[:-1] == rejected[:-1]):
            raise DataError(record.where, names["prompt"], "missing (without it, chosen and rejected must be "
                            "conversations that share every message but the last)")
        prompt, chosen, rejected = chosen[:-1], chosen[-1:], rejected[-1:]
    return PreferencePair(_messages(record.where, names["prompt"], prompt),
                          _reply(record.where, names["chosen"], chosen),
                          _reply(record.where, names["rejected"], rejected), record.where)


def _messages(where: str, field: str, value: str | list) -> list[dict[str, str]]:
    if isinstance(value, str):
        return [{"role": "user", "content": check_text(where, value, field)}]
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise DataError(where, field, f"message {i} must be an object with a text 'content' (and a 'role')")
        out.append({"role": str(message.get("role", "user")), "content": check_text(where, message["content"], field)})
    return out


def _reply(where: str, field: str, value: str | list) -> str:
    """A completion: the string, or the joined contents of assistant messages."""
    if isinstance(value, str):
        return check_text(where, value, field)
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise DataError(where, field, f"message {i} must be an object with a text 'content'")
        if message.get("role", "assistant") != "assistant":
            raise DataError(where, field, f"message {i} has role {message.get('role')!r}; a reply holds only assistant "
                            "messages (put the conversation before it in the prompt)")
    return "".join(check_text(where, m["content"], field) for m in value)


def split_by_prompt(pairs: Sequence[PreferencePair], fraction: float, seed: int) -> tuple[list, list]:
    """``(train, held out)``: about ``fraction`` of the distinct prompts, with all their pairs, held out,
    so that held-out accuracy is measured on prompts the model never trained on."""
    prompts = sorted({json.dumps(p.prompt) for p in pairs})
    random.Random(seed).shuffle(prompts)
    held = set(prompts[: round(fraction * len(prompts))])
    return [p for p in pairs if json.dumps(p.prompt) not in held], [p for p in pairs if json.dumps(p.prompt) in held]


def load_preference_data(data, seed: int) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """``(train, eval)`` pairs of a ``PreferenceDataConfig``: eval from ``eval_path``, or held-out prompts."""
    pairs = load_preferences(data.path, format=data.format, columns=data.columns, split=data.split, limit=data.limit)
    if data.eval_path:
        return pairs, load_preferences(data.eval_path, format=data.format, columns=data.columns, split=data.eval_split,
                                       field="data.eval_path")
    train, held = split_by_prompt(pairs, data.eval_fraction, seed)
    if not train:
        raise InvalidValueError(f"data.eval_fraction={data.eval_fraction} holds out every prompt of {data.path}")
    return train, held


# ---------------------------------------------------------------------------------------------
# Tokenising: exactly as the trainer encodes prompts and completions
# ---------------------------------------------------------------------------------------------


def tokenize_pairs(tokenizer, pairs: Sequence[PreferencePair], max_length: int | None = None,
                   label: str = "pairs") -> list[TokenizedPair]:
    """Prompt ids (chat template, as :class:`~rlvr.rollout.suites.PromptEncoder`) and completion ids + EOS;
    pairs longer than ``max_length`` tokens are left out, and the count is printed."""
    from rlvr.rollout.suites import PromptEncoder

    encode = PromptEncoder(tokenizer)
    eos = tokenizer.eos_token_id
    texts = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    out = []
    for i, pair in enumerate(pairs):
        prompt = encode(Problem("", pair.prompt, {}, ""))
        chosen, rejected = ids[i] + [eos], ids[len(pairs) + i] + [eos]
        if max_length is None or len(prompt) + max(len(chosen), len(rejected)) <= max_length:
            out.append(TokenizedPair(prompt, chosen, rejected))
    if len(out) < len(pairs):
        print(f"{label}: {len(pairs) - len(out)} of {len(pairs)} pairs are longer than {max_length} tokens: left out",
              flush=True)
    if pairs and not out:
        raise InvalidValueError(f"{label}: every pair is longer than {max_length} tokens (data.max_length)")
    return out


# ---------------------------------------------------------------------------------------------
# Making pairs from a task suite with an exact verifier
# ---------------------------------------------------------------------------------------------


def build_preferences(
    model: str,
    task: str,
    out: str | Path,
    *,
    samples: int = 8,
    limit: int | None = None,
    seed: int = 0,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    split: str = "train",
    path: str | None = None,
    options: dict[str, Any] | None = None,
    pairs_per_prompt: int = 1,
    success_threshold: float = 1.0,
    device: str = "auto",
    workers: int | None = None,
    batch_prompts: int = 64,
    progress: bool = True,
) -> dict[str, Any]:
    """Sample ``samples`` completions per problem from ``model``, verify them with each problem's
    verifier, and write up to ``pairs_per_prompt`` pairs (a passing completion chosen, a failing one
    rejected, distinct texts) per problem to the JSONL file ``out``. Completions whose verification
    timed out or errored, and completions cut off at ``max_new_tokens`` (a pair's texts are trained
    with EOS appended, which would make a cut-off answer look finished), are in neither pool.
    Returns counts (also printed by the command)."""
    from rlvr.engines import SamplingParams, build_engine
    from rlvr.rollout.evaluate import evaluate
    from rlvr.modeling.loading import check_model_folder, load_policy, load_tokenizer
    from rlvr.run.progress import make_progress
    from rlvr.run.runtime import quiet_transformers, resolve_device, seed_everything
    from rlvr.rollout.suites import PromptEncoder, load_suite
    from rlvr.verifiers.files import atomic_write_text
    from rlvr.verifiers.runner import VerifierRunner

    if samples < 2:
        raise InvalidValueError("--samples: a pair needs a passing and a failing completion: use at least 2")
    quiet_transformers()
    seed_everything(seed)
    check_model_folder(model, "--model")
    problems = load_suite(task, path=path, split=split, options=options or {}, limit=limit)
    tokenizer = load_tokenizer(model)
    policy = load_policy(model, device=str(resolve_device(device, "--device"))).eval()
    engine = build_engine("hf", policy, tokenizer)
    bar = make_progress(len(problems), f"sample {task}", unit="problem", enabled=progress)
    with VerifierRunner(workers=workers) as runner:
        result = evaluate(engine, PromptEncoder(tokenizer), problems, runner, samples=samples, keep_records=True,
                          sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature),
                          success_threshold=success_threshold, batch_prompts=batch_prompts,
                          progress=bar.update if bar is not None else None)
    if bar is not None:
        bar.close()
    rng = random.Random(seed)
    rows, truncated = [], 0
    for problem, record in zip(problems, result.records):
        good, bad = [], []
        for text, score, status, finish in zip(record["completions"], record["scores"], record["status"],
                                               record["finish_reason"]):
            if finish == "length":  # cut off: its text + EOS (how pairs are trained) is not what was judged
                truncated += 1
            elif status == "ok":
                (good if score >= success_threshold else bad).append(text)
        good, bad = sorted(set(good)), sorted(set(bad))
        combos = list(itertools.product(good, bad))
        for chosen, rejected in rng.sample(combos, min(pairs_per_prompt, len(combos))):
            rows.append({"id": problem.id, "prompt": list(problem.prompt), "chosen": chosen, "rejected": rejected})
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    with_pair = len({r["id"] for r in rows})
    return {"problems": len(problems), "samples": samples, "sample_accuracy": result.accuracy,
            "prompts_with_pair": with_pair, "pairs": len(rows), "truncated": truncated, "out": str(out)}
