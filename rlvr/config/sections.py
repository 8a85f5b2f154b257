"""The config sections every recipe shares (model, data, verifier, optimizer, logging, checkpoints, the
process), and the checks that tie a field to a registry: a plugin's name is as valid as a built-in one."""

from __future__ import annotations

import re
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator

from rlvr.verifiers.errors import UserError


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class FieldError(ValueError):
    """A check of a whole section that blames one of its fields (reported as ``section.field``)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def registered(registry: str, name: str, field: str | None = None) -> str:
    """``name`` when the registry at ``registry`` (``"module:ATTRIBUTE"``) knows it; else a
    ValueError listing the valid names, which pydantic reports under the field's key. Plugins'
    names (entry points) count like built-in ones. The registry's module is imported here, not
    when this module is, so reading a config stays cheap until it is validated."""
    from rlvr.verifiers.plugins import import_target

    try:
        return import_target(registry).check(name)
    except UserError as exc:
        raise (FieldError(field, str(exc)) if field else ValueError(str(exc))) from None


def plugin_options(check: str, name: str, options: dict, name_field: str) -> None:
    """Run ``check(name, options)`` (``"module:function"``) and report a user error as a ValueError,
    so that a bad verifier or task option fails when the config is loaded, not mid-run."""
    from rlvr.verifiers.errors import PluginLoadError
    from rlvr.verifiers.plugins import import_target

    try:
        import_target(check)(name, options)
    except UserError as exc:
        raise FieldError(name_field if isinstance(exc, PluginLoadError) else "options", str(exc)) from None


def check_stop_strings(value: list[str]) -> list[str]:
    """A ``stop`` list (``generation.stop``, a recipe's ``eval.stop``): every string non-empty."""
    if any(not string for string in value):
        raise ValueError("every stop string must be non-empty (an empty one would end every completion at once)")
    return value


def check_chat_template(value: str) -> str:
    """``auto``, ``none`` or a readable Jinja template file (pydantic reports the error under the field)."""
    from rlvr.rollout.chat import resolve_chat_template

    try:
        resolve_chat_template(value, where="file")
    except UserError as exc:
        raise ValueError(str(exc).removeprefix("file: ")) from None
    return value


class LoraConfig(Section):
    r: int = Field(16, ge=1, description="adapter rank")
    alpha: float = Field(32.0, gt=0, description="LoRA scaling numerator (scale = alpha / r)")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapters' input during training")
    target_modules: list[str] | str = Field("all-linear", description="module names, or 'all-linear'")


class ModelConfig(Section):
    path: str = Field("", description="a Hugging Face model: a local folder (e.g. a run's final/, or one made by the "
                      "tiny-model builder) or a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct (downloaded into "
                      "the hub cache on first use)")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="the compute dtype; weights that train stay float32 (master weights, "
        "rlvr/modeling/precision.py); float16 is refused (it needs loss scaling)")
    lora: Optional[LoraConfig] = Field(None, description="train LoRA adapters instead of all weights")
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass: less memory, "
                                         "about a third more compute per update")
    forward: Literal["auto", "hf"] = Field(
        "auto", description="auto: rlvr's shared-prompt forward (rlvr/modeling/fast_forward.py) for the architectures it "
        "supports (llama, mistral, qwen2), the model's own otherwise; hf: always the model's own (transformers) forward")
    logits_chunk_mb: float = Field(
        256, ge=0, description="the most memory (MiB) one chunk of float32 logits may take in a log-prob pass: longer "
        "passes compute log-probs a chunk of tokens at a time and recompute each chunk's logits in the backward "
        "(rlvr/modeling/chunked_logprobs.py); 0: whole logits at once")


    @field_validator("dtype")
    @classmethod
    def _trainable_dtype(cls, value: str) -> str:
        if value == "float16":  # the reason: rlvr/modeling/precision.py
            raise ValueError("float16 training needs loss scaling (its gradients and Adam's second moments "
                             "underflow), which rlvr does not do; use bfloat16 (bf16 compute with float32 master "
                             "weights) or float32")
        return value


