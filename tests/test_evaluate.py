"""Evaluation: the unbiased pass@k estimator, `rlvr eval`, and mixed-suite training metrics."""

import json
import subprocess
import sys
from itertools import combinations
from math import comb

import pytest

from rlvr.engines.base import Completion, SamplingParams
from rlvr.recipes import grpo
from rlvr.rollout.evaluate import evaluate, pass_at_k
from rlvr.tasks.base import Problem
from rlvr.verifiers import Reward, register_verifier
from rlvr.verifiers.runner import VerifierRunner
from rlvr.run.tracking import read_metrics
from test_grpo import _config


@pytest.mark.parametrize("n, c, k", [(5, 2, 1), (5, 2, 2), (10, 3, 8), (8, 0, 1), (8, 8, 8), (200, 13, 100)])
def test_pass_at_k_equals_the_binomial_formula(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


@pytest.mark.parametrize("n", [1, 4, 7])
def test_pass_at_k_is_the_chance_that_k_drawn_samples_hold_a_correct_one(n):
    for c in range(n + 1):
        samples = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            draws = list(combinations(samples, k))
            assert pass_at_k(n, c, k) == pytest.approx(sum(any(d) for d in draws) / len(draws)), (n, c, k)


def test_pass_at_k_by_hand():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # c / n
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    with pytest.raises(ValueError, match="at least 3 samples"):
        pass_at_k(2, 1, 3)


def test_eval_command_reports_pass_at_k_and_writes_results(taught_model, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "eval", "--model", str(taught_model), "--task", "arithmetic",
         "--task-option", "style=bare", "--task-option", "max_digits=1", "--samples", "4", "--k", "1,4",
         "--max-new-tokens", "3", "--workers", "0", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "pass@1" in result.stdout and "pass@4" in result.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert summary["problems"] == len(records) == 9 and summary["status"]["ok"] == 36
    assert summary["pass@1"] <= summary["pass@4"]
    # by definition, not by the function under test: pass@1 is the mean of c / n, pass@n whether any is right
    assert summary["pass@1"] == pytest.approx(sum(r["correct"] / 4 for r in records) / len(records))
    assert summary["pass@4"] == pytest.approx(sum(r["correct"] > 0 for r in records) / len(records))
    assert summary["accuracy"] == pytest.approx(sum(r["correct"] for r in records) / 36)


def test_eval_rejects_k_larger_than_samples(taught_model):
    result = subprocess.run([sys.executable, "-m", "rlvr.cli", "eval", "--model", str(taught_model), "--task", "arithmetic",
                             "--samples", "2", "--k", "1,8"], capture_output=True, text=True)
    assert result.returncode == 2 and "1..--samples (2)" in result.stderr


def test_mixed_suites_train_with_per_suite_metrics_and_evaluation(taught_model, tmp_path):
    config = _config(
        taught_model, tmp_path, "train.steps=2", "algorithm.beta=0",
        "data.1.task=arithmetic", "data.1.weight=3", "data.1.options={style: bare, max_digits: 1, ops: '-'}",
        "eval.tasks=[{task: arithmetic, split: test, options: {style: bare, max_digits: 1}}, "
        "{task: arithmetic, split: test, options: {style: bare, max_digits: 1, ops: '-'}}]",
    )
    grpo.train(config)
    records = read_metrics(tmp_path / "metrics.jsonl")
    steps = [r for r in records if "train/loss" in r]
    assert all("reward/arithmetic/accuracy" in r or "reward/arithmetic_2/accuracy" in r for r in steps)
    # both suites are drawn (16 draws at weights 1 : 3), and each step's per-suite accuracy is of suites it drew
    assert any("reward/arithmetic/accuracy" in r for r in steps) and any("reward/arithmetic_2/accuracy" in r for r in steps)
    final = records[-1]
    assert {"eval/arithmetic/accuracy", "eval/arithmetic_2/accuracy", "eval/accuracy"} <= set(final)


@register_verifier("test_eval_exact")
class _Exact:
    """1 for the reference answer, 0 otherwise; the text 'crash' is a failed verification that still
    carries a score of 1 (it must not count as correct)."""

    name = "test_eval_exact"

    def score(self, completion, reference):
        if completion == "crash":
            return Reward(1.0, status="error")
        return Reward(float(completion == reference["answer"]))


class _ScriptedEngine:
    """Problem i gets the completions SCRIPT[i], whatever the prompt (one batch of prompts per call)."""

    def __init__(self, script):
        self.script = script
        self.done = 0

    def generate(self, prompts, n, sampling):
        out = [[Completion([1], text, [-0.1], "stop") for text in self.script[self.done + i][:n]] for i in range(len(prompts))]
        self.done += len(prompts)
        return out


def test_evaluate_pass_at_k_by_hand_in_process():
    """Three problems x four samples with 1, 2 and 0 right (a failed verification scored 1 is not right):
    pass@1 = mean(c / n) = (1/4 + 2/4 + 0) / 3 = 0.25
    pass@2 = mean(1 - C(n-c, 2) / C(4, 2)) = ((1 - 3/6) + (1 - 1/6) + 0) / 3 = 4/9
    pass@4 = mean(c > 0) = 2/3"""
    script = [["7", "1", "2", "3"], ["5", "5", "0", "crash"], ["1", "2", "3", "4"]]
    problems = [Problem(f"p/{i}", [{"role": "user", "content": "q"}], {"answer": a}, "test_eval_exact")
                for i, a in enumerate(["7", "5", "9"])]
    result = evaluate(_ScriptedEngine(script), lambda p: [5], problems, VerifierRunner(workers=0),
                      sampling=SamplingParams(max_new_tokens=2), samples=4, ks=(1, 2, 4), batch_prompts=2)
    assert result.pass_at_k == pytest.approx({1: 0.25, 2: 4 / 9, 4: 2 / 3})
    assert result.accuracy == pytest.approx(3 / 12)
    assert result.status == {"ok": 11, "error": 1} and result.problems == 3
