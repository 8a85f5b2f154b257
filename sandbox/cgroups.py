"""Aggregate memory and process caps for a sandbox slot, through cgroups (v1 or v2).

Per-process rlimits cannot cap a run that forks (six children at 1.5 GiB each pass a 2 GiB
RLIMIT_AS) and RLIMIT_NPROC counts per user, so the caps that matter live here. Creating a cgroup
and moving a process into it costs ~20 ms, far more than a run should, so each *slot* gets one
cgroup for its lifetime: the slot's zygote is moved in once, and every run it forks is born
inside (no per-run migration). Runs of a slot are sequential, so the cgroup caps one run at a
time; between runs the zygote's own baseline is added to the memory limit.

Everything is created below this process's own cgroup in each hierarchy (nested limits of the
machine still apply), in a directory named ``rlvr-sandbox-<pid>-<random>-s<start time>`` (the
owner's pid and its start time in clock ticks since boot, from /proc/<pid>/stat) that is removed
at close. A tree left behind by an owner that died without cleaning up (SIGKILL, ``os._exit``) is
removed by the next pool that starts below the same cgroup, once it holds no process: its owner
is dead when no process has that pid, or when the process that has it now started at another
time (pids are reused: pid_max is 32768 on these machines).

Works with the v1/v2 mix these machines have (v1 memory and pids controllers, a v2 hierarchy
without controllers) and with a pure v2 machine where the memory and pids controllers can be
delegated to our cgroup.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "rlvr-sandbox-"


@dataclass(frozen=True)
class Controller:
    """Where one controller can be used: cgroup ``version`` (1 or 2) and our own cgroup dir."""

    name: str
    version: int
    base: Path


def _own_cgroups() -> dict[str, str]:
    """Controller name (or "" for the v2 hierarchy) -> this process's cgroup path."""
    out: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            out[""] = path
        for c in controllers.split(","):
            out[c] = path
    return out


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of every cgroup mount."""
    out = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(rfields) >= 3 and rfields[0] in ("cgroup", "cgroup2"):
            out.append((fields[4], rfields[0], set(rfields[2].split(","))))
    return out


def _writable_dir(base: Path) -> bool:
    probe = base / f"{PREFIX}probe-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


def locate(names: tuple[str, ...] = ("memory", "pids")) -> dict[str, Controller]:
    """The controllers among ``names`` that this process may create child cgroups for."""
    own, found = _own_cgroups(), {}
    v2_mount = None
    for mountpoint, fstype, opts in _mounts():
        if fstype == "cgroup2":
            v2_mount = mountpoint
            continue
        for name in names:
            if name in opts and name in own and name not in found:
                base = Path(mountpoint + own[name])
                if base.is_dir() and _writable_dir(base):
                    found[name] = Controller(name, 1, base)
    if v2_mount is not None and "" in own:
        base = Path(v2_mount + own[""])
        try:
            available = (base / "cgroup.controllers").read_text().split()
            enabled = (base / "cgroup.subtree_control").read_text().split()
        except OSError:
            available, enabled = [], []
        for name in names:
            if name in found or name not in available:
                continue
            if name not in enabled:
                try:  # fails while processes live in our own cgroup ("no internal processes")
                    (base / "cgroup.subtree_control").write_text(f"+{name}")
                except OSError:
                    continue
            if _writable_dir(base):
                found[name] = Controller(name, 2, base)
    return found


def start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (None if there is no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the command name may hold spaces
    except (IndexError, ValueError):
        return None


def tree_name(pid: int) -> str:
    """The name of a new pool's cgroup tree: owner pid, a random part, owner start time."""
    start = start_time(pid)
    return f"{PREFIX}{pid}-{secrets.token_hex(4)}" + (f"-s{start}" if start is not None else "")


def tree_owner(name: str) -> tuple[int, int | None] | None:
    """(pid, start time or None) of the pool that made tree ``name``; None for other names.
    Names without a start time come from older versions of this module."""
    if not name.startswith(PREFIX) or name.startswith(PREFIX + "probe"):
        return None
    parts = name[len(PREFIX):].split("-")
    try:
        pid = int(parts[0])
        start = int(parts[2][1:]) if len(parts) > 2 and parts[2].startswith("s") else None
    except ValueError:
        return None
    return pid, start


