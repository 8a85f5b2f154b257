"""The Ray backend of the verifier runner: same rewards as the local pool, lost actors retried or reported.

tests/test_runner.py runs its deadline, crash, thread and metrics tests on both backends; these are the
Ray-only behaviours. All use one local Ray (the ``ray_cluster`` fixture)."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from rlvr.sandbox import capabilities
from rlvr.verifiers import Reward, Verifier, register_verifier
from rlvr.verifiers.runner import VerifierRunner

pytestmark = pytest.mark.ray
STRONG = capabilities()["isolation"] == "strong"


@register_verifier("test_dies_once")
class DiesOnce(Verifier):
    """Kills its own process the first time it sees a completion (a marker file remembers), then scores."""

    def __init__(self, marker_dir: str):
        self.marker_dir = marker_dir

    def score(self, completion: str, reference: dict) -> Reward:
        marker = os.path.join(self.marker_dir, completion)
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(9)
        return Reward(1.0 if completion == reference["answer"] else 0.0, info={"pid": os.getpid()})


@register_verifier("test_slow_echo")
class SlowEcho(Verifier):
    def score(self, completion: str, reference: dict) -> Reward:
        time.sleep(float(reference.get("sleep", 0)))
        return Reward(1.0 if completion == reference["answer"] else 0.0, info={"pid": os.getpid()})


@register_verifier("test_dies_on_die")
class DiesOnDie(SlowEcho):
    def score(self, completion: str, reference: dict) -> Reward:
        if completion == "die":
            os._exit(3)
        return super().score(completion, reference)


@register_verifier("test_ray_unpicklable")
class Unpicklable(SlowEcho):
    def __init__(self):
        self.lock = threading.Lock()  # cannot be pickled: the runner scores it in-process


@pytest.fixture(scope="module")
def ray_runner(ray_cluster):
    with VerifierRunner(workers=2, timeout_s=20, backend="ray", cache_size=0) as r:
        yield r


def test_same_rewards_as_the_local_pool_on_math_and_code(ray_runner):
    math = [r"so \boxed{42}", r"\boxed{\frac{84}{2}}", r"\boxed{41}", "no answer", r"\boxed{42.0}"]
    code = ["```python\ndef f():\n    return 1\n```", "```python\ndef f():\n    return 2\n```",
            "```python\ndef f():\n    while True: pass\n```", "no code"]
    code_options = {"allow_weak_isolation": not STRONG, "sandbox_slots": 1, "timeout_s": 2, "total_timeout_s": 3}
    with VerifierRunner(workers=2, timeout_s=20, cache_size=0) as local:
        for verifier, completions, references, options in (
                ("math", math, [{"answer": "42"}] * len(math), None),
                ("code", code, [{"tests": ["assert f() == 1"]}] * len(code), code_options)):
            here = local.score_batch(verifier, completions, references, options)
            there = ray_runner.score_batch(verifier, completions, references, options)
            assert [(r.status, r.score) for r in there] == [(r.status, r.score) for r in here]
    assert [r.score for r in here][:2] == [1.0, 0.0]


def test_an_actor_killed_under_an_item_has_the_item_retried(ray_cluster):
    with VerifierRunner(workers=2, timeout_s=20, backend="ray", cache_size=0) as r:
        r.score_batch("test_slow_echo", ["warm"], [{"answer": "warm"}])  # actors up
        pool = r._pool
        out = {}
        thread = threading.Thread(target=lambda: out.update(rewards=r.score_batch(
            "test_slow_echo", ["a", "b", "c", "d"], [{"answer": "a", "sleep": 1.5}] * 4)))
        thread.start()
        time.sleep(0.7)  # both actors are inside their first item
        for actor in list(pool._all):
            ray_cluster.kill(actor.handle, no_restart=True)  # as a lost node would
        thread.join(timeout=60)
        assert not thread.is_alive()
        assert [(x.status, x.score) for x in out["rewards"]] == [("ok", 1.0), ("ok", 0.0), ("ok", 0.0), ("ok", 0.0)]
        assert pool.retried >= 2 and pool.alive() == 2


def test_an_item_that_always_kills_its_actor_is_reported_not_scored_zero(ray_cluster, tmp_path):
    with VerifierRunner(workers=2, timeout_s=20, backend="ray", cache_size=0) as r:
        options = {"marker_dir": str(tmp_path)}
        rewards = r.score_batch("test_dies_once", ["x", "y"], [{"answer": "x"}] * 2, options)
        assert [(x.status, x.score) for x in rewards] == [("ok", 1.0), ("ok", 0.0)]  # died once each, retried
        assert r._pool.retried == 2
    with VerifierRunner(workers=1, timeout_s=20, backend="ray") as r:
        died = r.score_batch("test_dies_on_die", ["die", "a"], [{"answer": "a"}] * 2)
        assert (died[0].status, died[0].score) == ("error", 0.0)
        assert "died on this item 2 times" in died[0].info["error"]
        assert (died[1].status, died[1].score) == ("ok", 1.0)
        assert r.metrics()["verify/test_dies_on_die/error"] == 1.0


def test_unportable_verifier_is_scored_in_process(ray_runner, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="rlvr.verifiers.runner"):
        rewards = ray_runner.score_batch("test_ray_unpicklable", ["a"], [{"answer": "a"}])
    assert rewards[0].info["pid"] == os.getpid() and "without a deadline" in caplog.text


def test_close_stops_the_actors_and_a_later_batch_starts_new_ones(ray_cluster):
    r = VerifierRunner(workers=1, timeout_s=20, backend="ray")
    pid = r.score_batch("test_slow_echo", ["a"], [{"answer": "a"}])[0].info["pid"]
    pool = r._pool
    r.close()
    assert pool.closed and pool.alive() == 0
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not os.path.exists(f"/proc/{pid}")
    assert r.score_batch("test_slow_echo", ["b"], [{"answer": "b"}])[0].score == 1.0
    r.close()


def test_default_size_is_one_actor_per_cluster_cpu(ray_cluster):
    with VerifierRunner(backend="ray", ray_num_cpus=3) as r:  # 2 x 3 CPUs fit beside ray_runner's 2
        r.score_batch("test_slow_echo", ["a"], [{"answer": "a"}])
        assert r._pool.size == 2  # 8 // 3: the fixture's cluster has 8 CPUs


def test_default_size_divides_the_cluster_between_torchrun_ranks(ray_cluster, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with VerifierRunner(backend="ray", ray_num_cpus=2) as r:
        r.score_batch("test_slow_echo", ["a"], [{"answer": "a"}])
        assert r._pool.size == 2  # 8 CPUs // 2 per actor // 2 ranks


def test_configuration_errors():
    with pytest.raises(ValueError, match="valid backends: local, ray"):
        VerifierRunner(backend="dask")
    with pytest.raises(ValueError, match="workers >= 1"):
        VerifierRunner(backend="ray", workers=0)


def test_a_missing_ray_is_named_with_the_install_command(monkeypatch):
    from rlvr.verifiers import ray_pool

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"pip install 'rlvr\[ray\]'"):
        ray_pool.import_ray()


@pytest.mark.slow
def test_a_training_run_on_ray_actors_learns_what_a_local_run_does(ray_cluster, taught_model, tmp_path):
    """Same seed, same rewards: a GRPO run scored by Ray actors logs the local run's rewards step for step."""
    from rlvr.recipes import grpo
    from rlvr.run.tracking import read_metrics
    from test_grpo import _config

    runs = {}
    for backend in ("local", "ray"):
        out = tmp_path / backend
        grpo.train(_config(taught_model, out, "algorithm.beta=0", f"verifier.backend={backend}", "verifier.workers=2"))
        runs[backend] = [(r["step"], r.get("reward/mean"), r.get("verify/status_ok")) for r in read_metrics(out / "metrics.jsonl")]
    assert runs["ray"] == runs["local"]
    assert sum(r[2] or 0 for r in runs["ray"]) == 3 * 32  # every sample of the 3 steps scored ok
