"""Self-check of the math suites on the real benchmark data in ../shared/data.

For every problem of every split: the gold answer, written as a model would (``\\boxed{gold}``),
scores 1.0 with the suite's verifier; a corrupted answer scores 0.0; and the dataset's worked
solution (``Problem.solution``, the SFT target) scores 1.0 except for the few listed below, each
with its reason.
"""

from __future__ import annotations

import re

import pytest

from rlvr.tasks import get_task
from rlvr.tasks.math_suites import boxed_answers, gold_from_boxes, problem_key
from rlvr.verifiers import get_verifier, list_verifiers

pytestmark = pytest.mark.skipif("math" not in list_verifiers(), reason="the math verifier is not registered")

# math/train (4,500) is a subset of math/test: checked through test_math_train_is_math_test_without_math500
SIZES = {
    ("gsm8k", "train"): 7473, ("gsm8k", "test"): 1319,
    ("math", "test"): 5000,
    ("math500", "test"): 500,
    ("aime24", "test"): 30, ("amc23", "test"): 40, ("minerva_math", "test"): 272,
}

# Worked solutions that do not read as one final answer (their golds are fine):
SOLUTION_EXCEPTIONS = {
    # "the final answer is 15 gallons * 8 pints / gallon = 120 pints": the statement holds an
    # expression and a number, which the verifier reads as two different answers (hedging)
    "gsm8k/train/7157",
    # boxes an intermediate result, then the final one (the gold is the last box)
    "math/test/91",
    # box two values that are both accepted (the gold is the list of alternatives): as a
    # completion that is two different answers
    "math/test/333", "math/test/2716", "math/test/2912", "math/test/2936",
    # the problem uses \boxed{N} as notation; the solution boxes 11, 20, 12 and states 6 unboxed
    "math/test/4060",
}


def first(gold):
    return gold[0] if isinstance(gold, list) else gold


def _letter(gold: str) -> str | None:
    core = re.sub(r"\\text\{|[(){}\s]", "", gold)
    return core if len(core) == 1 and core.isalpha() else None


def corrupted(gold: str) -> str:
    """A wrong final answer: another letter for a choice, a clearly different number for a
    number (relative change >= 50%, beyond any tolerance), else the gold plus one."""
    letter = _letter(gold)
    if letter:
        return f"The answer is \\boxed{{{'B' if letter.upper() == 'A' else 'A'}}}."
    try:
        x = float(gold.replace(",", ""))
    except ValueError:
        return f"The answer is $\\boxed{{{gold} + 1}}$."
    return f"The answer is $\\boxed{{{x + max(1.0, abs(x)):g}}}$."


@pytest.fixture(scope="module")
def verifier():
    return get_verifier("math")


@pytest.mark.parametrize("name,split", list(SIZES))
def test_gold_scores_one_and_corrupted_zero_on_every_problem(data_dir, verifier, name, split):
    suite = get_task(name, split=split)
    assert len(suite) == SIZES[(name, split)]
    assert suite.skipped == 0
    gold_fail = [p.id for p in suite if verifier.score(f"So the final answer is $\\boxed{{{first(p.reference['answer'])}}}$.",
                                                      p.reference).score != 1.0]
    assert gold_fail == []
    corrupt_pass = [p.id for p in suite if verifier.score(corrupted(first(p.reference["answer"])), p.reference).score != 0.0]
    assert corrupt_pass == []


@pytest.mark.parametrize("name,split", list(SIZES))
def test_worked_solutions_score_one(data_dir, verifier, name, split):
    suite = get_task(name, split=split)
    with_solution = [p for p in suite if p.solution]
    if name == "amc23":
        assert with_solution == []  # the set has answers only
        return
    assert len(with_solution) == len(suite)
    failures = {p.id for p in with_solution if verifier.score(p.solution, p.reference).score != 1.0}
    assert failures <= SOLUTION_EXCEPTIONS


