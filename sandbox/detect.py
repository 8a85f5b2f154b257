"""What isolation this machine offers, measured at start (not assumed), and which layers to use.

``capabilities()`` probes once per process and returns a JSON-friendly dict:

* ``isolation``: "strong" when a run gets no network, a whole-tree kill and an aggregate memory
  cap, plus a read-only view of the host filesystem and an unprivileged uid; else "weak", with
  the reasons in ``missing``. The pool refuses a weak sandbox unless ``allow_weak_isolation=True``.
* one entry per layer: bwrap (version and whether a real sandbox started), root, per-run
  namespaces, the cgroup controllers found (v1/v2 and where), seccomp, Landlock ABI, pidfd.

The bwrap probe starts a real sandbox with the same namespace and capability flags the slots use
(about 10-40 ms), because an installed bwrap can still fail (no user namespaces, a container that
forbids mounts, a kernel without the needed namespaces).
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import sys

from rlvr.sandbox import cgroups, launch

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x08000000, 0x20000000, 0x40000000


def _bwrap_probe(as_root: bool) -> tuple[bool, str, str]:
    """(works, version, error) for a sandbox started the way slots start it."""
    path = shutil.which("bwrap")
    if path is None:
        return False, "", "bwrap not found (apt-get install bubblewrap)"
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return False, "", f"bwrap --version failed: {exc!r}"
    cmd = launch.bwrap_command({}, as_root=as_root)
    cmd = cmd[: cmd.index("--")] + ["--", "/bin/sh", "-c", "test -d /proc/self && test ! -e /work"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20, env=launch.clean_env())
    except (OSError, subprocess.SubprocessError) as exc:
        return False, version, f"bwrap did not start: {exc!r}"
    if proc.returncode != 0:
        return False, version, f"bwrap failed (exit {proc.returncode}): {proc.stderr.strip()[:300]}"
    return True, version, ""


def _seccomp_available() -> bool:
    if platform.machine() != "x86_64":
        return False
    try:
        with open("/proc/self/status") as f:
            return any(line.startswith("Seccomp:") for line in f)
    except OSError:
        return False


def _landlock_abi() -> int:
    try:
        from rlvr.sandbox import guard

        return guard.landlock_abi()
    except (OSError, AttributeError, ImportError):
        return 0


@functools.lru_cache(maxsize=None)
def probe(use_bwrap: bool = True, use_cgroups: bool = True, use_namespaces: bool = True) -> dict:
    """Measure the machine; the arguments switch layers off (for tests and benchmarks)."""
    root = os.geteuid() == 0
    bwrap_ok, bwrap_version, bwrap_error = _bwrap_probe(root) if use_bwrap else (False, "", "disabled")
    controllers = cgroups.locate() if use_cgroups else {}
    per_run_ns = use_namespaces and root  # unshare + mount need CAP_SYS_ADMIN in our namespace
    caps = {
        "python": sys.version.split()[0],
        "root": root,
        "bwrap": {"works": bwrap_ok, "version": bwrap_version, "error": bwrap_error},
        "per_run_namespaces": per_run_ns,
        "network_isolated": bwrap_ok or per_run_ns,
        "cgroups": {name: f"v{c.version} {c.base}" for name, c in controllers.items()},
        "uid_drop": root,
        "seccomp": _seccomp_available(),
        "landlock_abi": _landlock_abi(),
        "pidfd": hasattr(os, "pidfd_open"),
    }
    missing = []
    if not bwrap_ok:
        missing.append(f"read-only filesystem view (bubblewrap: {bwrap_error})")
    if not caps["network_isolated"]:
        missing.append("network isolation (needs bubblewrap or root for a network namespace)")
    if not per_run_ns:
        missing.append("per-run pid namespace (needs root): runs see other processes, kill(-1) is "
                       "unavailable, the tree kill falls back to a subreaper")
    if "memory" not in controllers:
        missing.append("aggregate memory cap (no writable memory cgroup)")
    if not root:
        missing.append("unprivileged uid for runs (needs root to switch uid)")
    caps["missing"] = missing
    caps["isolation"] = "strong" if not missing else "weak"
    caps["usable"] = caps["pidfd"]
    return caps


def capabilities() -> dict:
    """The isolation this machine offers (see the module docstring); cached per process."""
    return dict(probe())


def zygote_config(caps: dict, ctl_fd: int, uid: int | None) -> dict:
    """The start-up configuration a slot's zygote receives (see ``sandbox.zygote``)."""
    flags = 0
    if caps["per_run_namespaces"]:
        flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC
        if not caps["bwrap"]["works"]:
            flags |= CLONE_NEWNET  # without bwrap the zygote shares the host's network
    return {
        "ctl_fd": ctl_fd,
        "uid": uid,
        "unshare": flags,
        "max_inodes": 100_000,
        "seccomp": caps["seccomp"],
        "landlock": caps["landlock_abi"] > 0,
        "cap_address_space": "memory" not in caps["cgroups"],
    }
