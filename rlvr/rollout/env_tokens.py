"""Environment messages -> the token ids appended to a multi-turn episode.

The episode's ids are never re-tokenised: after a turn, only the environment's new messages are
turned into ids and appended after the ids the model sampled (which end with its end-of-turn token).
How they are written is ``environment.messages``:

* ``template``: as the chat template writes them. The suffix is cut from a dummy conversation
  rendered with and without the messages (plus the generation prompt of the next assistant turn),
  starting right after the end-of-turn token that closed the assistant's message, so the model reads
  what it would read in a conversation rendered whole. This holds only for a template that is
  *prefix-preserving* (a conversation's rendering starts with the rendering of any of its earlier
  parts, and an assistant turn is closed by the token the engine stops at); :func:`check_template`
  proves that at start-up and refuses a template that is not (Qwen3's, which drops the reasoning of
  earlier turns, is the common case) with the fix.
* ``text``: plain text for models without a chat template that knows tool turns (the tiny model):
  a tool result as ``\\n```output\\n{content}\\n```\\n``, any other message as ``\\n{content}\\n``.
* ``auto`` (default): ``template`` when the tokenizer's (or the suite's) chat template passes the
  check, ``text`` when there is no chat template; a template that fails is refused, naming both fixes.
"""

from __future__ import annotations

from typing import Any, Sequence

from rlvr.rollout.chat import ChatTemplate, apply_template, resolve_chat_template
from rlvr.verifiers.errors import InvalidValueError

MESSAGE_FORMATS = ("auto", "template", "text")

#: How the ``text`` format writes an environment message, by role (any other role: ``default``).
TEXT_FORMATS = {"tool": "\n```output\n{content}\n```\n", "default": "\n{content}\n"}

