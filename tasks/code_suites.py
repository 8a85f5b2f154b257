"""Python code-generation suites, scored by the ``code`` verifier (unit tests in the sandbox).

=============  ==========================================  =========================================
suite          splits (size)                               hub dataset for ``path=``
=============  ==========================================  =========================================
``humaneval``  test 164                                    ``openai/openai_humaneval``
``mbpp``       test 500 (task ids 11-510), train 374       ``google-research-datasets/mbpp`` (``full``)
               (601-974), validation 90 (511-600),
               prompt 10 (1-10)
=============  ==========================================  =========================================

References follow the ``code`` verifier's format (``verifiers/code.py``):

* **HumanEval**: one test = the dataset's ``test`` source (which defines ``check(candidate)``)
  run against the entry point, in the hardened form of :func:`verifiers.code.humaneval_test`:
  the prompt is re-run inside the test, so a completion cannot fake the helpers some tests call
  from the prompt (``encode_cyclic`` in HumanEval/38, ``poly`` in /32). ``entry_point`` is set;
  ``setup`` holds the prompt's import lines (``from typing import List``), so a reply that
  restates only the function still runs the way prompt + completion would.
* **MBPP**: one test per ``assert`` of ``test_list`` (``challenge_test_list`` too with
  ``challenge_tests=True``). MBPP's ``test_setup_code`` (two tasks, 367 and 927, build trees of
  the solution's own ``Node`` class) can only run *after* the solution, so it is prepended to each
  test rather than passed as the verifier's ``setup`` (which runs before the solution).

Prompts ask for the program in one fenced ```` ```python ```` block (what the verifier extracts).
``Problem.solution`` is the dataset's reference program in such a block: HumanEval's prompt plus
canonical solution, MBPP's ``code``.
"""

from __future__ import annotations

import ast

from rlvr.tasks.base import Problem
from rlvr.tasks.loading import DataError, LoadedSuite, Record, fenced, instruction_text, read_records, resolve_source
from rlvr.tasks.registry import register_task
from rlvr.verifiers.code import humaneval_test, parse_python
from rlvr.verifiers.errors import InvalidValueError

HUMANEVAL_INSTRUCTION = ("Complete the following Python function. Reply with the whole function, including the "
                         "imports it needs, in a single ```python code block.")
MBPP_INSTRUCTION = "Write the Python code in a single ```python code block."

#: MBPP's standard splits, by task id (Austin et al. 2021, section 2.1)
MBPP_SPLITS = {"test": (11, 510), "train": (601, 974), "validation": (511, 600), "prompt": (1, 10)}


def import_lines(source: str) -> str:
    """The top-level ``import`` / ``from ... import`` statements of ``source``, one per line.

    ``source`` may be a function header without a body (a HumanEval prompt), so it is cut before
    its first ``def``/``class`` line if it does not parse whole."""
    tree = parse_python(source)
    if tree is None:
        lines = source.splitlines()
        head = next((i for i, line in enumerate(lines) if line.startswith(("def ", "class ", "async def "))), len(lines))
        tree = parse_python("\n".join(lines[:head])) or ast.Module(body=[], type_ignores=[])
    return "\n".join(ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)))


def code_prompt(body: str, instruction: str | None, system_prompt: str | None, *,
                instruction_first: bool) -> list[dict[str, str]]:
    """One user message: the task with the instruction before it (HumanEval: "complete this
    function") or after it (MBPP: the task text reads first), after an optional system message."""
    user = body if not instruction else (f"{instruction}\n\n{body}" if instruction_first else f"{body}\n\n{instruction}")
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": user}]


class _CodeSuite(LoadedSuite):
    default_verifier = "code"

    def _init(self, path, split, files, hub_name, hub_config, hub_split, on_error):
        self._check_split(split)
        self.split = split
        self.source = resolve_source(self.name, path, files, hub_name)
        self._load(read_records(self.source, hub_split=hub_split, hub_config=hub_config), self._build, on_error)

    def _build(self, record: Record) -> Problem | None:  # pragma: no cover - overridden
        raise NotImplementedError


