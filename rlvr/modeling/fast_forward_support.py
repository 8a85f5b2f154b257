"""Which models rlvr's own forward (:mod:`rlvr.modeling.fast_forward`) runs exactly, and the switch that
turns it off: :func:`supports` / :func:`unsupported_reason` read a model's architecture, its projections
(plain ``torch.nn.Linear`` or a vetted peft LoRA ``Linear``) and its training state; any model they
decline runs its own (transformers) forward instead. ``model.forward: hf`` in a run's config is
:func:`use_model_forward`.
"""

from __future__ import annotations

import contextlib

import torch

from rlvr.run.sharding import is_sharded

SUPPORTED_TYPES = ("llama", "mistral", "qwen2")
_OFF = "_rlvr_model_forward_only"  # the attribute use_model_forward sets on a module


def training_with_checkpointing(model) -> bool:
    """A model training with activation checkpointing: its forward keeps no KV cache."""
    if not model.training:
        return False
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):  # the new name, then the old one
        value = getattr(model, name, None)
        if value is not None:
            return bool(value)
    return False


def use_model_forward(model) -> None:
    """Make every pass over ``model`` use its own (transformers) forward (``model.forward: hf``)."""
    setattr(model, _OFF, True)


def supports(model) -> bool:
    """Whether :func:`encode_prompts` / :func:`forward_rows` can run ``model`` exactly."""
    return unsupported_reason(model) is None


def unsupported_reason(model) -> str | None:
    """Why rlvr's forward cannot run ``model`` (a transformers model, or a peft LoRA wrapper of one)
    exactly (None: it can)."""
    if getattr(model, _OFF, False):  # (a peft wrapper reads its base model's attributes too)
        return "model.forward: hf"
    from transformers import PreTrainedModel

    wrapper_reason = _peft_wrapper_reason(model)
    if wrapper_reason is not None:
        return wrapper_reason
    wrapped, model = model, transformers_model(model)
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if not isinstance(model, PreTrainedModel):
        return f"{type(model).__name__} is not a transformers model"
    if is_sharded(wrapped) or is_sharded(model):
        return "FSDP2-sharded parameters (its own forward reads whole weights)"
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_TYPES:
        return f"architecture {model_type!r} (rlvr's forward runs {', '.join(SUPPORTED_TYPES)})"
    if not all(hasattr(inner, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return "the decoder lacks embed_tokens, layers, norm or rotary_emb"
    if getattr(config, "hidden_act", None) != "silu" or getattr(config, "pretraining_tp", 1) != 1:
        return f"activation {getattr(config, 'hidden_act', None)!r} or tensor-parallel pretraining (SiLU, tp 1 only)"
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return f"sliding-window attention (window {config.sliding_window}): rlvr's forward attends to every earlier token"
    if model.training and getattr(config, "attention_dropout", 0.0):
        return "attention dropout while training"
    if training_with_checkpointing(model):
        return "gradient checkpointing while training (its forward keeps no cache)"
    if not hasattr(model, "lm_head") or type(model.lm_head) is not torch.nn.Linear:
        return "the output layer is not a plain Linear"
    lora_projections = set()
    for index, layer in enumerate(inner.layers):
        attn, mlp = layer.self_attn, layer.mlp
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            if type(proj) is torch.nn.Linear:
                continue
            if wrapped is model or not _is_lora_linear(proj):  # a quantised layer, a modules_to_save copy, ...
                return f"a projection (layer {index}) is a {type(proj).__name__}, not a plain or LoRA Linear"
            reason = _lora_projection_reason(proj)
            if reason is not None:
                return f"LoRA on a projection (layer {index}): {reason}"
            lora_projections.add(id(proj))
        if hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
            return "query/key norms in attention"
    if wrapped is not model:
        return _other_peft_module(model, lora_projections)
    return None


def transformers_model(model):
    """The transformers model under a peft wrapper (its layers are the wrapper's: a LoRA projection
    is the peft module, which rlvr's forward calls); the model itself without one."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _peft_wrapper_reason(model) -> str | None:
    """Why rlvr's forward cannot run a peft-wrapped ``model`` (None: it is not wrapped, or wraps LoRA
    adapters in a form :func:`unsupported_reason` goes on to check layer by layer)."""
    if not hasattr(model, "get_base_model"):
        return None
    from peft import PeftModel
    from peft.tuners.lora import LoraModel

    if not isinstance(model, PeftModel) or not isinstance(model.base_model, LoraModel):
        tuner = type(getattr(model, "base_model", model)).__name__
        return f"a peft {type(model).__name__} over {tuner} (rlvr's forward runs LoRA adapters only)"
    return None


def _is_lora_linear(proj) -> bool:
    """A peft LoRA ``Linear`` over a plain ``Linear`` (not a quantised one)."""
    from peft.tuners.lora import Linear as LoraLinear

    return type(proj) is LoraLinear and type(proj.base_layer) is torch.nn.Linear


def _lora_projection_reason(proj) -> str | None:
    """Why rlvr's forward cannot run the LoRA projection ``proj`` (:func:`_is_lora_linear`) by calling
    it (None: it can): its own forward must compute ``base(x) + scaling * B(A(x))`` for at most one
    active plain adapter, the same function of each token whatever else is in the pass."""
    if proj.disable_adapters or proj.merged:  # its forward is the base layer alone (its weights merged or not)
        return None
    active = [name for name in proj.active_adapters if name in proj.lora_A]
    if len(active) > 1:
        return f"{len(active)} active LoRA adapters ({', '.join(active)}); rlvr's forward runs one"
    for name in active:
        if name in proj.lora_variant or proj.use_dora.get(name, False):
            variant = type(proj.lora_variant[name]).__name__ if name in proj.lora_variant else "DoRA"
            return f"LoRA adapter {name!r} is a {variant} variant; rlvr's forward runs plain LoRA"
        if proj.lora_bias.get(name, False):
            return f"LoRA adapter {name!r} has a bias; rlvr's forward runs plain LoRA"
        dropout = proj.lora_dropout[name]
        if proj.training and isinstance(dropout, torch.nn.Dropout) and dropout.p > 0:
            return (f"LoRA dropout {dropout.p} while training (a prompt's dropout mask would be shared by its rows; "
                    f"set model.lora.dropout: 0)")
    return None


def _other_peft_module(model, lora_projections: set[int]) -> str | None:
    """A peft module of ``model`` other than the LoRA projections that rlvr's forward calls (a
    ``modules_to_save`` copy, trainable tokens, an adapter on the embeddings or the output layer),
    which rlvr's forward would read past: its reason, else None."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper

    for name, module in model.named_modules():
        if isinstance(module, (BaseTunerLayer, AuxiliaryTrainingWrapper)) and id(module) not in lora_projections:
            return f"a peft {type(module).__name__} at {name} (rlvr's forward runs LoRA on the attention and MLP projections only)"
    return None


@contextlib.contextmanager
def model_forward_only(model):
    """Inside the ``with``, every pass over ``model`` uses its own forward (as :func:`use_model_forward`)."""
    before = getattr(model, _OFF, None)
    setattr(model, _OFF, True)
    try:
        yield model
    finally:
        if before is None:
            delattr(model, _OFF)
        else:
            setattr(model, _OFF, before)
