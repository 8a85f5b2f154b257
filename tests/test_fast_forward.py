"""rlvr's shared-prompt forward computes the model's own forward: logits, gradients and decoding.

Exactness is checked in float64, where two implementations of the same function agree to ~1e-12 and
any real difference (a wrong mask, position or head layout) shows as ~1e-3; float32 is checked to
its rounding. Each architecture family it supports is covered: Llama (the tiny model), and Qwen2
with grouped-query attention and q/k/v biases; and LoRA-wrapped models (logits, adapter gradients,
the reference pass with adapters disabled, the critic's adapter switch, decoding), with the LoRA
forms it refuses.
"""

from __future__ import annotations

import copy

import pytest
import torch

from rlvr.modeling import fast_forward
from rlvr.engines import HFEngine, SamplingParams
from rlvr.modeling.logprobs import completion_logits
from rlvr.modeling.loading import load_policy, load_tokenizer


def _qwen2_gqa(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64, use_sliding_window=False, pad_token_id=0)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def _mistral_head_dim(seed: int = 0):
    """Mistral with an explicit head_dim (12, where hidden / heads is 8), grouped-query attention and
    no sliding window; untied embeddings."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=64,
                           sliding_window=None, pad_token_id=0)
    torch.manual_seed(seed)
    return MistralForCausalLM(config)


def _llama_rope_scaling(seed: int = 0):
    """Llama 3's rope scaling (frequency-dependent), over a short original context so that it bites."""
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
    config = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=1, max_position_embeddings=64, rope_parameters=rope,
                         tie_word_embeddings=False, pad_token_id=0)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


ARCHITECTURES = {  # every architecture model.forward: auto runs, and the variants of their configs
    "llama-tied": None,  # the tiny model: tied embeddings
    "qwen2-gqa-bias": _qwen2_gqa,
    "mistral-head-dim": _mistral_head_dim,
    "llama3-rope-scaling": _llama_rope_scaling,
}


@pytest.fixture(params=["grouped", "kernel"])
def attention(request, monkeypatch):
    """The fast forward's two attention paths: grouped matmuls (short rows on the CPU) and torch's
    fused kernel (long rows, and always on an accelerator), forced here on the tests' short rows."""
    monkeypatch.setattr(fast_forward, "SDPA_MIN_SCORES", 10**9 if request.param == "grouped" else 0)
    return request.param


@pytest.fixture(params=list(ARCHITECTURES))
def model(request, tiny_model, attention):
    torch.manual_seed(0)
    build = ARCHITECTURES[request.param]
    m = load_policy(tiny_model) if build is None else build()
    assert fast_forward.supports(m)
    with torch.no_grad():  # sharper logits than a random init's: differences cannot hide in a flat softmax
        for p in m.parameters():
            p.mul_(2.0)
    return m.double().train()


def _own_forward(model):
    twin = copy.deepcopy(model)
    fast_forward.use_model_forward(twin)
    return twin


