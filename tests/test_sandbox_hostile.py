"""Hostile programs: each must be contained, must score as failing where it cheats, and must leave
the host unchanged (no process of a sandbox uid survives, no file appears outside the sandbox,
the slot's memory returns to its baseline, the zygote survives).

Needs the strong sandbox (bubblewrap, root, cgroups); skips cleanly without it.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlvr.sandbox import Limits, SandboxPool, capabilities
from rlvr.sandbox.slot import UID_BASE, UID_SPAN

CAPS = capabilities()
pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(not CAPS["bwrap"]["works"],
                       reason=f"needs bubblewrap (apt-get install bubblewrap): {CAPS['bwrap']['error']}"),
    pytest.mark.skipif(CAPS["isolation"] != "strong", reason=f"needs the strong sandbox: {CAPS['missing']}"),
]

MARK = "rlvrhostile" + secrets.token_hex(6)  # files a hostile program tries to leave behind carry it
SECRET = "rlvr-secret-" + secrets.token_hex(12)
SHORT = Limits(timeout_s=1.0)
HOST_DIRS = [Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), Path.cwd(), Path.home()]


@pytest.fixture(scope="module")
def pool():
    os.environ["RLVR_SANDBOX_TEST_SECRET"] = SECRET  # the trainer's secrets live in its environment
    p = SandboxPool(slots=2)
    p.warm()
    yield p
    p.close()
    os.environ.pop("RLVR_SANDBOX_TEST_SECRET", None)


def _sandbox_uid_processes(uids: set[int]) -> list[str]:
    """Host processes running as one of ``uids`` (this pool's slots: other users of the sandbox on
    the same machine have their own random uids)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        uid = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:")), -1)
        if uid in uids:
            found.append(f"{entry.name}: {status.splitlines()[0]}")
    return found


def _marked_files() -> list[str]:
    hits = []
    for directory in HOST_DIRS:
        try:
            hits += [str(p) for p in directory.iterdir() if MARK in p.name]
        except OSError:
            pass
    return hits