class TaskConfig(Section):
    task: str = Field("arithmetic", description="registered task suite (see `rlvr tasks list`)")
    path: Optional[str] = Field(None, description="local data file/folder or hub dataset name for the suite")
    split: str = Field("train", description="which split of the suite to read (`rlvr tasks list` names them)")
    options: dict[str, Any] = Field(default_factory=dict, description="keyword options of the suite")
    weight: float = Field(1.0, gt=0, description="sampling weight when several suites are mixed")
    limit: Optional[int] = Field(None, ge=1, description="use only the first N problems")
    chat_template: str = Field("auto", description="how prompts are rendered: auto (the tokenizer's chat template), "
                               "none (raw prompts: message contents as plain text), or a Jinja template file")

    _valid_chat_template = field_validator("chat_template")(lambda cls, v: check_chat_template(v))

    @model_validator(mode="after")
    def _known_task_and_options(self) -> "TaskConfig":
        registered("rlvr.tasks:TASKS", self.task, "task")
        plugin_options("rlvr.tasks.registry:check_task", self.task, self.options, "task")
        return self


class VerifierConfig(Section):
    name: Optional[str] = Field(None, description="verifier to use; null = each problem's own (the suite's default)")
    options: dict[str, Any] = Field(default_factory=dict, description="keyword options of verifier.name (`rlvr "
                                    "verifiers list` shows each verifier's)")
    workers: Optional[int] = Field(
        None, ge=0, description="verifier worker processes, each item under a hard deadline; null = one per core "
        "(at most 4); 0 = score in the trainer process, without a deadline (only for cheap, trusted verifiers). "
        "Verifiers that declare in_process (numeric, repetition, length in overlong mode) are always scored there")
    timeout_s: float = Field(10.0, gt=0, description="hard deadline per item, in seconds (with worker processes)")
    backend: Literal["local", "ray"] = Field(
        "local", description="where verifier workers run: local (processes on this machine) or ray (Ray actors "
        "across a cluster, same deadline and statuses; an actor lost under an item retries it; needs the [ray] "
        "extra). With ray, workers null = one actor per ray_num_cpus CPUs of the cluster, divided between torchrun's "
        "ranks")
    ray_address: Optional[str] = Field(
        None, description="Ray cluster to join (e.g. auto, ray://head:10001); null = RAY_ADDRESS or a running "
        "`ray start`, else a local Ray for this run")
    ray_num_cpus: float = Field(1.0, gt=0, description="CPUs Ray reserves for each verifier actor")
    on_failure: Literal["mask", "zero"] = Field(
        "mask", description="samples whose verification timed out or errored: masked out of the loss, or scored 0"
    )
    success_threshold: Optional[float] = Field(
        None, description="a sample counts as correct (accuracy) when score >= this; null = accuracy only where a "
        "step's scores are all 0 or 1 (binary rewards; a continuous reward logs no accuracy)")
    max_error_frac: float = Field(
        0.5, ge=0, le=1, description="stop the run when more than this fraction of one step's samples got status "
        "error from the verifier (its first traceback is printed once, whatever the fraction)")

    @model_validator(mode="after")
    def _known_verifier_and_options(self) -> "VerifierConfig":
        if self.backend == "ray" and self.workers == 0:
            raise FieldError("workers", "workers 0 scores in the trainer process, which the ray backend cannot do: "
                             "use workers >= 1 or null (one actor per CPU of the cluster), or backend local")
        if self.name is None:
            if self.options:
                raise FieldError("options", "options need a verifier.name (with name null, each problem is "
                                 "scored by its suite's default verifier with its default options)")
            return self
        registered("rlvr.verifiers:VERIFIERS", self.name, "name")
        plugin_options("rlvr.verifiers.registry:check_verifier", self.name, self.options, "name")
        return self