def _batch(vocab: int, prompts: int = 3, group: int = 4, width: int = 6, length: int = 5):
    """Left-padded prompts of different lengths (one of them full width), each repeated ``group``
    times, with right-padded completions of different lengths (one empty)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (prompts * group, width + length), generator=generator)
    mask = torch.ones_like(ids)
    for p in range(prompts):
        pad = [2, 0, 4][p % 3]
        rows = slice(p * group, (p + 1) * group)
        ids[rows, :width] = ids[p * group, :width]
        ids[rows, :pad] = 0
        mask[rows, :pad] = 0
    for row, done in enumerate([5, 3, 0, 1] * prompts):
        mask[row, width + done :] = 0
    return ids, mask, length


def test_supported_models_are_recognised_and_others_fall_back(tiny_model):
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    policy = load_policy(tiny_model)
    assert fast_forward.supports(policy) and fast_forward.supports(_qwen2_gqa())
    assert not fast_forward.supports(load_policy(tiny_model, forward="hf"))  # model.forward: hf
    assert not fast_forward.supports(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=30)))
    assert fast_forward.supports(get_peft_model(load_policy(tiny_model), LoraConfig(r=2, target_modules=["q_proj"])))
    checkpointed = load_policy(tiny_model, gradient_checkpointing=True).train()
    assert not fast_forward.supports(checkpointed) and fast_forward.supports(checkpointed.eval())
    with pytest.raises(ValueError, match="model.forward"):
        load_policy(tiny_model, forward="fast")


def assert_same_logits_and_gradients(model, ids, mask, length):
    """rlvr's forward and the model's own give the same scored logits and the same gradients of a
    weighted sum of the log-probs (float64); returns rlvr's logits."""
    scored = mask[:, -length:].bool()
    weights = torch.linspace(-1.0, 2.0, len(ids) * length, dtype=torch.float64).view(len(ids), length)
    results = []
    for m in (model, _own_forward(model)):
        m.zero_grad()
        logits = completion_logits(m, ids, mask, length)
        logp = torch.log_softmax(logits, -1).gather(2, ids[:, -length:, None]).squeeze(-1)
        (logp * weights * scored).sum().backward()
        assert all(p.grad is None for p in m.parameters() if not p.requires_grad)  # a LoRA base stays frozen
        results.append((logits.detach(), [p.grad.clone() for p in m.parameters() if p.requires_grad]))
    (fast, fast_grads), (own, own_grads) = results
    assert fast.shape == own.shape and len(fast_grads) == len(own_grads) > 0
    torch.testing.assert_close(fast[scored], own[scored], rtol=1e-10, atol=1e-10)
    for a, b in zip(fast_grads, own_grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    return fast


def test_shared_prompt_logits_and_gradients_equal_the_models_own_forward(model):
    fast = assert_same_logits_and_gradients(model, *_batch(model.config.vocab_size))
    assert torch.isfinite(fast).all()  # padded query rows attend uniformly, never to nothing (NaN)


def test_decoding_a_token_at_a_time_equals_one_pass_over_the_rows(model):
    ids, mask, length = _batch(model.config.vocab_size)
    width, group = ids.shape[1] - length, 4
    prompts, prompt_mask = ids[::group, :width], mask[::group, :width]
    with torch.no_grad():
        first, cache = fast_forward.encode_prompts(model, prompts, prompt_mask, group)
        whole = fast_forward.forward_rows(model, ids[:, width:], cache)
        rows = fast_forward.RowCache.empty(cache, capacity=length)
        steps = [fast_forward.forward_rows(model, ids[:, width + t : width + t + 1], cache, rows) for t in range(length)]
    assert rows.length == length
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, rtol=1e-10, atol=1e-10)
    own = _own_forward(model)
    with torch.no_grad():
        reference = completion_logits(own, ids, mask, length)
    torch.testing.assert_close(first.repeat_interleave(group, 0), reference[:, 0], rtol=1e-10, atol=1e-10)


def test_rows_not_in_equal_runs_of_a_prompt_are_refused_by_the_rows_pass(model):
    ids, mask, length = _batch(model.config.vocab_size)
    width = ids.shape[1] - length
    _, cache = fast_forward.encode_prompts(model, ids[::4, :width], mask[::4, :width], group=4)
    with pytest.raises(ValueError, match="11 rows for 3 prompts x 4"):
        fast_forward.forward_rows(model, ids[:11, width:], cache)


def test_rows_in_any_order_share_prompts_exactly(model):
    ids, mask, length = _batch(model.config.vocab_size)
    order = torch.tensor([4, 5, 6, 7, 0, 1, 2, 3, 8, 9, 10, 11])  # groups in another order: still runs of 4
    scattered = torch.tensor([0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11])  # interleaved: the model's own path
    own = _own_forward(model)
    with torch.no_grad():
        for rows in (order, scattered):
            scored = mask[rows, -length:].bool()
            torch.testing.assert_close(completion_logits(model, ids[rows], mask[rows], length)[scored],
                                       completion_logits(own, ids[rows], mask[rows], length)[scored], rtol=1e-10, atol=1e-10)


