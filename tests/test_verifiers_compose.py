"""compose (weighted / min / gate / weight-0 metrics), format, length, repetition, the TRL adapter."""

from __future__ import annotations

import math

import pytest

from rlvr.verifiers import Reward, Verifier, from_trl, get_verifier, register_trl_reward, register_verifier
from rlvr.verifiers.runner import VerifierRunner

GOOD = "<think>6 times 7 is 42.</think>\n<answer>\\boxed{42}</answer>"
REF = {"answer": "42"}


@register_verifier("test_fixed")
class Fixed(Verifier):
    """Returns the configured score/status; for composition tests."""

    def __init__(self, value: float = 1.0, status: str = "ok"):
        self.value, self.status = value, status

    def score(self, completion, reference):
        return Reward(self.value, status=self.status, info={"error": "x"} if self.status == "error" else {})


def accuracy_reward(prompts, completions, answer, **kwargs):
    """A TRL-style reward function (importable by path: test_verifiers_compose:accuracy_reward)."""
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]


def maybe_reward(prompts, completions):
    return [None if "skip" in completions[0] else 0.5]


def chat_reward(prompts, completions, **kwargs):
    return [float(completions[0][0]["role"] == "assistant" and prompts[0][0]["role"] == "user")]


# ----------------------------------------------------------------------------- compose
def test_weighted_sum_with_every_component_logged():
    v = get_verifier("compose", mode="weighted", parts=[
        {"name": "format", "weight": 0.1}, {"name": "math", "weight": 1.0},
        {"name": "length", "weight": 0, "options": {"max_length": 30, "buffer": 10}}])
    r = v.score(GOOD, REF)
    assert r.score == pytest.approx(1.1)
    assert r.components == {"format": 1.0, "math": 1.0, "length": -1.0}  # weight 0: logged, not optimised
    assert r.info["extracted"] == "42"
    wrong = v.score(GOOD.replace("42}", "41}"), REF)
    assert wrong.score == pytest.approx(0.1) and wrong.components["math"] == 0.0


def test_gate_scores_b_only_where_a_passes():
    v = get_verifier("compose", mode="gate", parts=["format", "math"])
    assert v.score(GOOD, REF).score == 1.0
    hacked = v.score("<think></think><answer>42</answer>", REF)
    assert hacked.score == 0.0
    assert hacked.components == {"format": 0.0, "math": 1.0, "gate": 0.0}  # correctness still logged
    explicit = get_verifier("compose", parts=[{"name": "format", "gate": True}, {"name": "math"}], gate_fail_score=-1)
    assert explicit.score("<answer>42</answer>", REF).score == -1.0


def test_min_is_a_conservative_ensemble():
    v = get_verifier("compose", mode="min", parts=["math", "numeric"])
    assert v.score("so the answer is 42", REF).score == 1.0
    assert v.score(r"\boxed{84/2}", REF).score == 0.0  # numeric disagrees


def test_failures_and_abstentions():
    failing = get_verifier("compose", parts=[{"name": "test_fixed"}, {"name": "test_fixed", "options": {"status": "error"}}])
    r = failing.score("", {})
    assert r.status == "error" and "part failed" in r.info["error"]
    assert r.components == {"test_fixed": 1.0}  # a failed part is not logged as a 0
    logged_only = get_verifier("compose", parts=[
        {"name": "test_fixed", "options": {"value": 0.5}},
        {"name": "test_fixed", "weight": 0, "options": {"status": "timeout"}}])
    r = logged_only.score("", {})
    assert (r.status, r.score) == ("ok", 0.5)  # a weight-0 part failing does not fail the reward
    assert r.info["parts"]["test_fixed_2"]["status"] == "timeout"
    abstaining = get_verifier("compose", parts=[{"name": "test_fixed", "options": {"status": "abstain"}},
                                                {"name": "test_fixed", "options": {"value": 0.25}}])
    assert abstaining.score("", {}).score == 0.25
    all_abstain = get_verifier("compose", parts=[{"name": "test_fixed", "options": {"status": "abstain"}}])
    assert all_abstain.score("", {}).status == "abstain"


def test_compose_config_errors_are_loud():
    with pytest.raises(KeyError, match="valid verifiers"):
        get_verifier("compose", parts=[{"name": "nope"}])
    with pytest.raises(ValueError, match="valid keys"):
        get_verifier("compose", parts=[{"name": "math", "wieght": 1}])
    with pytest.raises(ValueError, match="mode"):
        get_verifier("compose", mode="sum", parts=["math"])
    with pytest.raises(ValueError, match="weight 0"):
        get_verifier("compose", parts=[{"name": "math", "weight": 0}])
    with pytest.raises(TypeError, match="valid options"):
        get_verifier("compose", parts=[{"name": "math", "options": {"tolerence": 1}}])


def test_compose_runs_in_workers_from_a_yaml_like_config():
    config = {"name": "compose", "options": {"mode": "weighted", "parts": [
        {"name": "format", "weight": 0.5}, {"name": "math", "weight": 1.0}, {"name": "repetition", "weight": 0}]}}
    with VerifierRunner(workers=1, timeout_s=5) as runner:
        r = runner.score_batch(config["name"], [GOOD], [REF], config["options"])[0]
    assert r.score == 1.5 and set(r.components) == {"format", "math", "repetition"}


