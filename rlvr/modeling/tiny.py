"""The tiny model the quickstart and the tests build locally (no hub download works here): a
randomly initialised Llama-architecture causal LM with a character-level tokenizer and a chat
template, saved like a hub model."""

from __future__ import annotations

import string
from pathlib import Path

import torch

TINY_SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]


# Every printable ASCII character is a token, so any prompt text can be read (unknown ones -> <unk>).
TINY_CHARS = [c for c in string.printable if c not in "\r\x0b\x0c"]


TINY_CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}"


def build_char_tokenizer():
    """A character-level tokenizer with a minimal chat template (message contents after BOS)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(TINY_SPECIAL_TOKENS + TINY_CHARS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one token per character
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def build_tiny_model(
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int = 512,
    max_positions: int = 256,
    seed: int = 0,
) -> Path:
    """Build a randomly initialised Llama-architecture causal LM with a character tokenizer and save
    it with ``save_pretrained``, so every later path loads it like a hub model.

    The Llama architecture matters: with transformers 5 a custom tokenizer saved beside a ``qwen2``
    config is replaced by the Qwen2 tokenizer on reload. Defaults give ~0.5M parameters.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir = Path(out_dir)
    tokenizer = build_char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
