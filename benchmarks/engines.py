"""Generation speed of the vLLM engine against the HF engine, and the cost of a weight sync.

    python benchmarks/engines.py [--model tiny|PATH] [--prompts 16] [--samples 8] [--new-tokens 256]
                                 [--rounds 3] [--dtype float32] [--part both|generation|lora]

Both engines serve the same policy and get the same prompts (arithmetic problems in the model's
chat template) and sampling settings; their calls alternate, round after round, and the medians are
compared, because these machines are shared and noisy. Then, for the vLLM engine:

* full fine-tuning: seconds to push the weights (``update_weights(iter_inference_weights(...))``);
* LoRA (r=8 on every linear layer): push time and the next generation's time, once with the
  adapter merged into the pushed weights and once served as an adapter (``lora_sync``), since
  serving an adapter makes every decode step dearer while merging makes every push dearer.

``--model tiny`` builds the quickstart's 0.54M-parameter model; any local HF folder works
(e.g. SmolLM2-135M-Instruct from ../shared/tools/make_smollm2.sh). Needs vLLM installed.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent  # holds verifiers.py / sandbox.py: keep them from shadowing packages
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

LORA = dict(r=8, alpha=16, dropout=0.0, target_modules="all-linear")


def _prompts(tokenizer, count: int) -> list[list[int]]:
    from rlvr.rollout.chat import encode_prompts
    from rlvr.tasks.registry import get_task

    problems = list(itertools.islice(get_task("arithmetic", split="test"), count))
    return encode_prompts(tokenizer, [p.prompt for p in problems])


def _timed_generate(engine, prompts, n, sampling) -> tuple[float, int]:
    start = time.perf_counter()
    groups = engine.generate(prompts, n, sampling)
    return time.perf_counter() - start, sum(len(c.token_ids) for g in groups for c in g)


def _median_push(engine, policy, lora_mode: str, repeats: int = 5) -> float:
    import torch

    from rlvr.modeling.loading import iter_inference_weights

    times = []
    for _ in range(repeats):
        with torch.no_grad():  # a pretend optimizer step, so every push carries new values
            for p in policy.parameters():
                if p.requires_grad:
                    p.mul_(1.0 + 1e-4)
        start = time.perf_counter()
        engine.update_weights(iter_inference_weights(policy, lora=lora_mode))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def compare_generation(model: Path, args) -> None:
    from rlvr.engines import HFEngine, SamplingParams, build_engine
    from rlvr.modeling.loading import load_policy, load_tokenizer

    policy, tokenizer = load_policy(model, dtype=args.dtype), load_tokenizer(model)
    prompts = _prompts(tokenizer, args.prompts)
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)
    hf = HFEngine(policy, tokenizer, max_batch_size=args.prompts * args.samples)
    start = time.perf_counter()
    vllm = build_engine("vllm", policy, tokenizer, max_batch_size=args.prompts * args.samples)
    print(f"vLLM start: {time.perf_counter() - start:.1f} s")
    for engine in (hf, vllm):  # warm-up (vLLM's first call is slow)
        engine.generate(prompts[:2], 2, sampling)
    rates = {"hf": [], "vllm": []}
    for round_ in range(args.rounds):
        for name, engine in (("hf", hf), ("vllm", vllm)):
            seconds, tokens = _timed_generate(engine, prompts, args.samples, sampling)
            rates[name].append(tokens / seconds)
            print(f"  round {round_ + 1} {name:4s}: {tokens} tokens in {seconds:.2f} s = {tokens / seconds:,.0f} tok/s")
    hf_rate, vllm_rate = statistics.median(rates["hf"]), statistics.median(rates["vllm"])
    print(f"generation, {args.prompts} prompts x {args.samples} samples x <= {args.new_tokens} new tokens: "
          f"hf {hf_rate:,.0f} tok/s, vllm {vllm_rate:,.0f} tok/s, vllm/hf = {vllm_rate / hf_rate:.2f}x")
    print(f"full-weight sync: {_median_push(vllm, policy, 'merge') * 1e3:.1f} ms (median of 5)")
    vllm.close()


def compare_lora_sync(model: Path, args) -> None:
    from rlvr.engines import SamplingParams, build_engine
    from rlvr.modeling.loading import load_policy, load_tokenizer

    tokenizer = load_tokenizer(model)
    prompts = _prompts(tokenizer, args.prompts)
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)
    for mode in ("merge", "adapter"):
        policy = load_policy(model, dtype=args.dtype, lora=LORA)
        engine = build_engine("vllm", policy, tokenizer, lora_sync=mode, max_batch_size=args.prompts * args.samples)
        push = _median_push(engine, policy, "adapter" if mode == "adapter" else "merge")
        engine.generate(prompts[:2], 2, sampling)
        gen = []
        for _ in range(args.rounds):
            seconds, tokens = _timed_generate(engine, prompts, args.samples, sampling)
            gen.append(tokens / seconds)
        rate = statistics.median(gen)
        step = push + args.prompts * args.samples * args.new_tokens / rate
        print(f"LoRA lora_sync={mode:7s}: push {push * 1e3:7.1f} ms, generation {rate:,.0f} tok/s, "
              f"push + one full-length batch {step:.2f} s")
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="'tiny' (built here) or a local HF model folder")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8, help="completions per prompt (the group size)")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="alternating timed calls per engine")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--part", choices=["both", "generation", "lora"], default="both",
                        help="the engine comparison, the LoRA sync comparison, or both")
    args = parser.parse_args()
    from rlvr.modeling.tiny import build_tiny_model
    from rlvr.run.runtime import quiet_transformers

    quiet_transformers()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "tiny") if args.model == "tiny" else Path(args.model)
        if args.part in ("both", "generation"):
            compare_generation(model, args)
        if args.part in ("both", "lora"):
            compare_lora_sync(model, args)


if __name__ == "__main__":
    main()
