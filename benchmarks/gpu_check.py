"""The GPU acceptance check: rlvr's GPU path on random-init models of real shapes, one command, a table.

    python benchmarks/gpu_check.py --smollm2 DIR [--out results.json] [--only CHECK ...]
    python benchmarks/gpu_check.py --dry-run          # the same checks at tiny shapes on the CPU (CI runs this)

DIR holds SmolLM2-135M-Instruct's ``config.json`` and tokenizer (``../shared/tools/make_smollm2.sh``
builds the model; its config and tokenizer, 3.5 MB, are all that travel). The Qwen2.5-0.5B and -1.5B
shapes are written below (no tokenizer needed: those checks feed random token ids). No weights travel:
every model is built from its config with random weights, so the numbers are of the machinery, not of a
model that can solve anything (a coin flip per sample is the reward where one is needed).

Checks (each a row; a failure is reported in its row and the others still run):

* ``master_weights``: one AdamW step (lr 1e-6) of ``model.dtype: bfloat16`` full fine-tuning against the
  float32 step on the same batch: the share of weights that move, the update's norm ratio and cosine
  (float32 master weights: ~1.0 / ~1.0; bf16 weights stepped in place, the old path, shown beside it).
* ``fsdp2_nccl``: a world-size-1 process group with rlvr's GPU backend map (``cpu:gloo,cuda:nccl``):
  the bookkeeping collectives, the policy loaded straight into FSDP2 shards (peak memory at load), one
  bf16 step through NCCL all-gathers and reduce-scatters.
* ``grpo_full`` / ``grpo_lora``: whole ``rlvr train`` GRPO steps (HF engine, bf16): generate / update /
  step medians, generated tokens per second, peak memory.
* ``async``: asynchronous generation (max_staleness 1) with the generator process on the GPU.
* ``logprobs_4k`` / ``logprobs_16k``: one completion log-prob forward+backward of a group of two rows of
  4,096 / 16,384 tokens after a shared prompt, Qwen2.5-0.5B shape (152k vocabulary), chunked logits,
  rlvr's shared-prompt forward (``auto``) and the model's own (``hf``): seconds and peak memory.

Everything is printed as a table and written as JSON (``--out``). Keep the whole run under ~8 minutes on
one H100 (a session is lent 15 minutes of device time, start-up included).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

_HERE = Path(__file__).resolve().parent  # holds verifiers.py / sandbox.py: keep them from shadowing packages
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))
sys.path.insert(0, str(_HERE))

QWEN = {  # Qwen2.5's published layer shapes (config.json of Qwen/Qwen2.5-0.5B-Instruct and -1.5B-Instruct)
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2),
}
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


class Setup:
    """Where models are built and which sizes a check uses: real shapes on a GPU, tiny ones for ``--dry-run``."""

    def __init__(self, args, tmp: Path):
        import torch

        self.dry, self.tmp = args.dry_run, tmp
        self.device = "cpu" if self.dry else "cuda"
        self.cuda = self.device == "cuda"
        self.smollm2 = args.smollm2
        self.name = "cpu (dry run, tiny shapes)" if self.dry else torch.cuda.get_device_name()
        self.steps, self.warmup = (2, 1) if self.dry else (3, 1)
        self.new_tokens = 8 if self.dry else 256

    def qwen(self, name: str, *, vocab: int | None = None) -> Path:
        """A random-init model of a Qwen2.5 shape (tiny in a dry run), saved in bf16; its folder."""
        from transformers import Qwen2Config, Qwen2ForCausalLM

        return self._save(f"{name}-random", lambda: Qwen2ForCausalLM(Qwen2Config(
            vocab_size=vocab or (512 if self.dry else 151936), tie_word_embeddings=True, rope_theta=1e6,
            max_position_embeddings=32768, **(TINY if self.dry else QWEN[name]))))

    def chat_model(self) -> Path:
        """SmolLM2-135M's shape with its tokenizer and chat template (the tiny model in a dry run)."""
        if self.dry:
            from rlvr.modeling.tiny import build_tiny_model

            path = self.tmp / "tiny"
            return path if path.exists() else build_tiny_model(path, seed=0)
        from real_shape_step import build_random_model

        path = self.tmp / "smollm2-random"
        if not path.exists():
            build_random_model(self.smollm2, path, None)
        return path

    def _save(self, name: str, build) -> Path:
        import torch

        path = self.tmp / name
        if not path.exists():
            torch.manual_seed(0)
            build().to(torch.bfloat16).save_pretrained(path)
        return path

    def reset_peak(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak_gb(self) -> float | None:
        import torch

        return round(torch.cuda.max_memory_allocated() / 1e9, 2) if self.cuda else None


# ---------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------


def step_delta(policy, device: str, rows: int, prompt: int, completion: int):
    """Every weight's change after one AdamW step (lr 1e-6) on -mean(log p) of a fixed random batch,
    flattened in float32, and the step's seconds."""
    import torch

    from rlvr.modeling.logprobs import completion_logprobs

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, policy.config.vocab_size, (rows, prompt + completion), generator=generator).to(device)
    logp, _ = completion_logprobs(policy, ids, torch.ones_like(ids), completion)  # untimed: kernel selection
    (-logp.mean()).backward()
    policy.zero_grad(set_to_none=True)
    before = [p.detach().float().cpu().clone() for p in policy.parameters()]  # a copy even where float32 on the CPU
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    logp, _ = completion_logprobs(policy, ids, torch.ones_like(ids), completion)
    (-logp.mean()).backward()
    torch.optim.AdamW(policy.parameters(), lr=1e-6, fused=True).step()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return torch.cat([(p.detach().float().cpu() - b).flatten() for p, b in zip(policy.parameters(), before)]), seconds


