"""Generation engines: ``hf`` (transformers ``generate``, the default) and, where installed, ``vllm``."""

from rlvr.engines.base import Completion, Engine, SamplingParams
from rlvr.engines.hf import HFEngine

ENGINES = {"hf": HFEngine}


def build_engine(name: str, model, tokenizer, **options) -> Engine:
    """The engine registered under ``name``; an unknown name lists the valid ones."""
    try:
        cls = ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; valid engines: {', '.join(ENGINES)}") from None
    return cls(model, tokenizer, **options)


__all__ = ["Completion", "ENGINES", "Engine", "HFEngine", "SamplingParams", "build_engine"]
