"""The embedded default: prove on a CPU that reinforcement learning makes a model better.

    1. build a tiny character-level Llama (~0.5M parameters) with ``save_pretrained``
    2. SFT-bootstrap it on 3-digit addition until it is right ~30% of the time (held-out dev set)
    3. GRPO against the ``numeric`` verifier, greedy accuracy on 500 held-out test problems
       measured before and after
    4. print accuracy before -> after; write summary.json, metrics, plots, checkpoints

Everything lands in one run folder: ``base_model/``, ``sft/``, and at the top the GRPO run
(``config.yaml``, ``metrics.jsonl``, ``metrics.png``, ``checkpoints/``, ``final/``) and ``summary.json``.

``reward_model=True`` (``rlvr quickstart --reward-model``) is RLHF with a learned reward instead:
after SFT (to dev accuracy 0.40), preference pairs from the SFT model's own samples
(``preferences.jsonl``), a Bradley-Terry reward model on them (``rm/``, ``arithmetic_rm.yaml``; its own
greedy accuracy is measured, as it is where RL against it heads), then GRPO against that reward model
(``arithmetic_grpo_rm.yaml``) with the exact verifier only watching (gold accuracy before -> after).
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
from rlvr.recipes.scaffold import RunInterrupted
from rlvr.rollout.suites import eval_entries
from rlvr.run.folder import run_files
from rlvr.verifiers.errors import InvalidValueError


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
        text = value if isinstance(value, str) and _reads_back(value) else json.dumps(value)
        words += ["--task-option", f"{key}={text}"]
    max_new_tokens = config.eval.max_new_tokens or config.generation.max_new_tokens  # as the run's evaluation
    words += ["--limit", str(suite.limit), "--max-new-tokens", str(max_new_tokens), "--samples", str(samples), "--k", ks]
    env = config.environment
    if env.name or env != type(env)():  # the run's episodes: same environment, budgets and token layout
        words += ["--environment", env.name] if env.name else []
        words += [arg for key, value in env.options.items() for arg in ("--env-option", f"{key}={json.dumps(value)}")]
        words += ["--max-turns", str(env.max_turns), "--max-episode-tokens", str(env.max_episode_tokens),
                  "--env-messages", env.messages]
    return shlex.join(words)


def _reads_back(text: str) -> bool:
    """Whether ``text`` given as ``key=text`` reads back as itself (YAML), so it needs no quoting."""
    try:
        return yaml.safe_load(text) == text
    except yaml.YAMLError:  # "*" is an alias marker
        return False


#: The RL stage's packaged config, by ``--algorithm``.
STAGE_CONFIGS = {"grpo": "quickstart.yaml", "ppo": "quickstart_ppo.yaml"}
#: The quickstart's tasks (``--task``): ``tools`` is 3-digit multiplication with the sandboxed python tool.
TASKS = ("arithmetic", "tools")
#: The tool quickstart's SFT and RL stages.
TOOL_CONFIGS = {"sft": "quickstart_tools_sft.yaml", "grpo": "quickstart_tools.yaml"}
#: The RL stage against a learned reward model (``--reward-model``), by ``--algorithm``.
RM_STAGE_CONFIGS = {"grpo": "arithmetic_grpo_rm.yaml", "ppo": "arithmetic_ppo_rm.yaml"}
#: Where the reward-model quickstart's SFT stops (dev accuracy; the other quickstarts stop at 0.30): the
#: reward model learns from the SFT model's own samples, and 60 more SFT steps past 0.30 took seed 2's
#: from 0.41 to 0.71 greedy accuracy (docs/reward-models.md).
RM_SFT_STOP = 0.40
#: ``rlvr preferences`` as the reward-model quickstart runs it (docs/reward-models.md measured these).
PREFERENCE_SAMPLING = dict(samples=8, limit=7000, max_new_tokens=5, temperature=1.0, pairs_per_prompt=4)
#: What a quickstart writes besides an RL run's files, and the file that keeps its settings for --resume.
SETTINGS_FILE = "quickstart.json"
QUICKSTART_FILES = ("base_model", "sft", "rm", "preferences.jsonl", SETTINGS_FILE)


def quickstart(out: str | Path | None = None, *, seed: int = 0, steps: int | None = None, device: str | None = None,
               progress: bool = True, overrides: Sequence[str] = (), overwrite: bool = False,
               algorithm: str = "grpo", reward_model: bool = False, resume: bool = False,
               task: str = "arithmetic") -> dict[str, Any]:
    """Run the stages; ``overrides`` (``key=value``) apply to the RL stage's config, which
    ``algorithm`` picks (grpo, or ppo: PPO with a learned critic). ``reward_model``: RL against a reward
    model trained on preferences from the SFT model's samples (see the module docstring).
    ``overwrite`` replaces an earlier quickstart in ``out`` (else such a folder is refused); ``resume``
    continues one in ``out`` with the settings it started with (``quickstart.json``), except ``device``
    when one is given: finished stages are kept, an interrupted one continues from its checkpoint.
    ``task="tools"``: 3-digit multiplication with the sandboxed ``python`` tool (multi-turn episodes;
    GRPO only, no reward model).

    Every stage's config, the device and the folder are checked before the first stage starts; a
    quickstart that fails before its SFT stage has trained a step leaves its folder as it found it (an
    ``--overwrite`` puts the quickstart it was replacing back)."""
    from rlvr.run.folder import RUN_FILES, RunFolderError, prepare_run_folder
    from rlvr.run.runtime import quiet_transformers, resolve_device

    quiet_transformers()
    started = time.perf_counter()
    if resume:
        folder_path = Path(out) if out is not None else None
        saved = folder_path / SETTINGS_FILE if folder_path is not None else None
        if saved is None or not saved.is_file():
            raise RunFolderError(f"--resume {out}: no {SETTINGS_FILE} there (a quickstart writes it when it starts); "
                                 "start it again with the same --out and no --resume")
        settings = json.loads(saved.read_text())
        if device is not None:  # the one setting a resume may change: the machine it continues on
            settings["device"] = device
    else:
        settings = dict(seed=seed, steps=steps, device=device or "auto", overrides=list(overrides),
                        algorithm=algorithm, reward_model=reward_model, task=task)
    _check_settings(settings)
    resolve_device(settings["device"], "--device")  # a device this machine lacks: one line, nothing written
    folder = prepare_run_folder(out, name="quickstart", resume=resume, overwrite=overwrite,
                                outputs=RUN_FILES + QUICKSTART_FILES)
    run_dir = folder.path
    try:
        configs = _stage_configs(run_dir, progress=progress, **settings)  # a wrong key fails before SFT starts
    except BaseException:
        folder.abandon()  # a folder it made is removed again
        raise
    print(f"run folder: {run_dir}" + (" (resuming)" if resume else ""), flush=True)
    folder.begin()
    (run_dir / SETTINGS_FILE).write_text(json.dumps(settings, indent=2))
    try:
        summary = _stages(run_dir, configs, resume=resume, progress=progress, **settings)
    except BaseException as exc:
        if run_files(run_dir / "sft"):  # the SFT stage trained: the new quickstart is the folder's, resumable
            folder.keep()
        else:
            folder.abandon()
        if not isinstance(exc, KeyboardInterrupt):
            raise
        what = exc.what if isinstance(exc, RunInterrupted) else "interrupted"
        if folder.state == "abandoned" and not resume:
            raise RunInterrupted(f"{what} before the SFT stage's first step: {run_dir} is as it was before the start",
                                 "the same command", run_dir=run_dir, step=None, resumable=False) from None
        # the stage's own resume command would skip the other stages
        raise RunInterrupted(what, f"rlvr quickstart --resume {run_dir}", run_dir=run_dir, step=None) from None
    summary["wall_s"] = time.perf_counter() - started
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    _report(summary, run_dir, settings["algorithm"], settings["reward_model"])
    return summary


def _check_settings(settings: dict[str, Any]) -> None:
    """The quickstart's task, algorithm and reward model fit together (one line each, before anything is written)."""
    task, algorithm, reward_model = settings["task"], settings["algorithm"], settings["reward_model"]
    if task not in TASKS:
        raise InvalidValueError(f"--task: unknown quickstart task {task!r}; valid: {', '.join(TASKS)}")
    if algorithm not in STAGE_CONFIGS:
        raise InvalidValueError(f"--algorithm: unknown quickstart algorithm {algorithm!r}; valid: "
                                f"{', '.join(STAGE_CONFIGS)}")
    if task == "tools" and (algorithm not in TOOL_CONFIGS or reward_model):
        raise InvalidValueError("--task tools: the tool quickstart trains with GRPO against the verifier; leave out "
                                + ("--reward-model" if reward_model else f"--algorithm {algorithm}"))


