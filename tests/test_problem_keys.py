"""What the trainer keeps per problem (its suite's chat template, its environment's tools, its place in a
suite) is keyed by ``Problem.key`` (suite and id), not by the object: a copied or unpickled problem keeps
all of it, and two suites with the same problem ids do not collide."""

from __future__ import annotations

import copy
import pickle

import pytest

from rlvr.config import RunConfig, build_config
from rlvr.rollout.async_rollout import AsyncRollouts, Sampled
from rlvr.rollout.chat import resolve_chat_template
from rlvr.rollout.suites import PromptEncoder, load_eval_suites, load_suite, load_training_suites
from rlvr.tasks.base import Problem
from rlvr.verifiers.errors import InvalidValueError

TOOLS_TEMPLATE = ("{% for t in tools or [] %}[tool {{ t.name }}]{% endfor %}"
                  "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
OPTIONS = {"style": "bare", "max_digits": 1, "n": 3}


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from rlvr.modeling.loading import load_tokenizer

    return load_tokenizer(tiny_model)


def _revived(problem: Problem) -> list[Problem]:
    return [copy.copy(problem), copy.deepcopy(problem), pickle.loads(pickle.dumps(problem))]


def test_two_suites_with_the_same_ids_get_distinct_stable_keys():
    config = build_config(RunConfig, {"model": {"path": "m"}, "data": [
        {"task": "arithmetic", "split": "test", "options": OPTIONS},
        {"task": "arithmetic", "split": "test", "options": OPTIONS, "chat_template": "none"}],
        "eval": {"tasks": [{"task": "arithmetic", "split": "test", "options": OPTIONS}]}})
    suites, _ = load_training_suites(config.data)
    eval_suites = load_eval_suites(config)
    first, second, held_out = suites["arithmetic"][0], suites["arithmetic_2"][0], eval_suites["arithmetic"][0]
    assert first.id == second.id == held_out.id  # the same problem, in three suites
    assert [first.key, second.key, held_out.key] == [("train/arithmetic", first.id), ("train/arithmetic_2", first.id),
                                                     ("eval/arithmetic", first.id)]
    assert first == second  # the suite names where a problem was loaded, not what it is
    assert all(p.key == first.key for p in _revived(first))


def test_a_copied_or_unpickled_problem_keeps_its_suites_template_and_tools(tokenizer, tmp_path):
    template_file = tmp_path / "tools.jinja"
    template_file.write_text(TOOLS_TEMPLATE)
    with_tools = load_suite("arithmetic", path=None, split="test", options=OPTIONS, limit=None,
                            chat_template=str(template_file), suite="train/a")
    raw = load_suite("arithmetic", path=None, split="test", options=OPTIONS, limit=None, chat_template="none",
                     suite="eval/b")
    encode = PromptEncoder.for_suites(tokenizer, {"a": with_tools}, {"b": raw})
    tools = [{"name": "calc", "parameters": {}}]
    encode.offer_tools(with_tools, tools)
    original = encode(with_tools[0])
    assert tokenizer.decode(original).startswith("[tool calc]<user>")  # the suite's template, listing the tools
    for problem in _revived(with_tools[0]):
        assert encode.template_of(problem) == resolve_chat_template(str(template_file))
        assert encode.tools_of(problem) == tools
        assert encode(problem) == original
    for problem in _revived(raw[0]):  # the same id in the other suite: its own template, no tools
        assert encode.template_of(problem).mode == "none" and encode.tools_of(problem) is None
        assert encode(problem) == encode(raw[0]) != original


def test_unnamed_suites_whose_ids_collide_are_refused_not_mixed(tokenizer):
    templated = load_suite("arithmetic", path=None, split="test", options=OPTIONS, limit=None)
    raw = load_suite("arithmetic", path=None, split="test", options=OPTIONS, limit=None, chat_template="none")
    with pytest.raises(InvalidValueError, match=r"assigned two chat templates"):
        PromptEncoder.for_suites(tokenizer, {"a": templated}, {"b": raw})


def test_async_checkpoints_name_a_copied_problem_by_its_place_in_its_suite():
    """Two suites of the same problem ids; the drawn problems are copies, as after a round trip through a process."""
    suites = {name: load_suite("arithmetic", path=None, split="test", options=OPTIONS, limit=None) for name in "ab"}
    rollouts = AsyncRollouts(None, draw=lambda k: [], encode=lambda p: [], suites=suites, num_prompts=2,
                             group_size=1, sampling=None, max_staleness=1, seed=0)
    drawn = [("b", pickle.loads(pickle.dumps(suites["b"][2]))), ("a", copy.deepcopy(suites["a"][1]))]
    rollouts._ready[3] = Sampled(drawn, [[1], [2]], [[], []], submitted_at=2, info={})
    state = rollouts.state_dict()
    assert state["ready"][3]["drawn"] == [("b", 2), ("a", 1)]
    rollouts.load_state_dict(state)
    assert [p is suites[name][k] for (name, p), k in zip(rollouts._ready[3].drawn, (2, 1))] == [True, True]
