"""Rollout: sampling problems, scoring groups, failure masking, overlong handling, padding layout."""

import torch

from rlvr.engines.base import Completion, SamplingParams
from rlvr.rollout.groups import Group, collect_groups
from rlvr.rollout.sampler import ProblemSampler
from rlvr.rollout.batch import collate, overlong_soft_penalty, sample_tensors
from rlvr.tasks.base import Problem
from rlvr.verifiers import Reward, register_verifier
from rlvr.verifiers.runner import VerifierRunner


@register_verifier("test_status_from_text")
class StatusFromText:
    """Scores 1 for 'right', 0 for 'wrong', and fails with the status named by the text otherwise."""

    name = "test_status_from_text"

    def score(self, completion, reference):
        if completion in ("timeout", "error", "abstain"):
            return Reward(0.0, status=completion)
        return Reward(float(completion == "right"), info={"extracted": completion or None})


def _problems(n, prefix="p"):
    return [Problem(f"{prefix}/{i}", [{"role": "user", "content": f"q{i}"}], {"answer": str(i)}, "test_status_from_text") for i in range(n)]


class ScriptedEngine:
    """Answers problem k with the texts script[k] (a group), cycling through the list per call."""

    pad_id = 0

    def __init__(self, script):
        self.script = script
        self.calls = 0

    def generate(self, prompts, n, sampling):
        out = []
        for _ in prompts:
            texts = self.script[self.calls % len(self.script)]
            self.calls += 1
            out.append([Completion([1] * max(1, len(t)), t, [-0.5] * max(1, len(t)), "stop") for t in texts[:n]])
        return out

    weight_sync = "shared"

    def update_weights(self, named_tensors):
        pass


def _collect(engine, sampler, *, dynamic, num_prompts=2):
    return collect_groups(
        engine=engine, runner=VerifierRunner(workers=0), sampler=sampler, encode=lambda p: [5, 6], num_prompts=num_prompts,
        group_size=2, sampling=SamplingParams(max_new_tokens=4), verifier=None, verifier_options=None,
        dynamic_sampling=dynamic, max_resample_rounds=3,
    )


def test_sampler_is_deterministic_covers_each_epoch_and_resumes():
    problems = _problems(10)
    a = ProblemSampler({"s": problems}, {"s": 1.0}, seed=3)
    first = [p.id for _, p in a.next(10)]
    assert sorted(first) == sorted(p.id for p in problems)  # one epoch = every problem once
    state = a.state_dict()
    after = [p.id for _, p in a.next(7)]
    b = ProblemSampler({"s": problems}, {"s": 1.0}, seed=3)
    b.load_state_dict(state)
    assert [p.id for _, p in b.next(7)] == after
    c = ProblemSampler({"s": problems}, {"s": 1.0}, seed=3)
    assert [p.id for _, p in c.next(10)] == first


def test_sampler_mixes_suites_by_weight():
    sampler = ProblemSampler({"a": _problems(5, "a"), "b": _problems(5, "b")}, {"a": 3.0, "b": 1.0}, seed=0)
    names = [name for name, _ in sampler.next(4000)]
    assert 0.70 < names.count("a") / len(names) < 0.80


def test_dynamic_sampling_drops_zero_variance_groups_and_refills():
    engine = ScriptedEngine([["right", "right"], ["right", "wrong"], ["wrong", "wrong"], ["wrong", "right"]])
    sampler = ProblemSampler({"s": _problems(50)}, {"s": 1.0}, seed=0)
    groups, stats = _collect(engine, sampler, dynamic=True)
    assert len(groups) == 2
    assert all({r.score for r in g.rewards} == {0.0, 1.0} for g in groups)
    # round 1: RR dropped, RW kept; round 2 (one prompt): WW dropped; round 3: WR kept
    assert stats.rounds == 3 and stats.dropped_groups == 2 and stats.zero_variance_groups == 2

    engine = ScriptedEngine([["right", "right"], ["right", "wrong"]])
    groups, stats = _collect(engine, ProblemSampler({"s": _problems(50)}, {"s": 1.0}, seed=0), dynamic=False)
    assert len(groups) == 2 and stats.rounds == 1 and stats.zero_variance_groups == 1


@register_verifier("test_continuous_length")
class ContinuousLength:
    """A continuous reward: a tenth of the completion's length, never reaching 1."""

    name = "test_continuous_length"

    def score(self, completion, reference):
        return Reward(len(completion) / 10)