def _stage_configs(run_dir: Path, *, seed: int, steps: int | None, device: str, overrides: list[str], algorithm: str,
                   reward_model: bool, progress: bool, task: str = "arithmetic") -> dict[str, Any]:
    """Every stage's config, validated before the first stage runs: ``sft``, ``rm`` (with ``--reward-model``,
    else None) and ``rl`` (the RL stage, with the user's ``overrides``)."""
    from rlvr.config import RewardModelConfig

    common = [f"train.seed={seed}", f"train.device={device}", f"log.progress={progress}"]
    tools = task == "tools"
    sft_file = TOOL_CONFIGS["sft"] if tools else "quickstart_sft.yaml"
    sft_overrides = [f"out={run_dir / 'sft'}", f"model.path={run_dir / 'base_model'}", *common]
    if reward_model:
        sft_overrides.append(f"eval.stop_at_accuracy={RM_SFT_STOP}")
    stage_file = TOOL_CONFIGS[algorithm] if tools else (RM_STAGE_CONFIGS if reward_model else STAGE_CONFIGS)[algorithm]
    rl_overrides = [f"out={run_dir}", f"model.path={run_dir / 'sft' / 'final'}", *common]
    if steps is not None:
        rl_overrides.append(f"train.steps={steps}")
    if reward_model:
        rl_overrides.append(f"reward_model.path={run_dir / 'rm' / 'final'}")
    rm = None if not reward_model else build_config(
        RewardModelConfig, load_packaged("arithmetic_rm.yaml"),
        [f"out={run_dir / 'rm'}", f"model.path={run_dir / 'sft' / 'final'}",
         f"data.path={run_dir / 'preferences.jsonl'}", *common], source="arithmetic_rm.yaml")
    return {
        "sft": build_config(SFTConfig, load_packaged(sft_file), sft_overrides, source=sft_file),
        "rm": rm,
        "rl": build_config(RunConfig, load_packaged(stage_file), [*rl_overrides, *overrides],
                           source=f"{stage_file} with the quickstart's key=value overrides"),
        "rl_packaged": load_packaged(stage_file),
    }


