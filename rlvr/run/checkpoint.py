"""Atomic checkpoints a run can resume from.

A checkpoint is a folder ``checkpoints/step_NNNNNN/`` holding one folder per model (``model/`` for
the policy: a loadable Hugging Face folder, full weights as safetensors or peft adapters; ``critic/``
for PPO's critic, ...) and ``trainer_state.pt`` (the state of every optimizer, scheduler, data
sampler, ... by name, RNG states, step). A sharded run's models and optimizers are under
``sharded/`` instead (:mod:`rlvr.run.sharded_checkpoint`), written by every rank into the temporary
folder first. It is written under a temporary name and renamed into place, so a crash leaves either
the previous checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import torch

from rlvr.run.folder import RunFolderError
from rlvr.run.runtime import rng_state, set_rng_state
from rlvr.verifiers.files import DiskFullError, is_disk_full

_STEP_DIR = re.compile(r"^step_(\d{6,})$")


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    models: dict[str, Any],
    tokenizer,
    states: dict[str, Any],
    extra: dict[str, Any],
    keep: int = 1,
    started: bool = False,
) -> Path:
    """Write checkpoint ``step`` atomically and prune all but the newest ``keep``.

    ``models`` maps a name to an object with ``save_pretrained(folder)`` or ``save(folder)``; the
    policy is named ``policy`` and saved under ``model/`` (with the tokenizer), any other under its
    own name. ``states`` maps a name to an object with ``state_dict()`` (optimizers, schedulers, the
    problem sampler, ...): :func:`restore_states` loads them back by the same names. ``extra`` holds
    plain values (wall time, evaluations). ``started``: the temporary folder (:func:`temporary_folder`)
    already holds the sharded part of this checkpoint.
    """
    root = checkpoint_root(run_dir)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}" if started else temporary_folder(run_dir, step)
    state = {
        "step": step,
        "rng": rng_state(),
        **{name: obj.state_dict() for name, obj in states.items()},
        **extra,
    }
    try:
        for name, model in models.items():
            folder = tmp / model_folder(name)
            (model.save_pretrained if hasattr(model, "save_pretrained") else model.save)(folder)
        tokenizer.save_pretrained(tmp / model_folder("policy"))
        torch.save(state, tmp / "trainer_state.pt")
    except (OSError, RuntimeError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # frees the space the partial copy took
        if is_disk_full(exc, root):
            previous = list_checkpoints(run_dir)
            kept = f"the previous checkpoint {previous[-1].name} is intact" if previous else "no earlier checkpoint exists"
            raise DiskFullError(f"disk full while writing checkpoint {final} ({kept}); free some space and "
                                f"continue with --resume {Path(run_dir)}") from exc
        raise
    if final.exists():  # the same step saved again (e.g. end of a resumed run)
        shutil.rmtree(final)
    tmp.rename(final)  # atomic on one file system
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def temporary_folder(run_dir: str | Path, step: int) -> Path:
    """The empty folder checkpoint ``step`` is written into before it is renamed into place."""
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    return tmp


def model_folder(name: str) -> str:
    """The folder of model ``name`` inside a checkpoint: ``model`` for the policy, else the name."""
    return "model" if name == "policy" else name


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / "trainer_state.pt").is_file()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def resume_checkpoint(run_dir: str | Path) -> Path:
    """The checkpoint ``--resume`` continues from: the latest complete one, or a user error."""
    found = latest_checkpoint(run_dir)
    if found is None:
        raise RunFolderError(f"--resume {run_dir}: no complete checkpoint under {checkpoint_root(run_dir)} (a run "
                             "saves one every checkpoint.every steps); start it again with --overwrite")
    return found


def load_trainer_state(checkpoint: str | Path) -> dict[str, Any]:
    return torch.load(Path(checkpoint) / "trainer_state.pt", map_location="cpu", weights_only=True)


def restore_states(checkpoint: str | Path, states: dict[str, Any]) -> dict[str, Any]:
    """Load a checkpoint's saved states into ``states`` (by the names they were saved under) and the
    RNG streams; returns the whole trainer state (``step``, and the ``extra`` values)."""
    state = load_trainer_state(checkpoint)
    missing = [name for name in states if name not in state]
    if missing:
        raise RunFolderError(f"checkpoint {checkpoint} holds no state for {', '.join(missing)} (it was written by "
                             "a different recipe); start the run again with --overwrite")
    for name, obj in states.items():
        obj.load_state_dict(state[name])
    set_rng_state(state["rng"])
    return state
