"""FSDP2 sharding of a model across the ranks of a run (``torch.distributed.fsdp.fully_shard``).

Each decoder layer is one unit (its parameters are all-gathered just before its forward and freed
after, its gradients reduce-scattered in the backward), and the root holds the rest (embeddings, the
final norm, the output layer). Every rank keeps 1/N of each parameter, of its gradient and of the
optimizer state built over the sharded parameters.

Gradients are **summed** over ranks, not averaged (``set_gradient_divide_factor(1.0)``): rlvr's
losses are each rank's numerator over the whole batch's denominators (``update.global_counts``),
so the sum is the gradient of the whole batch's loss, exactly as ``Distributed.sum_gradients``
makes it for ranks holding whole copies.

The output layer can be used outside the model's forward (``rlvr.modeling.logprobs`` computes
log-probs a chunk at a time from the final hidden states): the root's forward still runs (the
output layer swapped for an identity inside it), so the root's parameters are gathered, stay
gathered through the backward (FSDP2 does not reshard the root after its forward) and have their
gradients reduced with the rest.
"""

from __future__ import annotations

import torch


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder's list of layers under a causal LM (through a peft wrapper)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(base.get_decoder(), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"cannot find the decoder layers of {type(base).__name__} to shard (no `layers` list)")
    return layers


def shard_model(model, *, param_dtype: torch.dtype | None = None, offload: bool = False):
    """Shard ``model`` in place with FSDP2 over the default process group (one unit per decoder layer,
    the root for the rest) and return it. ``param_dtype`` all-gathers parameters in that dtype for
    compute (bf16 on a GPU) while the shards, gradient reduction and optimizer stay float32;
    ``offload`` keeps the shards and optimizer state in CPU memory."""
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

    options = {}
    if param_dtype is not None:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    if offload:
        options["offload_policy"] = CPUOffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, **options)
    fully_shard(model, **options)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # losses are normalised by global counts: gradients add
    return model


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)
