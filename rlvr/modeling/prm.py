"""A process reward model (PRM): a token-classification network read at the last token of each step.

    p(step k is good | prompt, steps 1..k) = softmax(logits[t_k])[1]   (2 labels: bad, good)
                                           = sigmoid(logits[t_k, 0])    (1 label)

where ``t_k`` is the last token of step k (:func:`rlvr.algorithms.process_rewards.step_end_indices`;
published PRMs read a step tag token there instead, see that module). Any
``AutoModelForTokenClassification`` folder with 1 or 2 labels works, from the hub or from ``rlvr
train-prm`` (``rlvr/recipes/train_prm.py``), which builds a fresh one from a causal LM folder
(:func:`load_prm_backbone`: the LM's body under a new linear head of 2 labels, e.g.
``LlamaForTokenClassification``). ``prm.json`` beside the weights records the step separator the
model was trained with (default ``"\\n"``).

Scoring reads the completion's tokens as the policy generated them: prompt ids as
:class:`rlvr.rollout.suites.PromptEncoder` encodes them, completion ids with the EOS of a finished
completion; so training (which tokenises its data the same way) and scoring agree on every position.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch

from rlvr.algorithms.process_rewards import step_end_indices
from rlvr.modeling.loading import check_model_folder, load_tokenizer, resolve_dtype, save_final_model
from rlvr.verifiers.errors import InvalidValueError

PRM_FILE = "prm.json"
DEFAULT_SEPARATOR = "\n"
LABELS = {0: "bad", 1: "good"}  # a fresh head's labels; the probability read is label 1's

# ---------------------------------------------------------------------------------------------
# Tokens -> text pieces -> step ends
# ---------------------------------------------------------------------------------------------


def token_pieces(tokenizer, ids: Sequence[int]) -> list[str]:
    """The text each token of ``ids`` adds to the decoded completion, special tokens (EOS, padding) as
    ``""``, so that ``"".join(token_pieces(...)) == tokenizer.decode(ids, skip_special_tokens=True)``
    for the usual tokenizers.

    Decoded incrementally, as inference servers stream text: each token is decoded with the tokens
    emitted just before it, so a SentencePiece word keeps its leading space and a character split over several
    byte tokens appears, whole, at the token that completes it (the ones before it add ``""``)."""
    pieces: list[str] = []
    prefix, read = 0, 0  # ids[prefix:read]: context already emitted; ids[read:i+1]: tokens not yet emitted
    before = ""  # the text of ids[prefix:read], decoded once per emission
    for i in range(len(ids)):
        now = tokenizer.decode(ids[prefix : i + 1], skip_special_tokens=True)
        if len(now) > len(before) and not now.endswith("\ufffd"):
            pieces.append(now[len(before):])
            prefix, read = read, i + 1  # the context of the next token: the ones just emitted (linear time)
            before = tokenizer.decode(ids[prefix:read], skip_special_tokens=True)
        else:
            pieces.append("")  # a special token, or a character still incomplete
    return pieces


def completion_step_ends(tokenizer, ids: Sequence[int], separator: str = DEFAULT_SEPARATOR) -> list[int]:
    """The index (into ``ids``) of each step's last token: :func:`step_end_indices` of
    :func:`token_pieces`."""
    return step_end_indices(token_pieces(tokenizer, ids), separator)


# ---------------------------------------------------------------------------------------------
# Logits at the step ends, their probabilities, their loss
# ---------------------------------------------------------------------------------------------


def step_logits(model, prompts: Sequence[list[int]], completions: Sequence[list[int]],
                step_ends: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """The classifier's logits at every step end of a batch: right-padded ``prompt + completion`` rows
    with an attention mask, one forward pass, gathered at ``len(prompt) + end`` for each end of each
    row in order.  -> [S, num_labels] float32, S = total steps of the batch"""
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    rows, cols = [], []
    for i, (seq, prompt, completion, ends) in enumerate(zip(seqs, prompts, completions, step_ends)):
        ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        for end in ends:
            if not 0 <= end < len(completion):
                raise ValueError(f"row {i}: a step ends at token {end}, outside its {len(completion)} completion tokens")
            rows.append(i)
            cols.append(len(prompt) + end)
    device = next(model.parameters()).device
    logits = model(input_ids=ids.to(device), attention_mask=attention.to(device), use_cache=False).logits  # [B, L, C]
    return logits[torch.tensor(rows, device=device), torch.tensor(cols, device=device)].float()  # [S, C]


def step_probabilities(logits: torch.Tensor) -> torch.Tensor:
    """p(good) of each step: sigmoid of a single logit, or softmax's label 1 of two.  [S, C] -> [S]"""
    if logits.shape[-1] == 1:
        return torch.sigmoid(logits[:, 0])
    if logits.shape[-1] == 2:
        return torch.softmax(logits, dim=-1)[:, 1]
    raise InvalidValueError(f"a process reward model has 1 or 2 labels, this one has {logits.shape[-1]}")


