"""Kernel-level locks a run process puts on itself before any untrusted code runs.

Runs *inside* the sandbox (it is shipped to the zygote as source, see ``sandbox.launch``), so it
imports only the standard library. The order of :func:`lock_down` matters and is the point of this
module:

1. rlimits (CPU seconds, file size, open files, no core dumps, processes of this uid),
2. ``oom_score_adj = 1000`` so the OOM killer picks run processes before the zygote,
3. drop to the slot's unprivileged uid/gid with no supplementary groups,
4. ``PR_SET_DUMPABLE 0`` so sibling processes of the same uid cannot read this one's memory
   through ``/proc/<pid>/mem`` (the harness holds the run's result nonce),
5. ``PR_SET_NO_NEW_PRIVS`` (set-uid binaries no longer elevate; required by 6 and 7),
6. Landlock: writes are allowed only beneath the run's work dir and ``/dev`` (kernel-enforced, so
   ``/proc/self/mem`` cannot be opened for writing whatever path tricks are used),
7. a seccomp filter that refuses namespace creation, ptrace, kernel-module and mount calls,
   ``io_uring``, ``bpf``, ``perf_event_open``, ... and the installation of new signal handlers
   (a Python signal handler receives the interrupted frame, which would let a program walk up to
   the test that called it).

Each step reports whether it took effect, so ``capabilities()`` and the tests can check it.
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import struct

# --- constants from the Linux UAPI headers ------------------------------------------------------

PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2

SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000

# classic BPF opcodes
BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_JGE_K = 0x35
BPF_JSET_K = 0x45
BPF_RET_K = 0x06

# seccomp_data offsets: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
OFF_NR, OFF_ARCH = 0, 4


def _arg_low(i: int) -> int:
    return 16 + 8 * i  # low 32 bits of args[i] on a little-endian machine


CLONE_NS_FLAGS = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
)

# x86_64 syscall numbers refused with EPERM. Only x86_64 is listed because it is the only
# architecture these filters were tested on; elsewhere seccomp is reported as unavailable.
X86_64_DENY = {
    "ptrace": 101, "syslog": 103, "personality": 135, "uselib": 134, "vhangup": 153,
    "modify_ldt": 154, "pivot_root": 155, "chroot": 161, "acct": 163, "mount": 165, "umount2": 166,
    "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170, "setdomainname": 171,
    "iopl": 172, "ioperm": 173, "init_module": 175, "delete_module": 176, "quotactl": 179,
    "lookup_dcookie": 212, "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250,
    "unshare": 272, "perf_event_open": 298, "name_to_handle_at": 303, "open_by_handle_at": 304,
    "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "finit_module": 313, "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "pidfd_getfd": 438, "mount_setattr": 442,
}
X86_64_CLONE, X86_64_CLONE3, X86_64_RT_SIGACTION = 56, 435, 13

EPERM, ENOSYS = 1, 38

# Landlock (fs access rights, ABI 1..3)
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LL_WRITE_FILE = 1 << 1
LL_REMOVE_DIR, LL_REMOVE_FILE = 1 << 4, 1 << 5
LL_MAKE_CHAR, LL_MAKE_DIR, LL_MAKE_REG, LL_MAKE_SOCK = 1 << 6, 1 << 7, 1 << 8, 1 << 9
LL_MAKE_FIFO, LL_MAKE_BLOCK, LL_MAKE_SYM = 1 << 10, 1 << 11, 1 << 12
LL_REFER, LL_TRUNCATE = 1 << 13, 1 << 14
LL_WRITES_V1 = (LL_WRITE_FILE | LL_REMOVE_DIR | LL_REMOVE_FILE | LL_MAKE_CHAR | LL_MAKE_DIR | LL_MAKE_REG
                | LL_MAKE_SOCK | LL_MAKE_FIFO | LL_MAKE_BLOCK | LL_MAKE_SYM)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


# --- seccomp ------------------------------------------------------------------------------------

def build_seccomp_filter(*, deny_signal_handlers: bool = True) -> bytes:
    """The packed ``struct sock_filter[]`` program (8 bytes an instruction).

    Wrong architecture (e.g. 32-bit ``int 0x80`` entry) or an x32 syscall kills the process; a
    listed syscall fails with EPERM; ``clone`` with any namespace flag fails with EPERM; ``clone3``
    fails with ENOSYS so that libc falls back to ``clone`` (whose flags a filter can read);
    ``rt_sigaction`` with a non-NULL new action fails with EPERM (queries still work).
    """
    prog: list[tuple[int, int, int, int]] = []

    def ins(code: int, jt: int, jf: int, k: int) -> None:
        prog.append((code, jt, jf, k))

    ret_eperm = SECCOMP_RET_ERRNO | EPERM
    ins(BPF_LD_W_ABS, 0, 0, OFF_ARCH)
    ins(BPF_JEQ_K, 1, 0, AUDIT_ARCH_X86_64)
    ins(BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS)
    ins(BPF_LD_W_ABS, 0, 0, OFF_NR)
    ins(BPF_JGE_K, 0, 1, X32_SYSCALL_BIT)
    ins(BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS)
    for nr in sorted(X86_64_DENY.values()):
        ins(BPF_JEQ_K, 0, 1, nr)
        ins(BPF_RET_K, 0, 0, ret_eperm)
    ins(BPF_JEQ_K, 0, 1, X86_64_CLONE3)
    ins(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | ENOSYS)
    if deny_signal_handlers:
        # rt_sigaction(sig, act, oldact): refuse when act != NULL (both 32-bit halves non-zero-tested)
        ins(BPF_JEQ_K, 0, 5, X86_64_RT_SIGACTION)
        ins(BPF_LD_W_ABS, 0, 0, _arg_low(1))
        ins(BPF_JEQ_K, 0, 2, 0)
        ins(BPF_LD_W_ABS, 0, 0, _arg_low(1) + 4)
        ins(BPF_JEQ_K, 1, 0, 0)
        ins(BPF_RET_K, 0, 0, ret_eperm)
        ins(BPF_LD_W_ABS, 0, 0, OFF_NR)  # reload nr for the checks below
    ins(BPF_JEQ_K, 0, 3, X86_64_CLONE)
    ins(BPF_LD_W_ABS, 0, 0, _arg_low(0))
    ins(BPF_JSET_K, 0, 1, CLONE_NS_FLAGS)
    ins(BPF_RET_K, 0, 0, ret_eperm)
    ins(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW)
    return b"".join(struct.pack("HBBI", *i) for i in prog)


def install_seccomp(program: bytes) -> None:
    """Load a filter built by :func:`build_seccomp_filter` (needs no_new_privs or CAP_SYS_ADMIN)."""
    n = len(program) // 8
    buf = ctypes.create_string_buffer(program, len(program))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(n, ctypes.addressof(buf))
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


# --- Landlock -----------------------------------------------------------------------------------

def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is absent or disabled."""
    if platform.machine() != "x86_64":
        return 0
    ret = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(int(ret), 0)


