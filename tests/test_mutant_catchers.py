"""Behaviour of the multi-turn, asynchronous and judge pieces against hand-computed values, written so
that the mutation check (tests/mutants.py) catches a small bug in each: how an environment message is
written as text, how many tool calls a turn runs and how their failures count, a tool's arguments
checked before it runs, which steps the asynchronous generator has in flight and how each is seeded,
and which HTTP statuses the judge's http backend retries. Unit level: no model, a second or less each.
"""

from __future__ import annotations

import json

import pytest

from rlvr.engines.base import Completion, SamplingParams
from rlvr.rollout.env_tokens import TextMessages
from rlvr.tasks.base import Problem
from rlvr.tasks.environments import get_environment
from rlvr.tasks.tools import ToolCall, call_tool
from tests.test_episodes import TOKENIZER, ids

# ---------------------------------------------------------------------------------------------
# env_tokens: the text format of environment messages
# ---------------------------------------------------------------------------------------------


def test_text_messages_write_a_tool_result_fenced_and_any_other_message_on_its_own_lines():
    text = TextMessages(TOKENIZER)
    messages = [{"role": "tool", "name": "python", "content": "42"}, {"role": "user", "content": "sure?"}]
    written = "\n```output\n42\n```\n" + "\nsure?\n"  # by hand, from the module docstring's format
    assert text.render(messages) == written
    assert text.encode(messages) == ids(written)  # the ids appended to the episode: the text alone, no specials


# ---------------------------------------------------------------------------------------------
# environments / tools: calls per turn, failures counted, arguments checked before the tool runs
# ---------------------------------------------------------------------------------------------