def _stages(run_dir: Path, configs: dict[str, Any], *, seed: int, steps: int | None, device: str,
            overrides: list[str], algorithm: str, reward_model: bool, resume: bool, progress: bool,
            task: str = "arithmetic") -> dict[str, Any]:
    """Every stage in order, each kept when a resumed quickstart finished it already; the RL stage's
    summary with the other stages' numbers added."""
    from rlvr.modeling.tiny import build_tiny_model
    from rlvr.recipes import sft, train

    stages = 5 if reward_model else 3
    if resume and (run_dir / "base_model" / "config.json").is_file():
        print(f"[1/{stages}] the tiny model built when the quickstart started: {run_dir / 'base_model'}")
    else:
        print(f"[1/{stages}] building a tiny model -> {run_dir / 'base_model'}")
        build_tiny_model(run_dir / "base_model", seed=seed)

    tools = task == "tools"
    sft_config, run_config = configs["sft"], configs["rl"]
    print(f"[2/{stages}] SFT bootstrap " + ("on gold tool-use episodes " if tools else "")
          + f"until held-out greedy accuracy reaches {sft_config.eval.stop_at_accuracy:.2f}")
    sft_summary = _stage(sft.train, sft_config, run_dir / "sft", resume=resume)
    print(f"      SFT stopped after {sft_summary['steps']} steps at dev accuracy {sft_summary['eval_accuracy']:.3f}")

    name = algorithm.upper()
    rm_summary = None
    if reward_model:
        rm_summary = _reward_model_stages(run_dir, configs["rl_packaged"], configs["rm"], seed=seed, device=device,
                                          progress=progress, resume=resume)
        rm_summary["greedy_accuracy"] = head_greedy_accuracy(run_dir / "rm" / "final", run_config)
        print(f"      the reward model's own greedy answers: accuracy {rm_summary['greedy_accuracy']:.3f} on the "
              f"{run_config.eval.limit} held-out problems ({name} against it heads there: docs/reward-models.md)")
    print(f"[{stages}/{stages}] {name} against " + ("the reward model (the `numeric` verifier only watches: gold)"
                                                   if reward_model else "the `numeric` verifier")
          + (", the model calling the sandboxed python tool mid-answer" if tools else ""))
    summary = _stage(train, run_config, run_dir, resume=resume, done=False)
    summary.update({
        f"{algorithm}_wall_s": summary["wall_s"],
        "sft_steps": sft_summary["steps"],
        "sft_dev_accuracy": sft_summary["eval_accuracy"],
        "eval_problems": run_config.eval.limit,
        "model": str(run_dir / "final"),
        "eval_command": eval_command(run_config),
    })
    if tools:
        summary["tools"] = _tool_metrics(run_dir / "metrics.jsonl")
    if rm_summary is not None:
        summary.update({"pairwise_accuracy": rm_summary["pairwise_accuracy"], "preference_pairs": rm_summary["pairs"],
                        "reward_model": rm_summary["model"], "reward_model_greedy_accuracy": rm_summary["greedy_accuracy"]})
    return summary


