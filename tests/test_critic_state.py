"""The critic must learn a value that depends on the state, not only the mean return.

A critic whose head saw no hidden state (or whose optimizer stepped only the head's bias) still
matches the mean return, which is all the PPO quickstart's slow check (mean value ~ mean return)
can see. Here the return is decided by one token inside the completion: a bias cannot explain any
of its variance, a critic that reads the state explains almost all of it.
"""

import torch

from rlvr.algorithms.critic import explained_variance
from rlvr.config import RunConfig, build_config
from rlvr.engines.base import Completion
from rlvr.recipes.ppo import _critic_gradients
from rlvr.recipes.update import TokenMeans, UpdateSettings
from rlvr.rollout.batch import collate
from rlvr.rollout.groups import Group


def _batch(tokenizer):
    """Two prompts x four completions: 'Y...' earns 1, 'N...' earns 0, tails of different lengths."""
    groups = []
    for prompt in ["1+2=", "3+4="]:
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        completions = []
        for text in ["Y17", "N17", "Y5", "N5"]:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            completions.append(Completion(ids, text, [0.0] * len(ids), "stop"))
        groups.append(Group("s", None, prompt_ids, completions))
    batch = collate(groups, tokenizer.pad_token_id)
    won = torch.tensor([text.startswith("Y") for g in groups for text in (c.text for c in g.completions)]).float()
    # V[b, t] is the value of the prompt + the first t tokens: at t = 0 the Y/N token is not yet seen
    # (the return's expectation there is 0.5); from t = 1 on it is, and the return is 1 or 0.
    returns = won[:, None].expand_as(batch.response_mask).clone()
    returns[:, 0] = 0.5
    batch.returns = returns * batch.response_mask
    return batch, won


def test_the_critic_learns_a_value_that_depends_on_the_state(tiny_model):
    from rlvr.modeling.loading import load_policy, load_tokenizer
    from rlvr.modeling.value_model import build_critic

    torch.manual_seed(0)
    policy, tokenizer = load_policy(tiny_model), load_tokenizer(tiny_model)
    critic = build_critic(policy, path=tiny_model)
    config = build_config(RunConfig, {"model": {"path": str(tiny_model)}}, ["algorithm.preset=ppo"])
    s = UpdateSettings.from_config(config)
    batch, won = _batch(tokenizer)
    optimizer = torch.optim.AdamW(critic.trainable_parameters(), lr=3e-3)
    for _ in range(60):  # each step as a PPO step: old values from the critic of the moment, then one update
        with torch.no_grad():
            batch.old_values = critic(batch.input_ids, batch.attention_mask, batch.completion_len) * batch.response_mask
        optimizer.zero_grad()
        _critic_gradients(critic, batch, s, TokenMeans())
        optimizer.step()
    with torch.no_grad():
        values = critic(batch.input_ids, batch.attention_mask, batch.completion_len)
    mask = batch.response_mask.bool()
    assert explained_variance(values, batch.returns, batch.response_mask) > 0.9
    after = mask.clone()
    after[:, 0] = False  # the states that have seen the deciding token
    gap = values[after & (won[:, None] == 1)].mean() - values[after & (won[:, None] == 0)].mean()
    assert gap > 0.8
    assert values[:, 0].sub(0.5).abs().max() < 0.2  # before it, the expectation
