"""How a slot's zygote is started: the bwrap command line, the read-only filesystem view, and the
bootstrap that loads the inside modules from source.

The sandbox sees (read-only) /usr, the /bin /lib /lib64 /sbin links or directories, the Python
installation that runs the host (its base interpreter: a virtual environment, which may live inside
the project, is never mounted unless ``site_packages=True``), and a few /etc files the
dynamic loader and time zone code read. It does not see the project, the host's home directory,
the host's /tmp, /sys, or the site-packages directory (hidden by an empty tmpfs unless
``site_packages=True``: third-party extension modules such as numpy give a program raw memory
access, see docs/sandbox.md). bwrap itself starts with an empty environment: its own
/proc/N/environ is readable inside the sandbox and would leak the trainer's secrets otherwise.

The inside modules (guard, pyguard, testguard, harness, zygote) are not bind-mounted (that would expose a
project path): their source travels in the ``-c`` argument, and a small bootstrap installs them
as ``sandbox.*`` modules before calling ``sandbox.zygote.main``.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import stat
import sys
import sysconfig
from pathlib import Path

INSIDE_MODULES = ("guard", "pyguard", "testguard", "harness", "zygote")  # dependency order

_BOOTSTRAP = """\
import json, sys, types
pkg = types.ModuleType("sandbox")
pkg.__path__ = []
sys.modules["sandbox"] = pkg
for name, source in json.loads(sys.argv[1]).items():
    mod = types.ModuleType("sandbox." + name)
    mod.__file__ = "<sandbox/" + name + ".py>"
    mod.__package__ = "sandbox"
    sys.modules[mod.__name__] = mod
    setattr(pkg, name, mod)
    exec(compile(source, mod.__file__, "exec"), mod.__dict__)
del pkg, name, source, mod
sys.modules["sandbox.zygote"].main(json.loads(sys.argv[2]))
"""

# Test-only CPython extension modules: memory-unsafe helpers a program must not load. pyguard
# refuses importing them by name; masking the files also stops loading them by path.
_MASKED_EXTENSIONS = ("_testcapi", "_testinternalcapi", "_testbuffer", "_testmultiphase",
                      "_testimportmultiple", "_testclinic", "_testsinglephase", "_ctypes_test",
                      "_xxtestfuzz", "xxlimited", "xxlimited_35", "_xxsubinterpreters",
                      "_xxinterpchannels", "xxsubtype")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/alternatives")


def inside_sources() -> dict[str, str]:
    """Module name -> source text of the modules that run inside the sandbox."""
    here = Path(__file__).resolve().parent
    return {name: (here / f"{name}.py").read_text() for name in INSIDE_MODULES}


def interpreter(*, site_packages: bool = False) -> str:
    """The Python binary that runs inside: the current one with ``site_packages`` (its virtual
    environment is then mounted too), else the base installation's binary, so that a virtual
    environment (e.g. ``.venv`` inside the project checkout) never has to be visible."""
    if site_packages:
        return sys.executable
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def python_command(config: dict, *, site_packages: bool = False) -> list[str]:
    """``python -I -S -B -c BOOTSTRAP SOURCES CONFIG`` for the sandbox's interpreter."""
    flags = ["-I", "-B"] + ([] if site_packages else ["-S"])
    return [interpreter(site_packages=site_packages), *flags, "-c", _BOOTSTRAP, json.dumps(inside_sources()),
            json.dumps(config)]


def _python_dirs(*, site_packages: bool = False) -> list[str]:
    """Directories the interpreter needs, outside /usr (pyenv, conda; a venv only with site-packages)."""
    dirs = {sys.base_prefix, sys.base_exec_prefix, str(Path(interpreter(site_packages=site_packages)).parent.parent)}
    if site_packages:
        dirs |= {sys.prefix, sys.exec_prefix, str(Path(os.path.realpath(sys.executable)).parent.parent)}
    return sorted(d for d in dirs if d and not (d == "/usr" or d.startswith("/usr/")) and os.path.isdir(d))


