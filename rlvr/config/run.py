"""The config of the RL recipes (``rlvr train``): ``RunConfig`` and the sections only it has.

``algorithm.preset`` fills the algorithm defaults of a named recipe *under* whatever the file and overrides set:

    preset        advantage      loss_agg                 clip (low/high)  beta  extras
    grpo          grpo           seq_mean_token_mean      0.2 / 0.2        0.04  k3 KL in the loss
    dr_grpo       dr_grpo        seq_mean_token_sum_norm  0.2 / 0.2        0     -
    dapo          grpo           token_mean               0.2 / 0.28       0     dynamic sampling, soft overlong punishment
    rloo          rloo           token_mean               0.2 / 0.2        0.05  k1 KL in the reward
    reinforce_pp  reinforce_pp   token_mean               0.2 / 0.2        0.01  k1 KL in the reward
    gspo          grpo           seq_mean_token_mean      3e-4 / 4e-4      0     policy_loss gspo (the sequence ratio)
    cispo         grpo           token_mean               1 / 0.28         0     policy_loss cispo (no lower bound)
    gmpo          grpo           seq_mean_token_mean      0.4 / 0.4 (log)  0     policy_loss gmpo (geometric mean)

and the actor-critic recipe (``rlvr/recipes/ppo.py``, a learned critic in ``critic:``):

    ppo                 gae (lam 0.95)  token_mean          0.2 / 0.2        0.05  k1 KL in the reward, 4 epochs x 4 minibatches
    reinforce_baseline  gae (lam 1.0)   token_mean          unclipped        0.05  k1 KL in the reward, one pass
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from rlvr.config.loading import ConfigError
from rlvr.config.compatibility import CRITIC_PRESETS  # noqa: F401  (re-exported as rlvr.config.CRITIC_PRESETS)
from rlvr.config.sections import (CheckpointConfig, EnvironmentConfig, FieldError, LogConfig, ModelConfig, OptimConfig,
                                  ProcessConfig, RecipeConfig, Section, TaskConfig, VerifierConfig, check_stop_strings,
                                  plugin_options, registered)

class EngineConfig(Section):
    name: str = Field("hf", description="generation engine, from the engine registry (built-in: hf, vllm; plugins "
                      "add more)")
    max_batch_size: int = Field(256, ge=1, description="sequences generated together")
    options: dict[str, Any] = Field(
        default_factory=dict, description="engine-specific keyword options, e.g. for vllm: lora_sync (merge|adapter), "
        "gpu_memory_utilization, tensor_parallel_size, enable_prefix_caching, max_model_len, sleep_mode, "
        "enforce_eager, kv_cache_gib (see docs/engines.md)")
    canary: bool = Field(True, description="after every weight push, check that the engine's log-probs on a fixed "
                         "sequence equal the trainer's; stop the run when they do not")
    canary_tolerance: Optional[float] = Field(
        None, gt=0, description="max |engine - trainer| canary log-prob (nats); default by dtype: float32 1e-3, "
        "float16 0.1, bfloat16 0.5")

    _known_engine = field_validator("name")(lambda cls, v: registered("rlvr.engines:ENGINES", v))


class GenerationConfig(Section):
    max_new_tokens: int = Field(256, ge=1, description="tokens sampled per completion at most (per turn in an "
                                "episode); a completion cut here has finish_reason length")
    temperature: float = Field(1.0, gt=0, description="sampling temperature; log-probs are of the tempered "
                               "distribution")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling: the smallest token set of this "
                         "probability (1 = off)")
    top_k: int = Field(0, ge=0, description="0 = off")
    stop: list[str] = Field(default_factory=list, description="strings that end a completion (or an episode's turn) "
                            "when its text holds one, e.g. ['</answer>']: finish_reason stop; its token ids end with "
                            "the token that completed the string")
    include_stop: bool = Field(True, description="keep the stop string at the end of the completion's text (what the "
                               "verifier reads, e.g. a closing </answer> a format check wants); false cuts it off")
    overlong_prompts: Literal["skip", "error"] = Field(
        "skip", description="prompts that leave no room for max_new_tokens in the model's context: left out (counted "
        "and reported at start), or refuse to run")

    _stop_strings_are_not_empty = field_validator("stop")(check_stop_strings)


class AlgorithmConfig(Section):
    preset: Literal["grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "gspo", "cispo", "gmpo", "ppo",
                    "reinforce_baseline"] = Field(
        "grpo", description="the recipe whose defaults fill the algorithm keys the config leaves unset (the keys "
        "marked 'set by algorithm.preset'; docs/training.md, Presets); ppo and reinforce_baseline train a critic")
    advantage: str = Field("grpo", description="advantage estimator: grpo, dr_grpo, rloo, reinforce_pp, or a plugin's "
                           "(critic-free presets); gae (the critic presets ppo and reinforce_baseline)")
    policy_loss: str = Field("ppo_clip", description="per-token policy loss: ppo_clip (clipped surrogate), vanilla "
                             "(unclipped policy gradient), gspo (clipped sequence ratio), gspo_token (GSPO's sequence "
                             "ratio with per-token gradients), cispo (clipped, detached importance weight times "
                             "log-prob), sapo (soft temperature gate instead of the clip), gmpo (geometric mean of log-clipped "
                             "ratios; clip_low / clip_high bound the log-ratio), clip_cov / kl_cov (ppo_clip / the policy "
                             "gradient with high-covariance tokens detached / KL-penalised), or a plugin's")
    loss_options: dict[str, Any] = Field(
        default_factory=dict, description="keyword options of algorithm.policy_loss beyond the clip range, e.g. "
        "{tau_pos: 1.0, tau_neg: 1.05} (sapo's gate temperatures), {ratio: 2e-4, cov_low: 1, cov_high: 5} (clip_cov), "
        "{ratio: 2e-3, coef: 1} (kl_cov); the paper's values when unset (docs/training.md)")
    loss_agg: str = Field("seq_mean_token_mean", description="loss aggregation: token_mean, seq_mean_token_mean, "
                          "seq_mean_token_sum_norm, or a plugin's")
    clip_low: float = Field(0.2, ge=0, le=1, description="PPO clip: the ratio pi/pi_old is kept >= 1 - clip_low "
                            "(1 = no lower bound, cispo's)")
    clip_high: float = Field(0.2, ge=0, description="PPO clip: the ratio pi/pi_old is kept <= 1 + clip_high "
                             "(DAPO's clip-higher raises it)")
    dual_clip: Optional[float] = Field(None, gt=1, description="bound on the loss of negative advantages (e.g. 3)")
    beta: float = Field(0.0, ge=0, description="KL coefficient; 0 = no reference model and no reference pass")
    kl_estimator: str = Field("k3", description="KL estimator: k1, k2, k3, or a plugin's")
    kl_placement: Literal["loss", "reward"] = Field("loss", description="KL as a loss term, or subtracted from the reward")
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus coefficient")
    ppo_epochs: int = Field(1, ge=1, description="passes over each batch")
    minibatches: int = Field(1, ge=1, description="optimizer steps per pass")
    old_logprobs: Literal["auto", "engine", "recompute"] = Field(
        "auto",
        description="source of pi_old when a batch is used more than once: the engine's sampling log-probs, "
        "or a recomputing pass; auto = engine for the hf engine in float32, else recompute",
    )
    off_policy: str = Field(
        "auto", description="off-policy correction between the engine's sampling policy and pi_old "
        "(rlvr/algorithms/off_policy.py): none, token_tis (weights min(rho, cap)), seq_mask (drop sequences whose "
        "geometric-mean rho is beyond [1/cap, cap]), decoupled (AReaL: weights rho, tokens with rho > cap dropped), "
        "or a plugin's; auto = none when the engine's log-probs are the trainer's own (the hf engine in float32, "
        "synchronous), decoupled with asynchronous generation (max_staleness >= 1), else token_tis (vLLM, bf16/fp16)")
    off_policy_cap: float = Field(2.0, ge=1, description="the bound of algorithm.off_policy on rho = pi_old / pi_engine")
    _known_correction = field_validator("off_policy")(
        lambda cls, v: v if v == "auto" else registered("rlvr.algorithms.off_policy:OFF_POLICY_CORRECTIONS", v))
    dynamic_sampling: bool = Field(False, description="drop groups whose accuracy has zero variance and refill (DAPO)")
    max_resample_rounds: int = Field(4, ge=0, description="extra generation rounds to refill a dynamic-sampling batch")
    guidance: Literal["none", "solution"] = Field(
        "none", description="solution: a group with no correct sample trains on its problem's gold solution in place of "
        "its last sample (off-policy guidance, critic-free presets; see rlvr/rollout/guidance.py)")
    guidance_samples: int = Field(1, ge=1, description="guidance: how many of a guided group's samples the solution "
                                  "replaces (its last ones; at most group_size - 1)")
    overlong: Literal["none", "filter", "soft"] = Field("none", description="truncated samples: keep, mask out, or soft punishment")
    overlong_buffer: int = Field(4, ge=1, description="soft punishment ramps over the last N tokens before max_new_tokens")
    overlong_penalty: float = Field(1.0, ge=0, description="reward subtracted at max_new_tokens (soft punishment)")
    # ---- the critic presets (ppo, reinforce_baseline) only ----
    gamma: float = Field(1.0, ge=0, le=1, description="[critic presets] GAE discount per token")
    lam: float = Field(0.95, ge=0, le=1, description="[critic presets] GAE lambda: 1 = Monte Carlo return minus V, "
                       "0 = one-step TD error")
    whiten_advantages: bool = Field(True, description="[critic presets] z-score the advantages over the batch's real tokens")
    truncation: Literal["none", "zero", "bootstrap"] = Field(
        "none", description="[critic presets] a response cut by max_new_tokens: keeps its score (none), earns no "
        "score (zero), or earns no score and bootstraps from the critic's value after its last token (bootstrap)")
    value_clip: Optional[float] = Field(0.2, gt=0, description="[critic presets] clip range of the value loss around "
                                        "the rollout-time values (null = unclipped squared error)")
    value_coef: float = Field(0.5, gt=0, description="[critic presets] weight of the value loss (it has its own optimizer: "
                              "the weight matters relative to optim.grad_clip)")
    target_kl: Optional[float] = Field(None, gt=0, description="[critic presets] adaptive KL controller: beta moves to "
                                       "keep the per-sequence KL to the reference near this (null = fixed beta)")
    kl_horizon: int = Field(10000, ge=1, description="[critic presets] the adaptive controller's horizon, in sequences")
    early_stop_kl: Optional[float] = Field(None, gt=0, description="[critic presets] stop a step's remaining epochs when "
                                           "the approx KL to the rollout policy exceeds this (null = never)")

    @model_validator(mode="before")
    @classmethod
    def _tis_cap_removed(cls, raw: Any) -> Any:
        """``tis_cap: C`` was a second spelling of ``off_policy: token_tis`` with ``off_policy_cap: C``."""
        if isinstance(raw, dict) and "tis_cap" in raw:
            raise FieldError("tis_cap", f"removed; write algorithm.off_policy: token_tis and algorithm.off_policy_cap: "
                             f"{raw['tis_cap'] if raw['tis_cap'] is not None else 'C'} instead")
        return raw

    @model_validator(mode="after")
    def _loss_options_fit_the_loss(self) -> "AlgorithmConfig":
        """Each of ``loss_options`` is a named option of ``policy_loss`` and its value is one the loss takes:
        the loss runs once on a one-token batch with them, so its own checks speak now, not mid-run."""
        if not self.loss_options:
            return self
        from rlvr.algorithms.losses import check_loss_options

        try:
            check_loss_options(self.policy_loss, self.loss_options)
        except ValueError as exc:
            raise FieldError("loss_options", str(exc)) from None
        return self

    _known_advantage = field_validator("advantage")(
        lambda cls, v: v if v == "gae" else registered("rlvr.algorithms.advantages:ADVANTAGE_ESTIMATORS", v))
    _known_policy_loss = field_validator("policy_loss")(lambda cls, v: registered("rlvr.algorithms.losses:POLICY_LOSSES", v))
    _known_loss_agg = field_validator("loss_agg")(lambda cls, v: registered("rlvr.algorithms.losses:LOSS_AGGREGATIONS", v))
    _known_kl = field_validator("kl_estimator")(lambda cls, v: registered("rlvr.algorithms.losses:KL_ESTIMATORS", v))


PRESETS: dict[str, dict[str, Any]] = {
    "grpo": dict(advantage="grpo", loss_agg="seq_mean_token_mean", clip_low=0.2, clip_high=0.2, beta=0.04,
                 kl_estimator="k3", kl_placement="loss"),
    "dr_grpo": dict(advantage="dr_grpo", loss_agg="seq_mean_token_sum_norm", clip_low=0.2, clip_high=0.2, beta=0.0),
    "dapo": dict(advantage="grpo", loss_agg="token_mean", clip_low=0.2, clip_high=0.28, beta=0.0,
                 dynamic_sampling=True, overlong="soft"),
    "rloo": dict(advantage="rloo", loss_agg="token_mean", clip_low=0.2, clip_high=0.2, beta=0.05,
                 kl_estimator="k1", kl_placement="reward"),
    "reinforce_pp": dict(advantage="reinforce_pp", loss_agg="token_mean", clip_low=0.2, clip_high=0.2, beta=0.01,
                         kl_estimator="k1", kl_placement="reward"),
    "gspo": dict(advantage="grpo", policy_loss="gspo", loss_agg="seq_mean_token_mean", clip_low=3e-4, clip_high=4e-4,
                 beta=0.0),
    "cispo": dict(advantage="grpo", policy_loss="cispo", loss_agg="token_mean", clip_low=1.0, clip_high=0.28, beta=0.0),
    "gmpo": dict(advantage="grpo", policy_loss="gmpo", loss_agg="seq_mean_token_mean", clip_low=0.4, clip_high=0.4,
                 beta=0.0),
    "ppo": dict(advantage="gae", loss_agg="token_mean", clip_low=0.2, clip_high=0.2, beta=0.05, kl_estimator="k1",
                kl_placement="reward", ppo_epochs=4, minibatches=4, lam=0.95),
    "reinforce_baseline": dict(advantage="gae", policy_loss="vanilla", loss_agg="token_mean", beta=0.05,
                               kl_estimator="k1", kl_placement="reward", ppo_epochs=1, minibatches=1, lam=1.0,
                               value_clip=None),
}
#: Presets whose advantages come from a learned critic (the ``rlvr/recipes/ppo.py`` recipe): CRITIC_PRESETS,
#: imported from rlvr.config.compatibility, whose table refuses what they do not combine with.
#: Algorithm keys that only a critic preset reads.
CRITIC_ALGORITHM_KEYS = ("gamma", "lam", "whiten_advantages", "truncation", "value_clip", "value_coef", "target_kl",
                         "kl_horizon", "early_stop_kl")


class AsyncGenerationConfig(Section):
    """Generation in a process of its own, overlapping the update (rlvr/rollout/async_rollout.py)."""

    max_staleness: Optional[int] = Field(
        None, ge=0, description="null: the engine generates in the trainer's process, step after step (the default). "
        "S >= 0: the HF engine runs in its own process with S steps in flight: a step trains on samples of the policy "
        "S updates old at most (0: the synchronous loop exactly, through the worker)")
    worker_threads: Optional[int] = Field(
        None, ge=1, description="torch threads of the generator process; null = as many as the trainer's at "
        "max_staleness 0 (they never run together), else half the cores (at least 1)")
    timeout_s: float = Field(300.0, gt=0, description="the longest wait for the generator (to start, to serve a "
                             "weight publication or a generation); past it the run stops with an error")
    device: Optional[str] = Field(
        None, description="where the generator process holds its copy of the model (in model.dtype) and samples: "
        "cpu, cuda, cuda:N (a GPU of its own, e.g. cuda:1) or auto; null = the trainer's (train.device)")

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: Optional[str]) -> Optional[str]:
        from rlvr.config.sections import DEVICE  # the spelling train.device takes

        if value is not None and not DEVICE.match(value):
            raise ValueError(f"{value!r} is not a device; use cpu, cuda, cuda:N, auto, or null (the trainer's)")
        return value


class TrainConfig(ProcessConfig):
    steps: int = Field(100, ge=1, description="training steps (one rollout and its update each)")
    prompts_per_step: int = Field(32, ge=1, description="problems drawn per step, over all ranks (P); each gets "
                                  "group_size completions")
    group_size: int = Field(8, ge=1, description="completions per prompt (G)")
    micro_batch_size: int = Field(64, ge=1, description="sequences per forward/backward (memory bound)")
    micro_batch_tokens: Optional[int] = Field(
        None, ge=1, description="tokens per forward/backward: rows sorted by length fill each micro-batch while rows x "
        "(longest prompt + longest completion) stays within this (rows counted as the shared-prompt forward lays them "
        "out: prompts x the most rows of one prompt; a longer row runs alone), at most micro_batch_size rows; "
        "null = micro_batch_size rows each, in batch order. Either way a micro-batch is cut to its own width")


class EvalConfig(Section):
    every: int = Field(0, ge=0, description="evaluate every N steps (0 = only at start/end)")
    at_start: bool = Field(True, description="evaluate the starting policy (logged as step 0)")
    at_end: bool = Field(True, description="evaluate after the last step (on its metrics line)")
    tasks: list[TaskConfig] = Field(default_factory=list, description="held-out suites; an entry without a split "
                                    "reads its suite's held-out split (test); empty = the first training suite's")
    limit: int = Field(200, ge=1, description="problems per suite")
    samples: int = Field(1, ge=1, description="samples per problem (1 + greedy = greedy accuracy)")
    greedy: bool = Field(True, description="decode greedily (else sample at generation.temperature)")
    max_new_tokens: Optional[int] = Field(None, ge=1, description="default: generation.max_new_tokens")

    @field_validator("tasks")
    @classmethod
    def _held_out_by_default(cls, tasks: list[TaskConfig]) -> list[TaskConfig]:
        """An entry without a split evaluates its suite's held-out split, not a training entry's ``train``; it
        is written out, so a resumed run's saved config evaluates the same split."""
        from rlvr.tasks.registry import held_out_split

        return [t if "split" in t.model_fields_set else t.model_copy(update={"split": held_out_split(t.task)})
                for t in tasks]


