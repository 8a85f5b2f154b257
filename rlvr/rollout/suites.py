"""Task suites as the trainer uses them: loaded from config, prompts encoded once per problem, and
described in the run's first lines (verifier, instruction, chat template, eval overlap)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterable, Sequence

from rlvr.rollout.chat import AUTO, ChatTemplate, encode_prompts, resolve_chat_template
from rlvr.tasks import get_task
from rlvr.tasks.registry import held_out_split
from rlvr.tasks.base import Problem
from rlvr.verifiers.errors import InvalidValueError


class SuiteProblems(list):
    """The problems of one loaded suite (a list), with what the run reports about the suite: its
    ``task``, ``split`` and ``path``, the answer-format ``instruction`` the suite appends to each
    prompt (None when the suite has no such setting, "" when it appends none), its default
    ``verifier`` and the ``chat_template`` its prompts are rendered with."""

    def __init__(self, problems: Iterable[Problem] = (), *, task: str = "", split: str = "", path: str | None = None,
                 instruction: str | None = None, verifier: str | None = None, chat_template: ChatTemplate = AUTO):
        super().__init__(problems)
        self.task, self.split, self.path = task, split, path
        self.instruction, self.verifier, self.chat_template = instruction, verifier, chat_template

    def like(self, problems: Iterable[Problem]) -> "SuiteProblems":
        """Other problems with this suite's description (e.g. after overlong prompts were dropped)."""
        return SuiteProblems(problems, task=self.task, split=self.split, path=self.path, instruction=self.instruction,
                             verifier=self.verifier, chat_template=self.chat_template)


class PromptEncoder:
    """Problem -> prompt token ids, cached so each prompt is tokenised once.

    Prompts are rendered with ``chat_template`` (``auto``, ``none`` or a Jinja file: see
    :mod:`rlvr.rollout.chat`), or with the template of the suite a problem came from when the suite was
    registered with :meth:`assign` (each training or eval suite may set its own).

    What is kept per problem (its template, its tools) is keyed by :attr:`Problem.key` (suite and id), not
    by the object: a copied or unpickled problem renders as the one it was copied from.
    """

    def __init__(self, tokenizer, chat_template: str | ChatTemplate | None = "auto"):
        self.tokenizer = tokenizer
        self.chat_template = resolve_chat_template(chat_template)
        self._templates: dict[tuple[str, str], ChatTemplate] = {}  # problem.key -> its suite's template
        self._tools: dict[tuple[str, str], tuple[list[dict], str]] = {}  # problem.key -> (tools, their JSON)
        self._cache: dict[tuple, list[int]] = {}

    @classmethod
    def for_suites(cls, tokenizer, *suites: dict[str, Sequence[Problem]]) -> "PromptEncoder":
        """An encoder that renders each problem of ``suites`` (``{name: problems}`` dicts, as loaded
        by :func:`load_training_suites` / :func:`load_eval_suites`) with its suite's template."""
        encoder = cls(tokenizer)
        for named in suites:
            for problems in named.values():
                encoder.assign(problems, getattr(problems, "chat_template", AUTO))
        return encoder

    def assign(self, problems: Iterable[Problem], chat_template: str | ChatTemplate) -> None:
        """Render ``problems`` with ``chat_template`` from now on. Two problems of the same key (suite and
        id) with different templates are refused: one of them would silently render with the other's."""
        template = resolve_chat_template(chat_template)
        for problem in problems:
            earlier = self._templates.setdefault(problem.key, template)
            if earlier != template:
                raise InvalidValueError(
                    f"problem {problem.id!r} of suite {problem.suite or '(unnamed)'!r} is assigned two chat templates "
                    "(two suites with the same problem ids and no suite names); load each suite with its own "
                    "`suite` name (load_suite(..., suite=...))")

    def offer_tools(self, problems: Iterable[Problem], tools: Sequence[dict]) -> None:
        """Render ``problems`` with ``tools`` (JSON schemas) listed by the chat template from now on."""
        shared = (list(tools), json.dumps(list(tools), sort_keys=True))  # the JSON: part of the cache key
        for problem in problems:
            self._tools[problem.key] = shared

    def template_of(self, problem: Problem) -> ChatTemplate:
        return self._templates.get(problem.key, self.chat_template)

    def tools_of(self, problem: Problem) -> list[dict] | None:
        """The tools listed in ``problem``'s prompt (:meth:`offer_tools`), or None."""
        tools = self._tools.get(problem.key)
        return tools[0] if tools else None

    def templates(self) -> list[ChatTemplate]:
        """Every chat template this encoder renders prompts with (once each)."""
        return list(dict.fromkeys(self._templates.values())) or [self.chat_template]

    def __call__(self, problem: Problem) -> list[int]:
        template, tools = self.template_of(problem), self._tools.get(problem.key)
        key = (template, tools[1] if tools else None, tuple((m.get("role", ""), m["content"]) for m in problem.prompt))
        ids = self._cache.get(key)
        if ids is None:
            ids = self._cache[key] = encode_prompts(self.tokenizer, [problem.prompt], template,
                                                    tools[0] if tools else None)[0]
        return ids


