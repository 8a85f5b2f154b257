"""The ``countdown`` verifier (extraction, the safe parser, number use, hostile input) and the
``countdown`` suite (seeded generator, held-out splits, the 256-problem file, self-check)."""

from __future__ import annotations

import builtins
import time
from fractions import Fraction

import pytest

from rlvr.tasks import get_task
from rlvr.tasks.countdown import Countdown, random_tree, reachable, solve, split_of
from rlvr.verifiers import get_verifier, list_verifiers
from rlvr.verifiers.countdown import MAX_DEPTH, MAX_EXPRESSION_CHARS, CountdownVerifier, evaluate, extract_expression

REF = {"numbers": [30, 100, 93], "target": 23}


@pytest.fixture(scope="module")
def verifier():
    return get_verifier("countdown")


# --- verifier: extraction -------------------------------------------------------------------------

@pytest.mark.parametrize("completion,expected,source", [
    ("think... <answer>30 - (100 - 93)</answer>", "30 - (100 - 93)", "answer_tag"),
    ("<answer>1+2</answer> then <answer> 30-(100-93) = 23 </answer>", "30-(100-93)", "answer_tag"),
    ("so $\\boxed{30 - (100 - 93)}$", "30 - (100 - 93)", "boxed"),
    ("Reasoning.\n30 - (100 - 93) = 23.\n", "30 - (100 - 93)", "last_line"),
    ("The answer is 30 × (100 − 93) ÷ 7", "30 * (100 - 93) / 7", "last_line"),
    ("<answer>23 = 30 - (100 - 93)</answer>", "30 - (100 - 93)", "answer_tag"),
    ("<answer>30 \\times 7 \\div 7</answer>", "30 * 7 / 7", "answer_tag"),
    ("", None, "none"),
])
def test_extraction(completion, expected, source):
    assert extract_expression(completion) == (expected, source)


def test_extract_modes_use_only_their_source():
    text = "<answer>1 + 2</answer>\n\\boxed{3 + 4}\n5 + 6"
    assert extract_expression(text, "boxed") == ("3 + 4", "boxed")
    assert extract_expression(text, "last_line")[0] == "5 + 6"
    assert extract_expression("no tags", "answer_tag") == (None, "none")
    with pytest.raises(ValueError, match="extract must be one of"):
        CountdownVerifier(extract="first_line")


# --- verifier: the parser --------------------------------------------------------------------------

@pytest.mark.parametrize("text,value,used", [
    ("30 - (100 - 93)", Fraction(23), [30, 100, 93]),
    ("100 / 8 * 2", Fraction(25), [100, 8, 2]),
    ("1 - 2 - 3", Fraction(-4), [1, 2, 3]),  # left-associative
    ("2 * 3 + 4 * 5", Fraction(26), [2, 3, 4, 5]),  # precedence
    ("-(-7) + +3", Fraction(10), [7, 3]),
    ("7 / 2", Fraction(7, 2), [7, 2]),  # exact rationals, no float rounding
    ("((((5))))", Fraction(5), [5]),
])
def test_parser_values(text, value, used):
    assert evaluate(text) == (value, used)


@pytest.mark.parametrize("text,reason", [
    ("30 ** 2", "unexpected '\\*'"), ("2 ^ 3", "unexpected character"), ("1.5 + 2", "whole numbers"),
    ("(1 + 2", "ends too early"), ("1 + 2)", "after a complete expression"), ("1 2", "after a complete"),
    ("5 / (3 - 3)", "division by zero"), ("", "empty"), ("__import__('os')", "unexpected character"),
    ("abs(3)", "unexpected character"), ("1e9", "unexpected character"), ("0x10", "unexpected character"),
])
def test_parser_rejects(text, reason):
    from rlvr.verifiers.countdown import ExpressionError

    with pytest.raises(ExpressionError, match=reason):
        evaluate(text)


def test_never_calls_eval(monkeypatch, verifier):
    def forbidden(*_args, **_kwargs):
        raise AssertionError("eval/exec/compile must not be used")

    for name in ("eval", "exec", "compile"):
        monkeypatch.setattr(builtins, name, forbidden)
    assert verifier.score("<answer>30 - (100 - 93)</answer>", REF).score == 1.0


# --- verifier: scoring -------------------------------------------------------------------------------

