"""Loading and saving models: the policy (full or LoRA, decided here once), the reference, a run's
final model, and the policy's weights as an inference engine takes them.

The reference policy is what the KL term compares against:
  * LoRA policy: the same network with its adapters switched off (no second copy in memory);
  * full fine-tuning: a frozen copy of the original weights, loaded only when beta > 0 (no copy,
    no pass otherwise).
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import Any, Iterator

import torch

from rlvr.modeling.forward_choice import choose_forward
from rlvr.modeling.logprobs import DEFAULT_LOGITS_CHUNK_MB, set_logits_chunk
from rlvr.modeling.precision import compute_dtype, set_compute_dtype, weights_dtype
from rlvr.run.sharded_checkpoint import SHARDED, has_sharded_part, load_sharded_model
from rlvr.run.sharding import is_sharded, shard_model, whole_copy, whole_zeros
from rlvr.verifiers.errors import InvalidValueError, MissingFileError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; valid: {', '.join(DTYPES)}") from None


#: The files transformers reads a model's weights from (one of them must be there).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
SAVED_BY = "a model folder is what save_pretrained writes, e.g. a run's final/ or checkpoints/step_N/model/"


#: The files of a hub model repo a run reads (not its ONNX, GGUF or other exports).
HUB_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken")


def is_hub_id(path: str) -> bool:
    """Whether ``path`` reads as a hub repo id, ``owner/name`` (not a relative or absolute path)."""
    import re

    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", path) is not None and not Path(path).exists()


def hub_snapshot(repo_id: str, field: str = "model.path") -> Path:
    """The local folder of hub model ``repo_id``: huggingface_hub's cache, downloaded on first use (its
    own progress bars; ``HF_HOME`` moves the cache, ``HF_HUB_OFFLINE=1`` uses it without the network).
    A failure (no network, no such repo, a gated one without a token) is one line naming the field."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, allow_patterns=list(HUB_FILES)))
    except Exception as exc:  # noqa: BLE001  (offline, unknown, gated, ...: all reported the same way)
        reason = {"LocalEntryNotFoundError": "the hub is unreachable and the model is not in the hub cache",
                  "RepositoryNotFoundError": "the hub has no such repo, or it is private (log in: `hf auth login`)",
                  "GatedRepoError": "a gated repo: accept its terms on the hub and log in (`hf auth login`)",
                  }.get(type(exc).__name__, f"{type(exc).__name__}: {str(exc).strip()[:160]}")
        raise MissingFileError(
            f"{field}: no model at {repo_id}: not a folder, and it looks like a hub id that could not be downloaded "
            f"({reason}); on a machine without the hub, download it elsewhere (`hf download {repo_id} "
            f"--local-dir DIR`) and set {field} to DIR") from None


def check_model_folder(path: str | Path, field: str = "model.path", *, contents: bool = False) -> Path:
    """``path`` as a folder that holds a Hugging Face model, or a one-line :class:`UserError` at once.

    A hub repo id (``HuggingFaceTB/SmolLM2-135M-Instruct``) that is not a local folder is downloaded
    into the hub cache once (:func:`hub_snapshot`) and that folder returned; an id the hub cannot
    provide fails at once, in one line, instead of transformers' ~50 s of retries and a traceback. With
    ``contents`` (every loader here: the tokenizer, the config, the weights) a ``config.json`` that is
    not JSON or names no architecture transformers knows, and a folder without weights (or with a Git
    LFS pointer in their place), are named too, before anything loads, instead of as a traceback from
    deep inside transformers.
    """
    folder = Path(path).expanduser()
    if not folder.is_dir() and is_hub_id(str(path)):
        folder = hub_snapshot(str(path), field)
    if not folder.is_dir():
        raise MissingFileError(f"{field}: no model at {path}: not a folder")
    if not (folder / "config.json").is_file():
        raise MissingFileError(f"{field}: no model at {path}: the folder has no config.json ({SAVED_BY})")
    problem = (_config_problem(folder / "config.json") or _weights_problem(folder)) if contents else None
    if problem:
        raise InvalidValueError(f"{field}: {path} is not a usable model folder: {problem}")
    return folder