class EnvironmentConfig(Section):
    """Multi-turn episodes (``docs/environments.md``): used for every problem whose suite names an
    environment, or for all problems when ``name`` is set."""

    name: Optional[str] = Field(None, description="environment for every problem (`rlvr tasks list` names them); "
                                "null = each problem's own (none: one completion per sample, as without this section)")
    options: dict[str, Any] = Field(default_factory=dict, description="keyword options of the environment(s), e.g. "
                                    "for tools: tools, call_format (json|code), max_calls_per_turn, timeout_s, "
                                    "memory_mb, max_output_chars, full_traceback")
    max_turns: int = Field(4, ge=1, description="assistant turns per episode at most (stop reason max_turns)")
    max_episode_tokens: int = Field(512, ge=1, description="tokens after the prompt per episode at most, sampled and "
                                    "environment together (stop reason max_tokens); each turn also samples at most "
                                    "generation.max_new_tokens")
    messages: Literal["auto", "template", "text"] = Field(
        "auto", description="how environment messages become tokens: template (the chat template's own tool/user "
        "turns; it must be prefix-preserving), text (plain text, for models without one), auto (template when the "
        "tokenizer has a chat template, else text)")
    workers: int = Field(4, ge=1, description="threads that run environment steps (tool calls) at once")
    step_timeout_s: float = Field(60.0, gt=0, description="seconds each call into an environment's code (episode(), "
                                  "step(), close()) may take before its episode ends as error (an environment that "
                                  "declares a longer step_timeout_s of its own, e.g. tools, gets that)")

    _known_environment = field_validator("name")(
        lambda cls, v: v if v is None else registered("rlvr.tasks.environments:ENVIRONMENTS", v))

    @model_validator(mode="after")
    def _known_options(self) -> "EnvironmentConfig":
        if self.name is not None:
            plugin_options("rlvr.tasks.environments:check_environment", self.name, self.options, "name")
        return self


class OptimConfig(Section):
    lr: float = Field(1e-6, gt=0, description="peak learning rate (AdamW)")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW beta1, beta2")
    warmup_steps: int = Field(0, ge=0, description="steps of linear warm-up from 0 to lr")
    schedule: Literal["constant", "linear", "cosine"] = Field("constant", description="the learning rate after "
                                                              "warm-up: constant, or decaying to min_lr_ratio * lr")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="final lr / peak lr for linear and cosine decay")
    grad_clip: float = Field(1.0, gt=0, description="max global gradient norm")


#: What ``log.tensorboard`` / ``log.wandb`` import, and the extra that installs both.
TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb"}
TRACKING_EXTRA = "pip install 'rlvr[tracking]'"


def tracker_missing(flag: str) -> str | None:
    """Why ``log.<flag>`` cannot work here (its package is not installed), or None when it can; the
    message goes after ``log.<flag>: ``."""
    import importlib.util

    module = TRACKERS[flag]
    if importlib.util.find_spec(module) is None:
        return (f"the {module} package is not installed; install it with {TRACKING_EXTRA} (or pip install {module}), "
                f"or set log.{flag}: false")
    return None


