"""Asynchronous generation: the generator process, the staleness bound, exactness at staleness 0, a hung
generator, and resume (tiny model, seconds each)."""

from __future__ import annotations

import os
import signal

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
