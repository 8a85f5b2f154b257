"""The arguments every training command takes (``train``, ``sft``, ``train-rm``, ``train-prm``, ``dpo``) and the config they
describe: ``CONFIG``, ``key=value`` overrides (anywhere on the line: ``rlvr.cli`` collects the ones after
a flag), ``--out``, ``--resume [RUN_DIR]`` and ``--overwrite``."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlvr.verifiers.errors import InvalidValueError


def add_run_arguments(p: argparse.ArgumentParser, *, kind: str, example: str | None = None) -> None:
    """``CONFIG [key=value ...] [--out DIR] [--resume [RUN_DIR] | --overwrite]``; ``kind`` names a new default
    run folder (``runs/<kind>-<timestamp>``), ``example`` a packaged config to start from."""
    like = f" (e.g. {example})" if example else ""
    show = f"rlvr config show --recipe {p.prog.split()[-1]}"  # the command's own name: train, sft, train-rm, ...
    p.add_argument("config", nargs="?", help=f"YAML config file{like}; optional with --resume, which reads the run's "
                   f"own config.yaml. Every key it can set, with its default and description: `{show}`")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="config overrides, applied after the file; they may stand anywhere on the command line "
                   f"(e.g. train.steps=10; `{show} KEY` describes one)")
    p.epilog = p.epilog or (f"Config keys: `{show}` lists every key of this command's config with its type, default "
                            f"and description; `{show} SECTION` one section (e.g. optim).")
    p.add_argument("--out", default=None, help="run folder (overrides the config's `out`; without either: a new "
                   f"runs/{kind}-<timestamp>)")
    p.add_argument("--resume", nargs="?", const=True, default=None, metavar="RUN_DIR",
                   help="continue a run from its latest checkpoint (weights, optimizer, schedule, RNG, data position): "
                   "the run in RUN_DIR, or without it the one in --out (or the config's `out`)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run already in the run folder (its config, metrics, checkpoints, final model); "
                   "without it such a folder is refused")


def load_run_config(args: argparse.Namespace, cls):
    """``(config, resume)`` from the arguments of :func:`add_run_arguments`. With ``--resume`` the run folder is
    RUN_DIR (or ``--out``, or the config's ``out``) and the config defaults to the one saved there."""
    from rlvr.config import load_config

    config_path, overrides, resume = args.config, list(args.overrides), args.resume
    if isinstance(resume, str) and "=" in resume and not Path(resume).exists():
        overrides.insert(0, resume)  # `--resume key=value`: a bare --resume followed by an override
        resume = True
    elif isinstance(resume, str) and Path(resume).is_file() and config_path is None:
        config_path, resume = resume, True  # `--resume CONFIG`: a bare --resume followed by the config file
    if config_path is not None and "=" in config_path and not Path(config_path).exists():
        overrides.insert(0, config_path)  # `--resume DIR key=value`, or overrides before the CONFIG file
        config_path = None
    if config_path is None:  # `rlvr train a=1 b=2 CONFIG`: argparse took the first override for the file
        files = [word for word in overrides if "=" not in word]
        if files:
            config_path = files[0]
            overrides.remove(config_path)
    folder = resume if isinstance(resume, str) else args.out
    if isinstance(resume, str) and args.out is not None and Path(args.out) != Path(resume):
        raise InvalidValueError(f"--resume {resume} and --out {args.out} name different run folders; give one")
    if resume and config_path is None:
        if folder is None:
            raise InvalidValueError("--resume needs the run folder: --resume RUN_DIR (or --out RUN_DIR, or a CONFIG "
                                    "whose `out` names it)")
        config_path = str(Path(folder) / "config.yaml")
        if not Path(config_path).is_file():
            raise InvalidValueError(f"--resume {folder}: no config.yaml there (is it a run folder?); give the CONFIG "
                                    "file too, or start the run without --resume")
    if config_path is None:
        raise InvalidValueError("give a CONFIG file (or --resume RUN_DIR to continue a run)")
    if folder is not None:
        overrides.append(f"out={folder}")
    config = load_config(cls, config_path, overrides)  # a ConfigError is printed by rlvr.cli
    if resume and config.out is None:
        raise InvalidValueError("--resume needs the run folder: --resume RUN_DIR, --out RUN_DIR, or `out` in the config")
    return config, bool(resume)
