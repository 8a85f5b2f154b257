"""Which models' log-probs stop at the decoder's states (chunked) and which compute whole logits, decided
by the output layer's module and a load-time measurement, not by a list of architecture names.

Each chunked architecture's log-probs, entropies and gradients equal ``log_softmax`` of the model's
own whole logits (its own forward over whole rows) to float32 rounding, and the whole ``[B, T, V]``
logits are never built; a model that post-processes its logits (Gemma 2's final soft-cap) or wraps
its head (LoRA on the output layer) keeps the whole logits, exactly.
"""

from __future__ import annotations

import pytest
import torch

from rlvr.modeling import logprobs
from rlvr.modeling.logprobs import completion_logprobs, output_head, position_ids, probe_output_head, set_logits_chunk

SMALL = dict(vocab_size=48, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)


def _qwen2_moe():
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    return Qwen2MoeForCausalLM(Qwen2MoeConfig(**SMALL, moe_intermediate_size=24, shared_expert_intermediate_size=24,
                                              num_experts=4, num_experts_per_tok=2, use_sliding_window=False))


def _mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM

    return MixtralForCausalLM(MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2, sliding_window=None))


def _phi3():
    from transformers import Phi3Config, Phi3ForCausalLM

    return Phi3ForCausalLM(Phi3Config(**SMALL))


def _gemma():  # tied embeddings, embeddings scaled by sqrt(hidden), GELU MLP
    from transformers import GemmaConfig, GemmaForCausalLM

    return GemmaForCausalLM(GemmaConfig(**SMALL, head_dim=8))


def _gemma2_softcap():  # logits = 30 tanh(head(h) / 30): not the output layer's
    from transformers import Gemma2Config, Gemma2ForCausalLM

    return Gemma2ForCausalLM(Gemma2Config(**SMALL, head_dim=8, final_logit_softcapping=30.0))


CHUNKED = {"qwen2-moe": _qwen2_moe, "mixtral": _mixtral, "phi3": _phi3, "gemma": _gemma}


def _build(make, seed: int = 0):
    """A random-init model in float32, its weights sharpened (a flat softmax hides differences)."""
    torch.manual_seed(seed)
    model = make().float().train()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    return model


