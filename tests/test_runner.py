"""VerifierRunner: process pool, hard deadline, crashes, threads, cache, metrics, fallbacks.

The tests that take the ``runner`` fixture run twice: on local worker processes and on Ray actors
(``verifier.backend: ray``; skipped where Ray is not installed)."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from rlvr.verifiers import Reward, Verifier, register_verifier
from rlvr.verifiers.runner import VerifierRunner

CALLS = {"n": 0}


@register_verifier("test_behaviour")
class Behaviour(Verifier):
    """Does what the completion says: ok, hang, die, raise, sleep:<s>, modules, none, nan."""

    def score(self, completion: str, reference: dict) -> Reward:
        CALLS["n"] += 1
        if completion == "hang":
            while True:
                pass
        if completion == "die":
            os._exit(3)
        if completion == "raise":
            raise RuntimeError("boom")
        if completion.startswith("sleep:"):
            time.sleep(float(completion[6:]))
        if completion == "modules":
            return Reward(1.0, info={"torch": "torch" in sys.modules, "pid": os.getpid()})
        if completion == "none":
            return None
        return Reward(1.0 if completion == reference.get("answer") else 0.0, info={"pid": os.getpid()})


@register_verifier("test_uncacheable")
class Uncacheable(Behaviour):
    cacheable = False


@register_verifier("test_unpicklable")
class Unpicklable(Behaviour):
    def __init__(self):
        self.lock = threading.Lock()  # cannot be pickled: the runner scores it in-process


def worker_pids() -> set[int]:
    """Live verifier worker processes started by this process."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and b"rlvr.verifiers._worker" in cmdline and not stat.rsplit(")", 1)[1].split()[0] == "Z":
            pids.add(int(entry.name))
    return pids


@pytest.fixture(scope="module", params=["local", pytest.param("ray", marks=pytest.mark.ray)])
def runner(request):
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
    with VerifierRunner(workers=2, timeout_s=1.0, backend=request.param) as r:
        yield r


def live_workers(runner: VerifierRunner, expected: int) -> int:
    """The runner's live workers, polled for a few seconds until there are ``expected``: a replacement
    spawned as a batch ends shows the parent's command line in /proc until its exec completes."""
    deadline = time.monotonic() + 5
    while True:
        count = len(worker_pids()) if runner.backend == "local" else runner._pool.alive()
        if count == expected or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def test_results_in_order_with_each_failure_kind(runner):
    items = ["a", "hang", "b", "die", "raise", "c", "none", "a"]
    start = time.perf_counter()
    rewards = runner.score_batch("test_behaviour", items, [{"answer": "a"}] * len(items))
    elapsed = time.perf_counter() - start
    assert [r.status for r in rewards] == ["ok", "timeout", "ok", "error", "error", "ok", "abstain", "ok"], \
        [r.info for r in rewards]
    assert [r.score for r in rewards] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert rewards[1].latency_s == pytest.approx(1.0) and "deadline" in rewards[1].info["error"]
    assert "died" in rewards[3].info["error"] and "boom" in rewards[4].info["error"]
    assert elapsed < 8
    assert live_workers(runner, 2) == 2  # killed workers were replaced, none leaked


def test_deadline_holds_when_called_from_threads(runner):
    out: dict[int, list[str]] = {}

    def work(k: int) -> None:
        rewards = runner.score_batch("test_behaviour", ["hang" if k % 2 else f"x{k}", f"x{k}"],
                                     [{"answer": f"x{k}"}] * 2)
        out[k] = [r.status for r in rewards] + [str(r.score) for r in rewards]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert time.perf_counter() - start < 15
    assert out[0] == ["ok", "ok", "1.0", "1.0"] and out[2] == ["ok", "ok", "1.0", "1.0"]
    assert out[1][:2] == ["timeout", "ok"] and out[3][:2] == ["timeout", "ok"]


def test_workers_import_verifiers_not_torch(runner):
    reward = runner.score_batch("test_behaviour", ["modules"], [{}])[0]
    assert reward.info["torch"] is False
    assert reward.info["pid"] != os.getpid()


