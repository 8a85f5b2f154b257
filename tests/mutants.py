"""Mutation check: small deliberate bugs in the algorithms, the rollout and the recipes (multi-turn
episodes, tools, asynchronous generation, off-policy corrections, the judge and process rewards
included), each of which some test must catch. Nothing is written to a source file: a mutant is applied in memory, inside the
pytest process that runs its tests.

    python tests/mutants.py                 # every mutant: a line each, a count, exit 1 if any survived
    python tests/mutants.py --only NAME ... # some of them
    python tests/mutants.py --list          # names, targets and tests

Each mutant names a function (``module:function`` or ``module:Class.method``) and a text replacement
inside its source, which must match exactly once, or is a small callable that changes data (a registry
entry, a preset). The runner first runs the union of the selected tests without any mutant (they must
pass, or a "caught" would mean nothing), then each mutant's tests in its own process:

    RLVR_MUTANT=NAME python -m pytest -x -q -p no:cacheprovider -p tests.mutants TESTS...

As a pytest plugin (``-p tests.mutants``) this module applies the mutant named by ``RLVR_MUTANT`` at
``pytest_configure``: it takes the function's source (``inspect.getsource``, dedented), applies the
replacement, executes it in the module's globals and rebinds it wherever the original object is
referenced: the module or class attribute, every loaded module's namespace, every registry and
every module-level dict holding it. A replacement that does not match fails loudly.
"""

from __future__ import annotations

import __future__
import argparse
import importlib
import inspect
import os
import re
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
ENV = "RLVR_MUTANT"


@dataclass(frozen=True)
class Mutant:
    name: str
    target: str  # "module:function", "module:Class.method", or what a data mutant changes (for the record)
    old: str = ""  # text inside the target's source, replaced once by ``new``
    new: str = ""
    tests: tuple[str, ...] = ()  # pytest node ids (non-slow)
    apply: Callable[[], None] | None = field(default=None, compare=False)  # a data mutant instead of text


# ---------------------------------------------------------------------------------------------
# Test ids
# ---------------------------------------------------------------------------------------------

ALG = "tests/test_algorithms.py::"
RANKS = "tests/test_batch_advantages_over_ranks.py::"
CRITIC = "tests/test_critic.py::"
PRESETS = "tests/test_presets.py::"
PREF = "tests/test_preference_losses.py::"
SHARDED = "tests/test_sharded_checkpoint.py::"
ROLLOUT = "tests/test_rollout.py::"
PRESET_CONFIG = PRESETS + "test_preset_config_is_the_documented_recipe"
PRESET_LOSS = PRESETS + "test_preset_loss_of_one_micro_batch_by_hand"
PRESET_ADV = PRESETS + "test_preset_advantages_by_hand"
MASKS = "tests/test_recipe_masks.py::test_failed_and_filtered_samples_have_no_loss_tokens_and_the_rest_keep_all_theirs"


def _registry_swap(registry: str, name: str, replacement: str) -> Callable[[], None]:
    """A data mutant: registry entry ``name`` becomes the object registered as ``replacement``."""

    def apply() -> None:
        module_name, _, attr = registry.partition(":")
        reg = getattr(importlib.import_module(module_name), attr)
        reg.register(name, reg.get(replacement), overwrite=True)

    return apply


def _preset_change(preset: str, **values) -> Callable[[], None]:
    def apply() -> None:
        from rlvr.config.run import PRESETS as table

        table[preset].update(values)

    return apply


def _without_429() -> None:
    """A data mutant: the http judge no longer retries HTTP 429 (its ``RETRY_STATUSES`` without it)."""
    backends = importlib.import_module("rlvr.verifiers.judge_backends")
    backends.RETRY_STATUSES = tuple(s for s in backends.RETRY_STATUSES if s != 429)


EPISODES = "rlvr.rollout.episodes"
EPISODE_TESTS = "tests/test_episodes.py::"
OFF_POLICY = "rlvr.algorithms.off_policy"
OFF_POLICY_TESTS = "tests/test_off_policy.py::"
JUDGE = "rlvr.verifiers.judge"
PROCESS = "tests/test_process_training.py::"
CATCHERS = "tests/test_mutant_catchers.py::"
ASYNC_CATCHER = CATCHERS + "test_async_rollouts_keep_s_steps_ahead_lag_min_s_t_minus_1_and_seed_each_step_from_the_run_seed"
RETRIED = CATCHERS + "test_the_http_judge_retries_408_409_425_429_and_5xx_once_each_and_fails_other_statuses_at_once"
GENERATOR = "tests/test_async_generation.py::test_the_generator_process_samples_what_the_in_process_engine_samples"
ADV = "rlvr.algorithms.advantages"
LOSSES = "rlvr.algorithms.losses"
VARIANTS = "rlvr.algorithms.policy_loss_variants"
POLICY_LOSS_TESTS = "tests/test_policy_losses.py::"
MISMATCH = "tests/test_mismatch_correction.py::"