class RunLogConfig(LogConfig):
    """``log:`` of ``rlvr train``: the keys every recipe logs with, plus the completions log."""

    completions_every: int = Field(
        1, ge=0, description="every N steps, write a sample of the step's completions (prompt, completion, reward, "
        "verifier status, problem id) to completions.jsonl in the run folder, to watch for reward hacking as it "
        "happens (rlvr/run/completions_log.py); 0 = never")
    completions_per_step: int = Field(
        8, ge=1, description="samples written per logged step at most: the step's first whole groups (a larger "
        "first group is cut to this many)")


class CriticConfig(Section):
    """The learned value function of the critic presets (``algorithm.preset: ppo | reinforce_baseline``)."""

    path: Optional[str] = Field(None, description="folder the critic's body starts from: null = the policy's model.path; "
                                "a reward model folder (sequence classification: its score layer starts the value head). "
                                "With LoRA the critic is a value adapter on the policy's own base, so leave it null")
    lr: Optional[float] = Field(None, gt=0, description="the critic's learning rate (null = optim.lr); constant after "
                                "optim.warmup_steps")


class PartnerVerifierConfig(Section):
    name: str = Field(description="a rule-based verifier (e.g. format, length, compose)")
    options: dict[str, Any] = Field(default_factory=dict, description="keyword options of that verifier")

    @model_validator(mode="after")
    def _known_verifier_and_options(self) -> "PartnerVerifierConfig":
        registered("rlvr.verifiers:VERIFIERS", self.name, "name")
        plugin_options("rlvr.verifiers.registry:check_verifier", self.name, self.options, "name")
        return self


