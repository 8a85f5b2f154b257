"""``rlvr eval``: pass@k, accuracy, verifier statuses and throughput of a model on a task suite."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rlvr.commands import HelpFormatter, check_sampling


def _key_values(pairs: list[str], flag: str) -> dict:
    import yaml

    from rlvr.verifiers.errors import InvalidValueError

    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise InvalidValueError(f"{flag} {pair!r} is not of the form key=value")
        key, value = pair.split("=", 1)
        try:
            out[key] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:  # not YAML (e.g. "*", an alias marker): the text itself
            out[key] = value
    return out


#: The flag of each field of the ``environment:`` section that ``rlvr eval`` builds from its flags.
ENVIRONMENT_FLAGS = {"name": "--environment", "options": "--env-option", "max_turns": "--max-turns",
                     "max_episode_tokens": "--max-episode-tokens", "messages": "--env-messages"}


def environment_section(args: argparse.Namespace):
    """The ``EnvironmentConfig`` of the episode flags, checked as a training run's ``environment:`` section is
    (a known name, options it takes, limits in range); a mistake is one line that names the flag and the
    valid choices, never a pydantic traceback."""
    from pydantic import ValidationError

    from rlvr.config import EnvironmentConfig
    from rlvr.verifiers.errors import InvalidValueError

    try:
        return EnvironmentConfig(name=args.environment, options=_key_values(args.env_option, "--env-option"),
                                 max_turns=args.max_turns, max_episode_tokens=args.max_episode_tokens,
                                 messages=args.env_messages)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = getattr(error.get("ctx", {}).get("error"), "field", None) or \
                (str(error["loc"][0]) if error["loc"] else "options")
            message = error["msg"].removeprefix("Value error, ")
            got = "" if error["type"] == "value_error" else f" (got {error.get('input')!r})"
            problems.append(f"{ENVIRONMENT_FLAGS.get(field, field)}: {message}{got}")
        raise InvalidValueError("; ".join(problems)) from None


def built_environments(section, problems) -> dict:
    """Every environment the problems play in (:func:`rlvr.rollout.episodes.build_environments`), built before
    any model loads; an option an environment does not take, or a value its constructor refuses (a
    plugin's own ``ValueError`` included), is one line that names ``--env-option`` and the environment."""
    from rlvr.rollout.episodes import build_environments
    from rlvr.verifiers.errors import InvalidValueError, OptionError, UserError

    try:
        return build_environments(section, problems)
    except (OptionError, InvalidValueError) as exc:
        raise InvalidValueError(f"--env-option: {exc}") from None
    except UserError:
        raise
    except (ValueError, TypeError) as exc:
        names = [section.name] if section.name else sorted({p.environment for p in problems if p.environment})
        given = ", ".join(f"{k}={v!r}" for k, v in section.options.items()) or "none"
        raise InvalidValueError(f"--env-option: environment {', '.join(map(repr, names))} refused its options "
                                f"({given}): {type(exc).__name__}: {exc}") from None


#: How the chat-template refusal of :func:`rlvr.rollout.env_tokens.message_encoder` names the fixes here.
MESSAGE_KNOBS = ("--env-messages {}", "--chat-template")


def check_episode_templates(section, environments: dict, problems, tokenizer, encode, eos_ids) -> None:
    """Check, before the model loads, that every chat template a problem that plays in an environment is
    rendered with can carry its episodes in ``--env-messages`` mode; a refusal names this command's flags
    (the episode runner would check the same, naming a training run's ``environment.messages``)."""
    from rlvr.rollout.env_tokens import message_encoder

    if not environments:
        return
    templates = {encode.template_of(p) for p in problems if section.name or p.environment}
    for template in templates:
        message_encoder(tokenizer, section.messages, template, eos_ids, knobs=MESSAGE_KNOBS)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "eval", formatter_class=HelpFormatter,
        help="measure a model on a task suite: pass@k (unbiased), accuracy, verifier statuses, throughput",
        description="Generate --samples completions per problem with the engine, verify them with the suite's verifier "
        "(or --verifier), and report pass@k with the unbiased estimator of Chen et al. (2021), mean accuracy, verifier "
        "status counts (a sample not scored counts as not correct, and a warning line says how many) and throughput. With --out, writes results.jsonl (one line per problem) and summary.json; a "
        "folder that already holds them is refused (checked before any work) unless --overwrite.",
    )
    p.add_argument("--model", required=True, help="local Hugging Face model folder (e.g. a run's final/)")
    p.add_argument("--task", required=True, help="task suite name (see `rlvr tasks list`)")
    p.add_argument("--split", default="test", help="suite split")
    p.add_argument("--path", default=None, help="local data file/folder or hub dataset name for the suite")
    p.add_argument("--task-option", action="append", default=[], metavar="k=v", help="suite option (repeatable), e.g. style=bare")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N problems")
    p.add_argument("--chat-template", default="auto", metavar="auto|none|PATH",
                   help="how prompts are rendered, as data[i].chat_template of a training run: auto (the tokenizer's "
                   "chat template), none (raw prompts), or a Jinja template file")
    p.add_argument("--samples", type=int, default=1, help="completions per problem (n of pass@k)")
    p.add_argument("--k", default="1", help="comma-separated k values for pass@k, each <= --samples (e.g. 1,8)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (ignored with --greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold")
    p.add_argument("--greedy", action="store_true", help="greedy decoding (every sample identical: use it with --samples 1)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="generation budget per completion")
    p.add_argument("--stop", action="append", default=[], metavar="STRING",
                   help="end a completion when its text holds STRING, kept in the text (repeatable; generation.stop)")
    p.add_argument("--cut-stop", action="store_true", help="cut the --stop string off the completion's text")
    p.add_argument("--verifier", default=None, help="verifier to use instead of the suite's default")
    p.add_argument("--option", action="append", default=[], metavar="k=v", help="verifier option (repeatable)")
    p.add_argument("--workers", type=int, default=None,
                   help="verifier worker processes, each item under the --timeout deadline (default: one per core, "
                   "at most 4; 0 = in this process, without a deadline)")
    p.add_argument("--timeout", type=float, default=10.0, help="hard deadline per verified item, in seconds")
    p.add_argument("--verifier-backend", choices=("local", "ray"), default="local",
                   help="where verifier workers run: local processes (default), or Ray actors (the cluster RAY_ADDRESS "
                   "names, else a local Ray; needs the [ray] extra)")
    p.add_argument("--environment", default=None, metavar="NAME",
                   help="play every problem as a multi-turn episode in this environment (default: the ones the suite's "
                   "problems name, e.g. python for tool_arithmetic; docs/environments.md)")
    p.add_argument("--env-option", action="append", default=[], metavar="k=v",
                   help="environment option (repeatable), e.g. timeout_s=2")
    p.add_argument("--max-turns", type=int, default=4, help="assistant turns per episode at most (environments only)")
    p.add_argument("--max-episode-tokens", type=int, default=512,
                   help="tokens after the prompt per episode at most, sampled and environment (environments only); "
                   "--max-new-tokens caps each turn")
    p.add_argument("--env-messages", choices=("auto", "template", "text"), default="auto",
                   help="how environment messages become tokens: the chat template's turns, plain text, or auto "
                   "(environments only; docs/environments.md)")
    p.add_argument("--batch-prompts", type=int, default=64, help="prompts generated together")
    p.add_argument("--engine", default="hf", help="generation engine: hf, vllm (needs vLLM installed, docs/engines.md) "
                   "or a plugin's")
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="model weights dtype")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--out", default=None, help="folder for results.jsonl and summary.json (created if missing; one that "
                   "already holds them is refused without --overwrite)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the results.jsonl and summary.json already in --out (when the new ones are complete)")
    p.set_defaults(func=run)