def owner_alive(owner: tuple[int, int | None]) -> bool:
    """Whether the process that made a tree still runs (same pid and, when known, same start)."""
    pid, start = owner
    if not _pid_alive(pid):
        return False
    return start is None or start_time(pid) in (start, None)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _kill_and_remove(directory: Path) -> None:
    """SIGKILL every process in ``directory`` and its children cgroups, then remove them."""
    if not directory.is_dir():
        return
    for child in sorted(p for p in directory.iterdir() if p.is_dir()):
        _kill_and_remove(child)
    deadline = time.monotonic() + 2.0
    while True:
        kill_file = directory / "cgroup.kill"
        if kill_file.exists():
            try:
                kill_file.write_text("1")
            except OSError:
                pass
        try:
            pids = [int(p) for p in (directory / "cgroup.procs").read_text().split()]
        except OSError:
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            directory.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)


def _empty(directory: Path) -> bool:
    """True when no process lives in ``directory`` or any cgroup below it."""
    for procs in directory.rglob("cgroup.procs"):
        try:
            if procs.read_text().strip():
                return False
        except OSError:
            return False
    return True


def remove_stale(controllers: dict[str, Controller]) -> int:
    """Remove empty cgroup trees left by sandbox pools whose process is gone; returns how many.

    Never kills anything: a tree that still holds processes is left alone, since its owner may
    live in another pid namespace (and so only look dead from here). A dead owner's sandboxes die
    with it (bwrap --die-with-parent, the bare zygote's parent-death signal), so its tree is empty
    by the time we look."""
    removed = 0
    for ctl in controllers.values():
        try:
            entries = list(ctl.base.iterdir())
        except OSError:
            continue
        for entry in entries:
            owner = tree_owner(entry.name)
            if owner is None or not entry.is_dir():
                continue
            if not owner_alive(owner) and _empty(entry):
                _kill_and_remove(entry)  # nothing to kill: removes the empty directories
                removed += 1
    return removed


class SlotCgroup:
    """The memory and pids cgroups of one slot (the same directory on v2, two on v1)."""

    def __init__(self, dirs: dict[str, tuple[int, Path]]):
        self.dirs = dirs  # controller -> (version, directory)
        self._memory_limit: int | None = None
        self._pids_limit: int | None = None

    def _file(self, controller: str, v1: str, v2: str) -> Path | None:
        entry = self.dirs.get(controller)
        if entry is None:
            return None
        version, directory = entry
        return directory / (v1 if version == 1 else v2)

    def attach(self, pid: int) -> None:
        """Move process ``pid`` (not its existing children) into every cgroup of the slot."""
        for _, directory in {d for d in self.dirs.values()}:
            (directory / "cgroup.procs").write_text(str(pid))

    def set_limits(self, memory_bytes: int | None, pids: int | None) -> None:
        """Set the caps (bytes, count); a write happens only when a value changes."""
        if memory_bytes is not None and memory_bytes != self._memory_limit:
            path = self._file("memory", "memory.limit_in_bytes", "memory.max")
            if path is not None:
                path.write_text(str(memory_bytes))
                if self.dirs["memory"][0] == 2:
                    swap = path.with_name("memory.swap.max")
                    if swap.exists():
                        swap.write_text("0")
                self._memory_limit = memory_bytes
        if pids is not None and pids != self._pids_limit:
            path = self._file("pids", "pids.max", "pids.max")
            if path is not None:
                path.write_text(str(pids))
                self._pids_limit = pids

    def memory_usage(self) -> int | None:
        """Bytes charged to the slot now (None without a memory cgroup)."""
        path = self._file("memory", "memory.usage_in_bytes", "memory.current")
        try:
            return int(path.read_text()) if path else None
        except (OSError, ValueError):
            return None

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer has killed in the slot so far."""
        path = self._file("memory", "memory.oom_control", "memory.events")
        if path is None:
            return 0
        try:
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def destroy(self) -> None:
        for _, directory in {d for d in self.dirs.values()}:
            _kill_and_remove(directory)


class CgroupTree:
    """One pool's cgroup directories: ``<own cgroup>/rlvr-sandbox-<pid>-<hex>-s<start>/slot<k>``."""

    def __init__(self, controllers: dict[str, Controller]):
        self.controllers = controllers
        remove_stale(controllers)
        self.name = tree_name(os.getpid())
        self.roots: dict[str, tuple[int, Path]] = {}
        for name, ctl in controllers.items():
            root = ctl.base / self.name
            if not root.exists():
                root.mkdir()
            if ctl.version == 2:
                (root / "cgroup.subtree_control").write_text(
                    " ".join(f"+{n}" for n, c in controllers.items() if c.version == 2))
            self.roots[name] = (ctl.version, root)

    def slot(self, index: int) -> SlotCgroup:
        dirs = {}
        for name, (version, root) in self.roots.items():
            directory = root / f"slot{index}"
            directory.mkdir(exist_ok=True)
            dirs[name] = (version, directory)
        return SlotCgroup(dirs)

    def destroy(self) -> None:
        for _, root in {r for r in self.roots.values()}:
            _kill_and_remove(root)
