"""The harness: runs a program, or a solution and its tests, inside the locked-down run process.

Runs *inside* the sandbox, standard library only, with no class that has Python methods (see
``sandbox.pyguard``). Two entry points, both ending the process with ``os._exit``:

* :func:`run_program` — ``execute()``: the code runs as ``__main__`` like ``python solution.py``
  (exit code, uncaught-exception traceback on stderr, atexit handlers, non-daemon threads joined).
* :func:`run_tests` — ``run_tests()``: the setup code and the solution run once under a timer;
  then each test runs in a fresh fork of that process, in a fresh copy of the namespace, after
  the standard modules are restored, with its own timeout. With ``guard_solution`` the tests
  are compiled first, before any program code runs, with their comparisons and calls routed
  through the guard (``testguard.instrument_test``: plain data only), and the solution's functions
  the tests call are wrapped: after every call the modules tests use are restored again and the
  returned value is checked (``testguard.make_guard``). This process (the parent) waits for
  each test with a pidfd and kills what is left of it (``kill(-1)`` reaches every process of the
  slot's uid except the caller) before the next one starts.

Results travel as lines ``<nonce> <json>\\n`` on an inherited pipe (``RESULT_FD``): not stdout,
not the exit code, not a file. The nonce lives only in a closure held by local variables, every
line is written with one ``write(2)`` below PIPE_BUF (atomic), and no library code that the
program could have patched takes part in building a line (only functions captured here, at import
time in the zygote, before any program ran). The host counts a test as passed only when it reads
``{"ev":"pass","i":N}`` with the right nonce; anything else on that pipe marks the run as tampered.
"""

from __future__ import annotations

import atexit
import builtins
import gc
import json.encoder
import os
import select
import signal
import sys
import threading
import time
import types

from . import pyguard, testguard  # relative: the same source runs as rlvr.sandbox.* here and as sandbox.* inside (see launch.py)

RESULT_FD = 3
DETAIL_CHARS = 600  # keeps every record far below PIPE_BUF (4096 bytes)

# Captured at import, in the zygote, before any program ran: a program can replace module
# attributes and builtins, but not these references (and not the C functions they point to).
# Everything below that runs after a program started uses only these names (no bare builtin
# such as ``enumerate`` or ``BaseException``: a program could have swapped them).
_write, _fork, _exit, _kill, _waitpid = os.write, os.fork, os._exit, os.kill, os.waitpid
_pidfd_open, _close, _select, _setpgid = os.pidfd_open, os.close, select.select, os.setpgid
_getpid, _getppid = os.getpid, os.getppid
_setitimer, _ITIMER_REAL = signal.setitimer, signal.ITIMER_REAL
_compile, _exec, _str, _type, _isinstance, _slice = compile, exec, str, type, isinstance, slice
_enumerate, _frozenset, _bool, _float, _int, _len = enumerate, frozenset, bool, float, int, len
_dict_items = dict.items
_BaseException, _SystemExit, _MemoryError, _OSError = BaseException, SystemExit, MemoryError, OSError
_SIGKILL = signal.SIGKILL
_WIFSIGNALED, _WTERMSIG, _WEXITSTATUS = os.WIFSIGNALED, os.WTERMSIG, os.WEXITSTATUS
_str_getitem = str.__getitem__
_type_name = type.__dict__["__name__"].__get__
_json_str = json.encoder.encode_basestring_ascii  # the C encoder when _json is available
_perf = time.perf_counter
_stdout, _stderr = sys.stdout, sys.stderr
_excepthook = sys.__excepthook__
_run_exitfuncs = atexit._run_exitfuncs
_thread_shutdown = threading._shutdown
_test_namespace = pyguard.test_namespace
_gc_collect, _gc_freeze = gc.collect, gc.freeze
_guard_functions = testguard.guard_solution_functions
_ReturnRejected = testguard.ReturnRejected
_CodeType = types.CodeType


def make_emitter(fd: int, nonce: str):
    """``emit(body)`` writes one authenticated record; ``body`` is a JSON object built here."""
    prefix = nonce + " "

    def emit(body: str) -> None:
        _write(fd, (prefix + body + "\n").encode())

    return emit


