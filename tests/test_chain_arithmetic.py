"""The ``chain_arithmetic`` suite (the process-reward demonstration): gold solutions score 1.0 and every
step labels right, held-out splits are disjoint, and :func:`label_steps` labels a model's steps as
Math-Shepherd would (hand-made completions)."""

from __future__ import annotations

import json

import pytest

from rlvr.algorithms.process_rewards import step_end_indices
from rlvr.tasks import Problem, get_task
from rlvr.tasks.chain_arithmetic import (chain_values, gold_steps, label_steps, split_of, split_steps,
                                         write_prm_data)
from rlvr.verifiers import get_verifier
from rlvr.verifiers.errors import InvalidValueError

# 7+5*3-4, left to right: 12, 36, 32
PROBLEM = Problem("chain/0", [{"role": "user", "content": "7+5*3-4:"}], {"answer": "32"}, "numeric",
                  solution="7+5=12\n12*3=36\n36-4=32", meta={"start": 7, "ops": [["+", 5], ["*", 3], ["-", 4]]})


def test_values_and_gold_steps_by_hand():
    assert chain_values(7, [("+", 5), ("*", 3), ("-", 4)]) == [12, 36, 32]
    assert gold_steps(7, [("+", 5), ("*", 3), ("-", 4)]) == ["7+5=12", "12*3=36", "36-4=32"]
    assert gold_steps(2, [("-", 5), ("*", 3)]) == ["2-5=-3", "-3*3=-9"]


@pytest.mark.parametrize("split", ["train", "dev", "test"])
@pytest.mark.parametrize("options", [{}, {"steps": 2, "max_operand": 5, "ops": "+-"}, {"style": "instruct", "steps": 4}])
def test_gold_solutions_score_one_and_every_step_labels_right(split, options):
    suite = get_task("chain_arithmetic", split=split, n=20, **options)
    numeric = get_verifier("numeric")
    steps = options.get("steps", 3)
    for p in suite:
        assert numeric.score(p.solution, p.reference).score == 1.0, p
        assert numeric.score(p.solution + "1", p.reference).score == 0.0
        assert len(split_steps(p.solution)) == steps and label_steps(p, p.solution) == [True] * steps
        text = "".join(f"{op}{b}" for op, b in p.meta["ops"])
        assert split_of(f"{p.meta['start']}{text}") == split
        assert all(1 <= b <= options.get("max_operand", 9) for _, b in p.meta["ops"])


def test_prompts_by_style():
    bare = get_task("chain_arithmetic", split="test", n=3)
    for p in bare:
        assert p.prompt[0]["content"] == f"{p.meta['start']}" + "".join(f"{o}{b}" for o, b in p.meta["ops"]) + ":"
    instruct = get_task("chain_arithmetic", split="test", n=1, style="instruct", seed=1)[0]
    assert instruct.prompt[0]["content"].startswith(f"Start at {instruct.meta['start']}, ")
    assert get_task("chain_arithmetic", split="dev", n=5, seed=3)[4] == get_task("chain_arithmetic", split="dev", n=5, seed=3)[4]


@pytest.mark.parametrize("steps", [1, 2])
def test_an_instruct_prompt_gives_away_neither_a_step_nor_the_answer(steps):
    """The format example is fixed: the problem's own first step (with one step, its answer) was shown as
    the example, so a model that copied it scored 0.67-0.90 on one-step chains it could not do."""
    from rlvr.tasks.chain_arithmetic import FORMAT_EXAMPLE

    problems = get_task("chain_arithmetic", split="test", steps=steps, style="instruct", max_operand=30, n=200)
    for problem in problems:
        content = problem.prompt[-1]["content"]
        assert f"(like {FORMAT_EXAMPLE})" in content, content
        first_step = problem.solution.splitlines()[0]
        if first_step != FORMAT_EXAMPLE:  # (the one problem whose first step is the example itself)
            assert first_step not in content, content


def test_held_out_problems_never_appear_in_training():
    def texts(split, n):
        return {p.prompt[0]["content"] for p in get_task("chain_arithmetic", split=split, n=n, steps=2, max_operand=4)}

    train = texts("train", 3000)
    for split in ("dev", "test"):
        held = texts(split, 20)
        assert held and not held & train


def test_bad_options_are_one_line_errors():
    with pytest.raises(InvalidValueError, match="unknown style 'chat'; valid styles: bare, instruct"):
        get_task("chain_arithmetic", style="chat")
    with pytest.raises(InvalidValueError, match="ops must be a non-empty string of"):
        get_task("chain_arithmetic", ops="/")
    with pytest.raises(InvalidValueError, match="steps must be >= 1"):
        get_task("chain_arithmetic", steps=0)
    with pytest.raises(InvalidValueError, match="cannot draw 500 distinct test problems"):
        get_task("chain_arithmetic", split="test", steps=1, max_operand=2, ops="+")


@pytest.mark.parametrize("completion, labels", [
    ("7+5=12\n12*3=36\n36-4=32", [True, True, True]),
    ("7+5=12\n12*3=36\n36-4=31", [True, True, False]),             # the last result is off
    ("7+5=13\n13*3=39\n39-4=35", [False, False, False]),           # wrong at once; the rest follows from it
    ("7+5=12\n12*3=35\n35-4=31", [True, False, False]),            # sound arithmetic after a wrong value: still wrong
    ("7+5=12\n12+3=15\n15-4=11", [True, False, False]),            # the wrong operation
    ("7+5=12\n12*4=48\n48-4=44", [True, False, False]),            # the wrong operand
    ("7+5=12\n12*3=36", [True, False]),                            # stops early: its last step is not the answer
    ("7+5=12\n12*3=36\n36-4=32\n32+1=33", [True, True, True, False]),  # a step past the last operation
    ("7+5=12\nso 12*3=36\n36-4=32", [True, False, False]),         # a line that is not a step
    (" 7 + 5 = 12 \n\n12*3 = 36\n36-4=32\n", [True, True, True]),  # spaces, blank lines, a trailing newline
    ("32", [False]),                                               # the answer alone
])
def test_label_steps_by_hand(completion, labels):
    assert label_steps(PROBLEM, completion) == labels


def test_labels_line_up_with_the_step_ends_of_the_tokens():
    completion = "7+5=12\n\n12*3=35\n35-4=31\n"
    tokens = list(completion) + [""]  # a character tokenizer, EOS last
    assert len(step_end_indices(tokens, "\n")) == len(label_steps(PROBLEM, completion)) == 3
    assert label_steps(PROBLEM, "7+5=12 | 12*3=36 | 36-4=32", separator=" | ") == [True, True, True]


def test_write_prm_data(tmp_path):
    out = tmp_path / "deep" / "prm.jsonl"
    n = write_prm_data([(PROBLEM, PROBLEM.solution), (PROBLEM, "7+5=13\n13*3=39"), (PROBLEM, "  \n")], out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert n == len(rows) == 2  # the blank completion has no step: left out
    assert rows[0] == {"id": "chain/0", "prompt": [{"role": "user", "content": "7+5*3-4:"}],
                       "completions": ["7+5=12", "12*3=36", "36-4=32"], "labels": [True, True, True]}
    assert rows[1]["completions"] == ["7+5=13", "13*3=39"] and rows[1]["labels"] == [False, False]
