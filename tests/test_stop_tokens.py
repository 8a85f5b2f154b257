"""Single-turn runs check, at start, that generation stops where the chat template ends an assistant turn:
a base model whose generation config stops at ``<|endoftext|>``, prompted in ChatML, never stops at
``<|im_end|>`` and runs every sample to ``max_new_tokens``."""

import pytest

from rlvr.modeling.tiny import build_char_tokenizer, build_tiny_model
from rlvr.rollout.chat import AUTO, ChatTemplate, end_of_turn_token, stop_token_warning

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _chatml(eos: str):
    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]})
    tokenizer.chat_template = CHATML
    tokenizer.eos_token = eos
    return tokenizer


def test_the_end_of_turn_token_is_read_from_the_template():
    assert end_of_turn_token(_chatml("<|endoftext|>"), AUTO) == "<|im_end|>"
    assert end_of_turn_token(build_char_tokenizer(), AUTO) is None  # a plain join writes nothing after a turn
    assert end_of_turn_token(_chatml("<|endoftext|>"), ChatTemplate(mode="none")) is None  # raw prompts


def test_a_template_whose_turn_end_is_not_a_stop_id_is_warned_about_naming_the_fix():
    tokenizer = _chatml("<|endoftext|>")
    endoftext, im_end = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    warning = stop_token_warning(tokenizer, [AUTO], [endoftext])
    assert warning.startswith(f"warning: the chat template ends an assistant turn with '<|im_end|>' (id {im_end})")
    assert f"add {im_end} to eos_token_id in generation_config.json" in warning
    assert stop_token_warning(tokenizer, [AUTO], [endoftext, im_end]) is None


@pytest.mark.slow
def test_a_run_prints_the_warning_before_it_loads_the_policy(tmp_path, capsys):
    from rlvr.config import RunConfig, build_config
    from rlvr.recipes import train

    from transformers import AutoModelForCausalLM

    model = build_tiny_model(tmp_path / "model", seed=0)
    tokenizer = _chatml("<|endoftext|>")
    weights = AutoModelForCausalLM.from_pretrained(model)
    weights.resize_token_embeddings(len(tokenizer))  # room for the ChatML tokens
    weights.save_pretrained(model)  # its generation config keeps the tiny model's own EOS
    tokenizer.save_pretrained(model)
    config = build_config(RunConfig, {
        "out": str(tmp_path / "run"), "model": {"path": str(model)},
        "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
        "generation": {"max_new_tokens": 2}, "train": {"steps": 1, "prompts_per_step": 2, "group_size": 2,
                                                       "threads": 1},
        "eval": {"at_start": False, "at_end": False}, "log": {"progress": False, "plot": False},
        "checkpoint": {"every": 0}})
    train(config)
    assert "warning: the chat template ends an assistant turn with '<|im_end|>'" in capsys.readouterr().out
