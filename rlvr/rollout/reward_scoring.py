"""A learned reward model as the training reward: scored in-process, in batches, on the trainer's device.

The verifier contract (one item at a time, in torch-free worker processes) cannot host a network, so a
reward model has this path of its own. For one batch of groups (``collect_groups`` calls it after the
verifiers ran):

    raw   = [RewardModel_m.score(prompt ids, completion ids) for m in 1..M]      # [M, N]
    z_m   = normalize(raw_m)            none | (r - running mean) / running std | (r - offset) / scale
    proxy = clip(ensemble(z), -c, c)    min | mean | mean_minus_std over the M models   -> [N]
    score = combine(proxy, rule-based verifier)   replace: proxy | add: proxy + v | gate: proxy if v passes

The ids are exactly the trainer's: the prompt as ``PromptEncoder`` encoded it and the completion as
generated (with its EOS when the model stopped), as ``rlvr train-rm`` tokenised its pairs. The scorer
implements :class:`rlvr.rollout.scoring.Scorer`: its result's ``gold`` holds the verifier's own rewards
(``group.gold``: logged as ``gold/`` next to ``proxy/reward``, never optimised: the gold-vs-proxy watch),
its ``rewards`` the scores. The results are ordinary :class:`Reward` objects, so advantages
and metrics downstream do not change; their ``components`` hold the ``proxy`` (what is optimised),
``rm`` (the reward model's own score: the ensemble over the raw scores, before normalisation and
clipping: what the gold is watched against) and, for an ensemble, each member's raw score ``rm/<i>``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from rlvr.algorithms.preference import combine_rewards
from rlvr.modeling.reward_model import RewardModel
from rlvr.rollout.groups import Group, verify_groups
from rlvr.rollout.scoring import ScoredGroups, Scorer
from rlvr.verifiers.base import Reward
from rlvr.verifiers.errors import InvalidValueError

if TYPE_CHECKING:
    from rlvr.verifiers.runner import VerifierRunner

# ---------------------------------------------------------------------------------------------
# Normalisation: running moments, merged batch by batch
# ---------------------------------------------------------------------------------------------


def merge_moments(count: int, mean: float, m2: float, x: torch.Tensor) -> tuple[int, float, float]:
    """Running (count, mean, M2 = sum of squared deviations) after the values ``x [n]`` (Chan et al.):

        delta = mean_x - mean;   n' = n + n_x;   mean' = mean + delta * n_x / n'
        M2'   = M2 + M2_x + delta^2 * n * n_x / n'
    """
    n_x = x.numel()
    if n_x == 0:
        return count, mean, m2
    x = x.double()
    mean_x = float(x.mean())
    m2_x = float(((x - mean_x) ** 2).sum())
    total = count + n_x
    delta = mean_x - mean
    return total, mean + delta * n_x / total, m2 + m2_x + delta * delta * count * n_x / total


def running_std(count: int, m2: float, eps: float = 1e-6) -> float:
    """The population std of the values seen, floored at ``eps`` (a constant score divides by ~0 otherwise)."""
    return max(math.sqrt(m2 / count), eps) if count else 1.0


# ---------------------------------------------------------------------------------------------
# Combining the proxy with a rule-based verifier, per sample: one small function per mode
# ---------------------------------------------------------------------------------------------


def _failed(partner: Reward) -> Reward | None:
    """The verifier could not check the sample: no reward (masked or 0, as verifier.on_failure says)."""
    return Reward(0.0, status=partner.status, info=partner.info) if partner.failed else None


def combine_replace(proxy: float, partner: Reward | None, **_: float) -> tuple[float, Reward | None]:
    """score = proxy."""
    return proxy, None


def combine_add(proxy: float, partner: Reward, **_: float) -> tuple[float, Reward | None]:
    """score = proxy + v (an abstaining verifier adds nothing), e.g. v a length penalty."""
    return proxy + (partner.score if partner.status == "ok" else 0.0), _failed(partner)


def combine_gate(proxy: float, partner: Reward, *, min_score: float, fail_score: float) -> tuple[float, Reward | None]:
    """score = proxy where v passes (status ok, v >= min_score), else fail_score: "RM reward only when
    the format check passes"."""
    passes = partner.status == "ok" and partner.score >= min_score
    return (proxy if passes else fail_score), _failed(partner)


COMBINES: dict[str, Callable[..., tuple[float, Reward | None]]] = {
    "replace": combine_replace, "add": combine_add, "gate": combine_gate,
}


# ---------------------------------------------------------------------------------------------
# The scorer
# ---------------------------------------------------------------------------------------------