class RewardModelRunConfig(Section):
    """A learned reward model as the training reward (``rlvr/rollout/reward_scoring.py``, docs/reward-models.md).
    The ``verifier`` section then only watches: its score is logged as ``gold/`` and never optimised."""

    path: Optional[str] = Field(None, description="a `rlvr train-rm` run's final/ folder, or any one-label "
                                "sequence-classification reward model folder")
    paths: list[str] = Field(default_factory=list, description="several reward models: an ensemble (instead of path)")
    ensemble: str = Field("min", description="how an ensemble's scores become one: min, mean, mean_minus_std, or a "
                          "plugin's")
    ensemble_k: float = Field(1.0, ge=0, description="k of mean_minus_std (mean - k * std over the models)")
    batch_size: int = Field(64, ge=1, description="sequences scored together")
    device: Optional[str] = Field(None, description="cpu, cuda, cuda:N; null = the trainer's device")
    dtype: Optional[Literal["float32", "bfloat16", "float16"]] = Field(None, description="null = model.dtype")
    normalize: Literal["none", "running", "fixed"] = Field(
        "none", description="each model's score before the ensemble: as is, (r - running mean) / running std over "
        "every score so far (kept in checkpoints), or (r - offset) / scale")
    offset: float = Field(0.0, description="[normalize: fixed] subtracted from each score")
    scale: float = Field(1.0, gt=0, description="[normalize: fixed] the score is divided by this")
    clip: Optional[float] = Field(None, gt=0, description="the proxy reward is clipped to [-clip, clip] after "
                                  "normalisation and the ensemble; null = no clipping")
    combine: Literal["replace", "add", "gate"] = Field(
        "replace", description="the training reward: the proxy alone (replace), proxy + the score of "
        "reward_model.verifier (add, e.g. a length penalty), or the proxy where reward_model.verifier passes and "
        "gate_fail_score where it fails (gate, e.g. a format check)")
    verifier: Optional[PartnerVerifierConfig] = Field(None, description="[combine: add, gate] the rule-based "
                                                      "verifier combined with the proxy")
    gate_min_score: float = Field(1.0, description="[combine: gate] the verifier passes at score >= this")
    gate_fail_score: float = Field(-1.0, description="[combine: gate] the reward where the verifier fails (in the "
                                   "proxy's units, after normalisation)")

    _known_ensemble = field_validator("ensemble")(
        lambda cls, v: registered("rlvr.algorithms.preference:REWARD_ENSEMBLES", v))

    @model_validator(mode="after")
    def _check(self) -> "RewardModelRunConfig":
        if bool(self.path) == bool(self.paths):
            raise ValueError("reward_model.path: set exactly one of path (one reward model) and paths (an ensemble)")
        if self.combine == "replace" and self.verifier is not None:
            raise ValueError("reward_model.verifier: combine is 'replace', so it would not be used; set "
                             "reward_model.combine: add or gate, or remove it")
        if self.combine != "replace" and self.verifier is None:
            raise ValueError(f"reward_model.verifier: combine {self.combine!r} needs a rule-based verifier to "
                             "combine with, e.g. {name: format}")
        if self.normalize != "fixed" and (self.offset != 0.0 or self.scale != 1.0):
            raise ValueError("reward_model.offset: offset and scale apply with normalize: fixed; set it, or remove them")
        return self

    @property
    def members(self) -> list[str]:
        return list(self.paths) if self.paths else [self.path]


