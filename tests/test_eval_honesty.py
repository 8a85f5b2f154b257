"""Evaluation says what it could not score, and pass/fail is the verifier's verdict (issue 42, items 5, 9, 12).

* a sample whose verification failed or abstained counts as not correct, and never silently: the status
  counts, ``error_frac`` / ``abstain_frac`` and a warning line that names the suite (all failed: the
  accuracy is called meaningless) come with it, in ``evaluate``, a training run's evaluation and ``rlvr eval``;
* an environment's turn rewards shape the trained reward but never decide pass/fail: a right final answer
  with a turn penalty is right for eval accuracy, pass@k and training's ``reward/accuracy``;
* ``rlvr eval``'s episode flags fail in one line that names the flag.

The engines are scripted and the verifiers real (registered here); only the ``rlvr eval`` runs load a model.
"""

from __future__ import annotations

import json

import pytest

from rlvr.cli import main
from rlvr.config import EvalConfig, GenerationConfig, VerifierConfig
from rlvr.engines.base import Completion, SamplingParams
from rlvr.recipes.step_metrics import step_metrics
from rlvr.rollout.batch import sample_tensors
from rlvr.rollout.evaluate import evaluate, evaluate_suites
from rlvr.rollout.groups import Group, RolloutStats, score_groups
from rlvr.tasks.base import Problem
from rlvr.tasks.environments import EnvStep, register_environment
from rlvr.verifiers import Reward, register_verifier
from rlvr.verifiers.runner import VerifierRunner
from test_episodes import EOS, Echo, ScriptedEngine, ids, problem, runner


@register_verifier("test_honesty_judge_down")
class _JudgeDown:
    """A judge whose server never answers: every item is the verifier's ``error``."""

    name = "test_honesty_judge_down"

    def score(self, completion, reference):
        return Reward(0.0, status="error", info={"error": "judge: connection refused (http://127.0.0.1:9)"})


@register_verifier("test_honesty_mixed")
class _Mixed:
    """1 for the reference answer, 0 otherwise; ``?`` abstains and ``!`` is a failed check (scored 1, not correct)."""

    name = "test_honesty_mixed"

    def score(self, completion, reference):
        if completion == "?":
            return Reward(0.0, status="abstain")
        if completion == "!":
            return Reward(1.0, status="error", info={"error": "checker crashed"})
        return Reward(float(completion == reference["answer"]))


class _Scripted:
    """Problem i gets the completions SCRIPT[i] (one batch of prompts per call)."""

    def __init__(self, script):
        self.script, self.done = script, 0

    def generate(self, prompts, n, sampling):
        out = [[Completion([1], text, [-0.1], "stop") for text in self.script[self.done + i][:n]]
               for i in range(len(prompts))]
        self.done += len(prompts)
        return out


def _problems(verifier: str, answers: list[str]) -> list[Problem]:
    return [Problem(f"p/{i}", [{"role": "user", "content": "q"}], {"answer": a}, verifier)
            for i, a in enumerate(answers)]


SAMPLING = SamplingParams(max_new_tokens=16)


# ---------------------------------------------------------------------------------------------
# Item 5: statuses are reported, never silently counted as wrong
# ---------------------------------------------------------------------------------------------


def test_an_evaluation_whose_judge_fails_every_call_says_its_accuracy_is_meaningless():
    problems = _problems("test_honesty_judge_down", ["1", "2"])
    result = evaluate(_Scripted([["1", "1"], ["2", "0"]]), lambda p: [5], problems, VerifierRunner(workers=0),
                      sampling=SAMPLING, samples=2)
    assert result.accuracy == 0.0 and result.status == {"error": 4}
    assert result.error_frac == 1.0 and result.abstain_frac == 0.0 and result.scored_accuracy is None
    line = result.status_warning("judged (test)")
    assert "\n" not in line and "judged (test)" in line and "none of the 4 samples was scored (error 4)" in line
    assert "meaningless" in line and "connection refused" in line  # what happened, and why
    summary = result.summary()
    assert summary["error_frac"] == 1.0 and summary["status"] == {"error": 4} and summary["scored_accuracy"] is None


