"""The policy update both recipes share: clipped-surrogate steps over a rollout batch.

``policy_terms`` is the loss of one micro-batch (policy loss + KL in the loss + entropy bonus, with
its diagnostics); ``update_policy`` is the critic-free recipe's whole update built from it;
``rlvr/recipes/ppo.py`` builds its actor-critic update from the same function.

Everything reads a :class:`UpdateSettings`, the few config values an update needs, not the run's
whole config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from rlvr.algorithms.losses import KL_ESTIMATORS, aggregate, policy_loss
from rlvr.algorithms.off_policy import OFF_POLICY_CORRECTIONS
from rlvr.modeling.logprobs import completion_logprobs, no_grad_logprobs
from rlvr.run.sharding import is_sharded
from rlvr.rollout.batch import Batch, MicroBatching
from rlvr.run.runtime import Distributed, full_norm


@dataclass(frozen=True)
class UpdateSettings:
    """What a policy update reads from a run's config (``from_config``)."""

    algo: "object"  # rlvr.config.AlgorithmConfig: losses, clips, KL, entropy, epochs, minibatches
    temperature: float  # the sampling temperature: log-probs are taken of the distribution sampled from
    max_len: int  # the longest completion: generation.max_new_tokens, or environment.max_episode_tokens (the seq_mean_token_sum_norm denominator)
    micro_batch_size: int
    grad_clip: float
    old_logprobs: str  # "engine" | "recompute": where pi_old comes from when a batch is used twice
    off_policy: str = "none"  # the correction between pi_old and the engine's policy, "auto" resolved (resolve_off_policy)
    dist: Distributed = field(default_factory=Distributed)  # the ranks: global counts, summed gradients
    micro_batch_tokens: int | None = None  # a token budget per micro-batch (None: micro_batch_size rows each)

    @classmethod
    def from_config(cls, config, dist: Distributed | None = None, *, episodes: bool = False) -> "UpdateSettings":
        """``episodes``: the run plays multi-turn episodes, whose rows are up to
        ``environment.max_episode_tokens`` long (the ``max_len`` then)."""
        source = config.algorithm.old_logprobs
        if source == "auto":  # the engine's log-probs are pi_old only when they are the trainer's own
            source = "engine" if engine_is_exact(config) else "recompute"
        return cls(algo=config.algorithm, temperature=config.generation.temperature,
                   max_len=config.environment.max_episode_tokens if episodes else config.generation.max_new_tokens,
                   micro_batch_size=config.train.micro_batch_size,
                   grad_clip=config.optim.grad_clip, old_logprobs=source, off_policy=resolve_off_policy(config),
                   dist=dist or Distributed(),
                   micro_batch_tokens=config.train.micro_batch_tokens)

    @property
    def micro(self) -> MicroBatching:
        """How the passes split rows into micro-batches: the row cap and the token budget."""
        return MicroBatching(self.micro_batch_size, self.micro_batch_tokens)

    @property
    def single_pass(self) -> bool:
        """One epoch of one minibatch: the sampling policy is the policy being differentiated."""
        return self.algo.ppo_epochs == 1 and self.algo.minibatches == 1


# ---------------------------------------------------------------------------------------------
# One micro-batch's policy loss
# ---------------------------------------------------------------------------------------------


@dataclass
class MicroLoss:
    loss: torch.Tensor  # the scalar to backpropagate
    pg_loss: float  # its policy-loss part
    terms: dict[str, float]  # diagnostics, to be averaged over tokens (see TokenMeans)
    logp: torch.Tensor  # [n, T] the policy's log-probs of the sampled tokens, with gradient