#: What ``rlvr eval --out`` writes; any of them in the folder means "this folder holds an evaluation".
EVAL_FILES = ("results.jsonl", "summary.json")


def run(args: argparse.Namespace) -> int:
    from rlvr.verifiers.cli import check_number, check_runner_flags
    from rlvr.verifiers.files import check_output_folder

    check_sampling(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                   greedy=args.greedy)
    check_runner_flags(args.workers, args.timeout)
    for flag, value in (("--samples", args.samples), ("--limit", args.limit), ("--batch-prompts", args.batch_prompts)):
        check_number(flag, value, 1)
    try:
        ks = sorted({int(k) for k in args.k.split(",") if k.strip()})
    except ValueError:
        print(f"rlvr eval: --k must be comma-separated integers, got {args.k!r}", file=sys.stderr)
        return 2
    if not ks or min(ks) < 1 or max(ks) > args.samples:
        print(f"rlvr eval: every k must lie in 1..--samples ({args.samples}), got {args.k}", file=sys.stderr)
        return 2
    if args.out is not None:  # before any work: an earlier evaluation there is not replaced by accident
        check_output_folder(args.out, EVAL_FILES, flag="--out", holds="an evaluation", overwrite=args.overwrite)

    if args.greedy and args.samples > 1:
        print(f"rlvr eval: warning: --greedy makes all {args.samples} samples of a problem identical, so pass@k for k > 1 "
              "equals pass@1; sample with a temperature instead (drop --greedy) or use --samples 1", file=sys.stderr)

    from rlvr.engines import ENGINES, SamplingParams, build_engine
    from rlvr.rollout.evaluate import evaluate
    from rlvr.modeling.loading import check_model_folder, load_policy, load_tokenizer, stop_token_ids
    from rlvr.rollout.episodes import episode_runner
    from rlvr.run.progress import make_progress
    from rlvr.run.runtime import quiet_transformers, resolve_device, seed_everything
    from rlvr.rollout.chat import resolve_chat_template
    from rlvr.rollout.suites import PromptEncoder, load_suite
    from rlvr.verifiers.errors import InvalidValueError
    from rlvr.verifiers.base import STATUSES
    from rlvr.rollout.suites import check_verifiers
    from rlvr.verifiers.runner import VerifierRunner

    quiet_transformers()
    seed_everything(args.seed)
    check_model_folder(args.model, "--model")
    task_options = _key_values(args.task_option, "--task-option")
    for argument in ("path", "split"):
        if argument in task_options:
            raise InvalidValueError(f"--task-option {argument}=...: {argument} is not a suite option; use --{argument}")
    chat_template = resolve_chat_template(args.chat_template, where="--chat-template")
    problems = load_suite(args.task, path=args.path, split=args.split, options=task_options, limit=args.limit)
    verifier_options = _key_values(args.option, "--option")
    check_verifiers(args.verifier, verifier_options, problems)  # built and preflighted (a judge's server) before any model
    section = environment_section(args)
    environments = built_environments(section, problems)  # an unknown name or option fails before any model loads
    ENGINES.check(args.engine)  # an unknown engine fails before any model is loaded
    device = resolve_device(args.device, "--device")
    tokenizer = load_tokenizer(args.model)
    encode = PromptEncoder(tokenizer, chat_template)
    eos_ids = stop_token_ids(args.model, tokenizer)
    check_episode_templates(section, environments, problems, tokenizer, encode, eos_ids)
    episodes = episode_runner(section, tokenizer, encode, eos_ids, environments, problems)
    model = load_policy(args.model, dtype=args.dtype, device=str(device)).eval()
    engine = build_engine(args.engine, model, tokenizer)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                              greedy=args.greedy, stop=tuple(s for s in args.stop if s), include_stop=not args.cut_stop)
    started = time.perf_counter()
    bar = make_progress(len(problems), f"eval {args.task}", unit="problem")
    with VerifierRunner(workers=args.workers, timeout_s=args.timeout, backend=args.verifier_backend) as runner:
        try:
            result = evaluate(engine, encode, problems, runner, sampling=sampling, samples=args.samples,
                              ks=ks, verifier=args.verifier, verifier_options=verifier_options, episodes=episodes,
                              batch_prompts=args.batch_prompts, keep_records=args.out is not None, progress=bar.update)
        finally:
            bar.close()
            getattr(engine, "close", lambda: None)()
    summary = {"model": str(args.model), "task": args.task, "split": args.split, **result.summary(),
               "wall_s": time.perf_counter() - started}
    print(f"{args.task} ({args.split}): {result.problems} problems x {args.samples} samples")
    for k, value in result.pass_at_k.items():
        print(f"  pass@{k:<3} {value:.4f}")
    scored = f" ({result.scored_accuracy:.4f} over the {result.status['ok']} scored)" \
        if result.scored_accuracy is not None and result.status["ok"] < result.samples else ""
    print(f"  accuracy {result.accuracy:.4f}{scored}   mean score {result.mean_score:.4f}")
    counts = ", ".join(f"{s} {result.status[s]}" for s in STATUSES if result.status[s] or s == "ok")
    print(f"  verifier status: {counts}"
          f"   (error_frac {result.error_frac:.4f}, abstain_frac {result.abstain_frac:.4f})")
    warning = result.status_warning(f"{args.task} ({args.split})")
    if warning:
        print(f"rlvr eval: {warning}", file=sys.stderr)
    if result.episodes:
        summary["episodes"] = result.episodes
        print("  episodes: " + ", ".join(f"{k.removeprefix('env/')} {v:.3g}" for k, v in result.episodes.items()
                                         if not k.startswith("env/stop_") or v))
    print(f"  {summary['tokens_per_s']:,.0f} generated tokens/s, {summary['problems_per_s']:.2f} problems/s")
    if args.out is not None:
        from rlvr.verifiers.files import atomic_write_text

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)  # checked (and made) before the evaluation; made again if removed since
        atomic_write_text(out / "results.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in result.records))
        atomic_write_text(out / "summary.json", json.dumps(summary, indent=2))
        print(f"  wrote {out / 'results.jsonl'} and {out / 'summary.json'}")
    return 0
