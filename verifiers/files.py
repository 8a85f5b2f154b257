"""Reading and writing the JSONL files of the command line, with every problem named by file and line.

Reading: :func:`jsonl_lines` yields each non-blank line's location (``FILE:LINE``) and object, or
the reason it is not one (invalid JSON, not an object, text that is not UTF-8), for the caller to
raise or skip. Writing: a file is written under a temporary name in its own folder and renamed into
place when complete (atomic on one file system), so readers see the old file or the new one, never
a torn one; a full disk is reported as such, naming the file.

Output paths: every command that writes (``rlvr eval --out``, ``rlvr verify --output``, ``rlvr
preferences --out``, ``rlvr verifiers audit --json``) checks where it will write before any work,
with :func:`check_output_file` or :func:`check_output_folder`, by the rules ``rlvr train`` applies to
its run folder: an earlier result there is refused unless ``--overwrite`` (then it is replaced when
the new one is complete), a file where a folder is wanted (or the reverse) is refused, missing parent
folders are created, and the folder must be writable.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import os
import shutil
from pathlib import Path
from typing import IO, Any, Iterator

from rlvr.verifiers.errors import UserError, invalid_text


def open_text(path: str | Path) -> IO[str]:
    """A UTF-8 text file (``.gz`` decompressed) whose undecodable bytes become lone surrogates, which
    :func:`~rlvr.verifiers.errors.invalid_text` then reports with their line, instead of a
    ``UnicodeDecodeError`` that names neither the file nor the line."""
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="surrogateescape")
    return open(path, encoding="utf-8", errors="surrogateescape")


def jsonl_lines(path: str | Path) -> Iterator[tuple[str, Any, str | None]]:
    """``(where, object, problem)`` for every non-blank line of a JSONL file: ``where`` is
    ``FILE:LINE``; ``problem`` is None for a usable JSON object, else why the line is not one
    (``object`` is then None)."""
    with open_text(path) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            text_problem = invalid_text(line)
            if text_problem:
                yield where, None, f"the line {text_problem}"
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                yield where, None, f"invalid JSON ({exc.msg} at column {exc.colno})"
                continue
            if not isinstance(value, dict):
                yield where, None, f"expected an object, got {type(value).__name__}"
                continue
            yield where, value, None


class OutputPathError(UserError):
    """A command's output path cannot be used as asked (taken, the wrong kind, not writable)."""


def check_output_file(path: str | Path, *, flag: str, overwrite: bool = False) -> Path:
    """The file a command will write, checked before any work (see the module docstring).

    Args:
        path: the file asked for.
        flag: the option that named it, for messages (``--output``).
        overwrite: an existing file may be replaced (when the new one is complete).
    """
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(f"{flag} {path} is a folder, not a file; name the file to write")
    if path.exists() and not overwrite:
        raise OutputPathError(f"{flag} {path} already exists; replace it with --overwrite, or choose another file "
                              f"with {flag}")
    _check_writable(path.parent, flag, path)
    return path


def check_output_folder(path: str | Path, outputs: tuple[str, ...], *, flag: str, holds: str,
                        overwrite: bool = False) -> Path:
    """The folder a command will write ``outputs`` (names at its top) into, checked and created before
    any work (see the module docstring); other files in it are left alone.

    Args:
        path: the folder asked for.
        outputs: what the command writes there.
        flag: the option that named it, for messages (``--out``).
        holds: what a folder holding any of ``outputs`` holds, for messages ("an evaluation").
        overwrite: earlier outputs may be replaced (when the new ones are complete).
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{flag} {path} is a file, not a folder; choose another folder with {flag}")
    present = [name for name in outputs if (path / name).exists()] if path.is_dir() else []
    if present and not overwrite:
        raise OutputPathError(f"{flag} {path} already holds {holds} ({', '.join(present)}); replace it with "
                              f"--overwrite, or choose another folder with {flag}")
    _check_writable(path, flag, path)
    return path


def ensure_writable(folder: Path) -> None:
    """Create ``folder`` (and its parents) and prove a file can be written in it; an OSError says why not
    (:func:`describe_os_error` turns it into a reason)."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".write_test_{os.getpid()}"
    probe.write_text("")
    probe.unlink()


def _check_writable(folder: Path, flag: str, target: Path) -> None:
    try:
        ensure_writable(folder)
    except OSError as exc:
        raise OutputPathError(f"{flag} {target}: cannot write to {folder}: {describe_os_error(exc, folder)}; "
                              f"choose another path with {flag}") from exc


def describe_os_error(exc: OSError, folder: Path | None = None) -> str:
    """A short reason for a failed write: the disk is full, no permission, a file in the way, or the
    system's message."""
    if exc.errno == errno.ENOSPC:
        return "no space left on the disk"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.EROFS:
        return "read-only file system"
    if exc.errno in (errno.ENOTDIR, errno.EEXIST) and folder is not None:
        blocker = next((p for p in [folder, *folder.parents] if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            return f"{blocker} is a file, not a folder"
    return exc.strerror or str(exc)


class DiskFullError(UserError, OSError):
    """A write ran out of disk space; the message names the file (anything written before is intact)."""


@contextlib.contextmanager
def atomic_writer(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """``with atomic_writer(p) as f: f.write(...)``: ``p`` appears only if the block finishes."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, mode, encoding=encoding if "b" not in mode else None) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise DiskFullError(f"disk full while writing {path}: free some space and run again") from exc
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_writer`)."""
    with atomic_writer(path) as f:
        f.write(text)


def is_disk_full(exc: BaseException, folder: str | Path) -> bool:
    """Whether ``exc`` came from a full disk: an ENOSPC anywhere in its chain, or (for writers such
    as torch.save and safetensors, which report it as "unexpected pos ..." without the errno) less
    than 16 MiB left on the file system of ``folder``."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return True
        seen = seen.__cause__ or seen.__context__
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free < 16 * 2**20
    except OSError:
        return False
