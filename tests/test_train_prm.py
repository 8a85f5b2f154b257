"""The process reward model: scoring (one score per step, read at the step's last token, batched =
unbatched), the step-labelled data's one-line errors, and ``rlvr train-prm`` end to end on a tiny model
(rlvr/modeling/prm.py, rlvr/rollout/step_data.py, rlvr/recipes/train_prm.py)."""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch

from rlvr.cli import main
from rlvr.config import PRMConfig, build_config
from rlvr.modeling.loading import load_tokenizer
from rlvr.modeling.prm import (ProcessRewardModel, completion_step_ends, load_prm_backbone, save_prm, step_loss,
                               step_probabilities, token_pieces)
from rlvr.recipes import train_prm
from rlvr.rollout.step_data import load_step_examples, tokenize_step_examples
from rlvr.run.tracking import read_metrics
from rlvr.tasks import get_task
from rlvr.tasks.chain_arithmetic import chain_values, write_prm_data
from rlvr.tasks.loading import DataError


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------------------------------------
# Pure pieces: probabilities and loss by hand
# ---------------------------------------------------------------------------------------------


def test_probabilities_and_loss_by_hand():
    two = torch.tensor([[0.0, 0.0], [0.0, 2.0]])
    assert step_probabilities(two).tolist() == pytest.approx([0.5, 1 / (1 + torch.e ** -2)])
    one = torch.tensor([[0.0], [1.0]])
    assert step_probabilities(one).tolist() == pytest.approx([0.5, 1 / (1 + torch.e ** -1)])
    labels = torch.tensor([1, 0])
    # CE: -log 0.5 and -log(1 - sigmoid(2)) = log(1 + e^2)
    expected = (torch.log(torch.tensor(2.0)) + torch.log1p(torch.e ** torch.tensor(2.0))) / 2
    assert step_loss(two, labels).item() == pytest.approx(expected.item(), rel=1e-5)
    assert step_loss(one, labels).item() == pytest.approx(((torch.log(torch.tensor(2.0)) +
                                                             torch.log1p(torch.e ** torch.tensor(1.0))) / 2).item(), rel=1e-5)


