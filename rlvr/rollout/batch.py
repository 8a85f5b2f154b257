"""Groups -> the tensors a policy update reads.

    sample_tensors(groups, ...)   rewards / validity / correctness as [P, G] tensors, with overlong
                                  filtering or soft punishment applied
    collate(groups, pad_id)       a Batch: [prompt (left-padded) | completion (right-padded)]
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

import torch

from rlvr.rollout.groups import Group, is_correct
from rlvr.verifiers.base import Reward


@dataclass
class SampleTensors:
    """Per-sample quantities laid out ``[P, G]`` (prompt, sample)."""

    scores: torch.Tensor  # reward used for advantages (after failure handling and shaping)
    raw_scores: torch.Tensor  # the verifier's score as given
    valid: torch.Tensor  # bool: enters group statistics and the loss
    correct: torch.Tensor | None  # bool: the verifier passed it (see :func:`verdicts`); None: no pass/fail
    truncated: torch.Tensor  # bool: finish_reason == "length"
    lengths: torch.Tensor  # completion tokens
    loss_weight: torch.Tensor  # 0/1: overlong filtering masks truncated samples out of the loss


def overlong_soft_penalty(lengths: torch.Tensor, max_len: int, buffer: int, penalty: float) -> torch.Tensor:
    """DAPO soft overlong punishment (added to the reward):

        0                                      if L <= max_len - buffer
        -penalty * (L - (max_len - buffer)) / buffer   if max_len - buffer < L <= max_len
    """
    start = max_len - buffer
    return -penalty * ((lengths.float() - start).clamp(min=0) / buffer).clamp(max=1.0)


def verdicts(rewards: Sequence[Sequence[Reward]], threshold: float | None) -> torch.Tensor | None:
    """Pass/fail ``[P, G]`` of verifier rewards: status ok and score >= ``threshold``. Without a
    threshold only binary rewards (every ok score 0 or 1) pass or fail, at 1; continuous ones give
    None: no accuracy is logged rather than a fake one."""
    if threshold is None:
        if not {r.score for row in rewards for r in row if r.status == "ok"} <= {0.0, 1.0}:
            return None
        threshold = 1.0
    return torch.tensor([[is_correct(r, threshold) for r in row] for row in rewards])


def sample_tensors(
    groups: list[Group],
    *,
    on_failure: str,
    success_threshold: float | None,
    overlong: str,
    max_new_tokens: int,
    overlong_buffer: int,
    overlong_penalty: float,
) -> SampleTensors:
    """Turn rewards into ``[P, G]`` tensors, applying failure handling and overlong treatment.

    A sample whose verification failed (timeout/error) is masked (``valid`` False: no advantage, no
    loss) when ``on_failure == "mask"``, or scored 0 when ``"zero"``. An ``abstain`` is always masked:
    the verifier gave no score to use.
    """
    raw = torch.tensor([[r.score for r in g.rewards] for g in groups], dtype=torch.float32)
    status = [[r.status for r in g.rewards] for g in groups]
    failed = torch.tensor([[s in ("timeout", "error") for s in row] for row in status])
    abstain = torch.tensor([[s == "abstain" for s in row] for row in status])
    valid = ~abstain & (~failed if on_failure == "mask" else torch.ones_like(failed))
    scores = torch.where(failed, torch.zeros_like(raw), raw)
    correct = verdicts([g.gold if g.gold is not None else g.rewards for g in groups], success_threshold)
    truncated = torch.tensor([[c.finish_reason == "length" for c in g.completions] for g in groups])
    lengths = torch.tensor([[len(c.token_ids) for c in g.completions] for g in groups])
    loss_weight = torch.ones_like(raw)
    if overlong == "soft":
        scores = scores + overlong_soft_penalty(lengths, max_new_tokens, overlong_buffer, overlong_penalty)
    elif overlong == "filter":
        loss_weight = (~truncated).float()
    return SampleTensors(scores, raw, valid, correct, truncated, lengths, loss_weight)


# ---------------------------------------------------------------------------------------------
# The padded batch
# ---------------------------------------------------------------------------------------------


@dataclass
class Batch:
    """Sequences laid out ``[left-padded prompt (W) | right-padded completion (T)]``.

    Every completion starts at column W, so the logits of the completion tokens are the model's
    last T + 1 positions (``logits_to_keep``) for every row.
    """

    input_ids: torch.Tensor  # [N, W + T]
    attention_mask: torch.Tensor  # [N, W + T]
    response_mask: torch.Tensor  # [N, T] 1 on sampled completion tokens that enter the loss (not environment tokens)
    engine_logp: torch.Tensor  # [N, T] sampling log-probs from the engine
    advantages: torch.Tensor  # [N] per sequence (critic-free), or [N, T] per token (PPO's GAE)
    old_logp: torch.Tensor | None = None  # [N, T] pi_old when a batch is used more than once
    ref_logp: torch.Tensor | None = None  # [N, T] reference log-probs when beta > 0
    old_values: torch.Tensor | None = None  # [N, T] the critic's V(s_t) at rollout time (PPO)
    returns: torch.Tensor | None = None  # [N, T] the critic's regression targets (PPO)

    @property
    def completion_len(self) -> int:
        return self.response_mask.shape[1]

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(**{f.name: (v.to(device) if isinstance(v := getattr(self, f.name), torch.Tensor) else v) for f in fields(self)})

    def select(self, index: torch.Tensor) -> "Batch":
        return Batch(**{f.name: (v[index] if isinstance(v := getattr(self, f.name), torch.Tensor) else v) for f in fields(self)})

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def collate(groups: list[Group], pad_id: int) -> Batch:
    """Pad every (prompt, completion) pair of ``groups`` into one :class:`Batch` (advantages zero). The
    response mask is 1 on the tokens the model sampled: a multi-turn episode's environment tokens
    (``Completion.loss_mask`` 0) are read by the model but enter no loss, KL, entropy or value term."""
    rows = [(g.prompt_ids, c) for g in groups for c in g.completions]
    width = max(len(p) for p, _ in rows)
    length = max(1, max(len(c.token_ids) for _, c in rows))
    ids, attention, logps, loss = [], [], [], []  # padded as lists, then one tensor each (not a tensor per row)
    for prompt, completion in rows:
        left, k = width - len(prompt), len(completion.token_ids)
        ids.append([pad_id] * left + list(prompt) + list(completion.token_ids) + [pad_id] * (length - k))
        attention.append([0] * left + [1] * (len(prompt) + k) + [0] * (length - k))
        logps.append(list(completion.logprobs) + [0.0] * (length - k))
        loss.append(list(completion.loss_mask if completion.loss_mask is not None else [1] * k) + [0] * (length - k))
    attention_mask = torch.tensor(attention, dtype=torch.long)
    return Batch(torch.tensor(ids, dtype=torch.long), attention_mask, torch.tensor(loss, dtype=torch.float32),
                 torch.tensor(logps, dtype=torch.float32), advantages=torch.zeros(len(rows)))
