"""Generation engines, behind the :class:`~rlvr.engines.base.Engine` protocol.

Engines are found by name in ``ENGINES`` (config field ``engine.name``): built-ins are registered
lazily by import path, so an engine whose optional package is missing costs nothing until it is
asked for and then fails with the install hint; a plugin adds one with an ``rlvr.engines`` entry
point (``my_engine = "my_package.engine:MyEngine"``), a class called as ``cls(model, tokenizer,
**options)``.
"""

from rlvr.engines.base import Completion, Engine, SamplingParams
from rlvr.engines.hf import HFEngine
from rlvr.verifiers.plugins import Registry

ENGINES: Registry[type] = Registry("engine", entry_point_group="rlvr.engines")
ENGINES.lazy("hf", "rlvr.engines.hf:HFEngine")


def build_engine(name: str, model, tokenizer, **options) -> Engine:
    """The engine registered under ``name``; an unknown name lists the valid ones."""
    return ENGINES.get(name)(model, tokenizer, **options)


__all__ = ["Completion", "ENGINES", "Engine", "HFEngine", "SamplingParams", "build_engine"]