@pytest.fixture(autouse=True)
def host_unchanged(pool):
    zygotes = [s.zygote_pid for s in pool._slots]
    uids = {s.uid for s in pool._slots}
    assert all(UID_BASE <= uid < UID_BASE + UID_SPAN for uid in uids)
    yield
    deadline = time.monotonic() + 2.0
    while _sandbox_uid_processes(uids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sandbox_uid_processes(uids) == [], "a sandboxed process outlived its run"
    assert _marked_files() == [], "a hostile program left a file on the host"
    for slot, pid in zip(pool._slots, zygotes):
        assert slot.zygote_pid == pid and slot.alive, "a hostile program took its zygote down"
        usage = slot.cgroup.memory_usage() if slot.cgroup else None
        if usage is not None:  # tmpfs files and processes of the run are all released
            assert usage < slot.baseline + (48 << 20), f"slot memory {usage >> 20} MiB after the run"


# --- resources ----------------------------------------------------------------------------------

FORK_BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
SETSID_FORK_BOMB = (
    "import os, time\n"
    "for _ in range(10000):\n"
    "    try:\n"
    "        if os.fork() == 0:\n"
    "            os.setsid()\n"
    "            while True:\n"
    "                try:\n"
    "                    os.fork()\n"
    "                except OSError:\n"
    "                    time.sleep(0.01)\n"
    "    except OSError:\n"
    "        time.sleep(0.01)\n"
)


@pytest.mark.parametrize("code", [FORK_BOMB, SETSID_FORK_BOMB], ids=["fork_bomb", "setsid_fork_bomb"])
def test_fork_bombs_are_capped_and_killed_with_the_tree(pool, code):
    start = time.monotonic()
    r = pool.execute(code, limits=Limits(timeout_s=1.5, max_processes=32))
    assert r.status == "timeout"
    assert time.monotonic() - start < 8


def test_thread_bomb_is_capped(pool):
    code = ("import threading, time\n"
            "n = 0\n"
            "try:\n"
            "    while True:\n"
            "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); n += 1\n"
            "except RuntimeError:\n"
            "    print('capped at', n)\n")
    r = pool.execute(code, limits=Limits(timeout_s=3, max_processes=32))
    assert r.status == "ok" and r.stdout.startswith("capped at"), (r.status, r.stderr[-300:])
    assert int(r.stdout.split()[-1]) <= 32


@pytest.mark.parametrize("code", [
    "x = 'a' * (1 << 30)",
    "chunks = []\nwhile True:\n    chunks.append('x' * (8 << 20))",
], ids=["one_gib", "gradual"])
def test_memory_bombs_hit_the_cap(pool, code):
    r = pool.execute(code, limits=Limits(timeout_s=10, memory_mb=128))
    assert r.status == "memory", (r.status, r.detail, r.stderr[-300:])


def test_memory_bomb_across_processes_hits_the_aggregate_cap(pool):
    # Six children of 48 MiB each: every one is far below a per-process limit, together they are
    # more than twice the 128 MiB cap (the case RLIMIT_AS cannot catch).
    code = ("import os, time\n"
            "kids = []\n"
            "for _ in range(6):\n"
            "    pid = os.fork()\n"
            "    if pid == 0:\n"
            "        x = 'k' * (48 << 20)\n"
            "        time.sleep(3)\n"
            "        os._exit(0)\n"
            "    kids.append(pid)\n"
            "print([os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) for k in kids])\n")
    r = pool.execute(code, limits=Limits(timeout_s=10, memory_mb=128))
    assert r.status == "memory", (r.status, r.stdout, r.stderr[-300:])


@pytest.mark.parametrize("code", [
    "while True:\n    pass",
    "import time\ntime.sleep(10**6)",
    "import signal, time\ntry:\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\nexcept OSError as e:\n    print(e)\nwhile True:\n    time.sleep(1)",
    "import select\nselect.select([], [], [])",
], ids=["busy_loop", "sleep_forever", "ignore_sigterm", "block_forever"])
def test_runs_past_the_deadline_are_killed(pool, code):
    start = time.monotonic()
    r = pool.execute(code, limits=SHORT)
    assert r.status == "timeout"
    assert time.monotonic() - start < 6


def test_output_flood_on_both_streams_is_capped_without_deadlock(pool):
    code = ("import sys, threading\n"
            "def flood(s):\n"
            "    try:\n"
            "        while True: s.write('z' * 65536)\n"
            "    except BrokenPipeError:\n"
            "        pass\n"
            "t = threading.Thread(target=flood, args=(sys.stderr,)); t.start(); flood(sys.stdout); t.join()\n")
    r = pool.execute(code, limits=Limits(timeout_s=3, max_output_bytes=100_000))
    assert r.truncated and len(r.stdout) == 100_000 and len(r.stderr) == 100_000
    assert r.status in ("ok", "timeout")


def test_ten_gigabyte_file_is_refused(pool):
    code = ("import os\n"
            "with open('big', 'wb') as f:\n"
            "    try:\n"
            "        f.truncate(10 << 30)\n"
            "    except OSError as e:\n"
            "        print('truncate', e.errno)\n"
            "    try:\n"
            "        for _ in range(10 << 10):\n"
            "            f.write(b'\\1' * (1 << 20))\n"
            "    except OSError as e:\n"
            "        print('write', e.errno)\n")
    r = pool.execute(code, limits=Limits(timeout_s=20, memory_mb=512, max_file_bytes=64 << 20))
    assert r.status in ("ok", "memory"), (r.status, r.stderr[-300:])
    assert "truncate 27" in r.stdout  # EFBIG: RLIMIT_FSIZE
    assert "write 27" in r.stdout or r.status == "memory"


def test_inode_bomb_is_capped(pool):
    code = ("i = 0\n"
            "try:\n"
            "    while True:\n"
            "        open(f'f{i}', 'w').close(); i += 1\n"
            "except OSError as e:\n"
            "    print('stopped', i, e.errno)\n")
    r = pool.execute(code, limits=Limits(timeout_s=30, memory_mb=256))
    assert r.status in ("ok", "memory", "timeout"), (r.status, r.stderr[-300:])
    if r.status == "ok":
        assert r.stdout.startswith("stopped") and int(r.stdout.split()[1]) <= 100_000


def test_segfault_is_contained(pool):
    r = pool.execute("import faulthandler\nfaulthandler._sigsegv()", limits=SHORT)
    assert r.status == "killed" and r.exit_code == -11, (r.status, r.exit_code, r.stderr[-200:])


def test_unbounded_recursion_is_contained(pool):
    # Python 3.11 keeps frames on the heap: this ends at the memory cap or as a C stack overflow.
    code = "import sys\nsys.setrecursionlimit(10**8)\ndef f(n): return f(n + 1) + 1\nf(0)"
    r = pool.execute(code, limits=Limits(timeout_s=10, memory_mb=256))
    # the memory cap's OOM kill (SIGKILL), or the stack overflow's SIGSEGV: not any signal, not an error
    assert (r.status, r.exit_code) in {("memory", -9), ("killed", -11)}, (r.status, r.exit_code, r.stderr[-200:])


# --- information and the host filesystem --------------------------------------------------------

def test_environment_secrets_do_not_leak(pool):
    code = ("import os\n"
            "print(dict(os.environ))\n"
            "for d in os.listdir('/proc'):\n"
            "    for name in ('environ', 'cmdline'):\n"
            "        try:\n"
            "            print(open(f'/proc/{d}/{name}', 'rb').read())\n"
            "        except OSError:\n"
            "            pass\n")
    r = pool.execute(code, limits=Limits(timeout_s=5))
    assert r.status == "ok"
    assert SECRET not in r.stdout + r.stderr


def test_host_files_are_invisible(pool, tmp_path):
    secret_file = tmp_path / "token.txt"
    secret_file.write_text(SECRET)
    targets = [str(secret_file), str(Path.cwd() / "pyproject.toml"), "/root/.bashrc", "/etc/shadow",
               "/etc/passwd", "/work", "/home", "/sys/kernel", "/proc/1/root/etc/hostname"]
    code = ("import os\n"
            f"for p in {targets!r}:\n"
            "    try:\n"
            "        print(p, 'READ', open(p).read()[:100]) if os.path.isfile(p) else print(p, 'LIST', os.listdir(p))\n"
            "    except OSError as e:\n"
            "        print(p, 'denied', e.errno)\n")
    r = pool.execute(code, limits=Limits(timeout_s=5))
    assert SECRET not in r.stdout
    assert "READ" not in r.stdout and "LIST" not in r.stdout, r.stdout


def test_proc_shows_only_the_run(pool):
    code = ("import os\n"
            "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
            "print(pids, os.getpid())\n"
            "text = ''\n"
            "for root, dirs, files in os.walk('/proc/self'):\n"
            "    for f in files[:50]:\n"
            "        try:\n"
            "            text += open(os.path.join(root, f), errors='replace').read(2000)\n"
            "        except OSError:\n"
            "            pass\n"
            "    if len(text) > 10**6: break\n"
            "print(len(text))\n")
    r = pool.execute(code, limits=Limits(timeout_s=10))
    pids = eval(r.stdout.splitlines()[0].rsplit("]", 1)[0] + "]")
    assert pids == [int(r.stdout.splitlines()[0].split()[-1])], r.stdout[:300]  # only itself
    assert SECRET not in r.stdout


def test_writes_and_deletes_outside_the_work_dir_fail(pool):
    paths = ["/usr/" + MARK, "/etc/" + MARK, "/root/" + MARK, "/" + MARK, "/proc/" + MARK,
             "/dev/" + MARK, str(Path.cwd() / MARK), "/tmp/../" + MARK]
    code = ("import os, shutil\n"
            "ok = []\n"
            f"for p in {paths!r}:\n"
            "    try:\n"
            "        open(p, 'w').write('x'); ok.append(p)\n"
            "    except OSError:\n"
            "        pass\n"
            "for p in ['/usr/bin/env', '/etc/hostname', '/bin/sh']:\n"
            "    try:\n"
            "        os.remove(p); ok.append(p)\n"
            "    except OSError:\n"
            "        pass\n"
            "for p in ['/usr/bin', '/etc']:\n"
            "    try:\n"
            "        os.chmod(p, 0o777); ok.append(p)\n"
            "    except OSError:\n"
            "        pass\n"
            "open('/proc/self/mem', 'rb') if False else None\n"
            "print(ok)\n")
    r = pool.execute(code, limits=Limits(timeout_s=5))
    assert r.stdout == "[]\n", r.stdout + r.stderr
    assert Path("/usr/bin/env").exists() and Path("/bin/sh").exists()


def test_own_memory_is_not_writable_through_proc(pool):
    code = ("for p in ['/proc/self/mem', '/proc/1/mem', '/proc/self/task/%d/mem' % __import__('os').getpid()]:\n"
            "    try:\n"
            "        open(p, 'r+b'); print('OPEN', p)\n"
            "    except OSError as e:\n"
            "        print('denied', e.errno)\n")
    r = pool.execute(code, limits=SHORT)
    assert "OPEN" not in r.stdout and r.stdout.count("denied") == 3


# --- network and other processes -----------------------------------------------------------------

def test_network_to_a_host_listener_fails(pool):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    code = ("import socket\n"
            "for family, addr in [(socket.AF_INET, ('127.0.0.1', %d)), (socket.AF_INET, ('1.1.1.1', 53))]:\n"
            "    s = socket.socket(family); s.settimeout(1)\n"
            "    try:\n"
            "        s.connect(addr); print('CONNECTED', addr)\n"
            "    except OSError as e:\n"
            "        print('refused', e.errno)\n"
            "try:\n"
            "    socket.getaddrinfo('example.com', 80); print('DNS')\n"
            "except OSError:\n"
            "    print('no dns')\n") % port
    try:
        r = pool.execute(code, limits=Limits(timeout_s=10))
        assert "CONNECTED" not in r.stdout and "DNS" not in r.stdout, r.stdout
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


def test_killing_the_parent_and_everything_else_fails(pool):
    code = ("import os, signal\n"
            "hits = []\n"
            "for pid in [os.getppid(), 1] + list(range(2, 400)):\n"
            "    if pid != os.getpid():\n"
            "        try:\n"
            "            os.kill(pid, signal.SIGKILL); hits.append(pid)\n"
            "        except OSError:\n"
            "            pass\n"
            "try:\n"
            "    os.kill(-1, signal.SIGKILL)  # every process of its uid but itself: none here\n"
            "except ProcessLookupError:\n"
            "    pass\n"
            "print(hits)\n")
    r = pool.execute(code, limits=SHORT)
    assert r.status == "ok" and r.stdout == "[]\n", (r.status, r.stdout, r.stderr)
    os.kill(os.getpid(), 0)  # we are still here
    assert pool.execute("print('still serving')", limits=SHORT).stdout == "still serving\n"


def test_killing_its_own_process_group_ends_only_the_run(pool):
    r = pool.execute("import os, signal\nos.killpg(0, signal.SIGKILL)", limits=SHORT)
    assert (r.status, r.exit_code) == ("killed", -9)


def test_daemons_do_not_outlive_the_run(pool):
    code = ("import os, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        os.closerange(0, 64)\n"
            "        time.sleep(60)\n"
            "    os._exit(0)\n"
            "print('parent done')\n")
    r = pool.execute(code, limits=Limits(timeout_s=5))
    assert r.status == "ok" and r.stdout == "parent done\n"
    # host_unchanged asserts that no process of a sandbox uid is left


def test_capabilities_and_privileges_inside(pool):
    code = ("import os\n"
            "st = open('/proc/self/status').read()\n"
            "print([l for l in st.splitlines() if l.startswith(('CapEff', 'CapPrm', 'NoNewPrivs', 'Seccomp:'))])\n"
            "print(os.getuid(), os.getgid(), os.getgroups())\n"
            "import ctypes\n")
    r = pool.execute(code, limits=SHORT)
    lines = r.stdout.splitlines()
    assert "CapEff:\\t0000000000000000" in lines[0] and "NoNewPrivs:\\t1" in lines[0] and "Seccomp:\\t2" in lines[0]
    uid, gid, groups = lines[1].split(maxsplit=2)
    assert UID_BASE <= int(uid) < UID_BASE + UID_SPAN and uid == gid and groups == "[]"


@pytest.mark.parametrize("code, refusals", [
    # the Python guard refuses ctypes outright; were ctypes allowed, unshare(2) must return -1
    ("import ctypes\nprint(ctypes.CDLL(None).unshare(0x10000000))",
     [(1, "", "PermissionError: ctypes.dlopen is not allowed in the sandbox"), (0, "-1", "")]),
    # os.unshare (Python 3.12+) raises PermissionError; the unshare binary runs and fails with EPERM
    ("import os\nos.unshare(0x10000000) if hasattr(os, 'unshare') else None\nimport subprocess\nprint(subprocess.run(['unshare', '-U', 'true']).returncode)",
     [(0, "1", "unshare: unshare failed: Operation not permitted"), (1, "", "PermissionError")]),
], ids=["ctypes_unshare", "unshare_binary"])
def test_new_namespaces_are_refused(pool, code, refusals):
    """Refused in one of the named ways: the program ran to its end and said so; a crash of another
    kind (a missing binary, a sandbox error) is not a refusal."""
    r = pool.execute(code, limits=Limits(timeout_s=5))
    assert r.status == "ok" and any((r.exit_code, r.stdout.strip()) == (code_, out) and said in r.stderr
                                    for code_, out, said in refusals), (r.status, r.exit_code, r.stdout, r.stderr[-300:])


# --- fake passes ----------------------------------------------------------------------------------
# Each case is (solution, tests, fools_naive, defense). ``fools_naive``: the cheat really works
# against a naive harness that runs solution + test as one program and trusts its exit code:
# proof that the case exercises its trick. "sandbox" runs that naive check inside execute() (so
# the cheat cannot touch the host); "host" runs it as a plain subprocess, for the harmless
# introspection tricks that execute()'s own guard would already stop.
# ``defense``: text that must appear in a test's detail, naming the layer that stopped it.

WRONG = "def add(a, b):\n    return a - b\n"
EQ_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "def check(candidate):\n    assert candidate(5, 5) == 10\ncheck(add)"]
UNITTEST_TESTS = ["import unittest\nclass T(unittest.TestCase):\n    def runTest(self):\n        self.assertEqual(add(1, 2), 3)\nT().runTest()"]
ISCLOSE_TESTS = ["import math\nassert math.isclose(add(1, 2), 3)"]
ABS_TESTS = ["assert abs(add(1, 2) - 3) < 1e-9"]
TWO_STEP_TESTS = ["add(0, 0)\nassert abs(add(1, 2) - 3) < 1e-9\nassert math.isclose(add(2, 2), 4)"]
FRAME_TESTS = ["assert add(1, 2) == 3"]
# Reads the expected value out of the calling test's constants: (..., 1, 2, 3) for add(1, 2) == 3.
PICK = ("def _pick(code, a, b):\n"
        "    ints = [c for c in code.co_consts if type(c) is int]\n"
        "    for i in range(len(ints) - 2):\n"
        "        if ints[i] == a and ints[i + 1] == b:\n"
        "            return ints[i + 2]\n"
        "    return 0\n")

