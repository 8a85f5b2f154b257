"""Benchmark the ``math`` verifier and the runner; plain math-verify side by side.

    python benchmarks/verifiers.py            # hand-made + MATH-500/GSM8K-derived cases (5,679)
    python benchmarks/verifiers.py --full     # + the 4,500 other MATH test problems and GSM8K train (29,502)
    python benchmarks/verifiers.py --json out.json

Prints, for the case set in tests/verifier_cases (see its README in build.py / real.py):

* accuracy per category and overall, and hedging false positives, for ``math`` and for plain
  math-verify (``verify(parse("$gold$"), parse(completion))``, its defaults, main thread);
* latency (median, p95, mean) and cases/s on one core, both sequential and in-process;
* hostile input: every probe scored in-process from a worker thread (must not hang: a probe that
  takes longer than 10 s counts as a hang) and through the runner's worker pool;
* runner throughput with worker processes (cache off), for ``math`` and the cheap ``numeric``;
* Math-Verify's own unit tests (``tests/verifier_cases/math_verify_suite.py`` reads their labelled
  pairs from the math-verify 0.9.0 sdist named by ``$RLVR_MATH_VERIFY_TESTS`` or unpacked under
  ``~/.cache/rlvr/math-verify-suite``): how many labels ``math`` and plain math-verify agree with;
* truncated completions (GSM8K / MATH-500 solutions cut mid-reasoning, ``real.truncated_cases``):
  how many are credited or have an answer extracted when scored with ``finish_reason=None`` (as a
  verifier that is not told sees them) and with ``finish_reason="length"``, and how many whole
  solutions marked ``length`` keep their credit.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlvr.verifiers import get_verifier  # noqa: E402
from rlvr.verifiers.runner import VerifierRunner  # noqa: E402

HANG_S = 10.0


def _real_module():
    spec = importlib.util.spec_from_file_location("verifier_cases_real", ROOT / "tests" / "verifier_cases" / "real.py")
    real = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real)
    return real


def load_cases(full: bool) -> list[dict]:
    return _real_module().load_cases(real=True, full=full)


def math_verify_suite(baseline: bool = True) -> dict:
    """Agreement with the labels of Math-Verify's own tests, ``math`` and plain math-verify side by side;
    ``{}`` when the suite is not on this machine."""
    spec = importlib.util.spec_from_file_location("verifier_cases_math_verify_suite",
                                                  ROOT / "tests" / "verifier_cases" / "math_verify_suite.py")
    suite = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = suite
    spec.loader.exec_module(suite)
    tests_dir = suite.suite_dir()
    if tests_dir is None:
        return {}
    pairs, skipped = suite.extract_pairs(tests_dir)
    ours = suite.score_ours(pairs)
    out = {"tests_dir": str(tests_dir), "pairs": len(pairs), "skipped": skipped,
           "rlvr math": sum(ours[p.id] == p.expected for p in pairs),
           "rlvr math disagrees": [p.id for p in pairs if ours[p.id] != p.expected]}
    if baseline:
        plain = suite.score_math_verify(pairs)
        out["math-verify"] = sum(plain[p.id] == p.expected for p in pairs)
        out["math-verify disagrees"] = [p.id for p in pairs if plain[p.id] != p.expected]
    return out


def truncation() -> dict:
    """Cut-off solutions scored without and with ``finish_reason="length"`` (module docstring)."""
    real = _real_module()
    if not hasattr(real, "truncated_cases"):
        return {}
    verifier = get_verifier("math")
    told = "finish_reason" in inspect.signature(verifier.score).parameters
    out: dict = {}
    for c in real.truncated_cases():
        row = out.setdefault(f"{c['category']} ({'cut' if c['expected'] == 0 else 'whole'})",
                             {"cases": 0, "credited_unknown": 0, "extracted_unknown": 0,
                              "credited_length": 0, "extracted_length": 0})
        row["cases"] += 1
        for reason in (None, "length"):
            kwargs = {"finish_reason": reason} if told else {}
            r = verifier.score(c["completion"], {"answer": c["answer"]}, **kwargs)
            key = "unknown" if reason is None else "length"
            row[f"credited_{key}"] += r.score > 0
            row[f"extracted_{key}"] += r.info.get("extracted") is not None
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def score_ours(cases: list[dict]) -> list[tuple[float, str, float]]:
    verifier = get_verifier("math")
    out = []
    for c in cases:
        start = time.perf_counter()
        r = verifier.score(c["completion"], {"answer": c["answer"]})
        out.append((r.score, r.status, time.perf_counter() - start))
    return out


def score_math_verify(cases: list[dict]) -> list[tuple[float, str, float]]:
    from math_verify import parse, verify

    out = []
    for c in cases:
        start = time.perf_counter()
        try:
            ok = verify(parse(f"${c['answer']}$"), parse(c["completion"]))
            status = "ok"
        except Exception:
            ok, status = False, "error"
        out.append((float(ok), status, time.perf_counter() - start))
    return out


def accuracy_table(cases: list[dict], results: dict[str, list]) -> dict:
    table: dict = {}
    for name, rows in results.items():
        per = defaultdict(lambda: [0, 0])
        hedge_fp = 0
        for c, (score, status, _) in zip(cases, rows):
            right = status == "ok" and score == c["expected"]
            per[c["category"]][0] += right
            per[c["category"]][1] += 1
            hedge_fp += "hedging" in c["category"] and score != 0.0
        total = sum(a for a, _ in per.values())
        lat = [r[2] for r in rows]
        table[name] = {
            "accuracy": total / len(cases), "correct": total, "cases": len(cases), "hedging_false_positives": hedge_fp,
            "per_category": {k: {"correct": a, "cases": n} for k, (a, n) in per.items()},
            "latency_ms": {"median": 1e3 * statistics.median(lat), "p95": 1e3 * pct(lat, 0.95),
                           "mean": 1e3 * statistics.mean(lat)},
            "cases_per_s_one_core": len(lat) / sum(lat),
        }
    return table


def hostile_probes() -> list[str]:
    from rlvr.verifiers.golden import safety_probes

    return [p["completion"] for p in safety_probes() if p["category"] != "reference"] + [
        "The answer is " + "1e|" * 1000, r"\boxed{" + r"1 \pm " * 200 + "1}", r"\boxed{9^{9^{9^{9}}}}"]


def hostile_in_threads(probes: list[str]) -> dict:
    """Each probe in a fresh thread of this process, no deadline around it: does the verifier return?"""
    verifier = get_verifier("math")
    worst, hangs = 0.0, 0
    for text in probes:
        done = {}
        thread = threading.Thread(target=lambda: done.update(r=verifier.score(text, {"answer": "42"})), daemon=True)
        start = time.perf_counter()
        thread.start()
        thread.join(HANG_S)
        elapsed = time.perf_counter() - start
        hangs += thread.is_alive()
        worst = max(worst, elapsed)
    return {"probes": len(probes), "hangs": hangs, "worst_s": worst}


def hostile_through_runner(probes: list[str]) -> dict:
    result: dict = {}

    def work() -> None:
        with VerifierRunner(workers=2, timeout_s=5.0, cache_size=0) as runner:
            start = time.perf_counter()
            rewards = runner.score_batch("math", probes, [{"answer": "42"}] * len(probes))
            result["seconds"] = time.perf_counter() - start
            result["statuses"] = {s: sum(r.status == s for r in rewards) for s in ("ok", "error", "timeout")}
            result["credited"] = sum(r.score > 0 for r in rewards)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(120)
    result["hung"] = thread.is_alive()
    return result


def runner_throughput(cases: list[dict], workers: int) -> dict:
    completions = [c["completion"] for c in cases]
    references = [{"answer": c["answer"]} for c in cases]
    out = {}
    with VerifierRunner(workers=workers, timeout_s=10.0, cache_size=0) as runner:
        runner.score_batch("numeric", ["1"], [{"answer": "1"}])  # start the pool outside the timing
        for name in ("math", "numeric"):
            start = time.perf_counter()
            for i in range(0, len(cases), 256):
                runner.score_batch(name, completions[i: i + 256], references[i: i + 256])
            out[name] = len(cases) / (time.perf_counter() - start)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="add the 4,500 MATH test problems outside MATH-500")
    parser.add_argument("--no-baseline", action="store_true", help="skip plain math-verify")
    parser.add_argument("--workers", type=int, default=2, help="worker processes for the runner numbers (default 2)")
    parser.add_argument("--json", type=Path, help="write the numbers to this JSON file")
    args = parser.parse_args()

    cases = load_cases(args.full)
    print(f"{len(cases)} cases in {len({c['category'] for c in cases})} categories")
    results = {"rlvr math": score_ours(cases)}
    if not args.no_baseline:
        results["math-verify"] = score_math_verify(cases)
    table = accuracy_table(cases, results)

    names = list(results)
    print(f"\n{'category':<22}" + "".join(f"{n:>16}" for n in names))
    for category in sorted(table[names[0]]["per_category"]):
        cells = [table[n]["per_category"][category] for n in names]
        print(f"{category:<22}" + "".join(f"{c['correct']:>9}/{c['cases']:<6}" for c in cells))
    for label, key in [("accuracy", "accuracy"), ("hedging false pos.", "hedging_false_positives")]:
        print(f"{label:<22}" + "".join(f"{table[n][key]:>16.4f}" if key == "accuracy" else f"{table[n][key]:>16}"
                                        for n in names))
    for label, key in [("median latency ms", "median"), ("p95 latency ms", "p95"), ("mean latency ms", "mean")]:
        print(f"{label:<22}" + "".join(f"{table[n]['latency_ms'][key]:>16.3f}" for n in names))
    print(f"{'cases/s/core':<22}" + "".join(f"{table[n]['cases_per_s_one_core']:>16.0f}" for n in names))

    probes = hostile_probes()
    threads = hostile_in_threads(probes)
    print(f"\nhostile input, in-process from a worker thread: {threads['probes']} probes, {threads['hangs']} hangs, "
          f"slowest {threads['worst_s']:.2f} s")
    pooled = hostile_through_runner(probes)
    print(f"hostile input through the runner (2 workers, 5 s deadline, called from a thread): hung={pooled['hung']}, "
          f"{pooled.get('statuses')}, credited {pooled.get('credited')}, {pooled.get('seconds', 0):.1f} s")

    throughput = runner_throughput(cases[:2000], args.workers)
    in_process = runner_throughput(cases[:2000], 0)
    print(f"runner throughput, cache off: {args.workers} workers: math {throughput['math']:.0f}/s, numeric "
          f"{throughput['numeric']:.0f}/s; in-process: math {in_process['math']:.0f}/s, numeric {in_process['numeric']:.0f}/s")

    mv_suite = math_verify_suite(baseline=not args.no_baseline)
    if mv_suite:
        line = (f"\nMath-Verify's own tests ({mv_suite['pairs']} labelled pairs): rlvr math agrees on "
                f"{mv_suite['rlvr math']}")
        if "math-verify" in mv_suite:
            line += f", plain math-verify on {mv_suite['math-verify']}"
        print(line)
        print(f"  rlvr math disagrees: {', '.join(mv_suite['rlvr math disagrees'])}")
        if "math-verify" in mv_suite:
            print(f"  math-verify disagrees: {', '.join(mv_suite['math-verify disagrees'])}")
    else:
        print("\nMath-Verify's own tests: not found (set RLVR_MATH_VERIFY_TESTS; see tests/test_math_verify_suite.py)")

    truncated = truncation()
    if truncated:
        print("\ntruncated completions: credited / answer extracted, finish_reason=None vs 'length'")
        for name, row in truncated.items():
            print(f"  {name:<26} {row['cases']:>4} cases: None {row['credited_unknown']:>4} / {row['extracted_unknown']:<4}"
                  f"  length {row['credited_length']:>4} / {row['extracted_length']}")

    if args.json:
        args.json.write_text(json.dumps({"accuracy": table, "hostile_threads": threads, "hostile_runner": pooled,
                                         "runner_items_per_s": {"workers": throughput, "in_process": in_process},
                                         "truncated": truncated, "math_verify_suite": mv_suite},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
