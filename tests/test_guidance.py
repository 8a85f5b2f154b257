"""Solution guidance: gold solutions into groups that got nothing right (rlvr/rollout/guidance.py)."""

import pytest
import torch

from rlvr.recipes import grpo
from rlvr.config import ConfigError, RunConfig, build_config
from rlvr.engines.base import Completion
from rlvr.rollout.guidance import guide_with_solutions, policy_logprobs_of_rows, solution_encoder
from rlvr.modeling.loading import load_tokenizer
from rlvr.rollout.groups import Group
from rlvr.rollout.batch import collate
from rlvr.tasks.base import Problem
from rlvr.run.tracking import read_metrics
from rlvr.verifiers import Reward
from rlvr.verifiers.runner import VerifierRunner


def _encode(text):
    return [ord(c) for c in text] + [1]  # characters, then EOS id 1


def _group(answer, texts, solution="same"):
    solution = answer if solution == "same" else solution
    problem = Problem(f"p/{answer}", [{"role": "user", "content": "q"}], {"answer": answer}, "numeric", solution=solution)
    completions = [Completion([ord(c) for c in t] + [1], t, [-0.5] * (len(t) + 1), "stop") for t in texts]
    rewards = [Reward(float(t == answer)) for t in texts]
    return Group("s", problem, [5, 6], completions, rewards)


def _guide(groups, **kwargs):
    return guide_with_solutions(groups, VerifierRunner(workers=0), encode=_encode, verifier=None, options=None,
                                max_new_tokens=kwargs.pop("max_new_tokens", 5), threshold=None, **kwargs)


def test_only_groups_with_nothing_right_get_their_solution_in_the_last_place():
    all_wrong, one_right = _group("7", ["1", "2", "3", "4"]), _group("8", ["8", "2", "3", "4"])
    no_solution = _group("9", ["1", "2", "3", "4"], solution=None)
    guided = _guide([all_wrong, one_right, no_solution])
    assert guided.rows == [3]  # group 0, sample 3
    first = guided.groups[0]
    assert [c.text for c in first.completions] == ["1", "2", "3", "7"]
    assert first.completions[-1].token_ids == [ord("7"), 1] and first.completions[-1].finish_reason == "stop"
    assert [r.score for r in first.rewards] == [0.0, 0.0, 0.0, 1.0]  # the verifier scored the solution
    assert guided.groups[1] is one_right and guided.groups[2] is no_solution
    assert [c.text for c in all_wrong.completions] == ["1", "2", "3", "4"]  # the input is not modified
    assert guided.metrics()["rollout/guided_frac"] == pytest.approx(1 / 3)


def test_wrong_and_overlong_solutions_are_not_injected():
    wrong = _group("7", ["1", "2"], solution="6")  # the verifier does not pass it: never trained towards
    long = _group("12345", ["1", "2"])  # 5 digits + EOS > max_new_tokens 5
    guided = _guide([wrong, long])
    assert guided.rows == [] and guided.groups == [wrong, long]
    assert (guided.guided, guided.rejected, guided.too_long) == (0, 1, 1)


def test_several_copies_replace_the_last_samples_and_keep_one_policy_sample():
    guided = _guide([_group("7", ["1", "2", "3", "4"]), _group("5", ["1", "2", "3", "4"])], copies=9)
    assert guided.rows == [1, 2, 3, 5, 6, 7]  # at most group_size - 1 per group
    assert guided.metrics()["rollout/guided_frac"] == 1.0  # groups, not rows
    assert [c.text for c in guided.groups[1].completions] == ["1", "5", "5", "5"]