def _text(value, limit: int = DETAIL_CHARS) -> str:
    """An exact ``str`` of at most ``limit`` characters, without calling methods a str subclass
    may have overridden."""
    if not _isinstance(value, _str):
        return "<not a string>"
    return _str_getitem(value, _slice(0, limit))


def describe(exc: BaseException, frames, test_name: str | None = None, source: str | None = None) -> str:
    """``"AssertionError: msg (test line 3: assert f(2) == 4)"`` for a failed test or setup."""
    name = _type_name(_type(exc))
    try:
        msg = _text(_str(exc))
    except _BaseException:  # a program-defined __str__ may raise anything
        msg = "<unprintable>"
    where = ""
    if test_name is not None:
        frames(True)  # the harness reads the traceback; no program code runs meanwhile
        try:
            tb, line = exc.__traceback__, None
            while tb is not None:
                if tb.tb_frame.f_code.co_filename == test_name:
                    line = tb.tb_lineno
                tb = tb.tb_next
        finally:
            frames(False)
        if line is not None and source is not None:
            lines = source.splitlines()
            text = lines[line - 1].strip() if 0 < line <= _len(lines) else ""
            where = " (test line %d: %s)" % (line, _text(text, 200))
    return _text("%s: %s%s" % (name, msg, where) if msg else "%s%s" % (name, where))


def _kind(exc: BaseException) -> str:
    if _isinstance(exc, _MemoryError):
        return "memory"
    if _isinstance(exc, _ReturnRejected):
        return "rejected"
    return "failed"


def _flush(current: bool = True) -> None:
    """Flush stdout/stderr: the program's current ones (``current``) and the original ones. The
    run process itself passes False after the solution loaded, so no program code runs there."""
    for stream in ((sys.stdout, sys.stderr, _stdout, _stderr) if current else (_stdout, _stderr)):
        try:
            stream.flush()
        except _BaseException:
            pass


# --- execute() ------------------------------------------------------------------------------

