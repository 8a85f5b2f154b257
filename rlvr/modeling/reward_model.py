"""A Bradley-Terry reward model: its two heads, loading it to train, saving it, and scoring with it.

    P(chosen > rejected | prompt) = sigmoid(r(x, y_w) - r(x, y_l))

Two heads (config ``head``) give the scalar r(x, y):

* ``score`` (default): the causal-LM folder loaded as ``AutoModelForSequenceClassification`` with
  ``num_labels=1``: a new linear layer on the hidden state of the sequence's last real token (the
  EOS after the completion; transformers finds it as the last token that is not ``pad_token_id``,
  which is set from the tokenizer). With LoRA the head is trained in full (peft ``modules_to_save``).
  ``final/`` loads with ``AutoModelForSequenceClassification.from_pretrained``.
* ``logprob``: the causal LM itself, r(x, y) = sum_t log p(y_t | x, y_<t) over the completion and its
  EOS. No new weights: the model starts as a ranker already (it prefers what it would generate) and
  Bradley-Terry training sharpens it. ``final/`` is a causal-LM folder.

``final/reward_model.json`` names the head, so :class:`RewardModel` scores either kind the same way.
The recipe that trains one is ``rlvr/recipes/train_rm.py`` (``rlvr train-rm``).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Callable, Sequence

import torch

from rlvr.modeling.logprobs import collate_completions, completion_logprobs
from rlvr.modeling.loading import check_model_folder, load_policy, load_tokenizer, resolve_dtype, save_final_model
from rlvr.modeling.precision import autocast
from rlvr.modeling.sharded_loading import (gather_dtype, load_into_shards, load_sharded, on_rank0, parameters_on_meta,
                                           saved_adapters_structure)

HEAD_FILE = "reward_model.json"

# ---------------------------------------------------------------------------------------------
# Scoring: (prompt ids, completion ids) -> r [N], one function per head
# ---------------------------------------------------------------------------------------------


def score_head_rewards(model, prompts: Sequence[list[int]], completions: Sequence[list[int]], pad_id: int) -> torch.Tensor:
    """Sequence-classification head: right-padded ``prompt + completion``; transformers reads the
    logit at the last token that is not padding.  -> [N] float32"""
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        attention[i, : len(s)] = 1
    device = next(model.parameters()).device
    with autocast(model):  # float32 master weights computing in model.dtype (rlvr/modeling/precision.py)
        return model(input_ids=ids.to(device), attention_mask=attention.to(device), use_cache=False).logits[:, 0].float()


def logprob_head_rewards(model, prompts: Sequence[list[int]], completions: Sequence[list[int]], pad_id: int) -> torch.Tensor:
    """Causal LM: sum of the completion tokens' log-probabilities (EOS included).  -> [N] float32"""
    ids, attention, mask = collate_completions(prompts, completions, pad_id)
    device = next(model.parameters()).device
    logp, _ = completion_logprobs(model, ids.to(device), attention.to(device), mask.shape[1])  # [N, T]
    return (logp * mask.to(device)).sum(dim=1)


HEADS: dict[str, Callable[..., torch.Tensor]] = {"score": score_head_rewards, "logprob": logprob_head_rewards}


class RewardModel:
    """A trained reward model (a ``rlvr train-rm`` run's ``final/``, or any one-label
    sequence-classification folder) that scores completions in batches of ``batch_size``:
    ``RewardModel(run / "final").score(prompt_ids_list, completion_ids_list)`` -> ``[N]`` rewards,
    with prompts encoded by :class:`rlvr.rollout.suites.PromptEncoder` and completions as generated
    (ending with EOS when the model stopped)."""

    def __init__(self, path: str | Path, device: str = "cpu", batch_size: int = 64, dtype: str = "float32"):
        folder = check_model_folder(path, "reward model")
        info = json.loads((folder / HEAD_FILE).read_text()) if (folder / HEAD_FILE).is_file() else {"head": "score"}
        self.head = info["head"]
        self.batch_size = batch_size
        self.tokenizer = tokenizer = load_tokenizer(folder)
        self.pad_id = tokenizer.pad_token_id
        if self.head == "logprob":
            self.model = load_policy(folder, dtype=dtype, device=device)
        else:
            from transformers import AutoModelForSequenceClassification

            self.model = AutoModelForSequenceClassification.from_pretrained(str(folder), dtype=resolve_dtype(dtype)).to(device)
            if self.model.config.pad_token_id is None:  # a folder from elsewhere: batches need it to find the last token
                self.model.config.pad_token_id = self.pad_id
        self.model.eval().requires_grad_(False)

    @torch.no_grad()
    def score(self, prompt_ids_list: Sequence[list[int]], completion_ids_list: Sequence[list[int]]) -> torch.Tensor:
        """r(x, y) for each (prompt ids, completion ids), completions ending with EOS as generated.  -> [N] on CPU"""
        out = [HEADS[self.head](self.model, prompt_ids_list[i : i + self.batch_size],
                                completion_ids_list[i : i + self.batch_size], self.pad_id).cpu()
               for i in range(0, len(prompt_ids_list), self.batch_size)]
        return torch.cat(out) if out else torch.zeros(0)


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------