class ProcessRewardRunConfig(Section):
    """A process reward model (PRM) scores each step of every sample (``rlvr/rollout/process_scoring.py``,
    docs/process-rewards.md). The verifier's outcome reward stays in the reward; the PRM adds to it."""

    path: str = Field(..., description="a `rlvr train-prm` run's final/ folder, or any token-classification PRM "
                      "folder (1 or 2 labels) with the policy's tokenizer")
    separator: Optional[str] = Field(None, description="what ends a step in a completion; null = the separator the "
                                     "PRM was trained with (its prm.json), else a newline")
    use: Literal["auto", "token", "aggregate"] = Field(
        "auto", description="token: each step's reward on its last token, for the estimators that take token "
        "rewards (PPO's GAE, REINFORCE++'s return-to-go); aggregate: one score per sample (min/last/mean of the "
        "steps), for the group estimators (grpo, dr_grpo, rloo); auto: token where the estimator takes it, else "
        "aggregate")
    aggregate: str = Field("min", description="[aggregate] how step scores become one: min (the weakest step), last, "
                           "mean, or a plugin's (rlvr.step_aggregations)")
    combine: Literal["add", "replace"] = Field(
        "add", description="[aggregate] the reward: the verifier's outcome score + coef * the aggregate (add), or "
        "coef * the aggregate alone (replace; the verifier then only watches, as gold/)")
    coef: float = Field(1.0, ge=0, description="weight of the process reward against the outcome reward")
    step_reward: str = Field(
        "potential", description="[token] what a step earns, coef times: potential (p_k - p_(k-1), p_0 = baseline, "
        "and the last step returns to 0: sums to -baseline for every solution, so the PRM moves credit within a "
        "solution and cannot be gamed; the default), delta (p_k - p_(k-1) on every step: sums to p_K - baseline, so "
        "the PRM's judgement of the last step counts), shifted (p_k - baseline on every step: pays for fewer steps "
        "with baseline 1, more with 0.5), or a plugin's (rlvr.step_rewards)")
    baseline: float = Field(0.5, description="[token] p_0 of delta, the subtracted value of shifted")
    batch_size: int = Field(32, ge=1, description="samples scored together")
    device: Optional[str] = Field(None, description="cpu, cuda, cuda:N; null = the trainer's device")
    dtype: Optional[Literal["float32", "bfloat16", "float16"]] = Field(None, description="null = model.dtype")

    _known_aggregate = field_validator("aggregate")(
        lambda cls, v: registered("rlvr.algorithms.process_rewards:AGGREGATIONS", v))
    _known_step_reward = field_validator("step_reward")(
        lambda cls, v: registered("rlvr.algorithms.process_rewards:STEP_REWARDS", v))


