"""Configs of the recipes that learn from fixed data, not from rollouts: SFT (``rlvr sft``), the
Bradley-Terry reward model (``rlvr train-rm``), offline DPO (``rlvr dpo``) and the process reward model
(``rlvr train-prm``).

Built from the same sections as ``RunConfig`` (``rlvr/config/sections.py``) and loaded the same way:
``load_config(SFTConfig, path, overrides)``.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from rlvr.config.sections import (CheckpointConfig, EnvironmentConfig, FieldError, LogConfig, ModelConfig, OptimConfig,
                                  ProcessConfig, RecipeConfig, Section, check_chat_template, check_stop_strings,
                                  plugin_options, registered)


class SFTDataConfig(Section):
    """One source of SFT examples; ``data`` is a list of them (like ``rlvr train``'s), whose examples
    are pooled. A single mapping is accepted too, as a list of one."""

    task: Optional[str] = Field("arithmetic", description="task suite whose problems carry a gold solution")
    path: Optional[str] = Field(None, description="suite data path, or a JSONL of {prompt|messages, completion} when task is null")
    split: str = Field("train", description="which split of the suite to read")
    options: dict[str, Any] = Field(default_factory=dict, description="keyword options of the suite")
    limit: Optional[int] = Field(None, ge=1, description="use only the first N examples")
    chat_template: str = Field("auto", description="how prompts are rendered: auto, none or a Jinja template file "
                               "(as data[i].chat_template of `rlvr train`: SFT and RL should render them alike)")

    _valid_chat_template = field_validator("chat_template")(lambda cls, v: check_chat_template(v))

    @model_validator(mode="after")
    def _known_task_and_options(self) -> "SFTDataConfig":
        if self.task is not None:
            registered("rlvr.tasks:TASKS", self.task, "task")
            plugin_options("rlvr.tasks.registry:check_task", self.task, self.options, "task")
        elif not self.path:
            raise FieldError("path", "set task to a suite, or task: null with path to a JSONL file of "
                             "{prompt|messages, completion} lines")
        return self


class SFTTrainConfig(ProcessConfig):
    steps: int = Field(500, ge=1, description="optimizer steps at most (eval.stop_at_accuracy may stop sooner)")
    batch_size: int = Field(64, ge=1, description="sequences per optimizer step")
    micro_batch_size: int = Field(256, ge=1, description="sequences per forward/backward (memory bound)")


class GreedyEvalStops(Section):
    """Stop strings of a recipe's greedy evaluation, as ``generation.stop`` / ``include_stop`` of ``rlvr train``
    (the same task should be measured alike by every recipe)."""

    stop: list[str] = Field(default_factory=list, description="strings that end a greedy answer when its text holds "
                            "one (as generation.stop of `rlvr train`), e.g. ['</answer>']")
    include_stop: bool = Field(True, description="keep the stop string in the answer the verifier reads (false: cut it)")

    _stop_strings_are_not_empty = field_validator("stop")(check_stop_strings)


class SFTEvalConfig(GreedyEvalStops):
    every: int = Field(0, ge=0, description="greedy accuracy on held-out problems every N steps (0 = only at the end)")
    at_end: bool = Field(True, description="measure the final model too (when the last step was not measured already); "
                         "needs a task: eval.task, or the first data entry's")
    task: Optional[str] = Field(None, description="default: the first data entry's task")
    split: str = Field("dev", description="the split of eval.task measured")
    options: dict[str, Any] = Field(default_factory=dict, description="default: the first data entry's options")
    limit: int = Field(200, ge=1, description="problems measured")
    max_new_tokens: int = Field(16, ge=1, description="tokens of each greedy answer at most")
    stop_at_accuracy: Optional[float] = Field(None, gt=0, le=1, description="stop as soon as held-out accuracy reaches this")


class SFTConfig(RecipeConfig):
    """Supervised fine-tuning on gold completions (``rlvr sft``), loss on completion tokens only."""

    out: Optional[str] = Field(None, description="run folder; null = a new runs/sft-<timestamp> (a folder that "
                               "already holds a run is refused unless --resume or --overwrite)")
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: list[SFTDataConfig] = Field(default_factory=lambda: [SFTDataConfig()],
                                      description="example sources (suites with gold solutions, or JSONL files), pooled")
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-5))
    train: SFTTrainConfig = Field(default_factory=SFTTrainConfig)
    eval: SFTEvalConfig = Field(default_factory=SFTEvalConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig, description="multi-turn solutions: how "
                                           "environment messages become tokens (messages), and the episodes the "
                                           "evaluation plays (as in `rlvr train`)")
    log: LogConfig = Field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)

    @model_validator(mode="after")
    def _check(self) -> "SFTConfig":
        if not self.model.path:
            raise ValueError("model.path: set it to a local Hugging Face model folder")
        if not self.data:
            raise ValueError("data: at least one source of examples is needed")
        if self.eval.every and self.eval.task is None and self.data[0].task is None:
            raise ValueError("eval.task: evaluation needs a task suite (the first data entry is a JSONL file)")
        return self

    @model_validator(mode="before")
    @classmethod
    def _one_source_as_a_list(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and isinstance(raw.get("data"), dict) and not all(str(k).isdigit() for k in raw["data"]):
            return {**raw, "data": [raw["data"]]}
        return raw


# ---------------------------------------------------------------------------------------------
# Preference learning: the Bradley-Terry reward model (``rlvr train-rm``) and offline DPO (``rlvr dpo``)
# ---------------------------------------------------------------------------------------------


class PreferenceDataConfig(Section):
    """Preference pairs ``(prompt, chosen, rejected)``: a JSONL or Parquet file, or a hub dataset
    (read with ``datasets``). The prompt is a string or chat messages; chosen and rejected are
    strings or assistant messages (see docs/reward-models.md)."""

    path: str = Field("", description="JSONL / Parquet file of pairs (e.g. written by `rlvr preferences`), or a hub "
                      "dataset name")
    format: Literal["auto", "jsonl", "parquet", "hub"] = Field(
        "auto", description="auto = by the file's suffix (.jsonl, .parquet), else a hub dataset")
    columns: dict[str, str] = Field(default_factory=dict, description="field names in the data for prompt, chosen, "
                                    "rejected when they differ, e.g. {prompt: question, chosen: good, rejected: bad}")
    split: str = Field("train", description="hub dataset split")
    limit: Optional[int] = Field(None, ge=1, description="use only the first N pairs")
    eval_fraction: float = Field(0.1, ge=0, lt=1, description="fraction of the prompts held out for evaluation (all "
                                 "pairs of a prompt go to the same side); ignored when eval_path is set")
    eval_path: Optional[str] = Field(None, description="a separate file (or hub dataset) of held-out pairs")
    eval_split: str = Field("test", description="hub split of eval_path")
    max_length: Optional[int] = Field(None, ge=2, description="pairs longer than this (prompt + completion + EOS, "
                                      "tokens) are left out and counted; null = the model's context length")

    @model_validator(mode="after")
    def _check(self) -> "PreferenceDataConfig":
        unknown = sorted(set(self.columns) - {"prompt", "chosen", "rejected"})
        if unknown:
            raise FieldError("columns", f"unknown field(s) {', '.join(unknown)}; map prompt, chosen, rejected")
        return self


def _check_preference_run(config) -> None:
    if not config.model.path:
        raise ValueError("model.path: set it to a local Hugging Face model folder")
    if not config.data.path:
        raise ValueError("data.path: set it to a JSONL or Parquet file of {prompt, chosen, rejected} pairs (e.g. "
                         "written by `rlvr preferences`) or a hub dataset name")


class PreferenceTrainConfig(ProcessConfig):
    epochs: float = Field(1.0, gt=0, description="passes over the training pairs (fractions allowed)")
    batch_size: int = Field(32, ge=1, description="pairs per optimizer step")
    micro_batch_size: int = Field(32, ge=1, description="pairs per forward/backward (memory bound)")


class RewardLossConfig(Section):
    margin: float = Field(0.0, description="the chosen must outscore the rejected by this much: -log sigmoid(r_w - r_l - m)")
    center_coef: float = Field(0.0, ge=0, description="reward centering, + c * mean((r_w + r_l)^2); keeps scores near 0")
    nll_coef: float = Field(0.0, ge=0, description="logprob head only: + this times the NLL per token of the chosen "
                            "completions, which keeps their log-probs from falling (Bradley-Terry fixes only differences), "
                            "so the head's own most likely answer, the one RL against it drifts to, improves with its ranking")


class RewardModelEvalConfig(Section):
    every: int = Field(0, ge=0, description="held-out pairwise accuracy every N steps (0 = only at start and end)")
    batch_size: int = Field(64, ge=1, description="pairs scored together")


class RewardModelConfig(RecipeConfig):
    """A Bradley-Terry reward model on preference pairs (``rlvr train-rm``)."""

    out: Optional[str] = Field(None, description="run folder; null = a new runs/rm-<timestamp> (a folder that already "
                               "holds a run is refused unless --resume or --overwrite)")
    model: ModelConfig = Field(default_factory=ModelConfig)
    head: Literal["score", "logprob"] = Field(
        "score", description="score: a linear head on the last token's hidden state (a sequence-classification "
        "model); logprob: r = sum log p(completion, EOS | prompt) of the causal LM itself (see docs/reward-models.md)")
    data: PreferenceDataConfig = Field(default_factory=PreferenceDataConfig)
    loss: RewardLossConfig = Field(default_factory=RewardLossConfig)
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-4))
    train: PreferenceTrainConfig = Field(default_factory=PreferenceTrainConfig)
    eval: RewardModelEvalConfig = Field(default_factory=RewardModelEvalConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)

    @model_validator(mode="after")
    def _check(self) -> "RewardModelConfig":
        _check_preference_run(self)
        if self.loss.nll_coef and self.head != "logprob":
            raise ValueError(f"loss.nll_coef: {self.loss.nll_coef} needs head: logprob (a score head has no "
                             "completion log-probs); set it to 0 or use the logprob head")
        return self


class DPOLossConfig(Section):
    loss: str = Field("sigmoid", description="sigmoid (DPO; cDPO with label_smoothing), ipo, or a plugin's")
    beta: float = Field(0.1, gt=0, description="strength of the pull to the reference (the implicit reward's scale)")
    label_smoothing: float = Field(0.0, ge=0, lt=0.5, description="cDPO: probability that a preference label is wrong")
    nll_coef: float = Field(0.0, ge=0, description="+ this times the NLL per token of the chosen completion (RPO); keeps "
                            "the chosen log-probs from falling")

    _known_loss = field_validator("loss")(lambda cls, v: registered("rlvr.algorithms.preference:DPO_LOSSES", v))


class DPOEvalConfig(GreedyEvalStops):
    every: int = Field(0, ge=0, description="held-out implicit accuracy (and gold accuracy with a task) every N steps "
                       "(0 = only at start and end)")
    batch_size: int = Field(64, ge=1, description="pairs scored together")
    task: Optional[str] = Field(None, description="task suite for greedy gold accuracy before/after (null = none)")
    path: Optional[str] = Field(None, description="the suite's data path")
    split: str = Field("test", description="the split of eval.task measured")
    options: dict[str, Any] = Field(default_factory=dict, description="keyword options of the suite")
    limit: int = Field(200, ge=1, description="problems evaluated")
    max_new_tokens: int = Field(16, ge=1, description="tokens of each greedy answer at most")

    @model_validator(mode="after")
    def _known_task_and_options(self) -> "DPOEvalConfig":
        if self.task is not None:
            registered("rlvr.tasks:TASKS", self.task, "task")
            plugin_options("rlvr.tasks.registry:check_task", self.task, self.options, "task")
        return self


class DPOConfig(RecipeConfig):
    """Offline direct preference optimisation on preference pairs (``rlvr dpo``)."""

    out: Optional[str] = Field(None, description="run folder; null = a new runs/dpo-<timestamp> (a folder that already "
                               "holds a run is refused unless --resume or --overwrite)")
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: PreferenceDataConfig = Field(default_factory=PreferenceDataConfig)
    dpo: DPOLossConfig = Field(default_factory=DPOLossConfig)
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-5))
    train: PreferenceTrainConfig = Field(default_factory=PreferenceTrainConfig)
    eval: DPOEvalConfig = Field(default_factory=DPOEvalConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)

    @model_validator(mode="after")
    def _check(self) -> "DPOConfig":
        _check_preference_run(self)
        return self


# ---------------------------------------------------------------------------------------------
# Process reward model (``rlvr train-prm``)
# ---------------------------------------------------------------------------------------------


class PRMDataConfig(Section):
    """Step-labelled examples, one JSON object a line (TRL's stepwise-supervision format; Math-Shepherd
    and PRM800K convert to it): ``{"prompt": text or chat messages, "completions": [step, ...],
    "labels": [true|false, ...]}`` (docs/process-rewards.md)."""

    path: str = Field("", description="JSONL file of step-labelled examples (e.g. written by "
                      "rlvr.tasks.chain_arithmetic.write_prm_data)")
    separator: str = Field("\n", description="what joins the steps into the completion text; a step ends at the "
                           "token that completes the separator after it (the last step: at the completion's EOS). "
                           "Saved with the model (prm.json): scoring splits completions the same way")
    limit: Optional[int] = Field(None, ge=1, description="use only the first N examples")
    eval_fraction: float = Field(0.1, ge=0, lt=1, description="fraction of the prompts held out for evaluation (all "
                                 "examples of a prompt go to the same side); ignored when eval_path is set")
    eval_path: Optional[str] = Field(None, description="a separate JSONL file of held-out examples")
    max_length: Optional[int] = Field(None, ge=2, description="examples longer than this (prompt + completion + EOS, "
                                      "tokens) are left out and counted; null = the model's context length")

    @field_validator("separator")
    @classmethod
    def _separator(cls, value: str) -> str:
        if not value:
            raise ValueError("must not be empty: steps are split at it (e.g. '\\n', '\\n\\n' or a tag like ' ки')")
        return value


class PRMTrainConfig(ProcessConfig):
    epochs: float = Field(1.0, gt=0, description="passes over the training examples (fractions allowed)")
    batch_size: int = Field(32, ge=1, description="examples (completions, with all their steps) per optimizer step")
    micro_batch_size: int = Field(32, ge=1, description="examples per forward/backward (memory bound)")


class PRMEvalConfig(Section):
    every: int = Field(0, ge=0, description="held-out step accuracy every N steps (0 = only at start and end)")
    batch_size: int = Field(64, ge=1, description="examples scored together")
    threshold: float = Field(0.5, gt=0, lt=1, description="a step is predicted good when p(good) >= this")


class PRMConfig(RecipeConfig):
    """A process reward model on step-labelled completions (``rlvr train-prm``): a token classifier read at
    the last token of each step, trained with cross-entropy on the step labels there."""

    out: Optional[str] = Field(None, description="run folder; null = a new runs/prm-<timestamp> (a folder that "
                               "already holds a run is refused unless --resume or --overwrite)")
    model: ModelConfig = Field(default_factory=ModelConfig, description="model.path: a causal LM folder (a new head "
                               "of 2 labels, bad/good, is put on it) or a token-classification folder (1 or 2 labels) "
                               "with the policy's tokenizer")
    data: PRMDataConfig = Field(default_factory=PRMDataConfig)
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-4))
    train: PRMTrainConfig = Field(default_factory=PRMTrainConfig)
    eval: PRMEvalConfig = Field(default_factory=PRMEvalConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)

    @model_validator(mode="after")
    def _check(self) -> "PRMConfig":
        if not self.model.path:
            raise ValueError("model.path: set it to a local Hugging Face model folder (a causal LM, or a token "
                             "classifier with 1 or 2 labels)")
        if not self.data.path:
            raise ValueError("data.path: set it to a JSONL file of {prompt, completions, labels} lines (step-labelled "
                             "completions, e.g. written by rlvr.tasks.chain_arithmetic.write_prm_data)")
        return self
