"""Test a verifier before training: golden cases and adversarial probes, as a table.

``audit("math")`` scores the verifier's golden cases (its own ``audit_cases()`` if it has one,
else the built-in set for its ``kind``: the final-answer set of :mod:`verifiers.golden` for
``kind = "answer"``; other kinds have no built-in set, and the report says so) and the hostile-input probes
(giant input, pathological LaTeX, empty answers, missing reference fields) through a
:class:`~verifiers.runner.VerifierRunner` with a worker process, so a hang shows up as a
``timeout`` instead of freezing the audit. Each probe gets a verdict:

============  ==============================================================================
ok            a golden case scored as expected
MISSED        a correct response earned no credit (or the exact score differs: WRONG)
caught        a response that must not earn credit did not (score <= 0, or timeout/error on a generic
              hostile input, where refusing to score is a fair answer)
unscored      the verifier failed (status error) on one of its own cases (its ``audit_cases()`` or the
              built-in golden set) that must not earn credit: no credit, but no catch either, since
              nothing was judged (e.g. the judge's server failed on an injection probe)
LET THROUGH   a wrong, hedged, hacked or hostile response earned credit

For a continuous verifier (one that declares ``pass_threshold``, or audited with ``threshold=``)
"credit" means a score at or above the threshold: golden responses must reach it, the others must
stay below it, and a little partial credit below it is fine. Either way the report names the
highest score any response that must not pass earned.
============  ==============================================================================

``AuditReport.ok`` is False when a golden case failed or a hedge or hostile input got through, when a
probe of the verifier's own cases (its ``audit_cases()`` or the built-in golden set; not the generic
hostile inputs, on which an error is a fair answer) could not be scored, and
when no probe was scored at all (every one ended in an error or a timeout, or abstained: a verifier
that fails on everything "catches" every bad response, which proves nothing); the report then shows
the first error, as it does for any unscored case. Before any probe, a verifier with a
``preflight()`` (the judge: is its server there?) is asked once, so an unreachable judge fails with
its connection error. Format hacks let through by a correctness-only verifier are reported, not failed
(they are the ``format`` verifier's job: compose the two).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rlvr.verifiers import golden
from rlvr.verifiers.registry import get_verifier
from rlvr.verifiers.runner import VerifierRunner

INFORMATIONAL = ("format_hack",)


@dataclass
class AuditRow:
    id: str
    category: str
    expect: object
    score: float
    status: str
    latency_ms: float
    verdict: str
    extracted: object = None
    error: str | None = None  # the verifier's error message, for a probe that errored or timed out
    own: bool = True  # one of the verifier's own cases (not a generic hostile-input probe)


@dataclass
class AuditReport:
    verifier: str
    options: dict
    rows: list[AuditRow] = field(default_factory=list)
    note: str = ""
    threshold: float | None = None  # None: the binary rule (credit > 0)

    def worst_rejected(self) -> AuditRow | None:
        """The response that must not pass with the highest score (None when all failed to score)."""
        scored = [r for r in self.rows if r.expect == "reject" and r.status == "ok"]
        return max(scored, key=lambda r: r.score, default=None)

    @property
    def scored(self) -> int:
        """How many probes the verifier scored (status ``ok``)."""
        return sum(r.status == "ok" for r in self.rows)

    @property
    def ok(self) -> bool:
        if not self.scored:
            return False  # nothing was judged, so nothing was shown to work
        return not any(r.verdict in ("MISSED", "WRONG") or (r.verdict == "LET THROUGH" and r.category not in INFORMATIONAL)
                       or r.verdict.startswith("unscored") for r in self.rows)

    def unscored(self) -> list[AuditRow]:
        """The probes the verifier failed on (status error), which prove nothing either way."""
        return [r for r in self.rows if r.verdict.startswith("unscored")]

    def summary(self) -> dict[str, Counter]:
        by_category: dict[str, Counter] = {}
        for r in self.rows:
            by_category.setdefault(r.category, Counter())[r.verdict.split(" ")[0] if r.verdict != "LET THROUGH" else r.verdict] += 1
        return by_category


def probes_for(verifier) -> tuple[list[dict], str]:
    """The verifier's golden probes plus the safety probes, and a note on where they came from."""
    own = getattr(verifier, "audit_cases", None)
    kind = getattr(verifier, "kind", "other")
    if callable(own):
        cases, note = list(own()), "golden cases: the verifier's own audit_cases()"
    elif kind == "answer":
        cases, note = golden.answer_probes(), "golden cases: the built-in final-answer set (reference {'answer': ...})"
    else:
        cases = []
        note = (f"golden cases: none. There is no built-in golden set for a verifier of kind {kind!r} (only "
                "kind = 'answer' verifiers, which compare a final answer with reference['answer'], get the "
                "final-answer set); only the hostile-input probes ran. Give the verifier an audit_cases() method "
                "(see docs/verifiers.md) to audit what it should accept and reject")
    reference = getattr(verifier, "audit_reference", None)
    cases = [{**case, "own": True} for case in cases]
    return cases + [{**probe, "own": False} for probe in golden.safety_probes(reference)], note


