"""Completion log-probs with a shared prompt pass equal those of whole rows, values and gradients."""

from __future__ import annotations

import pytest
import torch

from rlvr.modeling.logprobs import _whole_rows, completion_logits, completion_logprobs


def _rows(pad_id: int):
    """Six rows over three prompts of different lengths (left-padded to W=4), completions of
    lengths 3, 1, 2, 3, 0 and 2 (right-padded to T=3), one prompt holding the pad id itself."""
    prompts = [[1, 5, 6, 7], [1, 8], [pad_id, 9, 10]]
    rows = [(0, [11, 12, 2]), (0, [13]), (1, [5, 2]), (1, [6, 7, 8]), (2, []), (2, [12, 2])]
    width, length = 4, 3
    ids = torch.full((len(rows), width + length), pad_id)
    mask = torch.zeros_like(ids)
    for i, (p, completion) in enumerate(rows):
        prompt = prompts[p]
        ids[i, width - len(prompt) : width] = torch.tensor(prompt)
        ids[i, width : width + len(completion)] = torch.tensor(completion, dtype=torch.long)
        mask[i, width - len(prompt) : width + len(completion)] = 1
    response = mask[:, width:].float()
    return ids, mask, response, length


@pytest.fixture(scope="module")
def policy(tiny_model):
    from rlvr.modeling.loading import load_policy

    torch.manual_seed(0)
    model = load_policy(tiny_model)
    with torch.no_grad():  # a random tiny model's logits are nearly flat: sharpen them
        for p in model.parameters():
            p.mul_(3.0)
    return model.train()


def test_shared_prompt_logits_equal_whole_row_logits_where_scored(policy):
    ids, mask, response, length = _rows(policy.config.pad_token_id)
    shared = completion_logits(policy, ids, mask, length)
    whole = _whole_rows(policy, ids, mask, length)
    assert shared.shape == whole.shape == (len(ids), length, policy.config.vocab_size)
    scored = response.bool()
    torch.testing.assert_close(shared[scored], whole[scored], rtol=1e-5, atol=1e-5)


def test_a_shared_prompt_gets_the_summed_gradient_of_its_rows(policy):
    ids, mask, response, length = _rows(policy.config.pad_token_id)
    weights = torch.linspace(-1.0, 2.0, steps=length * len(ids)).view(len(ids), length)

    def grads(fn):
        policy.zero_grad()
        logits = fn(policy, ids, mask, length).float()
        logp = torch.log_softmax(logits, -1).gather(2, ids[:, -length:, None]).squeeze(-1)
        (logp * weights * response).sum().backward()
        return [p.grad.clone() for p in policy.parameters()]

    for shared, whole in zip(grads(completion_logits), grads(_whole_rows)):
        torch.testing.assert_close(shared, whole, rtol=1e-4, atol=1e-4)  # gradients up to ~30: fp32 rounding


def test_one_completion_token_needs_no_second_pass_and_distinct_prompts_run_whole(policy):
    ids, mask, response, length = _rows(policy.config.pad_token_id)
    first = completion_logits(policy, ids[:, :-2], mask[:, :-2], 1)  # T = 1: the prompts' last logits only
    torch.testing.assert_close(first, _whole_rows(policy, ids[:, :-2], mask[:, :-2], 1), rtol=1e-5, atol=1e-5)
    distinct = torch.tensor([0, 2, 4])  # one row per prompt: nothing to share
    torch.testing.assert_close(completion_logits(policy, ids[distinct], mask[distinct], length),
                               _whole_rows(policy, ids[distinct], mask[distinct], length), rtol=0, atol=0)


def test_completion_logprobs_with_temperature_and_entropy(policy):
    ids, mask, response, length = _rows(policy.config.pad_token_id)
    logp, entropy = completion_logprobs(policy, ids, mask, length, temperature=0.7, with_entropy=True)
    reference = torch.log_softmax(_whole_rows(policy, ids, mask, length).float() / 0.7, -1)
    expected = reference.gather(2, ids[:, -length:, None]).squeeze(-1)
    scored = response.bool()
    torch.testing.assert_close(logp[scored], expected[scored], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy[scored], -(reference.exp() * reference).sum(-1)[scored], rtol=1e-4, atol=1e-5)
    assert not entropy.requires_grad and logp.requires_grad