class RewardScorer(Scorer):
    """One or more :class:`RewardModel` s turned into training rewards (see the module docstring).

    ``score(groups)`` returns the combined reward-model scores as the rewards and the verifier's as the
    gold; ``runner`` scores the partner verifier of ``combine: add | gate`` (``reward_model.verifier``).
    ``state_dict`` / ``load_state_dict`` carry the running normalisation through checkpoints.
    """

    def __init__(self, config, *, device: str, dtype: str, tokenizer=None, runner: "VerifierRunner | None" = None):
        self.config = config
        self.runner = runner
        if config.verifier is not None and runner is None:
            raise ValueError("RewardScorer: reward_model.verifier is set, so a verifier runner is needed to score it")
        self.models = [RewardModel(path, device=device, batch_size=config.batch_size, dtype=dtype)
                       for path in config.members]
        if tokenizer is not None:
            for path, model in zip(config.members, self.models):
                check_same_tokenizer(tokenizer, model.tokenizer, path)
        self.moments = [(0, 0.0, 0.0) for _ in self.models]  # per model: count, mean, M2

    def describe(self) -> str:
        """One line for the start of a run: what the training reward is, and that the verifier only watches."""
        section = self.config
        models = ", ".join(f"{path} ({model.head} head)" for path, model in zip(section.members, self.models))
        ensemble = f", ensemble {section.ensemble}" if len(self.models) > 1 else ""
        shaping = f"normalize {section.normalize}" + (f", clip {section.clip:g}" if section.clip is not None else "")
        combine = {"replace": "", "add": f" plus verifier {section.verifier.name if section.verifier else ''}'s score",
                   "gate": f" where verifier {section.verifier.name if section.verifier else ''} passes ({section.gate_fail_score:g} "
                           "where it fails)"}[section.combine]
        return (f"reward: the reward model {models}{ensemble} ({shaping}){combine}; the suites' verifiers only "
                "watch (gold/ metrics and the evaluation), they are not optimised")

    def proxy(self, prompts: Sequence[list[int]], completions: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(proxy [N], raw member scores [M, N])``; running statistics take this batch in first, so
        the first batch is normalised by its own mean and std."""
        section = self.config
        raw = torch.stack([model.score(prompts, completions).double() for model in self.models])  # [M, N]
        if section.normalize == "running":
            self.moments = [merge_moments(*m, r) for m, r in zip(self.moments, raw)]
            z = torch.stack([(r - mean) / running_std(n, m2) for (n, mean, m2), r in zip(self.moments, raw)])
        elif section.normalize == "fixed":
            z = (raw - section.offset) / section.scale
        else:
            z = raw
        proxy = combine_rewards(z, section.ensemble, k=section.ensemble_k)  # [N]
        if section.clip is not None:
            proxy = proxy.clamp(-section.clip, section.clip)
        return proxy.float(), raw.float()

    def score(self, groups: Sequence[Group]) -> ScoredGroups:
        """The combined reward-model scores as the rewards; the groups' (the verifier's) rewards as the gold."""
        section = self.config
        prompts = [g.prompt_ids for g in groups for _ in g.completions]
        completions = [list(comp.token_ids) for g in groups for comp in g.completions]
        proxy, raw = self.proxy(prompts, completions)
        rm = combine_rewards(raw, section.ensemble, k=section.ensemble_k)  # [N] the reward model's own score, unnormalised
        partners = (verify_groups(self.runner, list(groups), section.verifier.name, section.verifier.options)
                    if section.verifier is not None else [[None] * len(g.completions) for g in groups])
        combine = COMBINES[section.combine]
        rewards: list[list[Reward]] = []
        k = 0
        for partner_row in partners:
            row = []
            for partner in partner_row:
                score, failure = combine(float(proxy[k]), partner, min_score=section.gate_min_score, fail_score=section.gate_fail_score)
                components = {"proxy": float(proxy[k]), "rm": float(rm[k])}
                if len(self.models) > 1:
                    components.update({f"rm/{m}": float(raw[m, k]) for m in range(len(self.models))})
                if partner is not None and partner.status == "ok":
                    components[section.verifier.name] = partner.score
                reward = failure or Reward(score)
                reward.components = components
                row.append(reward)
                k += 1
            rewards.append(row)
        return ScoredGroups(rewards=rewards, gold=[list(g.rewards) for g in groups])

    def state_dict(self) -> dict[str, Any]:
        """The running normalisation's moments, per member."""
        return {"moments": [list(m) for m in self.moments]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.moments = [(int(n), float(mean), float(m2)) for n, mean, m2 in state["moments"]]


def check_same_tokenizer(policy_tokenizer, rm_tokenizer, path: str, *, field: str = "reward_model.path",
                         trained_by: str = "`rlvr train-rm`") -> None:
    """The reward model reads the policy's token ids as they are: its vocabulary must be the policy's."""
    if policy_tokenizer.get_vocab() != rm_tokenizer.get_vocab():
        raise InvalidValueError(
            f"{field}: {path} has a different tokenizer from the policy's (model.path); the model scores the "
            "policy's token ids as they are, so it must share the policy's vocabulary (train it with "
            f"{trained_by} from the policy's base model)")


def build_reward_scorer(config, device, tokenizer, runner: "VerifierRunner") -> RewardScorer | None:
    """The run's :class:`RewardScorer` (``runner`` scores its partner verifier), or None when
    ``config.reward_model`` is not set."""
    rm = config.reward_model
    if rm is None:
        return None
    return RewardScorer(rm, device=rm.device or str(device), dtype=rm.dtype or config.model.dtype, tokenizer=tokenizer,
                        runner=runner)
