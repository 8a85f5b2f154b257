"""Completion log-probs at real lengths: time and peak memory of one forward+backward.

    python benchmarks/long_logprobs.py [--shape smollm2-4l|vocab152k-4l ...] [--tokens 1024 ...]
                                       [--rows 16] [--variant auto/chunked ...] [--threads 2]
                                       [--device cuda --dtype bfloat16]

One pass of the policy update (``completion_logprobs`` and the backward of their sum) on a random
model of real width, each variant in its own fresh process (so that peak memory is the pass's own),
variants alternating. Peak memory is the most resident memory above what the process held just
before the pass (sampled every 2 ms from ``/proc/self/statm``); the logits' share is printed
beside it: ``rows x tokens x vocabulary x 4`` bytes, the float32 tensor the whole-logits pass holds.

``--frozen-head`` freezes the output layer (as LoRA does), where the chunked backward recomputes
nothing. Variants are ``FORWARD/LOGITS``: FORWARD ``auto`` (rlvr's forward) or ``hf`` (the model's own, SDPA);
LOGITS ``chunked`` (log-probs computed over chunks of tokens; the default) or ``whole`` (the
whole ``[rows, tokens, vocabulary]`` logits at once, as before chunking).

Shapes (a 64-token prompt shared by groups of ``--group`` rows, 8 by default):

* ``smollm2-4l``   SmolLM2-135M's layer shape (hidden 576, 9 heads over 3 kv heads, vocabulary
  49,152, tied embeddings) cut to 4 layers;
* ``vocab152k-4l`` the same trunk with Qwen2.5's 151,936-token vocabulary.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent  # holds verifiers.py / sandbox.py: keep them from shadowing packages
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

SHAPES = {"smollm2-4l": 49152, "vocab152k-4l": 151936}  # vocabulary
PROMPT, GROUP = 64, 8
VARIANTS = ("hf/whole", "auto/whole", "hf/chunked", "auto/chunked")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """The most resident memory above the level at entry, sampled on a thread."""

    def __enter__(self):
        self.base = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def extra(self) -> int:
        return self.peak - self.base


def one_pass(shape: str, tokens: int, rows: int, variant: str, frozen_head: bool = False, group: int = 8,
             device: str = "cpu", dtype: str = "float32") -> dict:
    """Build the model and batch, run one forward+backward, return its time and peak memory. On a GPU
    one untimed pass comes first (kernel selection), and peak memory is CUDA's allocator peak above
    what the model and batch took."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlvr.modeling import fast_forward, logprobs
    from rlvr.modeling.logprobs import completion_logprobs

    forward, logits = variant.split("/")
    config = LlamaConfig(vocab_size=SHAPES[shape], hidden_size=576, intermediate_size=1536, num_hidden_layers=4,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rope_theta=100000.0, tie_word_embeddings=True, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).train()
    if frozen_head:  # as under LoRA (tied: the embedding too); the chunked backward then recomputes nothing
        model.lm_head.weight.requires_grad_(False)
    if forward == "hf":
        fast_forward.use_model_forward(model)
    chunking = hasattr(logprobs, "set_logits_chunk")  # a build before chunking computes whole logits
    if logits == "chunked" and not chunking:
        raise SystemExit("this build has no chunked log-probs: run the whole variants only")
    if logits == "whole" and chunking:
        logprobs.set_logits_chunk(model, 0)
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, config.vocab_size, (rows // group, PROMPT), generator=generator)
    ids = torch.cat([prompts.repeat_interleave(group, 0),
                     torch.randint(3, config.vocab_size, (rows, tokens), generator=generator)], dim=1)
    mask = torch.ones_like(ids)
    if device != "cpu":
        return _gpu_pass(model.to(device=device, dtype=getattr(torch, dtype)), ids.to(device), mask.to(device), tokens)
    with PeakMemory() as memory:
        start = time.perf_counter()
        logp, _ = completion_logprobs(model, ids, mask, tokens)
        logp.sum().backward()
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_bytes": memory.extra, "logp_sum": float(logp.sum()),
            "grad_norm": float(torch.linalg.vector_norm(model.model.norm.weight.grad))}


def _gpu_pass(model, ids, mask, tokens: int) -> dict:
    import torch

    from rlvr.modeling.logprobs import completion_logprobs

    logp, _ = completion_logprobs(model, ids, mask, tokens)  # untimed: kernel selection, allocator warm-up
    logp.sum().backward()
    model.zero_grad(set_to_none=True)
    del logp
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    logp, _ = completion_logprobs(model, ids, mask, tokens)
    logp.sum().backward()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_bytes": torch.cuda.max_memory_allocated() - base,
            "logp_sum": float(logp.float().sum()), "grad_norm": float(torch.linalg.vector_norm(
                model.model.norm.weight.grad.float()))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES),
                        help="model shape; repeatable (default: both)")
    parser.add_argument("--tokens", action="append", type=int, help="completion tokens; repeatable (default 1024)")
    parser.add_argument("--rows", type=int, default=16, help="rows, a multiple of --group (default 16)")
    parser.add_argument("--group", type=int, default=GROUP, help=f"rows per prompt (default {GROUP})")
    parser.add_argument("--variant", action="append", choices=VARIANTS, help="FORWARD/LOGITS; repeatable (default: all four)")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds, each variant once per round (default 1)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--frozen-head", action="store_true",
                        help="freeze the output layer (tied: and the embedding), as LoRA does")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: the pass on a GPU (default cpu)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="the model's dtype on a GPU (default float32; the CPU pass is float32)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.group < 1 or args.rows % args.group:
        parser.error(f"--rows must be a multiple of --group ({args.group}), got {args.rows}")
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        shape, tokens, variant = args.child.split(",")
        print(json.dumps(one_pass(shape, int(tokens), args.rows, variant, args.frozen_head, args.group,
                                  args.device, args.dtype)))
        return 0
    for shape in args.shape or sorted(SHAPES):
        for tokens in args.tokens or [1024]:
            logits_gb = args.rows * tokens * SHAPES[shape] * 4 / 1e9
            print(f"\n{shape}, {args.rows} rows in groups of {args.group} x ({PROMPT}-token prompt + {tokens} completion tokens), "
                  + (f"{args.device} {args.dtype}" if args.device != "cpu" else f"{args.threads} threads")
                  + f"; whole float32 logits {logits_gb:.2f} GB"
                  + ("; output layer frozen" if args.frozen_head else ""))
            results: dict[str, list[dict]] = {}
            for _ in range(args.rounds):
                for variant in args.variant or VARIANTS:
                    child = [sys.executable, __file__, "--child", f"{shape},{tokens},{variant}", "--rows",
                             str(args.rows), "--group", str(args.group), "--threads", str(args.threads),
                             "--device", args.device, "--dtype", args.dtype] \
                        + ["--frozen-head"] * args.frozen_head
                    done = subprocess.run(child, capture_output=True, text=True)
                    if done.returncode:
                        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["killed"]
                        print(f"  {variant:<13} failed (exit {done.returncode}): {tail[0]}")
                        continue
                    results.setdefault(variant, []).append(json.loads(done.stdout.strip().splitlines()[-1]))
            for variant, runs in results.items():
                best = min(runs, key=lambda r: r["seconds"])
                peak = max(r["peak_bytes"] for r in runs)
                print(f"  {variant:<13} {best['seconds']:7.1f} s   peak {peak / 1e9:6.2f} GB   "
                      f"sum logp {best['logp_sum']:.6e}   |grad final norm| {best['grad_norm']:.6e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
