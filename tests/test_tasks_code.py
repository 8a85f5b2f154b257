"""Self-check of the code suites on the real benchmark data, through the sandboxed ``code`` verifier.

HumanEval: all 164 canonical solutions pass, the bare prompt (a function returning None) fails.
MBPP: every reference program of all four standard splits passes its tests (974 tasks), with one
exception at the verifier's default time budget (see MBPP_SLOW); the same program with the
function under test redefined to raise fails every task.
"""

from __future__ import annotations

import ast
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlvr.tasks import get_task
from rlvr.tasks.code_suites import MBPP_SPLITS, import_lines
from rlvr.verifiers import list_verifiers
from rlvr.verifiers.code import parse_python

MBPP_SIZES = {"test": 500, "train": 374, "validation": 90, "prompt": 10}
# Reference programs too slow for the code verifier's default budget (8 s per item, shared by the
# solution's top level and each test: 2 s per test for 3 tests). They pass with a longer budget.
MBPP_SLOW = {
    # sum of amicable numbers below 10,000 by trial division over every divisor: O(n^2) steps,
    # 3-7 s for amicable_numbers_sum(9999) on a loaded 2-core machine
    "mbpp/test/123",
}


def _strong() -> bool:
    try:
        from rlvr.sandbox import capabilities
    except ImportError:
        return False
    return capabilities()["isolation"] == "strong"


def sandboxed(test):
    """Marks for a test that runs programs: the code verifier and the strong sandbox must exist."""
    test = pytest.mark.bwrap(test)
    test = pytest.mark.skipif(not _strong(), reason="needs the strong sandbox: bubblewrap (apt-get install "
                              "bubblewrap), root and a memory cgroup")(test)
    return pytest.mark.skipif("code" not in list_verifiers(), reason="the code verifier is not registered")(test)


@pytest.fixture(scope="module")
def verifier():
    from rlvr.verifiers import get_verifier

    v = get_verifier("code", sandbox_slots=2)
    yield v
    if v._pool is not None:
        v._pool.close()


def _score_all(verifier, pairs):
    """Scores of all pairs, two at a time from a short-lived thread pool. No item is re-scored: a
    sandbox failure (status error/timeout) is a bug here, and shows up as a failed gold."""
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda pair: verifier.score(*pair), pairs))


# --- loading (no sandbox) -------------------------------------------------------------------------

def test_humaneval_problems(data_dir):
    suite = get_task("humaneval", split="test")
    assert len(suite) == 164 and suite.skipped == 0
    p = suite[0]
    assert p.id == "humaneval/test/0" and p.verifier == "code"
    assert p.reference["entry_point"] == "has_close_elements"
    assert p.reference["setup"] == "from typing import List"
    [test] = p.reference["tests"]
    assert "def has_close_elements(" in test and "METADATA" in test and "def check(candidate)" in test
    content = p.prompt[-1]["content"]
    assert "```python\nfrom typing import List\n\n\ndef has_close_elements(" in content and content.rstrip().endswith("```")
    assert p.solution.startswith("```python\nfrom typing import List") and "return False" in p.solution
    assert all(len(q.reference["tests"]) == 1 and q.reference["entry_point"] in q.prompt[-1]["content"] for q in suite)


@sandboxed
def test_humaneval_prompt_helpers_cannot_be_faked(data_dir, verifier):
    """HumanEval/38's test calls the prompt's encode_cyclic: redefining it as the identity next to
    an identity decode_cyclic must not pass."""
    p = next(q for q in get_task("humaneval", split="test") if q.id == "humaneval/test/38")
    fake = "```python\ndef encode_cyclic(s: str):\n    return s\n\ndef decode_cyclic(s: str):\n    return s\n```"
    assert verifier.score(fake, p.reference).score == 0.0
    assert verifier.score(p.solution, p.reference).score == 1.0


@pytest.mark.parametrize("split", list(MBPP_SPLITS))
def test_mbpp_splits_by_task_id(data_dir, split):
    suite = get_task("mbpp", split=split)
    lo, hi = MBPP_SPLITS[split]
    ids = [p.meta["task_id"] for p in suite]
    assert len(suite) == MBPP_SIZES[split] and ids == list(range(lo, hi + 1))


