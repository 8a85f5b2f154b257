"""Math word-problem and competition suites, all scored by the ``math`` verifier.

========================  =================  ==========================================  ===========================
suite                     splits (size)      gold answer                                 hub dataset for ``path=``
========================  =================  ==========================================  ===========================
``gsm8k``                 train 7,473        the number after ``####`` in the solution   ``openai/gsm8k`` (``main``)
                          test 1,319
``math``                  test 5,000         the last ``\\boxed{}`` of the solution       ``DigitalLearningGmbH/MATH-lighteval``
                          train 4,500        (see :func:`gold_from_boxes`), or an
                                             ``answer`` column where present
``math500``               test 500           the ``answer`` field (else the last box)    ``HuggingFaceH4/MATH-500``
``aime24``                test 30            the ``answer`` field                        ``HuggingFaceH4/aime_2024``
``amc23``                 test 40            the ``answer`` field (``27.0`` -> ``27``)   ``math-ai/amc23``
``minerva_math``          test 272           the ``answer`` field, else the last box     ``math-ai/minervamath``
========================  =================  ==========================================  ===========================

``math``'s ``train`` split is the MATH test set minus the 500 MATH-500 problems (the usual RL
training set once MATH-500 is the benchmark); the MATH-500 problems are recognised by a
whitespace-insensitive hash of their text (:mod:`tasks._math500`), so the split can be cut from
any copy of MATH test. The original 7,500-problem MATH training set is not in ``../shared/data``;
load it from the hub with ``hub_split="train"``.

Prompt: one user message, the problem followed by an answer-format instruction (default: reason
step by step and put the final answer in ``\\boxed{}``), optionally after a system message. The
``math`` verifier also reads ``#### N`` and "the answer is" forms, so a custom instruction may ask
for those. ``Problem.solution`` is the dataset's worked solution, for supervised warm-up: GSM8K's keeps its
``#### N`` line but loses the ``<<48/2=24>>`` calculator annotations (a model should not learn to
write them; ``keep_calculator=True`` keeps them).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace
from typing import Any

from rlvr.tasks._math500 import MATH500_KEYS
from rlvr.tasks.base import Problem
from rlvr.tasks.loading import DataError, LoadedSuite, Record, instruction_text, read_records, resolve_source
from rlvr.tasks.registry import register_task

BOXED_INSTRUCTION = "Think step by step, then write the final answer inside \\boxed{}."
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox|framebox)\s*\{")
# A solution boxing several different values: the problem asks for all of them, or accepts any.
_ASKS_FOR_ALL = re.compile(r"separated by comma", re.I)
_ACCEPTS_ANY = re.compile(r"also accepted|also an acceptable|either (?:point|one|answer) is|not both", re.I)
# Golds the box rule gets wrong, by problem_key(problem), with why.
GOLD_FIXES = {
    # MATH test 4060: the problem uses \boxed{N} as notation; its solution boxes 11, 20 and 12 and
    # states "6 is our answer" unboxed, on purpose
    "46fd1f6c5bd5e2b1": "6",
}
_GSM8K_NUMBER = re.compile(r"^-?[\d,]*\.?\d+$")
_CALCULATOR = re.compile(r"<<[^<>\n]*>>")


def boxed_answers(text: str) -> list[str]:
    """The contents of every ``\\boxed{...}`` (also ``\\fbox``/``\\framebox``) in ``text``, in order.

    Braces are matched by depth, so ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``; an unclosed
    box is ignored. Linear in ``len(text)``.
    """
    answers = []
    end = 0
    for match in _BOX_OPEN.finditer(text):
        if match.start() < end:  # a box inside the previous box's content
            continue
        depth, i = 1, match.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            answers.append(text[match.end(): i - 1].strip())
            end = i
    return answers


def _canonical(answer: str) -> str:
    """Light LaTeX normalisation to tell different boxed values from the same one written twice
    (``10\\sqrt{2}`` / ``10\\sqrt 2``, ``\\tfrac32`` / ``\\frac{3}{2}``)."""
    return re.sub(r"\\left|\\right|\\[,!;: ]|[\s{}]", "", answer.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac"))


def gold_from_boxes(question: str, solution: str) -> str | list[str] | None:
    """The gold answer of a worked solution: its last ``\\boxed{}``, unless it boxes several
    different values: then all of them joined by ", " when the question asks for every value
    ("separated by commas"), or the list of acceptable alternatives when it accepts any one
    ("not both", "also accepted"). None when the solution has no box."""
    boxes = [b for b in boxed_answers(solution) if b]
    distinct: list[str] = []
    for box in boxes:
        if _canonical(box) not in {_canonical(d) for d in distinct}:
            distinct.append(box)
    if len(distinct) > 1 and _ASKS_FOR_ALL.search(question):
        return ", ".join(distinct)
    if len(distinct) > 1 and _ACCEPTS_ANY.search(question + " " + solution):
        return distinct
    return boxes[-1] if boxes else None


def problem_key(problem: str) -> str:
    """Whitespace-insensitive hash of a problem's text (recognises MATH-500 problems in MATH)."""
    return hashlib.blake2b(" ".join(problem.split()).encode(), digest_size=8).hexdigest()


