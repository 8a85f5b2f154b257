"""The Hugging Face engine: groups, finish reasons, and log-probs equal to a full forward pass."""

import pytest
import torch

from rlvr.chat import encode_prompts
from rlvr.engines import HFEngine, SamplingParams, build_engine
from rlvr.logprobs import completion_logprobs
from rlvr.models import load_policy, load_tokenizer
from rlvr.rollout import Group, collate


@pytest.fixture(scope="module")
def engine(tiny_model):
    return HFEngine(load_policy(tiny_model), load_tokenizer(tiny_model), max_batch_size=8)


def _prompts(tokenizer, texts):
    return encode_prompts(tokenizer, [[{"role": "user", "content": t}] for t in texts])


def test_groups_have_the_requested_shape_and_fields(engine):
    prompts = _prompts(engine.tokenizer, ["1+2=", "33+4=", "5+66="])
    groups = engine.generate(prompts, n=4, sampling=SamplingParams(max_new_tokens=6))  # 12 sequences in chunks of 8
    assert len(groups) == 3 and all(len(g) == 4 for g in groups)
    for group in groups:
        for c in group:
            assert len(c.logprobs) == len(c.token_ids) <= 6
            assert c.finish_reason in ("stop", "length")
            assert (c.finish_reason == "stop") == (c.token_ids[-1] in engine.eos_ids)
            assert all(lp <= 0 for lp in c.logprobs)


def test_recorded_logprobs_equal_a_training_forward_pass(engine):
    torch.manual_seed(0)
    prompts = _prompts(engine.tokenizer, ["7+345=", "2+2=", "123+45="])
    sampling = SamplingParams(max_new_tokens=8, temperature=0.7)
    groups = engine.generate(prompts, n=3, sampling=sampling)
    batch = collate([Group("t", None, p, g) for p, g in zip(prompts, groups)], engine.pad_id)
    with torch.no_grad():
        logp, _ = completion_logprobs(engine.model, batch.input_ids, batch.attention_mask, batch.completion_len, 0.7)
    diff = ((logp - batch.engine_logp).abs() * batch.response_mask).max()
    assert diff < 1e-4


def test_greedy_is_deterministic_and_ignores_the_seed(engine):
    prompts = _prompts(engine.tokenizer, ["4+5="])
    torch.manual_seed(1)
    a = engine.generate(prompts, n=2, sampling=SamplingParams(max_new_tokens=5, greedy=True))
    torch.manual_seed(2)
    b = engine.generate(prompts, n=1, sampling=SamplingParams(max_new_tokens=5, greedy=True))
    assert a[0][0].token_ids == a[0][1].token_ids == b[0][0].token_ids


def test_finish_reasons_stop_at_eos_and_length_at_the_limit(taught_model):
    tokenizer = load_tokenizer(taught_model)
    engine = HFEngine(load_policy(taught_model), tokenizer)
    prompts = _prompts(tokenizer, ["1+2=", "4+4="])
    stopped = engine.generate(prompts, n=1, sampling=SamplingParams(max_new_tokens=6, greedy=True))
    for (c,) in stopped:  # the SFT'd model answers with digits then EOS
        assert c.finish_reason == "stop" and c.token_ids[-1] == tokenizer.eos_token_id
        assert c.text.isdigit() and tokenizer.eos_token not in c.text
    cut = engine.generate(prompts, n=1, sampling=SamplingParams(max_new_tokens=1, greedy=True))
    assert all(c.finish_reason == "length" and len(c.token_ids) == 1 for (c,) in cut if c.token_ids[0] != tokenizer.eos_token_id)


def test_sampling_params_validation():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    SamplingParams(temperature=0, greedy=True)


def test_unknown_engine_lists_the_valid_ones(engine):
    with pytest.raises(KeyError, match="valid engines: hf"):
        build_engine("sglang", engine.model, engine.tokenizer)
