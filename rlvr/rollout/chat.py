"""Chat messages -> the text and token ids a model reads.

Task suites hand the trainer chat messages; only here do they meet a tokenizer. How they are
rendered is a suite's ``chat_template`` setting (``data[i].chat_template``, ``rlvr eval
--chat-template``, SFT's ``data[i].chat_template``):

* ``auto`` (the default): the tokenizer's chat template, with the generation prompt appended; a
  tokenizer without one (a base model) gets the message contents joined by blank lines, plus the
  special tokens the tokenizer adds by default (its BOS, if it has one);
* ``none``: raw prompts, whatever the tokenizer's template: the message contents joined by blank
  lines (for the usual one-message prompt, the question itself), encoded as ``tokenizer(text)``
  encodes it, so with the tokenizer's default special tokens (a Llama-style tokenizer prepends
  BOS, a Qwen-style one adds nothing);
* a path to a Jinja template file: rendered like a tokenizer's own template (``messages``,
  ``bos_token``, ``eos_token``, ``add_generation_prompt=True``); the template writes every special
  token itself, so none is added.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from rlvr.verifiers.errors import InvalidValueError, MissingFileError

Messages = Sequence[dict[str, str]]

#: The named ``chat_template`` settings; anything else is a path to a Jinja template file.
CHAT_TEMPLATE_MODES = ("auto", "none")


@dataclass(frozen=True)
class ChatTemplate:
    """A resolved ``chat_template`` setting: ``mode`` is auto, none or file; ``source`` the
    template text of a file."""

    mode: str = "auto"
    path: str | None = None
    source: str | None = None

    def describe(self, tokenizer: Any | None = None) -> str:
        """How prompts are rendered, in words (for the run's first lines and ``rlvr tasks show``)."""
        if self.mode == "file":
            return f"chat template {self.path}"
        if self.mode == "none":
            return "raw prompts (chat_template none: message contents joined, the tokenizer's default special tokens)"
        if tokenizer is not None and not getattr(tokenizer, "chat_template", None):
            return "raw prompts (the tokenizer has no chat template)"
        return "the tokenizer's chat template"


AUTO = ChatTemplate()


def resolve_chat_template(setting: str | ChatTemplate | None, where: str = "chat_template") -> ChatTemplate:
    """``auto`` | ``none`` | a Jinja template file -> :class:`ChatTemplate`. A missing file, or one
    that is not a valid Jinja template, is an error naming ``where`` (the config field or flag)."""
    if isinstance(setting, ChatTemplate):
        return setting
    if setting is None or setting == "auto":
        return AUTO
    if setting == "none":
        return ChatTemplate("none")
    path = Path(str(setting)).expanduser()
    if not path.is_file():
        raise MissingFileError(f"{where}: {setting!r} is neither {' nor '.join(CHAT_TEMPLATE_MODES)} nor a Jinja "
                               "template file that exists")
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidValueError(f"{where}: cannot read the template file {path}: {exc}") from None
    _check_jinja(source, f"{where}: {path}")
    return ChatTemplate("file", str(path), source)


def _check_jinja(source: str, where: str) -> None:
    try:
        import jinja2
    except ImportError:  # pragma: no cover - a dependency of transformers
        return
    try:
        jinja2.Environment().parse(source)
    except jinja2.TemplateSyntaxError as exc:
        raise InvalidValueError(f"{where} is not a valid Jinja template (line {exc.lineno}: {exc.message})") from None


def _check_messages(messages: Messages) -> None:
    if not messages:
        raise ValueError("a prompt needs at least one chat message")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "content" not in message:
            raise ValueError(f"chat message {i} must be a dict with 'role' and 'content', got {message!r}")


def _uses_template(tokenizer: Any | None, template: ChatTemplate) -> bool:
    if template.mode == "file":
        return True
    return template.mode == "auto" and tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def render_prompt(tokenizer: Any | None, messages: Messages, chat_template: str | ChatTemplate | None = None,
                  tools: Sequence[dict] | None = None) -> str:
    """The prompt text a model sees for ``messages`` under ``chat_template`` (module docstring);
    ``tools`` (JSON schemas) go to a chat template that lists tools (raw prompts ignore them)."""
    _check_messages(messages)
    template = resolve_chat_template(chat_template)
    if _uses_template(tokenizer, template):
        if tokenizer is None:
            raise ValueError("a chat template file needs a tokenizer to render with")
        return apply_template(tokenizer, template, messages, generation_prompt=True, tools=tools)
    return "\n\n".join(m["content"] for m in messages)


def apply_template(tokenizer: Any, template: ChatTemplate, messages: Messages, *, generation_prompt: bool,
                   tools: Sequence[dict] | None = None) -> str:
    """``messages`` rendered by the tokenizer's chat template (``auto``) or ``template``'s file: the one
    place a chat template is applied, for prompts and for the messages of multi-turn episodes."""
    extra: dict[str, Any] = {"chat_template": template.source} if template.mode == "file" else {}
    if tools:
        extra["tools"] = list(tools)
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt,
                                         **extra)


