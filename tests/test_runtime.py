"""Runtime helpers: the LR schedule by hand, thread choice, RNG round trip."""

import math
import os
import random
import subprocess
import sys
import time

import pytest
import torch

from rlvr.run import runtime


def test_lr_schedule_by_hand():
    f = lambda step, schedule: runtime.lr_multiplier(step, total=10, warmup=2, schedule=schedule, min_ratio=0.1)  # noqa: E731
    assert [f(s, "constant") for s in (0, 1, 2, 9)] == [0.5, 1.0, 1.0, 1.0]  # linear warm-up over 2 steps
    assert f(2, "linear") == 1.0 and f(6, "linear") == pytest.approx(1 - 0.9 * 0.5) and f(10, "linear") == pytest.approx(0.1)
    assert f(6, "cosine") == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(10, "cosine") == pytest.approx(0.1)
    with pytest.raises(ValueError, match="constant, linear, cosine"):
        f(5, "step")


@pytest.mark.parametrize("load, busy, confirm, expected", [
    (0.1, 0.05, None, 2),   # idle
    (0.7, 0.75, None, 1),   # another process on one core
    (1.2, 1.1, None, 1),
    (6.0, 2.0, None, 1),    # everything busy: still one thread
    (0.8, 0.02, 0.03, 2),   # right after pip install: the load average remembers work that has ended
    (0.9, 0.05, 1.0, 1),    # a pausing neighbour: the longer look sees it, the busier reading wins
    (0.7, None, None, 1),   # no /proc/stat: the load average decides
    (0.1, None, None, 2),
])
def test_auto_threads_leaves_busy_cores_alone(monkeypatch, load, busy, confirm, expected):
    readings = iter([busy, confirm])
    monkeypatch.setattr(runtime, "_auto_threads", None)
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(runtime, "busy_cores", lambda window_s: next(readings))
    assert runtime.auto_threads() == expected
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert runtime.auto_threads() == expected  # decided once per process


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc/stat")
def test_busy_cores_sees_a_process_spinning_on_a_core():
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 20\nwhile time.time() < end: pass"])
    try:
        time.sleep(0.3)  # let it start
        busy = runtime.busy_cores(0.5)
    finally:
        spinner.kill()
        spinner.wait()
    assert busy is not None and 0.6 <= busy <= os.cpu_count()


def test_rng_state_round_trip():
    state = runtime.rng_state()
    a = (random.random(), torch.rand(3))
    runtime.set_rng_state(state)
    b = (random.random(), torch.rand(3))
    assert a[0] == b[0] and torch.equal(a[1], b[1])
