"""Command line: ``rlvr verify`` and ``rlvr verifiers list | audit`` (no torch is imported).

``rlvr verify --verifier NAME [--option k=v ...] --input FILE.jsonl [--output OUT.jsonl]`` scores
every line: the completion is ``line[--completion-key]`` ("completion"); ``line["prompt"]`` (text
or chat messages) and ``line["finish_reason"]`` ("stop" / "length"), when present, reach the
verifiers that take them, as in training; the reference is ``line["reference"]`` when that is an
object, else every other field of the line (so a line ``{"completion": "... \\\\boxed{42}",
"answer": "42"}`` works as is). It prints the mean score,
status counts, latency percentiles and throughput; ``--output`` writes each line back with a
``reward`` object added. When items fail to verify, the first failure is printed (file, line and the
verifier's traceback), as training prints it; when no item could be scored (an empty file included),
the command exits 1.

``--output`` and ``audit --json`` are checked before any work: an existing file is refused unless
``--overwrite``, missing folders are created (:func:`rlvr.verifiers.files.check_output_file`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import Counter
from pathlib import Path

from rlvr.verifiers.errors import InvalidValueError, MissingFileError, invalid_text
from rlvr.verifiers.files import check_output_file, jsonl_lines


def add_parser(subparsers) -> None:
    """Register ``verify`` and ``verifiers {list,audit}`` on an argparse subparsers object."""
    verify = subparsers.add_parser(
        "verify", help="score completions in a JSONL file with a verifier",
        description="Score each line of a JSONL file (a completion plus its reference fields) and print a summary.")
    verify.add_argument("--verifier", required=True, help="registered verifier name (see `rlvr verifiers list`)")
    _add_option_args(verify)
    verify.add_argument("--input", required=True, type=Path, help="JSONL file: one {completion, reference fields} per line")
    verify.add_argument("--output", type=Path, help="write every input line with a 'reward' object added (JSONL; "
                        "missing folders are created, an existing file is refused without --overwrite)")
    verify.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    verify.add_argument("--completion-key", default="completion", help="field holding the completion (default: completion)")
    verify.add_argument("--workers", type=int, default=None,
                        help="worker processes (default: one per core, at most 4; 0 = in-process, no deadline)")
    verify.add_argument("--timeout", type=float, default=10.0, help="hard deadline per item in seconds (default: 10)")
    verify.add_argument("--backend", choices=("local", "ray"), default="local",
                        help="where the workers run: local processes (default), or Ray actors (the cluster RAY_ADDRESS "
                        "names, else a local Ray; without --workers: one per CPU of the cluster; needs the [ray] extra)")
    verify.add_argument("--batch-size", type=int, default=512, help="lines scored per batch (default: 512)")
    verify.set_defaults(func=run_verify)

    group = subparsers.add_parser("verifiers", help="list the registered verifiers or audit one",
                                  description="Inspect the verifier registry.")
    sub = group.add_subparsers(dest="verifiers_command", metavar="SUBCMD", required=True)
    listing = sub.add_parser("list", help="name, one-line description and options of every verifier",
                             description="List every registered verifier (built-ins and rlvr.verifiers plugins).")
    listing.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")
    listing.set_defaults(func=run_list)
    audit = sub.add_parser("audit", help="run golden cases and adversarial probes against a verifier",
                           description="Score golden cases, hedges, format hacks and hostile input (giant text, "
                                       "pathological LaTeX) and print what the verifier caught and let through.")
    audit.add_argument("name", help="registered verifier name")
    _add_option_args(audit)
    audit.add_argument("--timeout", type=float, default=5.0, help="deadline per probe in seconds (default: 5)")
    audit.add_argument("--threshold", type=float, default=None,
                       help="for a continuous reward: golden responses must score at least this, all others below it "
                       "(default: the verifier's pass_threshold; without one, any score > 0 is credit)")
    audit.add_argument("--json", type=Path, help="also write the audit rows to this JSON file (missing folders are "
                       "created, an existing file is refused without --overwrite)")
    audit.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    audit.set_defaults(func=run_audit)


def _add_option_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                        help="verifier option; VALUE is read as JSON when it parses (1e-6, true, [..]), else as text; repeatable")
    parser.add_argument("--options", default=None, metavar="JSON",
                        help="all verifier options as one JSON object (merged under --option)")


def parse_options(pairs: list[str], blob: str | None = None) -> dict:
    """``["tolerance=1e-6", "fallback=none"]`` -> ``{"tolerance": 1e-06, "fallback": "none"}``."""
    try:
        options = dict(json.loads(blob)) if blob else {}
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise InvalidValueError(f"--options must be one JSON object, e.g. '{{\"tolerance\": 1e-4}}' ({exc})") from None
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidValueError(f"--option expects KEY=VALUE, got {pair!r}")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value
    return options


def check_number(flag: str, value: float | None, minimum: float, *, above: bool = False) -> None:
    """A numeric flag within its range, checked before any work (None: not given, the default applies):
    ``value >= minimum``, or ``value > minimum`` when ``above``."""
    if value is None:
        return
    if not (value > minimum if above else value >= minimum):  # NaN fails too
        bound = f"> {minimum:g}" if above else f"at least {minimum:g}"
        raise InvalidValueError(f"{flag} must be {bound}, got {value:g}")


def check_runner_flags(workers: int | None, timeout: float | None) -> None:
    """``--workers`` and ``--timeout`` of a command that scores with a :class:`VerifierRunner`."""
    check_number("--workers", workers, 0)
    check_number("--timeout", timeout, 0, above=True)


CONTEXT_KEYS = ("prompt", "finish_reason")  # fields of a line that are the sample's, not the reference's


def _reference(line: dict, completion_key: str) -> dict:
    if isinstance(line.get("reference"), dict):
        return line["reference"]
    return {k: v for k, v in line.items() if k != completion_key and k not in CONTEXT_KEYS}


def _prompt(line: dict) -> list | None:
    """The line's ``prompt`` as chat messages (a string is one user message), or None."""
    prompt = line.get("prompt")
    if prompt is None or isinstance(prompt, list):
        return prompt
    return [{"role": "user", "content": str(prompt)}]


