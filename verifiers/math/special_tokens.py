"""Cut a response at the chat-template or special token that ends its turn.

The verifier sees decoded text, not the tokenizer, so a model that keeps writing after its turn
(``... (7,6) <|im_end|><|im_start|>user ...``) leaves tokens such as ``<|im_end|>``,
``<|im_start|>``, ``<|endoftext|>``, ``<|eot_id|>``, ``</s>``, ``<end_of_turn>`` or ``[INST]`` in the
response. What follows the first of them is a turn the model invented, not its answer, so
:func:`extract() <verifiers.math.extract.extract>` reads only the text before it. Tokens and role
names that *open* the response (``<|im_start|>assistant``) are skipped: they precede the answer.
"""

from __future__ import annotations

import re

# Chat-template and special tokens: <|im_end|>, <|eot_id|>, <|start_header_id|>, DeepSeek's <｜end▁of▁sentence｜>,
# </s>, <eos>, Gemma's <end_of_turn>, Llama-2's [INST]. Text after one is a turn the model invented.
_SPECIAL_TOKEN_RE = re.compile(
    r"<\|[A-Za-z][A-Za-z0-9_.:-]{1,40}\|>|<\uff5c[^\uff5c<>\n]{1,40}\uff5c>"
    r"|</s>|<eos>|<pad>|<(?:start|end)_of_(?:turn|text)>|\[/?INST\]")
_ROLE_RE = re.compile(r"(?i)^\s*(?:system|user|assistant|model|human|gpt|bot)?\s*$")
MAX_LEADING_TOKENS = 16


def cut_at_special_tokens(text: str) -> str:
    """``text`` up to the first special token that follows its content (tokens and role names that
    open it, ``<|im_start|>assistant``, are skipped)."""
    if "<" not in text and "[" not in text:
        return text
    pos = 0
    for n, m in enumerate(_SPECIAL_TOKEN_RE.finditer(text)):
        if n >= MAX_LEADING_TOKENS or not _ROLE_RE.match(text[pos: m.start()]):
            return text[: m.start()]
        pos = m.end()
    return text