def check_master_weights(s: Setup, shape: str) -> dict:
    import torch

    from rlvr.config import ModelConfig
    from rlvr.modeling.loading import load_policy, load_run_policy

    path = s.qwen(shape) if shape.startswith("qwen") else s.chat_model()
    rows, prompt, completion = (2, 8, 8) if s.dry else (8, 64, 256)
    deltas, out = {}, {}
    for name, load in (("float32", lambda: load_run_policy(ModelConfig(path=str(path)), s.device, None)),
                       ("bf16 master", lambda: load_run_policy(ModelConfig(path=str(path), dtype="bfloat16"),
                                                               s.device, None)),
                       ("bf16 in place (old)", lambda: load_policy(path, dtype="bfloat16", device=s.device))):
        s.reset_peak()
        policy = load()
        deltas[name], seconds = step_delta(policy, s.device, rows, prompt, completion)
        out[f"{name}: step s"], out[f"{name}: peak GB"] = round(seconds, 3), s.peak_gb()
        del policy
    reference = deltas["float32"]
    for name in ("bf16 master", "bf16 in place (old)"):
        d = deltas[name]
        out[f"{name}: moved"] = round(float((d != 0).float().mean()), 4)
        out[f"{name}: norm ratio"] = round(float(d.double().norm() / reference.double().norm()), 4)
        out[f"{name}: cosine"] = round(float(torch.nn.functional.cosine_similarity(d.double(), reference.double(), dim=0)),
                                       4)  # float64: a float32 sum over 1e8 products drifts past 1
    out["parameters (M)"] = round(reference.numel() / 1e6, 1)
    out["ok"] = out["bf16 master: moved"] > 0.99 and abs(out["bf16 master: norm ratio"] - 1) < 0.05
    return out


def check_fsdp2(s: Setup) -> dict:
    import torch

    from rlvr.config import ModelConfig
    from rlvr.modeling.loading import load_run_policy
    from rlvr.run.runtime import collective_device, process_group_backend
    from rlvr.run.sharding import lockstep_passes

    path = s.qwen("qwen2.5-1.5b")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    backend = process_group_backend(torch.device(s.device))
    torch.distributed.init_process_group(backend)
    try:
        group = torch.distributed.distributed_c10d._get_default_group()
        out = {"backend map": backend, "group devices": sorted(d.type for d in group._device_types),
               "bookkeeping on": str(collective_device())}
        box = [None]
        torch.distributed.all_gather_object(box, {"metrics": 1.0})  # what reduce_metrics does every step
        count = torch.tensor([2.0], dtype=torch.float64, device=collective_device())
        torch.distributed.all_reduce(count)  # what Distributed.sum does
        s.reset_peak()
        policy = load_run_policy(ModelConfig(path=str(path), dtype="bfloat16"), torch.device(s.device), None,
                                 shard=True)
        out["load peak GB"] = s.peak_gb()
        out["lockstep passes"] = lockstep_passes(policy, 3)
        out["object gather"], out["count sum"] = box[0] == {"metrics": 1.0}, float(count.item())
        delta, seconds = step_delta(policy, s.device, *((2, 8, 8) if s.dry else (8, 64, 256)))
        out["step s"], out["step peak GB"] = round(seconds, 3), s.peak_gb()
        out["moved"] = round(float((delta != 0).float().mean()), 4)
        out["ok"] = out["moved"] > 0.99 and out["lockstep passes"] == 3 and out["object gather"]
        return out
    finally:
        torch.distributed.destroy_process_group()


