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
gradients reduced with the rest. A pass without a backward must reshard the root itself.

Every rank must make as many forwards (:func:`lockstep_passes`). Whole copies come from a blueprint
kept at sharding time (the structure, parameters on the meta device): :func:`whole_copy` gathers the
weights into one on rank 0 (the final model), :func:`whole_zeros` makes an empty one for weights
pushed one tensor at a time (the HF engine's copy).
"""

from __future__ import annotations

import copy
import warnings
import weakref

import torch

from rlvr.run.runtime import collective_device

#: An unsharded copy of each sharded model's structure, its parameters on the meta device (no memory)
#: and its buffers real (rotary tables are not in a state dict): what :func:`whole_copy` fills in.
_BLUEPRINTS: "weakref.WeakKeyDictionary[torch.nn.Module, torch.nn.Module]" = weakref.WeakKeyDictionary()


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder's list of layers under a transformers model with a head (causal LM, sequence
    classification; through a peft wrapper)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(getattr(base, "base_model", base), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"cannot find the decoder layers of {type(base).__name__} to shard (no `layers` list)")
    return layers


def shard_model(model, *, param_dtype: torch.dtype | None = None, offload: bool = False, layers=None):
    """Shard ``model`` in place with FSDP2 over the default process group (one unit per decoder layer,
    the root for the rest) and return it. ``param_dtype`` all-gathers parameters in that dtype for
    compute (bf16 on a GPU) while the shards, gradient reduction and optimizer stay float32;
    ``offload`` keeps the shards and optimizer state in CPU memory. ``layers``: the units, when they are
    not the decoder layers of a transformers model (PPO's critic: its body's)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

    # rlvr's log-prob passes run the root with its output layer swapped for an identity and slice the hidden
    # states it returns, never changing them in place: FSDP2's warning about views returned is moot there
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    _BLUEPRINTS[model] = _blueprint(model)
    options = {}
    if param_dtype is not None:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    if offload:
        options["offload_policy"] = CPUOffloadPolicy()
    for layer in layers if layers is not None else decoder_layers(model):
        fully_shard(layer, **options)
    fully_shard(model, **options)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # losses are normalised by global counts: gradients add
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM (float32 asks it)
    return model


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def lockstep_passes(model, count: int) -> int:
    """How many forward passes this rank makes over ``count`` micro-batches of its own: ``count``, or
    for a sharded ``model`` the most any rank has (FSDP2 gathers every layer in each forward, so every
    rank must make as many; a rank with fewer repeats a pass and discards it)."""
    if not is_sharded(model):
        return count
    most = torch.tensor([count], dtype=torch.float64, device=collective_device())
    torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
    return int(most.item())


def whole_copy(model):
    """An unsharded copy of a sharded ``model`` on rank 0's CPU (None on the other ranks), gathered
    one parameter at a time; every rank must call it. Its memory is one whole model on rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if torch.distributed.get_rank() != 0:
        return None
    whole = copy.deepcopy(_BLUEPRINTS[model])
    whole.load_state_dict(state, strict=True, assign=True)
    base = whole.get_base_model() if hasattr(whole, "get_base_model") else whole
    if hasattr(base, "tie_weights"):
        base.tie_weights()  # assign=True gave the tied output layer its own tensor
    return whole


def whole_zeros(model, *, device, dtype: torch.dtype):
    """An unsharded copy of ``model``'s structure (a sharded one's: its blueprint) with every weight zero,
    in ``dtype`` on ``device``: a whole model's memory on this rank, for weights pushed into it one at a
    time (the HF engine of a sharded run, or of float32 master weights, generates from it)."""
    whole = copy.deepcopy(_BLUEPRINTS[model] if model in _BLUEPRINTS else _blueprint(model))
    for module in whole.modules():
        for name, param in module._parameters.items():
            if param is not None:
                module._parameters[name] = torch.nn.Parameter(torch.zeros(param.shape, dtype=dtype, device=device),
                                                              requires_grad=False)
    whole.to(device)  # the buffers
    base = whole.get_base_model() if hasattr(whole, "get_base_model") else whole
    if hasattr(base, "tie_weights"):
        base.tie_weights()
    return whole


def _blueprint(model):
    """``model`` copied with every parameter on the meta device (nothing allocated) and its buffers real."""
    memo = {id(p): torch.nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
            for p in model.parameters()}
    return copy.deepcopy(model, memo)
