"""A learned reward model inside RL training: scoring, ensembles, normalisation, composition with
verifiers, the gold-vs-proxy watch, continuous rewards, and end-to-end GRPO / PPO runs against one."""

import json
import shutil

import pytest
import torch

from rlvr.recipes import grpo, ppo
from rlvr.config import ConfigError, RunConfig, build_config
from rlvr.engines.base import Completion
from rlvr.modeling.reward_model import RewardModel
from rlvr.rollout.reward_scoring import RewardScorer, combine_add, combine_gate, merge_moments, running_std
from rlvr.rollout.groups import Group, RolloutStats, has_signal
from rlvr.rollout.batch import sample_tensors
from rlvr.recipes.step_metrics import step_metrics
from rlvr.tasks.base import Problem
from rlvr.run.alarms import Alarms, GoldWindow, RankingWindow, gold_fell, ranking_fell
from rlvr.run.tracking import read_metrics
from rlvr.verifiers import Reward


@pytest.fixture(scope="module")
def rm_folder(taught_model, tmp_path_factory):
    """A logprob-head reward model: the taught model itself, r = sum log p(completion, EOS | prompt)."""
    folder = tmp_path_factory.mktemp("rm") / "final"
    shutil.copytree(taught_model, folder)
    (folder / "reward_model.json").write_text(json.dumps({"head": "logprob"}))
    return folder


@pytest.fixture(scope="module")
def score_rm_folder(taught_model, tmp_path_factory):
    """A sequence-classification reward model folder without reward_model.json, as from the hub."""
    from transformers import AutoModelForSequenceClassification

    from rlvr.modeling.loading import load_tokenizer

    folder = tmp_path_factory.mktemp("hub_rm") / "rm"
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_pretrained(str(taught_model), num_labels=1).save_pretrained(folder)
    load_tokenizer(taught_model).save_pretrained(folder)
    return folder


def _rm(paths, **options):
    raw = {"model": {"path": "m"}, "reward_model": {"paths" if isinstance(paths, list) else "path": paths, **options}}
    return build_config(RunConfig, raw).reward_model


def _groups(scores_by_group, gold_by_group=None, texts=None):
    groups = []
    for k, scores in enumerate(scores_by_group):
        problem = Problem(id=f"p{k}", prompt=[{"role": "user", "content": f"{k}+1="}], reference={"answer": str(k + 1)},
                          verifier="numeric")
        completions = [Completion(token_ids=[5 + i, 2], text=f"{i}", logprobs=[-1.0, -1.0], finish_reason="stop")
                       for i in range(len(scores))]
        group = Group("arithmetic", problem, [1, 7, 8], completions, [Reward(s) for s in scores])
        if gold_by_group is not None:
            group.gold = [Reward(s, info={"extracted": "1"}) for s in gold_by_group[k]]
        groups.append(group)
    return groups