def _rows(vocab: int):
    """Six rows over three prompts (left-padded to 4 tokens, two rows each: shared in one pass) with
    completions of lengths 3, 1, 2, 3, 0 and 2 (right-padded to 3)."""
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, vocab, (n,), generator=generator).tolist() for n in (4, 2, 3)]
    lengths = [3, 1, 2, 3, 0, 2]
    width, length = 4, 3
    ids = torch.zeros(len(lengths), width + length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, done in enumerate(lengths):
        prompt = prompts[row // 2]
        ids[row, width - len(prompt) : width] = torch.tensor(prompt)
        ids[row, width : width + done] = torch.randint(1, vocab, (done,), generator=generator)
        mask[row, width - len(prompt) : width + done] = 1
    return ids, mask, length


def _reference(model, ids, mask, length):
    """``(logp, entropy)`` [B, T] from log_softmax of the model's own logits over whole rows."""
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=False).logits
    log_probs = torch.log_softmax(logits[:, -length - 1 : -1].float(), -1)
    return log_probs.gather(2, ids[:, -length:, None]).squeeze(-1), -(log_probs.exp() * log_probs).sum(-1)


def _values_and_gradients(model, fn, ids, mask, length):
    """Log-probs, entropies and every parameter's gradient of a weighted sum of both (scored tokens)."""
    scored = mask[:, -length:].float()
    weights = torch.linspace(-1.0, 2.0, steps=ids.numel() // ids.shape[1] * length).view(len(ids), length)
    model.zero_grad()
    logp, entropy = fn()
    ((logp * weights + 0.3 * entropy * weights.flip(0)) * scored).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), entropy.detach(), grads


def _assert_equal_to_reference(model, ids, mask, length, atol=2e-5):
    scored = mask[:, -length:].bool()
    ours = _values_and_gradients(
        model, lambda: completion_logprobs(model, ids, mask, length, with_entropy=True, entropy_grad=True), ids, mask, length)
    reference = _values_and_gradients(model, lambda: _reference(model, ids, mask, length), ids, mask, length)
    for a, b in zip(ours[:2], reference[:2]):
        torch.testing.assert_close(a[scored], b[scored], rtol=1e-5, atol=atol)
    assert ours[2].keys() == reference[2].keys() and ours[2]
    for name in ours[2]:
        torch.testing.assert_close(ours[2][name], reference[2][name], rtol=1e-4, atol=atol, msg=name)
    return ours


@pytest.fixture
def no_whole_logits(monkeypatch):
    """Log-prob passes that would build the whole [B, T, V] logits fail instead."""
    def refuse(*args, **kwargs):
        raise AssertionError("the whole [B, T, V] logits were built")

    monkeypatch.setattr(logprobs, "logits_logprobs", refuse)


@pytest.mark.parametrize("name", list(CHUNKED))
@pytest.mark.parametrize("chunk_mb", [1e-6, 256], ids=["one-token-chunks", "one-chunk"])
def test_models_whose_logits_are_their_output_layer_take_the_chunked_path_exactly(name, chunk_mb, no_whole_logits):
    model = _build(CHUNKED[name])
    set_logits_chunk(model, chunk_mb)
    assert output_head(model) is model.get_output_embeddings()
    ids, mask, length = _rows(model.config.vocab_size)
    logp, entropy, _ = _assert_equal_to_reference(model, ids, mask, length)
    unscored = ~mask[:, -length:].bool()
    assert (logp[unscored] == 0).all() and (entropy[unscored] == 0).all()  # never reached the output layer
    assert model.training  # the probe ran in eval mode and gave the mode back


@pytest.mark.parametrize("name", list(CHUNKED))
def test_a_pass_without_a_graph_is_chunked_too(name, no_whole_logits):
    """Every row its own prompt: whole rows through the model's own forward, stopped at the states."""
    model = _build(CHUNKED[name]).eval()
    set_logits_chunk(model, 1e-6)
    ids, mask, length = _rows(model.config.vocab_size)
    ids, mask = ids[::2], mask[::2]
    with torch.inference_mode():
        logp, _ = completion_logprobs(model, ids, mask, length)
        expected, _ = _reference(model, ids, mask, length)
    scored = mask[:, -length:].bool()
    torch.testing.assert_close(logp[scored], expected[scored], rtol=1e-5, atol=1e-5)


def test_post_processed_logits_keep_the_whole_logits_path_and_stay_exact():
    """Gemma 2's soft-cap moves a random-init model's flat logits by ~1e-3 of their size, about
    bfloat16's rounding: the probe plants logits large enough to show it, in any dtype."""
    for dtype in (torch.float32, torch.bfloat16):
        assert not probe_output_head(_gemma2_softcap().to(dtype))
    model = _build(_gemma2_softcap)
    set_logits_chunk(model, 1e-6)
    assert output_head(model) is None
    ids, mask, length = _rows(model.config.vocab_size)
    _assert_equal_to_reference(model, ids, mask, length, atol=1e-6)


def test_other_post_processing_keeps_the_whole_logits_path_too():
    """Scales after the output layer (Cohere's logit_scale, Granite's logits_scaling) commute with a
    bias-free matmul, yet are not the output layer: whole logits, as for any change after it."""
    from transformers import CohereConfig, CohereForCausalLM, GraniteConfig, GraniteForCausalLM

    assert output_head(CohereForCausalLM(CohereConfig(**SMALL, logit_scale=0.0625))) is None
    assert output_head(GraniteForCausalLM(GraniteConfig(**SMALL, logits_scaling=4.0))) is None


def test_the_verdict_is_measured_at_load_and_recorded_on_the_model(tiny_model, monkeypatch):
    from rlvr.modeling.loading import load_policy

    policy = load_policy(tiny_model)
    assert getattr(policy, logprobs._HEAD) is True  # measured at load, before any pass
    monkeypatch.setattr(logprobs, "_head_parity", lambda *args: pytest.fail("probed again"))
    assert output_head(policy) is policy.lm_head
    setattr(policy, logprobs._HEAD, False)  # a model that failed the probe: whole logits
    assert output_head(policy) is None


def test_the_probe_leaves_the_model_as_it_found_it():
    model = _build(_mixtral)
    head, before = model.get_output_embeddings(), {k: v.clone() for k, v in model.state_dict().items()}
    assert probe_output_head(model)
    assert model.get_output_embeddings() is head and not head._forward_hooks and model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_model_that_cannot_run_the_probe_keeps_the_whole_logits(monkeypatch):
    model = _build(_phi3)

    def broken(*args, **kwargs):
        raise RuntimeError("no position_ids here")

    monkeypatch.setattr(logprobs, "_model_pass", broken)
    assert not probe_output_head(model) and output_head(model) is None


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ["q_proj", "lm_head"]], ids=["attention", "output-layer"])
def test_lora_models_keep_working(targets):
    """LoRA on the attention: the head is still the plain output layer (chunked, a frozen head); LoRA
    on the output layer itself: whole logits. Both equal the wrapped model's own logits."""
    from peft import LoraConfig, get_peft_model

    model = _build(_mixtral)
    assert probe_output_head(model)  # at load, before the wrap
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False))
    set_logits_chunk(lora, 1e-6)
    assert (output_head(lora) is None) == ("lm_head" in targets)
    ids, mask, length = _rows(model.config.vocab_size)
    _, _, grads = _assert_equal_to_reference(lora, ids, mask, length)
    assert grads and all("lora_" in name for name in grads)