MUTANTS: list[Mutant] = [
    # ---- advantage estimators: the registry the recipe reads, and the formulas ----------------------
    Mutant("adv-grpo-is-dr_grpo", f"{ADV}:ADVANTAGE_ESTIMATORS['grpo']", tests=(PRESET_ADV,),
           apply=_registry_swap(f"{ADV}:ADVANTAGE_ESTIMATORS", "grpo", "dr_grpo")),
    Mutant("adv-dr_grpo-is-grpo", f"{ADV}:ADVANTAGE_ESTIMATORS['dr_grpo']", tests=(PRESET_ADV,),
           apply=_registry_swap(f"{ADV}:ADVANTAGE_ESTIMATORS", "dr_grpo", "grpo")),
    Mutant("adv-rloo-is-dr_grpo", f"{ADV}:ADVANTAGE_ESTIMATORS['rloo']", tests=(PRESET_ADV,),
           apply=_registry_swap(f"{ADV}:ADVANTAGE_ESTIMATORS", "rloo", "dr_grpo")),
    Mutant("adv-reinforce_pp-is-grpo", f"{ADV}:ADVANTAGE_ESTIMATORS['reinforce_pp']", tests=(PRESET_ADV,),
           apply=_registry_swap(f"{ADV}:ADVANTAGE_ESTIMATORS", "reinforce_pp", "grpo")),
    Mutant("grpo-no-std", f"{ADV}:grpo_advantages", "adv = (r - mean) / (var.sqrt() + EPS)", "adv = r - mean",
           tests=(ALG + "test_grpo_zscore_by_hand", PRESET_ADV)),
    Mutant("grpo-no-eps", f"{ADV}:grpo_advantages", "(var.sqrt() + EPS)", "var.sqrt()",
           tests=(ALG + "test_zero_variance_group_gets_zero_advantage",)),
    Mutant("grpo-biased-std", f"{ADV}:grpo_advantages", "(count - 1).clamp(min=1)", "count.clamp(min=1)",
           tests=(ALG + "test_grpo_zscore_by_hand",)),
    Mutant("grpo-batch-mean", f"{ADV}:grpo_advantages", "adv = (r - mean)", "adv = (r - r.mean())",
           tests=(PRESET_ADV,)),
    Mutant("rloo-includes-self", f"{ADV}:rloo_advantages", "baseline = (total - r) / (count - 1).clamp(min=1)",
           "baseline = total / count.clamp(min=1)", tests=(ALG + "test_rloo_leave_one_out_by_hand",)),
    Mutant("reinforce_pp-group-z-score", f"{ADV}:reinforce_pp_advantages", "batch_z_score(rewards.float(), valid, all_sum)",
           "grpo_advantages(rewards, valid)", tests=(ALG + "test_reinforce_pp_normalises_over_the_whole_batch",)),
    Mutant("batch-z-score-rank-mean", f"{ADV}:batch_z_score", "n, total = all_sum(", "n, total = _local(",
           tests=(RANKS + "test_batch_estimators_give_two_ranks_the_advantages_of_one_process",)),
    Mutant("batch-z-score-rank-std", f"{ADV}:batch_z_score", "square = all_sum(", "square = _local(",
           tests=(RANKS + "test_batch_estimators_give_two_ranks_the_advantages_of_one_process",)),
    # ---- aggregation ---------------------------------------------------------------------------------
    Mutant("token_mean-no-mask", f"{LOSSES}:token_mean", "(values * mask).sum()", "values.sum()",
           tests=(PRESET_LOSS,)),
    Mutant("seq_mean_token_mean-no-mask", f"{LOSSES}:seq_mean_token_mean", "(values * mask).sum(dim=1)",
           "values.sum(dim=1)", tests=(PRESET_LOSS,)),
    Mutant("seq_mean_token_mean-local-seqs", f"{LOSSES}:seq_mean_token_mean", "max(num_seqs, 1.0)", "values.shape[0]",
           tests=(ALG + "test_micro_batches_with_global_denominators_sum_to_the_whole",)),
    Mutant("sum_norm-per-seq-length", f"{LOSSES}:seq_mean_token_sum_norm", "/ float(max_len)",
           "/ mask.sum(dim=1).clamp(min=1)", tests=(ALG + "test_aggregation_modes_by_hand", PRESET_LOSS)),
    Mutant("token_mean-by-seqs", f"{LOSSES}:token_mean", "max(num_tokens, 1.0)", "max(num_seqs, 1.0)",
           tests=(ALG + "test_aggregation_modes_by_hand",)),
    # ---- the policy loss -----------------------------------------------------------------------------
    Mutant("policy-loss-no-mask", f"{LOSSES}:policy_loss", "total = aggregate(loss_t, mask, agg,",
           "total = aggregate(loss_t, torch.ones_like(mask), agg,",
           tests=(ALG + "test_policy_loss_on_policy_gradient_is_reinforce", PRESET_LOSS)),
    Mutant("ppo-clip-sign", f"{LOSSES}:clipped_surrogate", "loss = torch.maximum(unclipped, clipped)",
           "loss = -torch.maximum(unclipped, clipped)", tests=(ALG + "test_clip_values_by_hand",)),
    Mutant("ppo-no-clip", f"{LOSSES}:clipped_surrogate", "-adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)",
           "-adv * ratio", tests=(ALG + "test_clip_mask_matches_gradient",)),
    Mutant("ppo-clip-high-ignored", f"{LOSSES}:clipped_surrogate", "torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)",
           "torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_low)", tests=(ALG + "test_clip_higher_is_asymmetric",)),
    Mutant("ppo-no-dual-clip", f"{LOSSES}:clipped_surrogate", "loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)",
           "loss = loss", tests=(ALG + "test_dual_clip_bounds_negative_advantage_loss",)),
    Mutant("vanilla-sign", f"{LOSSES}:vanilla_policy_gradient", "loss = -adv * torch.exp(logp - old_logp)",
           "loss = adv * torch.exp(logp - old_logp)", tests=(PRESET_LOSS,)),
    Mutant("preset-dapo-no-clip-higher", "rlvr.config.run:PRESETS['dapo']['clip_high']", tests=(PRESET_CONFIG, PRESET_LOSS),
           apply=_preset_change("dapo", clip_high=0.2)),
    # ---- KL and entropy ----------------------------------------------------------------------------
    Mutant("kl-k3-is-k1", f"{LOSSES}:KL_ESTIMATORS['k3']", tests=(PRESET_LOSS,),
           apply=_registry_swap(f"{LOSSES}:KL_ESTIMATORS", "k3", "k1")),
    Mutant("kl-k1-sign", f"{LOSSES}:kl_k1", "return logp - ref_logp", "return ref_logp - logp",
           tests=(ALG + "test_kl_estimators_by_hand",)),
    Mutant("kl-loss-term-skipped", "rlvr.recipes.update:policy_terms", "loss = loss + algo.beta * aggregate(",
           "loss = loss + 0 * aggregate(", tests=(PRESET_LOSS,)),
    Mutant("kl-placement-ignored", "rlvr.recipes.update:policy_terms", 'if algo.kl_placement == "loss":', "if True:",
           tests=(PRESET_LOSS,)),
    Mutant("kl-reward-term-skipped", "rlvr.recipes.grpo:train", "scores = scores - algo.beta * seq_kl",
           "scores = scores", tests=("tests/test_recipe_masks.py::test_kl_in_the_reward_reaches_the_advantage_estimator",)),
    Mutant("ppo-kl-reward-sign", "rlvr.algorithms.critic:token_rewards", "rewards = rewards - beta *",
           "rewards = rewards + beta *", tests=(CRITIC + "test_token_rewards_score_at_last_real_token_minus_beta_kl",)),
    Mutant("entropy-bonus-sign", "rlvr.recipes.update:policy_terms", "loss = loss - algo.entropy_coef * aggregate(",
           "loss = loss + algo.entropy_coef * aggregate(", tests=(PRESETS + "test_entropy_bonus_is_subtracted",)),
    # ---- the critic ---------------------------------------------------------------------------------
    Mutant("gae-lambda-ignored", "rlvr.algorithms.critic:gae", "adv_t = delta + gamma * lam * next_adv",
           "adv_t = delta + gamma * next_adv", tests=(CRITIC + "test_gae_discounts_by_hand",)),
    Mutant("gae-gamma-not-in-delta", "rlvr.algorithms.critic:gae", "delta = r[:, t] + gamma * next_value - v[:, t]",
           "delta = r[:, t] + next_value - v[:, t]", tests=(CRITIC + "test_gae_discounts_by_hand",)),
    Mutant("gae-holes-are-steps", "rlvr.algorithms.critic:gae", "next_value = torch.where(on, v[:, t], next_value)",
           "next_value = v[:, t]", tests=(CRITIC + "test_gae_skips_a_hole_as_if_deleted",)),
    Mutant("value-loss-no-clip", "rlvr.algorithms.critic:clipped_value_loss_per_token",
           "loss = 0.5 * torch.maximum(unclipped_sq, clipped_sq)", "loss = 0.5 * unclipped_sq",
           tests=(CRITIC + "test_clipped_value_loss_picks_the_larger_branch",)),
    Mutant("critic-bias-only", "rlvr.modeling.value_model:ValueModel.forward", "v_all = self.head(states.float())",
           "v_all = self.head(states.float() * 0)",
           tests=("tests/test_critic_state.py::test_the_critic_learns_a_value_that_depends_on_the_state",)),
    # ---- preference losses --------------------------------------------------------------------------
    Mutant("dpo-sign", "rlvr.algorithms.preference:sigmoid_dpo", "loss = -F.logsigmoid(beta * h)",
           "loss = -F.logsigmoid(-beta * h)", tests=(PREF.rstrip(":"),)),
    Mutant("bt-margin-sign", "rlvr.algorithms.preference:bradley_terry_loss", "shifted = diff - margin",
           "shifted = diff + margin", tests=(PREF + "test_bradley_terry_margin_and_centering",)),
    # ---- log-probs: a repeated row runs once --------------------------------------------------------
    Mutant("logprobs-no-dedup", "rlvr.modeling.logprobs:completion_logprobs",
           "distinct = distinct_rows(input_ids, attention_mask)", "distinct = None",
           tests=("tests/test_logprobs.py::test_a_repeated_row_runs_once_and_its_gradient_counts_every_repeat",)),
    Mutant("distinct-rows-none", "rlvr.modeling.logprobs:distinct_rows", "if len(distinct) == len(input_ids):",
           "if True:",
           tests=("tests/test_logprobs.py::test_a_repeated_row_runs_once_and_its_gradient_counts_every_repeat",)),
    # ---- log-probs from hidden states in chunks; the forward's probe --------------------------------
    Mutant("chunked-backward-no-temperature", "rlvr.modeling.chunked_logprobs:_ChunkedLogProbs.backward",
           "if ctx.temperature != 1.0:", "if False:",
           tests=("tests/test_chunked_logprobs.py::test_chunks_give_the_whole_logits_values_and_gradients",)),
    Mutant("chunked-entropy-grad-sign", "rlvr.modeling.chunked_logprobs:_entropy_grad",
           "return -probs * (log_probs + entropy[:, None])", "return probs * (log_probs + entropy[:, None])",
           tests=("tests/test_chunked_logprobs.py::test_chunks_give_the_whole_logits_values_and_gradients",)),
    Mutant("chunked-last-chunk-dropped", "rlvr.modeling.chunked_logprobs:_chunked_forward",
           "end = min(start + chunk, count)", "end = start + chunk if start + chunk <= count else start",
           tests=("tests/test_chunked_logprobs.py::test_chunks_give_the_whole_logits_values_and_gradients",)),
    Mutant("logprobs-pad-tokens-scored", "rlvr.modeling.logprobs:_logprobs",
           "scored = attention_mask[:, -completion_len:].bool()",
           "scored = torch.ones_like(attention_mask[:, -completion_len:]).bool()",
           tests=("tests/test_logprobs.py::test_logprobs_in_one_token_chunks_equal_the_whole_logits_values_and_gradients",)),
    Mutant("kernel-attention-no-prompt-mask", "rlvr.modeling.fast_forward:_rows_kernel_bias",
           "bias[..., :width] = key_bias.view(num, 1, 1, width)", "bias[..., :width] = 0",
           tests=("tests/test_fast_forward.py::test_shared_prompt_logits_and_gradients_equal_the_models_own_forward",)),
    Mutant("probe-never-fails", "rlvr.modeling.forward_choice:choose_forward",
           "failed = [(where, d, t) for where, d, t in probes if not d <= t]", "failed = []",
           tests=("tests/test_forward_choice.py",)),
    # ---- rollout: masks, overlong, dynamic sampling, the sampler, evaluation -------------------------
    Mutant("on-failure-mask-ignored", "rlvr.rollout.batch:sample_tensors",
           'valid = ~abstain & (~failed if on_failure == "mask" else torch.ones_like(failed))', "valid = ~abstain",
           tests=(ROLLOUT + "test_failed_verification_is_masked_by_default_and_scored_zero_on_request",)),
    Mutant("overlong-soft-sign", "rlvr.rollout.batch:overlong_soft_penalty", "return -penalty *", "return penalty *",
           tests=(ROLLOUT + "test_overlong_soft_punishment_formula",)),
    Mutant("overlong-filter-ignored", "rlvr.rollout.batch:sample_tensors", "loss_weight = (~truncated).float()",
           "loss_weight = torch.ones_like(raw)", tests=(ROLLOUT + "test_overlong_filter_masks_truncated_samples_out_of_the_loss",)),
    Mutant("grpo-keep-drops-loss-weight", "rlvr.recipes.grpo:train",
           "keep = (trained_samples.valid.float() * trained_samples.loss_weight)", "keep = (trained_samples.valid.float())",
           tests=(MASKS + "[grpo]",)),
    Mutant("grpo-keep-drops-valid", "rlvr.recipes.grpo:train",
           "keep = (trained_samples.valid.float() * trained_samples.loss_weight)", "keep = (trained_samples.loss_weight)",
           tests=(MASKS + "[grpo]",)),
    Mutant("ppo-keep-dropped", "rlvr.recipes.ppo:train", "batch.response_mask = batch.response_mask * keep[:, None]",
           "pass", tests=(MASKS + "[ppo]",)),
    Mutant("dynamic-sampling-keeps-all", "rlvr.rollout.groups:collect_groups",
           "dropped.append(group)", "kept.append(group)",
           tests=(ROLLOUT + "test_dynamic_sampling_drops_zero_variance_groups_and_refills",)),
    Mutant("sampler-with-replacement", "rlvr.rollout.sampler:ProblemSampler._take",
           "index = self._order[name][self._position[name]]", "index = self._rng.randrange(len(self.suites[name]))",
           tests=(ROLLOUT + "test_sampler_is_deterministic_covers_each_epoch_and_resumes",)),
    Mutant("sampler-ignores-weights", "rlvr.rollout.sampler:ProblemSampler.next",
           "self._rng.choices(self.names, weights=self.weights, k=k)", "self._rng.choices(self.names, k=k)",
           tests=(ROLLOUT + "test_sampler_mixes_suites_by_weight",)),
    Mutant("eval-pass-at-k-is-pass-at-1", "rlvr.rollout.evaluate:evaluate", "pass_at_k(samples, c, k)",
           "pass_at_k(samples, c, 1)", tests=("tests/test_evaluate.py::test_evaluate_pass_at_k_by_hand_in_process",)),
    Mutant("eval-failed-counts-correct", "rlvr.rollout.groups:is_correct",
           'return reward.status == "ok" and verifier_score(reward) >= threshold',
           "return verifier_score(reward) >= threshold",
           tests=("tests/test_evaluate.py::test_evaluate_pass_at_k_by_hand_in_process",)),
    Mutant("turn-rewards-decide-pass-fail", "rlvr.rollout.episodes:verifier_score",
           "return reward.info.get(VERIFIER_SCORE, reward.score)", "return reward.score",
           tests=("tests/test_eval_honesty.py::test_a_turn_penalty_never_turns_a_right_answer_wrong",)),
    # ---- sharded runs (the in-process pieces; two-rank runs are subprocesses, out of a mutant's reach) -----
    Mutant("whole-copy-unties-the-output-layer", "rlvr.run.sharding:whole_copy", "base.tie_weights()", "pass",
           tests=(SHARDED + "test_a_whole_copy_of_a_sharded_model_has_its_weights_and_ties",)),
    Mutant("sharded-checkpoint-skips-optimizers", "rlvr.run.sharded_checkpoint:ShardedParts.save",
           "for name, (optimizer, model) in self.optimizers.items():", "for name, (optimizer, model) in {}.items():",
           tests=(SHARDED + "test_a_dcp_checkpoint_restores_model_and_adamw_state_bit_identical",)),
    Mutant("engine-copy-keeps-lora-layers", "rlvr.modeling.loading:generation_copy",
           "whole = whole.merge_and_unload()", "pass",
           tests=(SHARDED + "test_a_lora_policy_s_engine_copy_is_the_merged_base",)),

    # ---- multi-turn episodes: token masks, the budget, environment messages as tokens -------------
    Mutant("episode-env-tokens-sampled", f"{EPISODES}:EpisodeRunner._append_reply",
           "episode.append(ids, [0.0] * len(ids), sampled=False)", "episode.append(ids, [0.0] * len(ids), sampled=True)",
           tests=(EPISODE_TESTS + "test_each_turn_continues_from_the_exact_sampled_ids",)),
    Mutant("episode-budget-dropped", f"{EPISODES}:_by_cap", "min(per_turn, budget - len(episode.ids))", "per_turn",
           tests=(EPISODE_TESTS + "test_a_turn_cut_by_the_budget_ends_the_episode_with_max_tokens",)),
    Mutant("env-text-tool-unfenced", "rlvr.rollout.env_tokens:TextMessages.render",
           'TEXT_FORMATS.get(m.get("role", ""), TEXT_FORMATS["default"])', 'TEXT_FORMATS["default"]',
           tests=(CATCHERS + "test_text_messages_write_a_tool_result_fenced_and_any_other_message_on_its_own_lines",)),
    Mutant("env-template-cut-before-eos", "rlvr.rollout.env_tokens:TemplateMessages.__init__",
           "self._before.rindex(eos_text) + len(eos_text)", "self._before.rindex(eos_text)",
           tests=(EPISODE_TESTS + "test_a_prefix_preserving_template_appends_the_tool_turn_and_the_next_generation_prompt",)),
    # ---- environments and tools ---------------------------------------------------------------------
    Mutant("tools-env-calls-per-turn-uncapped", "rlvr.tasks.environments:ToolEpisode.step",
           "parse_tool_calls(text, env.call_format)[: env.max_calls_per_turn]", "parse_tool_calls(text, env.call_format)",
           tests=(CATCHERS + "test_a_turn_runs_at_most_max_calls_per_turn_calls_and_counts_the_failed_ones",)),
    Mutant("tools-env-errors-uncounted", "rlvr.tasks.environments:ToolEpisode.step",
           "out.tool_errors += int(result.failed)", "out.tool_errors += 0",
           tests=(CATCHERS + "test_a_turn_runs_at_most_max_calls_per_turn_calls_and_counts_the_failed_ones",)),
    Mutant("tool-arguments-unchecked", "rlvr.tasks.tools:_run_call",
           "if (wrong := check_arguments(target, call.arguments)) is not None:",
           "if (wrong := check_arguments(target, call.arguments)) is not None and False:",
           tests=(CATCHERS + "test_an_ill_typed_argument_is_an_observation_and_the_tool_never_runs",)),
    Mutant("tool-bool-passes-as-int", "rlvr.tasks.tools:_mismatch",
           "return None if isinstance(value, int) and not isinstance(value, bool) else _TYPE_WORDS[int]",
           "return None if isinstance(value, int) else _TYPE_WORDS[int]",
           tests=("tests/test_tools.py::test_arguments_are_checked_against_the_type_hints",)),
    # ---- asynchronous generation: the steps in flight, the generator process ------------------------
    Mutant("async-one-step-too-far-ahead", "rlvr.rollout.async_rollout:AsyncRollouts.take",
           "min(step + self.max_staleness, last_step)", "min(step + self.max_staleness + 1, last_step)",
           tests=(ASYNC_CATCHER,)),
    Mutant("async-seeded-by-submitting-step", "rlvr.rollout.async_rollout:AsyncRollouts._submit",
           "_step_seed(self.seed, step)", "_step_seed(self.seed, now)", tests=(ASYNC_CATCHER,)),
    Mutant("generator-rng-not-handed-back", "rlvr.engines.process:ProcessEngine.generate",
           'self.set_rng_state(info["rng"])', "pass", tests=(GENERATOR,)),
    Mutant("generator-publications-not-counted", "rlvr.engines.process:ProcessEngine.update_weights",
           "self.publications += 1", "pass", tests=(GENERATOR,)),
    # ---- off-policy corrections --------------------------------------------------------------------
    Mutant("off-policy-tis-cap-removed", f"{OFF_POLICY}:token_tis", ".exp().clamp(max=cap)", ".exp()",
           tests=(OFF_POLICY_TESTS + "test_token_tis_truncates_each_ratio_at_the_cap",)),
    Mutant("off-policy-seq-mask-one-sided", f"{OFF_POLICY}:sequence_mask", "mean_log.abs() <= bound", "mean_log <= bound",
           tests=(OFF_POLICY_TESTS + "test_sequence_mask_bounds_the_ratio_on_both_sides",)),
    Mutant("off-policy-decoupled-truncates", f"{OFF_POLICY}:decoupled", "return weights * keep, keep",
           "return weights.clamp(max=cap), torch.ones_like(keep)",
           tests=(OFF_POLICY_TESTS + "test_decoupled_weights_by_the_ratio_and_masks_tokens_beyond_the_cap",)),
    # ---- the judge: verdicts, rubric weights, retried statuses --------------------------------------
    Mutant("judge-first-verdict-line", f"{JUDGE}:_last_line_match", "for line in reversed(text.splitlines()):",
           "for line in text.splitlines():", tests=("tests/test_judge_hostile.py::test_only_a_verdict_line_is_a_verdict",)),
    Mutant("judge-score-scale-offset", f"{JUDGE}:read_score", "return (value - lo) / (hi - lo), said",
           "return value / hi, said", tests=("tests/test_judge.py::test_logprob_and_score_verdicts",)),
    Mutant("judge-rubric-weights-ignored", f"{JUDGE}:JudgeVerifier._reward",
           'weights = {c: self.rubric[c]["weight"] for c in scores}', "weights = {c: 1.0 for c in scores}",
           tests=("tests/test_judge.py::test_a_rubric_is_the_weighted_mean_of_its_criteria",)),
    Mutant("judge-429-not-retried", "rlvr.verifiers.judge_backends:RETRY_STATUSES", tests=(RETRIED,),
           apply=_without_429),
    Mutant("judge-retry-after-ignored", "rlvr.verifiers.judge_backends:HTTPJudge._call", "wait = asked", "pass",
           tests=("tests/test_judge_hostile.py::"
                  "test_retry_after_is_honoured_up_to_max_retry_after_s_and_a_longer_ask_fails_at_once",)),
    # ---- process rewards: where a step ends, the PRM's reading, the shaping -------------------------
    Mutant("final-step-end-off-by-one", "rlvr.algorithms.process_rewards:step_end_indices",
           "ends.append(len(token_texts) - 1)", "ends.append(len(token_texts) - 2)",
           tests=("tests/test_process_rewards.py::test_step_end_indices",)),
    Mutant("potential-last-term-zeroed", "rlvr.algorithms.process_rewards:potential_step_rewards",
           "+ [-previous[-1]]", "+ [0.0]", tests=(PROCESS + "test_step_reward_forms_by_hand",)),
    Mutant("prm-step-end-off-by-one", "rlvr.modeling.prm:step_logits", "cols.append(len(prompt) + end)",
           "cols.append(len(prompt) + end - 1)",
           tests=("tests/test_train_prm.py::test_one_score_per_step_read_at_its_last_token",)),
    Mutant("prm-reads-the-bad-label", "rlvr.modeling.prm:step_probabilities", "torch.softmax(logits, dim=-1)[:, 1]",
           "torch.softmax(logits, dim=-1)[:, 0]", tests=("tests/test_train_prm.py::test_probabilities_and_loss_by_hand",)),
    Mutant("process-step-reward-coef-dropped", "rlvr.rollout.process_scoring:step_rewards",
           "config.coef * r for r in", "r for r in",
           tests=(PROCESS + "test_step_rewards_land_on_each_steps_last_token_in_the_batch",)),
    Mutant("process-wrong-step-frac-inverted", "rlvr.rollout.process_scoring:step_metrics",
           "sum(p < 0.5 for p in flat)", "sum(p >= 0.5 for p in flat)", tests=(PROCESS + "test_step_metrics_by_hand",)),
    # ---- the sequence-level and clipped-weight policy losses (gspo, gspo_token, cispo) ----------------------
    Mutant("gspo-ratio-sum-not-mean", f"{LOSSES}:sequence_log_ratio",
           "return log_ratio.sum(dim=1) / m.sum(dim=1).clamp(min=1).to(logp.dtype)", "return log_ratio.sum(dim=1)",
           tests=(POLICY_LOSS_TESTS + "test_gspo_clips_the_geometric_mean_sequence_ratio_by_hand",)),
    Mutant("gspo-ratio-counts-padding", f"{LOSSES}:sequence_log_ratio",
           "torch.where(m, logp - old_logp, torch.zeros_like(logp))", "logp - old_logp",
           tests=(POLICY_LOSS_TESTS + "test_gspo_clips_the_geometric_mean_sequence_ratio_by_hand",)),
    Mutant("gspo-token-weight-not-detached", f"{VARIANTS}:gspo_token", "sequence_log_ratio(logp, old_logp, mask).detach()",
           "sequence_log_ratio(logp, old_logp, mask)",
           tests=(POLICY_LOSS_TESTS + "test_gspo_token_equals_gspo_in_value_and_gradient_with_one_advantage_per_sequence",)),
    Mutant("cispo-weight-not-detached", f"{VARIANTS}:cispo",
           "torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high).detach()", "torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)",
           tests=(POLICY_LOSS_TESTS + "test_cispo_weights_are_clipped_and_every_token_keeps_its_gradient_by_hand",)),
    Mutant("cispo-clipped-tokens-dropped", f"{VARIANTS}:cispo", "loss = -weight * adv * counted_logp",
           "loss = -weight * adv * torch.where((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high), "
           "counted_logp.detach(), counted_logp)",
           tests=(POLICY_LOSS_TESTS + "test_cispo_weights_are_clipped_and_every_token_keeps_its_gradient_by_hand",)),
    Mutant("policy-loss-mask-not-passed", f"{LOSSES}:policy_loss", 'extra = {"mask": mask} if _takes_mask(per_token) else {}',
           "extra = {}", tests=(PRESET_LOSS,)),
    Mutant("preset-gspo-ppo-clip-range", "rlvr.config.run:PRESETS['gspo']", tests=(PRESET_CONFIG, PRESET_LOSS),
           apply=_preset_change("gspo", clip_low=0.2, clip_high=0.2)),
    Mutant("preset-cispo-lower-bound", "rlvr.config.run:PRESETS['cispo']", tests=(PRESET_CONFIG, PRESET_LOSS),
           apply=_preset_change("cispo", clip_low=0.2)),
    # ---- the soft-gate, geometric-mean and covariance policy losses; the importance-weight metrics ------------
    Mutant("sapo-one-temperature", f"{VARIANTS}:sapo", "torch.full_like(adv, tau_neg)", "torch.full_like(adv, tau_pos)",
           tests=(POLICY_LOSS_TESTS + "test_sapo_soft_gate_value_and_gradient_by_hand",)),
    Mutant("gmpo-clips-both-directions", f"{VARIANTS}:gmpo",
           "kept = sign * torch.minimum(sign * log_ratio, sign * clipped_log_ratio)", "kept = clipped_log_ratio",
           tests=(POLICY_LOSS_TESTS + "test_gmpo_geometric_mean_of_log_clipped_ratios_by_hand",)),
    Mutant("preset-gmpo-ratio-clip-range", "rlvr.config.run:PRESETS['gmpo']", tests=(PRESET_CONFIG, PRESET_LOSS),
           apply=_preset_change("gmpo", clip_low=0.2, clip_high=0.2)),
    Mutant("clip-cov-picked-keep-gradient", f"{VARIANTS}:clip_cov",
           "loss = torch.where(picked, torch.zeros_like(loss), loss)", "pass",
           tests=(POLICY_LOSS_TESTS + "test_clip_cov_stops_the_gradient_of_the_high_covariance_token_by_hand",)),
    Mutant("kl-cov-penalises-lowest-covariance", f"{VARIANTS}:kl_cov", "torch.topk(cov, min(count, int(m.sum())))",
           "torch.topk(cov, min(count, int(m.sum())), largest=False)",
           tests=(POLICY_LOSS_TESTS + "test_kl_cov_penalises_the_top_covariance_token_by_hand",)),
    Mutant("stats-ratio-max-counts-padding", f"{LOSSES}:policy_loss", "float(ratio[m].max())", "float(ratio.max())",
           tests=(POLICY_LOSS_TESTS + "test_stats_ratio_max_capped_and_sequence_clip_fractions",)),
    Mutant("step-metrics-ratio-max-averaged", "rlvr.recipes.update:TokenMeans.add", 'if key.endswith("_max"):',
           "if False:", tests=(PRESETS + "test_step_metrics_keep_the_largest_ratio_and_average_the_rest",)),
    Mutant("gspo-dual-clip-frac-on-token-ratios", f"{LOSSES}:_dual_clipped_ratio", "if loss in _SEQUENCE_RATIO_LOSSES:",
           "if False:", tests=(POLICY_LOSS_TESTS + "test_gspo_dual_clip_fraction_counts_sequence_ratios",)),
    Mutant("loss-options-not-passed", f"{LOSSES}:policy_loss", "**extra, **(options or {}))", "**extra)",
           tests=(POLICY_LOSS_TESTS + "test_loss_options_reach_the_loss_and_are_checked_by_name_and_value",)),
    # ---- the engine-trainer mismatch, corrected by default ----------------------------------------------------
    Mutant("mismatch-auto-never-corrects", "rlvr.recipes.update:resolve_off_policy",
           'return "none" if engine_is_exact(config) else "token_tis"', 'return "none"',
           tests=(MISMATCH + "test_auto_corrects_exactly_when_the_engine_is_not_the_trainer",
                  MISMATCH + "test_a_run_with_a_mismatched_engine_is_corrected_and_logs_the_mismatch")),
    Mutant("mismatch-kl-k1-not-k3", "rlvr.recipes.update:Mismatch.add", "(log_ratio.exp() - 1.0 - log_ratio)",
           "(-log_ratio)", tests=(MISMATCH + "test_a_run_with_a_mismatched_engine_is_corrected_and_logs_the_mismatch",)),
    Mutant("tis-weights-inverted", f"{OFF_POLICY}:token_tis", "_log_ratio(prox_logp, behav_logp).exp()",
           "(-_log_ratio(prox_logp, behav_logp)).exp()",
           tests=(MISMATCH + "test_truncated_importance_weights_turn_another_policy_s_samples_into_the_trainer_s_gradient",)),
]