# ----------------------------------------------------------------------------- format
@pytest.mark.parametrize("completion, expected", [
    (GOOD, 1.0),
    ("<think>reasoning</think><answer>42</answer>\n", 1.0),
    ("<think></think><answer>42</answer>", 0.0),           # empty think block
    ("<think>   \n</think><answer>42</answer>", 0.0),
    ("<answer>42</answer>", 0.0),                          # no reasoning
    ("<think>x</think>", 0.0),                             # no answer
    ("<answer>42</answer><think>x</think>", 0.0),          # wrong order
    ("<think>x</think><answer></answer>", 0.0),            # empty answer
    ("<think>x<think>y</think></think><answer>42</answer>", 0.0),  # nested tags
    ("<think>x</think><answer>42</answer> trailing", 0.0),  # text outside the template
    ("<think>x</think><answer>1</answer><answer>2</answer>", 0.0),
])
def test_format_think_answer(completion, expected):
    assert get_verifier("format").score(completion, {}).score == expected


def test_format_styles_and_options():
    assert get_verifier("format", style="think").score("<think>hm</think> so 42", {}).score == 1.0
    assert get_verifier("format", style="think").score("<think>hm</think>", {}).score == 0.0
    assert get_verifier("format", style="boxed").score(r"so \boxed{42}", {}).score == 1.0
    assert get_verifier("format", style="boxed").score(r"\boxed{1} \boxed{2}", {}).score == 0.0
    assert get_verifier("format", style="regex", pattern=r"Answer: \d+").score("Answer: 12", {}).score == 1.0
    assert get_verifier("format", style="regex", pattern=r"\d+", match="search").score("x 1 y", {}).score == 1.0
    assert get_verifier("format", think_prefilled=True).score("plan</think><answer>4</answer>", {}).score == 1.0
    assert get_verifier("format", min_think_chars=20).score("<think>short</think><answer>4</answer>", {}).score == 0.0
    partial = get_verifier("format", partial=True).score("<think>x</think><answer></answer>", {})
    assert 0 < partial.score < 1 and partial.info["checks"]["answer_nonempty"] is False
    with pytest.raises(ValueError):
        get_verifier("format", style="regex")


# ----------------------------------------------------------------------------- length, repetition
@pytest.mark.parametrize("length, expected", [(0, 0.0), (70, 0.0), (80, -0.5), (90, -1.0), (91, -1.0)])
def test_overlong_soft_punishment(length, expected):
    # L_max = 90, L_cache = 20: 0 up to 70, then linear to -1 at 90, -1 beyond
    v = get_verifier("length", mode="overlong", max_length=90, buffer=20)
    assert v.score("a" * length, {}).score == pytest.approx(expected)


def test_length_units():
    assert get_verifier("length", max_length=10, buffer=5, unit="words").score("a " * 10, {}).score == 0.0 - 1.0
    tokens = get_verifier("length", max_length=10, buffer=5, unit="tokens")
    assert tokens.score("x", {"completion_tokens": 8}).score == pytest.approx(-0.6)
    assert tokens.score("x", {}).status == "error"


def test_cosine_length_scaling():
    v = get_verifier("length", mode="cosine", max_length=100, unit="chars")
    right, wrong = r"\boxed{42}", r"\boxed{41}"
    n = len(right)
    expect_right = 1.0 + (2.0 - 1.0) * (1 + math.cos(math.pi * n / 100)) / 2
    expect_wrong = 0.0 + (-10.0 - 0.0) * (1 + math.cos(math.pi * n / 100)) / 2
    r = v.score(right, REF)
    assert r.score == pytest.approx(expect_right) and r.components == {"correct": 1.0}
    assert v.score(wrong, REF).score == pytest.approx(expect_wrong)
    assert v.score("x" * 100 + right, REF).score == -10.0  # past max_length
    assert v.score(right, {}).status == "error"  # the correctness check's failure is this reward's


def test_repetition_penalty():
    v = get_verifier("repetition", n=3, max_penalty=-1.0)
    assert v.score("the quick brown fox jumps over", {}).score == 0.0
    looping = v.score("a b c a b c a b c a b c", {})  # 10 trigrams, 3 distinct
    assert looping.score == pytest.approx(-0.7)
    assert v.score("too short", {}).score == 0.0
    with pytest.raises(ValueError):
        get_verifier("repetition", max_penalty=1.0)


# ----------------------------------------------------------------------------- TRL adapter
def test_trl_function_becomes_a_verifier():
    v = from_trl(accuracy_reward)
    assert v.score("it is 42", {"answer": "42", "prompt": "q"}).score == 1.0
    assert v.score("it is 4", {"answer": "42"}).score == 0.0
    maybe = from_trl(maybe_reward)  # takes no **kwargs: the extra column is not passed
    assert maybe.score("ok", {"answer": "1"}).score == 0.5
    assert maybe.score("skip", {"answer": "1"}).status == "abstain"
    chat = from_trl(chat_reward, conversational=True)
    assert chat.score("hi", {"prompt": "hello"}).score == 1.0


def test_trl_function_by_name_and_from_config():
    register_trl_reward("test_accuracy", accuracy_reward, overwrite=True)
    assert get_verifier("test_accuracy").score("42", REF).score == 1.0
    by_path = get_verifier("trl", function="test_verifiers_compose:accuracy_reward")
    assert by_path.score("42", REF).score == 1.0
    with VerifierRunner(workers=1, timeout_s=5) as runner:
        rewards = runner.score_batch("trl", ["42", "41"], [REF, REF], {"function": "test_verifiers_compose:accuracy_reward"})
    assert [r.score for r in rewards] == [1.0, 0.0]
    with pytest.raises(ValueError):
        get_verifier("trl", function="not_a_path")


def test_trl_function_returning_garbage_is_an_error():
    bad = from_trl(lambda prompts, completions, **kw: [1.0, 2.0])
    assert bad.score("x", {}).status == "error"
