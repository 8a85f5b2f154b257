"""A third-party plugin package, written from the public docs, installed beside the project (a
dist-info with entry points on the path) and driven through the command line as its author would:
``rlvr verifiers list``, ``audit``, ``verify``, ``tasks list`` and a short ``train`` run.

It holds a binary verifier, a continuous one (with a pass threshold), a verifier that always
raises, a task suite, and a TRL-style reward function published by entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

PLUGIN = textwrap.dedent('''
    """rlvr_demo_plugin: what a plugin author writes."""
    from rlvr.tasks import Problem
    from rlvr.verifiers import Reward, Verifier


    class Exact(Verifier):
        """1.0 when the completion, stripped, is the answer."""

        def score(self, completion, reference):
            got = completion.strip()
            return Reward(float(got == str(reference["answer"])), info={"extracted": got or None})


    class Closeness(Verifier):
        """Continuous: 1 / (1 + |completion - answer|) for numeric completions, else 0."""
        pass_threshold = 0.99

        def score(self, completion, reference):
            try:
                value = float(completion.strip())
            except ValueError:
                return Reward(0.0, info={"extracted": None})
            return Reward(1.0 / (1.0 + abs(value - float(reference["answer"]))), info={"extracted": value})

        def audit_cases(self):
            ref = {"answer": "9"}
            return [{"id": "right", "category": "golden", "completion": "9", "reference": ref, "expect": "accept"},
                    {"id": "near", "category": "golden", "completion": "10", "reference": ref, "expect": "reject"}]


    class Broken(Verifier):
        def score(self, completion, reference):
            raise KeyError("needle")


    def length_reward(prompts, completions, **kwargs):
        """TRL style: shorter is better."""
        return [1.0 / (1 + len(c)) for c in completions]


    class Squares:
        """k*k= -> k squared (one-digit k), the shape of prompt the quickstart model reads."""
        name = "demo_squares"
        default_verifier = "demo_exact"
        splits = ("train", "test")

        def __init__(self, path=None, split="train", n=10):
            self.problems = [Problem(f"demo_squares/{split}/{k}", [{"role": "user", "content": f"{k}*{k}="}],
                                     {"answer": str(k * k)}, self.default_verifier) for k in range(n)]

        def __len__(self):
            return len(self.problems)

        def __iter__(self):
            return iter(self.problems)
''')

ENTRY_POINTS = textwrap.dedent('''
    [rlvr.verifiers]
    demo_exact = rlvr_demo_plugin:Exact
    demo_closeness = rlvr_demo_plugin:Closeness
    demo_broken = rlvr_demo_plugin:Broken
    demo_length = rlvr_demo_plugin:length_reward
    demo_missing = rlvr_demo_missing_module:Thing

    [rlvr.tasks]
    demo_squares = rlvr_demo_plugin:Squares
''')


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory):
    """An environment in which the plugin is installed (its package and dist-info on the path)."""
    root = tmp_path_factory.mktemp("site")
    (root / "rlvr_demo_plugin.py").write_text(PLUGIN)
    dist = root / "rlvr_demo_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rlvr-demo-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
               RLVR_PROGRESS="plain")
    return env


def rlvr(env, *args, cwd=None):
    return subprocess.run([sys.executable, "-m", "rlvr.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_list_shows_every_plugin_and_marks_the_broken_one(plugin_env):
    result = rlvr(plugin_env, "verifiers", "list")
    assert result.returncode == 0, result.stderr
    for name in ("demo_exact", "demo_closeness", "demo_broken", "demo_length"):
        assert name in result.stdout
    assert "demo_missing" in result.stdout and "BROKEN" in result.stdout
    assert "No module named 'rlvr_demo_missing_module'" in result.stdout
    assert "TRL reward function rlvr_demo_plugin.length_reward: TRL style: shorter is better" in result.stdout
    tasks = rlvr(plugin_env, "tasks", "list", "--no-sizes")
    assert tasks.returncode == 0 and "demo_squares" in tasks.stdout


def test_audit_of_binary_and_continuous_plugins(plugin_env):
    exact = rlvr(plugin_env, "verifiers", "audit", "demo_exact")
    assert exact.returncode == 0, exact.stdout  # not judged by the math final-answer set: it is no math verifier
    assert "no built-in golden set for a verifier of kind 'other'" in exact.stdout
    closeness = rlvr(plugin_env, "verifiers", "audit", "demo_closeness")
    assert closeness.returncode == 0, closeness.stdout
    assert "pass threshold of a continuous reward" in closeness.stdout
    assert "highest score of a response that must not pass: 0.5 (near" in closeness.stdout


def test_verify_with_the_trl_function_and_the_broken_plugin(plugin_env, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"completion": c, "answer": "9"}) + "\n" for c in ["9", "99"]))
    out = tmp_path / "out.jsonl"
    result = rlvr(plugin_env, "verify", "--verifier", "demo_length", "--input", str(src), "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["reward"]["score"] for line in out.read_text().splitlines()] == [0.5, 1 / 3]
    broken = rlvr(plugin_env, "verify", "--verifier", "demo_missing", "--input", str(src))
    assert broken.returncode == 2 and "Traceback" not in broken.stderr
    assert "verifier 'demo_missing' (rlvr_demo_missing_module:Thing, entry point of rlvr-demo-plugin 0.1) failed to load" \
        in broken.stderr


def test_a_short_train_run_with_the_plugin_suite_and_continuous_reward(plugin_env, tmp_path, taught_model):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({
        "out": str(tmp_path / "run"), "model": {"path": str(taught_model)},
        "data": [{"task": "demo_squares", "options": {"n": 10}}],
        "verifier": {"name": "demo_closeness", "success_threshold": 0.99},
        "algorithm": {"preset": "dapo", "overlong_buffer": 1},
        "generation": {"max_new_tokens": 3}, "train": {"steps": 2, "prompts_per_step": 4, "group_size": 4},
        "eval": {"limit": 5}, "log": {"plot_every": 0},
    }))
    result = rlvr(plugin_env, "train", str(cfg))
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/loss" in r]
    assert len(steps) == 2
    # continuous rewards differ within groups: dynamic sampling keeps them instead of dropping them all
    assert all(r["rollout/zero_variance_frac"] < 1.0 for r in steps)
    assert "\r" not in result.stderr  # no terminal: plain progress lines
    broken = tmp_path / "b.yaml"
    broken.write_text(cfg.read_text().replace("demo_closeness", "demo_broken").replace(str(tmp_path / "run"),
                                                                                    str(tmp_path / "run2")))
    result = rlvr(plugin_env, "train", str(broken))
    assert result.returncode == 2 and "more than verifier.max_error_frac=0.5: KeyError: 'needle'" in result.stderr
    assert result.stderr.count("Traceback (most recent call last)") == 1  # the first error's, shown once
