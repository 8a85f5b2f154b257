"""Loading a model straight into FSDP2 shards: no rank ever holds the whole model on its device.

Loading the whole model on every GPU and sharding it afterwards makes the peak memory of a rank the
whole float32 model (a 32B policy: ~128 GB, more than an 80 GB GPU holds before training starts). Here:

1. every rank builds the model's *structure* with its parameters on the meta device (no memory) and
   its buffers real (rotary tables are computed at construction and are not in a checkpoint);
2. every rank shards it (FSDP2 on meta parameters) and allocates only its own shards on the device;
3. rank 0 alone loads the weights from the folder, into host memory, and
   ``set_model_state_dict(..., broadcast_from_rank0=True)`` sends each tensor in turn, every rank keeping
   its shard of it: a rank's device holds its shards plus one whole tensor at a time.

Rank 0's host memory holds one whole model (host memory is the plentiful kind on a GPU node).

Steps 1 to 3 are :func:`load_into_shards`, for any model: it takes the structure (built inside
:func:`parameters_on_meta`) and rank 0's whole copy, loaded the ordinary way, so a sharded load holds
exactly the weights of the unsharded one (a new head's or new LoRA adapters' random initialisation
included: rank 0's is the one every rank gets). Its users: the policy and the reference
(:func:`load_sharded`), PPO's critic (:func:`rlvr.modeling.value_model.build_critic`) and the reward model
of ``rlvr train-rm`` (:func:`rlvr.modeling.reward_model.load_reward_backbone`).

The policy's load-time decisions of :func:`rlvr.modeling.loading.load_policy` (which forward runs, the
logits chunk, whether the logits are the output layer's: attributes named ``_rlvr_...`` on the model) are
made once, on rank 0's copy, and set on every rank's model, so every rank runs the same passes.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from rlvr.run.sharding import shard_model

_DECISIONS = "_rlvr_"  # the prefix of the attributes load_policy's decisions set on a model


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside register their parameters on the meta device (no memory, no initialisation
    cost) and keep their buffers real."""
    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def on_rank0(load: Callable[[], Any]) -> Any:
    """``load()`` on rank 0 of the default process group (the whole model, into its host memory), None on
    the other ranks."""
    return load() if torch.distributed.get_rank() == 0 else None


def load_into_shards(structure: torch.nn.Module, whole: torch.nn.Module | None, *, device,
                     param_dtype: torch.dtype | None = None, offload: bool = False,
                     layers: torch.nn.ModuleList | None = None) -> torch.nn.Module:
    """``structure`` (parameters on the meta device, buffers real, in its training form: mode, activation
    checkpointing, LoRA wrapping) FSDP2-sharded over the ranks of the default process group, each rank's
    shards allocated on ``device`` (the CPU with ``offload``) and filled from ``whole``, the same model
    loaded whole on rank 0's CPU (None on the other ranks); every rank calls this. ``param_dtype``,
    ``offload`` and ``layers``: those of :func:`rlvr.run.sharding.shard_model`."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    buffers = {name: buffer.detach().clone() for name, buffer in structure.named_buffers()}
    shard_model(structure, param_dtype=param_dtype, offload=offload, layers=layers)
    structure.to_empty(device="cpu" if offload else device)  # this rank's shards only
    with torch.no_grad():
        for name, buffer in structure.named_buffers():
            buffer.copy_(buffers[name])
    set_model_state_dict(structure, whole.state_dict() if whole is not None else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    return structure


def gather_dtype(compute: str) -> torch.dtype | None:
    """The dtype FSDP2 all-gathers a float32-sharded model's parameters in to compute in ``compute`` (a
    ``model.dtype`` name): None for float32, nothing to cast (as :func:`rlvr.modeling.loading.shard_for_run`
    shards a model)."""
    from rlvr.modeling.loading import resolve_dtype

    dtype = resolve_dtype(compute)
    return None if dtype == torch.float32 else dtype


def saved_adapters_structure(model, adapter_path: str | Path):
    """``model`` wrapped with the LoRA adapters saved at ``adapter_path`` (their shapes and targets; the
    values come from rank 0), trainable as ``PeftModel.from_pretrained(..., is_trainable=True)`` makes
    them (a saved config says ``inference_mode: true``, which would freeze them)."""
    from peft import PeftConfig, get_peft_model

    config = PeftConfig.from_pretrained(str(adapter_path))
    config.inference_mode = False
    return get_peft_model(model, config)


def load_sharded(path: str | Path, *, dtype: str, device, lora: dict[str, Any] | None = None,
                 adapter_path: str | Path | None = None, gradient_checkpointing: bool = False, forward: str = "auto",
                 logits_chunk_mb: float | None = None, param_dtype: torch.dtype | None = None,
                 offload: bool = False, frozen: bool = False):
    """The causal LM at ``path`` (weights in ``dtype``; LoRA adapters when ``lora``) FSDP2-sharded over the
    ranks of the default process group, loaded as the module docstring says; every rank calls this.
    ``param_dtype`` / ``offload``: those of :func:`rlvr.run.sharding.shard_model`; ``frozen``: a
    reference (eval mode, no gradients)."""
    from rlvr.modeling.loading import DEFAULT_LOGITS_CHUNK_MB, load_policy

    chunk = DEFAULT_LOGITS_CHUNK_MB if logits_chunk_mb is None else logits_chunk_mb
    source = on_rank0(lambda: load_policy(path, dtype=dtype, device="cpu", lora=lora, adapter_path=adapter_path,
                                          forward=forward, logits_chunk_mb=chunk))
    box = [_decisions(source) if source is not None else None]
    torch.distributed.broadcast_object_list(box, src=0)
    model = _structure(path, dtype=dtype, lora=lora, adapter_path=adapter_path)
    for name, value in box[0].items():
        setattr(_base(model), name, value)
    if gradient_checkpointing:
        _base(model).gradient_checkpointing_enable()
        _base(model).config.use_cache = False
    model = model.eval().requires_grad_(False) if frozen else model.train()
    return load_into_shards(model, source, device=device, param_dtype=param_dtype, offload=offload)


def _structure(path: str | Path, *, dtype: str, lora: dict[str, Any] | None, adapter_path: str | Path | None):
    """The causal LM's modules with meta parameters and real buffers (LoRA-wrapped like the source)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlvr.modeling.loading import _training_form, resolve_dtype

    config = AutoConfig.from_pretrained(str(path))
    with parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=resolve_dtype(dtype))
        if lora is not None and adapter_path is not None:  # the saved adapters' shapes; rank 0 sends their values
            return saved_adapters_structure(model, adapter_path)
        return _training_form(model, lora=lora, gradient_checkpointing=False, adapter_path=None)


def _decisions(model) -> dict[str, Any]:
    """What :func:`rlvr.modeling.loading.load_policy` decided about ``model`` at load (its ``_rlvr_``
    attributes), to be set on the other ranks' models."""
    return {name: value for name, value in vars(_base(model)).items() if name.startswith(_DECISIONS)}


def _base(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model