class LogConfig(Section):
    tensorboard: bool = Field(False, description="also write every numeric metric as TensorBoard events (run folder's "
                              f"tensorboard/); needs the tracking extra: {TRACKING_EXTRA}")
    wandb: bool = Field(False, description="also send every numeric metric and the resolved config to Weights & "
                        f"Biases; needs the tracking extra ({TRACKING_EXTRA}) and `wandb login` (or WANDB_MODE=offline)")
    wandb_project: str = Field("rlvr", description="[wandb] the W&B project")
    wandb_entity: Optional[str] = Field(None, description="[wandb] the W&B team or user; null = your default entity")
    wandb_name: Optional[str] = Field(None, description="[wandb] the W&B run's display name; null = the run folder's "
                                      "name")
    plot: bool = Field(True, description="draw metrics.png (every plot_every steps and at the end); false = no plot")
    plot_every: int = Field(50, ge=0, description="redraw plots every N steps (0 = only at the end)")
    alarm_patience: int = Field(5, ge=1, description="consecutive bad steps before an alarm")
    gold_window: int = Field(2, ge=1, description="steps the gold-vs-proxy alarm averages: the verifier's mean score "
                             "(gold) and the reward model's (proxy) of each step's samples; it fires when that gold "
                             "window falls below the gold_reference steps before it beyond noise while the proxy rises")
    gold_reference: int = Field(10, ge=1, description="steps before the gold window that the gold-vs-proxy alarm "
                                "compares it with")
    stop_on: list[str] = Field(default_factory=list, description="alarms that end the run (zero_variance, truncation, "
                               "no_extraction, gold_vs_proxy): the step finishes, the run is evaluated and checkpointed, "
                               "summary.json says why; with gold_vs_proxy, final/ is the policy of the best gold window")
    progress: bool = Field(True, description="show progress: a bar on a terminal, else a plain line every tenth of "
                           "the run; false = neither")

    @model_validator(mode="after")
    def _trackers_installed(self) -> "LogConfig":
        """A tracker asked for without its package fails here, at config load, before a model is loaded: not
        a warning mid-start and a run without the tracking it was asked for."""
        for flag in TRACKERS:
            problem = getattr(self, flag) and tracker_missing(flag)
            if problem:
                raise FieldError(flag, problem)
        return self

    @field_validator("stop_on")
    @classmethod
    def _known_alarms(cls, names: list[str]) -> list[str]:
        from rlvr.run.alarms import Alarms

        unknown = [name for name in names if name not in Alarms.NAMES]
        if unknown:
            raise ValueError(f"unknown alarm(s) {', '.join(unknown)}; valid: {', '.join(Alarms.NAMES)}")
        return names


class CheckpointConfig(Section):
    every: int = Field(50, ge=0, description="save every N steps (0 = only at the end)")
    keep: int = Field(1, ge=1, description="most recent checkpoints kept")
    at_end: bool = Field(True, description="save a resumable checkpoint after the last step (false: only the "
                         "every-N ones)")
    final_model: bool = Field(True, description="save the trained model to final/ (a model folder for `rlvr eval` "
                              "and later stages) at the end of the run")


DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?|mps)$")


class RecipeConfig(Section):
    """The whole config of a recipe (``rlvr train``, ``sft``, ...): which of its features combine is checked
    here, once, against the table of :mod:`rlvr.config.compatibility` (before any work)."""

    @model_validator(mode="after")
    def _features_combine(self) -> "RecipeConfig":
        from rlvr.config.compatibility import check_compatibility

        check_compatibility(self, "load")
        return self


class ProcessConfig(Section):
    """What every recipe's ``train:`` section holds about the process itself (seed, device, CPU threads):
    declared and checked here once; each recipe's section adds its own fields."""

    seed: int = Field(0, description="seed of the data order, sampling and initialisation (each rank adds its rank)")
    device: str = Field("auto", description="cpu, cuda, cuda:N, or auto (cuda when there is one)")
    threads: Union[PositiveInt, Literal["auto"], None] = Field(
        None, description="torch CPU threads: a number, 'auto' (the cores other work leaves free, measured at start), "
        "or null = torch's default")
    strategy: Literal["ddp", "fsdp2"] = Field(
        "ddp", description="how ranks under torchrun hold the model: ddp = each a whole copy with its optimizer state "
        "(gradients summed once per step); fsdp2 = each 1/N of every parameter, gradient and optimizer state "
        "(torch's fully_shard per decoder layer; docs/scaling.md). One process: the same either way")
    cpu_offload: bool = Field(False, description="with strategy fsdp2 on CUDA: keep the shards and the optimizer "
                              "state in CPU memory (slower steps, less GPU memory)")

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        if not DEVICE.match(value):
            raise ValueError(f"{value!r} is not a device; use cpu, cuda, cuda:N or auto")
        return value
