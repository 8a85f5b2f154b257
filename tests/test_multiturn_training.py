"""Training on multi-turn episodes: environment tokens are read by the model but carry no loss, and
both RL recipes (GRPO family, PPO) train on episodes end to end (tiny model, seconds)."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.config import RunConfig, build_config
from rlvr.engines.base import Completion
from rlvr.modeling.loading import load_policy, load_tokenizer
from rlvr.recipes import grpo, ppo
from rlvr.recipes.update import UpdateSettings, policy_terms
from rlvr.rollout.batch import collate
from rlvr.rollout.groups import Group
from rlvr.run.tracking import read_metrics
from rlvr.tasks.base import Problem
from rlvr.tasks.environments import EnvStep, register_environment


@register_environment("test_nudge", overwrite=True)
class Nudge:
    """Answers the first ``rounds`` turns of every episode with a user message (any model's episodes
    then have several turns, whatever it writes)."""

    name = "test_nudge"

    def __init__(self, rounds: int = 2, text: str = "again"):
        self.rounds, self.text = rounds, text

    def episode(self, problem):
        env, turns = self, []

        class Episode:
            def step(self, text):
                turns.append(text)
                if len(turns) > env.rounds:
                    return EnvStep()
                return EnvStep(messages=[{"role": "user", "content": env.text}], reward=0.0)

        return Episode()


# ---------------------------------------------------------------------------------------------
# The loss ignores what the environment wrote
# ---------------------------------------------------------------------------------------------


def _episode_batch(tokenizer, tail: str, env_logp: float):
    """Two episodes [model turn | environment message | model turn | environment message] under one prompt."""
    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    eos = tokenizer.eos_token_id
    completions = []
    for first, second in (("12", "3"), ("4", "56")):
        a, env, b, end = ids(first) + [eos], ids("\nok\n"), ids(second) + [eos], ids(tail)
        token_ids = a + env + b + end
        mask = [1] * len(a) + [0] * len(env) + [1] * len(b) + [0] * len(end)
        logprobs = [-0.7 if m else env_logp for m in mask]
        completions.append(Completion(token_ids, second, logprobs, "stop", loss_mask=mask))
    problem = Problem(id="p", prompt=[{"role": "user", "content": "1+2="}], reference={"answer": "3"}, verifier="numeric")
    batch = collate([Group("s", problem, ids("1+2="), completions)], tokenizer.pad_token_id)
    batch.advantages = torch.tensor([1.0, -1.0])
    batch.old_logp = batch.engine_logp - 0.1 * batch.response_mask  # pi_old differs from pi on sampled tokens only
    batch.ref_logp = batch.engine_logp.clone()
    return batch


def _loss_and_grads(model, batch, settings):
    model.zero_grad(set_to_none=True)
    part = policy_terms(model, batch, settings, num_seqs=len(batch), num_tokens=float(batch.response_mask.sum()))
    part.loss.backward()
    return part.loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_environment_tokens_change_neither_the_loss_nor_any_gradient(tiny_model):
    model, tokenizer = load_policy(tiny_model), load_tokenizer(tiny_model)
    config = build_config(RunConfig, {"model": {"path": str(tiny_model)}}, [
        "algorithm.beta=0.1", "algorithm.entropy_coef=0.01", "algorithm.ppo_epochs=2", "algorithm.off_policy=token_tis",
        "algorithm.off_policy_cap=2.0", "algorithm.loss_agg=token_mean"])
    settings = UpdateSettings.from_config(config)
    reference = _episode_batch(tokenizer, tail="\nxyz\n", env_logp=0.0)
    loss, grads = _loss_and_grads(model, reference, settings)
    # other tokens in the trailing environment message (nothing sampled reads them), and other
    # log-probs at every environment position (engine, pi_old, reference)
    other = _episode_batch(tokenizer, tail="\nQRS\n", env_logp=-5.0)
    other.old_logp = torch.where(other.response_mask.bool(), other.old_logp, -3.0)
    other.ref_logp = torch.where(other.response_mask.bool(), other.ref_logp, 2.0)
    assert not torch.equal(other.input_ids, reference.input_ids)
    loss_other, grads_other = _loss_and_grads(model, other, settings)
    assert torch.equal(loss, loss_other)
    for g, h in zip(grads, grads_other):
        assert torch.equal(g, h)
    # the number of loss tokens is the number of tokens the engine sampled
    assert int(reference.response_mask.sum()) == (3 + 2) + (2 + 3)


def test_the_trainer_reads_each_sampled_token_in_the_context_the_engine_sampled_it_in(taught_model):
    """Episodes played by the HF engine, collated: the trainer's log-prob of every sampled token (after
    earlier turns and the environment's messages) equals the engine's, so what is trained is what was
    sampled, where it was sampled."""
    from rlvr.engines import HFEngine, SamplingParams
    from rlvr.modeling.logprobs import completion_logprobs
    from rlvr.rollout.env_tokens import TextMessages
    from rlvr.rollout.episodes import EpisodeRunner
    from rlvr.rollout.suites import PromptEncoder

    model, tokenizer = load_policy(taught_model), load_tokenizer(taught_model)  # it ends its answers with EOS
    text = TextMessages(tokenizer)
    runner = EpisodeRunner(lambda problem: text, {"test_nudge": Nudge(rounds=2)}, max_turns=3, max_episode_tokens=30)
    problems = [Problem(id=str(k), prompt=[{"role": "user", "content": f"{k}+1="}], reference={"answer": str(k + 1)},
                        verifier="numeric", environment="test_nudge") for k in range(3)]
    prompts = [PromptEncoder(tokenizer)(p) for p in problems]  # as a run encodes them
    torch.manual_seed(0)
    groups = runner.generate(HFEngine(model, tokenizer), problems, prompts, 4, SamplingParams(max_new_tokens=6))
    batch = collate([Group("s", p, ids, g) for p, ids, g in zip(problems, prompts, groups)], tokenizer.pad_token_id)
    assert (batch.response_mask.sum(dim=1) < batch.attention_mask[:, -batch.completion_len:].sum(dim=1)).any()
    with torch.no_grad():
        logp, _ = completion_logprobs(model, batch.input_ids, batch.attention_mask, batch.completion_len)
    gap = ((logp - batch.engine_logp).abs() * batch.response_mask).max()
    assert gap < 1e-4, gap


# ---------------------------------------------------------------------------------------------
# Both recipes train on episodes
# ---------------------------------------------------------------------------------------------


def _config(model, out, *overrides):
    raw = {
        "out": str(out),
        "model": {"path": str(model)},
        "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
        "environment": {"name": "test_nudge", "messages": "text", "max_turns": 3, "max_episode_tokens": 24},
        "generation": {"max_new_tokens": 4},
        "optim": {"lr": 1e-3},
        "train": {"steps": 2, "prompts_per_step": 4, "group_size": 4, "micro_batch_size": 16},
        "eval": {"limit": 4},
        "checkpoint": {"every": 0},
        "log": {"progress": False, "plot_every": 0},
    }
    return build_config(RunConfig, raw, list(overrides))


@pytest.mark.slow
@pytest.mark.parametrize("recipe,overrides", [
    (grpo, ["algorithm.preset=grpo"]),
    (grpo, ["algorithm.preset=dr_grpo"]),
    (ppo, ["algorithm.preset=ppo", "algorithm.minibatches=2", "algorithm.ppo_epochs=2"]),
], ids=["grpo", "dr_grpo", "ppo"])
def test_rl_recipes_train_on_multi_turn_episodes(taught_model, tmp_path, recipe, overrides):
    recipe.train(_config(taught_model, tmp_path, *overrides))
    records = read_metrics(tmp_path / "metrics.jsonl")
    step = records[1]
    assert step["env/turns"] > 1 and 0 < step["env/masked_frac"] < 1  # several turns, environment tokens masked
    assert step["env/stop_eos"] + step["env/stop_max_turns"] + step["env/stop_max_tokens"] == pytest.approx(1.0)
    assert step["response/length_max"] <= 24  # the episode budget holds for every row
    assert all(r.get("mismatch/logprob_abs_diff_max", 0.0) < 1e-4 for r in records)  # where rows had an advantage
    assert all(math.isfinite(r["train/grad_norm"]) for r in records[1:])
    assert "eval/accuracy" in records[-1]  # the evaluation plays episodes too
