"""Environments and tools that misbehave (raise, hang, answer a megabyte, take arguments of the wrong
type) played through the real EpisodeRunner: each fault stays with its own episode, as a counted and
masked ``error`` within a real deadline, and every other episode goes on and is closed."""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time

import pytest

from rlvr.engines.base import SamplingParams
from rlvr.rollout.env_tokens import TextMessages
from rlvr.rollout.episodes import CHARS_PER_TOKEN_BOUND, EpisodeRunner, episode_metrics, settle_rewards
from rlvr.tasks.base import Problem
from rlvr.tasks.environments import EnvironmentFailure, EnvStep, get_environment
from rlvr.verifiers import get_verifier
from rlvr.verifiers.base import Reward
from tests.test_episodes import EOS, TOKENIZER, ScriptedEngine, ids

SAMPLING = SamplingParams(max_new_tokens=16)
DEADLINE_S = 0.3
HANG = threading.Event()  # never set: what a call that never returns waits on


class Hostile:
    """Per problem id (``"ok"``, ``"raise"``, ``"failure"``, ``"hang"``, ``"open_raise"``, ``"open_hang"``,
    ``"close_raise"``, ``"megabyte"``, ``"garbage"``), an episode that behaves or misbehaves that
    way; one tool message per turn otherwise, then the final answer. Counts the episodes closed."""

    name = "hostile"

    def __init__(self):
        self.opened, self.closed = 0, []

    def episode(self, problem):
        kind = problem.id
        if kind == "open_raise":
            raise KeyError("no such level")
        if kind == "open_hang":
            HANG.wait()
        self.opened += 1
        return HostileEpisode(self, kind)


class HostileEpisode:
    def __init__(self, env, kind):
        self.env, self.kind, self.turn = env, kind, 0

    def step(self, text):
        self.turn += 1
        if self.turn == 1 and self.kind == "raise":
            raise ValueError("board state corrupt " + "x" * 10_000)  # a long message is cut on the record
        if self.turn == 1 and self.kind == "failure":
            raise EnvironmentFailure("sandbox down")
        if self.turn == 1 and self.kind == "hang":
            HANG.wait()
        if self.turn == 1 and self.kind == "megabyte":
            return EnvStep(messages=[{"role": "user", "content": "y" * 1_000_000}])
        if self.turn == 1 and self.kind == "garbage":
            return {"messages": "not an EnvStep"}
        if self.turn == 1:
            return EnvStep(messages=[{"role": "tool", "content": "ok"}], tool_calls=1)
        return EnvStep()

    def close(self):
        self.env.closed.append(self.kind)
        if self.kind == "close_raise":
            raise OSError("socket already closed")


def _problem(kind: str) -> Problem:
    return Problem(id=kind, prompt=[{"role": "user", "content": "2*3="}], reference={"answer": "6"},
                   verifier="numeric", environment="hostile")


def _play(kinds, env=None, n=1, **kwargs):
    env = env or Hostile()
    text = TextMessages(TOKENIZER)
    runner = EpisodeRunner(lambda problem: text, {"hostile": env}, step_timeout_s=DEADLINE_S, **kwargs)
    engine = ScriptedEngine(lambda context, k: ids("6") + [EOS])
    start = time.perf_counter()
    groups = runner.generate(engine, [_problem(k) for k in kinds], [ids("2*3=") for _ in kinds], n, SAMPLING)
    return {k: g for k, g in zip(kinds, groups)}, env, time.perf_counter() - start


def test_any_exception_from_environment_code_ends_only_its_episode_as_a_masked_counted_error():
    kinds = ["ok", "raise", "failure", "open_raise", "close_raise", "garbage"]
    groups, env, _ = _play(kinds, n=2)
    records = {k: [c.episode for c in g] for k, g in groups.items()}
    assert all(r.stop == "eos" and r.turns == 2 and r.error is None for r in records["ok"])  # the others go on
    assert all(r.stop == "error" for k in kinds[1:] for r in records[k])
    assert records["raise"][0].error.startswith("step() raised ValueError: board state corrupt")
    assert len(records["raise"][0].error) <= 500  # the message is kept, not the 10 kB
    assert records["failure"][0].error == "sandbox down"  # EnvironmentFailure keeps its meaning and message
    assert "episode() raised KeyError" in records["open_raise"][0].error
    assert "close() raised OSError: socket already closed" in records["close_raise"][0].error
    assert "step() returned dict" in records["garbage"][0].error and "not an EnvStep" in records["garbage"][0].error
    # every episode that was opened is closed exactly once, the failing ones included
    assert sorted(env.closed) == sorted(k for k in kinds if k != "open_raise" for _ in range(2))
    assert env.opened == len(env.closed)

    flat = [c for k in kinds for c in groups[k]]
    rewards = settle_rewards(flat, [Reward(1.0)] * len(flat))
    assert [r.status for r in rewards] == ["ok"] * 2 + ["error"] * 10  # masked and counted, never a 0
    assert episode_metrics(flat)["env/stop_error"] == pytest.approx(10 / 12)
    assert all(len(c.token_ids) == len(c.loss_mask) == len(c.logprobs) > 0 for c in flat)  # rows still collate