def grpo_run(s: Setup, name: str, **sections) -> dict:
    """A whole ``rlvr train`` GRPO run on the chat model (coin-flip reward); its medians and peak memory."""
    from real_shape_step import COIN, register_coin

    from rlvr.config import RunConfig, build_config
    from rlvr.recipes import train
    from rlvr.run.tracking import read_metrics

    register_coin()
    run_dir = s.tmp / f"run-{name}"
    raw = {
        "out": str(run_dir), "model": {"path": str(s.chat_model()), "dtype": "bfloat16"},
        "data": [{"task": "arithmetic", "options": {"style": "instruct", "max_digits": 3}}],
        "verifier": {"name": COIN, "workers": 0},
        "generation": {"max_new_tokens": s.new_tokens, "temperature": 1.0},
        "algorithm": {"preset": "grpo"}, "optim": {"lr": 1e-6},
        "train": {"steps": s.steps + s.warmup, "prompts_per_step": 2 if s.dry else 8, "group_size": 4 if s.dry else 8,
                  "micro_batch_size": 16,
                  "device": s.device, "threads": 2 if s.dry else None},
        "eval": {"at_start": False, "at_end": False},
        "checkpoint": {"every": 0, "at_end": False, "final_model": False},
        "log": {"progress": False, "plot": False},
    }
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    s.reset_peak()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        train(build_config(RunConfig, raw))
    steps = [r for r in read_metrics(run_dir / "metrics.jsonl") if "time/step" in r][s.warmup:]
    median = lambda key: round(statistics.median(r[key] for r in steps), 3)  # noqa: E731
    return {"generate s": median("time/generate"), "update s": median("time/update"), "step s": median("time/step"),
            "tokens/s": round(median("perf/tokens_per_s")), "tokens/sample": median("response/length_mean"),
            "peak GB": s.peak_gb(), "printed": printed.getvalue(), "ok": len(steps) == s.steps}


def check_grpo(s: Setup, lora: bool) -> dict:
    model = {"lora": {"r": 16, "alpha": 32}} if lora else {}
    out = grpo_run(s, "lora" if lora else "full", model=model)
    out.pop("printed")
    return out


def check_async(s: Setup) -> dict:
    out = grpo_run(s, "async", async_generation={"max_staleness": 1}, algorithm={"off_policy": "decoupled"})
    printed = out.pop("printed")
    line = next((line for line in printed.splitlines() if line.startswith("async generation:")), "")
    out["generator"] = line.removeprefix("async generation: ")
    out["ok"] = out["ok"] and (f"on {s.device}" in line)
    return out


LOGPROB_ROWS = 2  # rows of one prompt in the log-prob checks: fewer distinct prompts than 3/4 of the rows