def math_prompt(question: str, instruction: str | None, system_prompt: str | None) -> list[dict[str, str]]:
    """The chat messages of a math problem (see the module docstring)."""
    user = f"{question.strip()}\n\n{instruction}" if instruction else question.strip()
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": user}]


class MathSuite(LoadedSuite):
    """Shared loading for the math suites: a subclass names its files, fields and gold rule.

    Args:
        path: a local file or folder, or a Hugging Face dataset name; None looks in
            ``$RLVR_DATA_DIR`` then ``../shared/data`` (see :func:`tasks.loading.resolve_source`).
        split: one of the suite's ``splits``.
        instruction: the answer-format instruction appended to each problem ("" for none).
        system_prompt: an optional system message.
        on_error: ``"raise"`` (default) or ``"skip"`` bad rows (counted in ``skipped``).
        hub_config, hub_split: override the configuration / split read from the hub.
    """

    default_verifier = "math"
    #: split -> relative file names searched in a data folder
    files: dict[str, tuple[str, ...]] = {}
    hub_name = ""
    hub_config: str | None = None
    hub_splits: dict[str, str] = {}  # our split -> the hub's split
    question_fields: tuple[str, ...] = ("problem", "question")
    answer_fields: tuple[str, ...] = ("answer",)
    solution_fields: tuple[str, ...] = ("solution",)
    id_fields: tuple[str, ...] = ()  # a column holding the dataset's own id, kept in meta

    def __init__(self, path: str | None = None, split: str = "test", *, instruction: str = BOXED_INSTRUCTION,
                 system_prompt: str | None = None, on_error: str = "raise", hub_config: str | None = None,
                 hub_split: str | None = None):
        self._check_split(split)
        self.split, self.instruction, self.system_prompt = split, instruction_text(instruction), system_prompt
        self.source = resolve_source(self.name, path, self.files[split], self.hub_name)
        records = read_records(self.source, hub_split=hub_split or self.hub_splits.get(split, split),
                               hub_config=hub_config if hub_config is not None else self.hub_config)
        self._load(records, self._build, on_error)

    # --- per-suite rules (overridden) ---------------------------------------------------------
    def gold(self, record: Record) -> str | list[str]:
        """The gold answer as written (a list: acceptable alternatives); raises :class:`DataError`
        when there is none."""
        answer = record.get(self.answer_fields, required=False)
        if answer is not None:
            return answer.strip()
        question = record.get(self.question_fields)
        fixed = GOLD_FIXES.get(problem_key(question))
        if fixed is not None:
            return fixed
        solution = record.get(self.solution_fields, required=False)
        if solution is None:
            raise DataError(record.where, self.answer_fields[0], f"missing (and no {self.solution_fields[0]!r} to read a \\boxed{{}} answer from)")
        gold = gold_from_boxes(question, solution)
        if gold is None:
            raise DataError(record.where, self.solution_fields[0], "no \\boxed{} final answer to use as the gold")
        return gold

    def keep(self, record: Record, question: str) -> bool:
        """Whether the row belongs to this split (all rows, unless a split is cut from a file)."""
        return True

    # --- shared ------------------------------------------------------------------------------
    def _build(self, record: Record) -> Problem | None:
        question = record.get(self.question_fields)
        if not self.keep(record, question):
            return None
        answer = self.gold(record)
        solution = record.get(self.solution_fields, required=False, allow_empty=True) or None
        meta: dict[str, Any] = {"source": record.where}
        for key in self.id_fields + ("level", "type", "subject", "url"):
            if record.data.get(key) not in (None, ""):
                meta[key] = record.data[key]
        if solution and len(boxes := boxed_answers(solution)) > 1 and len(set(boxes)) > 1:
            meta["boxed_answers"] = boxes  # several different boxes: the gold is the last (see docs/tasks.md)
        return Problem(
            id=f"{self.name}/{self.split}/{record.index}",
            prompt=math_prompt(question, self.instruction, self.system_prompt),
            reference={"answer": answer},
            verifier=self.default_verifier,
            solution=solution,
            meta=meta,
        )


