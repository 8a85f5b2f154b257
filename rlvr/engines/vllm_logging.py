"""vLLM's log output inside a training run: warnings and errors only, less the expected ones.

Installed through ``VLLM_LOGGING_CONFIG_PATH`` (``vllm_logging.json`` beside this module) unless the
user configured vLLM's logging (``VLLM_LOGGING_CONFIG_PATH`` or ``VLLM_LOGGING_LEVEL`` set). Kept
free of vLLM imports: vLLM's logging setup imports this module by name.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

CONFIG = Path(__file__).with_name("vllm_logging.json")


class ExpectedWarnings(logging.Filter):
    """Drops vLLM warnings that are expected here and say nothing is wrong: the engine runs without a
    tokenizer (prompts arrive as ids, stop ids are given), so the chat-template warm-up fails and no
    EOS id is read from it; a weight reload "fails" for rotary embeddings, whose cos/sin table is
    computed, never a checkpoint weight; the CPU worker refuses thread-count changes it made itself;
    and in-process vLLM warns that it seeds the global generators (the engine restores them)."""

    EXPECTED = (
        "Chat template warmup failed",
        "RotaryEmbedding: Failed to load weights",
        "Using None for EOS token id because tokenizer is not initialized",
        "CPU backend doesn't allow to use `torch.set_num_threads`",
        "The global random seed is set to",
        "Reset SSM cache type",  # no state-space layers in these models
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        # a second engine in one process registers vLLM's kernels again
        return not (message.startswith(self.EXPECTED) or message.endswith("is already registered. Overwriting."))


def use_quiet_logging() -> None:
    """Point vLLM at the quiet configuration, unless the user configured its logging."""
    if "VLLM_LOGGING_CONFIG_PATH" not in os.environ and "VLLM_LOGGING_LEVEL" not in os.environ:
        os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(CONFIG)
