"""``rlvr verify``, ``rlvr verifiers list`` and ``rlvr verifiers audit`` (verifiers/cli.py)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.verifiers.errors import UserError

from rlvr.verifiers import Reward, Verifier, cli, register_verifier
from rlvr.verifiers.audit import audit, format_report, verdict

ROOT = Path(__file__).resolve().parents[1]


def run(argv: list[str]) -> int:
    """The command as a user runs it (a user error is one line on stderr and exit status 2)."""
    from rlvr.cli import main

    return main(argv)


def test_every_option_has_help():
    parser = argparse.ArgumentParser(prog="rlvr")
    sub = parser.add_subparsers(dest="command")
    cli.add_parser(sub)
    seen = 0
    stack = [parser]
    while stack:
        p = stack.pop()
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
            elif not isinstance(action, argparse._HelpAction):
                assert action.help, f"{p.prog}: {action.dest} has no help"
                seen += 1
    assert seen >= 12


def test_parse_options():
    assert cli.parse_options(["tolerance=1e-6", "fallback=none", 'parts=[{"name": "math"}]', "flag=true"]) == {
        "tolerance": 1e-6, "fallback": "none", "parts": [{"name": "math"}], "flag": True}
    assert cli.parse_options(["a=1"], '{"a": 0, "b": 2}') == {"a": 1, "b": 2}
    with pytest.raises(UserError, match="--option expects KEY=VALUE, got 'no_equals_sign'"):
        cli.parse_options(["no_equals_sign"])


def test_verify_scores_a_file_and_writes_rewards(tmp_path, capsys):
    lines = [
        {"completion": "so the answer is \\boxed{42}", "answer": "42"},
        {"completion": "The answer is 41.", "answer": "42"},
        {"completion": "\\boxed{1,234}", "reference": {"answer": "1234"}, "id": 7},
        {"completion": "\\boxed{3} or \\boxed{4}", "answer": "3"},
    ]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert run(["verify", "--verifier", "math", "--option", "tolerance=1e-6", "--input", str(src),
                "--output", str(out), "--workers", "0"]) == 0
    printed = capsys.readouterr().out
    assert "4 items" in printed and "mean score     0.5000" in printed
    assert "status         ok 4" in printed and "p50" in printed and "p95" in printed
    written = [json.loads(x) for x in out.read_text().splitlines()]
    assert [w["reward"]["score"] for w in written] == [1.0, 0.0, 1.0, 0.0]
    assert written[2]["id"] == 7 and written[0]["reward"]["info"]["extracted"] == "42"


def test_verify_with_workers_and_a_composite(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"completion": "<think>6*7</think><answer>42</answer>", "answer": "42"}) + "\n")
    rc = run(["verify", "--verifier", "compose", "--options", '{"mode": "gate", "parts": ["format", "math"]}',
              "--input", str(src), "--workers", "1", "--timeout", "5"])
    assert rc == 0 and "mean score     1.0000" in capsys.readouterr().out


def test_verify_rejects_lines_without_a_completion(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "x", "answer": "1"}) + "\n")
    assert run(["verify", "--verifier", "math", "--input", str(src), "--workers", "0"]) == 2
    assert "no 'completion' field" in capsys.readouterr().err


def test_verifiers_list(capsys):
    assert run(["verifiers", "list"]) == 0
    text = capsys.readouterr().out
    for name in ("math", "numeric", "format", "length", "repetition", "compose", "trl"):
        assert f"\n{name} " in "\n" + text
    assert "tolerance=1e-06" in text
    assert run(["verifiers", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {d["name"] for d in listed} >= {"math", "compose"}


def test_audit_math_catches_hedges_and_hostile_input(tmp_path, capsys):
    rows = tmp_path / "rows.json"
    assert run(["verifiers", "audit", "math", "--json", str(rows)]) == 0
    text = capsys.readouterr().out
    assert "result: PASS" in text and "LET THROUGH" in text  # format hacks: reported, not the math verifier's job
    data = json.loads(rows.read_text())
    by_category = {}
    for row in data:
        by_category.setdefault(row["category"], set()).add(row["verdict"].split(" (")[0])
    assert by_category["hedging"] == {"caught"}
    assert by_category["pathological"] == {"caught"} and by_category["giant"] == {"caught"}
    assert by_category["golden"] <= {"ok", "caught"}


def test_audit_reports_a_verifier_that_lets_things_through(capsys):
    # numeric reads the last number: a hedge "41 or 42" gets credit; the audit must say so
    report = audit("compose", {"parts": [{"name": "numeric"}]}, timeout_s=3)
    assert not report.ok
    assert any(r.verdict == "LET THROUGH" and r.category == "hedging" for r in report.rows)
    assert "result: FAIL" in format_report(report)


def test_audit_gate_format_then_math_catches_format_hacks():
    report = audit("compose", {"mode": "gate", "parts": ["format", "math"]}, timeout_s=3)
    assert report.ok
    assert all(r.verdict.startswith("caught") for r in report.rows if r.category == "format_hack")


@register_verifier("test_needs_tests")
class NeedsTests(Verifier):
    """Understands only {"tests": [...]} references (like a code verifier)."""

    def score(self, completion, reference):
        if "tests" not in reference:
            return Reward(0.0, status="error", info={"error": "reference has no tests"})
        return Reward(1.0)


def test_audit_of_a_verifier_with_another_reference_shape():
    report = audit("test_needs_tests", timeout_s=3)
    assert "audit_cases()" in report.note and "no built-in golden set" in report.note
    assert not [r for r in report.rows if r.category == "golden"]  # the math set is not its yardstick
    assert all(r.verdict.startswith("caught") for r in report.rows if r.category in ("giant", "pathological"))
    # every probe errored (none has the reference it understands): nothing was scored, so it cannot pass
    assert report.scored == 0 and not report.ok
    result = format_report(report).splitlines()[-1]
    assert result.startswith("result: FAIL (no probe was scored: error ") and "reference has no tests" in result
    assert "audit_reference" in result


@register_verifier("test_other_kind")
class OtherKind(Verifier):
    """A plugin that scores something else than final answers, and scores 0 (not error) on them."""

    def score(self, completion, reference):
        return Reward(float(completion.strip().endswith(".")))


def test_audit_of_a_non_answer_plugin_passes_without_the_math_set(capsys):
    """Before: the math golden set was applied to every verifier without audit_cases(), so a
    plugin of another kind failed its audit by default (MISSED on every math golden case)."""
    assert run(["verifiers", "audit", "test_other_kind"]) == 0
    text = capsys.readouterr().out
    assert "result: PASS" in text and "kind 'other'" in text and "MISSED" not in text


def test_verdicts():
    assert verdict("accept", 1.0, "ok") == "ok"
    assert verdict("accept", 1.0, "timeout") == "MISSED"
    assert verdict("reject", 0.0, "ok") == "caught"
    assert verdict("reject", 1.0, "ok") == "LET THROUGH"
    assert verdict("reject", 0.0, "timeout") == "caught (timeout)"
    assert verdict(-0.5, -0.5, "ok") == "ok" and verdict(-0.5, 0.0, "ok") == "WRONG"


def test_commands_do_not_import_torch():
    code = ("import sys, argparse; from verifiers import Reward, Verifier, cli, register_verifier; p = argparse.ArgumentParser(); "
            "cli.add_parser(p.add_subparsers()); assert 'torch' not in sys.modules")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_through_the_rlvr_command_line(tmp_path, capsys):
    import rlvr.cli as rlvr_cli

    assert "rlvr.verifiers.cli" in rlvr_cli.COMMAND_MODULES
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"completion": "\\boxed{42}", "answer": "42"}) + "\n")
    assert rlvr_cli.main(["verify", "--verifier", "math", "--input", str(src), "--workers", "0"]) == 0
    assert "mean score     1.0000" in capsys.readouterr().out
    assert rlvr_cli.main(["verifiers", "list"]) == 0
    assert "compose" in capsys.readouterr().out


@register_verifier("test_errors_on_x")
class ErrorsOnX(Verifier):
    def score(self, completion, reference):
        if "x" in completion:
            raise ValueError("cannot read x")
        return Reward(1.0 if completion == "good" else 0.0)


def test_verify_mean_is_over_scored_items_and_errors_are_counted_apart(tmp_path, capsys):
    """Before: an error counted as a score of 0 in the mean, while training masks it."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"completion": c}) + "\n" for c in ["good", "bad", "x", "x"]))
    assert run(["verify", "--verifier", "test_errors_on_x", "--input", str(src), "--workers", "0"]) == 0
    printed = capsys.readouterr().out
    assert "mean score     0.5000 over the 2 scored items (status ok); 2 not scored" in printed
    assert "error 2" in printed and "ok 2" in printed


