"""The ``reasoning_gym`` suite and verifier (the library is optional: these tests skip without it,
except the one that checks the install hint)."""

from __future__ import annotations

import builtins
import pickle

import pytest

from rlvr.tasks import get_task
from rlvr.verifiers import get_verifier

# Datasets whose items carry a single gold answer and whose scorer gives 0 to a wrong one (others
# give partial credit by similarity, e.g. spell_backward, or 0.01 for any answer, or have no gold:
# see tasks/reasoning_gym.py).
GOLD_DATASETS = ["leg_counting", "basic_arithmetic", "chain_sum", "word_sorting", "family_relationships",
                 "gsm_symbolic", "gcd", "arc_1d", "knights_knaves", "rearc"]


def test_missing_library_says_how_to_install(monkeypatch):
    real_import = builtins.__import__

    def no_reasoning_gym(name, *args, **kwargs):
        if name == "reasoning_gym" or name.startswith("reasoning_gym."):
            raise ImportError("No module named 'reasoning_gym'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_reasoning_gym)
    with pytest.raises(ImportError, match="pip install reasoning-gym"):
        get_task("reasoning_gym", dataset="leg_counting", n=3)
    r = get_verifier("reasoning_gym").score("<answer>4</answer>", {"dataset": "leg_counting", "entry": {"answer": "4"}})
    assert r.status == "error" and "pip install reasoning-gym" in r.info["error"]


@pytest.fixture(scope="module")
def rg():
    return pytest.importorskip("reasoning_gym")


@pytest.mark.parametrize("dataset", GOLD_DATASETS)
def test_gold_scores_one_and_corrupted_zero(rg, dataset):
    suite = get_task("reasoning_gym", dataset=dataset, split="test", n=20)
    verifier = get_verifier("reasoning_gym")
    assert len(suite) == 20
    assert [verifier.score(p.solution, p.reference).score for p in suite] == [1.0] * 20
    assert [verifier.score("<answer>corrupted zzz</answer>", p.reference).score for p in suite] == [0.0] * 20
    assert all(verifier.score(p.solution.replace("<answer>", "").replace("</answer>", ""), p.reference).score == 0.0
               for p in suite)  # no tag, no answer


def test_splits_are_disjoint_and_seeded(rg):
    def questions(split, seed=0, n=200):
        return [p.reference["entry"]["question"] for p in get_task("reasoning_gym", dataset="basic_arithmetic",
                                                                      split=split, n=n, seed=seed)]

    train, dev, test = questions("train", n=1000), questions("dev"), questions("test")
    assert not set(train) & set(test) and not set(train) & set(dev) and not set(dev) & set(test)
    assert questions("test") == test
    assert len(set(questions("test", seed=1)) & set(test)) < 20  # another seed, (almost) other problems
    assert len(set(train)) == 1000


def test_prompt_reference_and_options(rg):
    p = get_task("reasoning_gym", dataset="leg_counting", split="dev", n=1, config={"min_animals": 2, "max_animals": 2})[0]
    assert p.id == "reasoning_gym/leg_counting/dev/0" and p.verifier == "reasoning_gym"
    assert [m["role"] for m in p.prompt] == ["system", "user"] and "<answer>" in p.prompt[0]["content"]
    assert p.reference["dataset"] == "leg_counting" and p.reference["config"] == {"min_animals": 2, "max_animals": 2}
    assert p.reference["entry"]["metadata"]["num_animals"] == 2
    bare = get_task("reasoning_gym", dataset="leg_counting", split="dev", n=1, system_prompt="")[0]
    assert [m["role"] for m in bare.prompt] == ["user"]
    with pytest.raises(ValueError, match="pass dataset=<name>; available: .*leg_counting"):
        get_task("reasoning_gym", split="test")
    with pytest.raises(ValueError, match="unknown dataset 'leg_count'"):
        get_task("reasoning_gym", dataset="leg_count", split="test")


def test_verifier_through_worker_processes(rg):
    from rlvr.verifiers.runner import VerifierRunner

    suite = get_task("reasoning_gym", dataset="chain_sum", split="test", n=4)
    verifier = get_verifier("reasoning_gym")
    assert pickle.loads(pickle.dumps(verifier)).score(suite[0].solution, suite[0].reference).score == 1.0
    with VerifierRunner(workers=1, timeout_s=120) as runner:
        rewards = runner.score_batch("reasoning_gym", [p.solution for p in suite] + ["<answer>-1</answer>"],
                                     [p.reference for p in suite] + [suite[0].reference])
    assert [(r.status, r.score) for r in rewards] == [("ok", 1.0)] * 4 + [("ok", 0.0)]


def test_the_audit_scores_its_probes_and_shows_the_librarys_substring_credit():
    """The audit scores real probes against a basic_arithmetic entry (it used to error on every one: no
    reference of the right shape). It fails, rightly: the library's default score_answer gives an answer
    that contains the gold partial credit, len(gold) / len(answer), so '79 or 78' earns 0.25."""
    pytest.importorskip("reasoning_gym")
    from rlvr.verifiers.audit import audit

    report = audit("reasoning_gym")
    assert [r.id for r in report.rows if r.status != "ok"] == [r.id for r in report.rows if r.category == "reference"]
    by_id = {r.id: r for r in report.rows}
    assert by_id["golden-01"].score == 1.0 and by_id["golden-03"].score == 0.0
    assert by_id["hack-06"].score == pytest.approx(0.25) and not report.ok