@register_task("humaneval")
class HumanEval(_CodeSuite):
    """HumanEval (Chen et al. 2021): 164 functions from signature + docstring.

    Args:
        path: a local ``HumanEval.jsonl(.gz)`` or folder, or a hub name; None: the project data.
        split: ``test``.
        instruction: text before the function header ("" for the bare header, for base models).
        system_prompt: an optional system message.
        on_error: ``"raise"`` or ``"skip"`` bad rows.
    """

    name = "humaneval"
    splits = ("test",)

    def __init__(self, path: str | None = None, split: str = "test", *, instruction: str = HUMANEVAL_INSTRUCTION,
                 system_prompt: str | None = None, on_error: str = "raise", hub_split: str = "test"):
        self.instruction, self.system_prompt = instruction_text(instruction), system_prompt
        files = ("humaneval/HumanEval.jsonl.gz", "humaneval/HumanEval.jsonl", "HumanEval.jsonl.gz", "HumanEval.jsonl")
        self._init(path, split, files, "openai/openai_humaneval", None, hub_split, on_error)

    def _build(self, record: Record) -> Problem:
        task_id = record.get("task_id")
        header = record.get("prompt")
        entry = record.get("entry_point").strip()
        test = record.get("test")
        canonical = record.get("canonical_solution", required=False, allow_empty=True)
        if not entry.isidentifier() or f"def {entry}(" not in header:
            raise DataError(record.where, "entry_point", f"{entry!r} is not a function defined in the prompt")
        if "def check(" not in test:
            raise DataError(record.where, "test", "does not define check(candidate)")
        if parse_python(test) is None:
            raise DataError(record.where, "test", "is not valid Python")
        reference = {"tests": [humaneval_test(header, test.strip(), entry)], "entry_point": entry}
        setup = import_lines(header)
        if setup:
            reference["setup"] = setup
        return Problem(
            id=f"humaneval/{self.split}/{task_id.rsplit('/', 1)[-1]}",
            prompt=code_prompt(fenced(header), self.instruction, self.system_prompt, instruction_first=True),
            reference=reference,
            verifier=self.default_verifier,
            solution=fenced(header + canonical) if canonical else None,
            meta={"task_id": task_id, "source": record.where},
        )


@register_task("mbpp")
class MBPP(_CodeSuite):
    """MBPP (Austin et al. 2021): 974 crowd-sourced Python tasks, each with three ``assert`` tests.

    Args:
        path: a local ``mbpp.jsonl`` (all tasks; the split is cut by task id) or folder, or a hub
            name (``google-research-datasets/mbpp``, configuration ``full``); None: the project data.
        split: ``test`` (ids 11-510), ``train`` (601-974), ``validation`` (511-600), ``prompt`` (1-10).
        prompt_tests: how many of the task's tests to show in the prompt (the function name and
            call signature come from them; 1 by default).
        challenge_tests: also run ``challenge_test_list`` (harder extra tests, 11 tasks have them).
        instruction, system_prompt, on_error: as for the other suites.
    """

    name = "mbpp"
    splits = tuple(MBPP_SPLITS)

    def __init__(self, path: str | None = None, split: str = "test", *, prompt_tests: int = 1,
                 challenge_tests: bool = False, instruction: str = MBPP_INSTRUCTION, system_prompt: str | None = None,
                 on_error: str = "raise", hub_config: str = "full", hub_split: str | None = None):
        if prompt_tests < 0:
            raise InvalidValueError("mbpp: prompt_tests must be >= 0")
        self.prompt_tests, self.challenge_tests = prompt_tests, challenge_tests
        self.instruction, self.system_prompt = instruction_text(instruction), system_prompt
        self.ids = MBPP_SPLITS.get(split)
        self._init(path, split, ("mbpp/mbpp.jsonl", "mbpp.jsonl"), "google-research-datasets/mbpp", hub_config,
                   hub_split or split, on_error)

    def _build(self, record: Record) -> Problem | None:
        task_id = record.get("task_id", kind=int)
        lo, hi = self.ids
        if not lo <= task_id <= hi:
            return None
        text = record.get(("text", "prompt"))
        tests = record.get(("test_list", "test"), kind=list)
        for i, test in enumerate(tests):
            if not isinstance(test, str) or parse_python(test) is None:
                raise DataError(record.where, "test_list", f"test {i} is not a Python statement: {str(test)[:60]!r}")
        shown = tests[: self.prompt_tests]
        if self.challenge_tests:
            tests = tests + list(record.get("challenge_test_list", kind=list, required=False, allow_empty=True) or [])
        setup = (record.get("test_setup_code", required=False, allow_empty=True) or "").replace("\r\n", "\n").strip()
        run = [f"{setup}\n{t}" if setup else t for t in tests]  # setup needs the solution: see module docstring
        code = record.get("code", required=False, allow_empty=True)
        body = text.strip()
        if shown:
            noun = "this test" if len(shown) == 1 else "these tests"
            body += f"\nYour code should pass {noun}:\n\n" + "\n".join(shown)
        return Problem(
            id=f"mbpp/{self.split}/{task_id}",
            prompt=code_prompt(body, self.instruction, self.system_prompt, instruction_first=False),
            reference={"tests": run},
            verifier=self.default_verifier,
            solution=fenced(code.replace("\r\n", "\n")) if code else None,
            meta={"task_id": task_id, "source": record.where},
        )