def policy_terms(policy, micro: Batch, settings: UpdateSettings, *, num_seqs: int, num_tokens: float) -> MicroLoss:
    """The loss of one micro-batch of a minibatch of ``num_seqs`` sequences and ``num_tokens`` loss
    tokens (the aggregation's denominators, so that micro-batch losses add up to the minibatch's):

        loss = policy_loss(logp, old_logp, A)  [+ beta * KL(pi || ref) in the loss]  [- c_H * entropy]
    """
    algo = settings.algo
    agg = dict(num_seqs=num_seqs, num_tokens=num_tokens, max_len=settings.max_len)
    logp, entropy = completion_logprobs(policy, micro.input_ids, micro.attention_mask, micro.completion_len,
                                        settings.temperature, with_entropy=True, entropy_grad=algo.entropy_coef > 0)
    old = logp.detach() if settings.single_pass else micro.old_logp
    weights, kept = off_policy_weights(settings, old, micro)
    loss, stats = policy_loss(logp, old, micro.advantages, micro.response_mask * kept if kept is not None else
                              micro.response_mask, clip_low=algo.clip_low, clip_high=algo.clip_high,
                              dual_clip=algo.dual_clip, agg=algo.loss_agg, loss=algo.policy_loss,
                              token_weights=weights, options=algo.loss_options, **agg)
    pg_loss = float(loss.detach())
    terms = {}
    if micro.ref_logp is not None:
        kl = KL_ESTIMATORS[algo.kl_estimator](logp, micro.ref_logp)
        terms["train/kl_ref"] = masked_mean(kl, micro.response_mask)
        if algo.kl_placement == "loss":
            loss = loss + algo.beta * aggregate(kl, micro.response_mask, algo.loss_agg, **agg)
    if algo.entropy_coef > 0:
        loss = loss - algo.entropy_coef * aggregate(entropy, micro.response_mask, algo.loss_agg, **agg)
    terms.update({
        "train/entropy": masked_mean(entropy, micro.response_mask),
        "train/clip_frac_low": stats.clip_frac_low,
        "train/clip_frac_high": stats.clip_frac_high,
        "train/dual_clip_frac": stats.dual_clip_frac,
        "train/ratio_mean": stats.ratio_mean,
        "train/approx_kl_old": stats.approx_kl,
        "train/ratio_max": stats.ratio_max,
        "train/capped_frac": stats.capped_frac,
        "train/seq_clip_frac": stats.seq_clip_frac,
    })
    if weights is not None:
        terms["train/off_policy_weight_mean"] = masked_mean(weights, micro.response_mask)
        terms["train/off_policy_kept_frac"] = masked_mean(kept, micro.response_mask)
    return MicroLoss(loss, pg_loss, terms, logp)


def engine_is_exact(config) -> bool:
    """Whether the engine's sampling log-probs are the trainer's own numbers for the policy being
    updated: the HF engine generates with the trainer's module, so in float32 and synchronously they
    agree to ~1e-6 (``mismatch/logprob_abs_diff_mean``). vLLM's kernels, bf16/fp16 arithmetic (the
    engine decodes in half precision, the trainer keeps float32 master weights) and asynchronous
    generation (an older policy sampled) all make them a different policy's."""
    return (config.engine.name == "hf" and config.model.dtype == "float32"
            and not config.async_generation.max_staleness)


def resolve_off_policy(config) -> str:
    """``algorithm.off_policy`` with ``auto`` resolved: ``none`` for an exact engine (every ratio is 1),
    ``decoupled`` for asynchronous generation (the correction that recovered most of what staleness 1
    cost the quickstart, docs/async-generation.md), else ``token_tis``: truncated importance sampling
    against the engine's numerics (Yao et al. 2025, "Your efficient RL framework secretly brings you
    off-policy RL training"), the default of peers that correct for it."""
    choice = config.algorithm.off_policy
    if choice != "auto":
        return choice
    if config.async_generation.max_staleness:
        return "decoupled"
    return "none" if engine_is_exact(config) else "token_tis"


def overlong_warning(config, max_len: int) -> str | None:
    """A warning when ``algorithm.overlong: soft`` would punish ordinary answers: its ramp starts at
    ``max_len - overlong_buffer`` tokens, and a ramp over half the budget or more punishes most answers
    the task wants (DAPO's paper: a 4,096-token buffer of 20,480). Measured on the quickstart (5 new
    tokens, buffer 4): the dapo preset learned to write shorter, wrong sums and fell from 0.74 to 0.06
    (benchmarks/README.md, "Policy losses"); with ``overlong: none`` it matched GRPO."""
    algo = config.algorithm
    if algo.overlong != "soft" or 2 * algo.overlong_buffer < max_len:
        return None
    start = max(0, max_len - algo.overlong_buffer)
    return (f"warning: algorithm.overlong: soft punishes every completion longer than {start} of its {max_len} "
            f"tokens (algorithm.overlong_buffer {algo.overlong_buffer}): most answers are penalised and the policy "
            f"learns to answer short; lower overlong_buffer (at most {max(1, (max_len - 1) // 2)}) or set "
            "algorithm.overlong: none")


