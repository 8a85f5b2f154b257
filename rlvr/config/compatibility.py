"""Which features combine: one declarative table, checked in one place.

Every refusal of a *pair* of features is a :class:`Rule` of :data:`RULES`: two :class:`Feature` s
(each a predicate over the config, named by the key that turns it on), why they do not combine, and the
fix. :func:`check_compatibility` checks the table:

* at config load (``when="load"``): every recipe config's model validator
  (:class:`rlvr.config.sections.RecipeConfig`) calls it, so a refused pair fails before any work, and
  before a run folder is claimed;
* at run start (``when="start"``): the rules that need the world size or the device, known only once
  the ranks have joined, checked by :func:`rlvr.run.ranks.join_run` before the run folder is claimed.

:func:`render_markdown` writes the table into docs/training.md ("Which features combine"); a test keeps
the two equal. Options that belong to one feature's own section (``reward_model.offset`` only with
``normalize: fixed``, ...) stay with that section's validator: they are not a combination of features.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional

from rlvr.verifiers.errors import InvalidValueError

CRITIC_PRESETS = ("ppo", "reinforce_baseline")  # rlvr.config.run.CRITIC_PRESETS (imported there from here)


@dataclass(frozen=True)
class Facts:
    """What a feature can depend on: the config, and at run start the ranks and the device."""

    config: Any
    world_size: Optional[int] = None  # known at run start
    device: Any = None  # torch.device, known at run start
    episodes: Optional[bool] = None  # whether the loaded problems play episodes, once the data is read


@dataclass(frozen=True)
class Feature:
    """A feature of a run: ``key`` is what turns it on (named in the refusal), ``name`` what it is (the
    docs), ``on`` whether ``facts`` use it: true or false, or the key that turned it on where ``key``
    names several."""

    key: str
    name: str
    on: Callable[[Facts], "bool | str | None"]


@dataclass(frozen=True)
class Rule:
    """``first`` and ``second`` do not combine. The refusal reads ``"{first.key}: {reason}; {fix}"``;
    ``reason`` and ``fix`` may name config values as ``{preset}``, ``{advantage}``, ``{device}``
    (:func:`_values`). ``recipes`` are the config classes it applies to (empty: every recipe);
    ``when`` is ``"start"`` for a rule that needs the world size or the device."""

    first: Feature
    second: Feature
    reason: str
    fix: str
    recipes: tuple[str, ...] = ("RunConfig",)
    when: Literal["load", "start"] = "load"

    def message(self, facts: Facts, key: str) -> str:
        """The one-line refusal; ``key`` is the one that turned ``first`` on."""
        values = _values(facts)
        return f"{key}: {self.reason.format(**values)}; {self.fix.format(**values)}"

    def applies(self, config: Any) -> bool:
        return not self.recipes or type(config).__name__ in self.recipes


def _values(facts: Facts) -> dict[str, str]:
    """The config values a refusal may quote."""
    config = facts.config
    algorithm = getattr(config, "algorithm", None)
    return {"preset": getattr(algorithm, "preset", ""), "advantage": getattr(algorithm, "advantage", ""),
            "device": str(facts.device)}


def _critic(facts: Facts) -> bool:
    return facts.config.algorithm.preset in CRITIC_PRESETS


def _plays_episodes(facts: Facts) -> bool:
    """Multi-turn episodes: ``environment.name``, or a suite (training or evaluation) that declares
    its problems' environment (a ``default_environment``, e.g. tool_arithmetic; custom's
    ``environment`` or ``environment_field`` option)."""
    from rlvr.tasks.registry import task_factory

    config = facts.config
    if facts.episodes is not None:  # the loaded data's answer: a plugin suite need not declare its environments
        return facts.episodes
    if config.environment.name is not None:
        return True
    for entry in [*config.data, *config.eval.tasks]:
        if entry.options.get("environment") or entry.options.get("environment_field"):
            return True
        try:
            if getattr(task_factory(entry.task), "default_environment", None):
                return True
        except Exception:  # an unknown or broken suite fails where it is loaded, with its own message
            continue
    return False


def _critic_algorithm_key(facts: Facts) -> Optional[str]:
    """The first option only a critic preset reads that differs from its default, as ``algorithm.KEY``."""
    from rlvr.config.run import CRITIC_ALGORITHM_KEYS, AlgorithmConfig

    defaults = AlgorithmConfig()
    changed = [key for key in CRITIC_ALGORITHM_KEYS if getattr(facts.config.algorithm, key) != getattr(defaults, key)]
    return f"algorithm.{changed[0]}" if changed else None


def _critic_section_key(facts: Facts) -> Optional[str]:
    """The first key of ``critic:`` that differs from its default, as ``critic.KEY``."""
    from rlvr.config.run import CriticConfig

    defaults = CriticConfig()
    changed = [key for key, value in facts.config.critic if value != getattr(defaults, key)]
    return f"critic.{changed[0]}" if changed else None


# ---- the features ------------------------------------------------------------------------------
ASYNC = Feature("async_generation.max_staleness", "asynchronous generation (any max_staleness)",
                lambda f: f.config.async_generation.max_staleness is not None)
ASYNC_STALE = Feature("async_generation.max_staleness", "asynchronous generation with max_staleness > 0",
                      lambda f: (f.config.async_generation.max_staleness or 0) > 0)
OTHER_ENGINE = Feature("engine.name", "an engine other than hf (vllm, a plugin's)",
                       lambda f: f.config.engine.name != "hf")
REWARD_MODEL = Feature("reward_model", "a learned reward model", lambda f: f.config.reward_model is not None)
PROCESS_REWARD = Feature("process_reward", "a process reward model", lambda f: f.config.process_reward is not None)
TOKEN_STEP_REWARDS = Feature("process_reward.use", "process rewards on tokens (use: token)",
                             lambda f: f.config.process_reward is not None and f.config.process_reward.use == "token")
SCORE_PER_SAMPLE = Feature("algorithm.advantage", "an estimator of one score per sample (grpo, dr_grpo, rloo)",
                           lambda f: not _critic(f) and f.config.algorithm.advantage != "reinforce_pp")
DYNAMIC_SAMPLING = Feature("algorithm.dynamic_sampling", "dynamic sampling",
                           lambda f: f.config.algorithm.dynamic_sampling)
FSDP2 = Feature("train.strategy", "fsdp2 sharding", lambda f: f.config.train.strategy == "fsdp2")
DDP = Feature("train.strategy", "ddp (each rank a whole copy)", lambda f: f.config.train.strategy == "ddp")
CPU_OFFLOAD = Feature("train.cpu_offload", "CPU offload of the shards", lambda f: f.config.train.cpu_offload)
ENGINE_OLD_LOGPROBS = Feature("algorithm.old_logprobs", "the engine's log-probs as pi_old (old_logprobs: engine)",
                              lambda f: f.config.algorithm.old_logprobs == "engine")
GUIDANCE = Feature("algorithm.guidance", "solution guidance", lambda f: f.config.algorithm.guidance != "none")
CRITIC_PRESET = Feature("algorithm.preset", "a critic preset (ppo, reinforce_baseline)", _critic)
CRITIC_FREE_PRESET = Feature("algorithm.preset",
                             "a critic-free preset (grpo, dr_grpo, dapo, rloo, reinforce_pp, gspo, cispo, gmpo)",
                             lambda f: not _critic(f))
GAE = Feature("algorithm.advantage", "the gae advantage", lambda f: f.config.algorithm.advantage == "gae")
GROUP_ADVANTAGE = Feature("algorithm.advantage", "an advantage other than gae",
                          lambda f: f.config.algorithm.advantage != "gae")
EPISODES = Feature("environment.name", "multi-turn episodes (environment.name, or a suite whose problems name an "
                   "environment)", _plays_episodes)
ADAPTIVE_KL = Feature("algorithm.target_kl", "the adaptive KL controller (critic presets)",
                      lambda f: _critic(f) and f.config.algorithm.target_kl is not None)
NO_KL_IN_REWARD = Feature("algorithm.kl_placement", "no KL penalty in the reward (kl_placement: loss, or beta: 0)",
                          lambda f: f.config.algorithm.beta == 0 or f.config.algorithm.kl_placement != "reward")
CRITIC_PATH = Feature("critic.path", "a critic started from another folder (critic presets)",
                      lambda f: _critic(f) and f.config.critic.path is not None)
LORA = Feature("model.lora", "LoRA adapters", lambda f: f.config.model.lora is not None)
CRITIC_ALGORITHM_KEY = Feature("algorithm.gamma, lam, whiten_advantages, truncation, value_clip, value_coef, "
                               "target_kl, kl_horizon, early_stop_kl", "an algorithm option of the critic presets",
                               _critic_algorithm_key)
CRITIC_SECTION = Feature("critic.path, critic.lr", "the critic: section", _critic_section_key)
PRM_RECIPE = Feature("train-prm", "training a process reward model (rlvr train-prm)", lambda f: True)
# known at run start
SEVERAL_RANKS = Feature("torchrun --nproc-per-node", "several ranks", lambda f: (f.world_size or 1) > 1)
SHARDED = Feature("train.strategy", "fsdp2 sharding over several ranks",
                  lambda f: f.config.train.strategy == "fsdp2" and (f.world_size or 1) > 1)
LORA_CRITIC = Feature("model.lora", "a LoRA critic (a critic preset with model.lora)",
                      lambda f: _critic(f) and f.config.model.lora is not None)
NO_CUDA = Feature("train.device", "a device other than CUDA", lambda f: getattr(f.device, "type", "cpu") != "cuda")

_ASYNC_WITHOUT = "asynchronous generation runs the HF engine in a process of its own, without {key} (set here)"
_PRM_WITHOUT = "a process reward model is not combined with {key} (set here) yet"


def _without(template: str, feature: Feature) -> str:
    return template.replace("{key}", feature.key)


#: The table. The first rule a config breaks is its refusal.
RULES: list[Rule] = [
    # ---- asynchronous generation
    *(Rule(ASYNC, other, _without(_ASYNC_WITHOUT, other), "remove one of the two")
      for other in (OTHER_ENGINE, REWARD_MODEL, DYNAMIC_SAMPLING, FSDP2)),
    Rule(ASYNC_STALE, ENGINE_OLD_LOGPROBS, "with async_generation.max_staleness > 0 the engine's log-probs "
         "(algorithm.old_logprobs: engine) are those of an older policy, not pi_old",
         "use algorithm.old_logprobs: recompute (or auto)"),
    Rule(ASYNC, SEVERAL_RANKS, "asynchronous generation runs in one process, and this run has several ranks "
         "(torchrun --nproc-per-node)", "remove it, or run one process", when="start"),
    # ---- process reward models
    *(Rule(PROCESS_REWARD, other, _without(_PRM_WITHOUT, other), "remove one of the two")
      for other in (REWARD_MODEL, EPISODES, ASYNC, GUIDANCE)),
    Rule(TOKEN_STEP_REWARDS, SCORE_PER_SAMPLE, "token rewards need an estimator that takes them (a critic preset "
         "such as ppo, or advantage reinforce_pp), and algorithm.advantage is '{advantage}', which takes one score "
         "per sample", "use aggregate (or auto)"),
    # ---- learned reward models and multi-turn episodes
    Rule(REWARD_MODEL, EPISODES, "a learned reward model scores single completions, not the multi-turn episodes of "
         "environment.name (or of a suite whose problems name an environment)",
         "remove reward_model or the environment"),
    # ---- solution guidance
    Rule(GUIDANCE, CRITIC_PRESET, "a gold solution is judged by the verifier and enters a group's baseline, so it "
         "needs a critic-free preset, and algorithm.preset is '{preset}'", "remove algorithm.guidance"),
    Rule(GUIDANCE, REWARD_MODEL, "a gold solution is judged by the verifier and enters a group's baseline, so it "
         "needs the verifier's reward, and reward_model is set", "remove algorithm.guidance or reward_model"),
    Rule(GUIDANCE, EPISODES, "a gold solution is one completion, and the problems play multi-turn episodes "
         "(environment.name, or a suite whose problems name an environment)", "set algorithm.guidance: none"),
    # ---- critic presets and critic-free presets
    Rule(GAE, CRITIC_FREE_PRESET, "gae needs a critic",
         "valid presets for it: ppo, reinforce_baseline (algorithm.preset is '{preset}')"),
    Rule(GROUP_ADVANTAGE, CRITIC_PRESET, "the {preset} preset's advantages come from its critic (gae), not "
         "'{advantage}' (algorithm.preset)", "remove the key, or pick a critic-free preset"),
    Rule(DYNAMIC_SAMPLING, CRITIC_PRESET, "the {preset} preset has no groups to filter (its baseline is the critic, "
         "algorithm.preset)", "remove the key"),
    Rule(ADAPTIVE_KL, NO_KL_IN_REWARD, "the adaptive controller scales the KL penalty in the reward, starting from "
         "algorithm.beta", "set algorithm.kl_placement: reward and algorithm.beta > 0"),
    Rule(CRITIC_PATH, LORA, "with model.lora the critic is a value adapter on the policy's own base weights, so it "
         "starts from the policy", "set critic.path: null (or train all weights)"),
    Rule(CRITIC_ALGORITHM_KEY, CRITIC_FREE_PRESET, "only the critic presets (ppo, reinforce_baseline) use it, and "
         "algorithm.preset is '{preset}'", "remove the key, or set algorithm.preset: ppo"),
    Rule(CRITIC_SECTION, CRITIC_FREE_PRESET, "only the critic presets (ppo, reinforce_baseline) have a critic, and "
         "algorithm.preset is '{preset}'", "remove the key, or set algorithm.preset: ppo"),
    Rule(SHARDED, LORA_CRITIC, "fsdp2 with model.lora cannot train the {preset} preset's critic, a second LoRA "
         "adapter on the sharded policy", "use train.strategy: ddp (LoRA keeps the whole model small) or full "
         "fine-tuning", when="start"),
    # ---- every recipe
    Rule(CPU_OFFLOAD, DDP, "a ddp rank (train.strategy: ddp) holds its whole model, there are no shards to offload",
         "train.cpu_offload needs train.strategy: fsdp2, or remove it", recipes=()),
    Rule(CPU_OFFLOAD, NO_CUDA, "it moves shards off a GPU, but this run trains on {device} (train.device)",
         "remove train.cpu_offload", recipes=(), when="start"),
    Rule(FSDP2, PRM_RECIPE, "fsdp2 is not supported by train-prm", "use ddp", recipes=("PRMConfig",)),
]


def check_compatibility(config: Any, when: Literal["load", "start"] = "load", *, world_size: Optional[int] = None,
                        device: Any = None, episodes: Optional[bool] = None) -> None:
    """Refuse the first rule of :data:`RULES` (of kind ``when``) that ``config`` breaks, with a one-line
    :class:`InvalidValueError` naming both keys and the fix. ``world_size`` and ``device`` are those of
    the run (``when="start"``); ``episodes`` is whether the loaded problems play multi-turn episodes
    (None: judged from the config, as at load; the RL run passes what its data says, for a plugin suite
    that does not declare the environment its problems name)."""
    facts = Facts(config, world_size=world_size, device=device, episodes=episodes)
    for rule in RULES:
        if rule.when != when or not rule.applies(config):
            continue
        first = rule.first.on(facts)
        if first and rule.second.on(facts):
            raise InvalidValueError(rule.message(facts, first if isinstance(first, str) else rule.first.key))


def render_markdown() -> str:
    """The table as docs/training.md shows it (between the ``compatibility`` markers)."""
    placeholders = {"preset": "<preset>", "advantage": "<advantage>", "device": "<device>"}
    lines = ["| feature | does not combine with | why | fix | checked |", "|---|---|---|---|---|"]
    for rule in RULES:
        where = "config load" if rule.when == "load" else "run start"
        if rule.recipes and rule.recipes != ("RunConfig",):
            where += " (" + ", ".join(_COMMANDS[name] for name in rule.recipes) + ")"
        elif not rule.recipes:
            where += " (every recipe)"
        cells = [f"{rule.first.name} (`{rule.first.key}`)", f"{rule.second.name} (`{rule.second.key}`)",
                 rule.reason.format(**placeholders), rule.fix.format(**placeholders), where]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


_COMMANDS = {"RunConfig": "rlvr train", "PRMConfig": "rlvr train-prm", "SFTConfig": "rlvr sft",
             "RewardModelConfig": "rlvr train-rm", "DPOConfig": "rlvr dpo"}


if __name__ == "__main__":  # python -m rlvr.config.compatibility: the table for docs/training.md
    print(render_markdown(), end="")