_DUMMY = [{"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "It is 2."}]
_PROBE = [{"role": "tool", "name": "python", "content": "2"}]


class TextMessages:
    """The ``text`` format: environment messages as plain text (module docstring)."""

    mode = "text"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def render(self, messages: Sequence[dict[str, str]]) -> str:
        return "".join(TEXT_FORMATS.get(m.get("role", ""), TEXT_FORMATS["default"]).format(content=m["content"])
                       for m in messages)

    def encode(self, messages: Sequence[dict[str, str]]) -> list[int]:
        return self.tokenizer(self.render(messages), add_special_tokens=False)["input_ids"]


class TemplateMessages:
    """The ``template`` format: environment messages as the chat template writes them, the next
    assistant turn's generation prompt included (module docstring)."""

    mode = "template"

    def __init__(self, tokenizer, template: ChatTemplate, eos_text: str):
        self.tokenizer, self.template, self.eos_text = tokenizer, template, eos_text
        self._before = self._render(_DUMMY, generation_prompt=False)
        self._cut = self._before.rindex(eos_text) + len(eos_text)  # right after the assistant's end-of-turn token

    def _render(self, messages: Sequence[dict[str, str]], *, generation_prompt: bool) -> str:
        return apply_template(self.tokenizer, self.template, messages, generation_prompt=generation_prompt)

    def render(self, messages: Sequence[dict[str, str]]) -> str:
        after = self._render([*_DUMMY, *messages], generation_prompt=True)
        if not after.startswith(self._before):
            raise InvalidValueError("the chat template rewrote earlier turns when environment messages were added "
                                    "(not prefix-preserving); set environment.messages=text or use a prefix-preserving "
                                    "chat_template file")
        return after[self._cut:]

    def encode(self, messages: Sequence[dict[str, str]]) -> list[int]:
        return self.tokenizer(self.render(messages), add_special_tokens=False)["input_ids"]


def check_template(tokenizer, template: ChatTemplate, eos_text: str) -> str | None:
    """Why the chat template cannot carry a multi-turn episode token-in, token-out, or None when it can:

    1. rendering ``[user]`` with the generation prompt is a prefix of ``[user, assistant]``: the
       model's first turn continues its prompt;
    2. the assistant's message is closed by ``eos_text``, the end-of-turn token the engine stops at,
       and nothing after it but whitespace, so the sampled ids end where the rendered turn ends;
    3. ``[user, assistant]`` is a prefix of ``[user, assistant, tool, assistant]``: adding turns never
       rewrites earlier ones (templates that drop earlier reasoning fail here).
    """
    def render(messages, generation_prompt):
        return apply_template(tokenizer, template, messages, generation_prompt=generation_prompt)

    try:
        prompt = render(_DUMMY[:1], True)
        one = render(_DUMMY, False)
        two = render([*_DUMMY, *_PROBE, {"role": "assistant", "content": "So 2."}], False)
    except Exception as exc:  # a template that cannot render a tool message raises whatever Jinja raises
        return f"rendering a tool message fails ({type(exc).__name__}: {exc})"
    if not one.startswith(prompt):
        return "the assistant's turn does not continue the generation prompt"
    end = one.find(_DUMMY[1]["content"], len(prompt)) + len(_DUMMY[1]["content"])
    if not eos_text or not one[end:].lstrip(" ").startswith(eos_text) or one[end:].strip().replace(eos_text, "", 1):
        return f"an assistant message is not closed by the end-of-turn token {eos_text!r}"
    if not two.startswith(one[: one.rindex(eos_text) + len(eos_text)]):
        return "adding turns rewrites earlier ones (the template is not prefix-preserving)"
    return None


def message_encoder(tokenizer, mode: str, chat_template: str | ChatTemplate | None, eos_ids: Sequence[int], *,
                    knobs: tuple[str, str] = ("environment.messages={}", "chat_template")) -> Any:
    """The encoder of ``environment.messages`` = ``mode`` (module docstring) for prompts rendered with
    ``chat_template``, whose turns end at one of ``eos_ids`` (the ids the engine stops at); a template
    that cannot carry an episode is refused with the fixes, spelled as the caller's ``knobs``: the
    messages setting (a format string for its value) and the chat-template one (``rlvr eval`` names
    its flags: ``("--env-messages {}", "--chat-template")``)."""
    messages_knob, template_knob = knobs
    if mode not in MESSAGE_FORMATS:
        raise InvalidValueError(f"environment.messages must be one of {', '.join(MESSAGE_FORMATS)}, got {mode!r}")
    template = resolve_chat_template(chat_template)
    has_template = template.mode == "file" or (template.mode == "auto" and bool(getattr(tokenizer, "chat_template", None)))
    if mode == "text" or (mode == "auto" and not has_template):
        return TextMessages(tokenizer)
    if not has_template:
        raise InvalidValueError(f"{messages_knob.format('template')} needs a chat template (the tokenizer has none "
                                f"and {template_knob} is none); set {messages_knob.format('text')}")
    problems = {}
    for eos_text in tokenizer.convert_ids_to_tokens(list(eos_ids)):
        problems[eos_text] = check_template(tokenizer, template, eos_text)
        if problems[eos_text] is None:
            return TemplateMessages(tokenizer, template, eos_text)
    problem = next((p for p in problems.values() if "end-of-turn" not in p), None) or next(iter(problems.values()))
    raise InvalidValueError(f"the chat template cannot carry multi-turn episodes token-in, token-out: {problem}; "
                            f"set {messages_knob.format('text')}, or give a prefix-preserving {template_knob} file")


class MessageEncoders:
    """The message encoder of each chat template, built (and checked) once: ``encoders(template)``.
    Both the trainer's episode runner and the asynchronous generator's use it."""

    def __init__(self, tokenizer, mode: str, eos_ids: Sequence[int]):
        self.tokenizer, self.mode, self.eos_ids = tokenizer, mode, list(eos_ids)
        self._built: dict[Any, Any] = {}

    def __call__(self, template: str | ChatTemplate | None) -> Any:
        if template not in self._built:
            self._built[template] = message_encoder(self.tokenizer, self.mode, template, self.eos_ids)
        return self._built[template]