def encode_prompts(tokenizer: Any, prompts: Sequence[Messages],
                   chat_template: str | ChatTemplate | None = None, tools: Sequence[dict] | None = None) -> list[list[int]]:
    """Token ids of each rendered prompt. With a template, special tokens come from the template, so
    none are added here (a template that writes ``bos_token`` would otherwise get it twice); raw
    prompts get the tokenizer's default special tokens, as ``tokenizer(text)`` gives them."""
    template = resolve_chat_template(chat_template)
    texts = [render_prompt(tokenizer, messages, template, tools) for messages in prompts]
    return tokenizer(texts, add_special_tokens=not _uses_template(tokenizer, template))["input_ids"]


#: An assistant message rendered to find what the template writes after it: the end-of-turn token.
_TURN_PROBE = [{"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "It is 2."}]


def end_of_turn_token(tokenizer: Any, template: ChatTemplate) -> str | None:
    """The special token the chat template closes an assistant turn with (ChatML's ``<|im_end|>``,
    Llama 3's ``<|eot_id|>``), or None: raw prompts, a template that writes nothing special after the
    message (the tiny model's plain join), or one that cannot render the probe turn."""
    if not _uses_template(tokenizer, template):
        return None
    try:
        text = apply_template(tokenizer, template, _TURN_PROBE, generation_prompt=False)
    except Exception:  # a template that only renders its own message shapes: nothing to check
        return None
    content = _TURN_PROBE[-1]["content"]
    after = text[text.rfind(content) + len(content):].lstrip() if content in text else ""
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    first = tokenizer.convert_ids_to_tokens(ids[:1])
    return first[0] if first and first[0] in set(tokenizer.all_special_tokens) else None


def stop_token_warning(tokenizer: Any, templates: Sequence[ChatTemplate], stop_ids: Sequence[int]) -> str | None:
    """A one-line warning when a chat template the run renders prompts with ends an assistant turn with a
    token generation does not stop at (a base model whose generation config stops at ``<|endoftext|>``,
    prompted in ChatML): its samples would run past the answer to ``max_new_tokens``."""
    stops = set(stop_ids)
    for template in dict.fromkeys(templates):
        token = end_of_turn_token(tokenizer, template)
        if token is None:
            continue
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id not in stops:
            shown = ", ".join(f"{t!r} ({i})" for t, i in zip(tokenizer.convert_ids_to_tokens(list(stops)), stops))
            return (f"warning: the chat template ends an assistant turn with {token!r} (id {token_id}), but generation "
                    f"stops only at {shown or 'no token'} (the model's generation_config.json eos_token_id and the "
                    f"tokenizer's EOS): samples will run on to max_new_tokens; add {token_id} to eos_token_id in "
                    "generation_config.json, or render prompts with a template that matches the model")
    return None
