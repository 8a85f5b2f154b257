"""A process reward model in training: step rewards on each step's last token for PPO's GAE, an aggregate
per sample for the critic-free estimators (rlvr/rollout/process_scoring.py)."""

from __future__ import annotations

import json

import pytest
import torch

from rlvr.algorithms.critic import token_rewards
from rlvr.engines.base import Completion
from rlvr.rollout.batch import collate
from rlvr.rollout.groups import Group
from rlvr.rollout.process_scoring import (ProcessRewardScorer, StepScores, step_metrics, step_reward_tensor,
                                          step_rewards)
from rlvr.tasks.base import Problem
from rlvr.verifiers.base import Reward


def test_dense_rewards_add_on_real_tokens_and_the_score_on_the_last():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    dense = torch.tensor([[-0.5, 0.0, -0.25, 9.0], [0.0, -1.0, 7.0, 7.0]])  # padding holds garbage
    kl = torch.tensor([[0.1, 0.2, 0.3, 0.0], [0.4, 0.5, 0.0, 0.0]])
    r = token_rewards(torch.tensor([1.0, 0.0]), mask, kl=kl, beta=0.5, dense=dense)
    expected = torch.tensor([[-0.5 - 0.05, -0.1, 1.0 - 0.25 - 0.15, 0.0], [-0.2, -1.0 - 0.25, 0.0, 0.0]])
    assert torch.allclose(r, expected)


