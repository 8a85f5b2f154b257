"""Task suites as the trainer uses them: loaded from config, prompts encoded once per problem."""

from __future__ import annotations

from typing import Any, Sequence

from rlvr.chat import encode_prompts
from rlvr.tasks import get_task
from rlvr.tasks.base import Problem
from rlvr.verifiers.errors import InvalidValueError


class PromptEncoder:
    """Problem -> prompt token ids (chat template applied), cached so each prompt is tokenised once."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[tuple, list[int]] = {}

    def __call__(self, problem: Problem) -> list[int]:
        key = tuple((m.get("role", ""), m["content"]) for m in problem.prompt)
        ids = self._cache.get(key)
        if ids is None:
            ids = self._cache[key] = encode_prompts(self.tokenizer, [problem.prompt])[0]
        return ids


def load_suite(task: str, *, path: str | None, split: str, options: dict[str, Any], limit: int | None) -> list[Problem]:
    problems = list(get_task(task, path=path, split=split, **options))
    if limit is not None:
        problems = problems[:limit]
    if not problems:
        where = f" at {path}" if path else ""
        raise InvalidValueError(f"task {task!r} (split {split!r}{where}) holds no problems; check the data file or the suite's options")
    return problems


def suite_name(task: str, names: Sequence[str]) -> str:
    """A unique name for metrics: the task name, suffixed when a task appears twice."""
    name, k = task, 2
    while name in names:
        name, k = f"{task}_{k}", k + 1
    return name


def load_training_suites(data) -> tuple[dict[str, list[Problem]], dict[str, float]]:
    """``({name: problems}, {name: sampling weight})`` for the ``data`` list of a run config."""
    suites: dict[str, list[Problem]] = {}
    weights: dict[str, float] = {}
    for entry in data:
        name = suite_name(entry.task, list(suites))
        suites[name] = load_suite(entry.task, path=entry.path, split=entry.split, options=entry.options, limit=entry.limit)
        weights[name] = entry.weight
    return suites, weights


def eval_entries(config) -> list:
    """The held-out suites of a run config, limits resolved: ``eval.tasks``, or else the first
    training suite's ``test`` split; each holds at most ``eval.limit`` problems."""
    entries = config.eval.tasks or [config.data[0].model_copy(update={"split": "test", "limit": None})]
    return [e.model_copy(update={"limit": min(e.limit or config.eval.limit, config.eval.limit)}) for e in entries]


def load_eval_suites(config) -> dict[str, list[Problem]]:
    """``{name: problems}`` of :func:`eval_entries`; empty when the run never evaluates."""
    if not (config.eval.at_start or config.eval.at_end or config.eval.every):
        return {}
    suites: dict[str, list[Problem]] = {}
    for entry in eval_entries(config):
        suites[suite_name(entry.task, list(suites))] = load_suite(
            entry.task, path=entry.path, split=entry.split, options=entry.options, limit=entry.limit
        )
    return suites


def drop_overlong_prompts(suites: dict[str, list[Problem]], encode: PromptEncoder, context: int | None,
                          max_new_tokens: int, on_overlong: str) -> dict[str, list[Problem]]:
    """The suites without the problems whose prompt leaves no room for ``max_new_tokens`` in the
    model's ``context`` (None: no limit known, nothing dropped).

    Every prompt is tokenised here, once (the encoder caches the ids for the run). A prompt that
    does not fit would otherwise be truncated by the position embeddings, or, at 200k characters,
    try to allocate tens of GB. ``on_overlong="skip"`` leaves such problems out and prints how many
    per suite; ``"error"`` refuses the run, naming one of them.
    """
    if context is None or not suites:
        return suites
    budget = context - max_new_tokens
    if budget < 1:
        raise InvalidValueError(f"generation.max_new_tokens ({max_new_tokens}) leaves no room for a prompt in the "
                                f"model's context of {context} tokens")
    out: dict[str, list[Problem]] = {}
    for name, problems in suites.items():
        lengths = [len(encode(p)) for p in problems]
        kept = [p for p, n in zip(problems, lengths) if n <= budget]
        dropped = len(problems) - len(kept)
        if dropped:
            worst = max(range(len(problems)), key=lengths.__getitem__)
            detail = (f"{dropped} of {len(problems)} prompts of suite {name!r} are longer than {budget} tokens (the model's "
                      f"context of {context} minus {max_new_tokens} new tokens); the longest, {problems[worst].id}, has "
                      f"{lengths[worst]}")
            if on_overlong == "error":
                raise InvalidValueError(f"{detail}. Set generation.overlong_prompts=skip to leave them out.")
            print(f"{detail}: skipped (generation.overlong_prompts=skip)", flush=True)
        if not kept:
            raise InvalidValueError(f"suite {name!r}: no prompt fits the model's context ({budget} tokens for the prompt)")
        out[name] = kept
    return out


def check_verifiers(override: str | None, options: dict, problems) -> None:
    """Every verifier the run will call exists and accepts its options: each is built once here,
    before any model is loaded (an unknown name lists the registered ones, a bad option the valid ones)."""
    from rlvr.verifiers.registry import get_verifier

    for name in {override} if override else {p.verifier for p in problems}:
        get_verifier(name, **(options if override else {}))