CALLED: list[tuple] = []


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first.
        b: the second.
    """
    CALLED.append((a, b))
    return a + b


def _call(**arguments) -> str:
    return "<tool_call>" + json.dumps({"name": "add", "arguments": arguments}) + "</tool_call>"


def test_a_turn_runs_at_most_max_calls_per_turn_calls_and_counts_the_failed_ones():
    env = get_environment("tools", tools=[f"{__name__}:add"], max_calls_per_turn=2, timeout_s=2)
    problem = Problem(id="p", prompt=[{"role": "user", "content": "1+2"}], reference={"answer": "3"},
                      verifier="numeric", environment="tools")
    turn = _call(a=1, b=2) + _call(a="x", b=1) + _call(a=3, b=4)  # the third is past the cap: never run
    CALLED.clear()
    step = env.episode(problem).step(turn)
    assert [m["content"] for m in step.messages] == [
        "3", "error: bad arguments for 'add': argument 'a' must be an integer, got a string 'x'"]
    assert [m["name"] for m in step.messages] == ["add", "add"] and {m["role"] for m in step.messages} == {"tool"}
    assert (step.tool_calls, step.tool_errors, len(step.tool_latency_s)) == (2, 1, 2)
    assert CALLED == [(1, 2)]  # the ill-typed call never reached the tool, the third never ran


def test_an_ill_typed_argument_is_an_observation_and_the_tool_never_runs():
    CALLED.clear()
    result = call_tool({"add": add}, ToolCall("add", {"a": "1", "b": 2}))
    assert (result.content, result.failed) == (
        "error: bad arguments for 'add': argument 'a' must be an integer, got a string '1'", True)
    assert CALLED == []
    assert call_tool({"add": add}, ToolCall("add", {"a": 40, "b": 2})).content == "42" and CALLED == [(40, 2)]


# ---------------------------------------------------------------------------------------------
# async_rollout: the steps in flight, their lag and their seeds
# ---------------------------------------------------------------------------------------------


class FifoGenerator:
    """Stands in for :class:`rlvr.engines.process.ProcessEngine` as :class:`AsyncRollouts` uses it: a queue
    served in order, so a generation submitted after publication ``v`` is sampled by ``v``. Records what
    each submission asked for (its ticket, the step's prompts, its seed or RNG state)."""

    def __init__(self):
        self.publications, self.submitted, self.rng_set = 0, [], []

    def publish(self):  # what update_weights does to the count
        self.publications += 1

    def rng_state(self):
        return {"cpu": f"trainer-{len(self.submitted)}".encode()}

    def set_rng_state(self, state):
        self.rng_set.append(state)

    def submit(self, prompts, n, sampling, *, rng=None, seed=None, problems=None, templates=None):
        self.submitted.append({"prompts": prompts, "seed": seed, "rng": rng, "publication": self.publications})
        return len(self.submitted) - 1

    def result(self, ticket):
        asked = self.submitted[ticket]
        groups = [[Completion([7], "7", [-0.1], "stop") for _ in range(2)] for _ in asked["prompts"]]
        return groups, {"publication": asked["publication"], "idle_s": 0.0, "seconds": 0.0,
                        "rng": {"cpu": f"worker-{ticket}".encode()}}


def _rollouts(engine, max_staleness, seed=5):
    from rlvr.rollout.async_rollout import AsyncRollouts

    problems = [Problem(id=str(k), prompt=[{"role": "user", "content": f"{k}+0="}], reference={"answer": str(k)},
                        verifier="numeric") for k in range(20)]
    order = iter(problems)
    return AsyncRollouts(engine, draw=lambda k: [("s", next(order)) for _ in range(k)],
                         encode=lambda problem: [int(problem.id)], suites={"s": problems}, num_prompts=2,
                         group_size=2, sampling=SamplingParams(max_new_tokens=1), max_staleness=max_staleness,
                         seed=seed)


def test_async_rollouts_keep_s_steps_ahead_lag_min_s_t_minus_1_and_seed_each_step_from_the_run_seed():
    engine = FifoGenerator()
    rollouts = _rollouts(engine, max_staleness=2, seed=5)
    lags, prompts = [], []
    for step in range(1, 6):
        sampled = rollouts.take(step, last_step=5)
        lags.append(step - sampled.submitted_at)
        prompts.append(sampled.prompt_ids)
        engine.publish()  # the step's update, then its weights go out
    assert lags == [0, 1, 2, 2, 2]  # min(S, t - 1), S = 2
    assert [s["publication"] for s in engine.submitted] == [0, 0, 0, 1, 2]  # steps 1-3 at once, then one a step
    assert prompts == [[[0], [1]], [[2], [3]], [[4], [5]], [[6], [7]], [[8], [9]]]  # each step its own draw, in order
    # S >= 1: step t is seeded (5 * 1_000_003 + t * 7_919) mod 2^62, whenever it was submitted
    assert [s["seed"] for s in engine.submitted] == [5 * 1_000_003 + t * 7_919 for t in range(1, 6)]
    assert all(s["rng"] is None for s in engine.submitted) and engine.rng_set == []


def test_async_rollouts_at_staleness_zero_continue_the_trainer_s_rng_stream():
    engine = FifoGenerator()
    rollouts = _rollouts(engine, max_staleness=0)
    for step in range(1, 4):
        assert rollouts.take(step, last_step=3).submitted_at == step
        engine.publish()
    assert [s["rng"] for s in engine.submitted] == [{"cpu": f"trainer-{k}".encode()} for k in range(3)]
    assert all(s["seed"] is None for s in engine.submitted)
    assert engine.rng_set == [{"cpu": f"worker-{k}".encode()} for k in range(3)]  # the worker's state comes back


# ---------------------------------------------------------------------------------------------
# judge_backends: which statuses are retried
# ---------------------------------------------------------------------------------------------


def test_the_http_judge_retries_408_409_425_429_and_5xx_once_each_and_fails_other_statuses_at_once():
    from rlvr.verifiers.judge_backends import HTTPJudge, JudgeRequest
    from tests.judge_server import FakeJudgeServer

    request = JudgeRequest((("user", "Reference answer:\n7\n<response-0>\n7\n</response-0>"),))
    for status in (408, 409, 425, 429, 500, 502, 503, 504):  # the request may succeed later: a second attempt
        with FakeJudgeServer(fail=lambda i, user, status=status: status if i == 0 else None) as judge:
            reply = HTTPJudge(base_url=judge.url, model="m", backoff_s=0, retries=2).complete([request])[0]
            assert (reply.error, reply.text, reply.attempts, judge.calls) == (None, "Verdict: yes", 2, 2), status
    for status in (400, 401, 403, 404, 422):  # retrying a bad request, key or model name only hides it
        with FakeJudgeServer(fail=lambda i, user, status=status: status) as judge:
            reply = HTTPJudge(base_url=judge.url, model="m", backoff_s=0, retries=2).complete([request])[0]
            assert reply.attempts == 1 and judge.calls == 1, status
            assert reply.error.startswith(f"HTTP {status} from {judge.url}/chat/completions"), reply.error


@pytest.mark.parametrize("retries", [0, 2])
def test_a_status_retried_until_the_retries_run_out_fails_after_retries_plus_one_attempts(retries):
    from rlvr.verifiers.judge_backends import HTTPJudge, JudgeRequest
    from tests.judge_server import FakeJudgeServer

    with FakeJudgeServer(fail=lambda i, user: 503) as judge:
        reply = HTTPJudge(base_url=judge.url, model="m", backoff_s=0, retries=retries).complete(
            [JudgeRequest((("user", "q"),))])[0]
        assert judge.calls == retries + 1
    assert reply.attempts == retries + 1 and reply.error.startswith(f"failed after {retries + 1} attempts: HTTP 503")
