"""Asynchronous generation: the generator process, the staleness bound, exactness at staleness 0, a hung
or killed generator, Ctrl-C, the generator's device, the deferred canary, and resume (tiny model, seconds
each; the CUDA checks at the end need a GPU)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from rlvr.config import RunConfig, build_config
from rlvr.engines import HFEngine, SamplingParams
from rlvr.engines.process import ProcessEngine
from rlvr.modeling.loading import iter_inference_weights, load_policy, load_tokenizer
from rlvr.recipes import grpo
from rlvr.run.tracking import read_metrics
from rlvr.tasks.environments import EnvStep, register_environment


def _config(model, out, *overrides):
    raw = {
        "out": str(out),
        "model": {"path": str(model)},
        "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
        "generation": {"max_new_tokens": 3},
        "optim": {"lr": 1e-3},
        "train": {"steps": 5, "prompts_per_step": 8, "group_size": 4, "micro_batch_size": 16},
        "eval": {"at_start": False, "at_end": False},
        "checkpoint": {"every": 0},
        "log": {"progress": False, "plot_every": 0},
    }
    return build_config(RunConfig, raw, list(overrides))


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(folder / "final" / "model.safetensors")


def test_the_generator_process_samples_what_the_in_process_engine_samples(taught_model):
    policy, tokenizer = load_policy(taught_model), load_tokenizer(taught_model)
    with torch.no_grad():  # weights the folder does not hold: they must come through the publication
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))
    prompts = [tokenizer("3+4=")["input_ids"], tokenizer("1+1=")["input_ids"]]
    sampling = SamplingParams(max_new_tokens=4)
    engine = ProcessEngine(taught_model, tokenizer, threads=torch.get_num_threads(), timeout_s=120)
    try:
        engine.update_weights(iter_inference_weights(policy))
        torch.manual_seed(3)
        remote = engine.generate(prompts, 6, sampling)
        after_remote = torch.rand(1)
        torch.manual_seed(3)
        local = HFEngine(policy, tokenizer).generate(prompts, 6, sampling)
        assert torch.equal(torch.rand(1), after_remote)  # the RNG stream continues as in-process sampling leaves it
        for a, b in zip(remote, local):
            assert [c.token_ids for c in a] == [c.token_ids for c in b]
            assert [c.logprobs for c in a] == [c.logprobs for c in b]
        # asynchronous use: submitted now, answered later, tagged with the publication that sampled them
        ticket = engine.submit(prompts, 2, sampling, seed=11)
        engine.update_weights(iter_inference_weights(policy))
        later = engine.submit(prompts, 2, sampling, seed=11)
        assert engine.result(later)[1]["publication"] == 2 and engine.result(ticket)[1]["publication"] == 1
    finally:
        engine.close()
    assert not engine._process.is_alive()


def test_staleness_zero_through_the_generator_process_is_the_synchronous_loop(taught_model, tmp_path):
    sync = grpo.train(_config(taught_model, tmp_path / "sync"))
    through = grpo.train(_config(taught_model, tmp_path / "async0", "async_generation.max_staleness=0"))
    a, b = _weights(tmp_path / "sync"), _weights(tmp_path / "async0")
    for key in a:
        assert torch.equal(a[key], b[key]), key  # 5 steps, bit-identical parameters
    records = read_metrics(tmp_path / "async0" / "metrics.jsonl")
    assert [r["async/lag"] for r in records] == [0.0] * 5
    synchronous = read_metrics(tmp_path / "sync" / "metrics.jsonl")
    assert [r["reward/mean"] for r in records] == [r["reward/mean"] for r in synchronous]
    assert sync["steps"] == through["steps"] == 5


@register_environment("test_async_nudge", overwrite=True)
class Nudge:
    """Answers the first two turns of every episode with a user message (importable: the generator
    process unpickles it)."""

    name = "test_async_nudge"

    def episode(self, problem):
        return NudgeEpisode()


class NudgeEpisode:
    def __init__(self):
        self.turns = 0

    def step(self, text):
        self.turns += 1
        return EnvStep(messages=[{"role": "user", "content": "again"}] if self.turns < 3 else [])


def test_the_generator_process_plays_multi_turn_episodes_as_the_trainer_would(taught_model, tmp_path):
    episodes = ["environment.name=test_async_nudge", "environment.messages=text", "environment.max_turns=3",
                "environment.max_episode_tokens=24", "train.steps=3"]
    grpo.train(_config(taught_model, tmp_path / "sync", *episodes))
    grpo.train(_config(taught_model, tmp_path / "async0", *episodes, "async_generation.max_staleness=0"))
    a, b = _weights(tmp_path / "sync"), _weights(tmp_path / "async0")
    for key in a:
        assert torch.equal(a[key], b[key]), key
    grpo.train(_config(taught_model, tmp_path / "async1", *episodes, "async_generation.max_staleness=1"))
    records = read_metrics(tmp_path / "async1" / "metrics.jsonl")
    assert [r["async/lag"] for r in records] == [0.0, 1.0, 1.0]
    assert all(r["env/turns"] > 1 and 0 < r["env/masked_frac"] < 1 for r in records)


def test_a_slow_trainer_trains_on_samples_at_most_max_staleness_old(taught_model, tmp_path, monkeypatch):
    import time

    real = grpo.update_policy

    def slow_update(*args, **kwargs):  # the generator is far faster than this trainer
        time.sleep(0.3)
        return real(*args, **kwargs)

    monkeypatch.setattr(grpo, "update_policy", slow_update)
    grpo.train(_config(taught_model, tmp_path, "async_generation.max_staleness=2", "train.steps=6"))
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["async/lag"] for r in records] == [0.0, 1.0, 2.0, 2.0, 2.0, 2.0]  # min(S, step - 1), never more
    # the samples were ready before the trainer asked: it hardly waited, the generator's work was hidden
    assert all(r["time/wait_for_samples"] < 0.2 for r in records[2:])
    assert all(r["async/overlap_frac"] > 0.5 for r in records[2:])
    assert all(r["mismatch/logprob_abs_diff_max"] > 1e-6 for r in records[2:] if "mismatch/logprob_abs_diff_max" in r)


def test_a_hung_generator_ends_the_run_with_an_error_naming_the_deadline(taught_model, tmp_path, monkeypatch,
                                                                         capsys):
    from rlvr.cli import main

    publish = ProcessEngine.update_weights

    def hang_then_publish(self, named):
        if self.publications == 1:  # the generator stops answering before the first update's weights
            os.kill(self._process.pid, signal.SIGSTOP)
        return publish(self, named)

    monkeypatch.setattr(ProcessEngine, "update_weights", hang_then_publish)
    config = tmp_path / "config.yaml"
    import yaml

    config.write_text(yaml.safe_dump(_config(taught_model, tmp_path / "run", "async_generation.max_staleness=1",
                                             "async_generation.timeout_s=3").model_dump(mode="json")))
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert "did not answer" in err and "within 3 s (async_generation.timeout_s)" in err
    assert len([line for line in err.splitlines() if line.startswith("rlvr train:")]) == 1


def test_a_resumed_async_run_trains_on_the_samples_the_uninterrupted_run_did(taught_model, tmp_path, monkeypatch):
    overrides = ["async_generation.max_staleness=1", "train.steps=4", "checkpoint.every=2"]
    grpo.train(_config(taught_model, tmp_path / "whole", *overrides))

    real = grpo.update_policy
    calls = []

    def crash_at_step_three(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("simulated crash after the checkpoint of step 2")
        return real(*args, **kwargs)

    monkeypatch.setattr(grpo, "update_policy", crash_at_step_three)
    with pytest.raises(RuntimeError, match="simulated crash"):
        grpo.train(_config(taught_model, tmp_path / "crashed", *overrides))
    monkeypatch.setattr(grpo, "update_policy", real)
    grpo.train(_config(taught_model, tmp_path / "crashed", *overrides), resume=True)
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "crashed")
    for key in a:
        assert torch.equal(a[key], b[key]), key
    whole, resumed = (read_metrics(tmp_path / name / "metrics.jsonl") for name in ("whole", "crashed"))
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    assert [r["reward/mean"] for r in resumed] == [r["reward/mean"] for r in whole]
    assert [r["async/lag"] for r in resumed] == [0.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("override, message", [
    ("engine.name=vllm", "without engine.name"),
    ("algorithm.dynamic_sampling=true", "without algorithm.dynamic_sampling"),
    ("algorithm.old_logprobs=engine", "older policy"),
])
def test_what_async_generation_does_not_take_is_refused_by_name(tmp_path, override, message):
    with pytest.raises(Exception, match=message):
        _config("m", tmp_path, "async_generation.max_staleness=1", override)


def test_a_damaged_publication_is_caught_by_the_deferred_canary(taught_model, tmp_path, monkeypatch):
    """At S >= 1 the canary is queued behind the weights and checked at the next push: the trainer never
    waits for the generator's queue, and a publication that arrived wrong still stops the run."""
    from rlvr.engines.weight_sync import StaleEngineError

    publish = ProcessEngine.update_weights

    def damage(self, named):
        if self.publications == 1:  # the first update's weights arrive damaged
            named = [(n, t + 0.5 if n.endswith("layers.0.mlp.down_proj.weight") else t) for n, t in named]
        return publish(self, named)

    monkeypatch.setattr(ProcessEngine, "update_weights", damage)
    with pytest.raises(StaleEngineError, match="stale or wrong weights"):
        grpo.train(_config(taught_model, tmp_path, "async_generation.max_staleness=1"))
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1]  # caught at step 2's push, before training on its samples