@register_verifier("test_continuous_overlap")
class ContinuousOverlap(Verifier):
    """Share of the reference's words found in the completion: partial credit everywhere."""

    pass_threshold = 0.5

    def score(self, completion, reference):
        words = str(reference.get("text", "the quick brown fox")).split()
        found = sum(w in completion for w in words)
        return Reward(found / len(words) if words else 0.0)

    def audit_cases(self):
        ref = {"text": "the quick brown fox"}
        return [
            {"id": "golden-1", "category": "golden", "completion": "the quick brown fox", "reference": ref, "expect": "accept"},
            {"id": "golden-2", "category": "golden", "completion": "quick brown fox", "reference": ref, "expect": "accept"},
            {"id": "wrong-1", "category": "golden", "completion": "a lazy dog, quick", "reference": ref, "expect": "reject"},
        ]


def test_a_continuous_verifier_is_judged_by_its_pass_threshold(capsys):
    """Before: hostile probes earning a little partial credit (0.25) failed the audit, exit 1."""
    report = audit("test_continuous_overlap", timeout_s=3)
    assert report.threshold == 0.5 and report.ok
    worst = report.worst_rejected()
    assert worst is not None and worst.score == 0.25 and worst.verdict == "caught"
    binary = audit("test_continuous_overlap", timeout_s=3, threshold=None)
    assert binary.ok  # the class attribute still applies when no threshold is passed
    assert run(["verifiers", "audit", "test_continuous_overlap"]) == 0
    text = capsys.readouterr().out
    assert "pass threshold of a continuous reward" in text and "highest score of a response that must not pass: 0.25" in text
    assert run(["verifiers", "audit", "test_continuous_overlap", "--threshold", "0.2"]) == 1  # 0.25 now passes: a leak
    assert "LET THROUGH" in capsys.readouterr().out
