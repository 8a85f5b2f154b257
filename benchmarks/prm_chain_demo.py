"""The process-reward demonstration on ``chain_arithmetic``: SFT a tiny model on the gold step-by-step
solutions, sample its own completions, label each step with the task's checker
(:func:`rlvr.tasks.chain_arithmetic.label_steps`), train a PRM on those labels (``rlvr train-prm``
from the SFT model), then PPO from the SFT model twice, side by side: with the verifier's outcome
reward only, and with the PRM's step rewards added (``process_reward.path``). Prints the PRM's
held-out step accuracy before -> after, and for each PPO run the held-out (gold) accuracy curve, its
final value and the first evaluated step at or above 0.6.

    python benchmarks/prm_chain_demo.py --out runs/prm_demo [--sft-steps 600] [--problems 1500] [--samples 4]
        [--ppo-steps 200] [--seed 0] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

OPTIONS = {"style": "bare", "max_operand": 5, "ops": "+-*"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/prm_demo", help="folder for the model, data and runs")
    parser.add_argument("--sft-steps", type=int, default=600, help="SFT steps at most (stops at --sft-accuracy)")
    parser.add_argument("--sft-accuracy", type=float, default=0.3, help="stop SFT at this greedy dev accuracy (room for RL to help)")
    parser.add_argument("--problems", type=int, default=1500, help="training problems sampled for PRM data")
    parser.add_argument("--samples", type=int, default=4, help="completions sampled per problem")
    parser.add_argument("--gold", action="store_true", help="add each sampled problem's gold solution (all steps "
                        "good) to the PRM data: the policy's own samples rarely get the last step right, and a PRM "
                        "trained on them alone learns that a last step is wrong")
    parser.add_argument("--prm-epochs", type=float, default=2.0, help="passes over the PRM data")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto")
    parser.add_argument("--ppo-steps", type=int, default=200, help="PPO steps of each run (0: stop after the PRM)")
    parser.add_argument("--seed", type=int, default=0, help="the PPO runs' train.seed")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each of the two PPO runs")
    parser.add_argument("--prm-coef", type=float, default=None, help="process_reward.coef of the PRM run (default: "
                        "the config's)")
    parser.add_argument("--prm-step-reward", default=None, help="process_reward.step_reward of the PRM run (delta, "
                        "shifted)")
    parser.add_argument("--prm-baseline", type=float, default=None, help="process_reward.baseline of the PRM run")
    parser.add_argument("--prm-base-accuracy", type=float, default=None,
                        help="start the PRM from a second, longer SFT of the same tiny model, stopped at this dev "
                        "accuracy (OUT/sft_prm_base), instead of the policy's SFT model: a stronger grader of the "
                        "same samples, as PRMs are often larger than their policies")
    parser.add_argument("--prm-base", default=None, help="start the PRM from this model folder (e.g. an earlier "
                        "OUT/sft_prm_base/final) instead of training one for --prm-base-accuracy")
    parser.add_argument("--from-stage", type=int, default=1, choices=(1, 2, 3, 4),
                        help="skip the stages before this one, reusing their outputs in OUT (2: OUT/sft/final; "
                        "3: also OUT/prm_data.jsonl; 4: also OUT/prm/final)")
    parser.add_argument("--tag", default="", help="suffix of the PPO run folders (compare settings side by side)")
    args = parser.parse_args()
    out = Path(args.out)
    overrides = [f"process_reward.{key}={value}" for key, value in (("coef", args.prm_coef), ("step_reward", args.prm_step_reward),
                                                                    ("baseline", args.prm_baseline)) if value is not None]

    from rlvr.config import SFTConfig, build_config
    from rlvr.modeling.tiny import build_tiny_model
    from rlvr.recipes import sft

    started = time.perf_counter()
    base = out / "tiny"

    def supervised(folder: str, accuracy: float, steps: int) -> Path:
        """SFT of the tiny model on gold solutions until dev accuracy ``accuracy`` (or ``steps``)."""
        sft.train(build_config(SFTConfig, {
            "out": str(out / folder), "model": {"path": str(base)},
            "data": {"task": "chain_arithmetic", "options": OPTIONS},
            "optim": {"lr": 2e-3}, "train": {"steps": steps, "batch_size": 128, "device": args.device},
            "eval": {"every": 25, "task": "chain_arithmetic", "options": OPTIONS, "split": "dev", "limit": 200,
                     "max_new_tokens": 40, "stop_at_accuracy": accuracy},
            "checkpoint": {"every": 0}, "log": {"progress": False, "plot_every": 0},
        }), overwrite=True)
        return out / folder / "final"

    model_path = out / "sft" / "final"
    if args.from_stage <= 1:
        build_tiny_model(base, seed=0)
        print("[1/4] SFT on the gold step-by-step solutions", flush=True)
        supervised("sft", args.sft_accuracy, args.sft_steps)
    data = out / "prm_data.jsonl"
    if args.from_stage <= 2:
        sample_and_label(args, model_path, data)
    if args.from_stage <= 3:
        prm_base = Path(args.prm_base) if args.prm_base else model_path
        if args.prm_base_accuracy is not None and not args.prm_base:
            print(f"[3/4] a longer SFT of the tiny model (to dev accuracy {args.prm_base_accuracy}), the PRM's start",
                  flush=True)
            prm_base = supervised("sft_prm_base", args.prm_base_accuracy, 4 * args.sft_steps)
        train_the_prm(args, prm_base, data, out)
        print(f"{time.perf_counter() - started:.0f} s so far", flush=True)
    if args.ppo_steps:
        compare_ppo(out, model_path, out / "prm" / "final", args.ppo_steps, args.seed, args.threads, overrides, args.tag)


def sample_and_label(args, model_path: Path, data: Path) -> None:
    from rlvr.engines import SamplingParams, build_engine
    from rlvr.modeling.loading import load_policy, load_tokenizer
    from rlvr.rollout.evaluate import evaluate
    from rlvr.rollout.suites import PromptEncoder
    from rlvr.run.runtime import resolve_device
    from rlvr.tasks import get_task
    from rlvr.tasks.chain_arithmetic import write_prm_data
    from rlvr.verifiers.runner import VerifierRunner

    print("[2/4] sample the SFT model's own completions and label their steps", flush=True)
    device = str(resolve_device(args.device, "--device"))
    tokenizer = load_tokenizer(model_path)
    policy = load_policy(model_path, device=device).eval()
    problems = list(get_task("chain_arithmetic", split="train", n=args.problems, seed=1, **OPTIONS))
    with VerifierRunner(workers=0) as runner:
        result = evaluate(build_engine("hf", policy, tokenizer), PromptEncoder(tokenizer), problems, runner,
                          samples=args.samples, keep_records=True,
                          sampling=SamplingParams(max_new_tokens=40, temperature=1.0))
    samples = [(p, text) for p, record in zip(problems, result.records) for text in record["completions"]]
    if args.gold:
        samples += [(p, p.solution) for p in problems]
    rows = write_prm_data(samples, data)
    labels = [label for line in data.read_text().splitlines() for label in json.loads(line)["labels"]]
    print(f"sample accuracy {result.accuracy:.3f}; {rows} labelled completions, {len(labels)} steps, "
          f"{sum(labels) / len(labels):.3f} of them good", flush=True)


def train_the_prm(args, model_path: Path, data: Path, out: Path) -> None:
    from rlvr.config import PRMConfig, build_config
    from rlvr.recipes import train_prm

    print(f"[3/4] train the PRM on those labels (rlvr train-prm), from {model_path}", flush=True)
    prm_config = build_config(PRMConfig, {
        "out": str(out / "prm"), "model": {"path": str(model_path)}, "data": {"path": str(data), "eval_fraction": 0.1},
        "optim": {"lr": 1e-3}, "train": {"epochs": args.prm_epochs, "batch_size": 32, "device": args.device},
        "eval": {"every": 50}, "checkpoint": {"every": 0}, "log": {"progress": False},
    })
    summary = train_prm.train(prm_config, overwrite=True)
    print(f"held-out step accuracy: {summary['step_accuracy_before']:.3f} -> {summary['step_accuracy']:.3f} "
          f"({summary['eval_steps']} steps; majority label {summary['majority_accuracy']:.3f}; first error "
          f"{summary['first_error_accuracy']:.3f})", flush=True)


def ppo_command(model: Path, out: Path, steps: int, seed: int, threads: int, prm: Path | None,
                overrides: list[str]) -> list[str]:
    import rlvr.configs

    config = Path(rlvr.configs.__file__).parent / "chain_ppo.yaml"
    return [sys.executable, "-m", "rlvr.cli", "train", str(config), f"model.path={model}", f"out={out}",
            f"train.steps={steps}", f"train.seed={seed}", f"train.threads={threads}", "log.progress=false",
            *([f"process_reward.path={prm}", *overrides] if prm else []), "--overwrite"]


def compare_ppo(out: Path, model: Path, prm: Path, steps: int, seed: int, threads: int, overrides: list[str],
                tag: str = "") -> None:
    """PPO with the outcome reward only and PPO with the PRM's step rewards, as two processes at once."""
    print(f"[4/4] PPO, outcome reward only vs outcome + PRM step rewards {' '.join(overrides)}: {steps} steps each, "
          "side by side", flush=True)
    started = time.perf_counter()
    variants = {f"outcome{tag}": None, f"outcome+prm{tag}": prm}
    runs = {name: subprocess.Popen(ppo_command(model, out / f"ppo_{name}", steps, seed, threads, path, overrides),
                                   stdout=subprocess.DEVNULL, stderr=open(out / f"ppo_{name}.log", "w"))
            for name, path in variants.items()}
    for name, process in runs.items():
        if process.wait() != 0:
            sys.exit(f"PPO {name} failed: see {out / f'ppo_{name}.log'}")
    print(f"both done in {time.perf_counter() - started:.0f} s", flush=True)
    for name in variants:
        summary = json.loads((out / f"ppo_{name}" / "summary.json").read_text())
        curve = {int(k): round(v["eval/accuracy"], 3) for k, v in summary["evaluations"].items()}
        reached = next((k for k, v in sorted(curve.items()) if v >= 0.6), None)
        print(f"{name:12s} gold accuracy {summary['accuracy_before']:.3f} -> {summary['accuracy_after']:.3f}; "
              f"first step at >= 0.6: {reached if reached is not None else 'not reached'}; "
              f"wall {summary['wall_s']:.0f} s; curve {curve}", flush=True)


if __name__ == "__main__":
    main()