def _others_can_enter(path: Path, *, read: bool) -> bool:
    """Whether a process of another uid, without supplementary groups, can traverse ``path``
    (and list it, with ``read``): the "other" permission bits."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    need = stat.S_IXOTH | (stat.S_IROTH if read else 0)
    return mode & need == need


def python_view(*, site_packages: bool = False) -> dict:
    """What the sandbox's unprivileged uid cannot reach of the Python it runs, without bubblewrap.

    ``{"dirs": [...], "tops": [...], "unfixable": [...]}``: ``dirs`` are the Python directories
    (see ``_python_dirs``) below a directory that other users cannot traverse (pyenv or conda in
    a 0700 home), ``tops`` the highest such directories, ``unfixable`` the Python directories
    that themselves deny other users (a bind mount keeps their mode). Empty lists when the
    interpreter is readable by everyone. The zygote makes the ``dirs`` visible in a mount
    namespace of its own (``sandbox.zygote._show_python``): a tmpfs on each top, the directories
    bind-mounted read-only into it; bubblewrap does the same with ``--perms 0755 --dir``.
    """
    dirs, tops, unfixable = [], set(), []
    for directory in _python_dirs(site_packages=site_packages):
        path = Path(directory)
        if not _others_can_enter(path, read=True):
            unfixable.append(directory)
            continue
        blocked = [p for p in reversed(path.parents) if not _others_can_enter(p, read=False)]
        if blocked:
            dirs.append(directory)
            tops.add(str(blocked[0]))
    # A top inside another top is covered by the outer one's tmpfs.
    tops = {t for t in tops if not any(t != u and Path(t).is_relative_to(u) for u in tops)}
    return {"dirs": sorted(dirs), "tops": sorted(tops), "unfixable": unfixable}


def _site_dirs(mounted: list[str]) -> list[str]:
    """site-packages directories inside the mounted Python directories (to hide under a tmpfs)."""
    paths = sysconfig.get_paths()
    out = {paths.get("purelib"), paths.get("platlib")}
    for prefix in {sys.base_prefix, sys.prefix}:
        out.update(sysconfig.get_paths(vars={"base": prefix, "platbase": prefix}).get(k) for k in ("purelib", "platlib"))
    inside = [Path(m) for m in mounted] + [Path("/usr")]
    return sorted(d for d in out if d and os.path.isdir(d) and any(Path(d).is_relative_to(m) for m in inside))


def _masked_extension_files() -> list[str]:
    dynload = Path(sysconfig.get_paths()["stdlib"]) / "lib-dynload"
    found = []
    for name in _MASKED_EXTENSIONS:
        found.extend(glob.glob(str(dynload / f"{name}.*.so")) + glob.glob(str(dynload / f"{name}.so")))
    return sorted(found)


def filesystem_args(*, site_packages: bool = False) -> list[str]:
    """bwrap arguments that build the read-only view of the host described in the module doc."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for path in _ETC_FILES:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    made: set[str] = set()
    python_dirs = _python_dirs(site_packages=site_packages)
    for directory in python_dirs:
        # Parents bwrap would create copy the host's modes (/root is 0700): make them traversable.
        for parent in reversed(Path(directory).parents[:-1]):
            if str(parent) not in made and not str(parent).startswith("/usr"):
                args += ["--perms", "0755", "--dir", str(parent)]
                made.add(str(parent))
        args += ["--ro-bind", directory, directory]
    if not site_packages:
        for directory in _site_dirs(python_dirs):
            args += ["--tmpfs", directory]
    for path in _masked_extension_files():
        args += ["--ro-bind", "/dev/null", path]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--chdir", "/tmp"]
    return args


def bwrap_command(config: dict, *, as_root: bool, site_packages: bool = False) -> list[str]:
    """The full command that starts one zygote inside bubblewrap."""
    bwrap = shutil.which("bwrap") or "bwrap"
    ns = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    if as_root:
        # No user namespace: the run can then drop to a *real* unprivileged uid. bwrap keeps all
        # capabilities for root; the zygote needs only these: unshare/mount/setns, setuid/setgid,
        # kill (a run belongs to another uid), and, without per-run mounts, chown/dac_override/
        # fowner to hand a work dir to the run's uid and remove it afterwards.
        caps = ["--cap-drop", "ALL"]
        for cap in ("CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN",
                    "CAP_DAC_OVERRIDE", "CAP_FOWNER"):
            caps += ["--cap-add", cap]
    else:
        ns = ["--unshare-user"] + ns
        caps = []
    life = ["--die-with-parent", "--new-session"]
    return [bwrap, *ns, *life, *caps, *filesystem_args(site_packages=site_packages), "--",
            *python_command(config, site_packages=site_packages)]


def clean_env() -> dict[str, str]:
    """The environment bwrap (or the bare zygote) starts with: empty, on purpose."""
    return {}
