"""Process rewards as pure functions: where steps end, their aggregation, their token-level rewards
(hand-computed values; rlvr/algorithms/process_rewards.py)."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.algorithms.process_rewards import (AGGREGATIONS, aggregate_step_scores, step_end_indices,
                                             step_token_rewards)
from rlvr.verifiers.errors import UnknownNameError

# ---------------------------------------------------------------------------------------------
# step_end_indices
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens, separator, expected", [
    # two steps: the first ends at its "\n" (index 2), the last at the last token
    (["1", "2", "\n", "3", "4"], "\n", [2, 4]),
    # one token holds the end of a step and the start of the next ("2\n3"): the step ends there
    (["1", "2\n3", "4"], "\n", [1, 2]),
    # a separator split over two tokens ends at the token completing it
    (["a", " k", "i ", "b"], " ki ", [2, 3]),
    # ... and a token that completes one step's separator and holds the whole next step: both end there
    (["a", " k", "i b"], " ki ", [2, 2]),
    (["step", "\n", "\n", "next"], "\n\n", [2, 3]),
    # trailing separator: no extra step after it
    (["a", "\n", "b", "\n"], "\n", [1, 3]),
    # no separator at all: one step ending at the last token
    (["a", "b", "c"], "\n", [2]),
    # whitespace-only tail (and an EOS decoded as ""): no step there
    (["a", "\n", " ", "\t", ""], "\n", [1]),
    (["a", "\n", "b", ""], "\n", [1, 3]),  # the final step ends at the last token, EOS included
    # empty steps (separators in a row, a leading separator) do not count
    (["\n", "a", "\n", "\n", "  ", "\n", "b"], "\n", [2, 6]),
    # blank or empty completion: no step
    (["  ", "\n"], "\n", []),
    ([], "\n", []),
    # a multi-character tag like Math-Shepherd's
    (["x", " ки", "y", " к", "и"], " ки", [1, 4]),
])
def test_step_end_indices(tokens, separator, expected):
    assert step_end_indices(tokens, separator) == expected


def test_exactly_one_index_per_step():
    steps = ["7+5=12", "12*3=36", "36-4=32"]
    text = "\n".join(steps)
    tokens = list(text) + [""]  # a character tokenizer, EOS last
    ends = step_end_indices(tokens, "\n")
    assert len(ends) == len(steps) and ends == [6, 14, len(tokens) - 1]
    assert [tokens[e] for e in ends[:-1]] == ["\n", "\n"]
    assert ends == sorted(set(ends))


def test_empty_separator_is_refused():
    with pytest.raises(ValueError, match="separator"):
        step_end_indices(["a"], "")


# ---------------------------------------------------------------------------------------------
# aggregate_step_scores
# ---------------------------------------------------------------------------------------------

SCORES = [[0.9, 0.2, 0.7], [0.5], [0.8, 0.6]]


@pytest.mark.parametrize("how, expected", [
    ("min", [0.2, 0.5, 0.6]),
    ("last", [0.7, 0.5, 0.6]),
    ("mean", [0.6, 0.5, 0.7]),  # (0.9 + 0.2 + 0.7) / 3, 0.5, (0.8 + 0.6) / 2
])
def test_aggregations_by_hand(how, expected):
    out = aggregate_step_scores(SCORES, how)
    assert out.shape == (3,) and out.dtype == torch.float32
    assert out.tolist() == pytest.approx(expected, abs=1e-6)


def test_a_completion_without_steps_gets_the_empty_value():
    assert aggregate_step_scores([[], [0.4]], "min").tolist() == pytest.approx([0.0, 0.4])
    assert aggregate_step_scores([[]], "mean", empty=-1.0).tolist() == [-1.0]
    assert aggregate_step_scores([], "last").shape == (0,)


def test_unknown_aggregation_lists_the_valid_ones():
    assert {"min", "last", "mean"} <= set(AGGREGATIONS.names())
    with pytest.raises(UnknownNameError, match="unknown step aggregation 'max'; valid step aggregations: last, mean, min"):
        aggregate_step_scores(SCORES, "max")


# ---------------------------------------------------------------------------------------------
# step_token_rewards
# ---------------------------------------------------------------------------------------------


def test_token_rewards_land_on_each_steps_last_token():
    tokens = [list("1+2=3\n3*2=6") + [""], list("5-1=4")]  # a batch of two completions
    ends = [step_end_indices(t, "\n") for t in tokens]
    assert ends == [[5, 11], [4]]
    rewards = step_token_rewards([[0.9, 0.3], [0.6]], ends, length=12)
    expected = torch.zeros(2, 12)
    expected[0, 5], expected[0, 11], expected[1, 4] = 0.9, 0.3, 0.6
    assert torch.equal(rewards, expected)
    assert rewards.sum(dim=1).tolist() == pytest.approx([1.2, 0.6])  # the step scores, nothing else


def test_two_steps_ending_on_one_token_both_count():
    """A token can close one step and hold the whole next one (step_end_indices gives [2, 2]): both rewards land."""
    ends = step_end_indices(["a", " k", "i b"], " ki ")
    rewards = step_token_rewards([[0.5, -0.25]], [ends], length=3)
    assert ends == [2, 2] and rewards.tolist() == [[0.0, 0.0, 0.25]]


def test_token_rewards_refuse_what_does_not_fit():
    with pytest.raises(ValueError, match="row 0 has a step ending at token 4, outside the 4 response tokens"):
        step_token_rewards([[0.5]], [[4]], length=4)
    with pytest.raises(ValueError, match="row 0 has 2 step scores but 1 step ends"):
        step_token_rewards([[0.5, 0.1]], [[1]], length=4)
    with pytest.raises(ValueError, match="2 rows of scores but 1 rows"):
        step_token_rewards([[0.5], [0.1]], [[1]], length=4)
    assert torch.equal(step_token_rewards([[]], [[]], 3), torch.zeros(1, 3))
    assert not math.isnan(step_token_rewards([[0.5]], [[0]], 1).item())