def test_unscored_samples_count_as_not_correct_and_are_counted_apart():
    """Three problems x two samples: one abstains, one failed check carries a score of 1 (not correct)."""
    problems = _problems("test_honesty_mixed", ["7", "5", "9"])
    result = evaluate(_Scripted([["7", "?"], ["5", "!"], ["9", "1"]]), lambda p: [5], problems,
                      VerifierRunner(workers=0), sampling=SAMPLING, samples=2, ks=(1, 2))
    assert result.status == {"ok": 4, "abstain": 1, "error": 1}
    assert result.accuracy == pytest.approx(3 / 6) and result.pass_at_k[2] == 1.0
    assert result.scored_accuracy == pytest.approx(3 / 4)  # over the four the verifier scored
    assert result.error_frac == pytest.approx(1 / 6) and result.abstain_frac == pytest.approx(1 / 6)
    assert result.mean_score == pytest.approx(3 / 6)  # the failed check's score of 1 is no reward
    line = result.status_warning("mixed")
    assert "2 of 6 samples were not scored (abstain 1, error 1)" in line and "0.7500 over the 4 scored" in line
    assert evaluate(_Scripted([["7"]]), lambda p: [5], problems[:1], VerifierRunner(workers=0),
                    sampling=SAMPLING).status_warning("clean") is None


def test_a_training_runs_evaluation_logs_statuses_and_warns():
    suites = {"good": _problems("test_honesty_mixed", ["1", "2"]), "judged": _problems("test_honesty_mixed", ["3"])}
    lines: list[str] = []
    metrics = evaluate_suites(_Scripted([["1"], ["0"], ["!"]]), lambda p: [5], suites, VerifierRunner(workers=0),
                              eval_config=EvalConfig(), generation=GenerationConfig(max_new_tokens=4),
                              verifier=VerifierConfig(), warn=lines.append)
    assert metrics["eval/good/accuracy"] == 0.5 and metrics["eval/judged/accuracy"] == 0.0  # the names of before
    assert metrics["eval/accuracy"] == 0.25 and metrics["eval/good/mean_score"] == 0.5
    assert metrics["eval/good/error_frac"] == 0.0 and metrics["eval/good/status_ok"] == 2.0
    assert metrics["eval/judged/error_frac"] == 1.0 and metrics["eval/judged/status_error"] == 1.0
    assert metrics["eval/judged/abstain_frac"] == 0.0 and "eval/judged/scored_accuracy" not in metrics
    assert metrics["eval/good/scored_accuracy"] == 0.5
    assert len(lines) == 1 and "eval judged:" in lines[0] and "meaningless" in lines[0]


# ---------------------------------------------------------------------------------------------
# Item 9: turn rewards shape the reward, the verifier decides pass/fail
# ---------------------------------------------------------------------------------------------


def test_a_turn_penalty_never_turns_a_right_answer_wrong():
    """Every sample answers 6 (right) after one tool round; the environment charges -0.1 a turn."""
    engine = ScriptedEngine(lambda context, k: ids("6") + [EOS])
    episodes, _ = runner(Echo(rounds=1, reward=-0.1))
    result = evaluate(engine, lambda p: ids("2*3="), [problem()], VerifierRunner(workers=0), sampling=SAMPLING,
                      samples=2, ks=(1, 2), episodes=episodes, keep_records=True)
    assert result.accuracy == 1.0 and result.pass_at_k == {1: 1.0, 2: 1.0}
    assert result.mean_score == pytest.approx(0.8)  # the penalty still shapes the score: 1 - 2 x 0.1
    assert result.records[0]["correct"] == 2 and result.records[0]["verifier_scores"] == [1.0, 1.0]

    # training, as a step scores its groups: one turn each, 6 (right) and 5 (wrong), -0.1 for the turn
    engine = ScriptedEngine(lambda context, k: (ids("6") if k == 0 else ids("5")) + [EOS])
    episodes, _ = runner(Echo(rounds=0, reward=-0.1))
    groups = [Group("s", problem(), ids("2*3="),
                    episodes.generate(engine, [problem()], [ids("2*3=")], 2, SAMPLING)[0])]
    score_groups(VerifierRunner(workers=0), groups, None, None)
    assert [r.score for r in groups[0].rewards] == pytest.approx([0.9, -0.1])  # trained on the shaped reward
    for threshold in (None, 1.0):  # binary verifier without a threshold, and with one
        samples = sample_tensors(groups, on_failure="mask", success_threshold=threshold, overlong="none",
                                 max_new_tokens=16, overlong_buffer=4, overlong_penalty=1.0)
        assert samples.correct.tolist() == [[True, False]], threshold
        metrics = step_metrics(groups, samples, RolloutStats(), {}, None, False)
        assert metrics["reward/accuracy"] == 0.5 and metrics["reward/env"] == pytest.approx(-0.1)
        assert metrics["reward/mean"] == pytest.approx(0.4)