def test_a_step_and_an_episode_start_that_never_return_end_within_the_deadline():
    groups, env, elapsed = _play(["hang", "open_hang", "ok"], workers=2)
    assert elapsed < 3 * DEADLINE_S + 0.5  # one deadline for the starts, one for the steps: nothing waits forever
    hung, never_opened, ok = (g[0].episode for g in groups.values())
    assert hung.stop == "error"
    assert hung.error == f"step() did not return within {DEADLINE_S:g} s (environment.step_timeout_s)"
    assert never_opened.stop == "error" and never_opened.error.startswith("episode() did not return within")
    assert ok.stop == "eos" and ok.turns == 2
    assert sorted(env.closed) == ["hang", "ok"]  # the hung episode is closed too (its step thread is abandoned)


def test_a_megabyte_observation_is_never_tokenised_and_its_episode_is_cut():
    class CountingText(TextMessages):
        longest = 0

        def encode(self, messages):
            CountingText.longest = max(CountingText.longest, sum(len(m["content"]) for m in messages))
            return super().encode(messages)

    text = CountingText(TOKENIZER)
    runner = EpisodeRunner(lambda problem: text, {"hostile": Hostile()}, max_episode_tokens=64)
    engine = ScriptedEngine(lambda context, k: ids("6") + [EOS])
    start = time.perf_counter()
    [[huge], [ok]] = runner.generate(engine, [_problem("megabyte"), _problem("ok")], [ids("x")] * 2, 1, SAMPLING)
    assert time.perf_counter() - start < 0.5
    assert CountingText.longest <= 64 * CHARS_PER_TOKEN_BOUND  # the megabyte was measured, never tokenised
    # a truncated sample (algorithm.overlong masks or shapes it), not an error: the tool quickstart's own
    # policy printing 718**1444 is where such replies come from, and errors count toward max_error_frac
    assert huge.episode.stop == "max_tokens" and huge.finish_reason == "length" and huge.episode.error is None
    assert ok.episode.stop == "eos"


def test_a_reply_that_no_longer_fits_the_budget_is_a_truncated_episode():
    class Chatty:  # a fresh, ordinary-sized reply each turn: the model's turns use the budget up
        def episode(self, problem):
            class Episode:
                def step(self, text):
                    return EnvStep(messages=[{"role": "user", "content": "more " * 6}])
            return Episode()

    text = TextMessages(TOKENIZER)
    runner = EpisodeRunner(lambda problem: text, {"hostile": Chatty()}, max_turns=50, max_episode_tokens=60)
    engine = ScriptedEngine(lambda context, k: ids("go") + [EOS])
    [[episode]] = runner.generate(engine, [_problem("ok")], [ids("x")], 1, SAMPLING)
    assert episode.episode.stop == "max_tokens" and episode.finish_reason == "length"
    assert len(episode.token_ids) <= 60


def test_max_turns_with_a_finished_last_turn_is_scored_on_its_answer():
    """An environment that is never done: the episode ends at max_turns, but the model ended its last
    turn itself, so it is no truncated completion and the verifier reads its final answer."""
    class NeverDone:
        def episode(self, problem):
            class Episode:
                def step(self, text):
                    return EnvStep(messages=[{"role": "user", "content": "are you sure?"}])
            return Episode()

    text = TextMessages(TOKENIZER)
    runner = EpisodeRunner(lambda problem: text, {"hostile": NeverDone()}, max_turns=2, max_episode_tokens=200)
    engine = ScriptedEngine(lambda context, k: ids("6") + [EOS])
    [[episode]] = runner.generate(engine, [_problem("ok")], [ids("2*3=")], 1, SamplingParams(max_new_tokens=32))
    assert episode.episode.stop == "max_turns" and episode.finish_reason == "stop"
    math_verifier = get_verifier("math")
    assert math_verifier.score(episode.text, {"answer": "6"}, finish_reason=episode.finish_reason).score == 1.0
    # what "length" (the finish_reason before) made of the same answer: no explicit final answer, 0
    assert math_verifier.score(episode.text, {"answer": "6"}, finish_reason="length").score == 0.0