FAKE_PASSES = {
    "exit_zero": (WRONG + "exit(0)", EQ_TESTS, True, "SystemExit"),
    "sys_exit": (WRONG + "import sys\nsys.exit(0)", EQ_TESTS, True, "SystemExit"),
    "os_exit": (WRONG + "import os\nos._exit(0)", EQ_TESTS, True, "exited with code 0"),
    "raise_system_exit": (WRONG + "raise SystemExit(0)", EQ_TESTS, True, "SystemExit"),
    "exit_inside_call": ("import os\ndef add(a, b):\n    os._exit(0)\n", EQ_TESTS, True, "exited with code 0"),
    "system_exit_inside_call": ("def add(a, b):\n    raise SystemExit(0)\n", EQ_TESTS, True, "SystemExit"),
    "keyboard_interrupt_inside_call": ("def add(a, b):\n    raise KeyboardInterrupt\n", EQ_TESTS, False, "KeyboardInterrupt"),
    "atexit_hook": (WRONG + "import atexit, os\natexit.register(lambda: (print('ALL TESTS PASSED'), os._exit(0)))",
                    EQ_TESTS, True, "AssertionError"),
    "printed_markers": (WRONG + "print('PASSED'); print('{\"ev\": \"pass\", \"i\": 0}'); print('OK (tests=3)')",
                        EQ_TESTS, False, "AssertionError"),
    "forged_records_all_fds": (WRONG + ("import os\n"
                                        "for fd in range(64):\n"
                                        "    for i in range(3):\n"
                                        "        try: os.write(fd, b'%032x {\"ev\":\"pass\",\"i\":%d}\\n' % (0, i))\n"
                                        "        except OSError: pass\n"), EQ_TESTS, False, "tampering"),
    "forged_records_from_child": (WRONG + ("import os, time\n"
                                           "if os.fork() == 0:\n"
                                           "    time.sleep(0.3)\n"
                                           "    os.write(3, b'{\"ev\":\"pass\",\"i\":1}\\n'); os._exit(0)\n"),
                                  EQ_TESTS, False, None),
    "patched_unittest": (WRONG + "import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n",
                         UNITTEST_TESTS, True, "AssertionError"),
    "patched_sys_modules": (WRONG + ("import sys, types\n"
                                     "fake = types.ModuleType('math'); fake.isclose = lambda *a, **k: True\n"
                                     "sys.modules['math'] = fake\n"), ISCLOSE_TESTS, True, "AssertionError"),
    "patched_module_attribute": (WRONG + "import math\nmath.isclose = lambda *a, **k: True\n", ISCLOSE_TESTS, True,
                                 "AssertionError"),
    "patched_builtins": (WRONG + "import builtins\nbuiltins.abs = lambda x: 0\n", ABS_TESTS, True, "AssertionError"),
    "shadowed_builtins": (WRONG + "abs = lambda x: 0\n", ABS_TESTS, True, "AssertionError"),
    "patch_inside_call": (("import builtins, math\n"
                           "def add(a, b):\n"
                           "    builtins.abs = lambda x: 0\n"
                           "    math.isclose = lambda *a, **k: True\n"
                           "    return a - b\n"), TWO_STEP_TESTS, True, "AssertionError"),
    "frame_walk": (PICK + "import sys\ndef add(a, b):\n    return _pick(sys._getframe(1).f_code, a, b)\n",
                   FRAME_TESTS, "host", "call stack is not available"),
    "traceback_frames": ((PICK + "def add(a, b):\n"
                          "    try:\n"
                          "        raise ValueError\n"
                          "    except ValueError as e:\n"
                          "        return _pick(e.__traceback__.tb_frame.f_back.f_code, a, b)\n"),
                         FRAME_TESTS, "host", "tb_frame is not available"),
    "generator_frames": ((PICK + "def add(a, b):\n"
                          "    g = (lambda: (yield))()\n"
                          "    next(g)\n"
                          "    return _pick(g.gi_frame.f_back.f_back.f_code, a, b)\n"),
                         FRAME_TESTS, False, "gi_frame is not available"),
    "signal_handler_frame": ((PICK + "import signal, os\n"
                              "seen = []\n"
                              "signal.signal(signal.SIGUSR1, lambda s, f: seen.append(f.f_back))\n"
                              "def add(a, b):\n"
                              "    os.kill(os.getpid(), signal.SIGUSR1)\n"
                              "    return _pick(seen[-1].f_code, a, b)\n"),
                             FRAME_TESTS, "host", "Operation not permitted"),
    "gc_scan_for_tests": (("import gc, re\n"
                           "def add(a, b):\n"
                           "    for o in gc.get_objects():\n"
                           "        if isinstance(o, tuple) and o[:2] == (a, b) and len(o) > 2 and isinstance(o[2], int):\n"
                           "            return o[2]\n"
                           "    return 0\n"), FRAME_TESTS, False, "gc.get_objects is not allowed"),
    "settrace_skips_asserts": (("import sys\n"
                                "def tracer(frame, event, arg):\n"
                                "    return tracer\n"
                                "sys.settrace(tracer)\n" + WRONG), EQ_TESTS, False, "sys.settrace is not allowed"),
    "ctypes_poke": (WRONG + "import ctypes\nctypes.c_long.from_address(id(3) + 24)\n", EQ_TESTS, False,
                    "ctypes.cdata is not allowed"),
    "new_audit_hook_spies_tests": (WRONG + ("import sys\n"
                                            "sys.addaudithook(lambda e, a: print('SPY', e, a) if e in ('compile', 'exec') else None)\n"),
                                   EQ_TESTS, False, "AssertionError"),
    "read_harness_fds": (("import os\n"
                          "found = []\n"
                          "for fd in os.listdir('/proc/self/fd'):\n"
                          "    try: found.append(open('/proc/self/fd/' + fd, 'rb').read())\n"
                          "    except OSError: pass\n"
                          "found.append(open('/proc/self/cmdline', 'rb').read())\n"
                          "src = b''.join(found).decode(errors='replace')\n"
                          "def add(a, b):\n"
                          "    import re\n"
                          "    m = re.search(r'add\\(%d, %d\\) == (\\d+)' % (a, b), src)\n"
                          "    return int(m.group(1)) if m else 0\n"), EQ_TESTS, False, "AssertionError"),
    "import_the_harness": ("import sandbox\n" + WRONG, EQ_TESTS, False, "No module named 'sandbox'"),
    "kill_the_harness": ("import os, signal\ndef add(a, b):\n    os.kill(os.getppid(), signal.SIGKILL)\n    return a - b\n",
                         EQ_TESTS, False, None),
    "marshal_bytecode": (WRONG + "import marshal\nmarshal.loads(marshal.dumps((lambda: 3).__code__))\n", EQ_TESTS,
                         False, "marshal.loads is only allowed"),
    "code_replace": (WRONG + "add.__code__ = (lambda a, b: 3).__code__\n", EQ_TESTS, False,
                     "rebinding __code__ is not allowed"),
    # Try several answers at once: the forked copy that guessed right would report a pass.
    "fork_guess_in_call": ("import os\ndef is_even(n):\n    return os.fork() == 0\n",
                           ["assert is_even(2) == True", "assert is_even(4)", "assert is_even(6) is True"], False, None),
    "fork_guess_at_top_level": ("import os\nGUESS = os.fork() == 0\ndef is_even(n):\n    return GUESS\n",
                                ["assert is_even(2) == True", "assert is_even(4)", "assert is_even(6) is True"], False,
                                None),
    "fork_many_guesses": (("import os\n"
                           "def add(a, b):\n"
                           "    for guess in range(12):\n"
                           "        if os.fork() == 0:\n"
                           "            return guess\n"
                           "    os.wait()\n"
                           "    return -1\n"), EQ_TESTS, False, None),
    # Aimed at the harness itself: builtins and module attributes its code might look up late.
    "harness_enumerate": (WRONG + "import builtins\n_e = builtins.enumerate\n"
                          "builtins.enumerate = lambda xs: _e(['pass'] * len(xs))\n", EQ_TESTS, False, "AssertionError"),
    "harness_isinstance": (WRONG + "import builtins, math\nmath.isclose = lambda *a, **k: True\n"
                           "builtins.isinstance = lambda *a: False\nbuiltins.id = lambda x: 0\n",
                           ["assert math.isclose(add(1, 2), 3)"], False, "AssertionError"),
    "harness_module_attributes": (WRONG + ("import types, sys, math, os, signal\n"
                                           "math.isclose = lambda *a, **k: True\n"
                                           "types.ModuleType = int; types.FunctionType = int\n"
                                           "sys.modules = {}; signal.SIGKILL = 0; os.WIFSIGNALED = lambda s: False\n"),
                                  ["assert math.isclose(add(1, 2), 3)"] + EQ_TESTS, False, "AssertionError"),
    "harness_exceptions": (WRONG + "import builtins\nbuiltins.BaseException = type('X', (), {})\n"
                           "builtins.OSError = type('Y', (), {})\n", EQ_TESTS, False, None),
    "patching_thread": (WRONG + ("import builtins, math, threading\n"
                                 "def spin():\n"
                                 "    while True:\n"
                                 "        math.isclose = lambda *a, **k: True\n"
                                 "        builtins.enumerate = lambda xs: iter([(0, 'pass')])\n"
                                 "threading.Thread(target=spin, daemon=True).start()\n"),
                        ["assert math.isclose(add(1, 2), 3)"] + EQ_TESTS, False, "AssertionError"),
}


