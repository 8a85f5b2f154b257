"""rlvr against TRL's ``GRPOTrainer`` on the same work: step time, and time to accuracy.

    pip install -r benchmarks/requirements-trl.txt      # TRL, for this benchmark only
    python benchmarks/vs_trl.py [--rounds 3] [--steps 20] [--betas 0,0.04] [--threads 2]
    python benchmarks/vs_trl.py --time-to-accuracy [--seeds 0,1,2] [--lrs 1.5e-4,3e-4] [--max-steps 1200]

Everything is built here, nothing is downloaded: the quickstart's tiny character-level Llama and its
SFT warm start (3-digit addition, ``7+345=`` -> ``352``, stopped at ~0.30 greedy accuracy), and the
problems, which both systems read as the same raw strings (no chat template: TRL feeds string
prompts raw; both see the same token ids, ``<bos>`` first) with the same reward: rlvr's ``numeric``
verifier (1 for the right number). Both train on the same problems at every step: TRL reads them
unshuffled, in the order that the rlvr run's seeded sampler draws them (a seed's 160 problems can be
0.05 easier or harder than another's on average, more than the two systems' own difference).

Step time (the default): each system runs in its own process, the two alternating for ``--rounds``
rounds at each beta, so both see the same machine (these machines are shared and noisy). Matched
settings: 8 prompts x 8 samples, up to 16 new tokens at temperature 1, fp32, AdamW lr 1e-4 constant,
gradient clipping 1.0, one optimizer step per batch (clip 0.2 never acts), group z-score advantages,
token-mean loss over the batch (TRL ``loss_type="dapo"``, rlvr ``loss_agg: token_mean``), k3 KL to
the SFT model in the loss at beta > 0, logging every step. The step model is the quickstart's with 4
layers instead of 2 (~1M parameters). Step time is the wall time between two step ends (logging
included), first step excluded; the median over all rounds is reported with tokens/s, peak RSS and
the mean reward per step, then one line ``ratio rlvr/trl median step time: beta0=X beta0.04=Y``.

Time to accuracy (``--time-to-accuracy``): the quickstart's own model and shape (2 layers, 32 prompts x
8 samples, 5 new tokens), from its SFT checkpoint (one per seed). Wall time of training (evaluation
excluded) until greedy accuracy on 500 held-out test problems, evaluated every 10 steps by the same
code for both (rlvr's HF engine and ``numeric`` verifier), first reaches ``--target`` (0.6). Each
system runs at every learning rate of ``--lrs``; its best learning rate (lowest median) is reported,
then ``ratio rlvr/trl time to 0.6 accuracy: X`` (an upper bound ``< X`` when only TRL's median seed
never reaches it). rlvr uses its quickstart config (beta 0.04, z-score groups, sequence-mean loss,
guidance from the gold answers on all-wrong groups); TRL its defaults for the rest (dapo loss, beta
0.04 to match; it has no guidance).

Real model (``--real-model DIR``, e.g. ``--real-model smollm2 --steps 6 --rounds 2 --betas 0``): the
same step-time measurement on a model users run, SmolLM2-135M-Instruct (built offline by
``../shared/tools/make_smollm2.sh DIR``), float32, on GSM8K's training problems as chat messages
(both systems apply the tokenizer's chat template), 2 prompts x 4 samples, up to 256 new tokens,
lr 1e-6, the reward each problem's rlvr verifier gives its reply.

Settings that cannot be matched: rlvr's generation records the sampling log-probs itself (TRL
computes them in the update's forward at one epoch); TRL evaluates nothing by itself, so its
evaluation runs in a callback whose time is subtracted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

TASK_OPTIONS = {"style": "bare", "max_digits": 3, "ops": "+"}
STEP_SHAPE = dict(prompts=8, group=8, new_tokens=16, lr=1e-4, layers=4)
#: ``--real-model``: SmolLM2-135M-Instruct on GSM8K (chat prompts), 256 new tokens.
REAL_SHAPE = dict(prompts=2, group=4, new_tokens=256, lr=1e-6)
TTA_SHAPE = dict(prompts=32, group=8, new_tokens=5, layers=2, eval_every=10, eval_limit=500)


# ---------------------------------------------------------------------------------------------
# Shared set-up: model, SFT warm start, problems
# ---------------------------------------------------------------------------------------------


def build_sft_model(root: Path, seed: int, layers: int, threads: int) -> Path:
    """The quickstart's tiny model (``layers`` deep) after its SFT bootstrap (~0.30 greedy accuracy)."""
    from rlvr.recipes import sft
    from rlvr.config import build_config
    from rlvr.configs import load_packaged
    from rlvr.modeling.tiny import build_tiny_model
    from rlvr.config import SFTConfig

    build_tiny_model(root / "base_model", seed=seed, num_layers=layers)
    config = build_config(SFTConfig, load_packaged("quickstart_sft.yaml"),
                          [f"out={root / 'sft'}", f"model.path={root / 'base_model'}", f"train.seed={seed}",
                           f"train.threads={threads}", "log.progress=false"])
    summary = sft.train(config)
    print(f"  SFT warm start ({layers} layers, seed {seed}): {summary['steps']} steps, "
          f"dev accuracy {summary['eval_accuracy']:.3f}", flush=True)
    return root / "sft" / "final"


