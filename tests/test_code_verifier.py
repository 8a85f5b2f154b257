"""The ``code`` verifier: extraction, the reference format, scoring, statuses, and real benchmark
solutions (HumanEval's 164 canonical solutions must all pass; stubs must all fail).

These check results, not isolation, so on a machine without the strong sandbox they run with
``allow_weak_isolation=True`` (the hostile suite in test_sandbox_hostile.py checks isolation)."""

from __future__ import annotations

import gzip
import json
import pickle
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rlvr.sandbox import capabilities
from rlvr.verifiers import Reward, get_verifier, list_verifiers
from rlvr.verifiers.code import CodeVerifier, code_blocks, extract_program, humaneval_test, names_to_keep, same_output
from tests.conftest import DATA_DIR, DATA_MISSING

DATA = DATA_DIR or Path(__file__).resolve().parents[1].parent / "shared" / "data"  # $RLVR_DATA_DIR first
HUMANEVAL = DATA / "humaneval" / "HumanEval.jsonl.gz"
MBPP = DATA / "mbpp" / "mbpp.jsonl"
STRONG = capabilities()["isolation"] == "strong"


@pytest.fixture(scope="module")
def verifier():
    v = get_verifier("code", sandbox_slots=2, allow_weak_isolation=not STRONG)
    yield v
    if v._pool is not None:
        v._pool.close()


def fenced(code: str, lang: str = "python") -> str:
    return f"Here is my solution.\n```{lang}\n{code}\n```\nIt runs in O(n)."


# --- extraction (no sandbox) ------------------------------------------------------------------------

def test_last_python_block_wins_and_other_languages_are_ignored():
    text = "```python\ndef f(): return 1\n```\ntext\n```py\ndef f(): return 2\n```\n```bash\nrm -rf /\n```"
    assert extract_program(text) == "def f(): return 2"
    assert extract_program(text, "first_block") == "def f(): return 1"
    assert extract_program(text, "all_blocks") == "def f(): return 1\n\ndef f(): return 2"


def test_untagged_and_unterminated_blocks():
    assert extract_program("```\nx = 1\n```") == "x = 1"
    assert extract_program("Sure:\n```python\ndef f():\n    return 3") == "def f():\n    return 3"
    assert code_blocks("a\n  ```Python3  \nx\n  ```\n") == [("python3", "x", True)]


def test_no_block_gives_none_unless_raw_fallback():
    assert extract_program("def f(): return 1") is None
    assert extract_program("def f(): return 1", fallback="raw") == "def f(): return 1"
    assert extract_program("```bash\nls\n```") is None
    assert extract_program("   ", fallback="raw") is None
    assert extract_program("x = 1", "raw") == "x = 1"


def test_extraction_is_linear_on_adversarial_text():
    import time

    text = "```\n" * 200_000 + "x" * 1_000_000
    start = time.perf_counter()
    extract_program(text)
    assert time.perf_counter() - start < 2.0


def test_output_comparison_ignores_trailing_whitespace_only():
    assert same_output("1 2  \n3\n\n\n", "1 2\n3")
    assert same_output("a\r\nb\r\n", "a\nb\n")
    assert not same_output("1 2\n3", "1  2\n3")
    assert not same_output("\n1", "1")


def test_names_to_keep_only_for_the_function_under_test():
    # MBPP 126: the function under test is called `sum`
    assert names_to_keep("def sum(a, b):\n    return a", ["assert sum(10, 15) == 6"], None) == ["sum"]
    # a shadowing helper next to the real function under test is not kept
    assert names_to_keep("abs = 1\ndef abs(x): return 0\ndef f(x): return x", ["assert abs(f(1) - 2) < 1e-9"], None) == []
    assert names_to_keep("def f(): pass", ["check(f)"], "f") == ["f"]
    assert names_to_keep("def f(:", ["f()"], None) == []


# --- registry, options, reference errors -------------------------------------------------------