# ---------------------------------------------------------------------------------------------
# Typed tools: a deadline, an output cap, arguments checked against the type hints
# ---------------------------------------------------------------------------------------------


def sleep_forever(seconds: int) -> str:
    """Sleep.

    Args:
        seconds: how long.
    """
    HANG.wait()
    return "woke up"


def add(a: int, b: float) -> float:
    """Add two numbers.

    Args:
        a: an integer.
        b: a number.
    """
    return a + b


def flood(n: int) -> str:
    """Print a lot.

    Args:
        n: characters.
    """
    return "z" * n


def _call(name, **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def _tool_turns(*turns):
    """A scripted engine writing ``turns`` in order (the last one, the final answer, again after that)."""
    def reply(context, k):
        seen = sum(1 for token in context if token == EOS)  # each earlier turn ended with EOS
        return ids(turns[min(seen, len(turns) - 1)]) + [EOS]
    return ScriptedEngine(reply)


def test_typed_tools_have_a_deadline_an_output_cap_and_typed_arguments():
    here = __name__
    env = get_environment("tools", tools=[f"{here}:sleep_forever", f"{here}:add", f"{here}:flood"],
                          timeout_s=DEADLINE_S, max_output_chars=40, max_calls_per_turn=4)
    engine = _tool_turns(_call("sleep_forever", seconds=1) + _call("add", a="1", b="2") + _call("add", a=True, b=2)
                         + _call("flood", n=1_000_000), _call("add", a=1, b=2), "3")
    text = TextMessages(TOKENIZER)
    runner = EpisodeRunner(lambda problem: text, {"hostile": env}, max_turns=4, max_episode_tokens=2000,
                           step_timeout_s=DEADLINE_S)  # the environment's own step deadline (4 calls) is longer
    start = time.perf_counter()
    [[episode]] = runner.generate(engine, [_problem("ok")], [ids("x")], 1, SamplingParams(max_new_tokens=400))
    assert time.perf_counter() - start < 2 * DEADLINE_S + 0.5
    record = episode.episode
    first, second = [m["content"] for m in record.messages if m["role"] == "tool"][:4], \
        [m["content"] for m in record.messages if m["role"] == "tool"][4:]
    assert first[0] == f"error: tool 'sleep_forever' did not return within {DEADLINE_S:g} s"
    assert first[1] == "error: bad arguments for 'add': argument 'a' must be an integer, got a string '1'"
    assert first[2] == "error: bad arguments for 'add': argument 'a' must be an integer, got a boolean true"
    assert len(first[3]) < 100 and "characters cut" in first[3]  # a megabyte result keeps its head and tail
    assert second == ["3"]  # an int for a float parameter is fine
    assert record.stop == "eos" and record.tool_calls == 5 and record.tool_errors == 3 and episode.text == "3"


def test_tool_environment_options_are_checked_when_it_is_built():
    for options, field in [({"timeout_s": 0}, "timeout_s"), ({"max_output_chars": 0}, "max_output_chars"),
                           ({"max_calls_per_turn": "2"}, "max_calls_per_turn")]:
        with pytest.raises(ValueError, match=f"environment tools: {field} must be"):
            get_environment("tools", tools=[f"{__name__}:add"], **options)
    env = get_environment("tools", tools=[f"{__name__}:add"], timeout_s=2, max_calls_per_turn=3)
    assert env.step_timeout_s == 3 * (2 + env.CALL_SLACK_S)  # the runner waits for a step at least this long


def test_tools_named_by_import_path_are_found_in_the_current_folder(tmp_path, monkeypatch):
    """The README's example: {tools: [python, "my_tools:lookup"], call_format: json, timeout_s: 5} with
    my_tools.py beside the user, found as a verifier named by import path is."""
    (tmp_path / "my_tools.py").write_text('def lookup(key: str) -> str:\n    """Look a key up.\n\n    Args:\n'
                                          '        key: what to look up.\n    """\n    return key.upper()\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        env = get_environment("tools", tools=["python", "my_tools:lookup"], call_format="json", timeout_s=5)
    finally:
        sys.modules.pop("my_tools", None)  # the next test's folder may hold another my_tools.py
    assert set(env.tools) == {"python", "lookup"} and env.tools["lookup"]("ab") == "AB"
    with pytest.raises(ValueError, match="environment tools: tool 'no_such_tools:lookup': no module named"):
        get_environment("tools", tools=["no_such_tools:lookup"])


# ---------------------------------------------------------------------------------------------
# The run's entry points
# ---------------------------------------------------------------------------------------------


def test_rlvr_eval_goes_on_when_an_environment_raises(tiny_model, tmp_path, capsys):
    from rlvr.cli import main
    from rlvr.tasks.environments import ENVIRONMENTS

    class Raising:  # fails as each episode starts (the random tiny model rarely ends a turn, so no step() runs)
        def episode(self, problem):
            raise RuntimeError("the game server crashed")

    ENVIRONMENTS.register("test_hostile_raising", Raising)
    try:
        code = main(["eval", "--model", str(tiny_model), "--task", "arithmetic", "--task-option", "style=bare",
                     "--task-option", "max_digits=1", "--limit", "2", "--max-new-tokens", "2", "--workers", "0",
                     "--environment", "test_hostile_raising", "--env-messages", "text", "--out", str(tmp_path / "ev")])
    finally:
        ENVIRONMENTS.unregister("test_hostile_raising")
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (tmp_path / "ev" / "results.jsonl").read_text().splitlines()]
    assert [row["status"] for row in rows] == [["error"], ["error"]]  # counted as errors, not wrong answers
    assert all(row["episodes"][0]["error"] == "episode() raised RuntimeError: the game server crashed" for row in rows)


def test_a_jsonl_problem_file_names_an_environment_per_problem(tmp_path):
    from rlvr.tasks import get_task
    from rlvr.verifiers.errors import UserError

    data = tmp_path / "problems.jsonl"
    rows = [{"q": "347*829=", "a": "287663", "env": "python"}, {"q": "1+1=", "a": "2", "env": ""},
            {"q": "2+2=", "a": "4"}]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    suite = get_task("custom", path=str(data), prompt_field="q", answer_field="a", environment_field="env")
    assert [p.environment for p in suite] == ["python", None, None]
    every = get_task("custom", path=str(data), prompt_field="q", answer_field="a", environment="tools")
    assert {p.environment for p in every} == {"tools"}
    (tmp_path / "bad.jsonl").write_text(json.dumps({"q": "1+1=", "a": "2", "env": "pyhton"}) + "\n")
    with pytest.raises(UserError, match=r"bad.jsonl:1: field 'env': unknown environment 'pyhton'; valid environments"):
        get_task("custom", path=str(tmp_path / "bad.jsonl"), prompt_field="q", answer_field="a",
                 environment_field="env")
    with pytest.raises(UserError, match="custom: environment: unknown environment 'nope'"):
        get_task("custom", path=str(data), prompt_field="q", answer_field="a", environment="nope")


class EveryOtherRaises:
    """Fails to start every other episode: half of a step's samples are environment errors."""

    def __init__(self):
        self.started = itertools.count(1)  # next() of a count is atomic: episodes start in several threads

    def episode(self, problem):
        if next(self.started) % 2:
            raise RuntimeError("the game server crashed")
        return HostileEpisode(Hostile(), "ok")


def test_rlvr_train_goes_on_when_an_environment_raises(tiny_model, tmp_path):
    from rlvr.config import RunConfig, build_config
    from rlvr.recipes import grpo
    from rlvr.run.tracking import read_metrics
    from rlvr.tasks.environments import ENVIRONMENTS

    ENVIRONMENTS.register("test_hostile_every_other", EveryOtherRaises)
    try:
        grpo.train(build_config(RunConfig, {
            "out": str(tmp_path), "model": {"path": str(tiny_model)},
            "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
            "environment": {"name": "test_hostile_every_other", "messages": "text", "max_episode_tokens": 8},
            "generation": {"max_new_tokens": 2}, "train": {"steps": 1, "prompts_per_step": 2, "group_size": 2},
            "eval": {"limit": 2}, "checkpoint": {"every": 0}, "log": {"progress": False, "plot": False},
        }, []))
    finally:
        ENVIRONMENTS.unregister("test_hostile_every_other")
    [step] = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] == 1 and "env/stop_error" in r]
    assert step["env/stop_error"] == 0.5  # half the episodes failed, masked and counted; the run went on
    assert (tmp_path / "summary.json").exists()