def test_a_lora_policy_shares_prompts_too_and_checkpointing_runs_whole_rows(tiny_model):
    from peft import LoraConfig, get_peft_model

    from rlvr.modeling.loading import load_policy

    torch.manual_seed(0)
    lora = get_peft_model(load_policy(tiny_model), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # a trained-looking adapter (B starts at 0)
    ids, mask, response, length = _rows(lora.config.pad_token_id)
    scored = response.bool()
    torch.testing.assert_close(completion_logits(lora, ids, mask, length)[scored],
                               _whole_rows(lora, ids, mask, length)[scored], rtol=1e-5, atol=1e-5)
    lora.base_model.model.gradient_checkpointing_enable()
    lora.train()
    calls = []
    hook = lora.base_model.model.model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs["input_ids"].shape),
                                                                  with_kwargs=True)
    completion_logits(lora, ids, mask, length)
    hook.remove()
    assert calls == [ids.shape]  # one pass over whole rows: a checkpointed model keeps no cache


@pytest.mark.parametrize("forward", ["auto", "hf"])
def test_a_repeated_row_runs_once_and_its_gradient_counts_every_repeat(tiny_model, forward):
    """Two samples that drew the same completion have the same log-probs: the distinct rows run once and
    the results are indexed out, so the log-probs are the distinct rows' and the gradient is theirs with
    each row's weights summed over its repeats (float64)."""
    from rlvr.modeling.loading import load_policy

    torch.manual_seed(0)
    model = load_policy(tiny_model, forward=forward).double().train()
    ids, mask, response, length = _rows(model.config.pad_token_id)
    repeat = torch.tensor([0, 1, 0, 2, 3, 3, 0, 4, 5, 5])  # rows 0, 3 and 5 repeated, not next to each other
    weights = torch.linspace(-1.0, 2.0, steps=length * len(repeat), dtype=torch.float64).view(len(repeat), length)
    calls, embedded = [], []
    hook = model.model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(len(kwargs["input_ids"])),
                                                 with_kwargs=True)
    # every forward, rlvr's own (auto) or the model's (hf), embeds the tokens it runs: count them
    embed_hook = model.model.embed_tokens.register_forward_hook(lambda module, args, out: embedded.append(args[0].numel()))
    model.zero_grad()
    logp, entropy = completion_logprobs(model, ids[repeat], mask[repeat], length, with_entropy=True)
    (logp * weights * response[repeat]).sum().backward()
    hook.remove()
    together = [p.grad.clone() for p in model.parameters()]
    assert forward == "auto" or max(calls) == 6  # the model's own forward saw six rows, never ten
    repeated_tokens, embedded[:] = sum(embedded), []
    model.zero_grad()
    distinct, distinct_entropy = completion_logprobs(model, ids, mask, length, with_entropy=True)
    embed_hook.remove()
    assert repeated_tokens == sum(embedded) > 0  # the ten rows cost exactly what their six distinct rows cost
    summed = torch.zeros(len(ids), length, dtype=torch.float64).index_add_(0, repeat, weights)
    (distinct * summed * response).sum().backward()
    assert torch.equal(logp.detach(), distinct.detach()[repeat]) and torch.equal(entropy, distinct_entropy[repeat])
    for a, b in zip(together, (p.grad for p in model.parameters())):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_distinct_rows_keeps_first_rows_in_batch_order():
    from rlvr.modeling.logprobs import distinct_rows

    ids = torch.tensor([[5, 1], [3, 2], [5, 1], [1, 1], [3, 2]])
    mask = torch.ones_like(ids)
    keep, inverse = distinct_rows(ids, mask)
    assert keep.tolist() == [0, 1, 3] and inverse.tolist() == [0, 1, 0, 2, 1]
    mask[2, 0] = 0  # same ids, another mask: a different row
    keep, inverse = distinct_rows(ids, mask)
    assert keep.tolist() == [0, 1, 2, 3] and inverse.tolist() == [0, 1, 2, 3, 1]
    assert distinct_rows(ids[:2], mask[:2]) is None


