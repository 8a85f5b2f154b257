"""Writing result files so that a crash or a full disk never leaves half of one behind.

A file is written under a temporary name in its own folder and renamed into place when complete
(atomic on one file system): readers see the old file or the new one, never a torn one. A full
disk is reported as such, naming the file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import IO, Iterator

from rlvr.verifiers.errors import UserError


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