def problems(split: str, task: str = "arithmetic") -> list[dict]:
    """The task's problems: arithmetic as raw prompt strings (what a run with no chat template feeds
    the model), GSM8K as chat messages (both systems apply the tokenizer's chat template)."""
    from rlvr.tasks import get_task

    if task == "arithmetic":
        return [{"prompt": p.prompt[-1]["content"], "answer": str(p.reference["answer"]), "verifier": "numeric"}
                for p in get_task("arithmetic", split=split, **TASK_OPTIONS)]
    return [{"prompt": [dict(m) for m in p.prompt], "answer": str(p.reference["answer"]), "verifier": p.verifier}
            for p in get_task(task, split=split)]


def in_rlvr_order(rows: list[dict], seed: int, task: str = "arithmetic") -> list[dict]:
    """``rows`` in the order an rlvr run with this seed draws its problems: its ``ProblemSampler``
    over the one suite ``task`` (the suite's name is part of the sampler's seed)."""
    from rlvr.rollout.sampler import ProblemSampler

    return [row for _, row in ProblemSampler({task: rows}, {task: 1.0}, seed=seed).next(len(rows))]


def greedy_accuracy(model, tokenizer, limit: int, max_new_tokens: int) -> float:
    """Greedy accuracy of ``model`` on the first ``limit`` test problems, by ``rlvr.rollout.evaluate.evaluate``
    (the HF engine, each problem's ``numeric`` verifier): what an rlvr run's ``eval/accuracy`` is."""
    from rlvr.rollout.chat import encode_prompts
    from rlvr.engines.base import SamplingParams
    from rlvr.engines.hf import HFEngine
    from rlvr.rollout.evaluate import evaluate
    from rlvr.tasks import get_task
    from rlvr.verifiers.runner import VerifierRunner

    test = list(get_task("arithmetic", split="test", **TASK_OPTIONS))[:limit]
    with VerifierRunner(workers=0) as runner:
        result = evaluate(HFEngine(model, tokenizer), lambda p: encode_prompts(tokenizer, [p.prompt])[0], test, runner,
                          sampling=SamplingParams(max_new_tokens=max_new_tokens, greedy=True))
    return result.accuracy


# ---------------------------------------------------------------------------------------------
# Workers: one run of one system, in its own process; results as JSON
# ---------------------------------------------------------------------------------------------