def load_suite(task: str, *, path: str | None, split: str, options: dict[str, Any], limit: int | None,
               chat_template: str | ChatTemplate | None = "auto", suite: str = "") -> SuiteProblems:
    """The problems of one suite (at most ``limit``), described (:class:`SuiteProblems`); each problem's
    :attr:`Problem.suite` is ``suite`` (the run's unique name for it, e.g. ``train/gsm8k``), so that what is
    kept per problem (template, tools) is keyed by a name that survives copies (:attr:`Problem.key`)."""
    source = get_task(task, path=path, split=split, **options)
    problems = [dataclasses.replace(p, suite=suite) if suite else p for p in source]
    if limit is not None:
        problems = problems[:limit]
    if not problems:
        where = f" at {path}" if path else ""
        raise InvalidValueError(f"task {task!r} (split {split!r}{where}) holds no problems; check the data file or the suite's options")
    instruction = getattr(source, "instruction", None)
    return SuiteProblems(problems, task=task, split=split, path=path,
                         instruction=instruction if isinstance(instruction, str) else None,
                         verifier=getattr(source, "default_verifier", None) or None,
                         chat_template=resolve_chat_template(chat_template))


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
        suites[name] = load_suite(entry.task, path=entry.path, split=entry.split, options=entry.options, limit=entry.limit,
                                  chat_template=entry.chat_template, suite=f"train/{name}")
        weights[name] = entry.weight
    return suites, weights


def eval_entries(config) -> list:
    """The held-out suites of a run config, splits and limits resolved: ``eval.tasks``, or else the
    first training suite's held-out split; each holds at most ``eval.limit`` problems.

    An ``eval.tasks`` entry that names no ``split`` reads the suite's held-out split
    (:func:`held_out_split`, ``test``), not the ``train`` default of a training entry."""
    if config.eval.tasks:
        entries = list(config.eval.tasks)  # an entry without a split got its held-out one when the config was read
    else:
        first = config.data[0]
        entries = [first.model_copy(update={"split": held_out_split(first.task), "limit": None})]
    return [e.model_copy(update={"limit": min(e.limit or config.eval.limit, config.eval.limit)}) for e in entries]


def load_eval_suites(config) -> dict[str, list[Problem]]:
    """``{name: problems}`` of :func:`eval_entries`; empty when the run never evaluates."""
    if not (config.eval.at_start or config.eval.at_end or config.eval.every):
        return {}
    suites: dict[str, list[Problem]] = {}
    for entry in eval_entries(config):
        name = suite_name(entry.task, list(suites))
        suites[name] = load_suite(entry.task, path=entry.path, split=entry.split, options=entry.options,
                                  limit=entry.limit, chat_template=entry.chat_template, suite=f"eval/{name}")
    return suites


def drop_overlong_prompts(suites: dict[str, list[Problem]], encode: PromptEncoder, context: int | None,
                          max_new_tokens: int, on_overlong: str, *,
                          knob: str = "generation.max_new_tokens") -> dict[str, list[Problem]]:
    """The suites without the problems whose prompt leaves no room for ``max_new_tokens`` in the
    model's ``context`` (None: no limit known, nothing dropped). ``knob`` is the config key that set
    ``max_new_tokens`` (``environment.max_episode_tokens`` for episodes, ``eval.max_new_tokens``), named
    in the messages so that they point at the value to change.

    Every prompt is tokenised here, once (the encoder caches the ids for the run). A prompt that
    does not fit would otherwise be truncated by the position embeddings, or, at 200k characters,
    try to allocate tens of GB. ``on_overlong="skip"`` leaves such problems out and prints how many
    per suite; ``"error"`` refuses the run, naming one of them.
    """
    if context is None or not suites:
        return suites
    budget = context - max_new_tokens
    if budget < 1:
        raise InvalidValueError(f"{knob} ({max_new_tokens}) leaves no room for a prompt in the model's context of "
                                f"{context} tokens; set it below {context}")
    out: dict[str, list[Problem]] = {}
    for name, problems in suites.items():
        lengths = [len(encode(p)) for p in problems]
        kept = [p for p, n in zip(problems, lengths) if n <= budget]
        dropped = len(problems) - len(kept)
        if dropped:
            worst = max(range(len(problems)), key=lengths.__getitem__)
            detail = (f"{dropped} of {len(problems)} prompts of suite {name!r} are longer than {budget} tokens (the model's "
                      f"context of {context} minus {knob} {max_new_tokens}); the longest, {problems[worst].id}, has "
                      f"{lengths[worst]}")
            if on_overlong == "error":
                raise InvalidValueError(f"{detail}. Set generation.overlong_prompts=skip to leave them out.")
            print(f"{detail}: skipped (generation.overlong_prompts=skip)", flush=True)
        if not kept:
            raise InvalidValueError(f"suite {name!r}: no prompt fits the model's context ({budget} tokens for the prompt)")
        out[name] = problems.like(kept) if isinstance(problems, SuiteProblems) else kept
    return out


