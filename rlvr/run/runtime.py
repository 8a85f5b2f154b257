"""Devices, seeds, RNG state (for exact resume), optimizer and learning-rate schedule, and the ranks of a
data-parallel run (``init_distributed``)."""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass
from typing import Any

import torch

from rlvr.verifiers.errors import InvalidValueError


def resolve_device(name: str, field: str = "train.device") -> torch.device:
    """``auto`` -> cuda when available, else cpu; anything else is passed to ``torch.device``.
    A device this machine does not have is a user error naming ``field``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise InvalidValueError(f"{field}: {name!r} is not a device; use cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidValueError(f"{field}={name}, but this machine has no CUDA device (torch {torch.__version__} sees "
                                "none); use cpu or auto")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise InvalidValueError(f"{field}={name}, but this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


_auto_threads: int | None = None


def busy_cores(window_s: float) -> float | None:
    """How many cores other work kept busy over the next ``window_s`` seconds (this process sleeps
    meanwhile), from the kernel's CPU time counters in ``/proc/stat``; None where there are none.

    Time stolen by the hypervisor counts as busy: on a shared VM it is a neighbour using the core.
    """

    def counters() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
        return fields[3] + fields[4], sum(fields)

    try:
        idle_before, total_before = counters()
        time.sleep(window_s)
        idle_after, total_after = counters()
    except (OSError, ValueError, IndexError):
        return None
    if total_after <= total_before:
        return None
    idle_share = (idle_after - idle_before) / (total_after - total_before)
    return (os.cpu_count() or 1) * min(1.0, max(0.0, 1.0 - idle_share))


def auto_threads() -> int:
    """Threads for the cores nobody else is using, decided once per process.

    Measured on the 2-core machines (quickstart step): a second thread makes a step 1.5x faster
    when the machine is idle, but 5x *slower* when another process keeps a core busy, because
    every parallel op waits for the thread that shares a core. So a core counts as taken when other
    work keeps it more than 40% busy.

    "Busy" is measured now, over half a second of CPU counters, not read from the 1-minute load
    average alone: that average still remembers work that has ended (right after ``pip install``
    it reads ~0.8 on an idle machine, which cost the README's quickstart its second thread). When
    the two disagree, a further 2-second look decides, and the busier reading wins, so work that
    pauses for a moment still counts. Without ``/proc/stat`` the load average decides. Deciding at
    start, before this process adds its own load, keeps the choice stable for the whole run.
    """
    global _auto_threads
    if _auto_threads is None:
        cores = os.cpu_count() or 1
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        busy = busy_cores(0.5)
        if busy is not None and load - busy > 0.5:
            again = busy_cores(2.0)
            busy = max(busy, again) if again is not None else None
        other = load if busy is None else busy
        _auto_threads = max(1, min(cores, cores - math.ceil(other - 0.4)))
        print(f"threads: auto -> {_auto_threads} ({other:.2f} of {cores} cores busy with other work; "
              f"load average {load:.2f})")
    return _auto_threads


def set_threads(threads: int | str | None) -> None:
    """Pin torch's CPU thread count: a number, ``"auto"`` (see :func:`auto_threads`), or None for
    torch's default (one per core)."""
    if threads == "auto":
        threads = auto_threads()
    if threads is not None:
        torch.set_num_threads(int(threads))


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
    # The fused implementation updates every tensor in one kernel (what transformers' Trainer, and so
    # TRL, use by default): 0.6 ms against 2.2 ms for the per-tensor loop on the 1M-parameter bench
    # model. Same update up to float rounding.
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas, fused=True)


def optimizer_step(params, optimizer: torch.optim.Optimizer, scheduler, grad_clip: float) -> float:
    """Clip the gradients of ``params`` to a global norm of ``grad_clip``, step the optimizer and the schedule;
    returns the norm before clipping."""
    norm = full_norm(torch.nn.utils.clip_grad_norm_(params, grad_clip))
    optimizer.step()
    scheduler.step()
    return norm


