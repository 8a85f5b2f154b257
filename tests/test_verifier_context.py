"""Every verifier sees the whole sample (prompt, completion, reference, finish reason) the same way
in training, ``rlvr eval`` and ``rlvr verify``; and a verifier's failure cannot hide."""

from __future__ import annotations

import json
import logging

import pytest

from rlvr.verifiers import Reward, Verifier, register_verifier
from rlvr.verifiers.base import context_fields, score_sample
from rlvr.verifiers.runner import VerifierRunner


@register_verifier("test_sees_the_sample")
class SeesTheSample(Verifier):
    """1.0 when the prompt arrived as chat messages and the finish reason as stop/length."""

    def score(self, completion, reference, *, prompt=None, finish_reason=None):
        ok = (isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict)
              and prompt[-1].get("role") == "user" and bool(prompt[-1].get("content"))
              and finish_reason in ("stop", "length"))
        return Reward(float(ok), info={"prompt": prompt, "finish_reason": finish_reason, "extracted": completion})


@register_verifier("test_always_raises")
class AlwaysRaises(Verifier):
    def score(self, completion, reference):
        raise RuntimeError("the reference has no 'needle' (a verifier bug)")


@register_verifier("test_raises_on_long")
class RaisesOnLong(Verifier):
    """Errors on completions of 3+ characters, scores 1 otherwise: some errors, not most."""

    def score(self, completion, reference):
        if len(completion) >= 3:
            raise ValueError("too long for me")
        return Reward(1.0)


def test_context_fields_are_taken_only_by_verifiers_that_declare_them():
    class Plain:
        def score(self, completion, reference):
            return 1.0

    class Anything:
        def score(self, completion, reference, **context):
            return len(context)

    assert context_fields(Plain()) == () and context_fields(SeesTheSample()) == ("prompt", "finish_reason")
    context = {"prompt": [{"role": "user", "content": "q"}], "finish_reason": "stop"}
    assert score_sample(Plain(), "c", {}, context) == 1.0  # called without them
    assert score_sample(Anything(), "c", {}, context) == 2


@pytest.mark.parametrize("workers", [0, 1])
def test_the_runner_passes_prompt_and_finish_reason(workers):
    prompt = [{"role": "user", "content": "What is 2+2?"}]
    with VerifierRunner(workers=workers) as runner:
        rewards = runner.score_batch("test_sees_the_sample", ["4", "4"], [{}, {}], prompts=[prompt, prompt],
                                     finish_reasons=["stop", "length"])
    assert [r.score for r in rewards] == [1.0, 1.0]
    assert rewards[0].info["prompt"] == prompt and rewards[1].info["finish_reason"] == "length"


def test_the_cache_tells_samples_apart_by_their_context():
    prompt = [{"role": "user", "content": "q"}]
    with VerifierRunner(workers=0) as runner:
        first = runner.score_batch("test_sees_the_sample", ["4"], [{}], prompts=[prompt], finish_reasons=["stop"])
        other = runner.score_batch("test_sees_the_sample", ["4"], [{}], prompts=[None], finish_reasons=["stop"])
    assert first[0].score == 1.0 and other[0].score == 0.0  # not served the first one's cached reward


def test_training_gives_every_verifier_the_prompt_and_finish_reason(taught_model, tmp_path):
    from rlvr.recipes import grpo
    from rlvr.config import RunConfig, build_config
    from rlvr.run.tracking import read_metrics

    config = build_config(RunConfig, {
        "out": str(tmp_path), "model": {"path": str(taught_model)},
        "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
        "verifier": {"name": "test_sees_the_sample", "workers": 1},
        "generation": {"max_new_tokens": 3}, "train": {"steps": 1, "prompts_per_step": 4, "group_size": 2},
        "eval": {"at_start": False, "at_end": True, "limit": 4}, "log": {"progress": False, "plot_every": 0},
    })
    grpo.train(config)
    record = read_metrics(tmp_path / "metrics.jsonl")[-1]
    assert record["reward/mean"] == 1.0 and record["eval/accuracy"] == 1.0


def test_rlvr_eval_gives_the_prompt_and_finish_reason(taught_model, tmp_path, capsys):
    from rlvr.cli import main

    code = main(["eval", "--model", str(taught_model), "--task", "arithmetic", "--task-option", "style=bare",
                 "--task-option", "max_digits=1", "--limit", "4", "--max-new-tokens", "3", "--verifier",
                 "test_sees_the_sample", "--workers", "0", "--out", str(tmp_path)])
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["accuracy"] == 1.0


def test_rlvr_verify_reads_prompt_and_finish_reason_from_the_line(tmp_path, capsys):
    from rlvr.cli import main

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in [
        {"completion": "4", "prompt": "What is 2+2?", "finish_reason": "stop", "answer": "4"},
        {"completion": "4", "prompt": [{"role": "user", "content": "2+2?"}], "finish_reason": "length"},
        {"completion": "4", "answer": "4"},  # no prompt: the verifier sees None
    ]))
    out = tmp_path / "out.jsonl"
    assert main(["verify", "--verifier", "test_sees_the_sample", "--input", str(src), "--output", str(out),
                 "--workers", "0"]) == 0
    rewards = [json.loads(line)["reward"] for line in out.read_text().splitlines()]
    assert [r["score"] for r in rewards] == [1.0, 1.0, 0.0]
    assert rewards[0]["info"]["prompt"] == [{"role": "user", "content": "What is 2+2?"}]