def test_registered_with_options():
    assert "code" in list_verifiers()
    v = get_verifier("code", all_or_nothing=True, timeout_s=2.0)
    assert isinstance(v, CodeVerifier) and v.all_or_nothing and v.timeout_s == 2.0
    with pytest.raises(TypeError, match="valid options"):
        get_verifier("code", nonsense=1)
    with pytest.raises(ValueError):
        get_verifier("code", extract="middle_block")


@pytest.mark.parametrize("reference", [
    {}, {"tests": []}, {"tests": "assert True"}, {"tests": [1]}, {"stdio": [{"input": "x"}]},
    {"tests": ["assert True"], "entry_point": 3}, "not a dict",
])
def test_broken_references_are_errors_not_zero_rewards(reference):
    r = get_verifier("code").score(fenced("x = 1"), reference)
    assert r.status == "error" and r.failed and "error" in r.info


def test_no_program_is_a_zero_reward_with_extracted_none():
    r = get_verifier("code").score("I don't know.", {"tests": ["assert True"]})
    assert (r.score, r.status, r.info["extracted"]) == (0.0, "ok", None)


def test_pickles_without_its_sandbox(verifier):
    verifier.score(fenced("x = 1"), {"tests": ["assert x == 1"]})
    clone = pickle.loads(pickle.dumps(verifier))
    assert clone._pool is None and clone.all_or_nothing == verifier.all_or_nothing


def test_sandbox_failure_is_a_verifier_error(monkeypatch):
    v = get_verifier("code")

    def broken():
        raise RuntimeError("bwrap exploded")

    monkeypatch.setattr(v, "_sandbox", broken)
    r = v.score(fenced("x = 1"), {"tests": ["assert x == 1"]})
    assert r.status == "error" and "bwrap exploded" in r.info["error"] and r.info["extracted"] == "x = 1"


# --- scoring ---------------------------------------------------------------------------------------

def test_fraction_and_all_or_nothing(verifier):
    ref = {"tests": ["assert f(1) == 2", "assert f(2) == 4", "assert f(3) == 7"]}
    r = verifier.score(fenced("def f(x):\n    return 2 * x"), ref)
    assert isinstance(r, Reward) and r.status == "ok"
    assert r.score == pytest.approx(2 / 3) and r.components["pass_rate"] == pytest.approx(2 / 3)
    assert (r.info["passed"], r.info["total"]) == (2, 3)
    assert [t["passed"] for t in r.info["per_test"]] == [True, True, False]
    strict = CodeVerifier(all_or_nothing=True, sandbox_slots=1, allow_weak_isolation=not STRONG)
    try:
        assert strict.score(fenced("def f(x):\n    return 2 * x"), ref).score == 0.0
        assert strict.score(fenced("def f(x):\n    return 2 * x + (x == 3)"), ref).score == 1.0
    finally:
        strict._sandbox().close()


def test_humaneval_style_reference_with_setup_and_entry_point(verifier):
    ref = {"tests": ["def check(candidate):\n    assert candidate([1, 2]) == 3\n\ncheck(total)"],
           "entry_point": "total", "setup": "from typing import List"}
    assert verifier.score(fenced("def total(xs: List[int]) -> int:\n    return sum(xs)"), ref).score == 1.0


def test_stdio_cases(verifier):
    ref = {"stdio": [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10"},
                     {"input": "0 0\n", "output": "1\n"}]}
    r = verifier.score(fenced("a, b = map(int, input().split())\nprint(a + b)  "), ref)
    assert r.score == pytest.approx(2 / 3)
    assert r.info["per_test"][2] == {"passed": False, "status": "failed", "detail": "wrong output"}
    crash = verifier.score(fenced("print(3)\nraise SystemExit(2)"), {"stdio": [{"input": "", "output": "3"}]})
    assert crash.score == 0.0 and "exit 2" in crash.info["per_test"][0]["detail"]


