"""Cases derived from real benchmark data (MATH-500, GSM8K) in ``../shared/data``.

* ``real_math500``: every MATH-500 reference solution scored against its own gold answer (1), and
  against that gold with one digit changed (0; kept only where math-verify agrees the two differ);
* ``real_gsm8k``: GSM8K test solutions (``#### N``) against N (1) and N+1 (0);
* ``real_hedging``: a MATH-500 solution followed by a second, different boxed answer, in three
  phrasings, and the gold offered next to a wrong answer in four phrasings, either order (all 0);
* ``real_answers``: MATH-500 golds, right (1) and with one digit changed (0), in four answer formats.

Built at load time (not stored) so the data stays where its licence file is; callers skip when
the data folder is absent. ``full=True`` adds the 4,500 MATH test problems outside MATH-500 (gold: the
solution's only box) and the 7,473 GSM8K training solutions.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
ANSWER_TEMPLATES = ("The final answer is $\\boxed{%s}$.", "Answer: %s", "<think>Work.</think><answer>%s</answer>",
                    "So the answer is %s.")
ANSWER_HEDGES = ("$\\boxed{%s}$ or $\\boxed{%s}$", "The answer is %s. Alternatively, it could be %s.",
                 "\\boxed{%s}\n\nAnswer: %s", "The answer is %s or %s.")
HEDGE_TEMPLATES = (
    "{solution}\n\nAlternatively, the answer could be $\\boxed{{{wrong}}}$.",
    "{solution}\n\nHmm, or maybe $\\boxed{{{wrong}}}$.",
    "Two candidates: $\\boxed{{{wrong}}}$ or the following.\n\n{solution}",
)


def _rows(path: Path) -> list[dict]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def perturb(answer: str) -> str | None:
    """The answer with its first digit changed (``\\frac{14}{3}`` -> ``\\frac{24}{3}``); None if it has none."""
    m = re.search(r"\d", answer)
    if not m:
        return None
    digit = str((int(m.group(0)) + 1) % 10)
    return answer[: m.start()] + digit + answer[m.end():]


def _differs(gold: str, wrong: str) -> bool:
    """math-verify's independent opinion that two answers differ (its timeouts work: main thread)."""
    from math_verify import parse, verify

    try:
        return not verify(parse(f"${gold}$"), parse(f"${wrong}$"))
    except Exception:
        return False


def real_cases(data: Path = DATA, *, gsm8k: int = 300, hedges: int = 200, full: bool = False) -> list[dict]:
    """The real-data cases (module docstring); ``[]`` when ``data`` is absent."""
    cases: list[dict] = []
    math500_path = data / "math500" / "test.jsonl"
    if math500_path.exists():
        rows = _rows(math500_path)
        cases += _math_cases(rows, "real_math500")
        for i, row in enumerate(rows[: hedges]):
            gold, wrong = row["answer"], perturb(row["answer"])
            if not (wrong and _differs(gold, wrong)):
                continue
            note = row.get("unique_id", "")
            template = HEDGE_TEMPLATES[i % len(HEDGE_TEMPLATES)]
            cases.append(_case("real_hedging", template.format(solution=row["solution"], wrong=wrong), gold, 0, note))
            for t in ANSWER_TEMPLATES:  # the real gold, and a wrong one, in the usual answer formats
                if "\\begin" in gold and t.startswith("Answer"):
                    continue  # a multi-line environment on an "Answer:" line is not a format anyone writes
                cases.append(_case("real_answers", t % gold, gold, 1, note))
                cases.append(_case("real_answers", t % wrong, gold, 0, note))
            for t in ANSWER_HEDGES:  # both answers offered, in either order
                cases.append(_case("real_hedging", t % (gold, wrong), gold, 0, note))
                cases.append(_case("real_hedging", t % (wrong, gold), gold, 0, note))
        if full and (data / "math" / "test.jsonl").exists():
            seen = {r["problem"] for r in rows}
            others = [r for r in _rows(data / "math" / "test.jsonl") if r["problem"] not in seen]
            for r in others:  # gold = the solution's box; solutions with several different boxes are skipped
                r["answer"] = _only_boxed(r["solution"])
            cases += _math_cases([r for r in others if r["answer"]], "real_math")
    gsm8k_path = data / "gsm8k" / "test.jsonl"
    if gsm8k_path.exists():
        rows = _rows(gsm8k_path)[:gsm8k]
        if full and (data / "gsm8k" / "train.jsonl").exists():
            rows += _rows(data / "gsm8k" / "train.jsonl")
        for row in rows:
            gold = row["answer"].rsplit("####", 1)[1].strip().replace(",", "")
            cases.append(_case("real_gsm8k", row["answer"], gold, 1, row["question"][:40]))
            cases.append(_case("real_gsm8k", row["answer"], str(int(gold) + 1), 0, row["question"][:40]))
    return cases