def head_greedy_accuracy(model: Path, config: RunConfig) -> float:
    """Greedy accuracy of a causal-LM folder (a ``logprob``-head reward model) on ``config``'s held-out
    evaluation: the RL stage's own problems, prompts and budget. A policy trained against a log-prob
    reward drifts to that model's most likely answers, so this is about where it ends up."""
    from rlvr.engines import build_engine
    from rlvr.modeling.loading import load_policy, load_tokenizer
    from rlvr.rollout.evaluate import evaluate_suites
    from rlvr.rollout.suites import PromptEncoder, load_eval_suites
    from rlvr.run.runtime import resolve_device
    from rlvr.verifiers.runner import VerifierRunner

    suites = load_eval_suites(config)
    tokenizer = load_tokenizer(model)
    policy = load_policy(str(model), device=str(resolve_device(config.train.device, "train.device"))).eval()
    with VerifierRunner(workers=0) as runner:  # the run's own evaluation, as its step 0 measures the policy
        return evaluate_suites(build_engine("hf", policy, tokenizer), PromptEncoder.for_suites(tokenizer, suites),
                               suites, runner, eval_config=config.eval, generation=config.generation,
                               verifier=config.verifier)["eval/accuracy"]


def _tool_metrics(metrics_file: Path) -> dict[str, float]:
    """The ``env/`` metrics of the RL stage's first and last steps (tool calls, errors, latency, stops)."""
    from rlvr.run.tracking import read_metrics

    steps = [r for r in read_metrics(metrics_file) if "env/turns" in r]
    if not steps:
        return {}
    first, last = steps[0], steps[-1]
    return {"first_step": {k: v for k, v in first.items() if k.startswith("env/")},
            "last_step": {k: v for k, v in last.items() if k.startswith("env/")}}