def off_policy_weights(settings: UpdateSettings, old_logp: torch.Tensor,
                       micro: Batch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(weights, kept)`` ``[n, T]`` of the run's off-policy correction (``settings.off_policy``, capped
    at ``algorithm.off_policy_cap``) between pi_old (the proximal policy) and the engine's sampling
    policy, or ``(None, None)`` without one. A dropped token stays in the aggregation's denominator as
    a zero (dropping tokens never scales the others' gradient up)."""
    if settings.off_policy == "none":
        return None, None
    return OFF_POLICY_CORRECTIONS.get(settings.off_policy)(old_logp, micro.engine_logp, micro.response_mask,
                                                           cap=settings.algo.off_policy_cap)


class TokenMeans:
    """Token-weighted running means of per-micro-batch diagnostics (``add`` then ``means``); a key
    ending in ``_max`` keeps the largest value instead (e.g. ``train/ratio_max``)."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.maxima: dict[str, float] = {}
        self.weight = 0.0

    def add(self, terms: dict[str, float], weight: float) -> None:
        for key, value in terms.items():
            if key.endswith("_max"):
                self.maxima[key] = max(self.maxima.get(key, value), value)
            else:
                self.sums[key] = self.sums.get(key, 0.0) + value * weight
        self.weight += weight

    def means(self) -> dict[str, float]:
        return {**{key: value / max(self.weight, 1e-9) for key, value in self.sums.items()}, **self.maxima}


class Mismatch:
    """Trainer-inference mismatch on the sampled tokens, measured before the first optimizer step
    (afterwards the trainer has moved on purpose): |trainer logp - engine logp| (mean, max) and the
    KL from the engine's policy to the trainer's, k3 of the tokens the engine sampled:
    ``KL(pi_engine || pi_trainer) ~ mean_t (r_t - 1 - log r_t)``, ``r_t = pi_trainer / pi_engine``
    (unbiased, never negative; 0 exactly when the two agree)."""

    def __init__(self):
        self.total = self.weight = self.max = self.kl = 0.0

    def add(self, logp: torch.Tensor, micro: Batch) -> None:
        mask = micro.response_mask
        log_ratio = (logp.detach().to(torch.float32) - micro.engine_logp.to(torch.float32)).clamp(-20.0, 20.0)
        gap = log_ratio.abs() * mask
        self.total += float(gap.sum())
        self.kl += float(((log_ratio.exp() - 1.0 - log_ratio) * mask).sum())
        self.weight += float(mask.sum())
        self.max = max(self.max, float(gap.max()) if gap.numel() else 0.0)

    def metrics(self) -> dict[str, float]:
        if not self.weight:
            return {}
        return {"mismatch/logprob_abs_diff_mean": self.total / self.weight, "mismatch/logprob_abs_diff_max": self.max,
                "mismatch/kl": self.kl / self.weight}


# ---------------------------------------------------------------------------------------------
# The critic-free update
# ---------------------------------------------------------------------------------------------


def update_policy(policy, batch: Batch, optimizer: torch.optim.Optimizer, settings: UpdateSettings) -> dict[str, float]:
    """``ppo_epochs`` passes of ``minibatches`` optimizer steps over ``batch``; returns mean diagnostics.

    When the batch is used exactly once (one epoch, one minibatch) the policy that sampled it is the
    policy being differentiated, so pi_old = pi_theta.detach() and no extra pass is made. Otherwise
    pi_old comes from the engine's sampling log-probs or from one recomputing pass before any step.
    Rows whose loss is exactly zero whatever the weights (see :func:`rows_with_gradient`) are not
    computed at all; the loss denominators still count them, so the gradient is unchanged. The rest
    run in micro-batches of ``settings.micro`` (a row cap, and a token budget with rows packed by length),
    each cut to its own width: padding is neither computed nor in any loss.
    """
    algo = settings.algo
    if not settings.single_pass and batch.old_logp is None:
        batch.old_logp = old_logprobs(policy, batch, settings)
    n = len(batch)
    minibatch_size = math.ceil(n / algo.minibatches)
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    sharded = is_sharded(policy)
    means, mismatch = TokenMeans(), Mismatch()
    loss_total, pg_total, grad_norms, computed_rows = 0.0, 0.0, [], 0
    for epoch in range(algo.ppo_epochs):
        order = torch.randperm(n) if not settings.single_pass else torch.arange(n)
        for start in range(0, n, minibatch_size):
            minibatch = batch.select(order[start : start + minibatch_size].to(batch.input_ids.device))
            rows = rows_with_gradient(minibatch, algo)
            computed_rows += len(rows)
            counts = global_counts(minibatch, settings.dist)
            optimizer.zero_grad(set_to_none=True)  # the first backward writes the gradients, no zeroing pass
            for micro_rows in settings.micro.passes(minibatch, rows, policy):
                if micro_rows is None:  # a sharded policy: another rank has more micro-batches than this one
                    zero_weight_pass(policy, minibatch, settings, counts)
                    continue
                micro = minibatch.select(micro_rows, trim=True)  # [n, W' + T']: this micro-batch's own width
                part = policy_terms(policy, micro, settings, **counts)
                part.loss.backward()
                loss_total, pg_total = loss_total + part.loss.item(), pg_total + part.pg_loss
                if not grad_norms:  # before any step
                    mismatch.add(part.logp, micro)
                means.add(part.terms, float(micro.response_mask.sum()))
            for p in params:  # no active rows (or a parameter outside the graph): a zero-gradient step
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            if not sharded:  # FSDP2 reduced them in the backward
                settings.dist.sum_gradients(params)
            grad_norms.append(full_norm(torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)))
            optimizer.step()
    steps = len(grad_norms)
    out = means.means()
    out.update({
        "train/loss": loss_total / steps,  # each optimizer step's full loss, averaged over the steps
        "train/pg_loss": pg_total / steps,
        "train/grad_norm": sum(grad_norms) / steps,
        "train/optimizer_steps": float(steps),
        "train/computed_rows_frac": computed_rows / (n * algo.ppo_epochs),
    })
    out.update(mismatch.metrics())
    return out


def zero_weight_pass(policy, minibatch: Batch, settings: UpdateSettings, counts: dict[str, float]) -> None:
    """A forward and backward of ``minibatch``'s first row with weight 0: its gradient is 0, but a sharded
    policy's collectives run as on the ranks that compute real rows (``MicroBatching.passes``)."""
    first = minibatch.select(torch.arange(1, device=minibatch.input_ids.device), trim=True)
    (policy_terms(policy, first, settings, **counts).loss * 0.0).backward()


def global_counts(minibatch: Batch, dist: Distributed) -> dict[str, float]:
    """The loss denominators of a minibatch split over ranks: sequences and loss tokens of all ranks'
    parts together (a rank's loss is its part's numerator over these, so the losses add up)."""
    return {"num_seqs": dist.sum(len(minibatch)), "num_tokens": dist.sum(float(minibatch.response_mask.sum()))}


def rows_with_gradient(minibatch: Batch, algo) -> torch.Tensor:
    """Indices of the rows whose loss can be non-zero.

    A row with no unmasked token contributes nothing. Without a KL term in the loss and without an
    entropy bonus, a row whose advantages are all 0 (e.g. every sample of a zero-variance group)
    contributes exactly 0 as well: -A * rho = 0 for any rho. Those rows are not computed.
    Advantages may be per sequence ``[N]`` or per token ``[N, T]``.
    """
    active = minibatch.response_mask.sum(dim=1) > 0
    kl_in_loss = algo.beta > 0 and algo.kl_placement == "loss"
    if not kl_in_loss and algo.entropy_coef == 0:
        adv = minibatch.advantages
        active &= (adv != 0) if adv.dim() == 1 else ((adv * minibatch.response_mask) != 0).any(dim=1)
    return active.nonzero().squeeze(1)


# ---------------------------------------------------------------------------------------------
# pi_old
# ---------------------------------------------------------------------------------------------


def old_logprobs(policy, batch: Batch, settings: UpdateSettings) -> torch.Tensor:
    """pi_old ``[N, T]`` for a batch used more than once: the engine's, or one recomputing pass."""
    if settings.old_logprobs == "engine":
        return batch.engine_logp
    return no_grad_logprobs(policy, batch, settings.micro, settings.temperature)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values.detach() * mask).sum() / mask.sum().clamp(min=1))