def test_math_hostile_input_from_a_thread_times_out_or_errors(runner):
    hostile = [r"\boxed{" + r"\frac{1}{" * 500 + "2" + "}" * 500 + "}", r"\boxed{9^{9^{9^{9}}}}",
               "The answer is " + "1e|" * 1000, r"\boxed{" + "(" * 5000 + "1" + ")" * 5000 + "}", r"\boxed{42}"]
    result = {}
    thread = threading.Thread(target=lambda: result.update(
        r=runner.score_batch("math", hostile, [{"answer": "42"}] * len(hostile))))
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    rewards = result["r"]
    assert all(r.score == 0.0 and r.status in ("ok", "error", "timeout") for r in rewards[:-1])
    assert rewards[-1].score == 1.0


def test_cache_and_in_batch_duplicates():
    with VerifierRunner(workers=0) as r:
        CALLS["n"] = 0
        first = r.score_batch("test_behaviour", ["a", "a", "b", "a"], [{"answer": "a"}] * 4)
        assert CALLS["n"] == 2  # "a" scored once, "b" once
        assert [x.score for x in first] == [1.0, 1.0, 0.0, 1.0]
        first[0].info["tampered"] = True  # callers get copies: the cache is not affected
        second = r.score_batch("test_behaviour", ["a", "b"], [{"answer": "a"}] * 2)
        assert CALLS["n"] == 2 and "tampered" not in second[0].info and second[0].info["cached"] is True
        assert r.score_batch("test_behaviour", ["a"], [{"answer": "b"}])[0].score == 0.0  # reference is in the key
        assert r.score_batch("test_behaviour", ["a"], [{"answer": "a"}], {})[0].score == 1.0
        r.score_batch("test_behaviour", ["raise", "raise"], [{}, {}])
        r.score_batch("test_behaviour", ["raise"], [{}])
        assert CALLS["n"] == 5  # errors are not cached (raise scored once per batch)
        CALLS["n"] = 0
        r.score_batch("test_uncacheable", ["a", "a"], [{"answer": "a"}] * 2)
        assert CALLS["n"] == 2
        m = r.metrics()
        assert m["verify/test_behaviour/cache_hits"] == 3.0  # in-batch duplicates are not cache hits
        assert m["verify/test_behaviour/ok"] == 8.0 and m["verify/test_behaviour/error"] == 3.0


def test_cache_is_bounded():
    with VerifierRunner(workers=0, cache_size=10) as r:
        r.score_batch("test_behaviour", [str(i) for i in range(100)], [{"answer": "1"}] * 100)
        assert len(r.cache) == 10


def test_metrics_names(runner):
    runner.score_batch("test_behaviour", ["a", "b"], [{"answer": "a"}] * 2)
    m = runner.metrics()
    for key in ("verify/test_behaviour/ok", "verify/test_behaviour/latency_p50_ms",
                "verify/test_behaviour/latency_p95_ms", "verify/test_behaviour/timeout", "verify/test_behaviour/cache_hits"):
        assert key in m and isinstance(m[key], float)
    assert m["verify/test_behaviour/latency_p50_ms"] <= m["verify/test_behaviour/latency_p95_ms"]


def test_unportable_verifier_is_scored_in_process_with_a_warning(caplog):
    with VerifierRunner(workers=1) as r, caplog.at_level(logging.WARNING, logger="rlvr.verifiers.runner"):
        rewards = r.score_batch("test_unpicklable", ["a", "b"], [{"answer": "a"}] * 2)
        assert [x.score for x in rewards] == [1.0, 0.0]
        assert rewards[0].info["pid"] == os.getpid()
        assert "without a deadline" in caplog.text


def test_main_module_verifier_is_scored_in_process(caplog, monkeypatch):
    """A class from the parent's __main__ pickles by reference but cannot be rebuilt in a worker."""
    Local = type("MainLike", (Behaviour,), {"__module__": "__main__"})
    monkeypatch.setattr(sys.modules["__main__"], "MainLike", Local, raising=False)
    register_verifier("test_main_local", overwrite=True)(Local)
    with VerifierRunner(workers=1) as r, caplog.at_level(logging.WARNING, logger="rlvr.verifiers.runner"):
        assert r.score_batch("test_main_local", ["a"], [{"answer": "a"}])[0].info["pid"] == os.getpid()
        assert "__main__" in caplog.text


