"""The embedded default: prove on a CPU that reinforcement learning makes a model better.

    1. build a tiny character-level Llama (~0.5M parameters) with ``save_pretrained``
    2. SFT-bootstrap it on 3-digit addition until it is right ~30% of the time (held-out dev set)
    3. GRPO against the ``numeric`` verifier, greedy accuracy on 500 held-out test problems
       measured before and after
    4. print accuracy before -> after; write summary.json, metrics, plots, checkpoints

Everything lands in one run folder: ``base_model/``, ``sft/``, and at the top the GRPO run
(``config.yaml``, ``metrics.jsonl``, ``metrics.png``, ``checkpoints/``, ``final/``) and ``summary.json``.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any, Sequence

import yaml

from rlvr.config import RunConfig, SFTConfig, build_config
from rlvr.configs import load_packaged
from rlvr.suites import eval_entries


def eval_command(config: RunConfig, *, samples: int = 8, ks: str = "1,8") -> str:
    """The ``rlvr eval`` line that measures a run's final model on the first suite its evaluation used.

    The suite's options (the quickstart's bare ``7+345=`` prompts) and the generation budget must be
    the ones the model was trained with; a plain ``--task arithmetic`` would ask it chat-formatted
    questions it has never seen, and score 0.
    """
    suite = eval_entries(config)[0]
    words = ["rlvr", "eval", "--model", str(Path(config.out) / "final"), "--task", suite.task, "--split", suite.split]
    if suite.path is not None:
        words += ["--path", suite.path]
    for key, value in suite.options.items():
        text = value if isinstance(value, str) and yaml.safe_load(value) == value else json.dumps(value)
        words += ["--task-option", f"{key}={text}"]
    max_new_tokens = config.eval.max_new_tokens or config.generation.max_new_tokens  # as the run's evaluation
    words += ["--limit", str(suite.limit), "--max-new-tokens", str(max_new_tokens), "--samples", str(samples), "--k", ks]
    return shlex.join(words)


#: The RL stage's packaged config, by ``--algorithm``.
STAGE_CONFIGS = {"grpo": "quickstart.yaml", "ppo": "quickstart_ppo.yaml"}


def quickstart(out: str | Path | None = None, *, seed: int = 0, steps: int | None = None, device: str = "auto",
               progress: bool = True, overrides: Sequence[str] = (), overwrite: bool = False,
               algorithm: str = "grpo") -> dict[str, Any]:
    """Run the four stages; ``overrides`` (``key=value``) apply to the RL stage's config, which
    ``algorithm`` picks (grpo, or ppo: PPO with a learned critic).
    ``overwrite`` replaces an earlier quickstart in ``out`` (else such a folder is refused)."""
    from rlvr import sft
    from rlvr.recipes import train
    from rlvr.models import build_tiny_model
    from rlvr.run_folder import RUN_FILES, prepare_run_folder
    from rlvr.runtime import quiet_transformers

    quiet_transformers()
    started = time.perf_counter()
    run_dir = prepare_run_folder(out, name="quickstart", overwrite=overwrite, outputs=RUN_FILES + ("base_model", "sft"))
    print(f"run folder: {run_dir}", flush=True)

    print(f"[1/3] building a tiny model -> {run_dir / 'base_model'}")
    build_tiny_model(run_dir / "base_model", seed=seed)

    print("[2/3] SFT bootstrap until held-out greedy accuracy reaches 0.30")
    sft_config = build_config(
        SFTConfig, load_packaged("quickstart_sft.yaml"),
        [f"out={run_dir / 'sft'}", f"model.path={run_dir / 'base_model'}", f"train.seed={seed}",
         f"train.device={device}", f"log.progress={progress}"],
        source="quickstart_sft.yaml",
    )
    sft_summary = sft.train(sft_config)
    print(f"      SFT stopped after {sft_summary['steps']} steps at dev accuracy {sft_summary['eval_accuracy']:.3f}")

    if algorithm not in STAGE_CONFIGS:
        raise ValueError(f"algorithm: unknown quickstart algorithm {algorithm!r}; valid: {', '.join(STAGE_CONFIGS)}")
    name = algorithm.upper()
    print(f"[3/3] {name} against the `numeric` verifier")
    run_overrides = [f"out={run_dir}", f"model.path={run_dir / 'sft' / 'final'}", f"train.seed={seed}",
                     f"train.device={device}", f"log.progress={progress}"]
    if steps is not None:
        run_overrides.append(f"train.steps={steps}")
    run_config = build_config(RunConfig, load_packaged(STAGE_CONFIGS[algorithm]), [*run_overrides, *overrides],
                              source=STAGE_CONFIGS[algorithm])
    summary = train(run_config)

    summary.update({
        "wall_s": time.perf_counter() - started,
        f"{algorithm}_wall_s": summary["wall_s"],
        "sft_steps": sft_summary["steps"],
        "sft_dev_accuracy": sft_summary["eval_accuracy"],
        "eval_problems": run_config.eval.limit,
        "model": str(run_dir / "final"),
        "eval_command": eval_command(run_config),
    })
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    before, after = summary["accuracy_before"], summary["accuracy_after"]
    print(f"\ngreedy accuracy on {run_config.eval.limit} held-out problems: "
          f"before {name} {before:.3f} -> after {after:.3f} ({after - before:+.3f})")
    print(f"wall time {summary['wall_s']:.0f} s; run folder: {run_dir} (summary.json, metrics.jsonl, metrics.png)")
    print(f"pass@1 and pass@8 of the trained model: {summary['eval_command']}")
    return summary
