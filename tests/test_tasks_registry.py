"""The suite registry: built-ins, ``@register_task``, the ``rlvr.tasks`` entry points, errors; and the
contract every built-in suite keeps (TaskSuite protocol, chat prompts, valid verifiers)."""

from __future__ import annotations

import sys
import types
from importlib import metadata

import pytest

import rlvr.tasks.registry as registry
from rlvr.tasks import Problem, TaskSuite, get_task, list_tasks, register_task
from rlvr.verifiers import list_verifiers
from rlvr.verifiers.errors import InvalidValueError

BUILT_IN = {"aime24", "amc23", "arithmetic", "countdown", "custom", "gsm8k", "humaneval", "math", "math500", "mbpp",
            "minerva_math", "reasoning_gym"}


@pytest.fixture
def clean_registry(monkeypatch):
    """A registry whose additions and plugin scan are undone after the test."""
    private = registry.TASKS.copy()
    private.rescan()
    monkeypatch.setattr(registry, "TASKS", private)


class Squares:
    name = "squares"
    default_verifier = "numeric"
    splits = ("train", "test")

    def __init__(self, path=None, split="train", *, n=3):
        self.items = range(n) if split == "train" else range(100, 100 + n)

    def __len__(self):
        return len(self.items)

    def __iter__(self):
        for k in self.items:
            yield Problem(f"squares/{k}", [{"role": "user", "content": f"{k}^2="}], {"answer": str(k * k)}, "numeric")


def test_built_ins_are_listed():
    assert BUILT_IN <= set(list_tasks())


def test_register_and_get(clean_registry):
    register_task("squares")(Squares)
    assert "squares" in list_tasks()
    suite = get_task("squares", split="test", n=2)
    assert isinstance(suite, TaskSuite) and [p.reference["answer"] for p in suite] == ["10000", "10201"]
    register_task("squares")(Squares)  # the same class again (a reload) is fine
    with pytest.raises(ValueError, match="already registered"):
        register_task("squares")(type("Other", (Squares,), {}))
    register_task("squares", overwrite=True)(type("Other", (Squares,), {}))


def test_unknown_name_split_and_option_list_the_valid_ones():
    with pytest.raises(KeyError, match="unknown task 'gsm9k'; valid tasks: .*gsm8k"):
        get_task("gsm9k")
    with pytest.raises(ValueError, match="unknown split 'validation'; valid splits: train, dev, test"):
        get_task("countdown", split="validation")
    with pytest.raises(TypeError, match="task 'arithmetic': unknown option.*max_digit\\b.*valid options: n, seed, max_digits"):
        get_task("arithmetic", max_digit=2)


def _entry_point(name: str, value: str) -> metadata.EntryPoint:
    return metadata.EntryPoint(name=name, value=value, group=registry.ENTRY_POINT_GROUP)


def test_entry_point_plugins_are_discovered_and_loaded_lazily(clean_registry, monkeypatch):
    module = types.ModuleType("fake_rlvr_plugin")
    module.Squares = Squares
    module.imported = 0
    monkeypatch.setitem(sys.modules, "fake_rlvr_plugin", module)
    seen_groups = []

    def fake_entry_points(*, group):
        seen_groups.append(group)
        return [_entry_point("plugin_squares", "fake_rlvr_plugin:Squares"),
                _entry_point("gsm8k", "fake_rlvr_plugin:Squares")]  # a built-in name: the built-in wins

    monkeypatch.setattr("rlvr.verifiers.plugins.metadata.entry_points", fake_entry_points)
    assert "plugin_squares" in list_tasks() and seen_groups == ["rlvr.tasks"]
    assert "plugin_squares" not in registry.TASKS._loaded  # listed, not imported yet
    assert len(get_task("plugin_squares", n=4)) == 4
    assert registry.TASKS._loaded["plugin_squares"] is Squares
    assert registry.task_factory("gsm8k").__name__ == "GSM8K"
    list_tasks()
    assert seen_groups == ["rlvr.tasks"]  # scanned once


def test_a_broken_plugin_names_its_entry_point(clean_registry, monkeypatch):
    monkeypatch.setattr("rlvr.verifiers.plugins.metadata.entry_points",
                        lambda *, group: [_entry_point("broken", "no_such_module_xyz:Suite")])
    assert "broken" in list_tasks()
    with pytest.raises(ImportError, match="task 'broken' \\(no_such_module_xyz:Suite, entry point\\) failed to load: "
                                          "ModuleNotFoundError: No module named 'no_such_module_xyz'"):
        get_task("broken")
    assert registry.TASKS.status("broken")[0] is False


# --- the contract of every built-in suite ------------------------------------------------------------

SMALL = {  # options that keep generated suites small
    "arithmetic": {"n": 20}, "countdown": {"n": 20},
}


def _suites(data_dir):
    for name in sorted(BUILT_IN - {"custom", "reasoning_gym"}):
        factory = registry.task_factory(name)
        for split in factory.splits:
            if name == "countdown" and split == "test":
                yield name, split, get_task(name, split=split)
            else:
                yield name, split, get_task(name, split=split, **SMALL.get(name, {}))


def test_every_built_in_suite_keeps_the_contract(data_dir):
    verifiers = set(list_verifiers())
    count = 0
    for name, split, suite in _suites(data_dir):
        count += 1
        assert isinstance(suite, TaskSuite), name
        assert suite.name == name and suite.default_verifier in verifiers
        problems = list(suite)
        assert len(problems) == len(suite) > 0
        assert len({p.id for p in problems}) == len(problems), (name, split)
        for p in problems:
            assert p.id.startswith(f"{name}/{split}/")
            assert isinstance(p.prompt, list) and p.prompt and p.prompt[-1]["role"] == "user"
            assert all(set(m) == {"role", "content"} and m["content"].strip() for m in p.prompt)
            assert p.verifier == suite.default_verifier and isinstance(p.reference, dict) and p.reference
        assert getattr(suite, "skipped", 0) == 0
    assert count == 19


def test_problems_are_frozen():
    p = Problem("x/1", [{"role": "user", "content": "hi"}], {"answer": "1"}, "numeric")
    with pytest.raises(Exception):
        p.id = "y"  # frozen
    assert p.solution is None and p.meta == {}


def test_draw_distinct_keeps_filters_and_drops():
    from rlvr.tasks.base import draw_distinct

    values = iter([1, 2, 2, 3, 4, 5, 6, 7])
    built = draw_distinct(3, lambda: next(values), lambda i, v: None if v == 3 else (i, v),
                          keep=lambda v: v != 1, key=lambda v: v, max_attempts=100, failure="x")
    assert built == [(0, 2), (1, 4), (2, 5)]  # 1 not kept, the second 2 a repeat, 3 dropped by build
    again = iter([2, 2, 2])
    assert draw_distinct(2, lambda: next(again), lambda i, v: v, max_attempts=5, failure="x") == [2, 2]  # no key
    with pytest.raises(InvalidValueError, match="space too small"):
        draw_distinct(2, lambda: 7, lambda i, v: v, key=lambda v: v, max_attempts=50, failure="space too small")


def test_hash_split_is_stable_and_follows_the_buckets():
    from collections import Counter

    from rlvr.tasks.base import hash_split

    assert hash_split("1+2") == hash_split("1+2")
    shares = Counter(hash_split(f"{a}+{b}") for a in range(100) for b in range(100))
    assert abs(shares["test"] / 10_000 - 0.10) < 0.02 and abs(shares["dev"] / 10_000 - 0.05) < 0.015