@pytest.mark.parametrize("completion,score,reason", [
    ("<answer>30 - (100 - 93)</answer>", 1.0, None),
    ("<answer>93 - 100 + 30</answer>", 1.0, None),
    ("<answer>30 - (100 - 93) + 30 - 30</answer>", 0.0, "uses 30 3 times"),
    ("<answer>23</answer>", 0.0, "not one of the given numbers"),
    ("<answer>30 - 7</answer>", 0.0, "not one of the given numbers"),
    ("<answer>100 - 93 + 30</answer>", 0.0, "evaluates to 37, not 23"),
    ("<answer>100 - 93</answer>", 0.0, "evaluates to 7"),
    ("<answer>30 / (100 - 100)</answer>", 0.0, "division by zero"),
    ("no expression here", 0.0, "no expression found"),
])
def test_scores(verifier, completion, score, reason):
    r = verifier.score(completion, REF)
    assert (r.score, r.status) == (score, "ok")
    if reason:
        assert reason in r.info["reason"]


def test_at_most_once_by_default_exactly_once_on_request(verifier):
    ref = {"numbers": [30, 100, 93, 5], "target": 23}
    assert verifier.score("<answer>30 - (100 - 93)</answer>", ref).score == 1.0
    strict = get_verifier("countdown", use_all=True)
    r = strict.score("<answer>30 - (100 - 93)</answer>", ref)
    assert r.score == 0.0 and "missing [5]" in r.info["reason"]
    assert strict.score("<answer>(30 - (100 - 93)) * 5 / 5</answer>", {**ref, "numbers": [30, 100, 93, 5, 5]}).score == 1.0
    # the reference's own use_all wins over the option
    assert verifier.score("<answer>30 - (100 - 93)</answer>", {**ref, "use_all": True}).score == 0.0
    assert strict.score("<answer>30 - (100 - 93)</answer>", {**ref, "use_all": False}).score == 1.0


def test_repeated_numbers_count_as_given(verifier):
    ref = {"numbers": [5, 5, 2], "target": 12}
    assert verifier.score("<answer>5 + 5 + 2</answer>", ref).score == 1.0
    assert verifier.score("<answer>5 + 5 + 2 + 5 - 5</answer>", ref).score == 0.0


@pytest.mark.parametrize("reference", [
    {}, {"numbers": [1, 2]}, {"numbers": [], "target": 1}, {"numbers": [1, "2"], "target": 3},
    {"numbers": [1, 2], "target": 1.5}, {"numbers": [1, 2], "target": 3, "use_all": "yes"}, "not a dict",
])
def test_broken_reference_is_an_error(verifier, reference):
    r = verifier.score("<answer>1 + 2</answer>", reference)
    assert r.status == "error" and r.failed


def test_hostile_inputs_are_bounded_and_fast(verifier):
    hostile = [
        "<answer>" + "(" * 5000 + "30" + ")" * 5000 + "</answer>",   # deep nesting
        "<answer>" + "-" * 5000 + "30</answer>",                       # deep unary chain
        "<answer>" + "1+" * 100_000 + "1</answer>",                    # long expression
        "1+" * 2_000_000 + "1",                                        # a huge last line
        "<answer>" * 200_000,                                          # unclosed tags
        "\\boxed{" * 200_000,                                          # unclosed boxes
        "<answer>" + "9" * 10_000 + "</answer>",                       # a giant literal
        "x" * 3_000_000,
    ]
    start = time.perf_counter()
    for text in hostile:
        r = verifier.score(text, REF)
        assert (r.score, r.status) == (0.0, "ok")
    assert time.perf_counter() - start < 3.0
    nested = "(" * (MAX_DEPTH + 1) + "30" + ")" * (MAX_DEPTH + 1)
    assert "deeper than" in verifier.score(f"<answer>{nested}</answer>", {"numbers": [30], "target": 30}).info["reason"]
    ok = "(" * (MAX_DEPTH - 1) + "30" + ")" * (MAX_DEPTH - 1)
    assert verifier.score(f"<answer>{ok}</answer>", {"numbers": [30], "target": 30}).score == 1.0
    assert MAX_EXPRESSION_CHARS <= 1000


def test_registered_and_pickles():
    import pickle

    assert "countdown" in list_verifiers()
    v = pickle.loads(pickle.dumps(get_verifier("countdown", use_all=True)))
    assert v.use_all and v.score("<answer>30 - (100 - 93)</answer>", REF).score == 1.0


# --- the solver and generator ------------------------------------------------------------------------

def test_solver():
    assert reachable([3])[Fraction(3)] == ("3", 3)
    values = reachable([1, 2, 3])
    assert {Fraction(6), Fraction(0), Fraction(9), Fraction(1, 6), Fraction(5)} <= set(values)
    for value, (text, _) in values.items():
        assert evaluate(text)[0] == value and sorted(evaluate(text)[1]) == [1, 2, 3]
    assert solve([30, 100, 93], 23) is not None and evaluate(solve([30, 100, 93], 23))[0] == 23
    assert solve([2, 3], 5) == "2 + 3" or evaluate(solve([2, 3], 5))[0] == 5
    assert solve([2, 3, 1000], 5) is not None                     # a subset is enough by default
    assert solve([2, 3, 1000], 5, use_all=True) is None           # but not with every number
    assert solve([1, 1], 7) is None
    assert evaluate(solve([4, 7, 8, 8], 24, use_all=True))[0] == 24


