"""``rlvr quickstart``."""

from __future__ import annotations

import argparse

from rlvr.commands import HelpFormatter
from rlvr.configs import load_packaged


#: The settings a quickstart keeps for --resume, with their defaults.
SETTINGS = {"seed": 0, "steps": None, "algorithm": "grpo", "reward_model": False, "task": "arithmetic"}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "quickstart", formatter_class=HelpFormatter,
        help="build a tiny model, SFT-bootstrap it, train it with GRPO, print accuracy before -> after",
        description="The embedded default run (5-7 minutes on a busy 2-core CPU, about 3-4 min idle): builds a tiny character-level "
        "model, SFT-bootstraps it on 3-digit addition, trains it with GRPO against the `numeric` verifier, and "
        "prints greedy accuracy on 500 held-out problems before and after. Writes a run folder with the resolved "
        "config, metrics.jsonl, plots, checkpoints and summary.json.",
    )
    p.add_argument("--out", default=None, help="run folder (default: runs/quickstart-<timestamp>)")
    p.add_argument("--seed", type=int, default=SETTINGS["seed"], help="seed for the model, data order and sampling")
    p.add_argument("--algorithm", choices=["grpo", "ppo"], default=SETTINGS["algorithm"],
                   help="the RL stage: grpo (group baselines, rlvr/configs/quickstart.yaml) or ppo (a learned critic, "
                   "rlvr/configs/quickstart_ppo.yaml)")
    p.add_argument("--reward-model", action="store_true",
                   help="RLHF with a learned reward: SFT to dev accuracy 0.40, preference pairs from the SFT model's "
                   "samples (up to 4 per problem), a reward model on them (arithmetic_rm.yaml; its own greedy accuracy "
                   "is printed: RL against it heads there), then RL against it (arithmetic_grpo_rm.yaml, or "
                   "arithmetic_ppo_rm.yaml with --algorithm ppo); the exact verifier only watches (gold accuracy); "
                   "about 5 min on an idle 2-core CPU (docs/reward-models.md)")
    p.add_argument("--task", choices=["arithmetic", "tools"], default=SETTINGS["task"],
                   help="arithmetic: 3-digit addition, one answer per prompt; tools: 3-digit multiplication where the "
                   "model writes a ```python block, reads its sandboxed output in the next turn and answers "
                   "(multi-turn episodes, tool output masked from the loss; rlvr/configs/quickstart_tools_sft.yaml and "
                   "quickstart_tools.yaml; about 4 min on an idle 2-core CPU; GRPO only; docs/environments.md)")
    p.add_argument("--steps", type=int, default=None, help=f"RL steps (default: the packaged config's {load_packaged('quickstart.yaml')['train']['steps']})")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N or auto (default auto: cuda when there is one); "
                   "with --resume, the device the quickstart continues on, in place of the one it started on")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress reports at all (without a terminal they are plain lines every few steps anyway)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier quickstart in --out (else refused)")
    p.add_argument("--resume", nargs="?", const=True, default=None, metavar="RUN_DIR",
                   help="continue an interrupted quickstart (RUN_DIR, or --out) with the settings it started with: "
                   "finished stages are kept, the interrupted one continues from its last checkpoint")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="overrides of the RL stage's config, e.g. train.prompts_per_step=16")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlvr.recipes.quickstart import quickstart
    from rlvr.verifiers.errors import InvalidValueError

    out = args.resume if isinstance(args.resume, str) else args.out
    if args.resume:
        changed = [f"--{name.replace('_', '-')}" for name, default in SETTINGS.items() if getattr(args, name) != default]
        changed += ["key=value"] if args.overrides else []
        if changed:
            raise InvalidValueError(f"--resume continues the quickstart with the settings it started with (its "
                                    f"quickstart.json); leave out {', '.join(changed)}")
        if out is None:
            raise InvalidValueError("--resume needs the quickstart's folder: --resume RUN_DIR")
    quickstart(out, seed=args.seed, steps=args.steps, device=args.device, progress=not args.no_progress,
               overrides=args.overrides, overwrite=args.overwrite, algorithm=args.algorithm,
               reward_model=args.reward_model, resume=bool(args.resume), task=args.task)
    return 0