def test_dynamic_sampling_keeps_continuous_groups_whose_rewards_differ():
    """Before: groups were kept by thresholded accuracy, so a continuous reward below the pass
    threshold (every group "all wrong") dropped every group and spent every extra round."""
    engine = ScriptedEngine([["aa", "aaa"], ["aa", "aa"], ["a", "aaaa"]])
    problems = [Problem(f"c/{i}", [{"role": "user", "content": "q"}], {}, "test_continuous_length") for i in range(50)]
    groups, stats = collect_groups(
        engine=engine, runner=VerifierRunner(workers=0), sampler=ProblemSampler({"s": problems}, {"s": 1.0}, seed=0),
        encode=lambda p: [5, 6], num_prompts=2, group_size=2, sampling=SamplingParams(max_new_tokens=4),
        verifier=None, verifier_options=None, dynamic_sampling=True, max_resample_rounds=3,
    )
    assert [[r.score for r in g.rewards] for g in groups] == [[0.2, 0.3], [0.1, 0.4]]
    assert stats.rounds == 2 and stats.dropped_groups == 1 and stats.zero_variance_groups == 1


def test_dynamic_sampling_tops_up_with_dropped_groups_when_rounds_run_out():
    engine = ScriptedEngine([["right", "right"]])
    groups, stats = _collect(engine, ProblemSampler({"s": _problems(50)}, {"s": 1.0}, seed=0), dynamic=True)
    assert len(groups) == 2 and stats.rounds == 4  # 1 + max_resample_rounds


def _groups(texts_by_group, finish="stop"):
    runner = VerifierRunner(workers=0)
    groups = []
    for i, texts in enumerate(texts_by_group):
        completions = [Completion([1] * len(t), t, [-1.0] * len(t), finish) for t in texts]
        rewards = runner.score_batch("test_status_from_text", texts, [{}] * len(texts))
        groups.append(Group("s", None, [9], completions, rewards))
    return groups


def _tensors(groups, **kw):
    args = dict(on_failure="mask", success_threshold=1.0, overlong="none", max_new_tokens=8, overlong_buffer=4, overlong_penalty=1.0)
    return sample_tensors(groups, **{**args, **kw})


def test_failed_verification_is_masked_by_default_and_scored_zero_on_request():
    groups = _groups([["right", "timeout", "error", "abstain"]])
    masked = _tensors(groups)
    assert masked.valid.tolist() == [[True, False, False, False]]
    assert masked.scores.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    zero = _tensors(groups, on_failure="zero")
    assert zero.valid.tolist() == [[True, True, True, False]]  # abstain has no score to use
    assert zero.correct.tolist() == [[True, False, False, False]]


def test_overlong_soft_punishment_formula():
    lengths = torch.tensor([2, 4, 5, 6, 8])
    # max 8, buffer 4: no penalty up to 4 tokens, then linear to -1 at 8
    assert overlong_soft_penalty(lengths, 8, 4, 1.0).tolist() == [0.0, 0.0, -0.25, -0.5, -1.0]
    groups = _groups([["right", "wrongwrong"]])
    t = _tensors(groups, overlong="soft", max_new_tokens=10, overlong_buffer=4)
    assert t.scores.tolist() == [[1.0, -1.0]]  # 10 tokens: full penalty on top of 0


def test_overlong_filter_masks_truncated_samples_out_of_the_loss():
    t = _tensors(_groups([["right", "wrong"]], finish="length"), overlong="filter")
    assert t.truncated.all() and t.loss_weight.tolist() == [[0.0, 0.0]]


def test_collate_layout_left_padded_prompts_right_padded_completions():
    groups = [
        Group("s", None, [7, 8, 9], [Completion([1, 2], "", [-0.1, -0.2], "stop")]),
        Group("s", None, [5], [Completion([3, 4, 6], "", [-0.3, -0.4, -0.5], "length")]),
    ]
    batch = collate(groups, pad_id=0)
    assert batch.input_ids.tolist() == [[7, 8, 9, 1, 2, 0], [0, 0, 5, 3, 4, 6]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert batch.response_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert torch.allclose(batch.engine_logp, torch.tensor([[-0.1, -0.2, 0.0], [-0.3, -0.4, -0.5]]))
    assert batch.completion_len == 3 and len(batch.select(torch.tensor([1]))) == 1


def test_the_configs_verifier_wins_over_each_problems_own():
    """verifier.name (with its options) scores every problem; without it, each problem's own verifier."""
    from rlvr.rollout.groups import score_groups

    problems = [Problem("p/0", [{"role": "user", "content": "q"}], {"answer": "0"}, "test_status_from_text"),
                Problem("p/1", [{"role": "user", "content": "q"}], {"answer": "1"}, "test_continuous_length")]
    completion = Completion([1], "right", [-0.1], "stop")
    runner = VerifierRunner(workers=0)
    groups = [Group("s", p, [5], [completion]) for p in problems]
    score_groups(runner, groups, None, None)
    assert [g.rewards[0].score for g in groups] == [1.0, 0.5]  # each problem's own verifier
    score_groups(runner, groups, "test_continuous_length", {})
    assert [g.rewards[0].score for g in groups] == [0.5, 0.5]  # the config's verifier for all
