"""Per-rank bytes of parameters, gradients and AdamW state: every rank holding the model (ddp) against
FSDP2 sharding (``torch.distributed.fsdp.fully_shard`` per decoder layer and on the root).

    python benchmarks/memory_per_rank.py [--model smollm2-135m|qwen2.5-1.5b|qwen2.5-7b|qwen2.5-32b ...]
                                         [--ranks 1 --ranks 2 --ranks 4 ...] [--dtype float32|bfloat16]

Each world size runs as that many processes (gloo on the CPU). The models are built on the meta
device from their published shapes (no weights, no memory), sharded the way FSDP2 shards them, and
the bytes are read from each rank's local shards (``DTensor.to_local()``): parameters, their
gradients (the same shapes) and AdamW's two moments (float32 where the parameters are float32 or
bfloat16 master weights: ``--dtype`` is the dtype the sharded parameters are kept in). The largest
rank is reported (shards of dimension 0 are not always equal). Activations, the all-gathered
layer in flight and the generation engine come on top (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent  # holds verifiers.py / sandbox.py: keep them from shadowing packages
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

# Published shapes (config.json of each hub model): layers, hidden, intermediate, heads, kv heads, vocabulary, tied
MODELS = {
    "smollm2-135m": ("llama", 30, 576, 1536, 9, 3, 49152, True),
    "qwen2.5-1.5b": ("qwen2", 28, 1536, 8960, 12, 2, 151936, True),
    "qwen2.5-7b": ("qwen2", 28, 3584, 18944, 28, 4, 152064, False),
    "qwen2.5-32b": ("qwen2", 64, 5120, 27648, 40, 8, 152064, False),
}


def build_meta_model(name: str, dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    kind, layers, hidden, intermediate, heads, kv, vocab, tied = MODELS[name]
    config_class, model_class = (LlamaConfig, LlamaForCausalLM) if kind == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    config = config_class(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=tied)
    with torch.device("meta"):
        return model_class(config).to(dtype)


def local_bytes(name: str, strategy: str, dtype_name: str) -> dict[str, int]:
    """This rank's bytes of parameters, gradients and AdamW moments for one model and strategy."""
    import torch

    from rlvr.run.sharding import shard_model

    dtype = getattr(torch, dtype_name)
    model = build_meta_model(name, dtype)
    if strategy == "fsdp2":
        shard_model(model)
    params = [p for p in model.parameters() if p.requires_grad]
    local = [p.to_local() if hasattr(p, "to_local") else p for p in params]
    param_bytes = sum(t.numel() * t.element_size() for t in local)
    moments = sum(t.numel() for t in local) * 2 * 4  # AdamW: exp_avg and exp_avg_sq, float32
    return {"params": param_bytes, "grads": param_bytes, "optimizer": moments,
            "count": sum(p.numel() for p in params)}


def _worker(rank: int, world: int, init: str, jobs: list, queue):
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        for name, strategy, dtype in jobs:
            queue.put((rank, name, strategy, local_bytes(name, strategy, dtype)))
    finally:
        dist.destroy_process_group()


def measure(world: int, jobs: list) -> dict:
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    queue = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/store"
        procs = [context.Process(target=_worker, args=(rank, world, init, jobs, queue)) for rank in range(world)]
        for p in procs:
            p.start()
        results = [queue.get() for _ in range(world * len(jobs))]
        for p in procs:
            p.join()
    largest: dict = {}
    for rank, name, strategy, sizes in results:
        key = (name, strategy)
        if key not in largest or sum(sizes[k] for k in ("params", "grads", "optimizer")) > \
                sum(largest[key][k] for k in ("params", "grads", "optimizer")):
            largest[key] = sizes
    return largest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", choices=sorted(MODELS), help="repeatable (default: all)")
    parser.add_argument("--ranks", action="append", type=int, help="world sizes; repeatable (default 1, 2, 4)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="dtype the (sharded) parameters are kept in (default float32)")
    args = parser.parse_args(argv)
    models = args.model or list(MODELS)
    gb = 1e9
    print(f"per-rank bytes (largest rank), parameters in {args.dtype}, AdamW moments in float32")
    print(f"{'model':<14} {'ranks':>5} {'strategy':<8} {'params GB':>10} {'grads GB':>9} {'AdamW GB':>9} "
          f"{'total GB':>9} {'params+AdamW vs ddp':>20}")
    for world in args.ranks or [1, 2, 4]:
        sizes = measure(world, [(m, s, args.dtype) for m in models for s in ("ddp", "fsdp2")])
        for name in models:
            ddp = sizes[(name, "ddp")]
            for strategy in ("ddp", "fsdp2"):
                s = sizes[(name, strategy)]
                ratio = (s["params"] + s["optimizer"]) / (ddp["params"] + ddp["optimizer"])
                total = s["params"] + s["grads"] + s["optimizer"]
                print(f"{name:<14} {world:>5} {strategy:<8} {s['params'] / gb:>10.2f} {s['grads'] / gb:>9.2f} "
                      f"{s['optimizer'] / gb:>9.2f} {total / gb:>9.2f} {ratio:>20.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