def test_a_turn_reward_that_is_not_finite_is_the_environments_error():
    engine = ScriptedEngine(lambda context, k: ids("6") + [EOS])
    episodes, _ = runner(Echo(rounds=0, reward=float("inf")))
    result = evaluate(engine, lambda p: ids("2*3="), [problem()], VerifierRunner(workers=0), sampling=SAMPLING,
                      episodes=episodes)
    assert result.status == {"error": 1} and "not a finite number" in result.first_error


# ---------------------------------------------------------------------------------------------
# Item 12: rlvr eval's episode flags fail in one line that names the flag
# ---------------------------------------------------------------------------------------------


@register_environment("test_honesty_picky")
class _Picky:
    """An environment plugin that refuses an option value with a plain ValueError."""

    name = "test_honesty_picky"

    def __init__(self, level: int = 1):
        if level < 1:
            raise ValueError(f"level must be at least 1, got {level}")

    def episode(self, problem):
        class Episode:
            def step(self, text):
                return EnvStep()

        return Episode()


@pytest.fixture
def model_folder(tmp_path):
    """A folder that passes the model-folder check: these mistakes are refused before any model loads."""
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


@pytest.mark.parametrize("flags, expected", [
    (["--environment", "pythn"], "--environment: unknown environment 'pythn'; valid environments: python"),
    (["--environment", "python", "--env-option", "bogus=1"],
     "--env-option: environment 'python': unknown option(s) bogus"),
    (["--env-option", "bogus=1"], "--env-option: environment 'python': unknown option(s) bogus; valid options:"),
    (["--environment", "test_honesty_picky", "--env-option", "level=0"], "level must be at least 1, got 0"),
    (["--max-turns", "0"], "--max-turns: "),
])
def test_eval_episode_flag_mistakes_are_one_line(model_folder, capsys, flags, expected):
    code = main(["eval", "--model", str(model_folder), "--task", "tool_arithmetic", "--limit", "1", *flags])
    err = capsys.readouterr().err
    assert code == 2 and expected in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 2  # the line, and the --debug hint
    if "level" in expected:
        assert "--env-option" in err and "test_honesty_picky" in err


def test_eval_names_its_own_flag_when_the_chat_template_cannot_carry_episodes(tiny_model, capsys):
    """The tiny model's chat template ends no assistant turn with its end-of-turn token: refused before
    the model loads, with the fix spelled as this command's flags (not a training config's keys)."""
    code = main(["eval", "--model", str(tiny_model), "--task", "tool_arithmetic", "--limit", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "set --env-messages text, or give a prefix-preserving --chat-template file" in err
    assert "environment.messages" not in err


def test_eval_prints_statuses_and_warns_when_nothing_was_scored(tiny_model, tmp_path, capsys):
    code = main(["eval", "--model", str(tiny_model), "--task", "arithmetic", "--task-option", "style=bare",
                 "--limit", "2", "--max-new-tokens", "2", "--workers", "0", "--verifier", "test_honesty_judge_down",
                 "--out", str(tmp_path / "eval")])
    captured = capsys.readouterr()
    assert code == 0
    assert "verifier status: ok 0, error 2   (error_frac 1.0000, abstain_frac 0.0000)" in captured.out
    assert "none of the 2 samples was scored (error 2)" in captured.err and "meaningless" in captured.err
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["error_frac"] == 1.0 and summary["status"] == {"error": 2}
    assert "connection refused" in summary["first_error"]
    record = json.loads((tmp_path / "eval" / "results.jsonl").read_text().splitlines()[0])
    assert record["errors"][0].startswith("judge: connection refused")