def full_norm(norm: torch.Tensor) -> float:
    """A gradient norm as a float (over a sharded model: the norm of the whole gradient)."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


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


def optimizer_from_config(params, optim, total: int, *, lr: float | None = None, schedule: str | None = None):
    """``(optimizer, scheduler)``: AdamW over ``params`` and its schedule over ``total`` steps, from an
    ``OptimConfig`` section; ``lr`` and ``schedule`` replace the section's (e.g. for PPO's critic)."""
    optimizer = build_optimizer(params, lr=lr or optim.lr, weight_decay=optim.weight_decay, betas=optim.betas)
    scheduler = build_scheduler(optimizer, total=total, warmup=optim.warmup_steps, schedule=schedule or optim.schedule,
                                min_ratio=optim.min_lr_ratio)
    return optimizer, scheduler


# ---------------------------------------------------------------------------------------------
# Data-parallel runs (torchrun): the one place that knows about ranks
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Distributed:
    """This process's place in a data-parallel run; a single process is rank 0 of 1, and every
    method is then a no-op, so the recipes call them unconditionally.

    Each rank holds a full copy of the model, takes whole groups of the step's prompts, and
    accumulates its gradients locally over any number of micro-batches (ranks may compute different
    numbers of rows: zero-advantage rows are skipped); :meth:`sum_gradients` then adds them across
    ranks once per optimizer step. Losses are normalised by global counts (:meth:`sum`), so the
    summed gradient is the gradient of the whole batch's loss, for every aggregation mode.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, value: float) -> float:
        """``value`` added over all ranks."""
        if self.world_size == 1:
            return value
        tensor = torch.tensor([float(value)], dtype=torch.float64, device=collective_device())
        torch.distributed.all_reduce(tensor)
        return float(tensor.item())

    def sum_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (a few statistics) added over all ranks, returned on its own device."""
        if self.world_size == 1:
            return tensor
        summed = tensor.detach().to(collective_device(), copy=True)
        torch.distributed.all_reduce(summed)
        return summed.to(tensor.device)

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Add every parameter's gradient over all ranks (one collective, a flat buffer)."""
        if self.world_size == 1:
            return
        for p in params:
            if p.grad is None:  # a rank that computed no row this step still takes part
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        torch.distributed.all_reduce(flat)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
            offset += p.numel()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self.world_size == 1:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.world_size > 1:
            torch.distributed.barrier()


def collective_device() -> torch.device:
    """Where a bookkeeping collective's tensor must live for the default process group: the CPU when the
    group has a CPU backend (every group rlvr makes, :func:`process_group_backend`), else the group's
    own device (a group made elsewhere as plain ``"nccl"``: the current GPU)."""
    types = [d.type for d in torch.distributed.distributed_c10d._get_default_group()._device_types]
    if not types or "cpu" in types:
        return torch.device("cpu")
    return torch.device(types[0], torch.cuda.current_device()) if types[0] == "cuda" else torch.device(types[0])


def process_group_backend(device: torch.device) -> str:
    """The backend map of a run's process group on ``device``: gloo for CPU tensors always, and NCCL for
    CUDA tensors on a GPU.

    A group made as plain ``"nccl"`` has no backend for CPU tensors, and rlvr's bookkeeping collectives
    (:meth:`Distributed.sum` of counts, the lockstep pass count, the Ctrl-C vote, the object gathers of
    metrics and RNG states) hold a few CPU numbers: each would fail with "No backend type associated
    with device type cpu". With both in the map every collective finds a backend for its tensor's
    device, by construction: gradients and FSDP2's all-gathers (CUDA) go through NCCL, the bookkeeping
    (a few bytes) through gloo, and object collectives pick the CPU (``_get_object_coll_device``)."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def init_distributed(device: str = "auto") -> Distributed:
    """Join the run ``torchrun`` started (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` in the environment):
    one GPU per local rank, a process group with gloo for CPU tensors and, on GPUs, NCCL for CUDA
    tensors (:func:`process_group_backend`). Without torchrun: a single process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    resolved = resolve_device(device)
    if world_size == 1:
        return Distributed(device=resolved)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if resolved.type == "cuda":
        resolved = torch.device("cuda", local_rank)
        torch.cuda.set_device(resolved)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(process_group_backend(resolved))
    return Distributed(rank=rank, local_rank=local_rank, world_size=world_size, device=resolved)