BY_NAME = {m.name: m for m in MUTANTS}
assert len(BY_NAME) == len(MUTANTS), "duplicate mutant names"


# ---------------------------------------------------------------------------------------------
# Applying a mutant in memory
# ---------------------------------------------------------------------------------------------


class MutantError(RuntimeError):
    pass


def _resolve(target: str):
    """``(owner, attribute name, object)`` for ``module:function`` or ``module:Class.method``."""
    module_name, _, qualname = target.partition(":")
    owner = importlib.import_module(module_name)
    *path, attr = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    obj = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
    return owner, attr, obj


def _mutated(target: str, old: str, new: str):
    """The target's function compiled from its source with ``old`` replaced by ``new`` (exactly once)."""
    owner, attr, original = _resolve(target)
    source = textwrap.dedent(inspect.getsource(original))
    count = source.count(old)
    if count != 1:
        raise MutantError(f"{target}: the text to replace occurs {count} times (must be once): {old!r}")
    module = sys.modules[original.__module__] if hasattr(original, "__module__") else inspect.getmodule(original)
    code = compile(source.replace(old, new), f"<mutant of {target}>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    namespace: dict = {}
    exec(code, module.__dict__, namespace)  # decorators run again (a registry's re-registers the new function)
    return owner, attr, original, namespace[attr]


def _rebind(original, replacement) -> int:
    """Replace every reference to ``original`` in loaded modules, registries and module-level dicts."""
    from rlvr.verifiers.plugins import Registry

    count = 0
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for key, value in list(namespace.items()):
            if value is original:
                namespace[key] = replacement
                count += 1
            elif isinstance(value, Registry):
                for name, entry in list(value._loaded.items()):
                    if entry is original:
                        value._loaded[name] = replacement
                        count += 1
            elif isinstance(value, dict) and not key.startswith("__"):
                for name, entry in list(value.items()):
                    if entry is original:
                        value[name] = replacement
                        count += 1
    return count


def apply_mutant(mutant: Mutant) -> None:
    if mutant.apply is not None:
        mutant.apply()
        return
    owner, attr, original, replacement = _mutated(mutant.target, mutant.old, mutant.new)
    setattr(owner, attr, replacement)
    _rebind(original, replacement)


def pytest_configure(config) -> None:
    name = os.environ.get(ENV)
    if not name:
        return
    import pytest

    if name not in BY_NAME:
        raise pytest.UsageError(f"{ENV}={name!r}: no such mutant; known: {', '.join(BY_NAME)}")
    try:
        apply_mutant(BY_NAME[name])
    except Exception as exc:  # a mutant that does not apply must not pass as "caught"
        raise pytest.UsageError(f"mutant {name} did not apply: {type(exc).__name__}: {exc}") from exc


def pytest_report_header(config) -> str | None:
    name = os.environ.get(ENV)
    return f"mutant applied: {name}" if name else None


# ---------------------------------------------------------------------------------------------
# The runner
# ---------------------------------------------------------------------------------------------


def _pytest(tests: list[str], mutant: str | None, timeout: float) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env["COLUMNS"] = "300"  # pytest's short summary keeps the failure's reason on the line
    if mutant:
        env[ENV] = mutant
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "tests.mutants", *tests]
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, "timed out"
    return done.returncode, done.stdout + done.stderr


