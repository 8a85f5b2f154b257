"""Chat messages -> the text and token ids a model reads.

Task suites hand the trainer chat messages; only here do they meet a tokenizer. A tokenizer with
a chat template renders them with the generation prompt appended; one without a template (a base
model) gets the message contents joined by blank lines.
"""

from __future__ import annotations

from typing import Any, Sequence

Messages = Sequence[dict[str, str]]


def render_prompt(tokenizer: Any | None, messages: Messages) -> str:
    """The prompt text a model sees for ``messages`` (template applied, generation prompt added)."""
    if not messages:
        raise ValueError("a prompt needs at least one chat message")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "content" not in message:
            raise ValueError(f"chat message {i} must be a dict with 'role' and 'content', got {message!r}")
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return "\n\n".join(m["content"] for m in messages)


def encode_prompts(tokenizer: Any, prompts: Sequence[Messages]) -> list[list[int]]:
    """Token ids of each rendered prompt. Special tokens come from the template, so none are added here
    (a template that writes ``bos_token`` would otherwise get it twice)."""
    texts = [render_prompt(tokenizer, messages) for messages in prompts]
    has_template = bool(getattr(tokenizer, "chat_template", None))
    return tokenizer(texts, add_special_tokens=not has_template)["input_ids"]