@register_task("gsm8k")
class GSM8K(MathSuite):
    """Grade-school math word problems; gold = the number after ``####`` in the solution.

    Takes the :class:`MathSuite` arguments plus ``keep_calculator`` (keep the ``<<a*b=c>>``
    annotations in ``Problem.solution``; default False).
    """

    name = "gsm8k"
    splits = ("train", "test")
    files = {s: (f"gsm8k/{s}.jsonl", f"{s}.jsonl") for s in splits}
    hub_name, hub_config = "openai/gsm8k", "main"
    question_fields = ("question",)
    solution_fields = ("answer",)
    answer_fields = ()

    def __init__(self, path: str | None = None, split: str = "test", *, keep_calculator: bool = False,
                 instruction: str = BOXED_INSTRUCTION, system_prompt: str | None = None, on_error: str = "raise",
                 hub_config: str | None = None, hub_split: str | None = None):
        self.keep_calculator = keep_calculator
        super().__init__(path, split, instruction=instruction, system_prompt=system_prompt, on_error=on_error,
                         hub_config=hub_config, hub_split=hub_split)

    def _build(self, record: Record) -> Problem | None:
        problem = super()._build(record)
        if problem is None or self.keep_calculator:
            return problem
        return replace(problem, solution=_CALCULATOR.sub("", problem.solution))

    def gold(self, record: Record) -> str:
        solution = record.get("answer")
        if "####" not in solution:
            raise DataError(record.where, "answer", "no '#### N' final answer line")
        gold = solution.rsplit("####", 1)[1].strip()
        if not _GSM8K_NUMBER.match(gold):
            raise DataError(record.where, "answer", f"the '####' gold {gold[:40]!r} is not a number")
        return gold


@register_task("math")
class MATH(MathSuite):
    """Hendrycks MATH (competition problems, 7 subjects, levels 1-5)."""

    name = "math"
    splits = ("test", "train")
    files = {s: ("math/test.jsonl", "test.jsonl") for s in splits}  # train is cut from test
    hub_name = "DigitalLearningGmbH/MATH-lighteval"
    hub_splits = {"test": "test", "train": "test"}
    id_fields = ("idx",)

    def keep(self, record: Record, question: str) -> bool:
        if self.split == "train":
            return problem_key(question) not in MATH500_KEYS
        return True


@register_task("math500")
class MATH500(MathSuite):
    """MATH-500: the 500-problem MATH test subset of PRM800K (Lightman et al. 2023)."""

    name = "math500"
    splits = ("test",)
    files = {"test": ("math500/test.jsonl", "test.jsonl")}
    hub_name = "HuggingFaceH4/MATH-500"
    id_fields = ("unique_id",)


@register_task("aime24")
class AIME24(MathSuite):
    """AIME 2024 (I and II), 30 problems with integer answers 0-999."""

    name = "aime24"
    splits = ("test",)
    files = {"test": ("extra_math/qwen25math_aime24_test.jsonl", "aime24/test.jsonl", "test.jsonl")}
    hub_name = "HuggingFaceH4/aime_2024"
    hub_splits = {"test": "train"}
    id_fields = ("id",)

    def gold(self, record: Record) -> str:
        return record.get("answer").strip()


@register_task("amc23")
class AMC23(MathSuite):
    """AMC 2023 (the 40-problem set used by Qwen2.5-Math's evaluation)."""

    name = "amc23"
    splits = ("test",)
    files = {"test": ("extra_math/qwen25math_amc23_test.jsonl", "amc23/test.jsonl", "test.jsonl")}
    hub_name = "math-ai/amc23"
    id_fields = ("id",)

    def gold(self, record: Record) -> str:
        return record.get("answer").strip()  # numbers are written as floats (27.0): get() gives "27"


@register_task("minerva_math")
class MinervaMath(MathSuite):
    """Minerva's OCW undergraduate STEM problems (272), gold from the answer field or the last box."""

    name = "minerva_math"
    splits = ("test",)
    files = {"test": ("extra_math/qwen25math_minerva_math_test.jsonl", "minerva_math/test.jsonl", "test.jsonl")}
    hub_name = "math-ai/minervamath"
    id_fields = ("idx",)