# ---------------------------------------------------------------------------------------------
# the generator's device, its signals, its death, and the deferred canary's near-ties
# ---------------------------------------------------------------------------------------------

class _Stop(Exception):
    """Raised by a recording stand-in for the generator process, to end a run once it is built."""


def _started_generator(monkeypatch, config) -> dict:
    """The keyword arguments the run builds its generator process with (the run stops there)."""
    from rlvr.recipes import rl_run

    seen = {}

    def record(path, tokenizer, **kwargs):
        seen.update(kwargs)
        raise _Stop

    monkeypatch.setattr(rl_run, "ProcessEngine", record)
    with pytest.raises(_Stop):
        grpo.train(config)
    return seen


def test_the_generator_runs_on_the_trainer_s_device_or_the_one_async_generation_names(taught_model, tmp_path,
                                                                                      monkeypatch):
    async1 = "async_generation.max_staleness=1"
    seen = _started_generator(monkeypatch, _config(taught_model, tmp_path / "a", async1, "model.dtype=bfloat16"))
    assert (seen["device"], seen["rng_device"], seen["dtype"]) == ("cpu", "cpu", "bfloat16")  # train.device auto
    seen = _started_generator(monkeypatch, _config(taught_model, tmp_path / "b", async1, "async_generation.device=cpu"))
    assert seen["device"] == "cpu"
    with pytest.raises(Exception, match=r"async_generation.device: 'gpu' is not a device; use cpu, cuda, cuda:N"):
        _config(taught_model, tmp_path / "c", async1, "async_generation.device=gpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_cuda_generator_on_a_machine_without_one_is_refused_by_name(taught_model, tmp_path, monkeypatch):
    from rlvr.verifiers.errors import InvalidValueError

    with pytest.raises(InvalidValueError, match=r"async_generation.device=cuda:1, but this machine has no CUDA"):
        _started_generator(monkeypatch, _config(taught_model, tmp_path, "async_generation.max_staleness=1",
                                                "async_generation.device=cuda:1"))


def test_a_generator_killed_while_the_trainer_waits_stops_the_run_at_once_naming_the_signal(taught_model, tmp_path,
                                                                                          monkeypatch):
    import threading

    from rlvr.engines.process import GeneratorError

    publish, killed = ProcessEngine.update_weights, []

    def kill(pid):
        os.kill(pid, signal.SIGKILL)
        killed.append(time.monotonic())

    def stall_then_kill(self, named):
        if self.publications == 1:  # the generator stops answering, and a second later is killed (the OOM killer)
            os.kill(self._process.pid, signal.SIGSTOP)
            threading.Timer(1.0, kill, args=(self._process.pid,)).start()
        return publish(self, named)

    monkeypatch.setattr(ProcessEngine, "update_weights", stall_then_kill)
    with pytest.raises(GeneratorError, match="generator process.* was killed by SIGKILL") as caught:
        grpo.train(_config(taught_model, tmp_path, "async_generation.max_staleness=1",
                           "async_generation.timeout_s=30"))
    assert time.monotonic() - killed[0] < 3, "noticed at the deadline, not at once"
    assert "cannot go on without it" in str(caught.value)


_INTERRUPTIBLE_TRAINER = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's foreground job has it
from rlvr.cli import main
from rlvr.recipes import grpo
real = grpo.update_policy
def slow_update(*args, **kwargs):  # steps long enough for the signal to land mid-run
    time.sleep(0.4)
    return real(*args, **kwargs)
grpo.update_policy = slow_update
sys.exit(main(["train", sys.argv[1]]))
"""


def test_ctrl_c_to_the_whole_process_group_ends_an_async_run_with_a_checkpoint_it_resumes_from(taught_model,
                                                                                                 tmp_path):
    """A terminal's Ctrl-C reaches the trainer and the generator (one process group): the generator
    must live on, so that the trainer finishes its step and drains the queue into its checkpoint."""
    import yaml

    from rlvr.run.checkpoint import list_checkpoints

    overrides = ["async_generation.max_staleness=1", "train.steps=8", "async_generation.timeout_s=30"]
    config = _config(taught_model, tmp_path / "run", *overrides)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    trainer = subprocess.Popen([sys.executable, "-c", _INTERRUPTIBLE_TRAINER, str(path)], start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        metrics = tmp_path / "run" / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
            assert trainer.poll() is None and time.monotonic() < deadline, trainer.communicate()
            time.sleep(0.05)
        os.killpg(trainer.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        out, err = trainer.communicate(timeout=60)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()
    assert trainer.returncode == 130, err
    assert "interrupted after step" in err and "resume with: rlvr train --resume" in err, err
    assert not _group_members(trainer.pid)  # the trainer closed its generator: nothing of the group is left
    saved = list_checkpoints(tmp_path / "run")
    assert saved, err
    summary = grpo.train(_config(taught_model, tmp_path / "run", *overrides), resume=True)
    assert summary["steps"] == 8
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 9))
    assert [r["async/lag"] for r in records] == [0.0] + [1.0] * 7  # the drained samples, then the queue again


def test_a_program_that_exits_without_closing_its_generator_does_not_wait_for_it(taught_model):
    """The generator ignores SIGTERM, which multiprocessing's exit hook sends its daemons before it joins
    them: the engine closes it first."""
    started = ("import sys; from rlvr.engines.process import ProcessEngine; "
               "from rlvr.modeling.loading import load_tokenizer; "
               "engine = ProcessEngine(sys.argv[1], load_tokenizer(sys.argv[1]), timeout_s=60); print('started')")
    done = subprocess.run([sys.executable, "-c", started, str(taught_model)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "started" in done.stdout, done.stderr


def _group_members(pgid: int, wait_s: float = 5.0) -> list[str]:
    """The command lines of the processes still in process group ``pgid`` after up to ``wait_s`` seconds
    (the ones that exit with their parent, such as multiprocessing's resource tracker, take a moment)."""
    deadline = time.monotonic() + wait_s
    while True:
        members = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.getpgid(int(pid)) == pgid:
                    members.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode())
            except (OSError, ProcessLookupError):
                continue
        if not members or time.monotonic() > deadline:
            return members
        time.sleep(0.1)


def _canary_sync(policy, tokenizer, engine):
    """The deferred canary as the async run builds it (:func:`rlvr.engines.weight_sync.start_engine`)."""
    from rlvr.engines.weight_sync import EngineSync

    return EngineSync(engine, policy, tokenizer, dtype="float32", prompt_tokens=32, new_tokens=4, deferred=True)


def test_a_bfloat16_generator_passes_the_deferred_canary_of_a_float32_trainer(taught_model):
    policy, tokenizer = load_policy(taught_model), load_tokenizer(taught_model)
    engine = ProcessEngine(taught_model, tokenizer, dtype="bfloat16", device="cpu", timeout_s=120)
    try:
        assert engine.loaded == {"device": "cpu", "dtype": "bfloat16"}
        sync = _canary_sync(policy, tokenizer, engine)
        assert sync.tolerance == 0.5  # the coarser of the two dtypes'
        sync.push()
        assert 0 < sync.settle()["sync/canary_max_abs_diff"] <= 0.5
    finally:
        engine.close()


def test_the_deferred_canary_takes_a_near_tie_resolved_otherwise_and_still_stops_damaged_weights(taught_model):
    """The generator's greedy token differs from the trainer's at a near-tie (2e-4 nats apart: rounding,
    another device or dtype): the canary passes. Weights that make it prefer a token the trainer rates
    far lower, or that move its log-probabilities, still stop the run."""
    from rlvr.engines.weight_sync import StaleEngineError

    policy, tokenizer = load_policy(taught_model), load_tokenizer(taught_model)
    engine = ProcessEngine(taught_model, tokenizer, timeout_s=120)
    try:
        sync = _canary_sync(policy, tokenizer, engine)
        greedy = SamplingParams(max_new_tokens=4, greedy=True)
        with torch.no_grad():
            hidden = policy.model(torch.tensor([sync.prompt])).last_hidden_state[0, -1]  # predicts canary token 0
            head = policy.lm_head.weight  # tied to the input embeddings: rows of tokens not in the prompt are free
            logits = head @ hidden
            top = int(logits.argmax())
            free = [t for t in range(len(head)) if t not in sync.prompt and t != top]
            tie, far = free[0], min(free[1:], key=lambda t: float(logits[t]))
            toward = hidden / hidden.dot(hidden)  # adding d * toward to a row adds d to its logit here
            head[tie] = head[top] - 1e-4 * toward  # the trainer: 1e-4 below its top token
            served = {"near tie": (tie, head[top] + 1e-4 * toward), "moved": (tie, head[top] + 2.0 * toward),
                      "far": (far, head[top] + 1e-4 * toward)}
        publish, row = engine.update_weights, {}

        def served_weights(named):  # the generator's weights: the trainer's, with one output row changed
            weights = dict(named)
            weights["lm_head.weight"] = weights["model.embed_tokens.weight"] = head.detach().clone()
            weights["lm_head.weight"][row["token"]] = row["row"]
            publish(weights.items())

        engine.update_weights = served_weights
        row.update(token=tie, row=served["near tie"][1])
        sync.push()
        assert sync.settle()["sync/canary_max_abs_diff"] < 1e-3  # float32's tolerance
        assert engine.generate([sync.prompt], 1, greedy)[0][0].token_ids[0] == tie  # the tie did go the other way
        assert HFEngine(policy, tokenizer).generate([sync.prompt], 1, greedy)[0][0].token_ids[0] == top
        for case, message in (("moved", "differ from the trainer's by up to"), ("far", "not by a near-tie")):
            row.update(token=served[case][0], row=served[case][1])
            sync.push()
            with pytest.raises(StaleEngineError, match=message):
                sync.settle()
    finally:
        engine.close()


# ---------------------------------------------------------------------------------------------
# on a GPU (skipped without one): `python -m pytest tests/test_async_generation.py -m gpu -q`
# ---------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_generator_samples_on_the_gpu_in_the_model_s_dtype(taught_model, tmp_path, monkeypatch):
    from rlvr.recipes import rl_run

    started = []

    class Recorded(ProcessEngine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(rl_run, "ProcessEngine", Recorded)
    grpo.train(_config(taught_model, tmp_path, "async_generation.max_staleness=1", "train.device=cuda",
                       "model.dtype=bfloat16", "train.steps=4"))
    assert started[0].loaded == {"device": "cuda:0", "dtype": "bfloat16"}
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["async/lag"] for r in records] == [0.0, 1.0, 1.0, 1.0]
    assert all(r["sync/canary_max_abs_diff"] <= 0.5 for r in records if "sync/canary_max_abs_diff" in r)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_staleness_zero_through_the_generator_is_the_synchronous_loop(taught_model, tmp_path):
    cuda = ["train.device=cuda", "train.steps=3"]
    grpo.train(_config(taught_model, tmp_path / "sync", *cuda))
    grpo.train(_config(taught_model, tmp_path / "async0", *cuda, "async_generation.max_staleness=0"))
    a, b = _weights(tmp_path / "sync"), _weights(tmp_path / "async0")
    for key in a:
        assert torch.equal(a[key], b[key]), key  # the samples are drawn on the GPU: its RNG stream handed over
    synchronous, through = (read_metrics(tmp_path / name / "metrics.jsonl") for name in ("sync", "async0"))
    assert [r["reward/mean"] for r in through] == [r["reward/mean"] for r in synchronous]
