"""Step-labelled completions ``(prompt, steps, labels)``: reading them and tokenising them for a process
reward model (``rlvr train-prm``).

The file is JSONL in TRL's stepwise-supervision format, one example a line::

    {"prompt": "7+5*3-4:", "completions": ["7+5=12", "12*3=36", "36-4=30"], "labels": [true, true, false]}

The prompt is a string (one user message) or chat messages ``[{role, content}, ...]``; ``completions``
holds the steps, ``labels`` one boolean (or 0/1) per step. Every complaint names the file, the line
and the field.

Tokenising (:func:`tokenize_step_examples`) is the trainer's own: the prompt goes through the model's
chat template as :class:`rlvr.rollout.suites.PromptEncoder` renders a task prompt; the completion is the
steps joined by the separator, its ids followed by EOS (as a finished completion is generated); each
step's label sits at the step's last token, found by
:func:`rlvr.algorithms.process_rewards.step_end_indices` exactly as scoring finds it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from rlvr.tasks.base import Problem
from rlvr.tasks.loading import DataError, _read_jsonl, check_text
from rlvr.verifiers.errors import InvalidValueError, MissingFileError


@dataclass(frozen=True)
class StepExample:
    """One completion of ``prompt`` in steps, each labelled good (True) or bad."""

    prompt: list[dict[str, str]]  # chat messages
    steps: list[str]
    labels: list[bool]
    where: str = ""  # file:line, for messages


@dataclass(frozen=True)
class TokenizedSteps:
    prompt: list[int]  # chat-templated prompt ids
    completion: list[int]  # ids of the steps joined by the separator, + EOS
    ends: list[int]  # the last token of each step (indices into completion)
    labels: list[int]  # 1 good, 0 bad, one per step


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


def load_step_examples(path: str, *, separator: str = "\n", limit: int | None = None,
                       field: str = "data.path") -> list[StepExample]:
    """The examples of a JSONL file (module docstring). A step that is blank or holds ``separator``
    would not be one step of the joined completion: it is an error naming the line."""
    local = Path(path).expanduser()
    if not local.is_file():
        raise MissingFileError(f"{field}: step-labelled file {path} does not exist")
    examples = [_example(record, separator) for record in itertools.islice(_read_jsonl(str(local)), limit)]
    if not examples:
        raise InvalidValueError(f"{field}: {path} holds no examples")
    return examples


def _example(record, separator: str) -> StepExample:
    if record.error is not None:
        raise DataError(record.where, None, record.error)
    prompt = record.get("prompt", kind=(str, list))
    steps = record.get("completions", kind=list)
    labels = record.get("labels", kind=list)
    if len(labels) != len(steps):
        raise DataError(record.where, "labels", f"{len(labels)} labels for {len(steps)} steps in 'completions'; give "
                        "one label per step")
    for i, step in enumerate(steps):
        check_text(record.where, step, "completions")
        if not step.strip():
            raise DataError(record.where, "completions", f"step {i} is blank")
        if separator in step:
            raise DataError(record.where, "completions", f"step {i} contains the separator {separator!r} (data.separator), "
                            "so it would read as several steps; choose another separator")
    for i, label in enumerate(labels):
        if label not in (True, False, 0, 1) or isinstance(label, float):
            raise DataError(record.where, "labels", f"label {i} is {label!r}; use true/false (or 1/0)")
    return StepExample(_messages(record.where, prompt), list(steps), [bool(x) for x in labels], record.where)


def _messages(where: str, value: str | list) -> list[dict[str, str]]:
    if isinstance(value, str):
        return [{"role": "user", "content": check_text(where, value, "prompt")}]
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise DataError(where, "prompt", f"message {i} must be an object with a text 'content' (and a 'role')")
        out.append({"role": str(message.get("role", "user")), "content": check_text(where, message["content"], "prompt")})
    return out


def load_step_data(data, seed: int) -> tuple[list[StepExample], list[StepExample]]:
    """``(train, eval)`` examples of a ``PRMDataConfig``: eval from ``eval_path``, or held-out prompts
    (:func:`rlvr.rollout.preferences.split_by_prompt`)."""
    from rlvr.rollout.preferences import split_by_prompt

    examples = load_step_examples(data.path, separator=data.separator, limit=data.limit)
    if data.eval_path:
        return examples, load_step_examples(data.eval_path, separator=data.separator, field="data.eval_path")
    train, held = split_by_prompt(examples, data.eval_fraction, seed)
    if not train:
        raise InvalidValueError(f"data.eval_fraction={data.eval_fraction} holds out every prompt of {data.path}")
    return train, held


# ---------------------------------------------------------------------------------------------
# Tokenising: exactly as the trainer encodes prompts and completions
# ---------------------------------------------------------------------------------------------


def tokenize_step_examples(tokenizer, examples: Sequence[StepExample], separator: str = "\n",
                           max_length: int | None = None, label: str = "examples") -> list[TokenizedSteps]:
    """Prompt ids (chat template, as :class:`~rlvr.rollout.suites.PromptEncoder`), completion ids + EOS, and
    each step's last token; examples longer than ``max_length`` tokens are left out, and the count is
    printed. A tokenisation that does not find one end per step is an error naming the example."""
    from rlvr.modeling.prm import completion_step_ends
    from rlvr.rollout.suites import PromptEncoder

    encode = PromptEncoder(tokenizer)
    eos = tokenizer.eos_token_id
    texts = [separator.join(e.steps) for e in examples]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    out = []
    for example, completion in zip(examples, ids):
        prompt = encode(Problem("", example.prompt, {}, ""))
        completion = list(completion) + [eos]
        if max_length is not None and len(prompt) + len(completion) > max_length:
            continue
        ends = completion_step_ends(tokenizer, completion, separator)
        if len(ends) != len(example.steps):
            raise DataError(example.where, "completions", f"the tokenizer's text of the {len(example.steps)} steps "
                            f"splits into {len(ends)} at {separator!r}; check data.separator")
        out.append(TokenizedSteps(prompt, completion, ends, [int(x) for x in example.labels]))
    if len(out) < len(examples):
        print(f"{label}: {len(examples) - len(out)} of {len(examples)} examples are longer than {max_length} tokens: "
              "left out", flush=True)
    if examples and not out:
        raise InvalidValueError(f"{label}: every example is longer than {max_length} tokens (data.max_length)")
    return out
