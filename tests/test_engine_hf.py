"""The Hugging Face engine: groups, finish reasons, and log-probs equal to a full forward pass."""

import pytest
import torch

from rlvr.rollout.chat import encode_prompts
from rlvr.engines import HFEngine, SamplingParams, build_engine
from rlvr.modeling.logprobs import completion_logprobs
from rlvr.modeling.loading import load_policy, load_tokenizer
from rlvr.rollout.groups import Group
from rlvr.rollout.batch import collate


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


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (3, 1.0), (0, 0.6), (4, 0.8)])
def test_sampling_keeps_the_tokens_transformers_warpers_keep(top_k, top_p):
    """Temperature, then top-k, then top-p, as transformers' generate applies them; the recorded
    log-prob is the tempered distribution's, before truncation."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from rlvr.engines.hf import sample_next

    torch.manual_seed(0)
    logits = torch.randn(5, 12)
    warpers = LogitsProcessorList([TemperatureLogitsWarper(0.7)] + ([TopKLogitsWarper(top_k)] if top_k else [])
                                  + ([TopPLogitsWarper(top_p)] if top_p < 1 else []))
    target = warpers(torch.zeros(5, 1, dtype=torch.long), logits.clone()).softmax(-1)  # what generate samples from
    draws = 4000
    tokens, logp = sample_next(logits.repeat(draws, 1), SamplingParams(temperature=0.7, top_k=top_k, top_p=top_p))
    expected = torch.log_softmax(logits / 0.7, -1).repeat(draws, 1).gather(1, tokens[:, None]).squeeze(1)
    torch.testing.assert_close(logp, expected)
    rows = torch.arange(5).repeat(draws)
    frequency = torch.zeros(5, 12).index_put_((rows, tokens), torch.ones(len(tokens)), accumulate=True) / draws
    assert not ((frequency > 0) & (target == 0)).any()  # never a token the warpers drop
    assert (frequency - target).abs().max() < 0.03  # 4000 draws: the standard error is at most 0.008
    if top_k or top_p < 1:
        assert ((target == 0).sum(1) > 0).all()


def test_draw_samples_each_row_s_distribution_and_never_a_zero_entry():
    from rlvr.engines.hf import draw

    probs = torch.tensor([[0.0, 0.1, 0.0, 0.6, 0.3, 0.0], [0.5, 0.0, 0.0, 0.0, 0.0, 0.5]])
    torch.manual_seed(0)
    tokens = draw(probs.repeat(20_000, 1)).view(20_000, 2)
    for row in range(2):
        frequency = torch.bincount(tokens[:, row], minlength=6) / 20_000
        assert (frequency[probs[row] == 0] == 0).all()
        assert (frequency - probs[row]).abs().max() < 0.015  # standard error at most 0.0036
    assert draw(torch.tensor([[0.0, 0.0, 1.0]])).tolist() == [2]

def test_greedy_decoding_equals_transformers_generate(taught_model):
    from transformers import GenerationConfig

    tokenizer = load_tokenizer(taught_model)
    engine = HFEngine(load_policy(taught_model), tokenizer)
    prompts = _prompts(tokenizer, ["1+2=", "4+4=", "9+9=", "12+3="])
    ours = engine.generate(prompts, n=1, sampling=SamplingParams(max_new_tokens=4, greedy=True))
    for prompt, (completion,) in zip(prompts, ours):
        out = engine.model.generate(input_ids=torch.tensor([prompt]), generation_config=GenerationConfig(
            max_new_tokens=4, do_sample=False, eos_token_id=engine.eos_ids, pad_token_id=engine.pad_id))
        theirs = out[0, len(prompt):].tolist()
        assert completion.token_ids == theirs[: len(completion.token_ids)]
        assert completion.finish_reason == "length" or theirs[len(completion.token_ids):] in ([], [engine.pad_id] * (len(theirs) - len(completion.token_ids)))
