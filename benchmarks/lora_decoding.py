"""LoRA decoding in the HF engine: operators per decoded token and decoding time, peft's module call per
projection (what decoding did before) against rlvr's decoding path (one ``addmm`` a projection over the
base layer's output, adapters cast and scaled once per generation: ``fast_forward._linear``).

    python benchmarks/lora_decoding.py [--layers 30] [--rows 16] [--new-tokens 32] [--rounds 3] [--threads 1]

A random-init model of SmolLM2-135M's layer shape (576 hidden, 9 heads, 3 key/value heads, 1,536 MLP; 30
layers unless told), its base in bf16 and LoRA r 16 on every projection in float32, as a run with
``model.dtype: bfloat16`` and ``model.lora`` holds them. A GPU decodes a model this small at the rate it
can launch operators, so the count of operators per token is the figure that carries over from this
machine; the time is the CPU's. Both arms decode the same prompts with the same seed, alternating rounds
in one process; the share of tokens both arms sample alike is printed (the sums differ by rounding,
which in bf16 turns a near-tie the other way now and then, and a row then goes its own way).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))


def build(layers: int, tokenizer, dtype: str):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
        num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    lora = get_peft_model(base.to(getattr(torch, dtype)), LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                               target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():  # B is zero at init: give the adapters something to add
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    return lora.eval()


def peft_linear(proj, x, adapters=None):
    """The projection as decoding computed it before: a LoRA one by peft's own module call."""
    import torch
    import torch.nn.functional as F

    if type(proj) is torch.nn.Linear:
        return F.linear(x, proj.weight, proj.bias)
    return proj(x)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=30, help="decoder layers (SmolLM2-135M has 30)")
    parser.add_argument("--rows", type=int, default=16, help="rows decoded together (4 prompts x rows/4 samples)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens decoded a row")
    parser.add_argument("--rounds", type=int, default=3, help="alternating timed rounds per arm")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 on a shared machine)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                        help="the base layers' dtype (a GPU run's bfloat16, or the CPU's float32); adapters float32")
    args = parser.parse_args()

    import tempfile

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from rlvr.engines import SamplingParams
    from rlvr.engines.hf import HFEngine
    from rlvr.modeling import fast_forward
    from rlvr.modeling.loading import load_tokenizer
    from rlvr.modeling.tiny import build_tiny_model
    from rlvr.run.runtime import quiet_transformers

    quiet_transformers()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = load_tokenizer(build_tiny_model(Path(tmp) / "tokenizer", seed=0))
    model = build(args.layers, tokenizer, args.dtype)
    assert fast_forward.supports(model), fast_forward.unsupported_reason(model)
    engine = HFEngine(model, tokenizer)
    samples = max(1, args.rows // 4)
    prompts = [tokenizer.encode(text) for text in ("12+3=", "7+45=", "101+9=", "6+66=")]
    lean = fast_forward._linear
    arms = {"peft module (before)": peft_linear, "addmm (rlvr)": lean}

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    def decode(arm: str, tokens: int, count: bool = False):
        fast_forward._linear = arms[arm]
        try:
            torch.manual_seed(0)
            counter = Count()
            with counter if count else torch.no_grad():
                out = engine.generate(prompts, samples, SamplingParams(
                    max_new_tokens=tokens, temperature=1.0, top_k=8))
            return out, counter.ops
        finally:
            fast_forward._linear = lean

    ops, outputs = {}, {}
    for arm in arms:  # operators per decoded token: two lengths, the difference over the extra tokens
        _, short = decode(arm, 4, count=True)
        _, long = decode(arm, 12, count=True)
        ops[arm] = (long - short) / 8
        outputs[arm] = [c.token_ids for group in decode(arm, args.new_tokens)[0] for c in group]
    with model.disable_adapter():  # the base layers alone: what full fine-tuning's decoding costs
        _, short = decode("addmm (rlvr)", 4, count=True)
        _, long = decode("addmm (rlvr)", 12, count=True)
    base_ops = (long - short) / 8
    pairs = [(a, b) for x, y in zip(outputs["peft module (before)"], outputs["addmm (rlvr)"]) for a, b in zip(x, y)]
    agree = sum(a == b for a, b in pairs) / len(pairs)
    times = {arm: [] for arm in arms}
    for _ in range(args.rounds):
        for arm in arms:
            start = time.perf_counter()
            decode(arm, args.new_tokens)
            times[arm].append(time.perf_counter() - start)
    print(f"SmolLM2-135M shape, {args.layers} layers, {args.dtype} base + float32 LoRA r 16 on every projection; "
          f"{len(prompts)} prompts x {samples} rows, {args.new_tokens} new tokens, {args.threads} thread(s), "
          f"median of {args.rounds} alternating rounds")
    print(f"{'decoding path':24s} {'operators/token':>16s} {'decode s':>9s}")
    for arm in arms:
        print(f"{arm:24s} {ops[arm]:16,.0f} {statistics.median(times[arm]):9.3f}")
    print(f"{'base layers alone':24s} {base_ops:16,.0f}")
    before, after = "peft module (before)", "addmm (rlvr)"
    print(f"operators {ops[after] / ops[before]:.2f}x, time {statistics.median(times[after]) / statistics.median(times[before]):.2f}x; "
          f"tokens sampled alike: {agree:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
