"""Accuracy of the ``math`` verifier on the case set (tests/verifier_cases): >= 99%, 0 hedging false positives.

The hand-made cases (cases.jsonl, built by tests/verifier_cases/build.py) cover every extraction
path and normalisation, hedging and multi-part answers; the real-data cases (MATH-500 and GSM8K
reference solutions, right and wrong golds, real solutions followed by a second boxed answer) are
derived from ../shared/data and skipped when it is absent. benchmarks/verifiers.py reports the same
numbers with latency and the math-verify baseline.
"""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

from rlvr.verifiers import get_verifier
from tests.conftest import DATA_MISSING

CASES_DIR = Path(__file__).resolve().parent / "verifier_cases"


def _load_real_module():
    spec = importlib.util.spec_from_file_location("verifier_cases_real", CASES_DIR / "real.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _evaluate(cases: list[dict]) -> tuple[float, list, Counter]:
    verifier = get_verifier("math")
    failures, per_category = [], Counter()
    for case in cases:
        reward = verifier.score(case["completion"], {"answer": case["answer"]})
        right = reward.status == "ok" and reward.score == case["expected"]
        per_category[case["category"]] += 1
        if not right:
            failures.append((case.get("id"), case["completion"][-80:], case["answer"], case["expected"],
                             reward.score, reward.status, reward.info.get("extracted")))
    return 1 - len(failures) / len(cases), failures, per_category


def _hedging_false_positives(cases: list[dict]) -> list:
    verifier = get_verifier("math")
    return [c["id"] for c in cases if "hedging" in c["category"]
            and verifier.score(c["completion"], {"answer": c["answer"]}).score != 0.0]


def test_case_file_is_in_sync_with_its_builder():
    module_spec = importlib.util.spec_from_file_location("verifier_cases_build", CASES_DIR / "build.py")
    build = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(build)
    stored = [json.loads(line) for line in (CASES_DIR / "cases.jsonl").read_text().splitlines()]
    assert [(c["completion"], c["answer"], c["expected"]) for c in stored] == \
           [(c["completion"], c["answer"], c["expected"]) for c in build.CASES]


def test_hand_made_cases():
    cases = [json.loads(line) for line in (CASES_DIR / "cases.jsonl").read_text().splitlines()]
    accuracy, failures, per_category = _evaluate(cases)
    assert len(cases) >= 400 and len(per_category) >= 20
    assert accuracy >= 0.99, failures
    assert _hedging_false_positives(cases) == []


def test_real_data_cases():
    real = _load_real_module()
    if not (real.DATA / "math500" / "test.jsonl").exists():
        pytest.skip(DATA_MISSING)
    cases = real.real_cases(gsm8k=200, hedges=200)
    accuracy, failures, per_category = _evaluate(cases)
    assert per_category["real_math500"] >= 900 and per_category["real_hedging"] >= 1000
    assert per_category["real_answers"] >= 1000
    assert accuracy >= 0.99, failures[:20]
    assert _hedging_false_positives(cases) == []