def read_lines(path: Path, completion_key: str) -> list[dict]:
    """The JSON objects of a JSONL file; anything unusable is an error naming the file and line."""
    return _read_lines(path, completion_key)[0]


def _read_lines(path: Path, completion_key: str) -> tuple[list[dict], list[str]]:
    """:func:`read_lines`, and where each line is (``FILE:LINE``)."""
    if not path.is_file():
        raise MissingFileError(f"--input {path}: no such file")
    rows, wheres = [], []
    for where, line, problem in jsonl_lines(path):
        if problem:
            raise InvalidValueError(f"{where}: {problem}; fix or drop it")
        if completion_key not in line:
            raise InvalidValueError(f"{where}: no {completion_key!r} field (set --completion-key to the field "
                                    "that holds the completion)")
        if not isinstance(line[completion_key], str):
            raise InvalidValueError(f"{where}: field {completion_key!r} must be text, got "
                                    f"{type(line[completion_key]).__name__}")
        problem = invalid_text(json.dumps(line, ensure_ascii=False))  # a "\ud800" escape in any field
        if problem:
            raise InvalidValueError(f"{where}: the line {problem}; fix or drop it")
        rows.append(line)
        wheres.append(where)
    return rows, wheres


def run_verify(args: argparse.Namespace) -> int:
    from rlvr.verifiers.files import atomic_writer
    from rlvr.verifiers.registry import check_verifier
    from rlvr.verifiers.runner import VerifierRunner

    options = parse_options(args.option, args.options)
    check_runner_flags(args.workers, args.timeout)
    check_number("--batch-size", args.batch_size, 1)
    if args.output:  # before any work: an earlier file is not replaced by accident
        check_output_file(args.output, flag="--output", overwrite=args.overwrite)
    check_verifier(args.verifier, options)  # a bad name or option fails before the file is read
    rows, wheres = _read_lines(args.input, args.completion_key)
    if not rows:  # nothing is scored: the exit status says so, as it does when every item fails
        print(f"rlvr verify: nothing to score: --input {args.input} holds no lines (an empty file, or blank lines "
              "only)", file=sys.stderr)
        return 1
    start = time.perf_counter()
    statuses: Counter = Counter()
    scores, scored, latencies = [], [], []
    first_failure = None  # (where, reward) of the first item that errored or timed out
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(atomic_writer(args.output)) if args.output else None
        runner = stack.enter_context(VerifierRunner(workers=args.workers, timeout_s=args.timeout,
                                                    backend=args.backend))
        for i in range(0, len(rows), args.batch_size):
            batch = rows[i: i + args.batch_size]
            rewards = runner.score_batch(args.verifier, [r[args.completion_key] for r in batch],
                                         [_reference(r, args.completion_key) for r in batch], options,
                                         prompts=[_prompt(r) for r in batch],
                                         finish_reasons=[r.get("finish_reason") for r in batch])
            for where, line, reward in zip(wheres[i: i + args.batch_size], batch, rewards):
                statuses[reward.status] += 1
                if first_failure is None and reward.status in ("error", "timeout"):
                    first_failure = (where, reward)
                scores.append(reward.score)
                if reward.status == "ok":
                    scored.append(reward.score)
                latencies.append(reward.latency_s)
                if out:
                    line = dict(line, reward={"score": reward.score, "status": reward.status,
                                              "components": reward.components, "latency_ms": 1e3 * reward.latency_s,
                                              "info": reward.info})
                    out.write(json.dumps(line, default=repr, ensure_ascii=False) + "\n")
    elapsed = time.perf_counter() - start
    print(summarize(args.verifier, str(args.input), scores, statuses, latencies, elapsed, scored))
    if args.output:
        print(f"wrote {args.output}")
    if first_failure is not None:
        where, reward = first_failure
        failed = statuses["error"] + statuses["timeout"]
        detail = reward.info.get("traceback") or reward.info.get("error") or f"status {reward.status} (no details)"
        print(f"verifier {args.verifier!r} failed on {failed} of {len(rows)} items; the first, {where}:\n"
              f"{detail.rstrip()}", file=sys.stderr, flush=True)
    if rows and not scored:
        print(f"rlvr verify: nothing was scored ({', '.join(f'{k} {v}' for k, v in statuses.most_common())} of "
              f"{len(rows)} items); fix the verifier, its options or the lines' reference fields", file=sys.stderr)
        return 1
    return 0