def test_prompt_and_reference_shapes(data_dir):
    p = get_task("gsm8k", split="test")[0]
    assert p.id == "gsm8k/test/0" and p.verifier == "math"
    assert p.reference == {"answer": "18"}
    assert [m["role"] for m in p.prompt] == ["user"]
    assert p.prompt[0]["content"].startswith("Janet") and "\\boxed{}" in p.prompt[0]["content"]
    assert p.solution.endswith("#### 18") and "<<" not in p.solution
    assert "<<16-3-4=9>>" in get_task("gsm8k", split="test", keep_calculator=True)[0].solution
    custom = get_task("math500", split="test", instruction="", system_prompt="You are a careful mathematician.")[0]
    assert [m["role"] for m in custom.prompt] == ["system", "user"]
    assert custom.prompt[1]["content"] == get_task("math500", split="test")[0].prompt[0]["content"].rsplit("\n\n", 1)[0]
    assert get_task("amc23", split="test")[0].reference == {"answer": "27"}  # 27.0 in the file


def _question(problem) -> str:
    return problem.prompt[-1]["content"].rsplit("\n\n", 1)[0]  # the text before the instruction


def test_math_train_is_math_test_without_math500(data_dir, verifier):
    test, train, m500 = (list(get_task(n, split=s)) for n, s in [("math", "test"), ("math", "train"), ("math500", "test")])
    m500_keys = {problem_key(_question(p)) for p in m500}
    test_by_key = {problem_key(_question(p)): p for p in test}
    assert (len(test), len(train), len(m500)) == (5000, 4500, 500)
    assert len(m500_keys) == 500 and m500_keys <= set(test_by_key)
    assert {problem_key(_question(p)) for p in train} == set(test_by_key) - m500_keys
    # MATH-500's answer field agrees with the last box of MATH's solution for the same problem
    disagree = [p.id for p in m500
                if verifier.score(f"\\boxed{{{test_by_key[problem_key(_question(p))].reference['answer']}}}", p.reference).score != 1.0]
    assert disagree == []


def test_boxed_answers():
    assert boxed_answers("so $\\boxed{\\frac{1}{2}}$ and \\fbox{3}") == ["\\frac{1}{2}", "3"]
    assert boxed_answers("\\boxed{\\{1,2\\}}") == ["\\{1,2\\}"]
    assert boxed_answers("\\boxed{unclosed") == []
    assert boxed_answers("\\framebox{204} minutes") == ["204"]
    assert boxed_answers("\\boxed{a \\boxed{b}}") == ["a \\boxed{b}"]


def test_golds_of_solutions_that_box_several_values(data_dir, verifier):
    assert gold_from_boxes("What is x?", "First $\\boxed{5}$, so the total is $\\boxed{161}$.") == "161"
    assert gold_from_boxes("Enter all solutions, separated by commas.", "$\\boxed{-2}$ and $\\boxed{1}$") == "-2, 1"
    assert gold_from_boxes("Enter one of the foci, not both.", "\\boxed{(10, 0)} or \\boxed{(0,0)}") == ["(10, 0)", "(0,0)"]
    assert gold_from_boxes("Enter all, separated by commas.", "$\\boxed{10\\sqrt{2}}$ ... $\\boxed{10\\sqrt 2}$") == "10\\sqrt 2"
    assert gold_from_boxes("q", "no box") is None
    by_id = {p.id: p for p in get_task("math", split="test")}
    both_roots = by_id["math/test/414"]  # sqrt(3x+6) = x+2: x = -2 and x = 1
    assert both_roots.reference == {"answer": "-2, 1"}
    assert verifier.score("\\boxed{-2, 1}", both_roots.reference).score == 1.0
    assert verifier.score("\\boxed{1}", both_roots.reference).score == 0.0
    either = by_id["math/test/333"]  # "-3 ... Note: 3 is also accepted"
    assert [verifier.score(f"\\boxed{{{x}}}", either.reference).score for x in ("-3", "3", "5")] == [1.0, 1.0, 0.0]
    assert by_id["math/test/4060"].reference == {"answer": "6"}  # tasks.math_suites.GOLD_FIXES


def test_unknown_split_lists_the_valid_ones(data_dir):
    with pytest.raises(ValueError, match="valid splits: train, test"):
        get_task("gsm8k", split="validation")
    with pytest.raises(ValueError, match="valid splits: test$"):
        get_task("math500", split="train")
