"""The embedded default: prove on a CPU that reinforcement learning makes a model better.

    1. build a tiny character-level Llama (~0.5M parameters) with ``save_pretrained``
    2. SFT-bootstrap it on 3-digit addition until it is right ~30% of the time (held-out dev set)
    3. GRPO against the ``numeric`` verifier, greedy accuracy on 500 held-out test problems
       measured before and after
    4. print accuracy before -> after; write summary.json, metrics, plots, checkpoints

Everything lands in one run folder: ``base_model/``, ``sft/``, and at the top the GRPO run
(``config.yaml``, ``metrics.jsonl``, ``metrics.png``, ``checkpoints/``, ``final/``) and ``summary.json``.

``reward_model=True`` (``rlvr quickstart --reward-model``) is RLHF with a learned reward instead:
after SFT, preference pairs from the SFT model's own samples (``preferences.jsonl``), a Bradley-Terry
reward model on them (``rm/``, ``arithmetic_rm.yaml``), then GRPO against that reward model
(``arithmetic_grpo_rm.yaml``) with the exact verifier only watching (gold accuracy before -> after).
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any, Sequence

import yaml

from rlvr.config import RunConfig, build_config

from rlvr.offline_configs import SFTConfig
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
#: The RL stage against a learned reward model (``--reward-model``), by ``--algorithm``.
RM_STAGE_CONFIGS = {"grpo": "arithmetic_grpo_rm.yaml", "ppo": "arithmetic_ppo_rm.yaml"}
#: ``rlvr preferences`` as the reward-model quickstart runs it (docs/reward-models.md measured these).
PREFERENCE_SAMPLING = dict(samples=8, limit=7000, max_new_tokens=5, temperature=1.0)


def quickstart(out: str | Path | None = None, *, seed: int = 0, steps: int | None = None, device: str = "auto",
               progress: bool = True, overrides: Sequence[str] = (), overwrite: bool = False,
               algorithm: str = "grpo", reward_model: bool = False) -> dict[str, Any]:
    """Run the stages; ``overrides`` (``key=value``) apply to the RL stage's config, which
    ``algorithm`` picks (grpo, or ppo: PPO with a learned critic). ``reward_model``: RL against a reward
    model trained on preferences from the SFT model's samples (see the module docstring).
    ``overwrite`` replaces an earlier quickstart in ``out`` (else such a folder is refused)."""
    from rlvr import sft
    from rlvr.recipes import train
    from rlvr.models import build_tiny_model
    from rlvr.run_folder import RUN_FILES, prepare_run_folder
    from rlvr.runtime import quiet_transformers

    quiet_transformers()
    started = time.perf_counter()
    if algorithm not in STAGE_CONFIGS:
        raise ValueError(f"algorithm: unknown quickstart algorithm {algorithm!r}; valid: {', '.join(STAGE_CONFIGS)}")
    stages = 5 if reward_model else 3
    run_dir = prepare_run_folder(out, name="quickstart", overwrite=overwrite,
                                 outputs=RUN_FILES + ("base_model", "sft", "rm", "preferences.jsonl"))
    print(f"run folder: {run_dir}", flush=True)

    print(f"[1/{stages}] building a tiny model -> {run_dir / 'base_model'}")
    build_tiny_model(run_dir / "base_model", seed=seed)

    print(f"[2/{stages}] SFT bootstrap until held-out greedy accuracy reaches 0.30")
    sft_config = build_config(
        SFTConfig, load_packaged("quickstart_sft.yaml"),
        [f"out={run_dir / 'sft'}", f"model.path={run_dir / 'base_model'}", f"train.seed={seed}",
         f"train.device={device}", f"log.progress={progress}"],
        source="quickstart_sft.yaml",
    )
    sft_summary = sft.train(sft_config)
    print(f"      SFT stopped after {sft_summary['steps']} steps at dev accuracy {sft_summary['eval_accuracy']:.3f}")

    name = algorithm.upper()
    stage_config = (RM_STAGE_CONFIGS if reward_model else STAGE_CONFIGS)[algorithm]
    run_overrides = [f"out={run_dir}", f"model.path={run_dir / 'sft' / 'final'}", f"train.seed={seed}",
                     f"train.device={device}", f"log.progress={progress}"]
    if steps is not None:
        run_overrides.append(f"train.steps={steps}")
    rm_summary = None
    if reward_model:
        rm_summary = _reward_model_stages(run_dir, load_packaged(stage_config), seed=seed, device=device, progress=progress)
        run_overrides.append(f"reward_model.path={run_dir / 'rm' / 'final'}")
    print(f"[{stages}/{stages}] {name} against " + ("the reward model (the `numeric` verifier only watches: gold)"
                                                   if reward_model else "the `numeric` verifier"))
    run_config = build_config(RunConfig, load_packaged(stage_config), [*run_overrides, *overrides], source=stage_config)
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
    if rm_summary is not None:
        summary.update({"pairwise_accuracy": rm_summary["pairwise_accuracy"], "preference_pairs": rm_summary["pairs"],
                        "reward_model": rm_summary["model"]})
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    before, after = summary["accuracy_before"], summary["accuracy_after"]
    print(f"\n{'gold ' if reward_model else ''}greedy accuracy on {run_config.eval.limit} held-out problems: "
          f"before {name} {before:.3f} -> after {after:.3f} ({after - before:+.3f})")
    if reward_model:
        fired = [a for a in summary["alarms"] if a["alarm"] == "gold_vs_proxy"]
        print(f"reward model: held-out pairwise accuracy {summary['pairwise_accuracy']:.3f}; gold-vs-proxy alarm: "
              + (f"fired at step {fired[0]['step']}" if fired else "never fired"))
    print(f"wall time {summary['wall_s']:.0f} s; run folder: {run_dir} (summary.json, metrics.jsonl, metrics.png)")
    print(f"pass@1 and pass@8 of the trained model: {summary['eval_command']}")
    return summary


def _reward_model_stages(run_dir: Path, rl_config: dict, *, seed: int, device: str, progress: bool) -> dict[str, Any]:
    """Preference pairs from the SFT model's samples on the RL task, then a reward model on them (``rm/``)."""
    from rlvr import reward_model
    from rlvr.offline_configs import RewardModelConfig
    from rlvr.preferences import build_preferences

    sft_model, task = run_dir / "sft" / "final", rl_config["data"][0]
    p = PREFERENCE_SAMPLING
    print(f"[3/5] preference pairs: {p['samples']} samples of the SFT model on each of {p['limit']} problems, a right "
          "answer paired with a wrong one (`rlvr preferences`)")
    stats = build_preferences(str(sft_model), task["task"], run_dir / "preferences.jsonl", split=task.get("split", "train"),
                              options=task.get("options", {}), seed=seed, device=device, workers=0, progress=progress, **p)
    print(f"      {stats['pairs']} pairs; {stats['sample_accuracy']:.3f} of the samples were right")
    print("[4/5] Bradley-Terry reward model on the pairs (`rlvr train-rm`, arithmetic_rm.yaml)")
    rm_config = build_config(
        RewardModelConfig, load_packaged("arithmetic_rm.yaml"),
        [f"out={run_dir / 'rm'}", f"model.path={sft_model}", f"data.path={run_dir / 'preferences.jsonl'}",
         f"train.seed={seed}", f"train.device={device}", f"log.progress={progress}"], source="arithmetic_rm.yaml")
    summary = reward_model.train(rm_config)
    print(f"      held-out pairwise accuracy {summary['pairwise_accuracy']:.3f}")
    return {**summary, "pairs": stats["pairs"]}