def test_mbpp_problem_shape(data_dir):
    p = get_task("mbpp", split="test")[0]
    assert p.id == "mbpp/test/11" and p.verifier == "code"
    assert p.reference == {"tests": ['assert remove_Occ("hello","l") == "heo"', 'assert remove_Occ("abcda","a") == "bcd"',
                                     'assert remove_Occ("PHP","P") == "H"']}
    content = p.prompt[-1]["content"]
    assert content.startswith("Write a python function to remove first and last occurrence")
    assert 'assert remove_Occ("hello","l") == "heo"' in content and "abcda" not in content  # one example test
    assert "\r" not in p.solution and p.solution.startswith("```python\ndef remove_Occ(s,ch):")
    three = get_task("mbpp", split="test", prompt_tests=3)[0].prompt[-1]["content"]
    assert "abcda" in three and "these tests" in three


def test_mbpp_setup_code_runs_after_the_solution(data_dir):
    by_id = {p.meta["task_id"]: p for p in get_task("mbpp", split="train")}
    tests = by_id[927].reference["tests"]
    assert all(t.startswith("root = Node(1)") for t in tests) and "setup" not in by_id[927].reference
    challenge = get_task("mbpp", split="test", challenge_tests=True)
    assert sum(len(p.reference["tests"]) > 3 for p in challenge) > 0


def test_import_lines_of_a_function_header():
    header = 'import math\nfrom typing import List, Tuple\n\n\ndef f(x: List[int]) -> int:\n    """doc"""\n'
    assert import_lines(header) == "import math\nfrom typing import List, Tuple"
    assert import_lines("def g():\n") == ""


# --- self-checks through the sandbox ---------------------------------------------------------------

@sandboxed
def test_humaneval_canonical_164_of_164_and_stubs_fail(data_dir, verifier):
    suite = list(get_task("humaneval", split="test"))
    good = _score_all(verifier, [(p.solution, p.reference) for p in suite])
    assert [(p.id, r.status, r.info.get("per_test")) for p, r in zip(suite, good) if r.score != 1.0] == []
    # the prompt's function header with an empty body: returns None
    header = [p.prompt[-1]["content"].split("```python\n", 1)[1].rsplit("```", 1)[0] for p in suite]
    stubs = _score_all(verifier, [(f"```python\n{h}    pass\n```", p.reference) for h, p in zip(header, suite)])
    assert [(p.id, r.status, r.info.get("error")) for p, r in zip(suite, stubs) if r.status != "ok"] == []
    assert [p.id for p, r in zip(suite, stubs) if r.score != 0.0] == []


def _broken(problem) -> str:
    """The reference program with every function the tests call redefined to raise (returning None
    is not wrong everywhere: MBPP 546 expects None for a missing character)."""
    code = problem.solution.removeprefix("```python\n").removesuffix("\n```")
    defined = {n.name for n in parse_python(code).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    called = {n.func.id for t in problem.reference["tests"] for n in ast.walk(parse_python(t))
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    stubs = "".join(f"\n\ndef {name}(*args, **kwargs):\n    raise ValueError('broken')" for name in sorted(called & defined))
    return f"```python\n{code}{stubs}\n```"


@sandboxed
@pytest.mark.parametrize("split", list(MBPP_SPLITS))
def test_mbpp_reference_programs_pass_and_broken_ones_fail(data_dir, verifier, split):
    suite = list(get_task("mbpp", split=split))
    good = _score_all(verifier, [(p.solution, p.reference) for p in suite])
    failures = {p.id: (r.status, r.info.get("per_test")) for p, r in zip(suite, good) if r.score != 1.0}
    assert set(failures) <= MBPP_SLOW, failures
    assert all(status == "ok" and any(t["status"] == "timeout" for t in per_test) for status, per_test in failures.values())
    bad = _score_all(verifier, [(_broken(p), p.reference) for p in suite])
    assert [(p.id, r.info.get("per_test")) for p, r in zip(suite, bad) if r.score != 0.0] == []


@sandboxed
def test_mbpp_slow_reference_passes_with_a_longer_budget(data_dir):
    from rlvr.verifiers import get_verifier

    slow = {p.id: p for p in get_task("mbpp", split="test") if p.id in MBPP_SLOW}
    v = get_verifier("code", timeout_s=60, total_timeout_s=120)
    try:
        assert {pid: v.score(p.solution, p.reference).score for pid, p in slow.items()} == dict.fromkeys(MBPP_SLOW, 1.0)
    finally:
        if v._pool is not None:
            v._pool.close()
