"""SFT: completion-only loss, data sources, early stop on held-out accuracy."""

import json

import pytest
import torch

from rlvr.recipes import sft
from rlvr.config import build_config
from rlvr.config import SFTConfig
from rlvr.modeling.logprobs import collate_completions
from rlvr.run.tracking import read_metrics


def test_collate_masks_prompt_tokens_out_of_the_loss():
    ids, attention, mask = collate_completions([[1, 2, 3], [4]], [[7, 8, 2], [9, 2]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3, 7, 8, 2], [0, 0, 4, 9, 2, 0]]
    assert attention.tolist() == [[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 1, 0]]  # completion (with EOS) only


def test_sft_learns_and_stops_at_the_target_accuracy(tiny_model, tmp_path):
    config = build_config(SFTConfig, {
        "out": str(tmp_path), "model": {"path": str(tiny_model)},
        "data": {"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}},
        "optim": {"lr": 3e-3}, "train": {"steps": 400, "batch_size": 64},
        "eval": {"every": 10, "max_new_tokens": 3, "stop_at_accuracy": 0.5},
        "log": {"progress": False},
    })
    summary = sft.train(config)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records[-1]["train/loss"] < records[0]["train/loss"] / 2
    assert summary["eval_accuracy"] >= 0.5 and summary["steps"] < 400  # stopped early
    assert (tmp_path / "final" / "model.safetensors").is_file() and (tmp_path / "metrics.png").is_file()


def test_sft_from_a_jsonl_file(tiny_model, tmp_path):
    data = tmp_path / "data.jsonl"
    rows = [{"prompt": "ab", "completion": "cd"}, {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    config = build_config(SFTConfig, {"out": str(tmp_path / "run"), "model": {"path": str(tiny_model)},
                                      "data": {"task": None, "path": str(data)}, "optim": {"lr": 1e-2},
                                      "train": {"steps": 30, "batch_size": 2}, "log": {"progress": False}})
    sft.train(config)
    losses = [r["train/loss"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")]
    assert losses[-1] < losses[0] / 3


def test_bad_jsonl_names_file_line_and_field(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n" + json.dumps({"prompt": "a"}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: needs fields 'prompt' and 'completion'"):
        sft._read_jsonl_examples(data, None)
    data.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: invalid JSON"):
        sft._read_jsonl_examples(data, None)


def test_data_is_a_list_of_sources_like_train_and_a_mapping_is_a_list_of_one(tmp_path):
    """Before: SFT's `data:` was a mapping and `rlvr train`'s a list; both shapes now load."""
    from rlvr.config import ConfigError

    data = tmp_path / "extra.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "completion": str(2 * a)}) + "\n" for a in range(3)))
    base = {"model": {"path": "m"}}
    both = build_config(SFTConfig, {**base, "data": [
        {"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}, "limit": 5},
        {"task": None, "path": str(data)},
    ]})
    examples = sft.load_sft_examples(both.data)
    assert len(examples) == 8 and examples[-1] == ([{"role": "user", "content": "2+2="}], "4")
    one = build_config(SFTConfig, {**base, "data": {"task": "arithmetic", "limit": 5}}, ["data.0.limit=3"])
    assert len(one.data) == 1 and one.data[0].limit == 3
    with pytest.raises(ConfigError, match=r"data\.1\.path: set task to a suite, or task: null with path"):
        build_config(SFTConfig, {**base, "data": [{"task": "arithmetic"}, {"task": None}]})
    with pytest.raises(ConfigError, match=r"data\.0\.options: task 'arithmetic': unknown option\(s\) nn"):
        build_config(SFTConfig, {**base, "data": [{"task": "arithmetic", "options": {"nn": 1}}]})


def test_text_that_is_not_unicode_names_file_and_line(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n" + '{"prompt": "a", "completion": "\\udfff"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: field 'completion': is not valid Unicode"):
        sft._read_jsonl_examples(data, None)
    data.write_bytes(b'{"prompt": "a", "completion": "\xff\xfe"}\n')  # bytes that are not UTF-8
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: the line is not valid Unicode"):
        sft._read_jsonl_examples(data, None)