def test_random_trees_use_every_number_once():
    import random

    rng = random.Random(0)
    for _ in range(200):
        numbers = [rng.randint(1, 20) for _ in range(rng.randint(2, 6))]
        value, text = random_tree(numbers, rng)
        assert evaluate(text) == (value, evaluate(text)[1]) and sorted(evaluate(text)[1]) == sorted(numbers)


def test_generated_splits_are_seeded_disjoint_and_solvable(verifier):
    train = Countdown(split="train", n=2000, seed=1)
    again = Countdown(split="train", n=2000, seed=1)
    assert [p.prompt for p in train] == [p.prompt for p in again]
    assert [p.prompt for p in Countdown(split="train", n=50, seed=2)] != [p.prompt for p in train][:50]
    dev = Countdown(split="dev", n=300)
    test = Countdown(split="test", source="generate", n=300)
    sets = {name: {tuple(sorted(p.reference["numbers"])) for p in suite} for name, suite in
            [("train", train), ("dev", dev), ("test", test)]}
    assert not (sets["train"] & sets["dev"]) and not (sets["train"] & sets["test"]) and not (sets["dev"] & sets["test"])
    assert all(split_of(numbers) == name for name, s in sets.items() for numbers in s)
    assert len(sets["train"]) == 2000  # distinct number sets
    for suite in (train, dev, test):
        for p in suite:
            assert 1 <= p.reference["target"] <= 100 and len(p.reference["numbers"]) == 3
            assert verifier.score(p.solution, p.reference).score == 1.0
            assert get_verifier("countdown", use_all=True).score(p.solution, p.reference).score == 1.0  # uses all


def test_generator_options_and_errors():
    four = Countdown(split="train", n=50, num_numbers=4, min_number=1, max_number=10, min_target=10, max_target=20, use_all=True)
    assert all(len(p.reference["numbers"]) == 4 and 10 <= p.reference["target"] <= 20 for p in four)
    assert all(p.reference["use_all"] is True and "exactly once" in p.prompt[-1]["content"] for p in four)
    with pytest.raises(ValueError, match="num_numbers"):
        Countdown(split="train", num_numbers=1)
    with pytest.raises(ValueError, match="cannot draw"):
        Countdown(split="test", source="generate", n=50, num_numbers=2, max_number=3)
    with pytest.raises(ValueError, match="valid splits: train, dev, test"):
        Countdown(split="validation")
    with pytest.raises(ValueError, match="source must be"):
        Countdown(split="train", source="web")


def test_generated_sets_never_hold_the_benchmark_file_sets(data_dir):
    file_sets = {tuple(sorted(p.reference["numbers"])) for p in get_task("countdown", split="test")}
    for split, kw in [("train", {}), ("dev", {}), ("test", {"source": "generate"})]:
        generated = {tuple(sorted(p.reference["numbers"])) for p in get_task("countdown", split=split, **kw)}
        assert not generated & file_sets


# --- the 256-problem file: self-check ------------------------------------------------------------------

def test_file_problems_gold_one_corrupted_zero(data_dir, verifier):
    suite = get_task("countdown", split="test")
    assert len(suite) == 256 and suite.skipped == 0 and suite.source.endswith("countdown_cd3_test.jsonl")
    p = suite[0]
    assert p.reference == {"numbers": [30, 100, 93], "target": 23} and p.verifier == "countdown"
    assert "[30, 100, 93]" in p.prompt[-1]["content"] and "23" in p.prompt[-1]["content"]
    assert [verifier.score(q.solution, q.reference).score for q in suite] == [1.0] * 256
    # every file problem is solvable with all three numbers, so the strict rule holds too
    strict = get_task("countdown", split="test", use_all=True)
    assert len(strict) == 256 and all(verifier.score(q.solution, q.reference).score == 1.0 for q in strict)
    # corrupted: the target moved by one; and a wrong number swapped in
    for q in suite:
        expression = q.solution[len("<answer>"):-len("</answer>")]
        assert verifier.score(q.solution, {**q.reference, "target": q.reference["target"] + 1}).score == 0.0
        assert verifier.score(f"<answer>{expression} + 0 * 7777</answer>", q.reference).score == 0.0
        assert verifier.score(f"<answer>{expression} + 1</answer>", q.reference).score == 0.0


def test_audit_passes():
    from rlvr.verifiers.audit import audit

    report = audit("countdown")
    assert report.ok, [(r.id, r.verdict) for r in report.rows if r.verdict not in ("ok", "caught", "caught (error)")]
    assert {r.category for r in report.rows} >= {"golden", "hack", "giant", "pathological"}