def test_in_process_mode_starts_no_workers():
    before = worker_pids()
    with VerifierRunner(workers=0) as r:
        assert r.score_batch("math", [r"\boxed{1}"], [{"answer": "1"}])[0].score == 1.0
        assert worker_pids() == before


def test_close_stops_workers_and_a_later_batch_restarts_them():
    before = worker_pids()
    r = VerifierRunner(workers=1, timeout_s=2)
    r.score_batch("test_behaviour", ["a"], [{"answer": "a"}])
    pids = worker_pids() - before
    assert len(pids) == 1
    r.close()
    assert not (worker_pids() & pids)
    assert r.score_batch("test_behaviour", ["a"], [{"answer": "a"}])[0].score == 1.0
    r.close()


def test_configuration_errors_raise():
    with VerifierRunner(workers=0) as r:
        with pytest.raises(KeyError, match="valid verifiers"):
            r.score_batch("no_such_verifier", ["a"], [{}])
        with pytest.raises(TypeError, match="valid options"):
            r.score_batch("math", ["a"], [{}], {"tolerence": 1})
        with pytest.raises(ValueError):
            r.score_batch("math", ["a", "b"], [{}])
    assert VerifierRunner(workers=0).score_batch("math", [], []) == []
    with pytest.raises(ValueError):
        VerifierRunner(workers=-1)


def test_workers_exit_when_their_parent_is_killed(tmp_path):
    """A trainer killed with SIGKILL closes nothing: its workers must notice and exit on their own."""
    import signal
    import subprocess

    script = (
        "import os, sys, time; from verifiers.runner import VerifierRunner; "
        "r = VerifierRunner(workers=2, timeout_s=5); r.score_batch('math', ['1'], [{'answer': '1'}]); "
        "print(' '.join(str(w.proc.pid) for w in r._pool._all), flush=True); time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1])
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in pids if Path(f"/proc/{p}").exists()
                 and Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    assert not alive, f"workers {alive} outlived their parent"


def test_workers_that_cannot_start_give_errors_not_a_hang(monkeypatch):
    from rlvr.verifiers import pool

    monkeypatch.setattr(pool, "WORKER_COMMAND", [sys.executable, "-c", "import sys; sys.exit(3)"])
    with VerifierRunner(workers=2, timeout_s=2) as r:
        for _ in range(2):  # the second batch must not wait for workers the first one lost
            start = time.perf_counter()
            rewards = r.score_batch("test_behaviour", ["a", "b", "c"], [{"answer": "a"}] * 3)
            assert time.perf_counter() - start < 30
            assert {x.status for x in rewards} == {"error"}
            assert "fail to start" in rewards[0].info["error"]
    monkeypatch.undo()
    with VerifierRunner(workers=1, timeout_s=5) as r:  # and a healthy pool afterwards still works
        assert r.score_batch("test_behaviour", ["a"], [{"answer": "a"}])[0].score == 1.0


def test_in_process_verifiers_skip_the_workers():
    """``in_process = True`` (numeric, repetition, overlong length, a compose of them) is scored in the
    calling thread even with workers: no pool is started for it. Anything else still gets workers."""
    from rlvr.verifiers.registry import get_verifier

    assert get_verifier("numeric").in_process and get_verifier("repetition").in_process
    assert get_verifier("length", mode="overlong").in_process
    assert not get_verifier("math").in_process and not get_verifier("format").in_process
    assert get_verifier("compose", parts=[{"name": "numeric"}, {"name": "repetition", "weight": 0.1}]).in_process
    assert not get_verifier("compose", parts=[{"name": "numeric"}, {"name": "math"}]).in_process
    with VerifierRunner(workers=2, timeout_s=5) as r:
        rewards = r.score_batch("numeric", ["so 12", "so 13"], [{"answer": "12"}] * 2)
        assert [x.score for x in rewards] == [1.0, 0.0]
        assert r._pool is None  # no worker was started
        assert r.score_batch("math", ["12"], [{"answer": "12"}])[0].score == 1.0
        assert r._pool is not None
