"""Which forward a model's passes run, decided once at load and proven there.

Also at load, :func:`rlvr.modeling.logprobs.probe_output_head` measures whether the model's logits
are exactly its output layer over its decoder's states (no soft-cap or scale after it): its log-prob
passes then stop at those states and compute log-probs a chunk of tokens at a time.

``model.forward: auto`` runs rlvr's shared-prompt forward (:mod:`rlvr.modeling.fast_forward`) on the
architectures it computes exactly, and the model's own (transformers) forward on everything else,
for a stated reason. Before the fast forward is trusted, a **parity probe** runs both forwards on a
few rows (two prompts, one of them left-padded, two completions each) and compares their completion
logits: a wrong rotary convention, mask or head layout shows as a relative difference of ~1e-1 where
float rounding stays below ~1e-6 (float32) or ~1e-2 (bfloat16). A model that fails the probe falls
back to its own forward, with a warning, for the whole run: a wrong forward is a wrong gradient on
every step, silently, and the HF engine decodes through the same path, so nothing later would notice.

:func:`forward_note` says what was chosen and why; runs print it at start.
"""

from __future__ import annotations

import copy
import warnings

import torch

from rlvr.modeling import fast_forward
from rlvr.modeling.logprobs import completion_logits, probe_output_head

_NOTE = "_rlvr_forward_note"
CONFIG_TOLERANCE = 1e-8  # float64 on the config proxy
PROBE_TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 2e-2}


def choose_forward(model, forward: str) -> str:
    """Settle ``model``'s forward (``model.forward``: ``auto`` or ``hf``), probing the fast one before
    trusting it; returns (and records on the model) a one-line note of the choice. Probes the output
    layer too (:func:`rlvr.modeling.logprobs.probe_output_head`), whichever forward runs."""
    probe_output_head(model)
    if forward == "hf":
        fast_forward.use_model_forward(model)
        note = "the model's own (transformers) forward (model.forward: hf)"
    elif forward != "auto":
        raise ValueError(f"model.forward must be 'auto' or 'hf', got {forward!r}")
    elif (reason := fast_forward.unsupported_reason(model)) is not None:
        note = f"the model's own (transformers) forward: rlvr's does not run {reason}"
    else:
        probes = [("this config, float64", parity_probe(_config_proxy(model)), CONFIG_TOLERANCE),
                  ("the model", parity_probe(model), PROBE_TOLERANCE.get(_dtype(model), 5e-2))]
        failed = [(where, d, t) for where, d, t in probes if not d <= t]  # NaN fails too
        if failed:
            fast_forward.use_model_forward(model)
            where, difference, tolerance = failed[0]
            note = (f"the model's own (transformers) forward: rlvr's disagreed with it on the load-time probe of "
                    f"{where} (max relative logit difference {difference:.1e} > {tolerance:.0e}); please report "
                    f"the model's config")
            warnings.warn(note, stacklevel=2)
        else:
            note = (f"rlvr's shared-prompt forward (load-time probe: max relative logit difference "
                    f"{probes[1][1]:.1e}, {probes[0][1]:.1e} in float64)")
    setattr(model, _NOTE, note)
    return note


def forward_note(model) -> str:
    """The note :func:`choose_forward` recorded, brought up to date: a model wrapped since in a form
    rlvr's forward does not run (e.g. LoRA with dropout) or checkpointing its activations runs its own
    forward while training. (A LoRA wrapper over a model probed at load runs rlvr's forward: its
    adapters are computed by peft's own modules, see :mod:`rlvr.modeling.fast_forward`.)"""
    note = getattr(model, _NOTE, None)
    reason = fast_forward.unsupported_reason(model)
    if note is None or (reason is not None and note.startswith("rlvr's")):
        return f"the model's own (transformers) forward: rlvr's does not run {reason}" if reason else \
            "rlvr's shared-prompt forward (not probed)"
    return note


def parity_probe(model, completion: int = 6) -> float:
    """Max |fast - own| / max |own| over the scored completion logits of a few probe rows (``model``:
    a transformers model, or a peft LoRA wrapper of one, probed with its adapters)."""
    base = fast_forward.transformers_model(model)
    vocab, pad = base.config.vocab_size, base.config.pad_token_id or 0
    device = base.model.embed_tokens.weight.device
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, vocab, (2, 8), generator=generator)
    ids = torch.cat([prompts.repeat_interleave(2, 0), torch.randint(0, vocab, (4, completion), generator=generator)], 1)
    mask = torch.ones_like(ids)
    ids[:2, :3], mask[:2, :3] = pad, 0  # the first prompt left-padded
    mask[1, -2:] = 0  # a shorter completion
    ids, mask = ids.to(device), mask.to(device)
    training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            fast = completion_logits(model, ids, mask, completion)
            with fast_forward.model_forward_only(model):
                own = completion_logits(model, ids, mask, completion)
    finally:
        model.train(training)
    scored = mask[:, -completion:].bool()
    fast, own = fast[scored].double(), own[scored].double()
    return float((fast - own).abs().max() / own.abs().max().clamp(min=1e-12))


def _config_proxy(model):
    """A float64 model of ``model``'s architecture and attention config (heads, key/value heads, head
    size, rotary embedding and its scaling, biases, tied embeddings) with 2 layers, a small width and
    vocabulary, and random weights sharp enough that attention matters: float64 leaves ~1e-12 of
    rounding, so any difference in how the two forwards read the config shows. (The real model's
    own weights can hide one: a random-init model in bfloat16 spreads its attention so evenly that
    a wrong rotary convention moves its logits by less than bfloat16's rounding.) A peft wrapper's
    proxy is of its transformers model: its adapters run as peft's own modules in both forwards."""
    model = fast_forward.transformers_model(model)
    config = copy.deepcopy(model.config)
    config.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    config.num_hidden_layers, config.hidden_size, config.intermediate_size, config.vocab_size = 2, 32, 48, 64
    config.pad_token_id = 0
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:2]
    with torch.random.fork_rng(devices=[]):
        # the CPU generator alone: torch.manual_seed would also reseed every GPU's, which fork_rng(devices=[])
        # does not restore, and a CUDA run would then sample from seed 0 whatever train.seed says
        torch.random.default_generator.manual_seed(0)
        proxy = type(model)(config).double()
        with torch.no_grad():
            for parameter in proxy.parameters():
                parameter.mul_(3.0)
    return proxy.to(model.model.embed_tokens.weight.device)


def _dtype(model) -> torch.dtype:
    return fast_forward.transformers_model(model).model.embed_tokens.weight.dtype