def landlock_ruleset(writable: list[str], abi: int) -> int:
    """A ruleset fd that allows filesystem writes only beneath the ``writable`` directories and to
    the ``writable`` files (e.g. /dev/null). Rules hold inodes and Landlock ignores rules on
    mount points hidden by a later mount, so build it after the run's mounts exist."""
    handled = LL_WRITES_V1 | (LL_REFER if abi >= 2 else 0) | (LL_TRUNCATE if abi >= 3 else 0)
    file_rights = handled & (LL_WRITE_FILE | LL_TRUNCATE)
    attr = struct.pack("Q", handled)  # struct landlock_ruleset_attr, ABI-1 size: fs rights only
    rs = _check(_libc.syscall(SYS_LANDLOCK_CREATE_RULESET, attr, len(attr), 0), "landlock_create_ruleset")
    try:
        for path in writable:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rights = handled if os.path.isdir(path) else file_rights
                rule = struct.pack("=Qi", rights, fd)  # packed struct landlock_path_beneath_attr
                _check(_libc.syscall(SYS_LANDLOCK_ADD_RULE, rs, LANDLOCK_RULE_PATH_BENEATH, rule, 0),
                       "landlock_add_rule")
            finally:
                os.close(fd)
    except BaseException:
        os.close(rs)
        raise
    return rs


def landlock_restrict(ruleset_fd: int) -> None:
    """Enforce a ruleset on the calling thread's process from now on (needs no_new_privs)."""
    _check(_libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset_fd, 0), "landlock_restrict_self")


# --- the whole lock-down ------------------------------------------------------------------------

def apply_rlimits(limits: dict, *, cap_address_space: bool) -> None:
    """Per-process limits. ``limits`` is the wire form of ``sandbox.Limits`` plus ``cpu_s``.

    RLIMIT_NPROC counts processes of the *uid*; each slot has its own uid, so it caps this run.
    RLIMIT_AS is only a fallback when no memory cgroup exists: it is per process (a run that forks
    multiplies it) and makes thread-heavy programs fail early.
    """
    cpu = max(1, int(limits["cpu_s"]) + 1)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["max_file_bytes"], limits["max_file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["max_open_files"], limits["max_open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"], limits["max_processes"]))
    if cap_address_space:
        mem = int(limits["memory_mb"]) << 20
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))


def lock_down(limits: dict, *, uid: int | None, landlock_fd: int | None, seccomp_program: bytes | None,
              cap_address_space: bool) -> dict:
    """Apply every layer, in order, to the calling process; returns what took effect.

    ``uid`` None means "cannot change uid" (not root, e.g. inside an unprivileged user namespace).
    ``landlock_fd`` is a ruleset from :func:`landlock_ruleset` (None: no Landlock).
    Raises OSError when a layer that was detected as available fails: a run must not silently
    start with less isolation than ``capabilities()`` promised.
    """
    applied = {}
    apply_rlimits(limits, cap_address_space=cap_address_space)
    applied["rlimits"] = True
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        try:
            os.write(fd, b"1000")
        finally:
            os.close(fd)
        applied["oom_score_adj"] = True
    except OSError:
        applied["oom_score_adj"] = False
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    applied["uid"] = os.getuid()
    _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "PR_SET_DUMPABLE")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    if landlock_fd is not None:
        landlock_restrict(landlock_fd)
    applied["landlock"] = landlock_fd is not None
    if seccomp_program:
        install_seccomp(seccomp_program)
    applied["seccomp"] = bool(seccomp_program)
    return applied
