"""Evaluation: the unbiased pass@k estimator, `rlvr eval`, and mixed-suite training metrics."""

import json
import subprocess
import sys
from itertools import combinations
from math import comb

import pytest

from rlvr import grpo
from rlvr.evaluate import pass_at_k
from rlvr.tracking import read_metrics
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
    expected = sum(pass_at_k(4, r["correct"], 1) for r in records) / len(records)
    assert summary["pass@1"] == pytest.approx(expected)


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
    final = records[-1]
    assert {"eval/arithmetic/accuracy", "eval/arithmetic_2/accuracy", "eval/accuracy"} <= set(final)
