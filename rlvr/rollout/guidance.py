"""Solution guidance: a group that got nothing right learns from its problem's gold solution.

On-policy RL only sharpens what the policy can already sample: a group whose G samples all fail has
zero advantage everywhere and teaches nothing, and a problem the policy never solves stays unsolved
(``docs/quickstart.md`` measures starts where a third of the problems are out of reach). With
``algorithm.guidance: solution`` such a group's last sample (its last ``algorithm.guidance_samples``)
is replaced by the problem's gold ``solution`` (tokenised as ``rlvr sft`` tokenises it: the text,
then end-of-sequence), scored by the verifier like any sample. The group then holds a success among
failures, so the group baseline
gives the solution a positive advantage and the policy's own failures a negative one: an
advantage-weighted imitation step on exactly the problems RL cannot reach yet. This is the idea of
off-policy guidance (LUFFY: Yan et al. 2025, "Learning to Reason under Off-Policy Guidance"), without
its policy shaping.

The solution was not sampled by the policy, so it has no sampling log-probs; its pi_old is the
policy's own log-prob of it at rollout time (:func:`policy_logprobs_of_rows`). With one epoch of one
minibatch its gradient is then ``A * grad log pi(solution)``; with more, the clip measures how far
the policy moved during the step, as for every row.

Left alone: problems without a solution, solutions longer than ``generation.max_new_tokens`` (the
policy could not have written them), and solutions the verifier does not pass (counted, never
trained towards). The step's reward and accuracy metrics stay those of the policy's own samples;
``rollout/guided_frac`` is the share of groups that got a solution.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from rlvr.engines.base import Completion
from rlvr.rollout.batch import Batch
from rlvr.rollout.groups import Group, is_correct, verify_groups
from rlvr.modeling.logprobs import no_grad_logprobs
from rlvr.run.sharding import is_sharded
from rlvr.verifiers.runner import VerifierRunner


@dataclass
class Guidance:
    """The groups to train on and where the solutions went."""

    groups: list[Group]  # the input groups, with the solution in place of the last samples where guided
    rows: list[int]  # flat row indices (group * G + sample) that hold a solution
    guided: int = 0  # groups that got their solution
    rejected: int = 0  # solutions the verifier did not pass (not injected)
    too_long: int = 0  # solutions longer than max_new_tokens (not injected)

    def metrics(self) -> dict[str, float]:
        return {"rollout/guided_frac": self.guided / max(1, len(self.groups)),
                "rollout/guidance_rejected": float(self.rejected), "rollout/guidance_too_long": float(self.too_long)}


def solution_encoder(tokenizer) -> Callable[[str], list[int]]:
    """Solution text -> completion token ids, as SFT builds its targets (no special tokens, then EOS);
    each distinct solution is tokenised once per run (the same problems come back epoch after epoch)."""
    eos = tokenizer.eos_token_id
    cache: dict[str, list[int]] = {}

    def encode(text: str) -> list[int]:
        if text not in cache:
            cache[text] = tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
        return list(cache[text])

    return encode


def guide_with_solutions(groups: list[Group], runner: VerifierRunner, *, encode: Callable[[str], list[int]],
                         verifier: str | None, options: dict | None, max_new_tokens: int,
                         threshold: float | None, copies: int = 1) -> Guidance:
    """Replace the last ``copies`` samples (at most G - 1: one of the policy's own stays) of every
    group with no correct sample by its problem's gold solution.

    A sample is correct when its status is ok and its score reaches ``threshold`` (``verifier.
    success_threshold``; 1.0 when unset). The input groups are not modified.
    """
    threshold = 1.0 if threshold is None else threshold
    copies = max(1, copies)
    candidates: list[tuple[int, Completion]] = []
    too_long = 0
    for k, group in enumerate(groups):
        solution = group.problem.solution
        if solution is None or any(is_correct(r, threshold) for r in group.rewards):
            continue
        ids = encode(solution)
        if len(ids) > max_new_tokens:
            too_long += 1
            continue
        candidates.append((k, Completion(token_ids=ids, text=solution, logprobs=[0.0] * len(ids), finish_reason="stop")))
    single = [Group(groups[k].suite, groups[k].problem, groups[k].prompt_ids, [c]) for k, c in candidates]
    rewards = verify_groups(runner, single, verifier, options) if single else []
    out, rows, rejected = list(groups), [], 0
    for (k, completion), (reward,) in zip(candidates, rewards):
        if not is_correct(reward, threshold):
            rejected += 1
            continue
        group, g = groups[k], len(groups[k].completions)
        n = min(copies, g - 1)
        out[k] = replace(group, completions=[*group.completions[:g - n], *[completion] * n],
                         rewards=[*group.rewards[:g - n], *[reward] * n])
        rows.extend(k * g + i for i in range(g - n, g))
    return Guidance(out, rows, len(candidates) - rejected, rejected, too_long)


def policy_logprobs_of_rows(policy, batch: Batch, rows: list[int], micro_batch_size, temperature: float) -> None:
    """Write the policy's log-probs of ``rows`` into ``batch.engine_logp`` (their pi at rollout time:
    the solutions were not sampled, so the engine has none)."""
    if not rows and not is_sharded(policy):
        return
    index = torch.tensor(rows or [0], device=batch.input_ids.device)  # a sharded policy: every rank makes the pass
    logp = no_grad_logprobs(policy, batch.select(index), micro_batch_size, temperature)
    if rows:
        batch.engine_logp[index] = logp * batch.response_mask[index]
