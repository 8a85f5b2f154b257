"""Runtime helpers: the LR schedule by hand, thread choice, RNG round trip."""

import math
import random

import pytest
import torch

from rlvr import runtime


def test_lr_schedule_by_hand():
    f = lambda step, schedule: runtime.lr_multiplier(step, total=10, warmup=2, schedule=schedule, min_ratio=0.1)  # noqa: E731
    assert [f(s, "constant") for s in (0, 1, 2, 9)] == [0.5, 1.0, 1.0, 1.0]  # linear warm-up over 2 steps
    assert f(2, "linear") == 1.0 and f(6, "linear") == pytest.approx(1 - 0.9 * 0.5) and f(10, "linear") == pytest.approx(0.1)
    assert f(6, "cosine") == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(10, "cosine") == pytest.approx(0.1)
    with pytest.raises(ValueError, match="constant, linear, cosine"):
        f(5, "step")


@pytest.mark.parametrize("load, expected", [(0.1, 2), (0.7, 1), (1.2, 1), (6.0, 1)])
def test_auto_threads_leaves_busy_cores_alone(monkeypatch, load, expected):
    monkeypatch.setattr(runtime, "_auto_threads", None)
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (load, load, load))
    assert runtime.auto_threads() == expected
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert runtime.auto_threads() == expected  # decided once per process


def test_rng_state_round_trip():
    state = runtime.rng_state()
    a = (random.random(), torch.rand(3))
    runtime.set_rng_state(state)
    b = (random.random(), torch.rand(3))
    assert a[0] == b[0] and torch.equal(a[1], b[1])