def test_no_grad_logprobs_are_the_graph_pass_s_values_and_a_later_graph_can_use_them(policy):
    """The no-grad pass (reference, pi_old) runs in inference mode; what it returns is an ordinary
    tensor that a loss may save for its backward (``logp * ref`` saves ``ref``)."""
    from rlvr.rollout.batch import Batch
    from rlvr.modeling.logprobs import no_grad_logprobs

    ids, mask, response, length = _rows(policy.config.pad_token_id)
    zeros = torch.zeros_like(response)
    batch = Batch(input_ids=ids, attention_mask=mask, response_mask=response, engine_logp=zeros, advantages=zeros[:, 0])
    ref = no_grad_logprobs(policy, batch, micro_batch_size=4, temperature=1.0)  # two micro-batches
    assert not ref.is_inference() and not ref.requires_grad
    logp, _ = completion_logprobs(policy, ids, mask, length)
    torch.testing.assert_close(ref * response, logp.detach() * response, rtol=1e-5, atol=1e-6)
    (logp * ref * response).sum().backward()
    assert all(p.grad is not None for p in policy.parameters())
    policy.zero_grad()


def _architecture(name: str, tiny_model):
    from transformers import GPT2Config, GPT2LMHeadModel, GraniteConfig, GraniteForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from rlvr.modeling.loading import load_policy

    torch.manual_seed(0)
    if name in ("llama-auto", "llama-hf"):
        return load_policy(tiny_model, forward=name.split("-")[1])
    if name == "qwen3":  # query/key norms: the model's own forward, its decoder's states
        return Qwen3ForCausalLM(Qwen3Config(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, pad_token_id=0))
    if name == "granite":  # logits divided by a scale after the output layer: whole logits
        return GraniteForCausalLM(GraniteConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                                num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
                                                logits_scaling=4.0))
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=40, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0, bos_token_id=1, eos_token_id=2))  # its own forward, chunked


@pytest.mark.parametrize("name", ["llama-auto", "llama-hf", "qwen3", "gpt2", "granite"])
def test_logprobs_in_one_token_chunks_equal_the_whole_logits_values_and_gradients(name, tiny_model):
    """Log-probs and entropies (with an entropy gradient) from the decoder's states, one token's
    logits at a time, against log_softmax over the same pass's whole logits (float64); a token that
    is not scored gets 0. (The shared-prompt pass against whole rows: the tests above, to the
    float32 rounding of the model's rotary tables.)"""
    from rlvr.modeling.logprobs import chunk_tokens, output_head, set_logits_chunk

    model = _architecture(name, tiny_model).double().train()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    assert (output_head(model) is None) == (name == "granite")
    set_logits_chunk(model, 1e-6)
    assert chunk_tokens(model, model.config.vocab_size) == 1
    ids, mask, response, length = _rows(model.config.pad_token_id or 0)
    scored = response.bool()
    weights = torch.linspace(-1.0, 2.0, steps=length * len(ids), dtype=torch.float64).view(len(ids), length)

    def run(fn):
        model.zero_grad()
        logp, entropy = fn()
        ((logp * weights + 0.3 * entropy * weights.flip(0)) * response).sum().backward()
        return logp.detach(), entropy.detach(), [p.grad.clone() for p in model.parameters()]

    def whole():
        log_probs = torch.log_softmax(completion_logits(model, ids, mask, length), -1)
        return log_probs.gather(2, ids[:, -length:, None]).squeeze(-1), -(log_probs.exp() * log_probs).sum(-1)

    chunked = run(lambda: completion_logprobs(model, ids, mask, length, with_entropy=True, entropy_grad=True))
    expected = run(whole)
    for a, b in zip(chunked[:2], expected[:2]):
        torch.testing.assert_close(a[scored], b[scored], rtol=1e-10, atol=1e-10)
    if name != "granite":
        assert (chunked[0][~scored] == 0).all() and (chunked[1][~scored] == 0).all()
    for a, b in zip(chunked[2], expected[2]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_the_configs_default_chunk_budget_is_the_modules():
    from rlvr.config.sections import ModelConfig
    from rlvr.modeling.logprobs import DEFAULT_LOGITS_CHUNK_MB, set_logits_chunk

    assert ModelConfig().logits_chunk_mb == DEFAULT_LOGITS_CHUNK_MB
    with pytest.raises(ValueError, match="logits_chunk_mb must be >= 0"):
        set_logits_chunk(torch.nn.Linear(1, 1), -1)
