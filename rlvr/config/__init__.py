"""Typed configuration: YAML files plus ``key=value`` overrides, validated by pydantic.

Every field has a default, so a config file names only what differs. Unknown keys, wrong types and
impossible combinations are errors that name the key and the valid choices.

    sections.py   the sections every recipe shares (model, data, verifier, optim, log, checkpoint, process)
    run.py        RunConfig: the RL recipes (``rlvr train``), with the algorithm presets
    offline.py    SFTConfig, RewardModelConfig, DPOConfig, PRMConfig: the recipes that learn from fixed data
    loading.py    load_config / build_config / save_config, overrides and error messages

Everything public is importable from here: ``from rlvr.config import RunConfig, load_config``.
"""

from rlvr.config.loading import ConfigError, build_config, deep_merge, load_config, parse_overrides, save_config
from rlvr.config.offline import (DPOConfig, DPOEvalConfig, DPOLossConfig, PRMConfig, PRMDataConfig, PRMEvalConfig,
                                 PRMTrainConfig, PreferenceDataConfig, PreferenceTrainConfig, RewardLossConfig, RewardModelConfig, RewardModelEvalConfig, SFTConfig, SFTDataConfig,
                                 SFTEvalConfig, SFTTrainConfig)
from rlvr.config.run import (CRITIC_ALGORITHM_KEYS, CRITIC_PRESETS, PRESETS, AlgorithmConfig, CriticConfig, EngineConfig,
                             EvalConfig, GenerationConfig, PartnerVerifierConfig, ProcessRewardRunConfig, RewardModelRunConfig, RunConfig,
                             RunLogConfig, TrainConfig)
from rlvr.config.sections import (CheckpointConfig, EnvironmentConfig, FieldError, LogConfig, LoraConfig, ModelConfig, OptimConfig,
                                  ProcessConfig, Section, TaskConfig, VerifierConfig, check_chat_template,
                                  plugin_options, registered)

__all__ = [
    "AlgorithmConfig", "CRITIC_ALGORITHM_KEYS", "CRITIC_PRESETS", "CheckpointConfig", "ConfigError", "CriticConfig",
    "DPOConfig", "DPOEvalConfig", "DPOLossConfig", "EngineConfig", "EnvironmentConfig", "EvalConfig", "FieldError", "GenerationConfig",
    "LogConfig", "LoraConfig", "ModelConfig", "OptimConfig", "PRESETS", "PRMConfig", "PRMDataConfig", "PRMEvalConfig",
    "PRMTrainConfig", "PartnerVerifierConfig",
    "PreferenceDataConfig", "PreferenceTrainConfig", "ProcessConfig", "ProcessRewardRunConfig", "RewardLossConfig", "RewardModelConfig",
    "RewardModelEvalConfig", "RewardModelRunConfig", "RunConfig", "RunLogConfig", "SFTConfig", "SFTDataConfig", "SFTEvalConfig",
    "SFTTrainConfig", "Section", "TaskConfig", "TrainConfig", "VerifierConfig", "build_config", "check_chat_template",
    "deep_merge", "load_config", "parse_overrides", "plugin_options", "registered", "save_config",
]
