"""The verifier worker process: reads scoring requests on stdin, writes one result per item.

Started by :class:`verifiers.pool.WorkerPool` as a fresh interpreter
(``python -c "from rlvr.verifiers._worker import main; main()"``) so that it imports ``verifiers`` and
nothing of the trainer (no torch). Frames on both pipes are a 4-byte big-endian length followed by
a pickle. Messages::

    parent -> worker   ("score", spec, blob | None, [(item_id, completion, reference, context), ...])
    worker -> parent   ("ready", pid)
                       ("result", item_id, (score, status, components, latency_s, info))
                       ("unportable", spec, error)      the verifier could not be rebuilt here

``blob`` is the pickled verifier instance, sent the first time a worker meets ``spec``. The worker
never times itself out: the parent kills it when an item overruns. It exits when stdin closes
(after calling ``close()`` on the verifiers that have one) or its parent dies (a watchdog thread
polls the parent pid, because a killed parent closes no pipe while the worker is busy).
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import sys
import threading
import time

_HEADER = struct.Struct(">I")


def read_frame(stream) -> object | None:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    body = stream.read(size)
    if len(body) < size:
        return None
    return pickle.loads(body)


def encode_frame(message: object) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(0)


def limit_memory(megabytes: int) -> None:
    """Cap this process's data segment (0 = no cap): a runaway answer fails instead of swapping."""
    if megabytes > 0:
        import resource

        limit = megabytes * 1024 * 1024
        try:
            resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        except (ValueError, OSError):
            pass


def _result_tuple(reward) -> tuple:
    from rlvr.verifiers.base import coerce_reward

    r = coerce_reward(reward)
    info = r.info
    try:
        pickle.dumps(info)
    except Exception:  # an unpicklable info value must not lose the score
        info = {k: repr(v)[:500] for k, v in info.items()}
    return (r.score, r.status, dict(r.components), r.latency_s, info)


def score_item(impl, completion: str, reference: dict, context: dict) -> tuple:
    """One item's result tuple; a verifier that raises gives an ``error`` result, it does not kill the
    process. The latency is the verifier's own, or else the time the call took."""
    from rlvr.verifiers.base import error_reward, score_sample

    start = time.perf_counter()
    try:
        reward = score_sample(impl, completion, reference, context)
    except Exception as exc:
        reward = error_reward(exc)
    result = _result_tuple(reward)
    if not result[3]:
        result = result[:3] + (time.perf_counter() - start,) + result[4:]
    return result


def _close_all(instances: dict) -> None:
    """Graceful shutdown (stdin closed): let verifiers that hold resources release them, e.g.
    the code verifier's sandbox pool and its cgroups, before the parent's grace period ends."""
    for impl in instances.values():
        close = getattr(impl, "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                pass


def main() -> None:
    out = os.fdopen(os.dup(1), "wb", buffering=0)  # the protocol channel
    os.dup2(2, 1)  # a verifier's stray print() must not corrupt the protocol
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    threading.Thread(target=_watch_parent, args=(int(os.environ.get("RLVR_VERIFIER_PARENT", os.getppid())),),
                     daemon=True).start()
    limit_memory(int(os.environ.get("RLVR_VERIFIER_MEMORY_MB", "0") or 0))

    import rlvr.verifiers  # noqa: F401  (registers the built-ins)
    from rlvr.verifiers.math import symbolic

    symbolic.warm()  # import sympy/math-verify now, not inside the first item's deadline
    out.write(encode_frame(("ready", os.getpid())))
    instances: dict[str, object] = {}
    stdin = sys.stdin.buffer
    while True:
        message = read_frame(stdin)
        if message is None:
            _close_all(instances)
            return
        _kind, spec, blob, items = message
        impl = instances.get(spec)
        if impl is None:
            try:
                impl = pickle.loads(blob)
            except Exception as exc:
                out.write(encode_frame(("unportable", spec, f"{type(exc).__name__}: {exc}")))
                continue
            instances[spec] = impl
        for item_id, completion, reference, context in items:
            out.write(encode_frame(("result", item_id, score_item(impl, completion, reference, context))))


if __name__ == "__main__":
    main()
