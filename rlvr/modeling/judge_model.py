"""The ``local`` judge backend: a causal LM folder run in this process, in batches, on a device.

The judge verifier (``rlvr.verifiers.judge``) is torch-free; it finds this backend through the entry
point ``local`` of the group ``rlvr.judge_backends`` that rlvr's ``pyproject.toml`` declares, so the
verifier package never imports the trainer. The runner scores a batched verifier in the calling
process, so in training the model lives in the trainer, beside the policy, as a learned reward model
does.

Each request's chat messages go through the judge tokenizer's own chat template (a plain
"role: content" join where it has none), left-padded into batches of ``batch_size``, and decoded
greedily (``temperature == 0``) or sampled. ``top_logprobs`` reads the first generated token's
distribution, for the judge's ``logprob`` verdict.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from rlvr.modeling.loading import check_model_folder, load_tokenizer, resolve_dtype
from rlvr.verifiers.judge_backends import JudgeReply, JudgeRequest


class LocalJudge:
    """Judge replies from the causal LM folder ``model``.

    Args:
        model: a local model folder (``AutoModelForCausalLM``).
        device: where it runs; default cuda when available, else cpu.
        dtype: ``float32`` | ``bfloat16`` | ``float16``.
        batch_size: requests decoded together.
    """

    def __init__(self, *, model: str, device: str | None = None, dtype: str = "float32", batch_size: int = 16):
        from transformers import AutoModelForCausalLM

        self.model = str(model)
        folder = check_model_folder(model, "verifier.options.model")
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.batch_size = max(1, int(batch_size))
        self.tokenizer = load_tokenizer(folder)
        self.lm = AutoModelForCausalLM.from_pretrained(folder, dtype=resolve_dtype(dtype)).to(self.device).eval()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id

    def render(self, request: JudgeRequest) -> list[int]:
        """The prompt ids of one request: the chat template with the generation prompt, or a plain join."""
        messages = request.as_messages()
        if getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        text = "\n\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\n\nassistant:"
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    @torch.no_grad()
    def complete(self, requests: Sequence[JudgeRequest]) -> list[JudgeReply]:
        replies: list[JudgeReply] = []
        for start in range(0, len(requests), self.batch_size):
            replies.extend(self._batch(requests[start : start + self.batch_size]))
        return replies

    def _batch(self, requests: Sequence[JudgeRequest]) -> list[JudgeReply]:
        prompts = [self.render(r) for r in requests]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts], device=self.device)  # [B, L] left-padded
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        first = requests[0]  # one batch shares the sampling settings (the judge sends one kind of request)
        sample = first.temperature > 0
        out = self.lm.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(r.max_tokens for r in requests),
                               do_sample=sample, temperature=first.temperature if sample else None, top_p=None,
                               top_k=None, pad_token_id=self.pad_id, output_scores=True, return_dict_in_generate=True)
        new = out.sequences[:, width:]  # [B, T]
        first_logp = torch.log_softmax(out.scores[0].float(), dim=-1)  # [B, V] the first generated token
        replies = []
        for b, request in enumerate(requests):
            tokens = new[b, : request.max_tokens].tolist()
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            top: dict[str, float] = {}
            if request.top_logprobs:
                values, indices = first_logp[b].topk(min(request.top_logprobs, first_logp.shape[-1]))
                for value, index in zip(values.tolist(), indices.tolist()):
                    key = self.tokenizer.decode([index])  # two tokens may decode alike: their mass adds up
                    prev = top.get(key)
                    top[key] = value if prev is None else max(prev, value) + math.log1p(math.exp(-abs(prev - value)))
            replies.append(JudgeReply(text=text, top_logprobs=top))
        return replies