def test_reinforce_pp_token_returns_by_hand():
    """G_t = score + the step rewards still ahead; z-scored over the real tokens of valid samples."""
    from rlvr.algorithms.advantages import token_return_advantages

    scores = torch.tensor([1.0, 0.0, 5.0])
    dense = torch.tensor([[0.0, -0.5, 0.0, 9.0], [-1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    valid = torch.tensor([True, True, False])  # the third sample is masked out of the statistics
    adv = token_return_advantages(scores, dense, mask, valid)
    g = torch.tensor([0.5, 0.5, 1.0, -1.0, 0.0])  # row 0: 1 - 0.5, 1 - 0.5, 1 (padding's 9 ignored); row 1: -1, 0
    z = (g - g.mean()) / (g.std() + 1e-6)
    assert torch.allclose(adv[0, :3], z[:3], atol=1e-5) and torch.allclose(adv[1, :2], z[3:], atol=1e-5)
    assert adv[0, 3] == 0 and (adv[1, 2:] == 0).all() and (adv[2] == 0).all()


def _group(prompt, completions, rewards):
    problem = Problem("p", [{"role": "user", "content": "q"}], {"answer": "1"}, "numeric")
    return Group("s", problem, list(prompt), [Completion(list(ids), "", [0.0] * len(ids), "stop") for ids in completions],
                 [Reward(r) for r in rewards])


def test_step_rewards_land_on_each_steps_last_token_in_the_batch():
    """Two groups of different prompt widths and completion lengths: each step's reward sits in the batch's
    response column of its last token, the token that ends the step."""
    sep, eos = 10, 2
    groups = [_group([5, 6, 7], [[1, 1, sep, 3, 3, eos], [4, sep, 4, 4]], [1, 0]),
              _group([8], [[9, 9, 9, sep, 9, eos]], [1])]
    ends = [[2, 5], [1, 3], [3, 5]]
    scores = [[0.9, 0.2], [0.5, 0.8], [0.25, 0.75]]
    shifted = _Config(coef=2.0, step_reward="shifted", baseline=1.0)
    for g, rows in ((groups[0], (0, 1)), (groups[1], (2,))):
        g.steps = [StepScores(ends[i], scores[i], step_rewards(scores[i], shifted)) for i in rows]
    batch = collate(groups, pad_id=0)
    steps = step_reward_tensor(groups, batch.completion_len)
    assert steps.shape == batch.response_mask.shape == (3, 6)
    response = batch.input_ids[:, -batch.completion_len:]  # [N, T] the completion tokens, as GAE sees them
    for i in range(3):
        placed = steps[i].nonzero().flatten().tolist()
        assert placed == ends[i]
        assert steps[i, ends[i]].tolist() == pytest.approx([2.0 * (p - 1.0) for p in scores[i]])
        assert all(batch.response_mask[i, e] == 1 for e in ends[i])
    assert response[0, 2] == sep and response[1, 1] == sep and response[2, 3] == sep  # a step's end: its separator


class _Config:
    def __init__(self, **kw):
        self.__dict__.update(dict(path="prm", separator=None, use="aggregate", aggregate="min", combine="add", coef=0.5,
                                  step_reward="potential", baseline=0.5, batch_size=4, device=None, dtype=None) | kw)


def _scorer(**kw) -> ProcessRewardScorer:
    scorer = ProcessRewardScorer.__new__(ProcessRewardScorer)  # the arithmetic only, without a model
    scorer.config, scorer.token_level = _Config(**kw), False
    return scorer


def test_aggregate_rewards_add_to_the_outcome_or_replace_it_and_failures_stay_failed():
    add, replace = _scorer(), _scorer(combine="replace")
    assert add._combined(Reward(1.0), 0.4).score == pytest.approx(1.2)
    assert add._combined(Reward(1.0), 0.4).components == {"prm": 0.4, "outcome": 1.0}
    assert add._combined(Reward(0.0, status="abstain"), 0.4).score == pytest.approx(0.2)  # an abstention adds nothing
    failed = add._combined(Reward(0.0, status="timeout"), 0.9)
    assert failed.status == "timeout" and failed.score == 0.0  # masked as the verifier's failure, not scored
    assert replace._combined(Reward(1.0), 0.4).score == pytest.approx(0.2)
    assert replace._combined(Reward(0.0, status="error"), 0.4).status == "ok"  # replace: the verifier only watches


def test_step_reward_forms_by_hand():
    from rlvr.algorithms.process_rewards import STEP_REWARDS

    delta, shifted = STEP_REWARDS["delta"], STEP_REWARDS["shifted"]
    assert delta([0.9, 0.2, 0.6], 0.5) == pytest.approx([0.4, -0.7, 0.4])  # sums to p_K - baseline = 0.1
    assert delta([], 0.5) == []
    assert shifted([0.9, 0.2, 0.6], 1.0) == pytest.approx([-0.1, -0.8, -0.4])
    potential = STEP_REWARDS["potential"]
    assert potential([0.9, 0.2, 0.6], 0.5) == pytest.approx([0.4, -0.7, -0.2])  # the last step returns Phi to 0
    assert potential([0.7], 0.5) == pytest.approx([-0.5]) and potential([], 0.5) == []
    for scores in ([0.9, 0.2, 0.6], [0.1] * 5, [0.99], [0.3, 0.8]):  # the sum is -baseline, whatever the steps
        assert sum(potential(scores, 0.5)) == pytest.approx(-0.5)
    # padding with sound steps earns nothing under delta, and each one earns under shifted 0.5
    assert sum(delta([0.9, 0.9, 0.9, 0.9], 0.5)) == pytest.approx(sum(delta([0.9], 0.5)))
    assert sum(shifted([0.9] * 4, 0.5)) == pytest.approx(4 * sum(shifted([0.9], 0.5)))


def test_the_step_reward_form_lands_on_the_step_ends():
    groups = [_group([5], [[1, 10, 3, 10, 4, 2]], [1])]
    scores = [0.9, 0.2, 0.6]
    groups[0].steps = [StepScores([1, 3, 5], scores, step_rewards(scores, _Config(coef=2.0, step_reward="delta")))]
    batch = collate(groups, pad_id=0)
    delta = step_reward_tensor(groups, batch.completion_len)
    assert delta[0].tolist() == pytest.approx([0.0, 0.8, 0.0, -1.4, 0.0, 0.8])
    groups[0].steps = [StepScores([1, 3, 5], scores, step_rewards(scores, _Config(coef=2.0, step_reward="potential")))]
    potential = step_reward_tensor(groups, batch.completion_len)
    assert potential[0].tolist() == pytest.approx([0.0, 0.8, 0.0, -1.4, 0.0, -0.4])


def test_the_default_step_reward_is_potential_shaping():
    from rlvr.config import RunConfig, build_config

    config = build_config(RunConfig, {"model": {"path": "m"}, "process_reward": {"path": "x"}})
    assert config.process_reward.step_reward == "potential" and config.process_reward.baseline == 0.5


def test_step_metrics_by_hand():
    scores = [[0.9, 0.2], [], [0.6]]
    m = step_metrics(scores, torch.tensor([0.2, 0.0, 0.6]))
    assert m["prm/step_score"] == pytest.approx((0.9 + 0.2 + 0.6) / 3)
    assert m["prm/steps"] == pytest.approx(1.0) and m["prm/no_step_frac"] == pytest.approx(1 / 3)
    assert m["prm/wrong_step_frac"] == pytest.approx(1 / 3) and m["prm/aggregate"] == pytest.approx(0.8 / 3)


@pytest.mark.parametrize("extra, message", [
    ({"algorithm": {"preset": "grpo"}, "process_reward": {"path": "x", "use": "token"}},
     "process_reward.use: token rewards need an estimator that takes them"),
    ({"algorithm": {"preset": "rloo"}, "process_reward": {"path": "x", "use": "token"}},
     "algorithm.advantage is 'rloo'"),
    ({"process_reward": {"path": "x"}, "reward_model": {"path": "y"}},
     "process_reward: a process reward model is not combined with reward_model"),
    ({"process_reward": {"path": "x", "aggregate": "median"}}, "valid"),
])
def test_the_config_refuses_what_a_prm_does_not_combine_with(extra, message):
    from rlvr.config import ConfigError, RunConfig, build_config

    with pytest.raises(ConfigError, match=message):
        build_config(RunConfig, {"model": {"path": "m"}, **extra})


# ---------------------------------------------------------------------------------------------
# End to end: PPO with step rewards, GRPO with an aggregate
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def untrained_prm(tiny_model, tmp_path_factory):
    """A PRM of the tiny model's shape and tokenizer (a fresh head: its scores are near 0.5, and vary)."""
    from rlvr.config import PRMConfig, build_config
    from rlvr.modeling.loading import load_tokenizer
    from rlvr.modeling.prm import load_prm_backbone, save_prm

    tokenizer = load_tokenizer(tiny_model)
    config = build_config(PRMConfig, {"model": {"path": str(tiny_model)}, "data": {"path": "x.jsonl"}})
    return save_prm(load_prm_backbone(config.model, tokenizer, "cpu"), tokenizer,
                    tmp_path_factory.mktemp("prm") / "final", separator="\n")


def _chain_run(tmp_path, model, prm, **extra):
    import yaml

    cfg = {"out": str(tmp_path / "run"), "model": {"path": str(model)},
           "data": [{"task": "chain_arithmetic", "options": {"style": "bare", "steps": 2, "max_operand": 5}}],
           "process_reward": {"path": str(prm)},
           "generation": {"max_new_tokens": 16}, "train": {"steps": 2, "prompts_per_step": 4, "group_size": 2},
           "eval": {"at_start": False, "at_end": False}, "log": {"progress": False, "plot_every": 0}}
    for key, value in extra.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_ppo_takes_the_step_rewards_into_its_returns(tiny_model, untrained_prm, tmp_path, monkeypatch, capsys):
    """The PRM's step rewards reach PPO's GAE: critic_targets gets a [N, T] tensor, non-zero exactly on the
    step ends of the rollout's completions; the run logs prm/ metrics."""
    from rlvr.cli import main
    from rlvr.recipes import ppo

    seen = []
    original = ppo.critic_targets

    def spy(batch, scores, truncated, **kw):
        seen.append((kw["step_rewards"].clone(), batch.response_mask.clone()))
        return original(batch, scores, truncated, **kw)

    monkeypatch.setattr(ppo, "critic_targets", spy)
    assert main(["train", str(_chain_run(tmp_path, tiny_model, untrained_prm, algorithm={"preset": "ppo"}))]) == 0
    assert "process reward: the PRM" in capsys.readouterr().out
    assert len(seen) == 2
    for steps, mask in seen:
        assert steps.shape == mask.shape
        placed = steps != 0  # potential: non-zero on step ends (a fresh head's p varies)
        assert placed.any() and placed.sum(dim=1).ge(1).all()  # every sample has at least one step
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "prm/step_score" in r]
    assert len(trained) == 2 and all(0 < r["prm/step_score"] < 1 and r["prm/steps"] >= 1 for r in trained)


@pytest.mark.slow
def test_grpo_adds_the_aggregate_to_the_outcome_and_measures_accuracy_on_the_outcome(tiny_model, untrained_prm, tmp_path):
    from rlvr.cli import main

    cfg = _chain_run(tmp_path, tiny_model, untrained_prm, process_reward={"aggregate": "mean", "coef": 0.5})
    assert main(["train", str(cfg)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if "prm/aggregate" in r)
    assert 0 < step["reward/prm"] < 1 and "gold/accuracy" in step  # the verifier's verdicts, not the mixed reward
    assert step["reward/mean"] == pytest.approx(step["gold/mean"] + 0.5 * step["prm/aggregate"], abs=1e-4)


@pytest.mark.slow
def test_reinforce_pp_trains_on_token_returns_with_step_rewards(tiny_model, untrained_prm, tmp_path, monkeypatch):
    from rlvr.cli import main
    from rlvr.recipes import grpo

    seen = []
    original = grpo.update_policy

    def spy(policy, batch, *args, **kw):
        seen.append(batch.advantages.clone())
        return original(policy, batch, *args, **kw)

    monkeypatch.setattr(grpo, "update_policy", spy)
    cfg = _chain_run(tmp_path, tiny_model, untrained_prm, algorithm={"preset": "reinforce_pp"})
    assert main(["train", str(cfg)]) == 0
    assert len(seen) == 2 and all(a.dim() == 2 for a in seen)  # [N, T]: a return per token
    assert any((row[row != 0].unique().numel() > 1) for a in seen for row in a)  # tokens of one sample differ


def test_the_prm_scorer_returns_its_rewards_gold_and_step_rewards(tiny_model, untrained_prm):
    """Through the Scorer protocol, on a real (untrained) PRM: token level keeps the verifier's rewards and adds
    each step's reward; aggregate replaces the rewards and returns the verifier's as the gold. ``score``
    leaves the groups as they are; ``apply`` writes the result."""
    from rlvr.modeling.loading import load_tokenizer
    from rlvr.rollout.scoring import Scorer

    tokenizer = load_tokenizer(tiny_model)
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in ("1+1=2\n2+2=4", "3\n", "x")]
    groups = [_group([5, 6], ids[:2], [1.0, 0.0]), _group([7], ids[2:], [1.0])]
    config = _Config(path=str(untrained_prm), coef=2.0)
    token = ProcessRewardScorer(config, token_level=True, device="cpu", dtype="float32", tokenizer=tokenizer)
    assert isinstance(token, Scorer) and token.token_level and token.state_dict() == {}
    result = token.score(groups)
    assert result.gold is None and [[r.score for r in row] for row in result.rewards] == [[1.0, 0.0], [1.0]]
    flat = [s for row in result.steps for s in row]
    assert [s.ends for s in flat] == [[5, 10], [1], [0]]  # "\n" ends a step, and so does the last token
    for s in flat:
        assert s.rewards == pytest.approx(step_rewards(s.scores, config)) and len(s.scores) == len(s.ends)
    assert all(g.steps is None and g.gold is None for g in groups)  # score() only returns
    assert token.metrics()["prm/steps"] == pytest.approx(4 / 3)  # 4 steps over 3 completions

    aggregate = ProcessRewardScorer(config, token_level=False, device="cpu", dtype="float32")
    result = aggregate.score(groups)
    assert result.steps is None and [[r.score for r in row] for row in result.gold] == [[1.0, 0.0], [1.0]]
    result.apply(groups)
    assert groups[0].gold == result.gold[0] and groups[0].steps is None and groups[0].verdicts is groups[0].gold
    for group, row in zip(groups, ([0, 1], [2])):
        for reward, k in zip(group.rewards, row):  # outcome + coef * min(step scores)
            expected = reward.components["outcome"] + 2.0 * min(flat[k].scores)
            assert reward.score == pytest.approx(expected, abs=1e-6)
