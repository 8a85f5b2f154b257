"""Process rewards: a score for each step of a completion, where the steps end, and how the step
scores become a reward (pure functions; the model that scores steps is ``rlvr/modeling/prm.py``).

A completion's steps are the pieces of its text between occurrences of a separator (``"\\n"`` by
default; Math-Shepherd writes ``"ки"``, PRM800K-style data one step per line). Published process reward
models (Math-Shepherd, Qwen2.5-Math-PRM, the PRM800K models) read each step's score at a *step tag*: a
special token the data inserts after every step, whose logit (or softmax over "good"/"bad") is the
probability that the solution is still correct at that point. Here no tag is inserted: the step's own
*last token* plays the tag's role, which is

* the token that completes the separator after the step, or
* for the final step (text after the last separator), the completion's last token (its EOS when the
  model stopped),

so a PRM is trained (``rlvr train-prm``) and read (:class:`rlvr.modeling.prm.ProcessRewardModel`) on
the policy's own tokens, with no tag the policy never generates.

Three uses of the step scores ``s_1..s_K`` (probabilities in [0, 1]) of one completion:

    aggregate   r = min_k s_k | s_K | mean_k s_k          (one reward per completion, for GRPO-family
                                                           estimators: :func:`aggregate_step_scores`)
    per token   r_t = s_k at the last token t of step k,  (a dense reward for PPO/GAE or REINFORCE-style
                      0 elsewhere                          returns: :func:`step_token_rewards`)

Example::

    from rlvr.algorithms.process_rewards import aggregate_step_scores, step_end_indices

    tokens = ["7", "+", "5", "=", "1", "2", "\\n", "1", "2", "*", "3", "=", "3", "6"]
    assert step_end_indices(tokens, "\\n") == [6, 13]
    assert aggregate_step_scores([[0.9, 0.2]], "min").tolist() == [0.20000000298023224]  # float32
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from rlvr.verifiers.plugins import Registry

# ---------------------------------------------------------------------------------------------
# Where each step ends, in tokens
# ---------------------------------------------------------------------------------------------


def step_end_indices(token_texts: Sequence[str], separator: str) -> list[int]:
    """The index of the token at which each step of a completion ends, one index per step.

    ``token_texts`` is the decoded text of each completion token in order (special tokens such as EOS
    as ``""``; :func:`rlvr.modeling.prm.token_pieces` makes it from ids). The completion's text,
    ``"".join(token_texts)``, is split at every occurrence of ``separator``:

    * a step followed by a separator ends at the token where the text first contains the whole
      separator (a separator split over two tokens ends at the token completing it);
    * the final step, the text after the last separator, ends at the last token, when it holds
      anything but whitespace (a trailing separator leaves no extra step);
    * an empty or whitespace-only piece (two separators in a row) is no step, and gets no index.

    A completion with no separator is one step ending at its last token (none when its text is
    blank). Indices never decrease; two steps share an index only when one token holds the end of a
    step and the whole of the next (a PRM then reads one score for both). The step's last token plays
    the part of the step tag published PRMs read their score at (see the module docstring).

        >>> step_end_indices(["a", "\\n", "b"], "\\n")
        [1, 2]
    """
    if not separator:
        raise ValueError("separator must be a non-empty string")
    token_ends, total = [], 0  # token_ends[i]: characters of the text up to and including token i
    for piece in token_texts:
        total += len(piece)
        token_ends.append(total)
    text = "".join(token_texts)
    ends: list[int] = []
    token, start = 0, 0  # token: the first token that may end the next step; start: where the step's text begins
    while True:
        found = text.find(separator, start)
        if found < 0:
            break
        stop = found + len(separator)  # the step's text ends with its separator at character stop - 1
        if text[start:found].strip():
            while token_ends[token] < stop:  # the first token whose text reaches past the separator
                token += 1
            ends.append(token)
        start = stop
    if text[start:].strip():
        ends.append(len(token_texts) - 1)
    return ends


# ---------------------------------------------------------------------------------------------
# Step scores -> one reward per completion (GRPO-family estimators)
# ---------------------------------------------------------------------------------------------

Aggregation = Callable[[torch.Tensor], torch.Tensor]  # step scores [K] (K >= 1) -> a scalar
AGGREGATIONS: Registry[Aggregation] = Registry("step aggregation", entry_point_group="rlvr.step_aggregations")


@AGGREGATIONS.register("min")
def aggregate_min(scores: torch.Tensor) -> torch.Tensor:
    """The weakest step: a solution is only as sound as its worst step (the PRM800K / Lightman et al.
    2023 choice; the default).  [K] -> []"""
    return scores.min()


@AGGREGATIONS.register("last")
def aggregate_last(scores: torch.Tensor) -> torch.Tensor:
    """The final step's score: a PRM trained Math-Shepherd style estimates at each step whether the
    answer is still reachable, so the last estimate judges the whole solution.  [K] -> []"""
    return scores[-1]


@AGGREGATIONS.register("mean")
def aggregate_mean(scores: torch.Tensor) -> torch.Tensor:
    """The average step: partial credit for partly sound solutions.  [K] -> []"""
    return scores.mean()


def aggregate_step_scores(scores: Sequence[Sequence[float]], how: str = "min", *, empty: float = 0.0) -> torch.Tensor:
    """One reward per completion from its step scores, with the aggregation ``how`` (``min``, ``last``,
    ``mean`` or a plugin's, from :data:`AGGREGATIONS`). A completion with no step (a blank
    completion) gets ``empty`` (default 0.0: no reasoning, no credit).  [N][K_i] -> [N] float32"""
    aggregate = AGGREGATIONS.get(how)
    out = [float(aggregate(torch.tensor(row, dtype=torch.float32))) if len(row) else float(empty) for row in scores]
    return torch.tensor(out, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# Step scores -> a reward on each step's last token (dense rewards)
# ---------------------------------------------------------------------------------------------


def step_token_rewards(scores: Sequence[Sequence[float]], ends: Sequence[Sequence[int]], length: int) -> torch.Tensor:
    """Token-level rewards of a batch of completions: zero everywhere except each step's score at its
    last token (summed where two steps end on one token) (``ends``, from :func:`step_end_indices`, indices into the completion's tokens, the
    columns of the batch's response tokens).  ``scores``, ``ends``: [N][K_i] -> [N, length] float32

    Each row needs as many ends as scores, and every end must lie in ``[0, length)``; anything else is
    a ``ValueError`` (a silently dropped step would be a reward lost)."""
    if len(scores) != len(ends):
        raise ValueError(f"step_token_rewards: {len(scores)} rows of scores but {len(ends)} rows of step ends")
    rewards = torch.zeros(len(scores), length, dtype=torch.float32)  # [N, T]
    for i, (row, row_ends) in enumerate(zip(scores, ends)):
        if len(row) != len(row_ends):
            raise ValueError(f"step_token_rewards: row {i} has {len(row)} step scores but {len(row_ends)} step ends")
        for score, end in zip(row, row_ends):
            if not 0 <= end < length:
                raise ValueError(f"step_token_rewards: row {i} has a step ending at token {end}, outside the "
                                 f"{length} response tokens")
            rewards[i, end] += score  # two steps can end on one token (it closes one and holds the next)
    return rewards


# ---------------------------------------------------------------------------------------------
# Step scores -> step rewards (token-level estimators): one small function per form
# ---------------------------------------------------------------------------------------------

StepReward = Callable[[Sequence[float], float], list[float]]  # (p_1..p_K, baseline) -> r_1..r_K
STEP_REWARDS: Registry[StepReward] = Registry("step reward form", entry_point_group="rlvr.step_rewards")


@STEP_REWARDS.register("delta")
def delta_step_rewards(scores: Sequence[float], baseline: float) -> list[float]:
    """r_k = p_k - p_{k-1}, p_0 = baseline: each step is paid for how much it moved the PRM's estimate that
    the solution is on track. The sum telescopes to p_K - baseline, so neither writing more sound steps
    (each adds ~0) nor stopping early (a solution cut short ends on a low p_K) earns anything; what a step
    changes is where the credit lands.  [K] -> [K]"""
    previous = [baseline, *scores[:-1]]
    return [p - q for p, q in zip(scores, previous)]


@STEP_REWARDS.register("potential")
def potential_step_rewards(scores: Sequence[float], baseline: float) -> list[float]:
    """Potential-based shaping (Ng, Harada and Russell 1999) with Phi = the PRM's estimate after each step and
    Phi = 0 once the answer ends: r_k = p_k - p_(k-1) for k < K, and r_K = -p_(K-1) (p_0 = baseline). The
    sum is -baseline for every solution, so the PRM cannot change which policy is best, only where the
    credit for the outcome lands within a solution; it cannot be gamed by writing more or fewer steps, or
    steps it misjudges.  [K] -> [K]"""
    if not scores:
        return []
    previous = [baseline, *scores[:-1]]
    return [p - q for p, q in zip(scores[:-1], previous)] + [-previous[-1]]


@STEP_REWARDS.register("shifted")
def shifted_step_rewards(scores: Sequence[float], baseline: float) -> list[float]:
    """r_k = p_k - baseline on every step. The sum grows with the number of steps: baseline 1 (every step a
    penalty) pays a policy for writing fewer steps, down to none; baseline 0.5 pays it for padding with
    plausible ones (docs/process-rewards.md measures the first).  [K] -> [K]"""
    return [p - baseline for p in scores]
