"""Per-phase time split of a GRPO step on the tiny model (CPU by default).

    python benchmarks/step_time.py [--steps 30] [--device cpu] [--shape quickstart|trl] [--engine hf|vllm ...]
                                   [--forward auto|hf ...] [--roofline]

Shapes (both start from the quickstart's SFT warm start, ~0.30 greedy accuracy, so that groups have
reward variance and the update does real work; a random model's groups are all zero, and at beta 0
its "update" would be empty):
    quickstart  32 prompts x 8 samples, 5 new tokens, the quickstart's 0.54M-parameter model
    trl         8 prompts x 8 samples, up to 16 new tokens, the same model with 4 layers (~1M
                parameters): the step-time shape of benchmarks/vs_trl.py, which times TRL beside it

Prints the median seconds of each phase (generate / verify / update / whole step) over the
steps after a warm-up, each phase's share of the step, and generated tokens per second. The
machines are shared and noisy: compare medians, and compare runs made one right after another.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

# This folder holds verifiers.py and sandbox.py benchmarks: keep them from shadowing the packages.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

SHAPES = {
    "quickstart": dict(layers=2, prompts=32, group=8, new_tokens=5),
    "trl": dict(layers=4, prompts=8, group=8, new_tokens=16),
}


def run(shape: str, steps: int, device: str, beta: float, threads: int | None, warmup: int = 3,
        engine: str = "hf", with_roofline: bool = False, forward: str = "auto") -> dict[str, float]:
    from benchmarks.vs_trl import TASK_OPTIONS, build_sft_model
    from rlvr.recipes import grpo
    from rlvr.config import RunConfig, build_config
    from rlvr.modeling.loading import load_policy
    from rlvr.run.tracking import read_metrics

    spec = SHAPES[shape]
    with tempfile.TemporaryDirectory() as tmp:
        model = build_sft_model(Path(tmp) / "model", seed=0, layers=spec["layers"], threads=threads or 2)
        n_params = sum(p.numel() for p in load_policy(model).parameters())
        config = build_config(RunConfig, {
            "out": str(Path(tmp) / "run"), "model": {"path": str(model), "forward": forward},
            "data": [{"task": "arithmetic", "options": TASK_OPTIONS}],
            "generation": {"max_new_tokens": spec["new_tokens"]}, "engine": {"name": engine},
            "algorithm": {"preset": "grpo", "beta": beta},
            "optim": {"lr": 1e-4},
            "train": {"steps": steps + warmup, "prompts_per_step": spec["prompts"], "group_size": spec["group"],
                      "micro_batch_size": 256, "device": device, "threads": threads},
            "eval": {"at_start": False, "at_end": False},
            "verifier": {"workers": 0},
            "checkpoint": {"every": 0, "at_end": False, "final_model": False},
            "log": {"progress": False, "plot": False},
        })
        grpo.train(config)
        records = [r for r in read_metrics(Path(tmp) / "run" / "metrics.jsonl") if "time/step" in r][warmup:]
        median = {key: statistics.median(r[key] for r in records)
                  for key in ("time/generate", "time/verify", "time/update", "time/step", "perf/tokens_per_s",
                              "response/length_max")}
        median["params"] = n_params
        if with_roofline:
            median["roofline"] = roofline(model, spec, completion_len=round(median["response/length_max"]), device=device,
                                          forward=forward)
    return median


def roofline(model_path: Path, spec: dict, *, completion_len: int, device: str, prompt_len: int = 8,
             forward: str = "auto") -> dict[str, float]:
    """The policy's forward + backward over one step's batch (``prompts`` x ``group`` rows of a
    ``prompt_len``-token prompt and a ``completion_len``-token completion, prompts shared as the
    trainer shares them): FLOPs counted by ``torch.utils.flop_counter``, median time, achieved FLOP/s,
    against the measured FLOP/s of the biggest matmul of the same pass alone (the MLP's up-projection
    over the completion tokens) and of a 2048^3 matmul (the machine's best)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from rlvr.modeling.logprobs import completion_logprobs
    from rlvr.modeling.loading import load_policy

    policy = load_policy(model_path, forward=forward).to(device).train()
    rows = spec["prompts"] * spec["group"]
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 15, (spec["prompts"], prompt_len), generator=generator).repeat_interleave(spec["group"], 0)
    completions = torch.randint(3, 15, (rows, completion_len), generator=generator)
    ids = torch.cat([prompts, completions], dim=1).to(device)
    mask = torch.ones_like(ids)

    def update_pass():
        policy.zero_grad()
        logp, _ = completion_logprobs(policy, ids, mask, completion_len)
        logp.sum().backward()

    with FlopCounterMode(display=False) as counter:
        update_pass()
    flops = counter.get_total_flops()
    seconds = _median_time(update_pass, device)
    hidden, inner = policy.config.hidden_size, policy.config.intermediate_size
    a = torch.randn(rows * (completion_len - 1), hidden, device=device)
    b = torch.randn(hidden, inner, device=device)
    mm_flops = 2 * a.shape[0] * hidden * inner
    mm_seconds = _median_time(lambda: a @ b, device)
    big = torch.randn(2048, 2048, device=device)
    big_seconds = _median_time(lambda: big @ big, device, repeats=5)
    return {"flops": flops, "seconds": seconds, "achieved": flops / seconds, "shape_peak": mm_flops / mm_seconds,
            "shape": f"[{a.shape[0]} x {hidden}] @ [{hidden} x {inner}]", "machine_peak": 2 * 2048**3 / big_seconds}


