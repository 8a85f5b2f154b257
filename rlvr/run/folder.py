"""Where a run writes: one folder per run, never shared by accident, and never lost to a start that fails.

Two runs that wrote into one folder used to mix silently (the second appended to the first's
``metrics.jsonl``, pruned its checkpoints, and a later ``--resume`` loaded the wrong weights). So:

* no ``out`` given: a new folder ``runs/<name>-<YYYYmmdd-HHMMSS>`` (suffixed ``-2``, ``-3`` ... if taken);
* ``out`` holds a run (any of :data:`RUN_FILES`): refused, unless the run is resumed (``--resume``)
  or replaced (``--overwrite``, which replaces exactly those files and nothing else);
* other files in ``out`` are left alone (the quickstart keeps its ``base_model/`` and ``sft/`` there);
* ``out`` must be writable, checked before any model is loaded.

A start can still fail after the folder is checked: a model path, a data file, an option or a device
found wrong while the run is built, or a Ctrl-C during start-up. Such a start must cost nothing, so
:class:`RunFolder` writes nothing until the run has been built (:meth:`RunFolder.begin`, when the
recipe restores or writes ``config.yaml``), and a start that ends before its first training step is
undone (:meth:`RunFolder.abandon`): what it wrote is removed, a folder it created is removed again,
and the run that ``--overwrite`` was replacing, moved aside to ``.previous-run/`` at ``begin``, is put
back. The replaced run is deleted only when the new one has trained its first step
(:meth:`RunFolder.keep`). The corrected command then runs in the same folder as if nothing happened.

The recipes print the folder on their first line of output.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlvr.verifiers.errors import UserError
from rlvr.verifiers.files import describe_os_error, ensure_writable

#: What a run writes at the top of its folder; any of them means "this folder holds a run".
RUN_FILES = ("config.yaml", "metrics.jsonl", "metrics.png", "summary.json", "checkpoints", "final", "final_critic",
             "tensorboard", "completions.jsonl")
#: Where ``--overwrite`` keeps the run it replaces until the new run has trained a step.
PREVIOUS_RUN = ".previous-run"


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


@dataclass
class RunFolder:
    """A run folder a start has claimed: its ``path``, what the start found there, and the three moments
    of a start (see the module docstring): :meth:`begin` (the run is built and writes its first file),
    :meth:`keep` (its first step is done) and :meth:`abandon` (it ended before that). Only the process
    that ``owns`` the folder (rank 0) touches files; on the other ranks the calls do nothing."""

    path: Path
    created: bool = False  # this start made the folder (an abandoned start removes it again if empty)
    resume: bool = False  # a resumed run: its folder is the run's own, nothing is moved or removed
    replacing: list[str] = field(default_factory=list)  # the previous run's files that --overwrite replaces
    outputs: tuple[str, ...] = RUN_FILES
    owns: bool = True
    state: str = "claimed"  # claimed -> begun -> kept, or -> abandoned

    def begin(self) -> None:
        """The run writes its first file: the run it replaces moves aside to ``.previous-run/``."""
        if self.state != "claimed":
            return
        self.state = "begun"
        if not self.owns or not self.replacing:
            return
        aside = self.path / PREVIOUS_RUN
        _remove(aside)  # a replaced run left there by a start that was killed (SIGKILL) before its first step
        aside.mkdir()
        for name in self.replacing:
            (self.path / name).rename(aside / name)

    def keep(self) -> None:
        """The new run trained a step: it is the folder's run now, and the one it replaced is deleted."""
        if self.state == "kept":
            return
        self.begin()
        self.state = "kept"
        if self.owns:
            _remove(self.path / PREVIOUS_RUN)

    def abandon(self) -> None:
        """The start ended before a training step: remove what it wrote and put back the run it was
        replacing (a resumed run's folder is left as it is: nothing was moved)."""
        if self.state in ("kept", "abandoned"):
            return
        begun, self.state = self.state == "begun", "abandoned"
        if not self.owns or self.resume:
            return
        if begun or not self.replacing:  # before begin the previous run was never touched
            for name in run_files(self.path, self.outputs):
                _remove(self.path / name)
        aside = self.path / PREVIOUS_RUN
        if aside.is_dir() and self.replacing:
            for name in self.replacing:
                if (aside / name).exists():
                    (aside / name).rename(self.path / name)
            _remove(aside)
        if self.created and self.path.is_dir() and not any(self.path.iterdir()):
            self.path.rmdir()


def prepare_run_folder(out: str | Path | None, *, name: str, resume: bool = False, overwrite: bool = False,
                       outputs: tuple[str, ...] = RUN_FILES) -> RunFolder:
    """Check the folder a run writes to and claim it (creating it if needed); see the module docstring for
    the rules. Nothing of a previous run is touched here: ``--overwrite`` replaces it at
    :meth:`RunFolder.begin` and deletes it at :meth:`RunFolder.keep`.

    Args:
        out: the folder asked for, or None for a new timestamped one.
        name: the run's kind, for the default folder's name (``grpo``, ``sft``).
        resume: the run continues from a checkpoint in ``out``, which must then hold a run.
        overwrite: replace a previous run's files in ``out``.
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
    elif present and not overwrite:
        kept = (f"; the run it was replacing when a start was killed is in {path / PREVIOUS_RUN}"
                if (path / PREVIOUS_RUN).is_dir() else "")
        raise RunFolderError(
            f"run folder {path} already holds a run ({', '.join(present)}); continue it with --resume {path}, "
            f"replace it with --overwrite, or choose another folder with --out{kept}")
    created = not path.exists()
    _check_writable(path)
    return RunFolder(path, created=created, resume=resume, replacing=[] if resume else present, outputs=outputs)


def _remove(target: Path) -> None:
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()


def _check_writable(path: Path) -> None:
    try:
        ensure_writable(path)
    except OSError as exc:
        raise RunFolderError(f"cannot write to run folder {path}: {describe_os_error(exc, path)}; choose another "
                             "--out") from exc