def _failed_test(output: str) -> str:
    """The first failing test of pytest's short summary, with the start of its reason."""
    found = re.search(r"^(?:FAILED|ERROR) (.+?)(?: - (.*))?$", output, re.MULTILINE)  # ids may hold spaces
    if not found:
        return "?"
    reason = (found.group(2) or "").strip()
    return found.group(1) + (f" ({reason[:60]})" if reason else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these mutants only")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per pytest run")
    args = parser.parse_args(argv)
    unknown = [n for n in args.only or [] if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown mutants: {', '.join(unknown)}")
    selected = [BY_NAME[n] for n in args.only] if args.only else MUTANTS
    if args.list:
        for m in selected:
            print(f"{m.name:32} {m.target}\n{'':32} {' '.join(m.tests)}")
        return 0

    tests = list(dict.fromkeys(t for m in selected for t in m.tests))
    start = time.monotonic()
    code, output = _pytest(tests, None, args.timeout)
    if code != 0:
        print(output[-4000:])
        print(f"baseline: the selected tests do not pass without a mutant (pytest exit {code}); nothing to check")
        return 2
    print(f"baseline: {len(tests)} test ids pass without a mutant ({time.monotonic() - start:.0f} s)")

    survived = broken = 0
    for m in selected:
        t0 = time.monotonic()
        code, output = _pytest(list(m.tests), m.name, args.timeout)
        took = time.monotonic() - t0
        if code == 0:
            survived += 1
            verdict = "SURVIVED"
        elif code == 1:
            verdict = f"caught by {_failed_test(output)}"
        else:
            broken += 1
            reason = re.search(r"mutant \S+ did not apply: .*", output)
            verdict = f"BROKEN (pytest exit {code}): {reason.group(0) if reason else output.strip()[-300:]}"
        print(f"{m.name:32} {verdict}  ({took:.0f} s)", flush=True)
    caught = len(selected) - survived - broken
    print(f"{caught}/{len(selected)} caught, {survived} survived, {broken} broken ({time.monotonic() - start:.0f} s)")
    return 0 if caught == len(selected) else 1


if __name__ == "__main__":
    sys.exit(main())