def _samples(groups, threshold=None):
    return sample_tensors(groups, on_failure="mask", success_threshold=threshold, overlong="none", max_new_tokens=4,
                          overlong_buffer=1, overlong_penalty=1.0)


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("section, message", [
    ({}, "reward_model.path: set exactly one of path"),
    ({"path": "a", "paths": ["b"]}, "reward_model.path: set exactly one of path"),
    ({"path": "a", "combine": "gate"}, "reward_model.verifier: combine 'gate' needs a rule-based verifier"),
    ({"path": "a", "verifier": {"name": "format"}}, "reward_model.verifier: combine is 'replace'"),
    ({"path": "a", "offset": 1.0}, "reward_model.offset: offset and scale apply with normalize: fixed"),
    ({"path": "a", "ensemble": "median"}, "reward_model.ensemble"),
    ({"path": "a", "combine": "add", "verifier": {"name": "nope"}}, "reward_model.verifier.name"),
])
def test_bad_reward_model_sections_fail_in_one_line(section, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        build_config(RunConfig, {"model": {"path": "m"}, "reward_model": section})


# ---------------------------------------------------------------------------------------------
# Scoring, ensembles, normalisation
# ---------------------------------------------------------------------------------------------


def test_scores_are_the_reward_models_own(rm_folder, score_rm_folder):
    prompts, completions = [[1, 20, 21], [1, 22], [1, 23, 24, 25]], [[5, 2], [6, 7, 2], [2]]
    for folder in (rm_folder, score_rm_folder):
        scorer = RewardScorer(_rm(str(folder), batch_size=2), device="cpu", dtype="float32")
        proxy, raw = scorer.proxy(prompts, completions)
        expected = RewardModel(folder, batch_size=8).score(prompts, completions)
        torch.testing.assert_close(proxy, expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(raw, expected[None], atol=1e-5, rtol=0)


def test_an_ensemble_combines_normalised_members_and_logs_each(rm_folder, score_rm_folder):
    config = _rm([str(rm_folder), str(score_rm_folder)], ensemble="mean_minus_std", ensemble_k=0.5,
                 normalize="fixed", scale=2.0, clip=0.3)
    scorer = RewardScorer(config, device="cpu", dtype="float32")
    groups = _groups([[0.0, 1.0]])
    ids = [g.prompt_ids for g in groups for _ in g.completions], [c.token_ids for g in groups for c in g.completions]
    raw = torch.stack([RewardModel(rm_folder).score(*ids), RewardModel(score_rm_folder).score(*ids)])  # [2, 2]
    z = raw / 2.0
    expected = (z.mean(0) - 0.5 * z.std(0, unbiased=False)).clamp(-0.3, 0.3)
    result = scorer.score(groups)
    assert groups[0].gold is None and result.steps is None and not scorer.token_level  # score() only returns
    result.apply(groups)
    got = [r.score for r in groups[0].rewards]
    assert got == pytest.approx(expected.tolist(), abs=1e-5)
    first, second = groups[0].rewards
    assert first.components["rm/0"] == pytest.approx(float(raw[0, 0]), abs=1e-5)  # each member's own score
    assert second.components["rm/1"] == pytest.approx(float(raw[1, 1]), abs=1e-5)
    own = raw[:, 0].mean() - 0.5 * raw[:, 0].std(unbiased=False)  # the ensemble's score, unnormalised, unclipped
    assert first.components["rm"] == pytest.approx(float(own), abs=1e-5) and first.components["proxy"] == got[0]
    assert [r.score for r in groups[0].gold] == [0.0, 1.0]  # the verifier's rewards became the gold


def test_running_moments_match_the_whole_history_and_survive_a_checkpoint(rm_folder):
    batches = [torch.tensor([1.0, 2.0, 4.0]), torch.tensor([-3.0]), torch.tensor([0.5, 0.25])]
    n, mean, m2 = 0, 0.0, 0.0
    for x in batches:
        n, mean, m2 = merge_moments(n, mean, m2, x)
    everything = torch.cat(batches).double()
    assert n == 6 and mean == pytest.approx(float(everything.mean()))
    assert running_std(n, m2) == pytest.approx(float(everything.std(unbiased=False)))

    scorer = RewardScorer(_rm(str(rm_folder), normalize="running"), device="cpu", dtype="float32")
    prompts, completions = [[1, 20], [1, 21], [1, 22]], [[5, 2], [6, 2], [7, 7, 2]]
    first, _ = scorer.proxy(prompts, completions)
    assert float(first.mean()) == pytest.approx(0.0, abs=1e-5)  # the first batch: by its own statistics
    assert float(first.std(unbiased=False)) == pytest.approx(1.0, abs=1e-4)
    state = json.loads(json.dumps(scorer.state_dict()))
    again = RewardScorer(_rm(str(rm_folder), normalize="running"), device="cpu", dtype="float32")
    again.load_state_dict(state)
    torch.testing.assert_close(again.proxy(prompts[:1], completions[:1])[0], scorer.proxy(prompts[:1], completions[:1])[0])


def test_a_reward_model_with_another_vocabulary_is_refused(rm_folder):
    from rlvr.rollout.reward_scoring import check_same_tokenizer
    from rlvr.verifiers.errors import InvalidValueError

    class Other:
        def get_vocab(self):
            return {"a": 0}

    with pytest.raises(InvalidValueError, match="reward_model.path: .* different tokenizer"):
        check_same_tokenizer(Other(), RewardModel(rm_folder).tokenizer, str(rm_folder))


# ---------------------------------------------------------------------------------------------
# Composition with rule-based verifiers
# ---------------------------------------------------------------------------------------------


def test_combine_modes():
    assert combine_add(0.5, Reward(-0.2)) == (pytest.approx(0.3), None)
    assert combine_add(0.5, Reward(0.0, status="abstain"))[0] == 0.5
    score, failure = combine_add(0.5, Reward(0.0, status="timeout"))
    assert failure.status == "timeout"  # masked like any failed verification
    assert combine_gate(0.7, Reward(1.0), min_score=1.0, fail_score=-1.0) == (0.7, None)
    assert combine_gate(0.7, Reward(0.0), min_score=1.0, fail_score=-1.0) == (-1.0, None)
    assert combine_gate(0.7, Reward(0.6), min_score=0.5, fail_score=-2.0)[0] == 0.7


class _Runner:
    """Scores every sample with the partner verifier's name looked up here (no worker processes)."""

    def __init__(self, scores):
        self.scores, self.calls = scores, []

    def score_batch(self, name, completions, references, options, prompts, finish_reasons):
        self.calls.append((name, options))
        return [Reward(self.scores[c]) for c in completions]


def test_gate_and_add_through_the_scorer(rm_folder):
    groups = _groups([[1.0, 0.0]])
    gated = RewardScorer(_rm(str(rm_folder), combine="gate", verifier={"name": "format"}, gate_fail_score=-5.0),
                         device="cpu", dtype="float32", runner=_Runner({"0": 1.0, "1": 0.0}))
    gated.score(groups).apply(groups)
    proxy = [r.components["proxy"] for r in groups[0].rewards]
    assert [r.score for r in groups[0].rewards] == [pytest.approx(proxy[0]), -5.0]
    assert groups[0].rewards[1].components["format"] == 0.0

    groups = _groups([[1.0, 0.0]])
    runner = _Runner({"0": -0.25, "1": 0.0})
    added = RewardScorer(_rm(str(rm_folder), combine="add", verifier={"name": "length", "options": {}}),
                         device="cpu", dtype="float32", runner=runner)
    added.score(groups).apply(groups)
    assert runner.calls == [("length", {})]
    assert groups[0].rewards[0].score == pytest.approx(groups[0].rewards[0].components["proxy"] - 0.25)


# ---------------------------------------------------------------------------------------------
# Metrics: gold next to proxy, no fake accuracy, continuous rewards
# ---------------------------------------------------------------------------------------------


def test_gold_metrics_and_no_accuracy_from_the_reward_model():
    groups = _groups([[0.3, -1.2, 2.0, 0.1]], gold_by_group=[[1.0, 0.0, 1.0, 1.0]])
    for g in groups:
        for r in g.rewards:
            r.components = {"proxy": r.score, "rm": 10 * r.score}
    samples = _samples(groups, threshold=0.2)  # even a threshold judges the verifier's rewards, not the RM's
    metrics = step_metrics(groups, samples, RolloutStats(groups_seen=1), {}, None, mixed=False)
    assert "reward/accuracy" not in metrics
    assert metrics["gold/accuracy"] == 0.75 and metrics["gold/mean"] == 0.75
    assert metrics["proxy/reward"] == pytest.approx(3.0) and metrics["reward/mean"] == pytest.approx(0.3)
    assert metrics["verify/no_answer_frac"] == 0.0  # the verifier's extraction, not the reward model's


def test_continuous_verifier_rewards_log_no_accuracy_and_no_zero_variance_alarm():
    groups = _groups([[0.2, 0.7, 0.4, 0.9], [0.1, 0.3, 0.35, 0.0]])
    assert all(has_signal(g.rewards) for g in groups)
    samples = _samples(groups)
    assert samples.correct is None
    rollout = RolloutStats(groups_seen=2, zero_variance_groups=sum(not has_signal(g.rewards) for g in groups))
    metrics = step_metrics(groups, samples, rollout, {}, None, mixed=False)
    assert "reward/accuracy" not in metrics and metrics["rollout/zero_variance_frac"] == 0.0
    alarms = Alarms(patience=2)
    assert all(alarms.update(step, metrics) == [] for step in range(1, 6))
    # binary rewards keep their accuracy; an explicit threshold gives continuous ones one
    binary = _groups([[1.0, 0.0, 0.0, 0.0]])
    assert step_metrics(binary, _samples(binary), RolloutStats(), {}, None, mixed=False)["reward/accuracy"] == 0.25
    assert _samples(groups, threshold=0.5).correct.float().mean() == 0.25


# ---------------------------------------------------------------------------------------------
# The gold-vs-proxy alarm
# ---------------------------------------------------------------------------------------------


def test_gold_fell_by_hand():
    before = GoldWindow(step=10, gold=0.40, se=0.01, proxy=1.0, steps=10, step_se=0.03)
    noise = 3.5 * (0.01 ** 2 + 0.03 ** 2 / 2) ** 0.5  # 0.0808: the fall of a 2-step window must exceed it
    assert gold_fell(before, GoldWindow(12, 0.40 - noise - 0.001, 0.001, 1.5, steps=2))
    assert not gold_fell(before, GoldWindow(12, 0.40 - noise + 0.001, 0.001, 1.5, steps=2))  # inside the noise,
    # however small the window's own standard error (it shrinks as the gold falls)
    assert not gold_fell(before, GoldWindow(12, 0.10, 0.02, 0.9, steps=2))  # the proxy fell too: not gaming it
    assert not gold_fell(before, GoldWindow(12, 0.10, 0.02, 1.0, steps=2))  # nor did it rise
    exact = GoldWindow(10, 0.40, 0.0, 1.0, steps=10)  # no noise: min_drop (0.03) decides
    assert not gold_fell(exact, GoldWindow(12, 0.375, 0.0, 2.0)) and gold_fell(exact, GoldWindow(12, 0.365, 0.0, 2.0))


def test_a_gold_window_averages_and_adds_the_errors_in_quadrature():
    w = GoldWindow.of([(3, 1.0, 0.3, 0.03), (4, 2.0, 0.4, 0.04), (5, 3.0, 0.5, 0.0)])
    assert (w.step, w.proxy, w.steps) == (5, 2.0, 3) and w.gold == pytest.approx(0.4)
    assert w.se == pytest.approx(0.05 / 3) and w.step_se == pytest.approx(0.05 / 3 ** 0.5)


def _run_alarms(alarms, steps, first=1):
    fired = []
    for step, (proxy, gold) in enumerate(steps, first):
        fired += [step for _ in alarms.update(step, {"proxy/reward": proxy, "gold/mean": gold, "gold/se": 0.02})]
    return fired


def test_the_alarm_fires_within_a_window_of_the_gold_turning_down_once_per_stretch_and_resumes():
    flat = [(0.1 * i, 0.30) for i in range(10)]  # steps 1-10: gold steady at 0.30, proxy rising
    collapse = [(1.0 + 0.2 * i, 0.30 - 0.04 * (i + 1)) for i in range(5)]  # steps 11-15: gold 0.26, 0.22, ...
    recovered = [(2.0, 0.30)] * 12
    alarms = Alarms(window=2, reference=10)
    assert _run_alarms(alarms, flat) == []
    state = json.loads(json.dumps(alarms.state_dict()))
    fired = _run_alarms(alarms, collapse + recovered, first=11)
    # every step's se is 0.02: the reference's (10 steps) is 0.0063, a 2-step window's under no change
    # 0.02 / sqrt(2) = 0.0141, so a fall must exceed 3.5 * sqrt(0.0063^2 + 0.0141^2) = 0.054. Steps 11-12
    # (0.24: 0.06 under the reference's 0.30) fire at step 12, two steps after the gold turned; once.
    assert fired == [12] and alarms.fired == [(12, "gold_vs_proxy")]
    resumed = Alarms(window=2, reference=10)
    resumed.load_state_dict(state)
    assert resumed.recent == [tuple(r) for r in state["recent"]] and len(resumed.recent) == 10
    assert _run_alarms(resumed, collapse, first=11) == [12]
    assert alarms.best == GoldWindow.of([(s, p, g, 0.02) for s, (p, g) in list(enumerate(flat, 1))[:2]])


def test_ranking_fell_by_hand():
    before = RankingWindow(accuracy=0.65, se=0.02, pairs=2000, proxy=1.0)
    noise = 3.0 * (0.02 ** 2 + 0.04 ** 2) ** 0.5  # 0.134
    assert not ranking_fell(before, RankingWindow(0.65 - noise - 0.001, 0.04, 600, 1.5))  # 0.515: beyond the noise,
    # but the reward model still prefers the right answers
    assert ranking_fell(before, RankingWindow(0.49, 0.04, 600, 1.5))  # a fall of 0.16 > 0.134, and below 0.5
    assert not ranking_fell(before, RankingWindow(0.49, 0.04, 600, 0.9))  # ... but the score fell: a noisy dip
    assert not ranking_fell(before, RankingWindow(0.52, 0.04, 600, 1.5))  # still prefers right answers: no alarm
    assert not ranking_fell(RankingWindow(0.55, 0.02, 2000, 1.0), RankingWindow(0.45, 0.04, 600, 1.5))  # 0.10: noise
    assert not ranking_fell(RankingWindow(0.52, 0.0, 2000, 1.0), RankingWindow(0.49, 0.0, 600, 1.5))  # min_drop 0.05


def test_a_ranking_window_pools_pairs_and_adds_the_errors_in_quadrature():
    w = RankingWindow.of([(3, 0.8, 0.1, 100.0, 1.0), (4, 0.5, 0.2, 300.0, 2.0)])
    assert w.pairs == 400 and w.accuracy == pytest.approx((80 + 150) / 400) and w.proxy == 1.5
    assert w.se == pytest.approx(((0.1 * 100) ** 2 + (0.2 * 300) ** 2) ** 0.5 / 400)


def test_the_alarm_fires_when_the_reward_model_turns_against_the_verifier_before_the_gold_falls():
    """The ranking sign: ten steps at 0.65 (se 0.05, 200 pairs a step), then the reward model's ranking of
    the policy's samples falls to 0.40 while the gold holds. At step 12 the 3-step window (steps 10-12:
    0.483, se 0.029) is 0.167 under the reference (steps 1-9, se 0.017; noise 3.0 * 0.033 = 0.10) and
    below chance while the score rose: the alarm fires there, the second step of the fall, once. A reward
    model whose ranking drifts from 0.90 to 0.61 (never below chance) never fires it, nor does the same
    dip with a falling score."""
    def run(alarms, ranking, first=1, proxy_slope=0.1):
        fired = []
        for step, accuracy in enumerate(ranking, first):
            metrics = {"proxy/reward": proxy_slope * step, "gold/mean": 0.30, "gold/se": 0.02, "proxy/pairwise_accuracy": accuracy,
                       "proxy/pairwise_se": 0.05, "proxy/ranked_pairs": 200.0}
            fired += [(step, "ranking" in m) for m in alarms.update(step, metrics)]
        return fired

    alarms = Alarms(window=2, reference=10)
    assert run(alarms, [0.65] * 10) == []
    state = json.loads(json.dumps(alarms.state_dict()))
    assert run(alarms, [0.40] * 6, first=11) == [(12, True)] and alarms.fired == [(12, "gold_vs_proxy")]
    resumed = Alarms(window=2, reference=10)
    resumed.load_state_dict(state)  # the ranking history is kept in checkpoints
    assert run(resumed, [0.40] * 3, first=11) == [(12, True)]
    older = Alarms(window=2, reference=10)  # a checkpoint whose ranking rows lack the proxy: history restarts
    older.load_state_dict({**state, "ranked": [row[:4] for row in state["ranked"]]})
    assert older.ranked == [] and run(older, [0.40] * 3, first=11) == []
    assert run(Alarms(window=2, reference=10), [0.90 - 0.01 * i for i in range(30)]) == []
    # the same dip with the reward model's score falling: a weak reward model's noisy ranking, no alarm
    assert run(Alarms(window=2, reference=10), [0.65] * 10 + [0.40] * 6, proxy_slope=-0.1) == []


def test_no_alarm_on_a_flat_noisy_gold_beside_a_rising_proxy():
    noise = [0.40, 0.46, 0.37, 0.44, 0.41, 0.35, 0.45, 0.39, 0.43, 0.38] * 3
    alarms = Alarms(window=3)
    assert _run_alarms(alarms, [(0.1 * i, g) for i, g in enumerate(noise)]) == []


# ---------------------------------------------------------------------------------------------
# End to end: GRPO and PPO against a reward model, resume with running normalisation
# ---------------------------------------------------------------------------------------------


def _config(model, rm, out, *overrides):
    raw = {
        "out": str(out), "model": {"path": str(model)},
        "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
        "reward_model": {"path": str(rm), "normalize": "running", "clip": 3.0},
        "generation": {"max_new_tokens": 3}, "optim": {"lr": 1e-3},
        "train": {"steps": 3, "prompts_per_step": 4, "group_size": 4, "micro_batch_size": 16, "threads": 1},
        "eval": {"limit": 8}, "checkpoint": {"every": 0}, "log": {"progress": False, "plot_every": 0},
        "verifier": {"workers": 0},
    }
    return build_config(RunConfig, raw, list(overrides))


def _check_run(out, summary):
    records = read_metrics(out / "metrics.jsonl")
    step = records[1]
    for key in ["proxy/reward", "gold/mean", "gold/accuracy", "reward/proxy", "reward/rm", "time/reward_model"]:
        assert key in step, key
    assert "reward/accuracy" not in step
    assert summary["gold_accuracy_before"] == summary["accuracy_before"] is not None
    assert summary["gold_accuracy_after"] == summary["accuracy_after"] is not None
    assert json.loads((out / "summary.json").read_text())["gold_accuracy_after"] == summary["gold_accuracy_after"]
    assert (out / "metrics.png").stat().st_size > 10_000
    return records


def test_grpo_against_a_reward_model(taught_model, rm_folder, tmp_path):
    summary = grpo.train(_config(taught_model, rm_folder, tmp_path, "algorithm.beta=0"))
    assert [r["step"] for r in _check_run(tmp_path, summary)] == [0, 1, 2, 3]


def test_ppo_against_a_reward_model(taught_model, rm_folder, tmp_path):
    summary = ppo.train(_config(taught_model, rm_folder, tmp_path, "algorithm.preset=ppo", "algorithm.minibatches=2",
                                "algorithm.ppo_epochs=1"))
    records = _check_run(tmp_path, summary)
    assert all("critic/value_loss" in r for r in records[1:])  # the critic regresses on the normalised proxy


def test_a_resumed_run_keeps_the_running_normalisation(taught_model, rm_folder, tmp_path, monkeypatch):
    extra = ["train.steps=4", "checkpoint.every=2", "eval.at_start=false", "eval.at_end=false", "algorithm.beta=0"]
    grpo.train(_config(taught_model, rm_folder, tmp_path / "whole", *extra))
    real, calls = grpo.update_policy, []

    def crash_at_step_3(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(grpo, "update_policy", crash_at_step_3)
    with pytest.raises(RuntimeError, match="killed"):
        grpo.train(_config(taught_model, rm_folder, tmp_path / "killed", *extra))
    monkeypatch.setattr(grpo, "update_policy", real)
    grpo.train(_config(taught_model, rm_folder, tmp_path / "killed", *extra), resume=True)
    whole, resumed = read_metrics(tmp_path / "whole" / "metrics.jsonl"), read_metrics(tmp_path / "killed" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(whole, resumed):  # the normalised rewards need the saved running statistics
        assert a["proxy/reward"] == pytest.approx(b["proxy/reward"], abs=1e-5)
        assert a["reward/mean"] == pytest.approx(b["reward/mean"], abs=1e-5)


def test_quickstart_reward_model_wires_its_stages(tmp_path, monkeypatch, capsys):
    """`rlvr quickstart --reward-model`: SFT -> pairs from the SFT model -> reward model -> GRPO against it
    (each stage replaced by a stub that records what it was given)."""
    import rlvr.modeling.tiny
    import rlvr.recipes
    import rlvr.recipes.quickstart
    import rlvr.recipes.sft
    import rlvr.recipes.train_rm
    import rlvr.rollout.preferences
    from rlvr.cli import main

    seen = {}
    monkeypatch.setattr(rlvr.modeling.tiny, "build_tiny_model", lambda path, seed: seen.setdefault("base", path))
    monkeypatch.setattr(rlvr.recipes.sft, "train",
                        lambda config, **_: seen.setdefault("sft", config) and {"steps": 7, "eval_accuracy": 0.4})

    def preferences(model, task, out, **kwargs):
        seen["preferences"] = (model, task, out, kwargs)
        return {"pairs": 11, "sample_accuracy": 0.2}

    def train_rm(config, **_):
        seen["rm"] = config
        return {"pairwise_accuracy": 0.93, "model": str(tmp_path / "rm" / "final")}

    def train_rl(config, **_):
        seen["rl"] = config
        return {"accuracy_before": 0.3, "accuracy_after": 0.5, "gold_accuracy_before": 0.3, "gold_accuracy_after": 0.5,
                "wall_s": 1.0, "alarms": []}

    monkeypatch.setattr(rlvr.rollout.preferences, "build_preferences", preferences)
    monkeypatch.setattr(rlvr.recipes.train_rm, "train", train_rm)
    monkeypatch.setattr(rlvr.recipes, "train", train_rl)
    monkeypatch.setattr(rlvr.recipes.quickstart, "head_greedy_accuracy",
                        lambda model, config: seen.setdefault("head", (model, config)) and 0.61)
    assert main(["quickstart", "--reward-model", "--out", str(tmp_path), "--seed", "3", "--steps", "5", "--no-progress"]) == 0
    assert seen["sft"].eval.stop_at_accuracy == 0.4  # further than the verifier quickstart's 0.3 (RM_SFT_STOP)
    model, task, out, kwargs = seen["preferences"]
    assert model == str(tmp_path / "sft" / "final") and task == "arithmetic" and kwargs["options"]["max_digits"] == 3
    assert seen["rm"].data.path == str(out) and seen["rm"].model.path == model and seen["rm"].head == "logprob"
    # the settings that made seed 1 gain (docs/reward-models.md): more pairs, the chosen answers kept likely
    assert kwargs["pairs_per_prompt"] == 4 and seen["rm"].loss.nll_coef == 1.0
    rl = seen["rl"]
    assert rl.reward_model.path == str(tmp_path / "rm" / "final") and rl.train.steps == 5 and rl.train.seed == 3
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["pairwise_accuracy"] == 0.93 and summary["gold_accuracy_after"] == 0.5 and "wall_s" in summary
    # the reward model's own greedy answers, on the RL stage's held-out problems: where GRPO against it heads
    assert seen["head"][0] == tmp_path / "rm" / "final" and seen["head"][1].eval.limit == rl.eval.limit
    assert summary["reward_model_greedy_accuracy"] == 0.61
    printed = capsys.readouterr().out
    assert "[5/5] GRPO against the reward model" in printed and "gold-vs-proxy alarm: never fired" in printed
    assert "the reward model's own greedy answers: accuracy 0.610 on the 500 held-out problems" in printed


def test_a_run_says_at_start_that_the_reward_model_is_the_reward(tmp_path):
    """Before, a run with reward_model.path announced only the suites' verifiers."""
    from types import SimpleNamespace

    from rlvr.rollout.reward_scoring import RewardScorer

    scorer = RewardScorer.__new__(RewardScorer)
    scorer.config = build_config(RunConfig, {"model": {"path": "m"}, "reward_model": {"path": "rm/final", "clip": 5}}
                                 ).reward_model
    scorer.models = [SimpleNamespace(head="logprob")]
    assert scorer.describe() == ("reward: the reward model rm/final (logprob head) (normalize none, clip 5); the "
                                 "suites' verifiers only watch (gold/ metrics and the evaluation), they are not optimised")


def test_stop_on_gold_vs_proxy_ends_the_run_on_the_policy_of_its_best_gold_window(taught_model, rm_folder, tmp_path,
                                                                                   monkeypatch):
    """log.stop_on: [gold_vs_proxy] ends the run at the step the alarm fires, evaluates and saves the policy
    that sampled the best gold window (the oldest policy of that window), and says so in summary.json."""
    import rlvr.run.alarms
    from safetensors.torch import load_file

    fires = iter([False, True])  # 1-step windows: step 2 (against step 1) holds, step 3 falls
    monkeypatch.setattr(rlvr.run.alarms, "gold_fell", lambda *a, **k: next(fires))
    config = _config(taught_model, rm_folder, tmp_path, "algorithm.beta=0", "train.steps=6", "log.gold_window=1",
                     "log.stop_on=[gold_vs_proxy]", "checkpoint.every=1", "checkpoint.keep=10", "eval.every=0")
    summary = grpo.train(config)
    assert summary["stopped"] == "alarm gold_vs_proxy at step 3" and summary["alarms"] == [
        {"step": 3, "alarm": "gold_vs_proxy"}]
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3] and "eval/accuracy" in records[-1]  # evaluated at the stop
    best = summary["final_policy_step"]
    gold = {r["step"]: r["gold/mean"] for r in records[1:]}
    assert best == max(gold, key=gold.get) - 1  # a 1-step window: the policy before the best step sampled it
    kept = load_file(str((tmp_path / "checkpoints" / f"step_{best:06d}" / "model" if best else taught_model)
                         / "model.safetensors"))
    final = load_file(str(tmp_path / "final" / "model.safetensors"))
    assert all(torch.equal(final[k], kept[k]) for k in final)
    assert grpo.train(config, resume=True)["stopped"] == summary["stopped"]  # a resume ends at once


def test_the_proxy_s_pairwise_accuracy_on_the_policy_s_own_samples_by_hand():
    """Pairs of one prompt's samples that the gold scores differently: the share the reward model orders
    the same way, a tie half. Group A: right 0.9 / 0.2, wrong 0.5 -> pairs (0.9>0.5 agree, 0.2<0.5
    disagree); group B: right 0.4, wrong 0.4 and 0.1 -> (tie 0.5, agree); group C has no mixed pair;
    an errored gold sample is left out. 2.5 of 4 pairs."""
    from rlvr.recipes.step_metrics import proxy_pairwise_accuracy, step_metrics  # noqa: F401
    from rlvr.verifiers.base import Reward

    def group(rows):
        rewards = [Reward(score=0.0, components={"rm": rm}) for rm, _ in rows]
        gold = [Reward(score=g, status="ok") if g is not None else Reward(score=0.0, status="error") for _, g in rows]
        return Group(suite="s", problem=None, prompt_ids=[1], completions=[], rewards=rewards, gold=gold)

    groups = [group([(0.9, 1.0), (0.2, 1.0), (0.5, 0.0)]), group([(0.4, 1.0), (0.4, 0.0), (0.1, 0.0), (3.0, None)]),
              group([(0.7, 1.0), (0.1, 1.0)])]
    accuracy, se, pairs = proxy_pairwise_accuracy(groups)
    assert (accuracy, pairs) == (2.5 / 4, 4.0)
    # clusters A (1 of 2 pairs) and B (1.5 of 2): sqrt(2/1 * ((1 - 1.25)^2 + (1.5 - 1.25)^2)) / 4
    assert se == pytest.approx((2 * (0.25 ** 2 + 0.25 ** 2)) ** 0.5 / 4)
    assert proxy_pairwise_accuracy([groups[2]]) is None  # nothing to rank