def _config_problem(config: Path) -> str | None:
    """What is wrong with a model's ``config.json`` (None: transformers can read it)."""
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f" (line {exc.lineno}: {exc.msg})" if isinstance(exc, json.JSONDecodeError) else ""
        return f"config.json is not valid JSON{where}"
    if not isinstance(data, dict):
        return "config.json does not hold a JSON object"
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = data.get("model_type")
    if not model_type:
        return "config.json names no model_type (e.g. \"llama\"), so transformers cannot tell the architecture"
    if model_type not in CONFIG_MAPPING_NAMES:
        import transformers

        return (f"config.json names model_type {model_type!r}, which transformers {transformers.__version__} does not "
                "know (a typo, a newer architecture: upgrade transformers, or a custom one, which rlvr does not load)")
    return None


def _weights_problem(folder: Path) -> str | None:
    """What is wrong with a model folder's weights (None: a weights file is there)."""
    present = [folder / name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not present:
        return f"it holds no weights (none of {', '.join(WEIGHT_FILES)}; {SAVED_BY})"
    for file in present:
        with file.open("rb") as f:
            head = f.read(64)
        if head.startswith(b"version https://git-lfs"):
            return (f"{file.name} is a Git LFS pointer, not the weights: fetch them (`git lfs pull` in the model's "
                    "repository) or download the model again")
        if file.name.endswith(".index.json"):
            try:
                shards = set(json.loads(file.read_text(encoding="utf-8"))["weight_map"].values())
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
                return f"{file.name} is not a weight index (JSON with a weight_map)"
            missing = sorted(name for name in shards if not (folder / name).is_file())
            if missing:
                return f"{file.name} lists {len(missing)} weight file(s) the folder lacks, e.g. {missing[0]}"
    return None


def context_length(path: str | Path) -> int | None:
    """The longest sequence the model at ``path`` takes (prompt + completion), from its config;
    None when the config does not say."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(check_model_folder(path, contents=True)))
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def stop_token_ids(path: str | Path, tokenizer) -> list[int]:
    """The ids that end a completion of the model at ``path`` (its generation config's, plus the
    tokenizer's EOS), read before the model is loaded: :func:`rlvr.engines.base.eos_token_ids`."""
    from types import SimpleNamespace

    from transformers import GenerationConfig

    from rlvr.engines.base import eos_token_ids

    try:
        config = GenerationConfig.from_pretrained(str(check_model_folder(path, contents=True)))
    except OSError:  # no generation_config.json: the tokenizer's EOS alone
        config = None
    return eos_token_ids(SimpleNamespace(generation_config=config), tokenizer)


def load_tokenizer(path: str | Path, field: str = "model.path"):
    """The model's tokenizer, with a pad token (falling back to EOS) and left padding for generation; a
    folder whose tokenizer files are missing or broken is a one-line error naming it."""
    from transformers import AutoTokenizer

    folder = check_model_folder(path, field, contents=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        found = [p.name for p in folder.iterdir() if p.name.startswith(("tokenizer", "vocab", "merges", "spiece"))]
        what = f"its tokenizer cannot be loaded: {' '.join(str(exc).split())[:300]}" if found else \
            "it holds no tokenizer (tokenizer.json, tokenizer.model or vocab files, as save_pretrained writes them)"
        raise InvalidValueError(f"{field}: {path} is not a usable model folder: {what}") from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_policy(
    path: str | Path,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    lora: dict[str, Any] | None = None,
    gradient_checkpointing: bool = False,
    adapter_path: str | Path | None = None,
    forward: str = "auto",
    logits_chunk_mb: float = DEFAULT_LOGITS_CHUNK_MB,
):
    """The trainable policy: all weights, or LoRA adapters when ``lora`` is given.

    ``lora`` holds peft ``LoraConfig`` fields (``r``, ``alpha``, ``dropout``, ``target_modules``).
    ``adapter_path`` reloads saved adapters (resume). ``forward="hf"`` keeps every pass on the model's
    own forward (``model.forward``; see :mod:`rlvr.modeling.fast_forward`); ``logits_chunk_mb`` bounds
    the logits its log-prob passes hold at once (``model.logits_chunk_mb``; see :mod:`rlvr.modeling.logprobs`).
    """
    from transformers import AutoModelForCausalLM

    from safetensors import SafetensorError

    folder = check_model_folder(path, contents=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=resolve_dtype(dtype))
    except (OSError, ValueError, SafetensorError) as exc:  # e.g. a truncated weights file (an interrupted download)
        reason = " ".join(str(exc).split())[:300]
        raise InvalidValueError(f"model folder {path}: its weights cannot be loaded ({reason}); save or download "
                                "the model again") from exc
    model = model.to(device)
    _choose_passes(model, forward, logits_chunk_mb)
    return _training_form(model, lora=lora, gradient_checkpointing=gradient_checkpointing, adapter_path=adapter_path)


def _training_form(model, *, lora: dict[str, Any] | None, gradient_checkpointing: bool,
                   adapter_path: str | Path | None):
    """``model`` in train mode, checkpointing its activations if asked, wrapped with LoRA adapters when
    ``lora`` is given (new ones, or those saved at ``adapter_path``)."""
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if lora is not None:
        from peft import LoraConfig, PeftModel, get_peft_model

        if adapter_path is not None:
            model = PeftModel.from_pretrained(model, str(adapter_path), is_trainable=True)
        else:
            config = LoraConfig(
                r=lora["r"],
                lora_alpha=lora["alpha"],
                lora_dropout=lora["dropout"],
                target_modules=lora["target_modules"],
                task_type="CAUSAL_LM",
            )
            model = get_peft_model(model, config)
    model.train()
    return model


def load_run_policy(model_config, device, checkpoint: Path | None, *, shard: bool = False, offload: bool = False):
    """The policy of an RL run (``model_config`` is a ``ModelConfig``): from ``model.path``, or from a
    checkpoint's ``model/`` when resuming (for LoRA: the base from ``model.path``, the adapters from
    the checkpoint).

    ``model.dtype`` is the compute dtype; weights that train are float32 (:mod:`rlvr.modeling.precision`):
    all weights of a full fine-tune, under autocast on one process or ``ddp``. ``shard``: FSDP2-shard it
    over the ranks (``train.strategy: fsdp2``; every rank calls this), float32 shards with bf16
    all-gathers and float32 gradient reduction; a checkpoint's weights come from its shards
    (``sharded/policy``)."""
    lora = model_config.lora.model_dump() if model_config.lora is not None else None
    sharded_checkpoint = checkpoint is not None and has_sharded_part(checkpoint)
    if checkpoint is None or sharded_checkpoint:
        path, adapter = model_config.path, None
    elif lora is None:
        path, adapter = Path(checkpoint) / "model", None
    else:
        path, adapter = model_config.path, Path(checkpoint) / "model"
    from rlvr.modeling.sharded_loading import load_sharded

    load = load_sharded if shard else load_policy  # sharded: never whole on the device (modeling/sharded_loading.py)
    policy = load(path, dtype=weights_dtype(model_config.dtype, trains_all_weights=shard or lora is None),
                  device=str(device), lora=lora, gradient_checkpointing=model_config.gradient_checkpointing,
                  adapter_path=adapter, forward=model_config.forward, logits_chunk_mb=model_config.logits_chunk_mb,
                  **({"param_dtype": resolve_dtype(model_config.dtype), "offload": offload} if shard else {}))
    return shard_for_run(policy, model_config.dtype, checkpoint, shard=shard, offload=offload,
                         master_weights=lora is None)


def shard_for_run(model, dtype: str, checkpoint: Path | None, *, shard: bool, offload: bool = False,
                  name: str = "policy", layers=None, master_weights: bool = False):
    """``model`` (float32 weights when ``shard``) FSDP2-sharded over the ranks with ``dtype`` as the compute
    dtype (``layers``: its units, see :func:`rlvr.run.sharding.shard_model`), its weights read from a
    sharded checkpoint's ``sharded/<name>`` when resuming from one; unchanged when not ``shard``. Every
    rank calls this. ``master_weights``: ``model`` holds float32 weights that all train, whose passes run
    under autocast in ``dtype`` (:mod:`rlvr.modeling.precision`; a LoRA base is already in ``dtype``)."""
    compute = resolve_dtype(dtype)
    if shard and not is_sharded(model):  # (load_sharded loads a model into its shards)
        shard_model(model, param_dtype=None if compute == torch.float32 else compute, offload=offload, layers=layers)
    if shard or master_weights:  # what its passes compute in and its engine serves
        set_compute_dtype(model, compute)
    if checkpoint is not None and has_sharded_part(checkpoint):
        load_sharded_model(model, Path(checkpoint) / SHARDED / name)
    return model


def generation_copy(policy, dtype: str, device):
    """A whole copy of a policy for the HF engine to generate from, on this rank, in ``dtype``: the base
    architecture (a LoRA policy's adapters are merged into the weights the engine is sent), its weights
    zero until the first push (``weight_sync: merged``). A sharded policy needs one (the HF engine cannot
    decode from shards; it costs one whole model per rank, which the sharding saves during the update
    but not during generation); so does a float32 master policy computing in bf16 (decoding from the
    float32 weights would read twice the bytes per token: the copy costs half a float32 model)."""
    whole = whole_zeros(policy, device=device, dtype=resolve_dtype(dtype))
    if is_lora(whole):
        whole = whole.merge_and_unload()
    return whole.eval().requires_grad_(False)


def needs_engine_copy(policy) -> bool:
    """Whether the HF engine decodes from a :func:`generation_copy` of ``policy`` rather than the policy
    itself: a sharded policy, or float32 master weights computing in a lower dtype."""
    return is_sharded(policy) or compute_dtype(policy) != next(policy.parameters()).dtype


def _choose_passes(model, forward: str, logits_chunk_mb: float) -> None:
    choose_forward(model, forward)
    set_logits_chunk(model, logits_chunk_mb)


def is_lora(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


class Reference:
    """Log-probabilities under the reference policy, without a second model when LoRA allows it.

    A full-fine-tuning reference is loaded from the *original* model folder, never copied from the
    live policy: a resumed run's policy has already moved, and a copy of it would be the wrong anchor.
    """

    def __init__(self, policy, *, needed: bool, path: str | Path, dtype: str = "float32", device: str = "cpu",
                 forward: str = "auto", logits_chunk_mb: float = DEFAULT_LOGITS_CHUNK_MB):
        self.needed = needed
        self._frozen = None
        if needed and not is_lora(policy) and is_sharded(policy):  # each rank holds 1/N of the reference too
            from rlvr.modeling.sharded_loading import load_sharded

            self._frozen = load_sharded(path, dtype=dtype, device=device, forward=forward,
                                        logits_chunk_mb=logits_chunk_mb, frozen=True)
        elif needed and not is_lora(policy):
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=resolve_dtype(dtype)).to(device)
            _choose_passes(model, forward, logits_chunk_mb)
            self._frozen = model.eval().requires_grad_(False)
        self._policy = policy

    @contextlib.contextmanager
    def model(self) -> Iterator[Any]:
        """The network that computes reference log-probabilities, valid inside the ``with``."""
        if not self.needed:
            raise RuntimeError("no reference model: beta is 0")
        if self._frozen is not None:
            yield self._frozen
        else:
            with self._policy.disable_adapter():
                yield self._policy


def save_final_model(model, tokenizer, out: str | Path, *, extra_json: dict[str, dict] | None = None) -> Path:
    """Save a standalone Hugging Face folder any later path loads like a hub model. A LoRA policy
    is saved twice: its adapters under ``adapter/`` and a merged copy at the top (merged from a
    deep copy, so the live model keeps its adapters). A sharded model is gathered into a whole copy on
    rank 0 first: every rank must call this, and rank 0 alone writes. ``extra_json``: files written
    beside the weights (``{"reward_model.json": {"head": "score"}}``)."""
    out = Path(out)
    if is_sharded(model):  # gathered to rank 0 (every rank calls this); the other ranks write nothing
        model = whole_copy(model)
        if model is None:
            return out
    if is_lora(model):
        model.save_pretrained(out / "adapter")
        copy.deepcopy(model).merge_and_unload().save_pretrained(out)
    else:
        model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for name, content in (extra_json or {}).items():
        (out / name).write_text(json.dumps(content))
    return out


def iter_inference_weights(policy, *, lora: str = "merge") -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's weights as ``(name, tensor)`` pairs for an inference engine, one at a time.

    Names are those of the base architecture's own checkpoint (``model.layers.0.mlp.up_proj.weight``):
    peft prefixes (``base_model.model.``, ``.base_layer``) are stripped and ``lm_head.weight`` is
    included even when tied to the embeddings (an engine that repacks the output layer only refreshes
    it when it is sent). Sharded parameters (DTensor) are gathered. Nothing is copied except a LoRA
    layer's merged weight, made one module at a time.

    ``lora`` decides what a LoRA policy yields: ``"merge"`` the full weights with each adapter's
    delta added (``W + scale * B @ A``; the live model is not changed), ``"adapter"`` only the adapter
    tensors, named as peft saves them (for an engine that serves the adapter itself). A policy
    without LoRA always yields its full weights.
    """
    if lora not in ("merge", "adapter"):
        raise ValueError(f"lora must be 'merge' or 'adapter', got {lora!r}")
    if is_lora(policy) and lora == "adapter":
        from peft import get_peft_model_state_dict

        for name, tensor in get_peft_model_state_dict(policy).items():
            yield name, _gathered(tensor)
        return
    base = policy.get_base_model() if is_lora(policy) else policy
    lora_layers = _lora_layers(policy) if is_lora(policy) else {}
    dtype = compute_dtype(policy)  # float32 master weights are sent as the engine serves them
    seen = set()
    for name, tensor in base.state_dict(keep_vars=True).items():
        if ".lora_" in name or "lora_magnitude_vector" in name:
            continue
        name = name.replace(".base_layer.", ".")
        seen.add(name)
        yield name, _merged_weight(lora_layers[name]).to(dtype) if name in lora_layers else _gathered(tensor, dtype)
    output = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if "lm_head.weight" not in seen and output is not None and getattr(output, "weight", None) is not None:
        yield "lm_head.weight", _gathered(output.weight, dtype)


def _gathered(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The whole of ``tensor`` (a DTensor shard is all-gathered), cast to ``dtype`` first (a float32 shard
    gathers in bf16: half the traffic)."""
    tensor = tensor.detach()
    if dtype is not None and tensor.is_floating_point():
        tensor = tensor.to(dtype)
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor  # a DTensor shard -> the whole


def _lora_layers(policy) -> dict[str, Any]:
    """``{base-architecture weight name: LoRA layer}`` for every unmerged LoRA layer."""
    from peft.tuners.lora import LoraLayer

    prefix = "base_model.model."
    layers = {}
    for module_name, module in policy.named_modules():
        if isinstance(module, LoraLayer) and not getattr(module, "merged", False):
            name = module_name[len(prefix):] if module_name.startswith(prefix) else module_name
            layers[f"{name}.weight"] = module
    return layers


@torch.no_grad()
def _merged_weight(layer) -> torch.Tensor:
    """A LoRA layer's base weight plus the delta of each active adapter (a new tensor)."""
    active = [a for a in layer.active_adapters if a in layer.lora_A]
    if any(layer.use_dora.get(a, False) for a in active):
        raise ValueError("DoRA adapters cannot be merged for an engine; use plain LoRA (model.lora)")
    weight = _gathered(layer.get_base_layer().weight)
    for adapter in active:
        weight = weight + _gathered(layer.get_delta_weight(adapter)).to(weight.dtype)  # sharded A, B: a DTensor
    return weight


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]
