"""rlvr's shared-prompt forward (``model.forward: auto``) against the model's own (``hf``).

    python benchmarks/fast_forward.py [--model tiny-trl|smollm2-shape|PATH ...] [--rounds 5] [--threads 2]

For each model, the three passes a GRPO step makes, each on the same tensors with both forwards,
alternating round after round (medians compared: these machines are shared and noisy):

* ``generate``  the HF engine's sampling of P prompts x G samples, every row decoding to the limit
  (no end-of-sequence token, so both forwards decode the same number of steps);
* ``no-grad``   completion log-probs without a graph (the reference pass at beta > 0);
* ``fwd+bwd``   completion log-probs and their backward (the policy update's pass).

Models: ``tiny-trl`` is the 4-layer tiny Llama of ``vs_trl.py`` (1.06M parameters, 8 x 8 rows,
9-token prompts, 6 completion tokens); ``smollm2-shape`` is a randomly initialised Llama of
SmolLM2-135M's shape (30 layers, hidden 576, 9 heads over 3 key/value heads, vocabulary 49,152: no
weights needed to time it), 4 prompts x 8 samples of a 64-token prompt and 16 completion tokens;
a local Hugging Face folder runs at the smollm2 batch shape. Both forwards compute the same function
(``tests/test_fast_forward.py``); the line ``max |logp diff|`` shows the float32 rounding between them.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent  # holds verifiers.py / sandbox.py: keep them from shadowing packages
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

SHAPES = {  # prompts, samples, prompt tokens, completion tokens
    "tiny-trl": (8, 8, 9, 6),
    "smollm2-shape": (4, 8, 64, 16),
}


def build_model(name: str, folder: Path):
    """``(model, batch shape)`` for a named model or a local folder."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from rlvr.modeling.tiny import build_tiny_model

    if name == "tiny-trl":
        path = build_tiny_model(folder / "tiny", num_layers=4, seed=0)
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), SHAPES[name]
    if name == "smollm2-shape":
        config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                             num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                             rope_theta=100000.0, tie_word_embeddings=True, pad_token_id=0, eos_token_id=2)
        torch.manual_seed(0)
        return LlamaForCausalLM(config), SHAPES[name]
    return AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32), SHAPES["smollm2-shape"]


class _NoEosTokenizer:
    """What the HF engine needs of a tokenizer, with no end-of-sequence token: rows decode to the limit."""

    pad_token_id = 0
    eos_token_id = None

    def batch_decode(self, ids, skip_special_tokens=True):
        return ["" for _ in ids]


def measure(name: str, rounds: int, folder: Path) -> dict[str, tuple[float, float]]:
    import torch

    from rlvr.modeling import fast_forward
    from rlvr.engines.base import SamplingParams
    from rlvr.engines.hf import HFEngine
    from rlvr.modeling.logprobs import completion_logprobs

    model, (prompts, samples, width, length) = build_model(name, folder)
    own = copy.deepcopy(model)
    fast_forward.use_model_forward(own)
    if not fast_forward.supports(model):
        raise SystemExit(f"{name}: rlvr's forward does not support this model ({model.config.model_type})")
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(3, vocab, (prompts, width), generator=generator)
    rows = prompt_ids.repeat_interleave(samples, 0)
    ids = torch.cat([rows, torch.randint(3, vocab, (len(rows), length), generator=generator)], dim=1)
    mask = torch.ones_like(ids)
    sampling = SamplingParams(max_new_tokens=length, temperature=1.0)

    def passes(m):
        engine = HFEngine(m, _NoEosTokenizer())
        engine.eos_ids = []  # no end of sequence: every row decodes to the limit

        def generate():
            engine.generate(prompt_ids.tolist(), samples, sampling)

        def no_grad():
            with torch.no_grad():
                completion_logprobs(m.eval(), ids, mask, length)

        def fwd_bwd():
            m.train()
            m.zero_grad()
            logp, _ = completion_logprobs(m, ids, mask, length)
            logp.sum().backward()

        return {"generate": generate, "no-grad": no_grad, "fwd+bwd": fwd_bwd}

    variants = {"auto": passes(model), "hf": passes(own)}
    times = {(v, p): [] for v in variants for p in variants[v]}
    for variant in variants.values():  # warm-up
        for fn in variant.values():
            fn()
    for _ in range(rounds):
        for part in ("generate", "no-grad", "fwd+bwd"):
            for key in ("hf", "auto"):
                start = time.perf_counter()
                variants[key][part]()
                times[(key, part)].append(time.perf_counter() - start)
    with torch.no_grad():
        a, _ = completion_logprobs(model.eval(), ids, mask, length)
        b, _ = completion_logprobs(own.eval(), ids, mask, length)
    params = sum(p.numel() for p in model.parameters())
    print(f"\n{name}: {params / 1e6:.2f}M parameters, {prompts} prompts x {samples} samples, {width}-token prompts, "
          f"{length} completion tokens, median of {rounds} alternating rounds; max |logp diff| {float((a - b).abs().max()):.1e}")
    result = {}
    for part in ("generate", "no-grad", "fwd+bwd"):
        hf, auto = (statistics.median(times[(k, part)]) for k in ("hf", "auto"))
        result[part] = (hf, auto)
        print(f"  {part:<9} hf {hf * 1e3:9.1f} ms   auto {auto * 1e3:9.1f} ms   auto/hf {auto / hf:.2f}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", help="tiny-trl, smollm2-shape or a local HF folder; repeatable "
                        "(default: tiny-trl and smollm2-shape)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per pass (default 5)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    import torch

    from rlvr.run.runtime import quiet_transformers

    quiet_transformers()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.model or ["tiny-trl", "smollm2-shape"]:
            measure(name, args.rounds, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