def test_tests_and_stdio_together(verifier):
    ref = {"tests": ["assert double(2) == 4"], "stdio": [{"input": "4", "output": "8"}]}
    code = "def double(x):\n    return 2 * x\nif __name__ == '__main__':\n    print(double(int(input())))"
    assert verifier.score(fenced(code), ref).score == 1.0


def test_model_failures_are_status_ok(verifier):
    ref = {"tests": ["assert f() == 1"]}
    loop = CodeVerifier(timeout_s=0.5, total_timeout_s=2.0, allow_weak_isolation=not STRONG)
    try:
        r = loop.score(fenced("def f():\n    while True: pass"), ref)
        assert (r.score, r.status) == (0.0, "ok") and r.info["per_test"][0]["status"] == "timeout"
    finally:
        loop._sandbox().close()
    for code in ["def f(:", "import os\ndef f():\n    os._exit(0)", "def f():\n    return 'x' * (1 << 34)"]:
        r = verifier.score(fenced(code), ref)
        assert (r.score, r.status) == (0.0, "ok"), (code, r)


def test_total_budget_shrinks_per_test_timeouts(verifier):
    v = CodeVerifier(timeout_s=5.0, total_timeout_s=1.0)
    assert v._limits(9, 0).timeout_s == pytest.approx(0.1)  # 10 budgets in 1 s
    assert v._limits(0, 4).timeout_s == pytest.approx(0.25)
    assert CodeVerifier(timeout_s=0.3)._limits(1, 0).timeout_s == pytest.approx(0.3)


def test_cheats_score_zero(verifier):
    ref = {"tests": ["assert f(2) == 4", "def check(candidate):\n    assert candidate(3) == 6\ncheck(f)"], "entry_point": "f"}
    cheats = [
        "def f(x):\n    return 0\nimport sys\nsys.exit(0)",
        "class E:\n    def __eq__(self, o): return True\ndef f(x):\n    return E()",
        "def f(x):\n    return 0\nprint('ALL TESTS PASSED')",
        "import unittest\nunittest.TestCase.assertEqual = lambda *a: None\ndef f(x):\n    return 0",
        "import os\ndef f(x):\n    os._exit(0)",
    ]
    for code in cheats:
        r = verifier.score(fenced(code), ref)
        assert (r.score, r.status) == (0.0, "ok"), (code, r.info.get("per_test"))


# --- real benchmarks ---------------------------------------------------------------------------------

def _humaneval() -> list[dict]:
    if not HUMANEVAL.exists():
        pytest.skip(f"HumanEval data not found at {HUMANEVAL}; {DATA_MISSING}")
    with gzip.open(HUMANEVAL, "rt") as f:
        return [json.loads(line) for line in f]


def _humaneval_reference(row: dict) -> dict:
    return {"tests": [row["test"] + f"\ncheck({row['entry_point']})\n"], "entry_point": row["entry_point"]}


def test_all_humaneval_canonical_solutions_pass_and_stubs_fail(verifier):
    rows = _humaneval()
    assert len(rows) == 164

    def canonical(row):
        return verifier.score(fenced(row["prompt"] + row["canonical_solution"]), _humaneval_reference(row))

    def stub(row):  # the prompt alone: the function returns None
        return verifier.score(fenced(row["prompt"] + "    pass\n"), _humaneval_reference(row))

    def shifted(pair):  # the next problem's solution body under this problem's name: wrong
        row, other = pair
        return verifier.score(fenced(row["prompt"] + other["canonical_solution"]), _humaneval_reference(row))

    with ThreadPoolExecutor(2) as pool:
        good = list(pool.map(canonical, rows))
        bad = list(pool.map(stub, rows))
        wrong = list(pool.map(shifted, list(zip(rows, rows[1:] + rows[:1]))[:40]))
    failures = [(row["task_id"], r.status, r.info.get("per_test")) for row, r in zip(rows, good) if r.score != 1.0]
    assert failures == []
    assert all(r.status == "ok" for r in good + bad + wrong)
    assert sum(r.score for r in bad) == 0
    assert sum(r.score == 1.0 for r in wrong) == 0