def _stage(train, config, folder: Path, *, resume: bool, done: bool = True) -> dict[str, Any]:
    """A stage's summary: read back when a resumed quickstart finished the stage already (``done``: its
    ``summary.json`` says so), continued from its latest checkpoint, or run from the start."""
    from rlvr.run.checkpoint import latest_checkpoint

    if resume and done and (folder / "summary.json").is_file():
        return json.loads((folder / "summary.json").read_text())
    if resume and latest_checkpoint(folder) is not None:
        return train(config, resume=True)
    return train(config, overwrite=resume)  # a stage stopped before its first checkpoint starts over


def _report(summary: dict[str, Any], run_dir: Path, algorithm: str, reward_model: bool) -> None:
    before, after = summary["accuracy_before"], summary["accuracy_after"]
    print(f"\n{'gold ' if reward_model else ''}greedy accuracy on {summary['eval_problems']} held-out problems: "
          f"before {algorithm.upper()} {before:.3f} -> after {after:.3f} ({after - before:+.3f})")
    if summary.get("tools"):
        first, last = summary["tools"]["first_step"], summary["tools"]["last_step"]
        print("tool use (sampled episodes, first -> last RL step): "
              f"calls per episode {first['env/tool_calls']:.2f} -> {last['env/tool_calls']:.2f}, "
              f"tool error rate {first['env/tool_error_rate']:.2f} -> {last['env/tool_error_rate']:.2f}, "
              f"turns {first['env/turns']:.2f} -> {last['env/turns']:.2f}, "
              f"tool latency p50 {1e3 * last.get('env/tool_latency_p50', 0.0):.0f} ms")
    if reward_model:
        fired = [a for a in summary["alarms"] if a["alarm"] == "gold_vs_proxy"]
        print(f"reward model: held-out pairwise accuracy {summary['pairwise_accuracy']:.3f}, its own greedy answers "
              f"{summary['reward_model_greedy_accuracy']:.3f}; gold-vs-proxy alarm: "
              + (f"fired at step {fired[0]['step']}" if fired else "never fired"))
    print(f"wall time {summary['wall_s']:.0f} s; run folder: {run_dir} (summary.json, metrics.jsonl, metrics.png)")
    print(f"pass@1 and pass@8 of the trained model: {summary['eval_command']}")


def _reward_model_stages(run_dir: Path, rl_config: dict, rm_config, *, seed: int, device: str,
                         progress: bool, resume: bool) -> dict[str, Any]:
    """Preference pairs from the SFT model's samples on the RL task, then a reward model on them (``rm/``,
    ``rm_config``)."""
    from rlvr.recipes import train_rm
    from rlvr.rollout.preferences import build_preferences

    sft_model, task, pairs_file = run_dir / "sft" / "final", rl_config["data"][0], run_dir / "preferences.jsonl"
    p = PREFERENCE_SAMPLING
    print(f"[3/5] preference pairs: {p['samples']} samples of the SFT model on each of {p['limit']} problems; up to "
          f"{p['pairs_per_prompt']} pairs of a right and a wrong answer per problem (`rlvr preferences`)")
    if resume and pairs_file.is_file():  # written whole or not at all
        pairs = len(pairs_file.read_text().splitlines())
        print(f"      {pairs} pairs (made before the resume)")
    else:
        stats = build_preferences(str(sft_model), task["task"], pairs_file, split=task.get("split", "train"),
                                  options=task.get("options", {}), seed=seed, device=device, workers=0,
                                  progress=progress, **p)
        pairs = stats["pairs"]
        print(f"      {pairs} pairs; {stats['sample_accuracy']:.3f} of the samples were right")
    print("[4/5] Bradley-Terry reward model on the pairs (`rlvr train-rm`, arithmetic_rm.yaml)")
    summary = _stage(train_rm.train, rm_config, run_dir / "rm", resume=resume)
    print(f"      held-out pairwise accuracy {summary['pairwise_accuracy']:.3f}")
    return {**summary, "pairs": pairs}
