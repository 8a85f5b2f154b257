"""Which recipe runs a config: ``rlvr/recipes/ppo.py`` for the critic presets, ``rlvr/recipes/grpo.py`` for the rest."""

from __future__ import annotations

from typing import Any

from rlvr.config import CRITIC_PRESETS, RunConfig


def train(config: RunConfig, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Train with the recipe ``config.algorithm.preset`` belongs to; returns the run summary."""
    if config.algorithm.preset in CRITIC_PRESETS:
        from rlvr.recipes import ppo as recipe
    else:
        from rlvr.recipes import grpo as recipe
    return recipe.train(config, resume=resume, overwrite=overwrite)