def test_humaneval_hardened_tests_pass_canonical_and_stop_helper_redefinition(verifier):
    rows = _humaneval()
    by_id = {row["task_id"]: row for row in rows}

    def hardened(row):
        return {"tests": [humaneval_test(row["prompt"], row["test"], row["entry_point"])],
                "entry_point": row["entry_point"]}

    with ThreadPoolExecutor(2) as pool:
        good = list(pool.map(lambda row: verifier.score(fenced(row["prompt"] + row["canonical_solution"]),
                                                        hardened(row)), rows))
    assert [row["task_id"] for row, r in zip(rows, good) if r.score != 1.0] == []
    # Redefine the helper the test relies on together with the solution: identity/identity.
    cheats = {"HumanEval/38": "def encode_cyclic(s):\n    return s\ndef decode_cyclic(s):\n    return s",
              "HumanEval/50": "def encode_shift(s):\n    return s\ndef decode_shift(s):\n    return s",
              "HumanEval/32": "def poly(xs, x):\n    return 0\ndef find_zero(xs):\n    return 0.0"}
    for task_id, code in cheats.items():
        row = by_id[task_id]
        assert verifier.score(fenced(code), _humaneval_reference(row)).score == 1.0  # the plain form is fooled
        assert verifier.score(fenced(code), hardened(row)).score == 0.0


def test_mbpp_reference_solutions_pass(verifier):
    if not MBPP.exists():
        pytest.skip(f"MBPP data not found at {MBPP}; {DATA_MISSING}")
    rows = [json.loads(line) for line in MBPP.read_text().splitlines()]
    rows = [r for r in rows if 11 <= r["task_id"] <= 70]  # a slice of the standard test split

    def score(row):
        setup = row.get("test_setup_code") or ""  # MBPP's setup runs after the solution
        tests = [f"{setup}\n{t}" if setup else t for t in row["test_list"]]
        return verifier.score(fenced(row["code"]), {"tests": tests})

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(score, rows))
    assert [(row["task_id"], r.info.get("per_test")) for row, r in zip(rows, results) if r.score != 1.0] == []


def test_through_the_verifier_runner_workers():
    from rlvr.verifiers.runner import VerifierRunner

    with VerifierRunner(workers=1, timeout_s=60) as runner:
        rewards = runner.score_batch("code", [fenced("def f():\n    return 1"), fenced("def f():\n    return 2")],
                                     [{"tests": ["assert f() == 1"]}] * 2,
                                     options={"allow_weak_isolation": not STRONG})
    assert [(r.status, r.score) for r in rewards] == [("ok", 1.0), ("ok", 0.0)]
    # A worker closes its sandbox pool when it shuts down, and a worker that was killed leaves
    # an empty tree the next pool sweeps (tests/test_sandbox_cgroups.py): no dead owner's tree
    # stays around once a pool has started.
    from rlvr.sandbox import cgroups

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        cgroups.remove_stale(cgroups.locate())
        stale = [p for c in cgroups.locate().values() for p in c.base.glob(cgroups.PREFIX + "*")
                 if cgroups.tree_owner(p.name) and not cgroups.owner_alive(cgroups.tree_owner(p.name))]
        if not stale:
            break
        time.sleep(0.2)
    assert stale == []


def test_audit_golden_cases_and_hacks():
    from rlvr.verifiers.audit import audit

    report = audit("code", {"timeout_s": 0.5, "total_timeout_s": 2.0, "allow_weak_isolation": not STRONG}, timeout_s=30)
    bad = [(r.id, r.category, r.score, r.status, r.verdict) for r in report.rows
           if r.verdict in ("MISSED", "WRONG", "LET THROUGH")]
    assert report.ok and bad == []
    assert {r.category for r in report.rows} >= {"golden", "hack", "hostile", "giant"}