def preflight(verifier) -> None:
    """Call ``verifier.preflight()`` where it has one, and the same for each part of a composite
    (``parts``): a cheap check, before any model is loaded, that the verifier can work (the judge asks
    its server for ``/models``). Raises the verifier's one-line :class:`UserError`."""
    check = getattr(verifier, "preflight", None)
    if callable(check):
        check()
    parts = getattr(verifier, "parts", None)
    if isinstance(parts, (list, tuple)):
        for part in parts:
            preflight(getattr(part, "impl", part))


def verdict(expect: object, score: float, status: str, threshold: float | None = None, *, own_case: bool = False) -> str:
    """The verdict on one probe; ``threshold`` None is the binary rule (credit means score > 0).
    ``own_case``: a probe of the verifier's own cases, on which an error is no catch (``unscored``)."""
    failed = status in ("timeout", "error")
    passes = score > 0 if threshold is None else score >= threshold
    if isinstance(expect, (int, float)) and not isinstance(expect, bool):
        return "ok" if status == "ok" and abs(score - float(expect)) <= 1e-6 else "WRONG"
    if expect == "accept":
        return "ok" if status == "ok" and passes else "MISSED"
    if status == "error" and own_case:
        return "unscored (error)"  # no credit, but nothing was judged: not a catch
    if failed:
        return f"caught ({status})"
    return "LET THROUGH" if passes else "caught"


def audit(name: str, options: dict | None = None, *, timeout_s: float = 5.0, workers: int = 1,
          threshold: float | None = None) -> AuditReport:
    """Run every probe against verifier ``name`` built with ``options``. ``threshold`` (default: the
    verifier's ``pass_threshold``) judges a continuous verifier: see the module docstring."""
    options = dict(options or {})
    verifier = get_verifier(name, **options)
    preflight(verifier)  # an unreachable judge fails here with its connection error, in one line
    probes, note = probes_for(verifier)
    threshold = getattr(verifier, "pass_threshold", None) if threshold is None else threshold
    report = AuditReport(name, options, note=note, threshold=threshold)
    with VerifierRunner(workers=workers, timeout_s=timeout_s, cache_size=0) as runner:
        rewards = runner.score_batch(name, [p["completion"] for p in probes], [p["reference"] for p in probes], options)
    for probe, reward in zip(probes, rewards):
        report.rows.append(AuditRow(probe["id"], probe["category"], probe["expect"], reward.score, reward.status,
                                    1e3 * reward.latency_s, verdict(probe["expect"], reward.score, reward.status, threshold,
                                            own_case=probe.get("own", True)),
                                    reward.info.get("extracted"),
                                    reward.info.get("error") if reward.status in ("error", "timeout") else None,
                                    own=probe.get("own", True)))
    return report


def format_report(report: AuditReport) -> str:
    """The audit as a fixed-width table plus a per-category summary."""
    rule = ("credit: a score > 0 (binary)" if report.threshold is None
            else f"credit: a score >= {report.threshold:g} (pass threshold of a continuous reward)")
    lines = [f"audit of verifier {report.verifier!r} options={report.options}; {rule}", report.note, ""]
    header = f"{'probe':<16} {'category':<13} {'expect':<7} {'score':>8} {'status':<8} {'ms':>8}  verdict"
    lines += [header, "-" * len(header)]
    for r in report.rows:
        lines.append(f"{r.id:<16} {r.category:<13} {str(r.expect):<7} {r.score:>8.3f} {r.status:<8} {r.latency_ms:>8.1f}  {r.verdict}")
    lines += ["", "summary:"]
    for category, counts in report.summary().items():
        parts = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        lines.append(f"  {category:<13} {parts}")
    worst = report.worst_rejected()
    lines.append("")
    if worst is not None:
        lines.append(f"highest score of a response that must not pass: {worst.score:.4g} ({worst.id}, {worst.category})")
    if report.rows and not report.scored:
        statuses = Counter(r.status for r in report.rows)
        first = next((r for r in report.rows if r.error), None)
        cause = f"; the first error ({first.id}): {first.error}" if first is not None else ""
        lines.append(f"result: FAIL (no probe was scored: {', '.join(f'{k} {v}' for k, v in statuses.most_common())} of "
                     f"{len(report.rows)}{cause}). Fix the verifier, or give it the audit_reference its probes should "
                     "use and audit_cases() (docs/verifiers.md)")
    else:
        unscored = report.unscored()
        cause = ""
        if unscored:
            cause = (f"; {len(unscored)} of the verifier's own cases unscored (it failed on them); the first error "
                     f"({unscored[0].id}): {unscored[0].error}")
        if report.ok:
            lines.append("result: PASS")
        else:
            lines.append(f"result: FAIL (see MISSED / WRONG / LET THROUGH / unscored rows{cause})")
    return "\n".join(lines)
