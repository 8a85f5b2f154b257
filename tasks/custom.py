"""``custom``: a user's own data as a suite, by column mapping, with no code.

    get_task("custom", path="my_problems.jsonl", prompt_field="question", answer_field="answer")
    get_task("custom", path="my_code.parquet", prompt_field="text", tests_field="tests", verifier="code")
    get_task("custom", path="owner/dataset", split="test", prompt_field="problem", answer_field="answer")

``path`` is a local ``.jsonl`` / ``.jsonl.gz`` / ``.json`` / ``.csv`` / ``.parquet`` file, a folder
holding one such file per split (``train.jsonl``, ``test.parquet``, ...), or a Hugging Face dataset
name (read with ``datasets.load_dataset(path, hub_config, split=split)``). A single file is the
data of whatever split is asked for (the split name only appears in problem ids).

Columns:

* ``prompt_field`` (default ``prompt``): the question as a string, or a ready list of chat
  messages (``[{"role": ..., "content": ...}]``), used as is.
* one of ``answer_field`` (reference ``{"answer": ...}``; a list means several acceptable
  answers), ``tests_field`` (reference ``{"tests": [...]}``; a list of Python snippets, a single
  snippet, or a JSON-encoded list as CSV cells hold it; with ``entry_point_field`` and
  ``setup_field`` for the code verifier), and/or ``reference_fields`` (``{reference key: column}``,
  for any verifier, e.g. ``{"numbers": "nums", "target": "target"}`` for ``countdown``).
* optional ``id_field`` (default: the row number), ``solution_field`` (a gold completion for SFT).
* optional ``environment_field``: a column naming the registered environment each problem is played
  in as a multi-turn episode (``python``, ``tools``, a plugin's; an empty cell: single-turn), or
  ``environment``: one environment for every problem of the data. Their options are the run's
  ``environment.options`` (one set per environment name: a run builds each environment once).

``verifier`` defaults to ``math`` with an answer column and ``code`` with a tests column; it may be
any registered name or an import path (``"my_pkg.rewards:Exact"``). The answer-format
``instruction`` appended to a string prompt defaults to what that verifier reads (``\\boxed{}`` for
``math``, a fenced block for ``code``, nothing for others); ``instruction="none"`` (or ``""``) adds
none. ``rlvr train`` prints both choices in its first lines.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlvr.tasks.base import Problem
from rlvr.tasks.loading import DataError, LoadedSuite, Record, format_number, instruction_text, looks_like_hub_name, read_records
from rlvr.tasks.registry import register_task
from rlvr.verifiers.errors import InvalidValueError, MissingFileError

DEFAULT_INSTRUCTIONS = {
    "math": "Think step by step, then write the final answer inside \\boxed{}.",
    "code": "Write the Python code in a single ```python code block.",
}
_DATA_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".csv", ".parquet")


def _split_file(folder: Path, split: str) -> str:
    for suffix in _DATA_SUFFIXES:
        if (folder / f"{split}{suffix}").is_file():
            return str(folder / f"{split}{suffix}")
    present = sorted({p.name.split(".")[0] for p in folder.iterdir() if p.name.endswith(_DATA_SUFFIXES)})
    raise InvalidValueError(f"custom: no {split}.jsonl/.json/.csv/.parquet in {folder}; splits there: {', '.join(present) or 'none'}")


@register_task("custom")
class Custom(LoadedSuite):
    """A local file, folder or hub dataset mapped onto problems by column names (module docstring).

    Args:
        path: the data (required).
        split: the split to read (a folder's ``{split}.*`` file, a hub split; free for one file).
        prompt_field, answer_field, tests_field, reference_fields, entry_point_field, setup_field,
            id_field, solution_field: the column mapping.
        verifier: the registered verifier that scores the problems.
        instruction: appended to string prompts (None: the verifier's default, "none" or "": none).
        system_prompt: an optional system message.
        on_error: ``raise`` or ``skip`` bad rows (counted in ``skipped``).
        hub_config: the hub dataset's configuration.
        environment: the environment every problem is played in (None: each row's
            ``environment_field``, else none).
        environment_field: the column naming each row's environment (empty: none).
    """

    name = "custom"
    default_verifier = "math"
    splits: tuple[str, ...] = ()  # whatever the data holds

    def __init__(self, path: str | None = None, split: str = "train", *, prompt_field: str = "prompt",
                 answer_field: str | None = None, tests_field: str | None = None,
                 reference_fields: dict[str, str] | None = None, entry_point_field: str | None = None,
                 setup_field: str | None = None, id_field: str | None = None, solution_field: str | None = None,
                 verifier: str | None = None, instruction: str | None = None, system_prompt: str | None = None,
                 on_error: str = "raise", hub_config: str | None = None, environment: str | None = None,
                 environment_field: str | None = None):
        if path is None:
            raise InvalidValueError("custom: pass path= a local .jsonl/.csv/.parquet file or folder, or a Hugging Face dataset name")
        if not (answer_field or tests_field or reference_fields):
            raise InvalidValueError("custom: name the gold column: answer_field=, tests_field= or reference_fields={key: column}")
        if answer_field and tests_field:
            raise InvalidValueError("custom: give answer_field or tests_field, not both")
        verifier = verifier or ("code" if tests_field else "math")
        from rlvr.verifiers import VERIFIERS  # names only: the verifier itself runs in the trainer

        if verifier not in VERIFIERS:  # a registered name, or an import path ("my_pkg.rewards:Exact")
            raise InvalidValueError(f"custom: {VERIFIERS.unknown(verifier)}")
        self.default_verifier = verifier
        from rlvr.tasks.environments import ENVIRONMENTS  # names only: environments are built by the run

        self._environments = set(ENVIRONMENTS.names())
        if environment is not None and environment not in self._environments:
            raise InvalidValueError(f"custom: environment: {ENVIRONMENTS.unknown(environment)}")
        if environment is not None and environment_field is not None:
            raise InvalidValueError("custom: give environment= (one for all problems) or environment_field= "
                                    "(a column), not both")
        self.environment, self.environment_field = environment, environment_field
        self.split, self.prompt_field, self.answer_field, self.tests_field = split, prompt_field, answer_field, tests_field
        self.reference_fields = dict(reference_fields or {})
        self.entry_point_field, self.setup_field = entry_point_field, setup_field
        self.id_field, self.solution_field, self.system_prompt = id_field, solution_field, system_prompt
        self.instruction = instruction_text(instruction, DEFAULT_INSTRUCTIONS.get(verifier, ""))

        local = Path(str(path)).expanduser()
        if local.is_dir():
            self.source = _split_file(local, split)
        elif local.is_file():
            self.source = str(local)
        elif looks_like_hub_name(str(path)):
            self.source = str(path)
        else:
            raise MissingFileError(f"custom: {path} is neither a file, a folder nor a Hugging Face dataset name")
        self._load(read_records(self.source, hub_split=split, hub_config=hub_config), self._build, on_error)

    def _prompt(self, record: Record) -> list[dict[str, str]]:
        value = record.get(self.prompt_field, kind=(str, list))
        if isinstance(value, list):  # ready chat messages
            if not all(isinstance(m, dict) and isinstance(m.get("content"), str) and "role" in m for m in value):
                raise DataError(record.where, self.prompt_field, "a list prompt must hold {'role', 'content'} messages")
            messages = [{"role": str(m["role"]), "content": m["content"]} for m in value]
            if self.system_prompt and messages[0]["role"] != "system":
                messages.insert(0, {"role": "system", "content": self.system_prompt})
            return messages
        user = f"{value.strip()}\n\n{self.instruction}" if self.instruction else value.strip()
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + [{"role": "user", "content": user}]

    def _tests(self, record: Record) -> list[str]:
        value = record.get(self.tests_field, kind=(str, list))
        if isinstance(value, str) and value.lstrip().startswith("["):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise DataError(record.where, self.tests_field, "looks like a JSON list but does not parse") from None
        tests = [value] if isinstance(value, str) else value
        if not tests or not all(isinstance(t, str) and t.strip() for t in tests):
            raise DataError(record.where, self.tests_field, "must be a non-empty list of non-empty strings")
        return tests

    def _build(self, record: Record) -> Problem:
        reference: dict[str, Any] = {}
        if self.answer_field:
            answer = record.get(self.answer_field, kind=(str, int, float, list))
            if isinstance(answer, (int, float)):
                answer = format_number(answer)  # the contract: golds are text as written
            elif isinstance(answer, list):
                answer = [format_number(a) if isinstance(a, (int, float)) else str(a) for a in answer]
                if not answer:
                    raise DataError(record.where, self.answer_field, "is empty")
            reference["answer"] = answer
        if self.tests_field:
            reference["tests"] = self._tests(record)
            for key, column in (("entry_point", self.entry_point_field), ("setup", self.setup_field)):
                if column and (value := record.get(column, required=False, allow_empty=True)):
                    reference[key] = value
        for key, column in self.reference_fields.items():
            reference[key] = record.get(column, kind=object, allow_empty=True)
        ident = record.get(self.id_field) if self.id_field else str(record.index)
        solution = record.get(self.solution_field, required=False, allow_empty=True) if self.solution_field else None
        return Problem(
            id=f"custom/{self.split}/{ident}",
            prompt=self._prompt(record),
            reference=reference,
            verifier=self.default_verifier,
            solution=solution or None,
            meta={"source": record.where},
            environment=self._environment(record),
        )

    def _environment(self, record: Record) -> str | None:
        """The row's environment: ``environment``, or its ``environment_field`` cell (empty: none)."""
        if self.environment_field is None:
            return self.environment
        name = record.get(self.environment_field, required=False, allow_empty=True)
        if not name or not name.strip():
            return None
        if name.strip() not in self._environments:
            raise DataError(record.where, self.environment_field, f"unknown environment {name!r}; valid environments: "
                                                                  f"{', '.join(sorted(self._environments))}")
        return name.strip()