def test_the_trl_adapter_receives_the_prompt():
    """Before: rollout passed only the reference, so every TRL function saw prompts == [""]."""
    from rlvr.verifiers import from_trl

    seen = []

    def reward(prompts, completions, **kwargs):
        seen.append((prompts, kwargs.get("finish_reason")))
        return [1.0]

    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    with VerifierRunner(workers=0) as runner:
        runner.cache.clear()
        plain = from_trl(reward, name="trl_plain")
        score_sample(plain, "4", {}, {"prompt": prompt, "finish_reason": "stop"})
        chat = from_trl(reward, conversational=True)
        score_sample(chat, "4", {}, {"prompt": prompt})
    assert seen[0] == (["Be brief.\n\n2+2?"], ["stop"])
    assert seen[1][0] == [prompt]


def test_a_verifier_that_always_raises_stops_the_run_with_its_error(taught_model, tmp_path, capsys):
    """Before: loss 0 for the whole run, exit 0, the error never shown (only a zero-variance alarm)."""
    from rlvr.cli import main
    import yaml

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({
        "out": str(tmp_path / "run"), "model": {"path": str(taught_model)},
        "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
        "verifier": {"name": "test_always_raises", "workers": 1},
        "generation": {"max_new_tokens": 3}, "train": {"steps": 5, "prompts_per_step": 2, "group_size": 2},
        "eval": {"at_start": False, "at_end": False}, "log": {"progress": False, "plot_every": 0},
    }))
    code = main(["train", str(cfg)])
    out, err = capsys.readouterr()
    assert code == 2
    assert "Traceback" in out and "RuntimeError: the reference has no 'needle'" in out  # the first one, once
    assert out.count("Traceback") == 1
    assert ("verifier 'test_always_raises' failed on 4 of 4 samples at step 1 (100%), more than verifier.max_error_frac=0.5: "
            "RuntimeError: the reference has no 'needle'") in err


def test_some_errors_are_counted_and_shown_once_without_stopping(taught_model, tmp_path, capsys):
    from rlvr.recipes import grpo
    from rlvr.config import RunConfig, build_config
    from rlvr.run.tracking import read_metrics

    config = build_config(RunConfig, {
        "out": str(tmp_path), "model": {"path": str(taught_model)},
        "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
        "verifier": {"name": "test_raises_on_long", "workers": 0, "max_error_frac": 1.0},
        "generation": {"max_new_tokens": 3}, "train": {"steps": 3, "prompts_per_step": 4, "group_size": 2},
        "eval": {"at_start": False, "at_end": False}, "log": {"progress": False, "plot_every": 0},
    })
    grpo.train(config)
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "verify/error_frac" in r]
    assert len(records) == 3 and all(0 <= r["verify/error_frac"] <= 1 for r in records)
    out = capsys.readouterr().out
    if any(r["verify/error_frac"] > 0 for r in records):
        assert out.count("ValueError: too long for me") == 1


def test_a_score_given_as_text_is_the_verifiers_error_not_a_reward():
    """Before: Reward("1.0") was coerced to 1.0 silently."""
    with pytest.raises(TypeError, match="Reward.score must be a number, got str '1.0'"):
        Reward("1.0")

    class TextScore:
        def score(self, completion, reference):
            return Reward("1.0")

    from rlvr.verifiers.runner import _score_here

    reward = _score_here(TextScore(), "x", {})
    assert reward.status == "error" and "must be a number" in reward.info["error"]


def test_an_implausible_reward_is_warned_about_once(caplog):
    @register_verifier("test_huge_reward", overwrite=True)
    class Huge(Verifier):
        def score(self, completion, reference):
            return Reward(1e9)

    with VerifierRunner(workers=0) as runner, caplog.at_level(logging.WARNING, logger="rlvr.verifiers.runner"):
        runner.score_batch("test_huge_reward", ["a", "b"], [{}, {}])
        runner.score_batch("test_huge_reward", ["c"], [{}])
    warnings = [r for r in caplog.records if "1e+09" in r.getMessage()]
    assert len(warnings) == 1 and "test_huge_reward" in warnings[0].getMessage()


def test_numeric_gives_no_answer_for_a_cut_off_completion():
    """Its last number is wherever the budget ran out: '35' of '352...', or a number mid-reasoning."""
    from rlvr.verifiers import get_verifier

    numeric = get_verifier("numeric")
    assert numeric.score("352", {"answer": "352"}, finish_reason="stop").score == 1.0
    assert numeric.score("352", {"answer": "352"}).score == 1.0  # unknown finish reason: as before
    cut = numeric.score("so far 352, then", {"answer": "352"}, finish_reason="length")
    assert cut.score == 0.0 and cut.info["extracted"] is None
    lenient = get_verifier("numeric", allow_truncated=True)
    assert lenient.score("352", {"answer": "352"}, finish_reason="length").score == 1.0
