"""Progress for long work: a live bar on a terminal, plain lines in a log.

A tqdm bar redraws itself with carriage returns; written to a file (CI logs, ``nohup``, ``> log``)
every redraw becomes text, thousands of lines of it. Without a terminal, :func:`make_progress` returns
a :class:`PlainProgress` instead, which prints one ordinary line every ``every`` steps or
``interval_s`` seconds (whichever comes first), plus the last one. Both take the same calls:
``update(n)``, ``set_postfix(**values)``, ``write(message)``, ``close()``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def make_progress(total: int, desc: str, *, initial: int = 0, enabled: bool = True, unit: str = "step",
             stream: TextIO | None = None, every: int | None = None, interval_s: float = 30.0,
             until: str | None = None):
    """A progress reporter for ``total`` units, or None when ``enabled`` is False.

    A tqdm bar when ``stream`` (default: stderr) is a terminal, else a :class:`PlainProgress`.
    ``RLVR_PROGRESS=plain`` or ``=bar`` forces one or the other. ``until`` names a stop rule that may end
    the run before ``total`` (SFT's ``eval.stop_at_accuracy``): ``total`` is then a cap, and the time left
    is an upper bound, said as such.
    """
    if not enabled:
        return None
    stream = stream or sys.stderr
    mode = os.environ.get("RLVR_PROGRESS", "").lower()
    if mode == "bar" or (mode != "plain" and _is_terminal(stream)):
        from tqdm.auto import tqdm

        label = f"{desc} (at most {total}; stops at {until})" if until else desc
        return tqdm(total=total, initial=initial, desc=label, unit=unit, dynamic_ncols=True, file=stream)
    return PlainProgress(total, desc, initial=initial, unit=unit, stream=stream, every=every, interval_s=interval_s,
                         until=until)


class PlainProgress:
    """One line per ``every`` units or ``interval_s`` seconds: ``grpo: step 50/600 (8%), 2.1 s/step,
    eta 19m, reward=0.41 acc=0.38``. ``every`` defaults to a tenth of the total (at least 1)."""

    def __init__(self, total: int, desc: str, *, initial: int = 0, unit: str = "step", stream: TextIO | None = None,
                 every: int | None = None, interval_s: float = 30.0, until: str | None = None):
        self.total, self.desc, self.unit, self.until = total, desc, unit, until
        self.n = initial
        self.stream = stream or sys.stderr
        self.every = every or max(1, total // 10)
        self.interval_s = interval_s
        self.postfix: dict[str, Any] = {}
        self._start_n, self._start_t = initial, time.monotonic()
        self._last_n, self._last_t = initial, self._start_t
        self._closed = False

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        due = self.n - self._last_n >= self.every or now - self._last_t >= self.interval_s
        if due or self.n >= self.total:
            self._print(now)

    def set_postfix(self, **values: Any) -> None:
        self.postfix = values

    def write(self, message: str) -> None:
        print(message, file=self.stream, flush=True)

    def _print(self, now: float) -> None:
        done = self.n - self._start_n
        rate = (now - self._start_t) / done if done else 0.0
        parts = [f"{self.desc}: {self.unit} {self.n}/{self.total} ({100 * self.n / max(self.total, 1):.0f}%)"]
        if done:
            parts.append(f"{rate:.2f} s/{self.unit}")
            left = rate * (self.total - self.n)
            if left > 0:  # with a stop rule, the cap's time: an upper bound
                parts.append(f"eta at most {_duration(left)} (stops at {self.until})" if self.until
                             else f"eta {_duration(left)}")
        if self.postfix:
            parts.append(" ".join(f"{k}={v}" for k, v in self.postfix.items()))
        print(", ".join(parts), file=self.stream, flush=True)
        self._last_n, self._last_t = self.n, now

    def close(self) -> None:
        if not self._closed and self.n != self._last_n:
            self._print(time.monotonic())
        self._closed = True

    def __enter__(self) -> "PlainProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