def step_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the steps' labels (1 good, 0 bad): binary on a single logit, two-way softmax
    on two.  logits [S, C], labels [S] -> []"""
    if logits.shape[-1] == 1:
        return torch.nn.functional.binary_cross_entropy_with_logits(logits[:, 0], labels.float())
    return torch.nn.functional.cross_entropy(logits, labels.long())


# ---------------------------------------------------------------------------------------------
# Scoring with a trained PRM
# ---------------------------------------------------------------------------------------------


class ProcessRewardModel:
    """A process reward model that scores the steps of completions in batches of ``batch_size``.

    ``path``: a ``rlvr train-prm`` run's ``final/`` or any token-classification folder with 1 or 2
    labels (the tokenizer must be the policy's). ``.separator`` is the step separator it was trained
    with (``prm.json``; ``"\\n"`` without one), ``.tokenizer`` its tokenizer::

        prm = ProcessRewardModel(run / "final")
        ends = [prm.step_ends(c) for c in completion_ids]            # or step_end_indices(...) yourself
        scores = prm.score_steps(prompt_ids, completion_ids, ends)   # [N][K_i] probabilities
        rewards = aggregate_step_scores(scores, "min")               # [N]
    """

    def __init__(self, path: str | Path, *, device: str = "cpu", dtype: str = "float32", batch_size: int = 16):
        from transformers import AutoModelForTokenClassification

        folder = check_model_folder(path, "process reward model")
        info = json.loads((folder / PRM_FILE).read_text()) if (folder / PRM_FILE).is_file() else {}
        self.separator = info.get("separator", DEFAULT_SEPARATOR)
        self.batch_size = batch_size
        self.tokenizer = load_tokenizer(folder)
        self.pad_id = self.tokenizer.pad_token_id
        self.model = AutoModelForTokenClassification.from_pretrained(str(folder), dtype=resolve_dtype(dtype)).to(device)
        if self.model.config.num_labels not in (1, 2):
            raise InvalidValueError(f"process reward model {path}: a PRM has 1 or 2 labels, this one has "
                                    f"{self.model.config.num_labels}")
        self.model.eval().requires_grad_(False)

    def step_ends(self, completion_ids: Sequence[int]) -> list[int]:
        """The last token of each step of one completion, split at this model's separator."""
        return completion_step_ends(self.tokenizer, completion_ids, self.separator)

    @torch.no_grad()
    def score_steps(self, prompt_ids: Sequence[list[int]], completion_ids: Sequence[list[int]],
                    step_ends: Sequence[Sequence[int]]) -> list[list[float]]:
        """p(good) of each step of each completion, read at its end token (``step_ends``: indices into
        the completion, as :meth:`step_ends` gives them).  [N] rows -> [N][K_i] floats; a completion
        with no step gets ``[]``."""
        if not len(prompt_ids) == len(completion_ids) == len(step_ends):
            raise ValueError(f"score_steps: {len(prompt_ids)} prompts, {len(completion_ids)} completions and "
                             f"{len(step_ends)} rows of step ends; give one of each per sample")
        flat: list[float] = []
        for start in range(0, len(prompt_ids), self.batch_size):
            batch = slice(start, start + self.batch_size)
            if any(step_ends[batch]):
                logits = step_logits(self.model, prompt_ids[batch], completion_ids[batch], step_ends[batch], self.pad_id)
                flat.extend(step_probabilities(logits).cpu().tolist())
        out, at = [], 0
        for ends in step_ends:
            out.append(flat[at : at + len(ends)])
            at += len(ends)
        return out


# ---------------------------------------------------------------------------------------------
# Building one to train, and saving it
# ---------------------------------------------------------------------------------------------


def is_token_classifier(path: str | Path) -> bool:
    """Whether the folder holds a token-classification model already (else: a causal LM to build on)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(check_model_folder(path)))
    return any(name.endswith("ForTokenClassification") for name in (config.architectures or []))


def load_prm_backbone(model_config, tokenizer, device: str, weights: Path | None = None):
    """The trainable PRM of a ``ModelConfig`` (``model.path``, ``model.lora``, ``model.dtype``): a
    token-classification folder as it is (its 1 or 2 labels), or a causal LM's body under a new head of
    two labels (bad, good), classifier dropout off. ``weights``: a checkpoint's ``model/`` folder (resume:
    the whole model, or LoRA adapters over ``model.path``)."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    lora = model_config.lora.model_dump() if model_config.lora is not None else None
    source = check_model_folder(weights if weights is not None and lora is None else model_config.path)
    # pad_token_id: the batches are right-padded and the model must know its pad token
    config = AutoConfig.from_pretrained(str(source), pad_token_id=tokenizer.pad_token_id)
    if not is_token_classifier(source):  # a causal LM: a new head of two labels on its body
        config.num_labels, config.id2label, config.label2id = 2, dict(LABELS), {v: k for k, v in LABELS.items()}
        config.classifier_dropout = 0.0  # no dropout before the new head (transformers' default is 0.1)
    model = AutoModelForTokenClassification.from_pretrained(str(source), config=config,
                                                            dtype=resolve_dtype(model_config.dtype)).to(device)
    if model.config.num_labels not in (1, 2):
        raise InvalidValueError(f"model.path: {source} is a token classifier of {model.config.num_labels} labels; "
                                "a PRM has 1 (sigmoid) or 2 (bad, good)")
    if model_config.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if lora is not None:
        from peft import LoraConfig, PeftModel, get_peft_model

        if weights is not None:
            model = PeftModel.from_pretrained(model, str(weights), is_trainable=True)
        else:
            head = [name for name in ("score", "classifier") if hasattr(model, name)]  # Llama-style, BERT-style
            model = get_peft_model(model, LoraConfig(
                r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                target_modules=lora["target_modules"], task_type="TOKEN_CLS", modules_to_save=head))
    return model.train()


def save_prm(model, tokenizer, out: str | Path, *, separator: str = DEFAULT_SEPARATOR) -> Path:
    """``out``: a standalone token-classification folder (LoRA merged; adapters also under ``adapter/``)
    + ``prm.json`` naming the step separator. Loads with :class:`ProcessRewardModel` or
    ``AutoModelForTokenClassification.from_pretrained``."""
    return save_final_model(model, tokenizer, out, extra_json={PRM_FILE: {"separator": separator}})
