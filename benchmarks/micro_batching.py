"""Micro-batches of a policy update on a long-tailed batch: the whole batch's width, each micro-batch's
own width (trimmed), and rows packed under a token budget (``train.micro_batch_tokens``).

    python benchmarks/micro_batching.py [--rows 64] [--group 8] [--median 64] [--sigma 1.0]
                                        [--micro 16] [--tokens N ...] [--forward auto --forward hf]
                                        [--hidden 256] [--layers 4] [--heads 4] [--rounds 3] [--threads 2]
                                        [--device cuda --dtype bfloat16]

The batch: ``rows / group`` prompts of 16..32 tokens, ``group`` completions each, completion lengths
drawn lognormal around ``--median`` (sigma 1.0: the longest of 64 rows is 7.9x the median), seed 0.
The model: the repository's tiny Llama builder (``rlvr/modeling/tiny.py``, random weights) at
``--hidden`` and ``--layers``. Each variant runs the update's inner loop on it, the loss of
``rlvr/recipes/update.py`` (``policy_terms``, token-mean, global denominators): forward and backward
of every micro-batch, no optimizer step.

    whole width   micro-batches of ``--micro`` rows, each as wide as the batch (the update before trimming)
    trimmed       the same rows, each micro-batch cut to its longest prompt and longest completion
    budget N      rows packed longest first, at most N tokens each, at most ``rows`` rows (default: two
                  budgets, 4 x (W + T), a few times the longest row, and
                  micro x (W + T), the tokens of one whole-width micro-batch: the same peak size)

Variants alternate round after round (these machines are shared and noisy) and medians are compared;
the lines give the tokens computed (rows x width summed over the passes) against the real ones, the
passes made, the time ratio to ``whole width`` and, on CUDA, the peak memory allocated. The variants
compute the same loss and gradient to rounding (``tests/test_micro_batching.py``); the line
``max |grad diff|`` shows it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent  # holds verifiers.py / sandbox.py: keep them from shadowing packages
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))


def long_tailed_batch(vocab: int, rows: int, group: int, median: float, sigma: float, seed: int = 0):
    """A ``Batch`` of ``rows // group`` prompts x ``group`` completions, lognormal completion lengths."""
    import torch

    from rlvr.rollout.batch import Batch

    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(16, 33, (rows // group,), generator=g)  # tokens per prompt
    lengths = (median * torch.exp(sigma * torch.randn(rows, generator=g))).round().clamp(1, 16 * median).long()
    width, length = int(prompts.max()), int(lengths.max())
    input_ids = torch.randint(3, vocab, (rows, width + length), generator=g)
    attention_mask = torch.zeros_like(input_ids)
    response_mask = torch.zeros(rows, length)
    for i in range(rows):
        k, p = int(lengths[i]), int(prompts[i // group])
        input_ids[i, :width] = input_ids[i - i % group, :width]  # a group shares its prompt
        attention_mask[i, width - p : width + k] = 1
        response_mask[i, :k] = 1
    advantages = torch.randn(rows, generator=g)
    return Batch(input_ids, attention_mask, response_mask, torch.zeros(rows, length), advantages)


def run_passes(policy, batch, s, plan, trim: bool) -> tuple[int, int, int]:
    """The update's micro-batch loop (forward + backward each); ``(tokens computed, real tokens, passes)``."""
    from rlvr.recipes.update import global_counts, policy_terms, rows_with_gradient

    counts = global_counts(batch, s.dist)
    computed = real = passes = 0
    for rows in plan.split(batch, rows_with_gradient(batch, s.algo)):
        micro = batch.select(rows, trim=trim)
        policy_terms(policy, micro, s, **counts).loss.backward()
        computed, real, passes = computed + micro.input_ids.numel(), real + int(micro.attention_mask.sum()), passes + 1
    return computed, real, passes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--group", type=int, default=8, help="rows per prompt")
    parser.add_argument("--median", type=float, default=64, help="median completion tokens")
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of the completion lengths")
    parser.add_argument("--micro", type=int, default=16, help="train.micro_batch_size")
    parser.add_argument("--tokens", type=int, action="append",
                        help="train.micro_batch_tokens, repeatable (default: 4 x (W + T) and micro x (W + T))")
    parser.add_argument("--forward", action="append", choices=["auto", "hf"], help="model.forward (default: both)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()

    import torch

    from rlvr.config import RunConfig, build_config
    from rlvr.modeling.fast_forward import use_model_forward
    from rlvr.modeling.loading import load_policy
    from rlvr.modeling.tiny import build_tiny_model
    from rlvr.recipes.update import UpdateSettings
    from rlvr.rollout.batch import MicroBatching

    torch.set_num_threads(args.threads)
    path = build_tiny_model(Path(tempfile.mkdtemp()) / "tiny", hidden_size=args.hidden, num_layers=args.layers,
                            num_heads=args.heads, intermediate_size=8 * args.hidden // 3,  # Llama's MLP ratio
                            max_positions=int(16 * args.median) + 64)
    batch = None
    for forward in args.forward or ["auto", "hf"]:
        policy = load_policy(path, dtype=args.dtype, device=args.device)
        if forward == "hf":
            use_model_forward(policy)
        if batch is None:
            batch = long_tailed_batch(policy.config.vocab_size, args.rows, args.group, args.median,
                                      args.sigma).to(args.device)
            lengths = batch.response_mask.sum(dim=1)
            print(f"batch: {len(batch)} rows ({args.group} per prompt), width {batch.input_ids.shape[1]} "
                  f"(prompts <= {batch.input_ids.shape[1] - batch.completion_len}), completions median "
                  f"{float(lengths.median()):.0f}, mean {float(lengths.mean()):.1f}, max {int(lengths.max())} tokens "
                  f"({float(lengths.max() / lengths.median()):.1f}x the median); {args.threads} threads")
        budgets = args.tokens or [4 * batch.input_ids.shape[1], args.micro * batch.input_ids.shape[1]]
        config = build_config(RunConfig, {"model": {"path": str(path)}}, [
            "algorithm.loss_agg=token_mean", "algorithm.beta=0", f"generation.max_new_tokens={batch.completion_len}"])
        s = UpdateSettings.from_config(config)
        variants = {"whole width": (MicroBatching(args.micro), False), "trimmed": (MicroBatching(args.micro), True)}
        variants.update({f"budget {budget}": (MicroBatching(len(batch), budget), True) for budget in budgets})
        times = {name: [] for name in variants}
        counts, grads, peaks = {}, {}, {}
        cuda = batch.input_ids.is_cuda
        for _ in range(args.rounds + 1):  # the first round warms up and is not timed
            for name, (plan, trim) in variants.items():
                policy.zero_grad(set_to_none=True)
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                start = time.perf_counter()
                counts[name] = run_passes(policy, batch, s, plan, trim)
                if cuda:
                    torch.cuda.synchronize()
                    peaks[name] = torch.cuda.max_memory_allocated() / 2**20
                times[name].append(time.perf_counter() - start)
                grads[name] = torch.cat([p.grad.float().flatten() for p in policy.parameters()])
        base = statistics.median(times["whole width"][1:])
        print(f"\nmodel.forward={forward} (hidden {args.hidden}, {args.layers} layers, {args.dtype} on {args.device}), "
              f"median of {args.rounds} rounds:")
        for name, (computed, real, passes) in counts.items():
            median = statistics.median(times[name][1:])
            peak = f", peak {peaks[name]:.0f} MiB" if name in peaks else ""
            print(f"  {name:<18} {median * 1000:8.1f} ms  x{median / base:.2f}   {passes:2d} passes, tokens computed "
                  f"{computed:6d} (real {real}, {computed / real:.2f}x){peak}")
        diff = max(float((g - grads["whole width"]).abs().max()) for g in grads.values())
        largest = float(grads["whole width"].abs().max())
        print(f"  max |grad diff| against whole width: {diff:.1e} (max |grad| {largest:.1e})")


if __name__ == "__main__":
    main()
