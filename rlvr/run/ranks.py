"""What a recipe does differently in a data-parallel run (``torchrun --nproc-per-node N -m rlvr train``).

Each rank holds a full copy of the model and trains on its own whole groups (see
:class:`rlvr.rollout.sampler.RankSampler`); ``update.py`` sums the gradients. Everything that touches the run
folder happens on rank 0 only: preparing it (the path is broadcast), the config, metrics (reduced over
ranks first, :func:`reduce_metrics`), plots, evaluation, checkpoints (with every rank's RNG and
sampler state gathered in), the final model and the summary. On one process every helper here does
exactly what the recipes did before.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

from rlvr.config.compatibility import check_compatibility
from rlvr.run.checkpoint import restore_states, save_checkpoint, temporary_folder
from rlvr.run.folder import RunFolder, RunFolderError, prepare_run_folder
from rlvr.run.runtime import (Distributed, init_distributed, quiet_transformers, rng_state, seed_everything,
                              set_rng_state, set_threads)
from rlvr.run.sharded_checkpoint import SHARDED, ShardedParts
from rlvr.run.sharding import is_sharded, lockstep_passes
from rlvr.run.tracking import Tracker
from rlvr.verifiers.errors import InvalidValueError

#: Metrics added over ranks (counts, throughput, and losses each rank holds a part of: its numerator
#: over the global denominators); ``time/`` takes the slowest rank; everything else is the mean of
#: the ranks that logged it (rates and means over equal-sized rank batches).
SUMMED = ("train/loss", "train/pg_loss", "critic/value_loss", "rollout/dropped_groups", "perf/tokens_per_s",
          "proxy/ranked_pairs")
SUMMED_PREFIXES = ("verify/status_",)
MAX_PREFIXES = ("time/",)


def join_run(config, name: str, *, resume: bool = False, overwrite: bool = False, check=None):
    """The start every recipe shares, on one process or under torchrun: join the ranks, ``check`` the
    world size, claim the run folder (``config.out`` or ``runs/<name>-<timestamp>``) on rank 0 and
    broadcast its path, seed, set threads. Returns ``(config with out set, folder, dist)``: ``folder`` is
    a :class:`rlvr.run.folder.RunFolder` that only rank 0 acts on. The ``when="start"`` rules of
    :mod:`rlvr.config.compatibility` (several ranks, the device) are checked before the folder is claimed."""
    quiet_transformers()
    dist = init_distributed(config.train.device)
    # the features that do not combine with this world size or device: refused before the folder is claimed
    check_compatibility(config, "start", world_size=dist.world_size, device=dist.device)
    if check is not None:
        check(dist.world_size)
    error, folder = None, None
    if dist.is_main:
        try:
            folder = prepare_run_folder(config.out, name=name, resume=resume, overwrite=overwrite)
        except RunFolderError as exc:
            error = str(exc)
    error, run_dir = dist.broadcast((error, None if folder is None else folder.path))
    if error is not None:
        raise RunFolderError(error)
    if folder is None:  # another rank's view: the same folder, whose files rank 0 handles
        folder = RunFolder(Path(run_dir), resume=resume, owns=False)
    config = config.model_copy(update={"out": str(run_dir)})
    if dist.is_main:
        ranks = f", {dist.world_size} ranks" if dist.world_size > 1 else ""
        print(f"run folder: {run_dir}" + (" (resuming)" if resume else "") + ranks, flush=True)
    seed_everything(config.train.seed)  # the same on every rank until the models are built
    set_threads(config.train.threads)
    return config, folder, dist


def backward_on_share(batch: list, micro_batch_size: int, loss_of, model, dist: Distributed) -> dict[str, float]:
    """The backward pass of one optimizer step of the pair recipes (reward model, DPO), on one process or
    several: this rank takes every world-size-th example of ``batch`` (the whole batch, the same on
    every rank), runs ``loss_of(micro_batch) -> (mean loss, stats)`` over it in micro-batches, each
    weighted by its share of the *whole* batch, and sums the gradients of ``model`` and the stats
    across ranks. A sharded model's ranks make as many passes as the busiest one (zero-weight
    repeats of their first micro-batch) and FSDP2 sums the gradients. Returns the step's stats,
    means over the whole batch."""
    mine = batch[dist.rank :: dist.world_size]
    starts = list(range(0, len(mine), micro_batch_size))
    passes = lockstep_passes(model, len(starts))
    sums: dict[str, float] = {}
    for index in range(passes):
        mb = mine[starts[index] : starts[index] + micro_batch_size] if index < len(starts) else mine[:1]
        weight = len(mb) / len(batch) if index < len(starts) else 0.0
        loss, stats = loss_of(mb)
        (loss * weight).backward()
        for key, value in stats.items():
            sums[key] = sums.get(key, 0.0) + value * weight
    if not is_sharded(model):  # FSDP2 summed them in the backward
        dist.sum_gradients([p for p in model.parameters() if p.requires_grad])
    if dist.world_size == 1:
        return sums
    out: dict[str, float] = {}
    for part in dist.gather(sums):  # a rank with no example this step holds no key
        for key, value in part.items():
            out[key] = out.get(key, 0.0) + value
    return out


def check_world_size(config, world_size: int) -> None:
    """Every rank takes ``prompts_per_step / world_size`` whole groups: the division must be exact. (What
    does not combine with several ranks is the compatibility table's, checked by :func:`join_run`.)"""
    train, algorithm = config.train, config.algorithm
    if train.prompts_per_step % world_size:
        raise InvalidValueError(f"train.prompts_per_step={train.prompts_per_step} is not divisible by the "
                                f"{world_size} ranks of this run; use a multiple of {world_size}")
    if algorithm.minibatches > train.prompts_per_step // world_size:
        raise InvalidValueError(f"algorithm.minibatches ({algorithm.minibatches}) cannot exceed train.prompts_per_step "
                                f"per rank ({train.prompts_per_step // world_size} on {world_size} ranks)")


def sharded_run(train, dist: Distributed) -> bool:
    """Whether this run's models are FSDP2-sharded: ``train.strategy: fsdp2`` on several ranks (one
    process has nothing to shard and runs as ``ddp``). CPU offload without CUDA was refused by
    :func:`join_run` (the compatibility table)."""
    shard = train.strategy == "fsdp2" and dist.world_size > 1
    if dist.is_main and shard:
        print(f"strategy: fsdp2, every parameter, gradient and optimizer state sharded over {dist.world_size} ranks",
              flush=True)
    return shard


def seed_ranks(seed: int, dist: Distributed) -> None:
    """Give each rank its own sampling RNG (seed + rank), after the models are built alike; one process
    keeps its stream as it is."""
    if dist.world_size > 1:
        seed_everything(seed + dist.rank)


def open_tracker(config, run_dir: Path, dist: Distributed):
    """The metrics tracker on rank 0; on the other ranks one that writes nothing."""
    if not dist.is_main:
        return _Silent(run_dir / "metrics.jsonl")
    return Tracker.for_run(run_dir, config)


class _Silent:
    def __init__(self, path: Path):
        self.path = path

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def truncate(self, step: int) -> None:
        pass

    def close(self) -> None:
        pass


def restore_run_states(checkpoint: Path, states: dict[str, Any], dist: Distributed, sampler, *, seed: int,
                       models: dict[str, Any] | None = None) -> dict:
    """Load a checkpoint's ``states`` (the optimizers of sharded ``models`` from their shards) and give
    each rank back its own RNG and data position; returns the whole trainer state (``step`` and the
    plain values saved with it)."""
    sharded = ShardedParts.in_checkpoint(checkpoint, models or {}, states)  # an fsdp2 run's, on any world size
    sharded.load_optimizers(checkpoint)
    state = restore_states(checkpoint, {name: s for name, s in states.items() if name not in sharded.optimizers})
    restore_rank_state(state.get("ranks") or [{"rng": state["rng"], "sampler": None}], dist, sampler, seed,
                       state["step"])
    return state


def restore_rank_state(saved: list[dict[str, Any]], dist: Distributed, sampler, seed: int, step: int) -> None:
    """Each rank takes back its own RNG and sampler state from a checkpoint of as many ranks. With a
    different number, the data split and the sampling RNG streams change (a one-line warning): every
    rank continues from rank 0's data position and draws from a fresh stream (seed + rank + step)."""
    if len(saved) == dist.world_size:
        set_rng_state(saved[dist.rank]["rng"])
        if sampler is not None:
            sampler.load_state_dict(saved[dist.rank]["sampler"])
        return
    if sampler is not None:
        sampler.load_state_dict(saved[0]["sampler"])
    seed_everything(seed + dist.rank + 1_000_003 * step)
    if dist.is_main:
        print(f"warning: resuming a {len(saved)}-rank checkpoint on {dist.world_size} ranks: the problems continue "
              "from rank 0's position but split differently, and the sampling RNG streams restart, so the run will "
              "not repeat an uninterrupted one", flush=True)


def save_run_checkpoint(run_dir: Path, step: int, *, dist: Distributed, sampler, extra: dict[str, Any],
                        models: dict[str, Any], states: dict[str, Any], **kwargs) -> None:
    """Gather every rank's RNG and sampler state (a collective: every rank calls this), let every rank
    write its shards of the sharded models and optimizers, and write the rest of the checkpoint on
    rank 0 (``kwargs``: those of :func:`rlvr.run.checkpoint.save_checkpoint`)."""
    ranks = dist.gather({"rng": rng_state(), "sampler": sampler.state_dict() if sampler is not None else None})
    sharded = ShardedParts.of(models, states)
    if sharded:
        tmp = dist.broadcast(temporary_folder(run_dir, step) if dist.is_main else None)
        sharded.save(tmp / SHARDED)  # every rank its own shards; rank 0 the metadata, after all wrote
        models = {name: model for name, model in models.items() if name not in sharded.models}
        states = {name: state for name, state in states.items() if name not in sharded.optimizers}
    if dist.is_main:
        save_checkpoint(run_dir, step, extra={**extra, "ranks": ranks}, models=models, states=states,
                        started=bool(sharded), **kwargs)


def reduce_metrics(metrics: dict[str, float], dist: Distributed) -> dict[str, float]:
    """One step's metrics over all ranks (one collective): sums for counts, throughput and split losses
    (:data:`SUMMED`), the maximum for times, the mean over the ranks that logged a key for the rest."""
    if dist.world_size == 1:
        return metrics
    per_rank = dist.gather(metrics)
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for m in per_rank for k in m):
        values = [m[key] for m in per_rank if key in m and m[key] is not None]
        if not values:
            continue
        if key in SUMMED or key.startswith(SUMMED_PREFIXES):
            out[key] = float(sum(values))
        elif key.startswith(MAX_PREFIXES):
            out[key] = float(max(values))
        else:
            out[key] = float(sum(values)) / len(values)
    return out


def weights_checksum(*models) -> str:
    """A digest of the parameters and buffers of ``models``, equal only for bit-identical weights."""
    digest = hashlib.sha256()
    for model in models:
        for name, tensor in sorted(model.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def replica_check(dist: Distributed, *models) -> dict[str, Any]:
    """Every rank's digest of ``models`` (the policy, and PPO's critic) for the summary of a multi-rank
    run: the replicas must be identical, and rank 0 warns when they are not. Empty on one process."""
    if dist.world_size == 1:
        return {}
    checksums = dist.gather(weights_checksum(*models))
    if dist.is_main and len(set(checksums)) > 1:
        print(f"warning: the ranks' final weights differ ({checksums}); only rank 0's were saved", flush=True)
    return {"world_size": dist.world_size, "weights_checksums": checksums}
