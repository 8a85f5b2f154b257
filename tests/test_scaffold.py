"""The recipe scaffold (rlvr/recipes/scaffold.py): Ctrl-C saves a checkpoint at the end of the step and says
how to resume, a second Ctrl-C aborts at once, every recipe resumes to where an uninterrupted run ends,
an early stop is kept across a resume, and SFT measures its final model."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from rlvr.config import DPOConfig, SFTConfig, build_config
from rlvr.recipes import dpo, sft
from rlvr.recipes.scaffold import RunInterrupted
from rlvr.run.checkpoint import list_checkpoints
from rlvr.run.tracking import read_metrics


def _sft_config(out, model, **sections):
    raw = {"out": str(out), "model": {"path": str(model)},
           "data": {"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}, "limit": 200},
           "optim": {"lr": 3e-3}, "train": {"steps": 8, "batch_size": 16, "threads": 1},
           "eval": {"every": 0, "at_end": False, "limit": 20, "max_new_tokens": 3},
           "checkpoint": {"every": 100}, "log": {"progress": False, "plot": False}}
    raw.update(sections)
    return build_config(SFTConfig, raw)


def _signal_at(monkeypatch, module, step_count: int, signals: int = 1):
    """Send SIGINT to this process ``signals`` times while step ``step_count`` runs (from the recipe's
    optimizer step, as a user's Ctrl-C would arrive mid-step)."""
    real = module.optimizer_step
    calls = {"n": 0}

    def step(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == step_count:
            for _ in range(signals):
                os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "optimizer_step", step)


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.fixture(autouse=True)
def default_sigint():
    """SIGINT at Python's default handler for the test, and as it was afterwards: a pytest started as a
    background job of a non-interactive shell (as CI starts it) inherits SIGINT ignored, and keeps it so."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_saves_the_step_says_how_to_resume_and_the_resume_ends_where_an_unbroken_run_ends(
        tiny_model, tmp_path, monkeypatch):
    sft.train(_sft_config(tmp_path / "whole", tiny_model))
    _signal_at(monkeypatch, sft, 3)
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(RunInterrupted) as caught:
        sft.train(_sft_config(tmp_path / "cut", tiny_model))
    assert len(os.listdir("/proc/self/fd")) == fds  # metrics.jsonl closed (its file stayed open until collected)
    message = str(caught.value)
    assert message == (f"interrupted after step 3: checkpoint {tmp_path / 'cut' / 'checkpoints' / 'step_000003'} saved; "
                       f"resume with: rlvr sft --resume {tmp_path / 'cut'}")
    assert [p.name for p in list_checkpoints(tmp_path / "cut")] == ["step_000003"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is gone with the run
    monkeypatch.undo()

    summary = sft.train(_sft_config(tmp_path / "cut", tiny_model), resume=True)
    assert summary["steps"] == 8
    whole, cut = read_metrics(tmp_path / "whole" / "metrics.jsonl"), read_metrics(tmp_path / "cut" / "metrics.jsonl")
    assert [r["step"] for r in cut] == list(range(1, 9))  # one line per step across the two parts
    assert [r["train/loss"] for r in cut] == [r["train/loss"] for r in whole]
    a, b = _weights(tmp_path / "whole" / "final"), _weights(tmp_path / "cut" / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_signal_inherited_ignored_stays_ignored_while_a_run_listens():
    """`rlvr train ... &` from a script: the shell starts it with SIGINT ignored, so that a Ctrl-C meant
    for the foreground program does not stop it; the run keeps it ignored and still listens for SIGTERM."""
    from rlvr.recipes.scaffold import _Signals

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with _Signals().installed(print):
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert callable(signal.getsignal(signal.SIGTERM))
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_a_second_ctrl_c_aborts_at_once_and_names_the_last_checkpoint(tiny_model, tmp_path, monkeypatch):
    config = _sft_config(tmp_path / "run", tiny_model, checkpoint={"every": 2})
    _signal_at(monkeypatch, sft, 5, signals=2)
    with pytest.raises(RunInterrupted) as caught:
        sft.train(config)
    assert str(caught.value) == (f"aborted; the last checkpoint is {tmp_path / 'run' / 'checkpoints' / 'step_000004'}; "
                                 f"resume with: rlvr sft --resume {tmp_path / 'run'}")
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step_000004"]  # step 5 was not finished
    assert len(read_metrics(tmp_path / "run" / "metrics.jsonl")) == 4


def test_an_abort_before_any_checkpoint_says_to_start_again(tiny_model, tmp_path, monkeypatch):
    _signal_at(monkeypatch, sft, 2, signals=2)
    with pytest.raises(RunInterrupted) as caught:
        sft.train(_sft_config(tmp_path / "run", tiny_model))
    assert str(caught.value) == (f"aborted before {tmp_path / 'run'} held a checkpoint; start it again with: "
                                 f"rlvr sft {tmp_path / 'run' / 'config.yaml'} --overwrite")


def test_an_early_stop_is_kept_when_the_run_is_resumed(tiny_model, tmp_path):
    config = _sft_config(tmp_path / "run", tiny_model, train={"steps": 40, "batch_size": 16, "threads": 1},
                         eval={"every": 2, "limit": 20, "max_new_tokens": 3, "stop_at_accuracy": 0.01})
    first = sft.train(config)
    stop = first["steps"]
    assert stop < 40 and first["stopped"].startswith("eval.stop_at_accuracy") and first["eval_accuracy"] >= 0.01
    again = sft.train(config, resume=True)  # nothing left to do: the stop is in the checkpoint
    assert again["steps"] == stop and len(read_metrics(tmp_path / "run" / "metrics.jsonl")) == stop


def test_sft_measures_its_final_model(tiny_model, tmp_path):
    """eval_accuracy was null without eval.every, or an older step's accuracy for the final model."""
    never = sft.train(_sft_config(tmp_path / "a", tiny_model, eval={"every": 0, "limit": 20, "max_new_tokens": 3}))
    last = read_metrics(tmp_path / "a" / "metrics.jsonl")[-1]
    assert never["eval_accuracy"] is not None and last["eval/accuracy"] == never["eval_accuracy"] and last["step"] == 8
    odd = sft.train(_sft_config(tmp_path / "b", tiny_model, eval={"every": 3, "limit": 20, "max_new_tokens": 3}))
    measured = [r["step"] for r in read_metrics(tmp_path / "b" / "metrics.jsonl") if "eval/accuracy" in r]
    assert measured == [3, 6, 8] and odd["eval_accuracy"] is not None


def _pairs(path, n=48):
    rows = [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)}
            for a in range(8) for b in range(6)][:n]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_dpo_resumes_to_where_an_unbroken_run_ends(tiny_model, tmp_path, monkeypatch):
    data = _pairs(tmp_path / "pairs.jsonl")

    def config(out):
        return build_config(DPOConfig, {
            "out": str(out), "model": {"path": str(tiny_model)}, "data": {"path": str(data), "eval_fraction": 0.2},
            "optim": {"lr": 3e-3}, "train": {"epochs": 2, "batch_size": 8, "threads": 1},
            "checkpoint": {"every": 100}, "log": {"progress": False, "plot": False}})

    whole = dpo.train(config(tmp_path / "whole"))
    _signal_at(monkeypatch, dpo_pairs_module(), 4)
    with pytest.raises(RunInterrupted, match="resume with: rlvr dpo --resume"):
        dpo.train(config(tmp_path / "cut"))
    monkeypatch.undo()
    resumed = dpo.train(config(tmp_path / "cut"), resume=True)
    assert resumed["implicit_accuracy"] == whole["implicit_accuracy"] and resumed["margin"] == whole["margin"]
    assert resumed["logp_chosen_before"] == whole["logp_chosen_before"]  # the start's evaluation came back too
    a, b = _weights(tmp_path / "whole" / "final"), _weights(tmp_path / "cut" / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)


def dpo_pairs_module():
    from rlvr.recipes import pairs

    return pairs
