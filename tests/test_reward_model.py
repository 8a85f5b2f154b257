"""Preference data (reading, errors, tokenising, `rlvr preferences`) and the Bradley-Terry reward model."""

import json
import random
import shutil

import pytest
import torch

from rlvr.modeling.reward_model import RewardModel
from rlvr.recipes import train_rm
from rlvr.cli import main
from rlvr.config import build_config
from rlvr.config import RewardModelConfig
from rlvr.rollout.preferences import load_preferences, split_by_prompt, tokenize_pairs
from rlvr.tasks.loading import DataError
from rlvr.run.tracking import read_metrics
from rlvr.verifiers.errors import MissingFileError


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------------------------------------
# Reading preference data
# ---------------------------------------------------------------------------------------------


def test_the_accepted_shapes_of_a_pair(tmp_path):
    rows = [
        {"prompt": "1+1=", "chosen": "2", "rejected": "3"},
        {"prompt": "0+0=", "chosen": "0", "rejected": ""},  # an empty reply (the model stopped at once) is a reply
        {"prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": "2+2="}],
         "chosen": [{"role": "assistant", "content": "4"}], "rejected": [{"role": "assistant", "content": "5"}]},
        {"chosen": [{"role": "user", "content": "3+3="}, {"role": "assistant", "content": "6"}],  # no prompt field
         "rejected": [{"role": "user", "content": "3+3="}, {"role": "assistant", "content": "7"}]},
    ]
    pairs = load_preferences(str(_write(tmp_path / "p.jsonl", rows)))
    assert [(p.prompt[-1]["content"], p.chosen, p.rejected) for p in pairs] == [("1+1=", "2", "3"), ("0+0=", "0", ""), ("2+2=", "4", "5"),
                                                                               ("3+3=", "6", "7")]
    assert pairs[0].prompt == [{"role": "user", "content": "1+1="}] and pairs[2].prompt[0]["role"] == "system"
    assert pairs[0].where.endswith("p.jsonl:1")


def test_column_mapping_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"q": ["1+1=", "2+2="], "good": ["2", "4"], "bad": ["3", "5"]}), path)
    pairs = load_preferences(str(path), columns={"prompt": "q", "chosen": "good", "rejected": "bad"}, limit=1)
    assert [(p.prompt[0]["content"], p.chosen, p.rejected) for p in pairs] == [("1+1=", "2", "3")]


@pytest.mark.parametrize("row, message", [
    ({"prompt": "a", "chosen": "b"}, r"p\.jsonl:2: field 'rejected': missing"),
    ({"prompt": "a", "chosen": 3.5, "rejected": "c"}, r"p\.jsonl:2: field 'chosen': expected"),
    ({"prompt": "", "chosen": "b", "rejected": "c"}, r"p\.jsonl:2: field 'prompt': is empty"),
    ({"prompt": "a", "chosen": [{"role": "user", "content": "x"}], "rejected": "c"},
     r"p\.jsonl:2: field 'chosen': message 0 has role 'user'"),
    ({"prompt": [{"role": "user"}], "chosen": "b", "rejected": "c"}, r"p\.jsonl:2: field 'prompt': message 0 must"),
    ({"chosen": "b", "rejected": "c"}, r"p\.jsonl:2: field 'prompt': missing"),
])
def test_bad_rows_name_file_line_and_field(tmp_path, row, message):
    path = _write(tmp_path / "p.jsonl", [{"prompt": "ok", "chosen": "1", "rejected": "2"}, row])
    with pytest.raises(DataError, match=message):
        load_preferences(str(path))


def test_bad_files(tmp_path):
    with pytest.raises(MissingFileError, match=r"data\.path: preference file .*nope\.jsonl does not exist"):
        load_preferences(str(tmp_path / "nope.jsonl"))
    (tmp_path / "bad.jsonl").write_text("{oops\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:1: invalid JSON"):
        load_preferences(str(tmp_path / "bad.jsonl"))