def test_prompts_with_different_numbers_of_rows_share_exactly(model):
    """Rows left out of some groups (zero-advantage or repeated samples): the fast forward pads each
    group with empty rows and returns the rows asked for; logits and gradients are the model's own."""
    ids, mask, length = _batch(model.config.vocab_size)
    rows = torch.tensor([9, 0, 1, 2, 4, 8, 10, 11])  # groups of 3, 1 and 4 rows, one row out of place
    assert_same_logits_and_gradients(model, ids[rows], mask[rows], length)


def test_the_engine_decodes_what_the_models_own_forward_decodes(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    fast, own = (HFEngine(load_policy(tiny_model, forward=f).double(), tokenizer) for f in ("auto", "hf"))
    prompts = [tokenizer.encode("12+3="), tokenizer.encode("7+45=")]
    for sampling in (SamplingParams(max_new_tokens=6, greedy=True), SamplingParams(max_new_tokens=6, temperature=0.8)):
        torch.manual_seed(3)
        a = fast.generate(prompts, n=3, sampling=sampling)
        torch.manual_seed(3)
        b = own.generate(prompts, n=3, sampling=sampling)
        for group_a, group_b in zip(a, b):
            for x, y in zip(group_a, group_b):
                assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
                assert x.logprobs == pytest.approx(y.logprobs, abs=1e-9)


def test_float32_agrees_to_rounding(tiny_model):
    model = load_policy(tiny_model)
    ids, mask, length = _batch(model.config.vocab_size)
    scored = mask[:, -length:].bool()
    with torch.no_grad():
        torch.testing.assert_close(completion_logits(model, ids, mask, length)[scored],
                                   completion_logits(_own_forward(model), ids, mask, length)[scored], rtol=1e-5, atol=1e-5)


def test_short_key_rows_are_padded_for_the_cpu_softmax_without_changing_it():
    scores = torch.randn(2, 3, 7, dtype=torch.float64)
    torch.testing.assert_close(fast_forward._softmax(scores), torch.softmax(scores, -1), rtol=1e-12, atol=1e-12)
    long = torch.randn(2, 20)
    torch.testing.assert_close(fast_forward._softmax(long), torch.softmax(long, -1))


def test_tokens_not_needed_are_not_computed_and_the_rest_are_unchanged(model):
    ids, mask, length = _batch(model.config.vocab_size)
    width, group = ids.shape[1] - length, 4
    with torch.no_grad():
        _, cache = fast_forward.encode_prompts(model, ids[::group, :width], mask[::group, :width], group)
        whole = fast_forward.forward_rows(model, ids[:, width:], cache)
        needed = mask[:, width:].bool()  # a prefix of each row, one row empty
        packed = fast_forward.forward_rows(model, ids[:, width:], cache, needed=needed)
        nothing = fast_forward.forward_rows(model, ids[:, width:], cache, needed=torch.zeros_like(needed))
    torch.testing.assert_close(packed[needed], whole[needed], rtol=1e-10, atol=1e-10)
    assert (packed[~needed] == 0).all() and (nothing == 0).all()


def test_prompts_and_rows_in_one_pass_equal_the_two_passes(model):
    ids, mask, length = _batch(model.config.vocab_size)
    width, group = ids.shape[1] - length, 4
    prompts, prompt_mask, needed = ids[::group, :width], mask[::group, :width], mask[:, width:].bool()
    with torch.no_grad():
        first, cache = fast_forward.encode_prompts(model, prompts, prompt_mask, group)
        for rows_needed in (None, needed):
            last, joint = fast_forward.forward_prompts_and_rows(model, prompts, prompt_mask, ids[:, width:], rows_needed)
            torch.testing.assert_close(last, first, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(joint, fast_forward.forward_rows(model, ids[:, width:], cache, needed=rows_needed),
                                       rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="11 rows for 3 prompts"):
        fast_forward.forward_prompts_and_rows(model, prompts, prompt_mask, ids[:11, width:])


def test_decoding_skips_finished_rows_and_keeps_the_others_exact(model):
    """A decoding step computes only the rows still running (``needed``); theirs are the logits of the
    full step, the finished rows' are 0."""
    ids, mask, length = _batch(model.config.vocab_size)
    width, group = ids.shape[1] - length, 4
    running = mask[:, width:].bool()  # a prefix of each row, one row empty from the start
    with torch.no_grad():
        _, cache = fast_forward.encode_prompts(model, ids[::group, :width], mask[::group, :width], group)
        full, skipping = fast_forward.RowCache.empty(cache, capacity=length), fast_forward.RowCache.empty(cache, capacity=length)
        for t in range(length):
            token = ids[:, width + t : width + t + 1]
            every = fast_forward.forward_rows(model, token, cache, full)
            some = fast_forward.forward_rows(model, token, cache, skipping, needed=running[:, t : t + 1])
            alive = running[:, t]
            torch.testing.assert_close(some[alive], every[alive], rtol=1e-10, atol=1e-10)
            assert (some[~alive] == 0).all()


def test_the_kernel_paths_masks_are_built_once_per_pass_and_shared_by_every_layer(monkeypatch):
    """On the fused-kernel path (every pass on a GPU) each layer's attention reads the same masks: the
    rows' ``[D, 1, L, W + L]`` built by the first layer, sliced per prompt, its rows padded to 16 keys
    (the kernels read such a mask in place). A mask per layer per prompt, each saved for the backward,
    was an estimated 15 GB over 28 layers at 16k tokens."""
    monkeypatch.setattr(fast_forward, "SDPA_MIN_SCORES", 0)
    model = _qwen2_gqa()  # 2 layers, grouped-query attention
    ids, mask, length = _batch(model.config.vocab_size)
    width, group = ids.shape[1] - length, 4
    calls, kernel = [], fast_forward._kernel

    def spy(w, q, k, v, bias):
        calls.append((q.shape, k.shape, bias))
        return kernel(w, q, k, v, bias)

    monkeypatch.setattr(fast_forward, "_kernel", spy)
    last, rows = fast_forward.forward_prompts_and_rows(model, ids[::group, :width], mask[::group, :width], ids[:, width:],
                                                       states=True)
    (last.sum() + rows.sum()).backward()  # the graph holds every mask it used: one storage each
    prompt_calls = [c for c in calls if c[0][0] == 3]  # D = 3 prompts in one call per layer
    row_calls = [c for c in calls if c[0][0] == group]  # one call per prompt per layer
    assert len(prompt_calls) == 2 and len(row_calls) == 2 * 3
    for shapes in (prompt_calls, row_calls):
        storages = {bias.untyped_storage().data_ptr() for _, _, bias in shapes}
        assert len(storages) == 1  # one mask for the pass, whatever the layer or prompt
        assert all(bias.stride(-2) % 16 == 0 and bias.stride(-1) == 1 for _, _, bias in shapes)
    heads = model.config.num_attention_heads
    assert all(k == (group, heads, width + length, 8) for _, k, _ in row_calls)  # prompt | own keys, per query head


# ---------------------------------------------------------------------------------------------
# LoRA: peft's own modules compute the adapters inside rlvr's forward
# ---------------------------------------------------------------------------------------------

def _with_lora(base):
    """``base`` (sharpened as the plain tests' models) under LoRA adapters on every projection (r 4,
    as a run's ``model.lora``), their B random instead of peft's zeros so that the adapters change the
    logits; float64, training."""
    from peft import LoraConfig, get_peft_model

    with torch.no_grad():
        for p in base.parameters():
            p.mul_(2.0)
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    _randomise_adapter(lora, "default", seed=0)
    return lora.double().train()


def _randomise_adapter(lora, adapter: str, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if f"lora_B.{adapter}." in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=generator))


@pytest.fixture(params=["llama-tied", "qwen2-gqa-bias"])
def lora_model(request, tiny_model, attention):
    build = ARCHITECTURES[request.param]
    return _with_lora(load_policy(tiny_model) if build is None else build())


def test_lora_logits_and_adapter_gradients_equal_the_models_own_forward(lora_model):
    """A LoRA policy's training pass (shared prompts, and groups of different sizes) runs rlvr's
    forward: the model's own logits, and gradients on the adapter weights only, equal to its own."""
    assert fast_forward.supports(lora_model)
    ids, mask, length = _batch(lora_model.config.vocab_size)
    fast = assert_same_logits_and_gradients(lora_model, ids, mask, length)
    with torch.no_grad(), lora_model.disable_adapter():
        without = completion_logits(lora_model, ids, mask, length)
    scored = mask[:, -length:].bool()
    assert (fast[scored] - without[scored]).abs().max() > 1e-2  # the adapters matter to what was compared
    rows = torch.tensor([9, 0, 1, 2, 4, 8, 10, 11])  # groups of 3, 1 and 4 rows
    assert_same_logits_and_gradients(lora_model, ids[rows], mask[rows], length)


def test_a_lora_policys_reference_pass_and_merged_adapters_equal_the_models_own_forward(tiny_model):
    """The reference of a LoRA run is the policy with its adapters disabled (``Reference.model``):
    rlvr's forward then computes what the model's own does, the base model alone; with the adapters
    merged into the base weights, it computes the adapted model."""
    lora = _with_lora(load_policy(tiny_model))
    own = _own_forward(lora)
    ids, mask, length = _batch(lora.config.vocab_size)
    scored = mask[:, -length:].bool()
    with torch.no_grad():
        adapted = completion_logits(own, ids, mask, length)[scored]
        with lora.disable_adapter(), own.disable_adapter():
            assert fast_forward.supports(lora)
            disabled = completion_logits(lora, ids, mask, length)[scored]
            torch.testing.assert_close(disabled, completion_logits(own, ids, mask, length)[scored], rtol=1e-10, atol=1e-10)
        assert (disabled - adapted).abs().max() > 1e-2
        lora.merge_adapter()
        assert fast_forward.supports(lora)
        torch.testing.assert_close(completion_logits(lora, ids, mask, length)[scored], adapted, rtol=1e-10, atol=1e-10)


def test_the_critics_adapter_switch_leaves_each_adapter_exact(tiny_model):
    """A LoRA PPO critic is a ``value`` adapter on the policy's base, switched in for its own pass
    (the model's own forward on the decoder) and back: the policy's passes on rlvr's forward then
    compute the policy's adapter, and with ``value`` active they compute ``value``'s."""
    from rlvr.modeling.value_model import build_critic

    policy = _with_lora(load_policy(tiny_model))
    critic = build_critic(policy, path=None, lora=dict(r=4, alpha=8, dropout=0.0, target_modules="all-linear"))
    _randomise_adapter(policy, "value", seed=1)
    policy.double()  # the value adapter too (the head stays float32, as the critic runs it)
    ids, mask, length = _batch(policy.config.vocab_size)
    scored = mask[:, -length:].bool()
    critic(ids, mask, length)  # switches to the value adapter and back
    assert policy.active_adapter == "default" and fast_forward.supports(policy)
    with torch.no_grad():
        own = _own_forward(policy)
        default = completion_logits(policy, ids, mask, length)[scored]
        torch.testing.assert_close(default, completion_logits(own, ids, mask, length)[scored], rtol=1e-10, atol=1e-10)
        policy.set_adapter("value")
        own.set_adapter("value")
        value = completion_logits(policy, ids, mask, length)[scored]
        torch.testing.assert_close(value, completion_logits(own, ids, mask, length)[scored], rtol=1e-10, atol=1e-10)
    assert (value - default).abs().max() > 1e-2  # two different adapters were compared


def test_the_engine_decodes_a_lora_policy_as_its_own_forward(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    lora = _with_lora(load_policy(tiny_model))
    assert fast_forward.supports(lora)
    fast, own = HFEngine(lora, tokenizer), HFEngine(_own_forward(lora), tokenizer)
    prompts = [tokenizer.encode("12+3="), tokenizer.encode("7+45=")]
    for sampling in (SamplingParams(max_new_tokens=6, greedy=True), SamplingParams(max_new_tokens=6, temperature=0.8)):
        torch.manual_seed(3)
        a = fast.generate(prompts, n=3, sampling=sampling)
        torch.manual_seed(3)
        b = own.generate(prompts, n=3, sampling=sampling)
        for group_a, group_b in zip(a, b):
            for x, y in zip(group_a, group_b):
                assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
                assert x.logprobs == pytest.approx(y.logprobs, abs=1e-9)


def test_decoding_steps_read_the_adapters_without_calling_peft(tiny_model, monkeypatch):
    """A decoding step computes each LoRA projection as one addmm over the base layer's output (peft's
    forward is 7 operators and a module call a projection: LoRA decoded at half full fine-tuning's
    speed on a GPU); only the prompts' pass calls peft's modules, so more tokens add no calls."""
    from peft.tuners.lora import Linear as LoraLinear

    tokenizer = load_tokenizer(tiny_model)
    lora = _with_lora(load_policy(tiny_model)).eval()
    calls = []
    forward = LoraLinear.forward
    monkeypatch.setattr(LoraLinear, "forward", lambda self, *a, **k: calls.append(1) or forward(self, *a, **k))
    engine, prompts = HFEngine(lora, tokenizer), [tokenizer.encode("12+3="), tokenizer.encode("7+45=")]
    counts = []
    for tokens in (2, 6):
        calls.clear()
        out = engine.generate(prompts, n=2, sampling=SamplingParams(max_new_tokens=tokens, temperature=1.0, top_k=3))
        assert max(len(c.token_ids) for group in out for c in group) > 1
        counts.append(len(calls))
    assert counts[0] == counts[1]  # the prefill's calls only (one per projection at most)
    with lora.disable_adapter():  # adapters off while decoding: the base layers alone, as peft has them
        engine.generate(prompts, n=1, sampling=SamplingParams(max_new_tokens=3, greedy=True))


@pytest.mark.filterwarnings("ignore:`lora_bias=True` was passed", "ignore:Model has `tie_word_embeddings=True`")
def test_lora_forms_it_cannot_run_exactly_are_refused_with_the_reason(tiny_model):
    """Each LoRA form outside plain single-adapter LoRA on the projections falls back to the model's
    own forward, saying why."""
    from peft import LoraConfig, PromptTuningConfig, get_peft_model

    def reason(**config):
        return fast_forward.unsupported_reason(get_peft_model(load_policy(tiny_model), LoraConfig(**config)).train())

    assert "DoraLinearVariant variant" in reason(r=2, target_modules=["q_proj"], use_dora=True)
    assert "has a bias" in reason(r=2, target_modules=["q_proj"], lora_bias=True)
    dropout = get_peft_model(load_policy(tiny_model), LoraConfig(r=2, lora_dropout=0.1, target_modules=["q_proj"]))
    assert "LoRA dropout 0.1 while training" in fast_forward.unsupported_reason(dropout.train())
    assert fast_forward.supports(dropout.eval())  # decoding: dropout is off
    assert "ModulesToSaveWrapper, not a plain or LoRA Linear" in reason(r=2, target_modules=["k_proj"], modules_to_save=["q_proj"])
    assert "a peft Embedding at model.embed_tokens" in reason(r=2, target_modules=["q_proj", "embed_tokens"])
    assert "output layer is not a plain Linear" in reason(r=2, target_modules=["q_proj", "lm_head"])
    two = get_peft_model(load_policy(tiny_model), LoraConfig(r=2, target_modules=["q_proj"]))
    two.add_adapter("other", LoraConfig(r=2, target_modules=["q_proj"]))
    two.base_model.set_adapter(["default", "other"])
    assert "2 active LoRA adapters (default, other)" in fast_forward.unsupported_reason(two)
    prompt = get_peft_model(load_policy(tiny_model), PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2))
    assert "runs LoRA adapters only" in fast_forward.unsupported_reason(prompt)
