"""Calls the caller stops waiting for: each in a daemon thread of its own, given up at its deadline.

A judge call, an environment step or a typed tool is code that may never return. Python cannot kill
a thread, so the only deadline that holds is the caller's: :func:`run_with_deadlines` runs the calls
at most ``workers`` at once, stops waiting for each at its deadline (and for all of them at the
batch's), and returns every call's :class:`Outcome`. An abandoned call runs on in its daemon thread
(which never holds up the interpreter's exit) and its late result is dropped; its slot goes to the
next call at once, so a runaway costs a thread, never the caller's time. A Ctrl-C in the caller
propagates at once: the calls in flight are left to end on their own and no new one starts.

Used by the judge's HTTP backend (:mod:`rlvr.verifiers.judge_backends`), the episode runner's
environment steps (:mod:`rlvr.rollout.episodes`) and typed tools (:func:`rlvr.tasks.tools.call_tool`).
"""

from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

__all__ = ["Outcome", "run_with_deadlines"]

#: The longest the caller waits without checking for a signal (a Ctrl-C) and for deadlines passed.
POLL_S = 0.1


@dataclass
class Outcome:
    """How one call of :func:`run_with_deadlines` ended: its ``value``, the ``error`` it raised, or
    ``timed_out`` (still running at its deadline, or never started before the batch's, and abandoned)."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False


def run_with_deadlines(calls: Sequence[Callable[[], Any]], timeout_s: float | None | Sequence[float | None],
                       workers: int = 1, name: str = "rlvr-call", *, deadline: float | None = None) -> list[Outcome]:
    """Run ``calls`` (no arguments each), at most ``workers`` at once, and return their outcomes in order
    once every call has returned or passed its deadline (see the module docstring).

    ``timeout_s`` is one limit in seconds for every call, or one per call (None: no limit), counted from
    the call's start. ``deadline`` (a ``time.monotonic()`` time, None: none) ends the whole batch: calls
    running then are abandoned and calls not started are ``timed_out`` too. Exceptions of any kind,
    ``SystemExit`` included, are the call's outcome and never propagate.
    """
    limits = list(timeout_s) if isinstance(timeout_s, Sequence) else [timeout_s] * len(calls)
    outcomes: list[Outcome] = [Outcome(timed_out=True)] * len(calls)
    finished: queue.SimpleQueue = queue.SimpleQueue()
    pending = iter(range(len(calls)))
    running: dict[int, float] = {}  # calls running, and when each is given up
    end = math.inf if deadline is None else deadline

    def start(index: int) -> None:
        def target() -> None:
            try:
                finished.put((index, Outcome(value=calls[index]())))
            except BaseException as exc:  # noqa: BLE001 - whatever the call does is its outcome
                finished.put((index, Outcome(error=exc)))

        limit = limits[index]
        running[index] = min(end, math.inf if limit is None else time.monotonic() + limit)
        threading.Thread(target=target, name=f"{name}-{index}", daemon=True).start()

    def fill() -> None:
        while len(running) < max(workers, 1) and time.monotonic() < end and (index := next(pending, None)) is not None:
            start(index)

    fill()
    while running:
        # in slices of at most POLL_S: a blocked get would hold a Ctrl-C until some call returns
        wait = min(running.values()) - time.monotonic()
        try:
            index, outcome = finished.get(timeout=min(POLL_S, max(wait, 0.0)))
        except queue.Empty:
            now = time.monotonic()
            for index in [i for i, given_up in running.items() if given_up <= now]:
                del running[index]  # abandoned: outcomes[index] stays timed_out
        else:
            if index in running:  # else the late result of a call already given up
                outcomes[index] = outcome
                del running[index]
        fill()
    return outcomes