def test_cli_reports_bad_data_in_one_line(tmp_path, tiny_model, capsys):
    path = _write(tmp_path / "p.jsonl", [{"prompt": "a", "chosen": "b"}])
    code = main(["train-rm", str(_rm_yaml(tmp_path, tiny_model, path)), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "p.jsonl:1: field 'rejected': missing" in err.splitlines()[0]


def _rm_yaml(tmp_path, model, data):
    cfg = tmp_path / "rm.yaml"
    cfg.write_text(json.dumps({"model": {"path": str(model)}, "data": {"path": str(data)}, "log": {"progress": False}}))
    return cfg


def test_held_out_pairs_have_unseen_prompts():
    from rlvr.rollout.preferences import PreferencePair

    pairs = [PreferencePair([{"role": "user", "content": str(i % 10)}], "a", "b") for i in range(50)]
    train, held = split_by_prompt(pairs, 0.2, seed=0)
    assert len(held) == 10 and len(train) == 40  # 2 of 10 prompts, with all 5 pairs each
    assert not {p.prompt[0]["content"] for p in train} & {p.prompt[0]["content"] for p in held}


def test_tokenising_matches_the_trainers_prompt_encoding(tiny_model):
    from rlvr.modeling.loading import load_tokenizer
    from rlvr.rollout.preferences import PreferencePair
    from rlvr.rollout.suites import PromptEncoder
    from rlvr.tasks.base import Problem

    tokenizer = load_tokenizer(tiny_model)
    messages = [{"role": "user", "content": "12+3="}]
    (pair,) = tokenize_pairs(tokenizer, [PreferencePair(messages, "15", "16")])
    assert pair.prompt == PromptEncoder(tokenizer)(Problem("x", messages, {}, "numeric"))
    assert tokenizer.decode(pair.chosen) == "15<eos>" and pair.rejected[-1] == tokenizer.eos_token_id
    kept = tokenize_pairs(tokenizer, [PreferencePair(messages, "15" * 20, "1"), PreferencePair(messages, "1", "2")], 20)
    assert len(kept) == 1  # the pair with 40 characters is left out
    with pytest.raises(ValueError, match="every pair is longer than 20 tokens"):
        tokenize_pairs(tokenizer, [PreferencePair(messages, "15" * 20, "1")], max_length=20)


# ---------------------------------------------------------------------------------------------
# `rlvr preferences`: pairs from a suite and its verifier
# ---------------------------------------------------------------------------------------------


def test_preferences_pairs_a_passing_with_a_failing_completion(taught_model, tmp_path, capsys):
    from rlvr.verifiers import get_verifier

    out = tmp_path / "prefs.jsonl"
    code = main(["preferences", "--model", str(taught_model), "--task", "arithmetic", "--task-option", "style=bare",
                 "--task-option", "max_digits=1", "--out", str(out), "--samples", "6", "--limit", "40",
                 "--max-new-tokens", "3", "--workers", "0", "--pairs-per-prompt", "2"])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) >= 5, capsys.readouterr().out
    numeric = get_verifier("numeric")
    for row in rows:
        a, b = row["prompt"][0]["content"].rstrip("=").split("+")
        reference = {"answer": str(int(a) + int(b))}
        assert numeric.score(row["chosen"], reference).score == 1.0
        assert numeric.score(row["rejected"], reference).score < 1.0
    per_prompt = {}
    for row in rows:
        per_prompt.setdefault(row["id"], []).append((row["chosen"], row["rejected"]))
    assert all(len(v) <= 2 and len(set(v)) == len(v) for v in per_prompt.values())
    assert "gave a pair" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Training the reward model
# ---------------------------------------------------------------------------------------------


def _easy_pairs(path, n=240, seed=0):
    """Chosen replies start with Y, rejected with N: a pattern a tiny model learns in a few steps."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        tail = str(rng.randint(0, 999))
        rows.append({"prompt": f"{a}+{b}=", "chosen": "Y" + tail, "rejected": "N" + tail[::-1]})
    return _write(path, rows)


def _rm_config(tmp_path, model, data, **extra):
    raw = {"out": str(tmp_path / "rm"), "model": {"path": str(model)}, "data": {"path": str(data), "eval_fraction": 0.25},
           "optim": {"lr": 3e-3}, "train": {"epochs": 2, "batch_size": 16, "threads": 1},
           "eval": {"every": 5}, "log": {"progress": False}}
    for key, value in extra.items():
        section, _, field = key.partition("__")
        raw.setdefault(section, {})
        if field:
            raw[section][field] = value
        else:
            raw[section] = value
    return build_config(RewardModelConfig, raw)


def test_score_head_learns_and_final_loads_with_from_pretrained(tiny_model, tmp_path):
    from transformers import AutoModelForSequenceClassification

    config = _rm_config(tmp_path, tiny_model, _easy_pairs(tmp_path / "p.jsonl"))
    summary = train_rm.train(config)
    assert summary["pairwise_accuracy"] >= 0.9 and summary["eval_pairs"] > 30
    records = read_metrics(tmp_path / "rm" / "metrics.jsonl")
    assert records[0]["step"] == 0 and "eval/pairwise_accuracy" in records[0]
    assert any("eval/pairwise_accuracy" in r for r in records[1:-1])  # every 5 steps
    final = tmp_path / "rm" / "final"
    assert (tmp_path / "rm" / "metrics.png").is_file()
    assert json.loads((tmp_path / "rm" / "summary.json").read_text())["pairwise_accuracy"] == summary["pairwise_accuracy"]

    rm = RewardModel(final, batch_size=3)
    tokenizer = rm_tokenizer = __import__("rlvr.modeling.loading", fromlist=["load_tokenizer"]).load_tokenizer(final)
    prompts = [tokenizer("<bos>1+2=")["input_ids"]] * 2 + [tokenizer("<bos>10+20=")["input_ids"]] * 3
    completions = [tokenizer(t)["input_ids"] + [tokenizer.eos_token_id] for t in ["Y3", "N3", "Y30", "N30", "Y"]]
    scores = rm.score(prompts, completions)
    assert scores.shape == (5,) and scores[0] > scores[1] and scores[2] > scores[3]
    hf = AutoModelForSequenceClassification.from_pretrained(str(final)).eval()
    with torch.no_grad():
        one_by_one = [hf(input_ids=torch.tensor([p + c])).logits[0, 0].item() for p, c in zip(prompts, completions)]
    assert scores.tolist() == pytest.approx(one_by_one, abs=1e-4)  # batched, right-padded = unpadded
    assert rm_tokenizer.pad_token_id == hf.config.pad_token_id


def test_lora_score_head_saves_merged_model(tiny_model, tmp_path):
    from transformers import AutoModelForSequenceClassification

    config = _rm_config(tmp_path, tiny_model, _easy_pairs(tmp_path / "p.jsonl", n=120),
                        model__lora={"r": 4, "alpha": 8}, train__epochs=1, eval={"every": 0})
    summary = train_rm.train(config)
    final = tmp_path / "rm" / "final"
    assert (final / "adapter").is_dir() and summary["pairwise_accuracy"] is not None
    rm = RewardModel(final)
    hf = AutoModelForSequenceClassification.from_pretrained(str(final)).eval()
    ids = [[1, 5, 6, 7]], [[8, 9, 2]]
    with torch.no_grad():
        assert rm.score(*ids).item() == pytest.approx(hf(input_ids=torch.tensor([[1, 5, 6, 7, 8, 9, 2]])).logits[0, 0].item(), abs=1e-5)
    base = AutoModelForSequenceClassification.from_pretrained(str(tiny_model), num_labels=1)
    assert not torch.equal(base.model.layers[0].mlp.up_proj.weight, hf.model.layers[0].mlp.up_proj.weight)  # merged


def test_logprob_head_learns(tiny_model, tmp_path):
    config = _rm_config(tmp_path, tiny_model, _easy_pairs(tmp_path / "p.jsonl", n=160), head="logprob", train__epochs=1,
                        eval={"every": 0})
    summary = train_rm.train(config)
    assert summary["pairwise_accuracy"] >= 0.9
    # it starts as a ranker of what it would generate and Bradley-Terry sharpens it (docs/reward-models.md):
    # on these pairs 0.32-0.93 before, 1.0 after, over two tiny models x three pair sets
    assert summary["pairwise_accuracy"] > summary["pairwise_accuracy_before"]
    rm = RewardModel(tmp_path / "rm" / "final")
    assert rm.head == "logprob"
    r = rm.score([[1, 20, 21]], [[5, 2]])
    assert r.item() < 0  # a sum of log-probabilities


def test_logprob_head_nll_anchor_keeps_the_chosen_answers_likely(tiny_model, tmp_path):
    """Bradley-Terry fixes only r_w - r_l; loss.nll_coef also raises the chosen log-probs themselves."""
    from rlvr.modeling.loading import load_tokenizer
    from rlvr.rollout.preferences import load_preferences

    data = _easy_pairs(tmp_path / "p.jsonl", n=160)
    chosen_logp = {}
    for coef in (0.0, 1.0):
        config = _rm_config(tmp_path / str(coef), tiny_model, data, head="logprob", train__epochs=1, eval={"every": 0},
                            loss={"nll_coef": coef})
        summary = train_rm.train(config)
        assert summary["pairwise_accuracy"] >= 0.9
        logged = [r for r in read_metrics(tmp_path / str(coef) / "rm" / "metrics.jsonl") if "train/loss" in r]
        assert ("train/nll_chosen" in logged[-1]) == bool(coef)
        rm = RewardModel(tmp_path / str(coef) / "rm" / "final")
        tokenizer = load_tokenizer(tmp_path / str(coef) / "rm" / "final")
        pairs = tokenize_pairs(tokenizer, load_preferences(str(data))[:40])
        chosen_logp[coef] = rm.score([p.prompt for p in pairs], [p.chosen for p in pairs]).mean().item()
    assert chosen_logp[1.0] > chosen_logp[0.0] + 1.0


def test_nll_coef_needs_the_logprob_head(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="loss.nll_coef: 0.5 needs head: logprob"):
        _rm_config(tmp_path, tiny_model, _easy_pairs(tmp_path / "p.jsonl", n=8), loss={"nll_coef": 0.5})


def test_resume_continues_exactly(tiny_model, tmp_path):
    data = _easy_pairs(tmp_path / "p.jsonl", n=96)
    full = train_rm.train(_rm_config(tmp_path / "a", tiny_model, data, train__epochs=1, eval={"every": 0},
                                         checkpoint={"every": 2, "keep": 10}))
    run = tmp_path / "a" / "rm"
    assert full["steps"] == 5  # 72 training pairs / 16
    resumed_dir = tmp_path / "b" / "rm"
    shutil.copytree(run, resumed_dir)
    for name in ("step_000004", "step_000005"):
        shutil.rmtree(resumed_dir / "checkpoints" / name)
    shutil.rmtree(resumed_dir / "final")
    config = _rm_config(tmp_path / "b", tiny_model, data, train__epochs=1, eval={"every": 0}, checkpoint={"every": 2})
    again = train_rm.train(config, resume=True)
    assert again["pairwise_accuracy"] == pytest.approx(full["pairwise_accuracy"])
    steps = [r["step"] for r in read_metrics(resumed_dir / "metrics.jsonl")]
    assert steps == sorted(steps) and steps.count(3) == 1
    a = RewardModel(run / "final").score([[1, 5]], [[6, 2]])
    b = RewardModel(resumed_dir / "final").score([[1, 5]], [[6, 2]])
    assert a.item() == pytest.approx(b.item(), abs=1e-5)