def summarize(verifier: str, source: str, scores: list[float], statuses: Counter, latencies: list[float],
              elapsed: float, scored: list[float] | None = None) -> str:
    """The printed summary. ``scored`` holds the scores of the items whose status is ``ok``: the mean
    is over those, as training counts them (timeouts, errors and abstentions are masked out of the
    loss, not rewards of 0), and the others are counted apart."""
    n = len(scores)
    scored = scores if scored is None else scored
    lat = sorted(latencies)
    pct = (lambda q: 1e3 * lat[min(n - 1, int(q * n))]) if n else (lambda q: 0.0)
    unscored = n - len(scored)
    mean = f"{sum(scored) / len(scored):.4f}" if scored else "-"
    lines = [
        f"verifier {verifier} on {source}: {n} items in {elapsed:.2f} s ({n / elapsed if elapsed else 0:.0f} items/s)",
        f"mean score     {mean} over the {len(scored)} scored items (status ok)"
        + (f"; {unscored} not scored (timeout/error/abstain), left out as training masks them" if unscored else ""),
        "status         " + (", ".join(f"{k} {v}" for k, v in statuses.most_common()) or "-"),
        f"latency        p50 {pct(0.5):.2f} ms, p95 {pct(0.95):.2f} ms, max {1e3 * lat[-1] if lat else 0:.2f} ms",
    ]
    return "\n".join(lines)


def run_list(args: argparse.Namespace) -> int:
    from rlvr.verifiers.registry import VERIFIERS, describe_verifier, list_verifiers

    described = []
    for name in list_verifiers():
        ok, reason = VERIFIERS.status(name)
        if ok:
            described.append({**describe_verifier(name), "broken": None})
        else:  # a broken plugin is listed, marked, with its whole reason; it is not fatal
            described.append({"name": name, "description": "BROKEN: the plugin does not load (reason below)",
                              "options": {}, "broken": reason})
    if args.json:
        print(json.dumps(described, indent=2, default=repr))
        return 0
    width = max((len(d["name"]) for d in described), default=0) + 1
    for d in described:
        print(f"{d['name']:<{width}} {d['description']}")
        if d["options"]:
            opts = ", ".join(f"{k}={v!r}" for k, v in d["options"].items())
            print(f"{'':<{width}} options: {opts}")
    broken = [d for d in described if d["broken"]]
    if broken:
        print(f"\n{len(broken)} broken plugin(s); using them fails until fixed:")
        for d in broken:
            print(f"  {d['name']}: {d['broken']}")
    return 0


def run_audit(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from rlvr.verifiers.audit import audit, format_report
    from rlvr.verifiers.files import atomic_write_text

    options = parse_options(args.option, args.options)
    check_runner_flags(None, args.timeout)
    if args.json:  # before any work
        check_output_file(args.json, flag="--json", overwrite=args.overwrite)
    report = audit(args.name, options, timeout_s=args.timeout, threshold=args.threshold)
    if args.json:
        atomic_write_text(args.json, json.dumps([asdict(r) for r in report.rows], indent=1, default=repr))
    print(format_report(report))
    return 0 if report.ok else 1
