"""Devices, seeds, RNG state (for exact resume), optimizer and learning-rate schedule."""

from __future__ import annotations

import math
import os
import random
from typing import Any

import torch


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu; anything else is passed to ``torch.device``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but CUDA is not available (use device=cpu or auto)")
    return device


def set_threads(threads: int | None) -> None:
    """Pin torch's CPU thread count (None keeps torch's default). Tiny models gain little from a
    second thread, and on a shared machine a busy core makes every parallel op wait for it."""
    if threads is not None:
        torch.set_num_threads(threads)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def quiet_transformers() -> None:
    """Silence per-load progress bars and advisory warnings of transformers/datasets in our output."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass


def build_optimizer(params, *, lr: float, weight_decay: float, betas: tuple[float, float]) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas)


def lr_multiplier(step: int, *, total: int, warmup: int, schedule: str, min_ratio: float) -> float:
    """Learning-rate factor after ``step`` scheduler steps: linear warm-up, then constant, linear
    or cosine decay from 1 down to ``min_ratio`` at ``total``."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return 1.0 - (1.0 - min_ratio) * progress
    if schedule == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr schedule {schedule!r}; valid: constant, linear, cosine")


def build_scheduler(optimizer, *, total: int, warmup: int, schedule: str, min_ratio: float):
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_multiplier(s, total=total, warmup=warmup, schedule=schedule, min_ratio=min_ratio)
    )