@pytest.mark.parametrize("name", sorted(FAKE_PASSES))
def test_fake_passes_score_zero(pool, name):
    code, tests, fools_naive, defense = FAKE_PASSES[name]
    if fools_naive == "host":
        naive = subprocess.run([sys.executable, "-I", "-c", code + "\n" + tests[0]], capture_output=True,
                               text=True, timeout=30)
        assert naive.returncode == 0, f"the {name} trick does not even fool a naive harness: {naive.stderr[-300:]}"
    elif fools_naive:  # the trick really works when a harness trusts the program's exit status
        naive = pool.execute(code + "\n" + tests[0], limits=Limits(timeout_s=5))
        assert naive.exit_code == 0, f"the {name} trick does not even fool a naive harness: {naive.stderr[-300:]}"
    r = pool.run_tests(code, tests, limits=Limits(timeout_s=2), guard_solution=True)
    assert r.status == "ok"
    assert r.passed == 0, [(o.status, o.detail[:80]) for o in r.per_test]
    if defense is not None:
        assert any(defense in o.detail for o in r.per_test), [o.detail[:120] for o in r.per_test]
    assert "SPY" not in r.stdout


def test_forged_records_mark_the_run_as_tampered(pool):
    r = pool.run_tests(FAKE_PASSES["forged_records_all_fds"][0], EQ_TESTS, limits=SHORT)
    assert r.tampered and r.passed == 0 and "tampering" in r.per_test[0].detail


