"""Mixed precision: float32 master weights that train, low-precision (bfloat16) compute.

``model.dtype: bfloat16`` names the *compute* dtype. Weights an optimizer updates stay float32: an
AdamW step of ``lr * m / sqrt(v)`` at lr 1e-6 is ~1e-6 per weight, and a bfloat16 weight near 0.02 moves
only in steps of ~1e-4 (8 bits of mantissa), so bf16 weights stepped in place mostly do not move at all
(measured: a bf16 update 0.13x the float32 one, 1.9% of weights moving). The standard recipe keeps the
weights, gradients and optimizer state in float32 and runs the forward in bf16:

  * a model whose full weights train, on one process or under ``ddp``: float32 weights and the passes
    under ``torch.autocast`` in the compute dtype (:func:`autocast`); the HF engine decodes from a
    bf16 copy the trainer pushes its weights into, as vLLM holds its own (``rlvr train``'s engine, and
    the greedy evaluations of ``sft`` and ``dpo``);
  * under FSDP2: float32 shards and FSDP2's ``MixedPrecisionPolicy`` (bf16 all-gathers, float32
    gradient reduction), :func:`rlvr.run.sharding.shard_model`;
  * LoRA: the frozen base in the compute dtype (nothing steps it) and the adapters float32 (peft keeps
    them so), no autocast needed.

float16 has bfloat16's 8 bits of mantissa and 5 bits of exponent: gradients below ~6e-8 flush to zero
and an Adam second moment of ~1e-8 squared underflows (measured: updates 43x too large). It needs loss
scaling, which rlvr does not do, so ``model.dtype`` refuses it (``rlvr.config.sections.ModelConfig``).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

_COMPUTE = "_rlvr_compute_dtype"  # the attribute :func:`set_compute_dtype` sets on a model


def weights_dtype(compute: str, *, trains_all_weights: bool) -> str:
    """The dtype to load a model's weights in: float32 for weights an optimizer steps (the master copy),
    else the compute dtype (a LoRA base, a frozen reference)."""
    return "float32" if trains_all_weights else compute


def set_compute_dtype(model, dtype: torch.dtype) -> None:
    """Record ``dtype`` as the compute dtype of ``model``, whose weights are float32 master weights: its
    passes run under :func:`autocast`, its engine serves ``dtype``. Nothing is recorded where ``dtype``
    is the weights' own."""
    if dtype != next(model.parameters()).dtype:
        setattr(model, _COMPUTE, dtype)


def compute_dtype(model) -> torch.dtype:
    """The dtype ``model`` computes in: the recorded one (:func:`set_compute_dtype`), else its weights'
    (a LoRA model's: its base's, not its float32 adapters')."""
    recorded = _recorded(model)
    if recorded is not None:
        return recorded
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, "dtype", None) or next(base.parameters()).dtype


@contextlib.contextmanager
def autocast(model) -> Iterator[None]:
    """The passes of ``model`` in its recorded compute dtype (float32 master weights trained without
    FSDP2); nothing otherwise (FSDP2 casts the weights it gathers itself, a LoRA base is already in it)."""
    from rlvr.run.sharding import is_sharded

    dtype = _recorded(model)
    if dtype is None or is_sharded(model):
        yield
        return
    with torch.autocast(device_type=next(model.parameters()).device.type, dtype=dtype):
        yield


def _recorded(model) -> torch.dtype | None:
    for candidate in (model, model.get_base_model() if hasattr(model, "get_base_model") else None):
        if candidate is not None and hasattr(candidate, _COMPUTE):
            return getattr(candidate, _COMPUTE)
    return None