def check_logprobs(s: Setup, tokens: int) -> dict:
    """A group of :data:`LOGPROB_ROWS` rows of ``tokens`` completion tokens each after one shared 128-token
    prompt, forward+backward with chunked logits, through rlvr's shared-prompt forward (``auto``) and
    the model's own (``hf``): each arm warmed up at the timed shape, then timed twice, alternating, the
    faster kept. The row records which forward really ran: one row alone shares no prompt and runs the
    model's own forward under ``auto`` too (the first GPU table compared that with itself)."""
    import torch

    from rlvr.config import ModelConfig
    from rlvr.modeling import fast_forward
    from rlvr.modeling.loading import load_run_policy
    from rlvr.modeling.logprobs import completion_logprobs

    tokens = 64 if s.dry else tokens
    path = s.qwen("qwen2.5-0.5b")
    policies = {}
    for forward in ("auto", "hf"):
        policies[forward] = load_run_policy(ModelConfig(path=str(path), dtype="bfloat16", forward=forward), s.device, None)
        if forward == "hf":
            fast_forward.use_model_forward(policies[forward])
    prompt = torch.randint(3, policies["auto"].config.vocab_size, (1, 128))
    ids = torch.cat([prompt.expand(LOGPROB_ROWS, -1),
                     torch.randint(3, policies["auto"].config.vocab_size, (LOGPROB_ROWS, tokens))], dim=1).to(s.device)
    ran = {"auto": 0, "hf": 0}
    shared_pass = fast_forward.forward_prompts_and_rows

    def counted(*args, **kwargs):
        ran[current] += 1
        return shared_pass(*args, **kwargs)

    fast_forward.forward_prompts_and_rows = counted
    out, times = {}, {"auto": [], "hf": []}
    try:
        for current in ["auto", "hf", "auto", "hf", "auto", "hf"]:  # the first of each: an untimed warm-up
            policy = policies[current]
            s.reset_peak()
            base = torch.cuda.memory_allocated() if s.cuda else 0
            try:
                start = time.perf_counter()
                logp, _ = completion_logprobs(policy, ids, torch.ones_like(ids), tokens)
                logp.sum().backward()
                if s.cuda:
                    torch.cuda.synchronize()
                times[current].append(time.perf_counter() - start)
                out[f"{current}: peak GB above model"] = round((torch.cuda.max_memory_allocated() - base) / 1e9, 2) \
                    if s.cuda else None
            except torch.OutOfMemoryError:
                times[current].append(float("inf"))
            policy.zero_grad(set_to_none=True)
            del logp
    finally:
        fast_forward.forward_prompts_and_rows = shared_pass
    for forward, seconds in times.items():
        out[f"{forward}: s"] = round(min(seconds[1:]), 3) if min(seconds[1:]) < float("inf") else "out of memory"
    out["rows x tokens"] = f"{LOGPROB_ROWS} x {tokens}"
    out["auto ran"] = "rlvr's forward" if ran["auto"] == 3 else f"the model's own ({ran['auto']}/3 passes rlvr's)"
    out["ok"] = ran == {"auto": 3, "hf": 0} and all(not isinstance(v, str) for k, v in out.items() if k.endswith(": s"))
    return out


CHECKS = {
    "master_weights": lambda s: check_master_weights(s, "qwen2.5-1.5b"),
    "master_weights_smollm2": lambda s: check_master_weights(s, "smollm2"),
    "fsdp2_nccl": check_fsdp2,
    "grpo_full": lambda s: check_grpo(s, lora=False),
    "grpo_lora": lambda s: check_grpo(s, lora=True),
    "async": check_async,
    "logprobs_4k": lambda s: check_logprobs(s, 4096),
    "logprobs_16k": lambda s: check_logprobs(s, 16384),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smollm2", type=Path, default=None,
                        help="folder with SmolLM2-135M-Instruct's config.json and tokenizer (not needed with --dry-run)")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU: every check's code runs, in seconds")
    parser.add_argument("--only", action="append", choices=sorted(CHECKS), help="run only these checks (repeatable)")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if not args.dry_run and args.smollm2 is None:
        parser.error("--smollm2 DIR is needed on a GPU (or use --dry-run)")

    import torch

    from rlvr.run.runtime import quiet_transformers

    quiet_transformers()
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device: use --dry-run")
    results = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        setup = Setup(args, Path(tmp))
        print(f"rlvr GPU check on {setup.name}: torch {torch.__version__}", flush=True)
        for name in args.only or list(CHECKS):
            t0 = time.perf_counter()
            try:
                row = CHECKS[name](setup)
            except Exception as exc:  # a failing check is a row of the table; the others still run
                row = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500],
                       "where": traceback.format_exc().splitlines()[-3:]}
            row["seconds"] = round(time.perf_counter() - t0, 1)
            results[name] = row
            print(f"{'ok  ' if row['ok'] else 'FAIL'} {name}: " + json.dumps(row), flush=True)
    summary = {"device": setup.name, "torch": torch.__version__, "wall_s": round(time.perf_counter() - started, 1),
               "checks": results}
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2))
    failed = [name for name, row in results.items() if not row["ok"]]
    print(f"{len(results) - len(failed)}/{len(results)} checks ok in {summary['wall_s']} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
