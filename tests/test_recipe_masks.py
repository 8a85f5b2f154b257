"""What the RL recipes hand to their update: exactly the samples that count, and rewards with the KL
penalty in them when the preset puts it there. Short runs on the tiny models, the recipe's own
helpers wrapped to record what passes through."""

import pytest
import torch

from rlvr.config import RunConfig, build_config
from rlvr.recipes import grpo, ppo
from rlvr.run.tracking import read_metrics
from rlvr.verifiers import Reward, register_verifier


@register_verifier("test_masks_flaky")
class FlakyByAnswer:
    """Crashes on problems whose answer is a multiple of 3; otherwise 1 for the right sum, else 0."""

    name = "test_masks_flaky"

    def score(self, completion, reference):
        if int(reference["answer"]) % 3 == 0:
            raise RuntimeError("verifier crashed")
        return Reward(float(completion.strip() == reference["answer"]))


def _config(model, out, *overrides):
    raw = {
        "out": str(out), "model": {"path": str(model)},
        "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
        "generation": {"max_new_tokens": 3}, "optim": {"lr": 1e-3},
        "train": {"steps": 1, "prompts_per_step": 8, "group_size": 4, "micro_batch_size": 16},
        "eval": {"at_start": False, "at_end": False}, "checkpoint": {"every": 0},
        "log": {"progress": False, "plot_every": 0},
    }
    return build_config(RunConfig, raw, list(overrides))


@pytest.mark.parametrize("recipe", ["grpo", "ppo"])
def test_failed_and_filtered_samples_have_no_loss_tokens_and_the_rest_keep_all_theirs(taught_model, tmp_path,
                                                                                        monkeypatch, recipe):
    """verifier.on_failure: mask and algorithm.overlong: filter, as the update sees them: a row whose
    verification failed or that hit max_new_tokens has an all-zero response mask; every other row
    keeps one loss token per completion token."""
    module = grpo if recipe == "grpo" else ppo
    seen = {}
    real_collate = module.collate

    def collate(groups, pad_id):
        seen["groups"] = groups
        return real_collate(groups, pad_id)

    update_name = "update_policy" if recipe == "grpo" else "update_actor_critic"
    real_update = getattr(module, update_name)

    def spy_update(*args, **kwargs):
        batch = next(a for a in args if hasattr(a, "response_mask"))
        seen["mask"] = batch.response_mask.detach().cpu().clone()
        return real_update(*args, **kwargs)

    monkeypatch.setattr(module, "collate", collate)
    monkeypatch.setattr(module, update_name, spy_update)
    preset = ["algorithm.preset=grpo", "algorithm.beta=0.04"] if recipe == "grpo" else ["algorithm.preset=ppo",
                                                                                       "algorithm.ppo_epochs=1",
                                                                                       "algorithm.minibatches=1"]
    torch.manual_seed(0)
    module.train(_config(taught_model, tmp_path, *preset, "verifier.name=test_masks_flaky", "verifier.workers=0",
                         "algorithm.overlong=filter", "generation.max_new_tokens=2"))
    rows = [(c, r) for g in seen["groups"] for c, r in zip(g.completions, g.rewards)]
    dropped = [r.status in ("error", "timeout") or c.finish_reason == "length" for c, r in rows]
    assert any(dropped) and not all(dropped)  # both kinds are in the batch
    assert any(r.status == "error" for _, r in rows) and any(c.finish_reason == "length" for c, _ in rows)
    mask = seen["mask"]
    for i, ((completion, _), drop) in enumerate(zip(rows, dropped)):
        assert mask[i].sum().item() == (0 if drop else len(completion.token_ids)), i


def test_kl_in_the_reward_reaches_the_advantage_estimator(taught_model, tmp_path, monkeypatch):
    """rloo: scores = verifier score - beta * sum_t k1_t, before the estimator. Step 1's policy is the
    reference (KL 0); at step 2 it has moved, and the scores the estimator gets are off the 0/1 grid
    by exactly beta times the logged per-sequence KL."""
    scores_seen = []
    registry = grpo.ADVANTAGE_ESTIMATORS.copy()
    rloo = registry.get("rloo")

    def recording_rloo(scores, valid=None):
        scores_seen.append(scores.clone())
        return rloo(scores, valid)

    registry.register("rloo", recording_rloo, overwrite=True)
    monkeypatch.setattr(grpo, "ADVANTAGE_ESTIMATORS", registry)
    torch.manual_seed(0)
    grpo.train(_config(taught_model, tmp_path, "algorithm.preset=rloo", "train.steps=2"))
    steps = read_metrics(tmp_path / "metrics.jsonl")
    beta = 0.05
    assert steps[0]["reward/kl_seq_mean"] == 0 and torch.equal(scores_seen[0], scores_seen[0].round())
    kl = steps[1]["reward/kl_seq_mean"]
    assert abs(kl) > 1e-3  # the policy moved: there is a penalty to see
    shift = scores_seen[1].round() - scores_seen[1]  # beta * seq_kl per sample
    assert shift.mean().item() == pytest.approx(beta * kl, rel=1e-3)