def test_solution_rows_get_the_policys_log_probs(taught_model):
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(taught_model)
    policy = AutoModelForCausalLM.from_pretrained(taught_model)
    encode = solution_encoder(tokenizer)
    prompt = tokenizer("3+4=", add_special_tokens=False)["input_ids"]
    ids = encode("7")
    assert ids[-1] == tokenizer.eos_token_id
    sampled = Completion(encode("9"), "9", [-0.25, -0.5], "stop")
    solution = Completion(ids, "7", [0.0] * len(ids), "stop")
    batch = collate([Group("s", Problem("p", [], {}, "numeric"), prompt, [sampled, solution])], pad_id=0)
    policy_logprobs_of_rows(policy, batch, [1], micro_batch_size=4, temperature=1.0)
    assert batch.engine_logp[0].tolist() == [-0.25, -0.5]  # sampled rows keep the engine's
    with torch.no_grad():
        logits = policy(torch.tensor([prompt + ids])).logits[0].log_softmax(-1)
    expected = [float(logits[len(prompt) - 1 + i, t]) for i, t in enumerate(ids)]
    assert batch.engine_logp[1, : len(ids)].tolist() == pytest.approx(expected, abs=1e-5)


def _config(model, out, *overrides):
    raw = {
        "out": str(out), "model": {"path": str(model)},
        "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
        "generation": {"max_new_tokens": 3}, "optim": {"lr": 3e-3},
        "train": {"steps": 4, "prompts_per_step": 8, "group_size": 4, "micro_batch_size": 32},
        "algorithm": {"beta": 0.0}, "eval": {"at_start": False, "at_end": False},
        "checkpoint": {"every": 0, "at_end": False, "final_model": False},
        "log": {"progress": False, "plot": False},
    }
    return build_config(RunConfig, raw, list(overrides))


def _solution_logp(model_dir, problems, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    encode = solution_encoder(tokenizer)
    total = 0.0
    with torch.no_grad():
        for p in problems:
            prompt, ids = tokenizer(p.prompt[-1]["content"], add_special_tokens=False)["input_ids"], encode(p.solution)
            logits = model(torch.tensor([[tokenizer.bos_token_id] + prompt + ids])).logits[0].log_softmax(-1)
            total += sum(float(logits[len(prompt) + i, t]) for i, t in enumerate(ids))
    return total / len(problems)


def test_a_policy_that_gets_nothing_right_learns_its_solutions(tiny_model, tmp_path):
    """The random tiny model answers nothing right: without guidance every group is all-wrong and
    beta 0 gives no gradient at all; with it, the solutions' log-probs rise."""
    from rlvr.tasks import get_task

    tokenizer = load_tokenizer(tiny_model)
    problems = list(get_task("arithmetic", split="train", style="bare", max_digits=1))[:50]
    before = _solution_logp(tiny_model, problems, tokenizer)
    config = _config(tiny_model, tmp_path / "guided", "algorithm.guidance=solution", "checkpoint.final_model=true")
    grpo.train(config)
    steps = read_metrics(tmp_path / "guided" / "metrics.jsonl")
    assert len(steps) == 4 and all(s["rollout/guided_frac"] > 0.5 for s in steps)
    assert all(s["reward/accuracy"] < 0.2 for s in steps)  # the policy's own samples, not the solutions
    assert all(s["train/grad_norm"] > 0 for s in steps)
    assert _solution_logp(tmp_path / "guided" / "final", problems, tokenizer) > before + 0.5


def test_guidance_with_several_optimizer_steps_per_batch(tiny_model, tmp_path):
    """pi_old of a solution row is the policy's log-prob at rollout time, so the first minibatch's
    ratio is 1 on it too and later ones measure how far the step moved."""
    config = _config(tiny_model, tmp_path, "algorithm.guidance=solution", "algorithm.guidance_samples=2",
                     "algorithm.ppo_epochs=2", "algorithm.minibatches=2", "algorithm.old_logprobs=engine", "train.steps=2")
    grpo.train(config)
    steps = read_metrics(tmp_path / "metrics.jsonl")
    assert all(s["rollout/guided_frac"] > 0.5 and s["train/optimizer_steps"] == 4 for s in steps)
    assert all(abs(s["train/approx_kl_old"]) < 1.0 and s["mismatch/logprob_abs_diff_max"] < 1e-4 for s in steps)


def test_guidance_needs_the_verifiers_reward_and_a_critic_free_preset(tiny_model, tmp_path):
    with pytest.raises(ConfigError, match="algorithm.guidance"):
        _config(tiny_model, tmp_path, "algorithm.guidance=solution", "algorithm.preset=ppo")
    with pytest.raises(ConfigError, match="guidance"):
        _config(tiny_model, tmp_path, "algorithm.guidance=sometimes")
