"""The ``math`` verifier on the case set (tests/verifier_cases): every case exactly as expected.

The hand-made cases (cases.jsonl, built by tests/verifier_cases/build.py) cover every extraction
path and normalisation, hedging and multi-part answers; the real-data cases (MATH-500 and GSM8K
reference solutions, right and wrong golds, real solutions followed by a second boxed answer) are
derived from ../shared/data and skipped when it is absent. benchmarks/verifiers.py reports the same
numbers with latency and the math-verify baseline.

Each category is one test: the cases of that category the verifier gets wrong must be exactly the
ones listed in ``KNOWN_FAILURES`` / ``KNOWN_REAL_FAILURES`` (by case id, with the reason). A new
failure fails the test, and so does a listed case that starts passing (remove it from the list), so
no regression hides under an accuracy threshold. Both lists are empty at present.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rlvr.verifiers import get_verifier
from tests.conftest import DATA_MISSING

CASES_DIR = Path(__file__).resolve().parent / "verifier_cases"
HAND = [json.loads(line) for line in (CASES_DIR / "cases.jsonl").read_text().splitlines()]
HAND_CATEGORIES = sorted({c["category"] for c in HAND})
REAL_CATEGORIES = ("real_math500", "real_gsm8k", "real_hedging", "real_answers")

# case id -> why the verifier is allowed to get it wrong (each one is a strict expected failure)
KNOWN_FAILURES: dict[str, str] = {}
KNOWN_REAL_FAILURES: dict[str, str] = {}


def _load_real_module():
    spec = importlib.util.spec_from_file_location("verifier_cases_real", CASES_DIR / "real.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def verifier():
    return get_verifier("math")


def _failures(cases: list[dict], verifier) -> dict[str, str]:
    """``{case id: what went wrong}`` for every case not scored exactly as expected."""
    out = {}
    for case in cases:
        reward = verifier.score(case["completion"], {"answer": case["answer"]})
        if not (reward.status == "ok" and reward.score == case["expected"]):
            out[case["id"]] = (f"expected {case['expected']}, got {reward.score} ({reward.status}); extracted "
                               f"{reward.info.get('extracted')!r}; gold {str(case['answer'])[:80]!r}; "
                               f"completion ...{case['completion'][-100:]!r}")
    return out


def _assert_exactly_known(category: str, cases: list[dict], failures: dict[str, str], known: dict[str, str]):
    ids = {c["id"] for c in cases}
    new = {i: failures[i] for i in sorted(failures.keys() - known.keys())}
    fixed = sorted((known.keys() & ids) - failures.keys())
    lines = [f"{category}: {len(failures)} of {len(cases)} cases wrong"]
    lines += [f"  NEW FAILURE {i}: {why}" for i, why in new.items()]
    lines += [f"  now passes (remove it from the known failures): {i}" for i in fixed]
    assert not new and not fixed, "\n".join(lines)


def test_case_file_is_in_sync_with_its_builder():
    module_spec = importlib.util.spec_from_file_location("verifier_cases_build", CASES_DIR / "build.py")
    build = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(build)
    assert [(c["completion"], c["answer"], c["expected"]) for c in HAND] == \
           [(c["completion"], c["answer"], c["expected"]) for c in build.CASES]


def test_hand_made_case_set_shape():
    ids = [c["id"] for c in HAND]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    assert len(HAND) >= 400 and len(HAND_CATEGORIES) >= 20
    assert set(KNOWN_FAILURES) <= set(ids), set(KNOWN_FAILURES) - set(ids)


@pytest.mark.parametrize("category", HAND_CATEGORIES)
def test_hand_made_cases(category, verifier):
    cases = [c for c in HAND if c["category"] == category]
    _assert_exactly_known(category, cases, _failures(cases, verifier), KNOWN_FAILURES)


def test_no_hedging_false_positive(verifier):
    hedges = [c for c in HAND if "hedging" in c["category"]]
    assert [c["id"] for c in hedges if verifier.score(c["completion"], {"answer": c["answer"]}).score != 0.0] == []


@pytest.fixture(scope="module")
def real_cases():
    real = _load_real_module()
    if not (real.DATA / "math500" / "test.jsonl").exists():
        pytest.skip(DATA_MISSING)
    cases = real.with_ids(real.real_cases(gsm8k=200, hedges=200))
    counts = {k: sum(c["category"] == k for c in cases) for k in REAL_CATEGORIES}
    assert counts["real_math500"] >= 900 and counts["real_hedging"] >= 1000 and counts["real_answers"] >= 1000, counts
    assert {c["category"] for c in cases} <= set(REAL_CATEGORIES)
    assert set(KNOWN_REAL_FAILURES) <= {c["id"] for c in cases}
    return cases


@pytest.mark.parametrize("category", REAL_CATEGORIES)
def test_real_data_cases(category, real_cases, verifier):
    cases = [c for c in real_cases if c["category"] == category]
    failures = _failures(cases, verifier)
    _assert_exactly_known(category, cases, failures, KNOWN_REAL_FAILURES)
    if category == "real_hedging":
        assert not any(c["id"] in failures for c in cases), "a hedged response earned credit"