def run_program(code: str, emit) -> None:
    """Run ``code`` as ``__main__`` and exit with its exit status, like ``python solution.py``."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    sys.argv = ["solution.py"]
    status = 0
    try:
        _exec(_compile(code, pyguard.SOLUTION_FILENAME, "exec"), main.__dict__)
    except _SystemExit as exc:
        status = _exit_status(exc.code)
    except _BaseException as exc:
        if _isinstance(exc, _MemoryError):
            emit('{"ev":"uncaught","kind":"memory"}')
        try:
            _excepthook(_type(exc), exc, exc.__traceback__)
        except _BaseException:
            pass
        status = 1
    for finish in (_thread_shutdown, _run_exitfuncs):  # what interpreter shutdown would do
        try:
            finish()
        except _BaseException:
            pass
    _flush()
    _exit(status)


def _exit_status(code) -> int:
    if code is None:
        return 0
    if _isinstance(code, _int):
        return code & 0xFF
    try:
        _stderr.write(_text(_str(code), 10_000) + "\n")
    except _BaseException:
        pass
    return 1


# --- run_tests() ----------------------------------------------------------------------------

def run_tests(req: dict, emit, snap: dict, controls: dict) -> None:
    """Setup + solution once, then each test in its own fork. Never returns."""
    timeout = float(req["limits"]["timeout_s"])
    # Built before the solution runs: it must not use anything the solution could replace.
    # ``reached`` is filled in each test process with the standard modules its test can see.
    reached: list = []
    guard = testguard.make_guard(snap, reached) if req.get("guard_solution") else None
    # With the guard, the tests are compiled now, before any program code runs, with their
    # comparisons and calls routed through it (testguard.instrument_test); a test that does not
    # compile keeps its exception, raised in its own process like any failure.
    compiled: list = []
    if guard is not None:
        helpers = testguard.test_helpers(guard)
        for i, source in enumerate(req["tests"]):
            try:
                compiled.append(testguard.instrument_test(source, "<test %d>" % i))
            except BaseException as exc:
                compiled.append(exc)
    else:
        helpers = None
    ns = {"__name__": "solution", "__builtins__": builtins}
    sys.modules["__main__"] = types.ModuleType("__main__")
    harness_pid = _getpid()
    # SIGALRM keeps its default action (terminate): the setup phase cannot outlive its timer,
    # and a program cannot install a handler (seccomp refuses new signal handlers).
    _setitimer(_ITIMER_REAL, timeout)
    try:
        if req.get("setup"):
            _exec(_compile(req["setup"], "<setup>", "exec"), ns)
        _exec(_compile(req["code"], pyguard.SOLUTION_FILENAME, "exec"), ns)
    except _BaseException as exc:
        _only_the_original(harness_pid)
        _setitimer(_ITIMER_REAL, 0)
        emit('{"ev":"setup","ok":0,"kind":"%s","detail":%s}' % (_kind(exc), _json_str(describe(exc, controls["frames"]))))
        _flush(False)
        _exit(0)
    _only_the_original(harness_pid)
    _setitimer(_ITIMER_REAL, 0)
    # Let the solution's garbage die now (a finalizer may patch modules) and freeze the rest, so
    # that no finalizer of the solution's top level runs in a test process. Each test process
    # restores the modules its test can reach (pyguard.test_namespace).
    _gc_collect()
    _gc_freeze()
    # From here on this process uses only the references captured at import.
    emit('{"ev":"setup","ok":1}')
    keep = _frozenset(req.get("keep_names") or ())
    kill_all = _bool(req.get("kill_all"))  # else only the test's own process group can be reached
    for i, source in _enumerate(req["tests"]):
        _flush(False)
        start = _perf()
        pid = _fork()
        if pid == 0:
            code = compiled[i] if helpers is not None else None
            _one_test(i, source, code, ns, snap, keep, guard, helpers, reached, emit, controls)
        kind, code = _wait_test(pid, timeout)
        emit('{"ev":"end","i":%d,"kind":"%s","code":%d,"wall_s":%.6f}' % (i, kind, code, _perf() - start))
        try:  # whatever the test left behind (daemons, setsid'ed children)
            _kill(-1 if kill_all else -pid, _SIGKILL)
        except _OSError:
            pass
    emit('{"ev":"done"}')
    _flush(False)
    _exit(0)


def _one_test(i: int, source: str, code, ns: dict, snap: dict, keep, guard, helpers, reached, emit,
              controls) -> None:
    """In the forked test process: build the namespace, run, report. Never returns. ``code`` is
    the instrumented test (or the exception compiling it raised) when the guard is on."""
    name = "<test %d>" % i
    me, parent = _getpid(), _getppid()  # before any program code runs in this process
    try:
        _setpgid(0, 0)
        tns = _test_namespace(ns, snap, keep, reached)
        if guard is not None:
            _guard_functions(tns, guard["wrap"])
            for key, value in _dict_items(helpers):
                tns[key] = value
        controls["set_test_globals"](tns)
        if code is None:
            code = _compile(source, name, "exec")
        elif _type(code) is not _CodeType:
            raise code
        _exec(code, tns)
    except _BaseException as exc:
        _only_the_original(me, parent)
        detail = describe(exc, controls["frames"], name, source)
        emit('{"ev":"fail","i":%d,"kind":"%s","detail":%s}' % (i, _kind(exc), _json_str(detail)))
        _flush()
        _exit(1)
    _only_the_original(me, parent)
    emit('{"ev":"pass","i":%d}' % i)
    _flush()
    _exit(0)


def _only_the_original(pid: int, parent: int | None = None) -> None:
    """End a process that a program forked while the harness ran it: such a copy continues into
    the harness's own code and, holding the nonce, could report the outcome of a different guess
    (``return os.fork() == 0`` passes a boolean test in one of the two processes). Only the
    process the harness started may report (its pid and parent pid, read with functions captured
    before the program ran)."""
    if _getpid() != pid or (parent is not None and _getppid() != parent):
        _exit(0)


def _wait_test(pid: int, timeout: float) -> tuple[str, int]:
    """Wait for one test process: ("exited", code), ("signaled", signo) or ("timeout", 0)."""
    pidfd = _pidfd_open(pid)
    try:
        ready, _, _ = _select([pidfd], [], [], timeout)
    finally:
        _close(pidfd)
    if not ready:
        for target in (-pid, pid):
            try:
                _kill(target, _SIGKILL)
            except _OSError:
                pass
        _waitpid(pid, 0)
        return "timeout", 0
    _, status = _waitpid(pid, 0)
    if _WIFSIGNALED(status):
        return "signaled", _WTERMSIG(status)
    return "exited", _WEXITSTATUS(status)