def test_guarded_and_unguarded_tests_agree_for_honest_code(pool):
    code = "import math\ndef add(a, b):\n    return a + b\n"
    tests = EQ_TESTS + UNITTEST_TESTS + ISCLOSE_TESTS + ABS_TESTS + TWO_STEP_TESTS
    for guard in (False, True):
        r = pool.run_tests(code, tests, limits=SHORT, guard_solution=guard)
        assert r.all_passed, (guard, [(o.status, o.detail) for o in r.per_test])


ALWAYS_EQUAL = {
    "always_equal_object": "class E:\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\ndef add(a, b):\n    return E()\n",
    "int_subclass": "class I(int):\n    __eq__ = int.__ne__\ndef add(a, b):\n    return I(0)\n",
    "inside_a_list": "class E:\n    __eq__ = lambda s, o: True\ndef add(a, b):\n    return [E()][0]\n",
}
E_CLASS = "class E:\n    def __eq__(self, o): return True\n"
HIDDEN_ALWAYS_EQUAL = {  # (solution, test): places a naive return check would not look
    "yielded_by_a_generator": (E_CLASS + "def f(x):\n    return (E() for _ in range(3))\n",
                               "assert list(f(1)) == [1, 2, 3]"),
    "yielded_by_map": (E_CLASS + "def f(x):\n    return map(lambda _: E(), range(3))\n", "assert list(f(1)) == [1, 2, 3]"),
    "written_into_an_argument": (E_CLASS + "def f(xs):\n    xs[:] = [E() for _ in xs]\n",
                                 "xs = [3, 1, 2]\nf(xs)\nassert xs == [1, 2, 3]"),
    "past_thirty_thousand_items": (E_CLASS + "def f(x):\n    return [0] * 30000 + [E()]\n",
                                   "assert f(1) == [0] * 30000 + [7]"),
    "inside_a_dict_value": (E_CLASS + "def f(x):\n    return {'k': (1, [E()])}\n", "assert f(1) == {'k': (1, [9])}"),
}


