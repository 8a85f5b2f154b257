"""Groups -> the tensors a policy update reads.

    sample_tensors(groups, ...)   rewards / validity / correctness as [P, G] tensors, with overlong
                                  filtering or soft punishment applied
    collate(groups, pad_id)       a Batch: [prompt (left-padded) | completion (right-padded)]
    MicroBatching                 rows -> micro-batches: a row cap, and optionally a token budget
    Batch.select(rows, trim=True) a micro-batch cut to its own width (padding dropped)
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

import torch

from rlvr.run.sharding import lockstep_passes

from rlvr.rollout.episodes import verifier_score
from rlvr.rollout.groups import Group, is_correct
from rlvr.verifiers.base import Reward


@dataclass
class SampleTensors:
    """Per-sample quantities laid out ``[P, G]`` (prompt, sample)."""

    scores: torch.Tensor  # reward used for advantages (after failure handling and shaping)
    raw_scores: torch.Tensor  # the score as given (the verifier's, plus an episode's turn rewards)
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
    """Pass/fail ``[P, G]`` of verifier rewards: status ok and the verifier's own score >= ``threshold``
    (:func:`~rlvr.rollout.groups.is_correct`: an episode's turn rewards shape the trained score but never
    decide pass/fail, so a binary verifier's accuracy is still logged when turn rewards are non-zero).
    Without a threshold only binary rewards (every ok verifier score 0 or 1) pass or fail, at 1;
    continuous ones give None: no accuracy is logged rather than a fake one."""
    if threshold is None:
        if not {verifier_score(r) for row in rewards for r in row if r.status == "ok"} <= {0.0, 1.0}:
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
    correct = verdicts([g.verdicts for g in groups], success_threshold)
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

    def select(self, index: torch.Tensor, *, trim: bool = False) -> "Batch":
        """The rows ``index``. With ``trim`` they are cut to their own width as well: the prompt part to
        their longest prompt and the completion part to their longest completion (:func:`trim_window`),
        every ``[n, T]`` field alike. Only padding is dropped, which every loss masks: a trimmed
        micro-batch has the same loss as the untrimmed one, over fewer positions."""
        if not trim:
            return Batch(**{f.name: (v[index] if isinstance(v := getattr(self, f.name), torch.Tensor) else v)
                            for f in fields(self)})
        columns, length = trim_window(self.attention_mask, self.completion_len, index, self.response_mask)
        sequence = ("input_ids", "attention_mask")  # [N, W + T]; every other 2-D field is per token [N, T]

        def cut(name: str, v):
            if not isinstance(v, torch.Tensor):
                return v
            if name in sequence:
                return v[index, columns]  # a tensor index with a slice: one contiguous copy
            return v[index, :length] if v.dim() == 2 else v[index]

        return Batch(**{f.name: cut(f.name, getattr(self, f.name)) for f in fields(self)})

    def __len__(self) -> int:
        return self.input_ids.shape[0]


# ---------------------------------------------------------------------------------------------
# Micro-batches: rows packed under a token budget, each cut to its own width
# ---------------------------------------------------------------------------------------------


def row_extents(attention_mask: torch.Tensor, completion_len: int,
                response_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(prompt [N], completion [N])`` in tokens: how far each row's left-padded prompt reaches back
    from column W (its first real token on), and how far its right-padded completion reaches (to its
    last real token, or last loss token of ``response_mask``, inclusive). Taken from where the tokens
    are, not from counts, so masked tokens inside a row are kept."""
    rows, width = attention_mask.shape[0], attention_mask.shape[1] - completion_len
    device = attention_mask.device
    completion = attention_mask[:, width:] != 0  # [N, T]
    if response_mask is not None:
        completion = completion | (response_mask != 0)
    # the furthest real column, counted from W: (column's distance) * (real) and its max over the row
    reach = (completion * torch.arange(1, completion_len + 1, device=device)).amax(dim=1) if completion_len \
        else torch.zeros(rows, dtype=torch.long, device=device)
    back = ((attention_mask[:, :width] != 0) * torch.arange(width, 0, -1, device=device)).amax(dim=1) if width \
        else torch.zeros(rows, dtype=torch.long, device=device)
    return back, reach


def trim_window(attention_mask: torch.Tensor, completion_len: int, rows: torch.Tensor,
                response_mask: torch.Tensor | None = None) -> tuple[slice, int]:
    """``(columns, length)`` for the micro-batch ``rows`` of a ``[N, W + T]`` batch: ``columns`` the slice
    of the W + T columns they need (their longest prompt before W, their longest completion after it)
    and ``length`` the completion part's width in it (at least 1: a batch always has a completion column)."""
    width = attention_mask.shape[1] - completion_len
    back, reach = row_extents(attention_mask[rows], completion_len,
                              response_mask[rows] if response_mask is not None else None)
    prompt = int(back.max()) if len(back) else 0
    length = max(1, int(reach.max()) if len(reach) else 1)
    return slice(width - prompt, width + length), length


@dataclass(frozen=True)
class MicroBatching:
    """How an update splits its rows into micro-batches (one forward and backward each): at most ``rows``
    rows (``train.micro_batch_size``) and, with ``tokens`` (``train.micro_batch_tokens``), at most
    ``tokens`` tokens, counted as a micro-batch runs once trimmed (``Batch.select(rows, trim=True)``):
    rows x (longest prompt + longest completion), where rows are counted as the shared-prompt forward
    lays them out, its prompts x the most rows of any one prompt (:func:`pack_rows`)."""

    rows: int
    tokens: int | None = None

    def split(self, batch, rows: torch.Tensor) -> list[torch.Tensor]:
        """``rows`` (indices into ``batch``: a :class:`Batch`, or anything with its ``input_ids``,
        ``attention_mask`` and ``completion_len``) as micro-batches of row indices, each in batch order.

        Without a token budget: consecutive runs of ``self.rows`` rows, in the order given. With one, the
        rows are packed longest first (:func:`pack_rows`): similar lengths share a micro-batch, so little of
        it is padding, and a long-tailed batch runs its many short rows in a few wide micro-batches."""
        if self.tokens is None or len(rows) == 0:
            return list(rows.split(self.rows)) if len(rows) else []
        back, reach = row_extents(batch.attention_mask[rows], batch.completion_len,
                                  batch.response_mask[rows] if getattr(batch, "response_mask", None) is not None
                                  else None)
        from rlvr.modeling.logprobs import prompt_index  # not at the top: rlvr.modeling.logprobs imports this module

        _, source = prompt_index(batch.input_ids[rows], batch.attention_mask[rows], batch.completion_len)
        packs = pack_rows(back.tolist(), reach.clamp(min=1).tolist(), source.tolist(), self.rows, self.tokens)
        # each micro-batch back in batch order: a group's rows (one prompt) side by side, as the
        # shared-prompt log-prob passes lay them out (rlvr/modeling/logprobs.py)
        return [rows[torch.tensor(sorted(pack), dtype=torch.long, device=rows.device)] for pack in packs]


    def passes(self, batch, rows: torch.Tensor, model) -> list[torch.Tensor | None]:
        """The micro-batches this rank runs over ``rows`` (:meth:`split`), then, for a sharded ``model``,
        ``None`` up to the most any rank formed (:func:`rlvr.run.sharding.lockstep_passes`: FSDP2 gathers
        every layer in each forward, so every rank makes as many); a ``None`` is a pass whose result the
        caller discards (a zero-weight backward, a repeated no-grad pass)."""
        parts = self.split(batch, rows)
        return parts + [None] * (lockstep_passes(model, len(parts)) - len(parts))


def pack_rows(prompt: list[int], completion: list[int], source: list[int], max_rows: int,
              max_tokens: int) -> list[list[int]]:
    """Positions ``0 .. n-1`` of rows with these prompt and completion lengths (tokens) and prompts
    (``source``: rows of one prompt share its forward), packed into micro-batches of at most
    ``max_rows`` rows and ``max_tokens`` tokens each.

    A micro-batch costs cells x (longest prompt + longest completion) of its rows, where cells = its
    prompts x the most rows of any one prompt: rlvr's shared-prompt forward lays rows out so (a prompt
    with fewer rows gets empty ones, which its attention still spans). For whole groups, or rows of
    distinct prompts, cells = rows. Next-fit over the rows sorted longest completion first (then
    longest prompt; ties keep batch order): each micro-batch holds rows of similar length. A row
    longer than the budget by itself is a micro-batch of its own."""
    order = sorted(range(len(prompt)), key=lambda i: (-completion[i], -prompt[i]))
    packs: list[list[int]] = []
    current: list[int] = []
    counts: dict[int, int] = {}  # the current micro-batch's rows per prompt
    width = length = most = 0  # its longest prompt and completion, the most rows of one prompt
    for i in order:
        w, l, m = max(width, prompt[i]), max(length, completion[i]), max(most, counts.get(source[i], 0) + 1)
        cells = (len(counts) + (source[i] not in counts)) * m
        if current and (len(current) + 1 > max_rows or cells * (w + l) > max_tokens):
            packs.append(current)
            current, counts, w, l, m = [], {}, prompt[i], completion[i], 1
        current.append(i)
        counts[source[i]] = counts.get(source[i], 0) + 1
        width, length, most = w, l, m
    if current:
        packs.append(current)
    return packs


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
