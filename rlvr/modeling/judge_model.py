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
import sys
from typing import Sequence

import torch

from rlvr.modeling.loading import check_model_folder, context_length, load_tokenizer, resolve_dtype
from rlvr.verifiers.errors import InvalidValueError
from rlvr.verifiers.judge_backends import JudgeReply, JudgeRequest


class LocalJudge:
    """Judge replies from the causal LM folder ``model``.

    Args:
        model: a local model folder (``AutoModelForCausalLM``).
        device: where it runs; default cuda when available, else cpu.
        dtype: ``float32`` | ``bfloat16`` | ``float16``.
        batch_size: requests decoded together.

    A request whose prompt plus ``max_tokens`` does not fit the model's context is not truncated (cutting
    the response or the grader's closing instruction would change what is judged): its reply is an
    ``error`` naming the lengths and the fix, so the sample is masked and counted (and
    ``verifier.max_error_frac`` stops a run where it happens to most samples), and the first one is also
    printed once as a warning. A batch that fails (e.g. out of memory) is an error on its own items.
    """

    DTYPES = ("float32", "bfloat16", "float16")

    def __init__(self, *, model: str, device: str | None = None, dtype: str = "float32", batch_size: int = 16):
        from transformers import AutoModelForCausalLM

        self.validate(model=model, device=device, dtype=dtype, batch_size=batch_size)
        self.model = str(model)
        folder = check_model_folder(model, "verifier.options.model")
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.batch_size = int(batch_size)
        self.tokenizer = load_tokenizer(folder)
        self.lm = AutoModelForCausalLM.from_pretrained(folder, dtype=resolve_dtype(dtype)).to(self.device).eval()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.context = context_length(folder)  # None: the config does not say; nothing is checked
        self._warned = False

    @classmethod
    def validate(cls, *, model: object = None, device: object = None, dtype: object = "float32",
                 batch_size: object = 16) -> None:
        """Every option checked without loading anything (the judge calls this when it is built)."""
        from rlvr.verifiers.judge_backends import check_integer

        check_model_folder(str(model), "verifier.options.model")
        if dtype not in cls.DTYPES:
            raise InvalidValueError(f"judge backend_options.dtype {dtype!r} is unknown; valid dtypes: {', '.join(cls.DTYPES)}")
        if device is not None and not (isinstance(device, str) and device.split(":")[0] in ("cpu", "cuda", "mps")):
            raise InvalidValueError(f"judge backend_options.device must be cpu, cuda, cuda:N or mps, got {device!r}")
        check_integer("backend_options.batch_size", batch_size, 1)

    def render(self, request: JudgeRequest) -> list[int]:
        """The prompt ids of one request: the chat template with the generation prompt, or a plain join."""
        messages = request.as_messages()
        if getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        text = "\n\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\n\nassistant:"
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def overflow(self, prompt: list[int], request: JudgeRequest) -> str | None:
        """Why ``prompt`` cannot be judged by this model (over its context), or None when it fits."""
        if self.context is None or len(prompt) + request.max_tokens <= self.context:
            return None
        return (f"judge prompt of {len(prompt)} tokens plus max_tokens={request.max_tokens} is over the local judge "
                f"model's context of {self.context} tokens ({self.model}): not judged; lower the judge's "
                "max_response_chars, shorten its template, or use a judge model with a longer context")

    @torch.no_grad()
    def complete(self, requests: Sequence[JudgeRequest]) -> list[JudgeReply]:
        replies: list[JudgeReply | None] = [None] * len(requests)
        fitting: list[tuple[int, list[int]]] = []
        for i, request in enumerate(requests):
            prompt = self.render(request)
            why = self.overflow(prompt, request)
            if why is None:
                fitting.append((i, prompt))
                continue
            replies[i] = JudgeReply(error=why)
            if not self._warned:
                self._warned = True
                print(f"warning: {why} (each such sample is a counted error)", file=sys.stderr, flush=True)
        for start in range(0, len(fitting), self.batch_size):
            chunk = fitting[start : start + self.batch_size]
            try:
                done = self._batch([requests[i] for i, _ in chunk], [p for _, p in chunk])
            except Exception as exc:  # this batch's items fail; the others stand
                done = [JudgeReply(error=f"local judge failed: {type(exc).__name__}: {exc}"[:1000])] * len(chunk)
            for (i, _), reply in zip(chunk, done):
                replies[i] = reply
        return replies  # type: ignore[return-value]

    def _batch(self, requests: Sequence[JudgeRequest], prompts: list[list[int]]) -> list[JudgeReply]:
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