def run_trl(spec: dict) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlvr.verifiers import get_verifier

    torch.set_num_threads(spec["threads"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    task = spec.get("task", "arithmetic")

    def exact_answer(completions, answer, verifier, **_):  # rlvr's own reward for the task, in TRL's process
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]  # chat: the reply's text
        return [get_verifier(v).score(t, {"answer": a}).score for t, a, v in zip(texts, answer, verifier)]

    class Clock(TrainerCallback):
        """Step ends, rewards, and (time to accuracy) the greedy evaluation, whose time is excluded."""

        def __init__(self):
            self.ends, self.rewards, self.lengths, self.evals = [], [], [], []
            self.eval_s = 0.0

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter() - self.eval_s)
            if spec.get("eval_every") and state.global_step % spec["eval_every"] == 0:
                start = time.perf_counter()
                accuracy = greedy_accuracy(kwargs["model"], tokenizer, spec["eval_limit"], spec["new_tokens"])
                self.evals.append({"step": state.global_step, "accuracy": accuracy, "train_s": self.ends[-1] - self.ends_0})
                self.eval_s += time.perf_counter() - start
                if accuracy >= spec["target"]:
                    control.should_training_stop = True

        def on_train_begin(self, args, state, control, **kwargs):
            self.ends_0 = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                self.rewards.append(logs["reward"])
                self.lengths.append(logs.get("completions/mean_length", float("nan")))

    config = GRPOConfig(
        output_dir=spec["out"], seed=spec["seed"], max_steps=spec["steps"],
        per_device_train_batch_size=spec["prompts"] * spec["group"], num_generations=spec["group"],
        max_completion_length=spec["new_tokens"], temperature=1.0,
        learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=spec.get("warmup", 0),
        max_grad_norm=1.0, beta=spec["beta"], loss_type=spec.get("loss_type", "dapo"), epsilon=0.2,
        logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True, shuffle_dataset=False,
        use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, dataloader_num_workers=0,
    )
    clock = Clock()
    # TRL tokenizes a string prompt with the tokenizer's call defaults, which add no <bos> here; rlvr
    # (and the SFT warm start) put <bos> first: write it into the text so that the ids are the same.
    rows = in_rlvr_order(problems("train", task), spec["seed"], task)  # unshuffled: rlvr's problems at every step
    if task == "arithmetic":
        rows = [{**row, "prompt": tokenizer.bos_token + row["prompt"]} for row in rows]
    dataset = Dataset.from_list(rows)
    trainer = GRPOTrainer(model=model, reward_funcs=exact_answer, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[clock])
    trainer.train()
    ends = [t - clock.ends_0 for t in clock.ends]
    return {"ends": ends, "rewards": clock.rewards, "lengths": clock.lengths, "evals": clock.evals,
            "peak_rss_mib": peak_rss_mib()}


