"""Metrics file, plots, alarms and checkpoint atomicity."""

import json

import pytest
import torch

from rlvr.run.checkpoint import latest_checkpoint, list_checkpoints, load_trainer_state, save_checkpoint
from rlvr.run.alarms import Alarms
from rlvr.run.tracking import Tracker, plot_metrics, read_metrics


def test_tracker_flushes_each_step_and_truncates_on_resume(tmp_path):
    tracker = Tracker(tmp_path)
    for step in range(1, 6):
        tracker.log(step, {"reward/mean": step / 10, "train/kl_ref": torch.tensor(0.01 * step)})
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 5  # readable before close: nothing lost on a crash
    tracker.truncate(3)
    tracker.log(4, {"reward/mean": 0.0})
    tracker.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]
    assert read_metrics(tmp_path / "metrics.jsonl")[1]["train/kl_ref"] == pytest.approx(0.02)


def test_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1}) + "\n" + '{"step": 2, "rew')
    assert read_metrics(path) == [{"step": 1}]


def test_plot_draws_a_png(tmp_path):
    tracker = Tracker(tmp_path)
    for step in range(20):
        tracker.log(step, {"reward/mean": step / 20, "reward/accuracy": step / 30, "train/entropy": 1 - step / 40,
                           "response/length_mean": 4.0, "response/length_max": 5.0})
    tracker.close()
    out = plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "metrics.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_alarms_fire_after_patience_once_per_streak():
    alarms = Alarms(patience=3)
    bad = {"rollout/zero_variance_frac": 0.95, "response/truncation_rate": 0.1}
    assert alarms.update(1, bad) == [] and alarms.update(2, bad) == []
    fired = alarms.update(3, bad)
    assert len(fired) == 1 and "zero_variance" in fired[0]
    assert alarms.update(4, bad) == []  # no repeat within the streak
    alarms.update(5, {"rollout/zero_variance_frac": 0.2})
    for step in range(6, 9):
        fired = alarms.update(step, {"response/truncation_rate": 0.6, "verify/no_answer_frac": 0.95})
    assert {m.split()[1] for m in fired} == {"truncation", "no_extraction"}
    state = alarms.state_dict()
    restored = Alarms(patience=3)
    restored.load_state_dict(state)
    assert restored.fired == alarms.fired


class _Saveable:
    def __init__(self):
        self.weight = torch.nn.Linear(2, 2)

    def save_pretrained(self, path):
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.weight.state_dict(), path / "w.pt")


def test_checkpoints_are_atomic_and_pruned(tmp_path):
    model = _Saveable()
    optimizer = torch.optim.AdamW(model.weight.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    for step in (2, 4, 6):
        save_checkpoint(tmp_path, step, models={"policy": model, "critic": _Saveable()}, tokenizer=_Saveable(),
                        states={"optimizer": optimizer, "scheduler": scheduler}, extra={"sampler": {"position": step}},
                        keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000004", "step_000006"]
    (tmp_path / "checkpoints" / ".tmp_step_000008").mkdir()  # a crash mid-write leaves only a temp folder
    (tmp_path / "checkpoints" / "step_000010").mkdir()  # or a folder without its state file
    assert latest_checkpoint(tmp_path).name == "step_000006"
    assert load_trainer_state(latest_checkpoint(tmp_path))["sampler"] == {"position": 6}
    assert (latest_checkpoint(tmp_path) / "critic" / "w.pt").is_file()  # every named model in its own folder
    assert "optimizer" in load_trainer_state(latest_checkpoint(tmp_path))


def test_restoring_a_checkpoint_written_by_another_recipe_names_what_is_missing(tmp_path):
    from rlvr.run.checkpoint import restore_states
    from rlvr.run.folder import RunFolderError

    model = _Saveable()
    optimizer = torch.optim.AdamW(model.weight.parameters())
    path = save_checkpoint(tmp_path, 1, models={"policy": model}, tokenizer=_Saveable(), states={"optimizer": optimizer},
                           extra={})
    with pytest.raises(RunFolderError, match="holds no state for critic_optimizer"):
        restore_states(path, {"optimizer": optimizer, "critic_optimizer": optimizer})
