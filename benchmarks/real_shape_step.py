"""GRPO steps on a random-init model of a real model's shape: per-phase time and peak GPU memory.

    python benchmarks/real_shape_step.py --shape DIR [--device cuda] [--dtype bfloat16] [--layers N]
        [--prompts 8] [--group 8] [--new-tokens 256] [--steps 4] [--forward auto|hf ...]
        [--logits-chunk-mb 256 ...] [--out results.json]

DIR holds a model's ``config.json`` and tokenizer files; no weights are read: the model is built
from the config with random weights (``--layers`` cuts its depth), so only a few MB travel to a GPU
machine. A random model's samples are noise that no verifier passes, so the reward here is a coin
flip per completion (a hash of its text): every group has reward variance and the update does its
full work. Prompts are the arithmetic suite's instruct-style questions in the tokenizer's chat
template, and a random model rarely stops, so nearly every sample runs to ``--new-tokens``.

Each (forward, logits chunk) variant is a whole ``rlvr train`` run in this process with
``engine: hf``, one after another; the first ``--warmup`` steps are left out of the medians.
Printed per variant: the median seconds of generation, update and whole step, generated tokens
per second, and the peak GPU memory the run allocated (``torch.cuda.max_memory_allocated``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent  # holds verifiers.py / sandbox.py: keep them from shadowing packages
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

COIN = "benchmark_coin"


def register_coin() -> None:
    """The coin-flip reward (module docstring), registered once under :data:`COIN`."""
    from rlvr.verifiers import Reward, Verifier, register_verifier
    from rlvr.verifiers.registry import VERIFIERS

    if COIN in VERIFIERS:
        return

    @register_verifier(COIN)
    class Coin(Verifier):
        """1 or 0 from one bit of a hash of the completion: variance without a model that can solve anything."""

        def score(self, completion, reference, **_):
            return Reward(float(hashlib.blake2b(completion.encode(), digest_size=1).digest()[0] & 1))


def build_random_model(shape: Path, out: Path, layers: int | None) -> int:
    """A random-init model of ``shape``'s config (cut to ``layers``) with its tokenizer, saved to ``out``;
    returns its parameter count."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(shape)
    if layers:
        config.num_hidden_layers = layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(shape).save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def run_variant(model: Path, run_dir: Path, args, forward: str, chunk_mb: float) -> dict:
    """One ``rlvr train`` run of the variant; its medians and peak memory."""
    import torch

    from rlvr.config import RunConfig, build_config
    from rlvr.recipes import train
    from rlvr.run.tracking import read_metrics

    config = build_config(RunConfig, {
        "out": str(run_dir), "model": {"path": str(model), "dtype": args.dtype, "forward": forward,
                                       "logits_chunk_mb": chunk_mb},
        "data": [{"task": "arithmetic", "options": {"style": "instruct", "max_digits": 3}}],
        "verifier": {"name": COIN, "workers": 0},
        "generation": {"max_new_tokens": args.new_tokens, "temperature": 1.0},
        "algorithm": {"preset": "grpo"},
        "optim": {"lr": 1e-6},
        "train": {"steps": args.steps + args.warmup, "prompts_per_step": args.prompts, "group_size": args.group,
                  "micro_batch_size": args.micro_batch, "device": args.device},
        "eval": {"at_start": False, "at_end": False},
        "checkpoint": {"every": 0, "at_end": False, "final_model": False},
        "log": {"progress": False, "plot": False},
    })
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    train(config)
    wall = time.perf_counter() - start
    steps = [r for r in read_metrics(run_dir / "metrics.jsonl") if "time/step" in r][args.warmup:]
    median = lambda key: statistics.median(r[key] for r in steps)  # noqa: E731
    return {"forward": forward, "logits_chunk_mb": chunk_mb, "generate_s": median("time/generate"),
            "update_s": median("time/update"), "step_s": median("time/step"),
            "tokens_per_s": median("perf/tokens_per_s"), "response_tokens": median("response/length_mean"),
            "peak_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else None, "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", required=True, type=Path, help="folder with config.json and the tokenizer")
    parser.add_argument("--layers", type=int, default=None, help="cut the model to this many layers (default: all)")
    parser.add_argument("--device", default="cuda", help="cuda or cpu (default cuda)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt (default 8)")
    parser.add_argument("--new-tokens", type=int, default=256, help="generation budget (default 256)")
    parser.add_argument("--micro-batch", type=int, default=16, help="rows per forward/backward (default 16)")
    parser.add_argument("--steps", type=int, default=4, help="measured steps per variant (default 4)")
    parser.add_argument("--warmup", type=int, default=2, help="steps left out first (default 2)")
    parser.add_argument("--forward", action="append", choices=["auto", "hf"], help="repeatable (default: auto, hf)")
    parser.add_argument("--logits-chunk-mb", action="append", type=float,
                        help="model.logits_chunk_mb; repeatable (default: 256 and 0, whole logits)")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)

    import torch

    register_coin()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        n = build_random_model(args.shape, model, args.layers)
        device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
        print(f"{args.shape.name}-shaped random model, {n / 1e6:.0f}M parameters, {args.dtype} on {device}; "
              f"{args.prompts} prompts x {args.group} samples x up to {args.new_tokens} new tokens, "
              f"micro-batch {args.micro_batch}; medians of {args.steps} steps after {args.warmup}", flush=True)
        for forward in args.forward or ["auto", "hf"]:
            for chunk_mb in args.logits_chunk_mb or [256.0, 0.0]:
                r = run_variant(model, Path(tmp) / f"run-{forward}-{chunk_mb:g}", args, forward, chunk_mb)
                results.append(r)
                peak = f"peak {r['peak_gb']:.2f} GB" if r["peak_gb"] is not None else ""
                print(f"  forward {forward:<4} logits {'whole' if not chunk_mb else f'{chunk_mb:g} MB chunks':<14} "
                      f"generate {r['generate_s']:6.2f} s  update {r['update_s']:6.2f} s  step {r['step_s']:6.2f} s  "
                      f"{r['tokens_per_s']:8.0f} tokens/s  {r['response_tokens']:.0f} tokens/sample  {peak}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"shape": args.shape.name, "args": {k: str(v) for k, v in vars(args).items()},
                                        "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