def peak_rss_mib() -> float:
    """This process's peak resident memory (``VmHWM``: unlike ``ru_maxrss`` it does not carry over the
    parent's peak across fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_rlvr(spec: dict) -> dict:
    from rlvr.recipes import grpo
    from rlvr.config import RunConfig, build_config
    from rlvr.configs import load_packaged
    from rlvr.run.tracking import read_metrics

    if spec.get("eval_every"):  # time to accuracy: the quickstart's own config
        base = load_packaged("quickstart.yaml")
        base["eval"] = {"every": spec["eval_every"], "limit": spec["eval_limit"], "at_start": False, "at_end": False}
    else:
        task = spec.get("task", "arithmetic")
        data = {"task": "arithmetic", "options": TASK_OPTIONS} if task == "arithmetic" else {"task": task}
        base = {"data": [data],
                "algorithm": {"preset": "grpo", "loss_agg": "token_mean", "beta": spec["beta"]},
                "eval": {"at_start": False, "at_end": False}}
    overrides = {
        "out": spec["out"], "model": {"path": spec["model"]},
        "generation": {"max_new_tokens": spec["new_tokens"], "temperature": 1.0},
        "optim": {"lr": spec["lr"], "warmup_steps": spec.get("warmup", 0)},
        "train": {"steps": spec["steps"], "prompts_per_step": spec["prompts"], "group_size": spec["group"],
                  "seed": spec["seed"], "threads": spec["threads"], "micro_batch_size": 256},
        "checkpoint": {"every": 0, "at_end": False, "final_model": False},
        "log": {"progress": False, "plot": False},
    }
    config = build_config(RunConfig, _merge(base, overrides))
    grpo.train(config)
    records = [r for r in read_metrics(Path(spec["out"]) / "metrics.jsonl") if "time/step" in r]
    evals, train_s = [], 0.0
    for r in records:
        train_s += r["time/step"] + r.get("time/log", 0.0)
        if "eval/accuracy" in r:  # the first training suite's test split (runs to the step budget: no early stop)
            evals.append({"step": r["step"], "accuracy": r["eval/accuracy"], "train_s": train_s})
    start = records[0]["time"] - records[0]["time/step"]
    return {"ends": [r["time"] - start for r in records], "rewards": [r["reward/mean"] for r in records],
            "lengths": [r["response/length_mean"] for r in records], "evals": evals,
            "peak_rss_mib": peak_rss_mib()}


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


WORKERS = {"trl": run_trl, "rlvr": run_rlvr}


def launch(system: str, spec: dict, root: Path) -> dict:
    """Run one worker in a fresh process; its result."""
    spec_path = root / f"spec_{system}.json"
    result_path = root / f"result_{system}.json"
    spec_path.write_text(json.dumps(spec))
    result_path.unlink(missing_ok=True)
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run([sys.executable, __file__, "--worker", system, "--spec", str(spec_path), "--result", str(result_path)],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{system} run failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(result_path.read_text())


# ---------------------------------------------------------------------------------------------
# The two measurements
# ---------------------------------------------------------------------------------------------


def step_times(ends: list[float]) -> list[float]:
    """Seconds between consecutive step ends, the first step excluded."""
    return [b - a for a, b in zip(ends, ends[1:])]


def step_time_benchmark(args, root: Path) -> None:
    if args.real_model:  # a model users run, on a task users train on
        s, task, model = REAL_SHAPE, "gsm8k", Path(args.real_model)
        print(f"\nstep time on {model} (GSM8K, chat template)", end="")
    else:
        s, task = STEP_SHAPE, "arithmetic"
        model = build_sft_model(root / "step_model", seed=0, layers=s["layers"], threads=args.threads)
        print("\nstep time", end="")
    print(f": {s['prompts']} prompts x {s['group']} samples, up to {s['new_tokens']} new tokens, "
          f"{args.steps} steps, {args.rounds} alternating rounds, {args.threads} threads", flush=True)
    ratios = {}
    for beta in args.betas:
        runs: dict[str, list[dict]] = {"trl": [], "rlvr": []}
        for round_ in range(args.rounds):
            order = ("trl", "rlvr") if round_ % 2 == 0 else ("rlvr", "trl")
            for system in order:
                spec = dict(model=str(model), out=str(root / f"{system}_beta{beta:g}_round{round_}"), seed=round_, steps=args.steps,
                            prompts=s["prompts"], group=s["group"], new_tokens=s["new_tokens"], lr=s["lr"],
                            beta=beta, threads=args.threads, task=task)
                result = launch(system, spec, root)
                runs[system].append(result)
                print(f"  beta {beta} round {round_ + 1} {system:<4}: median step "
                      f"{statistics.median(step_times(result['ends'])) * 1e3:6.1f} ms", flush=True)
        medians = {}
        for system, results in runs.items():
            times = [t for r in results for t in step_times(r["ends"])]
            medians[system] = statistics.median(times)
            lengths = [x for r in results for x in r["lengths"][1:]]
            tokens_s = s["prompts"] * s["group"] * statistics.mean(lengths) / medians[system]
            rewards = [x for r in results for x in r["rewards"]]
            print(f"  beta {beta} {system:<4}: median step {medians[system] * 1e3:6.1f} ms, {tokens_s:6.0f} generated "
                  f"tokens/s, peak RSS {max(r['peak_rss_mib'] for r in results):5.0f} MiB, mean reward per step "
                  f"{statistics.mean(rewards):.3f}")
        ratios[beta] = medians["rlvr"] / medians["trl"]
    print("ratio rlvr/trl median step time: " + " ".join(f"beta{b:g}={r:.2f}" for b, r in ratios.items()))


def time_to_accuracy_benchmark(args, root: Path) -> None:
    s = TTA_SHAPE
    print(f"\ntime to {args.target} greedy test accuracy: {s['prompts']} prompts x {s['group']} samples, {s['new_tokens']} "
          f"new tokens, eval every {s['eval_every']} steps on {s['eval_limit']} problems (eval time excluded), "
          f"at most {args.max_steps} steps, seeds {args.seeds}, learning rates {args.lrs}", flush=True)
    times: dict[tuple[str, float], list[float]] = {}
    budgets: dict[tuple[str, float], list[float]] = {}  # training seconds of the whole step budget
    for seed in args.seeds:
        model = build_sft_model(root / f"tta_model_{seed}", seed=seed, layers=s["layers"], threads=args.threads)
        for lr in args.lrs:
            for system in ("trl", "rlvr") if seed % 2 == 0 else ("rlvr", "trl"):
                spec = dict(model=str(model), out=str(root / f"{system}_tta_seed{seed}_lr{lr:g}"), seed=seed, steps=args.max_steps,
                            prompts=s["prompts"], group=s["group"], new_tokens=s["new_tokens"], lr=lr, beta=0.04,
                            warmup=25, threads=args.threads, eval_every=s["eval_every"], eval_limit=s["eval_limit"],
                            target=args.target)
                result = launch(system, spec, root)
                reached = [e for e in result["evals"] if e["accuracy"] >= args.target]
                seconds = reached[0]["train_s"] if reached else float("inf")
                times.setdefault((system, lr), []).append(seconds)
                budgets.setdefault((system, lr), []).append(result["evals"][-1]["train_s"] if result["evals"] else 0.0)
                curve = " ".join(f"{e['step']}:{e['accuracy']:.2f}" for e in result["evals"][4::5])
                print(f"  seed {seed} lr {lr:g} {system:<4}: " + (f"{seconds:6.1f} s (step {reached[0]['step']})"
                      if reached else f"not reached in {args.max_steps} steps") + f"   [{curve}]", flush=True)
    best, best_lr = {}, {}
    for system in ("trl", "rlvr"):
        medians = {lr: statistics.median(times[(system, lr)]) for lr in args.lrs}
        best_lr[system] = lr = min(medians, key=medians.get)
        best[system] = medians[lr]
        print(f"  {system:<4}: best lr {lr:g}, median time to {args.target}: {best[system]:.1f} s "
              f"({', '.join(f'lr {k:g}: {v:.1f} s' for k, v in medians.items())})")
    print(f"ratio rlvr/trl time to {args.target} accuracy: {tta_ratio(best, budgets, best_lr, args.max_steps)}")


def tta_ratio(best: dict[str, float], budgets: dict, best_lr: dict[str, float], max_steps: int) -> str:
    """The ratio of the median times; when only TRL's median is "never", an upper bound: TRL would
    have needed more than its median training time of the whole step budget."""
    inf = float("inf")
    if best["rlvr"] < inf and best["trl"] < inf:
        return f"{best['rlvr'] / best['trl']:.2f}"
    if best["rlvr"] < inf:
        budget = statistics.median(budgets[("trl", best_lr["trl"])])
        return (f"< {best['rlvr'] / budget:.2f} (TRL's median seed did not reach it in {max_steps} steps, "
                f"{budget:.0f} s of training; the bound uses those seconds)")
    return "n/a (rlvr's median seed did not reach it" + (")" if best["trl"] < inf else ", nor TRL's)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    floats = lambda text: [float(x) for x in text.split(",")]  # noqa: E731
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per beta (step time)")
    parser.add_argument("--steps", type=int, default=20, help="steps per run (step time)")
    parser.add_argument("--betas", type=floats, default=[0.0, 0.04], help="KL coefficients, comma-separated")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads of every run")
    parser.add_argument("--time-to-accuracy", action="store_true", help="measure time to accuracy instead of step time")
    parser.add_argument("--real-model", metavar="DIR",
                        help="step time on this model folder (SmolLM2-135M-Instruct from ../shared/tools/make_smollm2.sh) "
                             "with GSM8K chat prompts and 256 new tokens, instead of the tiny model (use few --steps)")
    parser.add_argument("--seeds", type=lambda t: [int(x) for x in t.split(",")], default=[0, 1, 2],
                        help="time to accuracy: seeds (one SFT model each)")
    parser.add_argument("--lrs", type=floats, default=[1.5e-4, 3e-4], help="time to accuracy: learning rates swept")
    parser.add_argument("--target", type=float, default=0.6, help="time to accuracy: the greedy accuracy to reach")
    parser.add_argument("--max-steps", type=int, default=1200, help="time to accuracy: step budget per run (the slow seeds need ~900-1,200 steps)")
    parser.add_argument("--out", help="working folder (default: a temporary one)")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        result = WORKERS[args.worker](json.loads(Path(args.spec).read_text()))
        Path(args.result).write_text(json.dumps(result))
        return 0
    try:
        import trl  # noqa: F401
    except ImportError:
        sys.exit("TRL is not installed: pip install -r benchmarks/requirements-trl.txt")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        root.mkdir(parents=True, exist_ok=True)
        if args.time_to_accuracy:
            time_to_accuracy_benchmark(args, root)
        else:
            step_time_benchmark(args, root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