def test_token_pieces_rebuild_the_text(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    ids = tokenizer("7+5=12\n12*3=36", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    pieces = token_pieces(tokenizer, ids)
    assert len(pieces) == len(ids) and "".join(pieces) == "7+5=12\n12*3=36" and pieces[-1] == ""
    assert completion_step_ends(tokenizer, ids) == [6, len(ids) - 1]  # the "\n", then EOS


# ---------------------------------------------------------------------------------------------
# Scoring: one score per step, at the step's last token
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fresh_prm(tiny_model, tmp_path_factory):
    """A PRM folder built from the tiny causal LM (a new, untrained 2-label head) and saved."""
    tokenizer = load_tokenizer(tiny_model)
    config = build_config(PRMConfig, {"model": {"path": str(tiny_model)}, "data": {"path": "x.jsonl"}})
    model = load_prm_backbone(config.model, tokenizer, "cpu")
    assert model.config.num_labels == 2 and type(model).__name__ == "LlamaForTokenClassification"
    return save_prm(model, tokenizer, tmp_path_factory.mktemp("prm") / "final", separator="\n")


def test_one_score_per_step_read_at_its_last_token(fresh_prm):
    from transformers import AutoModelForTokenClassification

    prm = ProcessRewardModel(fresh_prm, batch_size=2)
    tok = prm.tokenizer
    assert prm.separator == "\n"
    texts = ["7+5=12\n12*3=36\n36-4=32", "1+1=2", "3*3=9\n\n9-1=8\n", ""]
    prompts = [tok("<bos>7+5*3-4:")["input_ids"], tok("<bos>1+1:")["input_ids"], tok("<bos>3*3-1:")["input_ids"],
               tok("<bos>1:")["input_ids"]]
    completions = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    ends = [prm.step_ends(c) for c in completions]
    assert [len(e) for e in ends] == [3, 1, 2, 0]
    scores = prm.score_steps(prompts, completions, ends)
    assert [len(s) for s in scores] == [3, 1, 2, 0]
    assert all(0 < p < 1 for row in scores for p in row)
    hf = AutoModelForTokenClassification.from_pretrained(str(fresh_prm)).eval()
    for prompt, completion, row_ends, row in zip(prompts, completions, ends, scores):
        if not row_ends:
            continue
        with torch.no_grad():  # unbatched, unpadded: the softmax's "good" at len(prompt) + end
            probs = torch.softmax(hf(input_ids=torch.tensor([prompt + completion])).logits[0], dim=-1)[:, 1]
        assert row == pytest.approx([probs[len(prompt) + e].item() for e in row_ends], abs=1e-5)


def test_a_one_label_token_classifier_is_read_with_a_sigmoid(tiny_model, tmp_path):
    from transformers import AutoModelForTokenClassification

    tokenizer = load_tokenizer(tiny_model)
    model = AutoModelForTokenClassification.from_pretrained(str(tiny_model), num_labels=1)
    model.save_pretrained(tmp_path / "one")
    tokenizer.save_pretrained(tmp_path / "one")  # a folder from elsewhere: no prm.json
    prm = ProcessRewardModel(tmp_path / "one")
    (row,) = prm.score_steps([[1, 20]], [[30, 31, 2]], [[1, 2]])
    with torch.no_grad():
        logits = model.eval()(input_ids=torch.tensor([[1, 20, 30, 31, 2]])).logits[0, :, 0]
    assert row == pytest.approx(torch.sigmoid(logits[[3, 4]]).tolist(), abs=1e-5)


# ---------------------------------------------------------------------------------------------
# The data: TRL's stepwise format, and one-line errors
# ---------------------------------------------------------------------------------------------

GOOD = {"prompt": "1+2:", "completions": ["1+2=3"], "labels": [True]}


@pytest.mark.parametrize("row, message", [
    ({"prompt": "1+2:", "completions": ["1+2=3", "3*2=6"], "labels": [True]},
     r"d\.jsonl:2: field 'labels': 1 labels for 2 steps in 'completions'; give one label per step"),
    ({"prompt": "1+2:", "labels": [True]}, r"d\.jsonl:2: field 'completions': missing"),
    ({"completions": ["a"], "labels": [True]}, r"d\.jsonl:2: field 'prompt': missing"),
    ({"prompt": "1", "completions": ["a", " "], "labels": [1, 0]}, r"d\.jsonl:2: field 'completions': step 1 is blank"),
    ({"prompt": "1", "completions": ["a\nb"], "labels": [1]},
     r"d\.jsonl:2: field 'completions': step 0 contains the separator '\\n'"),
    ({"prompt": "1", "completions": ["a"], "labels": ["yes"]}, r"d\.jsonl:2: field 'labels': label 0 is 'yes'"),
    ({"prompt": "1", "completions": "a", "labels": [1]}, r"d\.jsonl:2: field 'completions': expected list"),
    ("{oops", r"d\.jsonl:2: invalid JSON"),
])
def test_bad_rows_name_file_line_and_field(tmp_path, row, message):
    path = _write(tmp_path / "d.jsonl", [GOOD, row])
    with pytest.raises(DataError, match=message):
        load_step_examples(str(path))


def test_chat_prompts_are_encoded_as_the_trainer_encodes_them(tiny_model, tmp_path):
    from rlvr.rollout.suites import PromptEncoder
    from rlvr.tasks.base import Problem

    messages = [{"role": "user", "content": "1+2*3:"}]
    path = _write(tmp_path / "d.jsonl", [{"prompt": messages, "completions": ["1+2=3", "3*3=9"], "labels": [1, 1]}])
    tokenizer = load_tokenizer(tiny_model)
    (example,) = tokenize_step_examples(tokenizer, load_step_examples(str(path)))
    assert example.prompt == PromptEncoder(tokenizer)(Problem("x", messages, {}, "numeric"))
    assert tokenizer.decode(example.completion) == "1+2=3\n3*3=9<eos>"
    assert example.ends == [5, 11] and example.labels == [1, 1]


def test_cli_reports_bad_data_in_one_line(tmp_path, tiny_model, capsys):
    path = _write(tmp_path / "d.jsonl", [{"prompt": "a", "completions": ["b", "c"], "labels": [True]}])
    cfg = tmp_path / "prm.yaml"
    cfg.write_text(json.dumps({"model": {"path": str(tiny_model)}, "data": {"path": str(path)},
                               "log": {"progress": False}}))
    code = main(["train-prm", str(cfg), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "d.jsonl:1: field 'labels': 1 labels for 2 steps" in err.splitlines()[0]
    code = main(["train-prm", str(cfg), "data.path=" + str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "run2")])
    assert code == 2 and "data.path: step-labelled file" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# rlvr train-prm end to end
# ---------------------------------------------------------------------------------------------


def _corrupted(problem, rng) -> str:
    """The gold chain with one step's result far off (+40..80); later steps continue from the wrong value,
    so every step from there on is bad (Math-Shepherd's rule, as label_steps applies it)."""
    start, ops = problem.meta["start"], problem.meta["ops"]
    k, value, lines = rng.randrange(len(ops)), start, []
    for i, (op, b) in enumerate(ops):
        new = chain_values(value, [(op, b)])[0] + (rng.randint(40, 80) if i == k else 0)
        lines.append(f"{value}{op}{b}={new}")
        value = new
    return "\n".join(lines)


def _chain_data(path, n=400, seed=0):
    rng = random.Random(seed)
    problems = get_task("chain_arithmetic", split="train", n=n, seed=seed, max_operand=5, ops="+-")
    return path if write_prm_data(((p, p.solution if rng.random() < 0.4 else _corrupted(p, rng)) for p in problems),
                                  path) else None


def _prm_config(out, model, data, **extra):
    raw = {"out": str(out), "model": {"path": str(model)}, "data": {"path": str(data), "eval_fraction": 0.25},
           "optim": {"lr": 1e-2}, "train": {"epochs": 3, "batch_size": 16, "threads": 2},
           "eval": {"every": 20}, "log": {"progress": False}, "checkpoint": {"every": 0}}
    for key, value in extra.items():
        section, _, field = key.partition("__")
        raw.setdefault(section, {})[field] = value
    return build_config(PRMConfig, raw)


@pytest.mark.slow
def test_train_prm_learns_the_steps_of_chain_arithmetic(tiny_model, tmp_path, capsys):
    data = _chain_data(tmp_path / "steps.jsonl")
    cfg = tmp_path / "prm.yaml"
    cfg.write_text(json.dumps(_prm_config(tmp_path / "prm", tiny_model, data).model_dump(mode="json")))
    assert main(["train-prm", str(cfg)]) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "prm" / "summary.json").read_text())
    assert f"held-out step accuracy: {summary['step_accuracy_before']:.3f} -> {summary['step_accuracy']:.3f}" in out
    # 0.53 -> 0.84 on this data (majority label 0.57): well above chance after ~56 steps
    assert summary["step_accuracy"] >= 0.75 and summary["step_accuracy"] > summary["majority_accuracy"] + 0.1
    assert summary["step_accuracy"] > summary["step_accuracy_before"] + 0.1
    assert summary["eval_steps"] == 3 * summary["eval_examples"]
    records = read_metrics(tmp_path / "prm" / "metrics.jsonl")
    assert records[0]["step"] == 0 and "eval/step_accuracy" in records[0]
    assert (tmp_path / "prm" / "metrics.png").is_file()
    prm = ProcessRewardModel(tmp_path / "prm" / "final")  # the final model scores gold above a corrupted chain
    tok, problem = prm.tokenizer, get_task("chain_arithmetic", split="test", n=1, max_operand=5, ops="+-")[0]
    prompt = tok("<bos>" + problem.prompt[0]["content"])["input_ids"]
    completions = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                   for t in (problem.solution, _corrupted(problem, random.Random(1)))]
    scores = prm.score_steps([prompt] * 2, completions, [prm.step_ends(c) for c in completions])
    assert [len(s) for s in scores] == [3, 3] and min(scores[0]) > min(scores[1])


@pytest.mark.slow
def test_resume_continues_exactly(tiny_model, tmp_path):
    data = _chain_data(tmp_path / "steps.jsonl", n=64)
    full = train_prm.train(_prm_config(tmp_path / "a", tiny_model, data, train__epochs=1,
                                       checkpoint__every=2, checkpoint__keep=10, eval__every=0))
    assert full["steps"] == 3  # 48 training examples / 16
    run, resumed = tmp_path / "a", tmp_path / "b"
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000003")
    shutil.rmtree(resumed / "final")
    again = train_prm.train(_prm_config(resumed, tiny_model, data, train__epochs=1, checkpoint__every=2,
                                        eval__every=0), resume=True)
    assert again["step_accuracy"] == pytest.approx(full["step_accuracy"])
    assert again["eval_loss"] == pytest.approx(full["eval_loss"], abs=1e-5)
    steps = [r["step"] for r in read_metrics(resumed / "metrics.jsonl")]
    assert steps == sorted(steps) and steps.count(3) == 1