def _median_time(fn, device: str, repeats: int = 20) -> float:
    import time

    import torch

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="measured steps (after 3 warm-up steps)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--shape", choices=sorted(SHAPES), action="append", help="shape(s) to time (default: all)")
    parser.add_argument("--beta", type=float, default=0.0, help="KL coefficient (0 = no reference pass)")
    parser.add_argument("--engine", action="append", help="engine(s) to time, in turn (default: hf)")
    parser.add_argument("--roofline", action="store_true",
                        help="also time the update's forward+backward alone: counted FLOPs, achieved FLOP/s, and the "
                        "measured matmul peak of the same machine for the same shapes")
    parser.add_argument("--threads", type=int, action="append",
                        help="torch CPU threads; repeat to compare (e.g. --threads 1 --threads 2); default: torch's")
    parser.add_argument("--forward", choices=["auto", "hf"], action="append",
                        help="model.forward: auto (rlvr's shared-prompt forward) or hf (the model's own); repeat to "
                        "compare; default: auto")
    args = parser.parse_args(argv)
    for shape in args.shape or list(SHAPES):
        step_ms = {}
        variants = [(e, t, f) for e in args.engine or ["hf"] for t in args.threads or [None] for f in args.forward or ["auto"]]
        for engine, threads, forward in variants:
            m = run(shape, args.steps, args.device, args.beta, threads, engine=engine, with_roofline=args.roofline,
                    forward=forward)
            spec = SHAPES[shape]
            print(f"\n{shape}: {spec['prompts']} prompts x {spec['group']} samples, {spec['new_tokens']} new tokens, "
                  f"{m['params'] / 1e6:.2f}M parameters, beta {args.beta}, engine {engine}, forward {forward}, "
                  f"threads {threads or 'default'}, "
                  f"device {args.device}, median of {args.steps} steps")
            for phase in ("generate", "verify", "update"):
                seconds = m[f"time/{phase}"]
                print(f"  {phase:<9} {seconds * 1e3:8.1f} ms   {seconds / m['time/step']:6.1%} of the step")
            print(f"  {'step':<9} {m['time/step'] * 1e3:8.1f} ms   generation {m['perf/tokens_per_s']:,.0f} tokens/s")
            if "roofline" in m:
                r = m["roofline"]
                print(f"  roofline: update forward+backward {r['flops'] / 1e9:.2f} GFLOP in {r['seconds'] * 1e3:.1f} ms = "
                      f"{r['achieved'] / 1e9:.1f} GFLOP/s; the pass's biggest matmul {r['shape']} alone "
                      f"{r['shape_peak'] / 1e9:.1f} GFLOP/s ({r['achieved'] / r['shape_peak']:.0%} of it); 2048^3 matmul "
                      f"{r['machine_peak'] / 1e9:.1f} GFLOP/s ({r['achieved'] / r['machine_peak']:.0%} of it)")
            step_ms[f"engine={engine} threads={threads} forward={forward}"] = m["time/step"] * 1e3
        if len(step_ms) > 1:
            base = next(iter(step_ms))
            print(f"  step time relative to {base}: " + ", ".join(f"{k}: {v / step_ms[base]:.2f}x" for k, v in step_ms.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