def load_reward_backbone(config, tokenizer, device: str, adapter_or_weights: Path | None = None, *,
                         shard: bool = False, compute_dtype: str = "float32", offload: bool = False):
    """The trainable reward model of a ``RewardModelConfig``: the head's network over ``model.path``, LoRA or
    full. ``adapter_or_weights`` is a checkpoint's ``model/`` folder (resume).

    ``shard`` (``train.strategy: fsdp2``; every rank calls this): loaded straight into FSDP2 shards
    (:mod:`rlvr.modeling.sharded_loading`), all-gathered in ``compute_dtype`` (``offload``: shards on the
    CPU), so no rank's device holds the whole model; rank 0 loads it whole on its CPU as without ``shard``
    (a new score head's and new adapters' initialisation included), and every rank's shards hold exactly
    those weights."""
    lora = config.model.lora.model_dump() if config.model.lora is not None else None
    dtype, param_dtype = config.model.dtype, gather_dtype(compute_dtype)
    if config.head == "logprob":
        full = adapter_or_weights if adapter_or_weights is not None and lora is None else config.model.path
        options = dict(dtype=dtype, device=device, lora=lora, adapter_path=adapter_or_weights if lora else None,
                       gradient_checkpointing=config.model.gradient_checkpointing, forward=config.model.forward,
                       logits_chunk_mb=config.model.logits_chunk_mb)
        if shard:
            return load_sharded(full, **options, param_dtype=param_dtype, offload=offload)
        return load_policy(full, **options)
    source = check_model_folder(adapter_or_weights if adapter_or_weights is not None and lora is None
                                else config.model.path)
    adapter = adapter_or_weights if lora is not None else None
    pad_id = tokenizer.pad_token_id  # transformers scores the last non-pad token, and refuses batches without one
    if not shard:
        return _score_model(source, dtype=dtype, pad_id=pad_id, lora=lora, adapter=adapter,
                            gradient_checkpointing=config.model.gradient_checkpointing).to(device)
    whole = on_rank0(lambda: _score_model(source, dtype=dtype, pad_id=pad_id, lora=lora, adapter=adapter,
                                          gradient_checkpointing=False))
    structure = _score_model(source, dtype=dtype, pad_id=pad_id, lora=lora, adapter=adapter,
                             gradient_checkpointing=config.model.gradient_checkpointing, structure=True)
    return load_into_shards(structure, whole, device=device, param_dtype=param_dtype, offload=offload)


def _score_model(source: Path, *, dtype: str, pad_id: int, lora: dict | None, adapter: Path | None,
                 gradient_checkpointing: bool, structure: bool = False):
    """The ``score`` head's network: ``source`` as a one-label sequence classifier on the CPU, in train mode,
    LoRA-wrapped when ``lora`` (new adapters training the score layer in full, or those saved at ``adapter``).
    ``structure``: its modules only, parameters on the meta device (for :func:`load_into_shards`)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    with parameters_on_meta() if structure else contextlib.nullcontext():
        if structure:
            config = AutoConfig.from_pretrained(str(source), num_labels=1, pad_token_id=pad_id)
            model = AutoModelForSequenceClassification.from_config(config, dtype=resolve_dtype(dtype))
        else:
            model = AutoModelForSequenceClassification.from_pretrained(str(source), num_labels=1, pad_token_id=pad_id,
                                                                       dtype=resolve_dtype(dtype))
        if gradient_checkpointing:
            model.gradient_checkpointing_enable()
        if lora is not None:
            from peft import LoraConfig, PeftModel, get_peft_model

            if adapter is not None and structure:
                model = saved_adapters_structure(model, adapter)
            elif adapter is not None:
                model = PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
            else:
                model = get_peft_model(model, LoraConfig(
                    r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                    target_modules=lora["target_modules"], task_type="SEQ_CLS", modules_to_save=["score"]))
    return model.train()


def save_reward_model(model, tokenizer, out: Path, head: str) -> Path:
    """``out``: a standalone folder (LoRA merged; adapters also under ``adapter/``) + ``reward_model.json``.
    A sharded model is gathered into a whole copy on rank 0 first (every rank calls this)."""
    return save_final_model(model, tokenizer, out, extra_json={HEAD_FILE: {"head": head}})


