"""Where a run writes: one folder per run, never shared by accident.

Two runs that wrote into one folder used to mix silently (the second appended to the first's
``metrics.jsonl``, pruned its checkpoints, and a later ``--resume`` loaded the wrong weights). So:

* no ``out`` given: a new folder ``runs/<name>-<YYYYmmdd-HHMMSS>`` (suffixed ``-2``, ``-3`` ... if taken);
* ``out`` holds a run (any of :data:`RUN_FILES`): refused, unless the run is resumed (``--resume``)
  or replaced (``--overwrite``, which deletes exactly those files and nothing else);
* other files in ``out`` are left alone (the quickstart keeps its ``base_model/`` and ``sft/`` there);
* ``out`` must be writable, checked before any model is loaded.

The recipes print the folder on their first line of output.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from rlvr.verifiers.errors import UserError
from rlvr.verifiers.files import describe_os_error, ensure_writable

#: What a run writes at the top of its folder; any of them means "this folder holds a run".
RUN_FILES = ("config.yaml", "metrics.jsonl", "metrics.png", "summary.json", "checkpoints", "final", "tensorboard")


class RunFolderError(UserError):
    """The run folder cannot be used as asked (taken, not writable, nothing to resume)."""


def default_run_folder(name: str, root: str | Path = "runs") -> Path:
    """A folder that does not exist yet: ``runs/<name>-<timestamp>``."""
    base = Path(root) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, k = base, 2
    while path.exists():
        path, k = base.with_name(f"{base.name}-{k}"), k + 1
    return path


def run_files(path: Path, outputs: tuple[str, ...] = RUN_FILES) -> list[str]:
    """The run outputs present in ``path`` (empty for a fresh folder)."""
    return [name for name in outputs if (path / name).exists()] if path.is_dir() else []


def prepare_run_folder(out: str | Path | None, *, name: str, resume: bool = False, overwrite: bool = False,
                       outputs: tuple[str, ...] = RUN_FILES) -> Path:
    """Check (and create) the folder a run writes to; see the module docstring for the rules.

    Args:
        out: the folder asked for, or None for a new timestamped one.
        name: the run's kind, for the default folder's name (``grpo``, ``sft``).
        resume: the run continues from a checkpoint in ``out``, which must then hold a run.
        overwrite: delete a previous run's files from ``out`` first.
        outputs: the names a run writes at the top of its folder (the quickstart adds its stages').
    """
    if resume and overwrite:
        raise RunFolderError("--resume and --overwrite contradict each other: resume keeps the run, overwrite deletes it")
    if out is None:
        if resume:
            raise RunFolderError("--resume needs the run folder to continue")
        path = default_run_folder(name)
    else:
        path = Path(out)
    if path.exists() and not path.is_dir():
        raise RunFolderError(f"run folder {path} is a file, not a folder; choose another --out")
    present = run_files(path, outputs)
    if resume:
        if not present:
            raise RunFolderError(f"--resume {path}: no run there to continue (no {', '.join(outputs[:2])}); "
                                 "start it without --resume")
    elif present:
        if not overwrite:
            raise RunFolderError(
                f"run folder {path} already holds a run ({', '.join(present)}); continue it with --resume {path}, "
                "replace it with --overwrite, or choose another folder with --out")
        for item in present:
            target = path / item
            shutil.rmtree(target) if target.is_dir() else target.unlink()
    _check_writable(path)
    return path


def _check_writable(path: Path) -> None:
    try:
        ensure_writable(path)
    except OSError as exc:
        raise RunFolderError(f"cannot write to run folder {path}: {describe_os_error(exc, path)}; choose another "
                             "--out") from exc