@pytest.mark.parametrize("name", sorted(HIDDEN_ALWAYS_EQUAL))
def test_hidden_always_equal_objects_are_rejected(pool, name):
    code, test = HIDDEN_ALWAYS_EQUAL[name]
    assert pool.execute(code + "\n" + test, limits=SHORT).exit_code == 0  # fools a naive harness
    r = pool.run_tests(code, [test], limits=SHORT, guard_solution=True)
    assert [o.status for o in r.per_test] == ["rejected"], r.per_test


@pytest.mark.parametrize("name", sorted(ALWAYS_EQUAL))
def test_always_equal_objects_are_rejected_with_the_guard(pool, name):
    assert pool.execute(ALWAYS_EQUAL[name] + "\n" + EQ_TESTS[0], limits=SHORT).exit_code == 0  # fools naive
    r = pool.run_tests(ALWAYS_EQUAL[name], EQ_TESTS, limits=SHORT, guard_solution=True)
    assert r.passed == 0
    assert {o.status for o in r.per_test} == {"rejected"}


def test_the_guard_lets_correct_solutions_through(pool):
    code = ("from collections import namedtuple, Counter\n"
            "P = namedtuple('P', 'x y')\n"
            "class Helper:\n"
            "    def __init__(self): self.v = 1\n"
            "def add(a, b):\n"
            "    return a + b\n"
            "def pair(): return P(1, 2)\n"
            "def counts(s): return Counter(s)\n"
            "def helper(): return Helper()\n"
            "def squares(n): return (i * i for i in range(n))\n"
            "def sort_in_place(xs): xs.sort()\n"
            "def cyclic():\n    a = [1]\n    a.append(a)\n    return a\n")
    tests = EQ_TESTS + ["assert pair() == (1, 2)", "assert counts('aab') == {'a': 2, 'b': 1}",
                     "assert helper().v == 1", "import math\nassert math.isclose(add(0.1, 0.2), 0.3)",
                     "assert list(squares(3)) == [0, 1, 4]", "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]",
                     "r = cyclic()\nassert r[0] == 1 and r[1] is r"]
    r = pool.run_tests(code, tests, limits=SHORT, guard_solution=True)
    assert r.all_passed, [(o.status, o.detail) for o in r.per_test]


IN_TEST_ATTACKS = {
    "memory_bomb": ("x = 'm' * (1 << 30)", "memory"),
    "fork_bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", "timeout"),
    "busy_loop": ("while True:\n    pass", "timeout"),
    "segfault": ("import faulthandler\nfaulthandler._sigsegv()", "crashed"),
    "setsid_daemon": ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nassert False", "failed"),
}


@pytest.mark.parametrize("name", sorted(IN_TEST_ATTACKS))
def test_attacks_inside_one_test_fail_only_that_test(pool, name):
    attack, status = IN_TEST_ATTACKS[name]
    code = "def ok():\n    return 1\n"
    tests = ["assert ok() == 1", attack, "assert ok() == 1"]
    r = pool.run_tests(code, tests, limits=Limits(timeout_s=1, memory_mb=128, max_processes=32))
    assert [o.status for o in r.per_test] == ["passed", status, "passed"], [(o.status, o.detail) for o in r.per_test]