def truncated_cases(data: Path = DATA, *, n: int = 300, seed: int = 0) -> list[dict]:
    """Reference solutions cut off mid-reasoning, as a length-limited generation leaves them: GSM8K
    test solutions cut before their ``####`` line and MATH-500 solutions cut before their first box,
    each at a random word boundary in the last 60% of the reasoning. Scored against the real gold
    with ``finish_reason="length"`` they have no final answer (expected 0); the field
    ``finish_reason`` says so. The whole solutions followed by the start of a check and cut there
    keep their final marker (1)."""
    import random

    rng = random.Random(seed)
    cases: list[dict] = []
    sources = [("gsm8k", data / "gsm8k" / "test.jsonl"), ("math500", data / "math500" / "test.jsonl")]
    for name, path in sources:
        if not path.exists():
            continue
        for row in _rows(path)[:n]:
            if name == "gsm8k":
                solution = row["answer"]
                gold = solution.rsplit("####", 1)[1].strip().replace(",", "")
                body = solution.rsplit("####", 1)[0]
            else:
                solution, gold = row["solution"], row["answer"]
                body = solution[: solution.find("\\boxed")] if "\\boxed" in solution else ""
            spaces = [i for i, c in enumerate(body) if c == " " and i >= 0.4 * len(body)]
            if not spaces:
                continue
            cut = body[: rng.choice(spaces)]
            cases.append({**_case(f"truncated_{name}", cut, gold, 0, "cut mid-reasoning"), "finish_reason": "length"})
            # the whole solution and the start of a check after it, cut there: its final marker counts
            cases.append({**_case(f"truncated_{name}", solution + "\n\nLet me double-check", gold, 1,
                                  "whole solution, then cut"), "finish_reason": "length"})
    return cases


def _math_cases(rows: list[dict], category: str) -> list[dict]:
    out = []
    for row in rows:
        out.append(_case(category, row["solution"], row["answer"], 1, row.get("unique_id", "")))
        wrong = perturb(row["answer"])
        if wrong and _differs(row["answer"], wrong):
            out.append(_case(category, row["solution"], wrong, 0, row.get("unique_id", "")))
    return out


def _only_boxed(solution: str) -> str | None:
    from rlvr.verifiers.math.extract import find_boxed

    contents = {b[2].strip() for b in find_boxed(solution)}
    return contents.pop() if len(contents) == 1 else None


def _case(category: str, completion: str, answer: str, expected: int, note: str) -> dict:
    return {"category": category, "completion": completion, "answer": answer, "expected": expected, "note": note}


def load_cases(*, real: bool = True, full: bool = False) -> list[dict]:
    """Hand-made cases (``cases.jsonl``) plus, when the data is present, the real-data cases."""
    cases = _rows(Path(__file__).with_name("cases.jsonl"))
    if real:
        cases += with_ids(real_cases(full=full))
    return cases


def with_ids(cases: list[dict]) -> list[dict]:
    """``cases`` with an ``id`` each, ``<category>-NNNN`` in order (stable while the data and the
    arguments of :func:`real_cases` are)."""
    counts: dict[str, int] = {}
    for c in cases:
        counts[c["category"]] = counts.get(c["category"], 0) + 1
        c["id"] = f"{c['category']}-{counts[c['category']]:04d}"
    return cases