def check_verifiers(override: str | None, options: dict, problems) -> None:
    """Every verifier the run will call exists and accepts its options: each is built once here,
    before any model is loaded (an unknown name lists the registered ones, a bad option the valid ones),
    and asked for its ``preflight()`` where it has one (the judge: is its server there?)."""
    from rlvr.verifiers.audit import preflight
    from rlvr.verifiers.registry import get_verifier

    for name in {override} if override else {p.verifier for p in problems}:
        preflight(get_verifier(name, **(options if override else {})))


def describe_suites(config, suites: dict[str, Sequence[Problem]], eval_suites: dict[str, Sequence[Problem]]) -> list[str]:
    """The run's first lines about its data: for each training and eval suite, the verifier that
    scores it (and where that choice comes from), the instruction appended to its prompts, and its
    chat template; then a warning for each eval suite that shares prompts with the training data
    (e.g. the default eval of a one-file ``custom`` suite, which reads the same file for every split)."""
    lines = []
    train_keys = [f"data.{i}" for i in range(len(config.data))]
    eval_keys = [f"eval.tasks.{i}" for i in range(len(config.eval.tasks))] or ["data.0"]
    for kind, keys, named in (("train", train_keys, suites), ("eval", eval_keys, eval_suites)):
        for key, (name, problems) in zip(keys, named.items()):
            lines.append(f"{kind} suite {name} ({key}): {_describe(problems, config.verifier.name, key)}")
    lines += _overlap_warnings(config, suites, dict(zip(eval_keys, eval_suites.items())))
    return lines


def _describe(problems: Sequence[Problem], override: str | None, key: str) -> str:
    split = getattr(problems, "split", "")
    where = getattr(problems, "path", None)
    head = f"{len(problems)} problems" + (f", split {split}" if split else "") + (f", {where}" if where else "")
    if override:
        verifier = f"verifier {override} (verifier.name)"
    else:
        names = sorted({p.verifier for p in problems})
        how = f"{key}.options.verifier or verifier.name" if getattr(problems, "task", "") == "custom" else "verifier.name"
        verifier = f"verifier {', '.join(names)} (the suite's default; set {how} to change it)"
    instruction = getattr(problems, "instruction", None)
    if instruction is None:
        added = "prompts as the suite writes them"
    elif instruction:
        added = f"instruction added to each prompt: {instruction!r} ({key}.options.instruction: none drops it)"
    else:
        added = "no instruction added"
    template = getattr(problems, "chat_template", AUTO)
    rendered = f"chat_template {template.path if template.mode == 'file' else template.mode}"
    return f"{head}; {verifier}; {added}; {rendered}"


def _prompt_key(problem: Problem) -> tuple:
    return tuple((m.get("role", ""), m["content"]) for m in problem.prompt)


def _overlap_warnings(config, suites: dict[str, Sequence[Problem]],
                      eval_suites: dict[str, tuple[str, Sequence[Problem]]]) -> list[str]:
    """A warning for each eval suite (``{config key: (name, problems)}``) that shares prompts with the
    training data: its split, and the fix that fits where the suite came from."""
    trained = {_prompt_key(p) for problems in suites.values() for p in problems}
    trained_splits = {(getattr(p, "task", ""), getattr(p, "split", "")) for p in suites.values()}
    warnings = []
    for key, (name, problems) in eval_suites.items():
        shared = sum(_prompt_key(p) in trained for p in problems)
        if not shared:
            continue
        task, split, path = getattr(problems, "task", ""), getattr(problems, "split", ""), getattr(problems, "path", None)
        one_file = task == "custom" and path and not _is_folder(path)
        why = f" ({path} is one file: a custom suite reads it for every split)" if one_file else ""
        if not key.startswith("eval.tasks."):  # the default evaluation: the first training suite's held-out split
            fix = ("set eval.tasks to held-out data (e.g. {task: custom, path: test.jsonl, ...}), or point the suite at "
                   "a folder holding train.jsonl and test.jsonl")
        elif one_file:
            fix = f"point {key}.path at held-out data, or at a folder holding train.jsonl and test.jsonl"
        elif (task, split) in trained_splits:
            held_out = held_out_split(task)
            fix = (f"{key}.split is {split}, the split training reads: drop {key}.split to evaluate the held-out "
                   f"{held_out} split" if held_out != split else f"{key}.split is {split}, the split training reads: "
                   "set it to a split training does not read")
        else:
            fix = f"split {split} of {task} repeats training prompts: point {key} at other held-out data"
        where = f" (split {split})" if split else ""
        warnings.append(f"warning: eval suite {name!r}{where}: {shared} of its {len(problems)} prompts are also training "
                        f"prompts{why}, so its accuracy is not held-out accuracy; {fix}")
    return warnings


def _is_folder(path: str) -> bool:
    from pathlib import Path

    return Path(path).expanduser().is_dir()


def announce_suites(config, suites: dict[str, Sequence[Problem]], eval_suites: dict[str, Sequence[Problem]]) -> None:
    """Print :func:`describe_suites` (the run's first lines, before any model is loaded)."""
    for line in describe_suites(config, suites, eval_suites):
        print(line, flush=True)
