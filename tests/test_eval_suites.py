"""The held-out suites of ``rlvr train`` (rlvr/rollout/suites.py): an ``eval.tasks`` entry without a
``split`` evaluates the suite's held-out split, not the training split, and a warning about an eval
suite that shares prompts with the training data names its split and a fix the user has not tried."""

from __future__ import annotations

import json

from rlvr.config import RunConfig, build_config
from rlvr.rollout.suites import describe_suites, eval_entries, load_eval_suites, load_training_suites
from rlvr.tasks.registry import held_out_split


def _config(*overrides: str, data: list | None = None) -> RunConfig:
    return build_config(RunConfig, {"model": {"path": "m"}, "data": data or [{"task": "arithmetic"}]}, list(overrides))


def test_an_eval_entry_without_a_split_reads_the_held_out_split():
    config = _config("eval.tasks=[{task: arithmetic}, {task: arithmetic, split: dev}, {task: arithmetic, split: train}]")
    assert [e.split for e in eval_entries(config)] == ["test", "dev", "train"]
    assert [getattr(s, "split", None) for s in load_eval_suites(config).values()] == ["test", "dev", "train"]


def test_the_default_eval_reads_the_first_training_suites_test_split():
    (entry,) = eval_entries(_config())
    assert entry.task == "arithmetic" and entry.split == "test" and entry.limit == 200


def test_held_out_split_of_each_kind_of_suite():
    assert held_out_split("arithmetic") == "test"   # train, dev, test
    assert held_out_split("humaneval") == "test"    # test only
    assert held_out_split("custom") == "test"       # any split of the user's data: test.jsonl of a folder


def test_training_prompts_in_an_eval_suite_warn_with_the_split_and_the_fix():
    config = _config("eval.tasks=[{task: arithmetic, split: train}]")
    lines = describe_suites(config, load_training_suites(config.data)[0], load_eval_suites(config))
    (warning,) = [line for line in lines if line.startswith("warning")]
    assert warning.startswith("warning: eval suite 'arithmetic' (split train): ")
    assert "eval.tasks.0.split is train, the split training reads" in warning
    assert "drop eval.tasks.0.split to evaluate the held-out test split" in warning
    assert "set eval.tasks to held-out data" not in warning  # the user did set eval.tasks


def test_a_one_file_custom_eval_entry_points_at_its_path(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "a": str(2 * i)}) + "\n" for i in range(4)))
    entry = {"task": "custom", "path": str(data), "options": {"answer_field": "a"}}
    config = _config(f"eval.tasks=[{json.dumps(entry)}]", data=[entry])
    lines = describe_suites(config, load_training_suites(config.data)[0], load_eval_suites(config))
    (warning,) = [line for line in lines if line.startswith("warning")]
    assert warning.startswith("warning: eval suite 'custom' (split test): 4 of its 4 prompts are also training prompts")
    assert "point eval.tasks.0.path at held-out data" in warning and "set eval.tasks to" not in warning


def test_the_held_out_split_is_written_into_the_saved_config(tmp_path):
    """A resumed run reads its saved config.yaml: the eval entry must still say test there (it said train,
    the training entry's default, so a resume evaluated the training split)."""
    from rlvr.config import load_config, save_config

    save_config(_config("eval.tasks=[{task: arithmetic}]"), tmp_path / "config.yaml")
    assert [e.split for e in eval_entries(load_config(RunConfig, tmp_path / "config.yaml"))] == ["test"]