class RunConfig(RecipeConfig):
    """The RL recipes of ``rlvr train``: critic-free (grpo.py) or actor-critic (ppo.py), by preset."""

    out: Optional[str] = Field(None, description="run folder; null = a new runs/<preset>-<timestamp>. A folder that "
                               "already holds a run is refused unless resumed (--resume) or replaced (--overwrite)")
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: list[TaskConfig] = Field(default_factory=lambda: [TaskConfig()], description="training suites (weights mix them)")
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig, description="multi-turn episodes: "
                                           "environments and tools (used only where a problem or name sets one)")
    async_generation: AsyncGenerationConfig = Field(default_factory=AsyncGenerationConfig,
                                                    description="generation overlapping the update (off by default)")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig, description="the value model (critic presets only)")
    reward_model: Optional[RewardModelRunConfig] = Field(
        None, description="a learned reward model as the training reward (null = the verifier's score)")
    process_reward: Optional[ProcessRewardRunConfig] = Field(
        None, description="a process reward model scoring each step, added to the verifier's reward (null = none)")
    optim: OptimConfig = Field(default_factory=OptimConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    log: RunLogConfig = Field(default_factory=RunLogConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)

    @model_validator(mode="after")
    def _check_values(self) -> "RunConfig":
        """Values that are impossible on their own or against a size; which features combine is the table
        of rlvr/config/compatibility.py, checked by RecipeConfig."""
        algorithm, train = self.algorithm, self.train
        if not self.data:
            raise ValueError("data: at least one training suite is needed")
        if algorithm.advantage in ("grpo", "dr_grpo", "rloo") and train.group_size < 2:
            raise ValueError(f"train.group_size: advantage {algorithm.advantage!r} compares samples within a group, "
                             "so it needs group_size >= 2")
        if algorithm.dynamic_sampling and train.group_size < 2:
            raise ValueError("algorithm.dynamic_sampling needs train.group_size >= 2")
        if algorithm.minibatches > train.prompts_per_step:
            raise ValueError(f"algorithm.minibatches ({algorithm.minibatches}) cannot exceed train.prompts_per_step "
                             f"({train.prompts_per_step})")
        if algorithm.overlong == "soft" and algorithm.overlong_buffer >= self.generation.max_new_tokens:
            raise ValueError("algorithm.overlong_buffer must be smaller than generation.max_new_tokens")
        if not self.model.path:
            raise ValueError("model.path: set it to a local Hugging Face model folder")
        return self

    @classmethod
    def fill_defaults(cls, raw: dict) -> dict:
        """The preset's algorithm defaults under what the file and the overrides set."""
        algorithm = raw.get("algorithm")
        if algorithm is None:
            algorithm = {}
        if not isinstance(algorithm, dict):
            raise ConfigError("algorithm: must be a mapping")
        name = algorithm.get("preset", "grpo")
        if name not in PRESETS:
            raise ConfigError(f"algorithm.preset: unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
        return {**raw, "algorithm": {**PRESETS[name], **algorithm}}
