"""Progress without a terminal is a few plain lines, never carriage-return redraws."""

from __future__ import annotations

import io

from rlvr.run.progress import PlainProgress, make_progress as progress


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_without_a_terminal_a_line_every_tenth_of_the_run(monkeypatch):
    monkeypatch.delenv("RLVR_PROGRESS", raising=False)
    log = io.StringIO()
    bar = progress(600, "grpo", stream=log)
    assert isinstance(bar, PlainProgress)
    for step in range(600):
        bar.update(1)
        bar.set_postfix(reward=f"{step / 600:.3f}")
    bar.close()
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 10  # every 60 steps, the last one included once
    assert lines[0].startswith("grpo: step 60/600 (10%)") and "reward=0.097" in lines[0]  # the postfix set before the 60th update
    assert lines[-1].startswith("grpo: step 600/600 (100%)")


def test_a_line_at_least_every_interval(monkeypatch):
    clock = iter(float(t) for t in range(0, 1000, 40))  # 40 s per step
    monkeypatch.setattr("rlvr.run.progress.time.monotonic", lambda: next(clock))
    log = io.StringIO()
    bar = PlainProgress(100, "sft", stream=log, interval_s=30)
    bar.update(1)
    bar.update(1)
    assert log.getvalue().count("\n") == 2 and "eta" in log.getvalue()


def test_a_terminal_gets_the_live_bar_and_the_switch_forces_either(monkeypatch):
    monkeypatch.delenv("RLVR_PROGRESS", raising=False)
    assert not isinstance(progress(10, "x", stream=Tty()), PlainProgress)
    monkeypatch.setenv("RLVR_PROGRESS", "plain")
    assert isinstance(progress(10, "x", stream=Tty()), PlainProgress)
    monkeypatch.setenv("RLVR_PROGRESS", "bar")
    assert not isinstance(progress(10, "x", stream=io.StringIO()), PlainProgress)
    assert progress(10, "x", enabled=False) is None


def test_resumed_runs_count_from_where_they_were():
    log = io.StringIO()
    bar = PlainProgress(100, "grpo", initial=90, stream=log, every=5)
    for _ in range(10):
        bar.update(1)
    assert log.getvalue().splitlines()[0].startswith("grpo: step 95/100")


def test_a_stop_rule_makes_the_eta_an_upper_bound(monkeypatch):
    """Issue 42 item 24: SFT's ETA was the step cap's time as if the run would reach it; with
    eval.stop_at_accuracy it may stop far sooner, so the time is said to be a bound, with the rule."""
    clock = iter(float(t) for t in range(0, 1000, 10))  # 10 s per step
    monkeypatch.setattr("rlvr.run.progress.time.monotonic", lambda: next(clock))
    log = io.StringIO()
    bar = PlainProgress(100, "sft", stream=log, every=1, until="eval accuracy 0.3")
    bar.update(1)
    assert "eta at most 16m (stops at eval accuracy 0.3)" in log.getvalue()
