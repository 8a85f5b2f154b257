"""What the commands write, and how they fail: ``rlvr eval --out``, ``rlvr verify --output``,
``rlvr preferences --out`` and ``rlvr verifiers audit --json`` check their output path before any
work (an occupied one is refused unless ``--overwrite``, missing parent folders are created);
bad sampling flags, a closed pipe and a verifier that fails on everything are reported, not
tracebacks or a silent exit 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _rlvr(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_line_error(err: str) -> str:
    """The message of a user error: one line (plus the --debug hint), no traceback."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line and not line.startswith("(rlvr --debug")]
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------------------------------------
# output paths: checked before any work, occupied ones refused, parents created
# ---------------------------------------------------------------------------------------------

EVAL = ["eval", "--task", "arithmetic", "--task-option", "style=bare", "--task-option", "max_digits=1", "--limit", "2",
        "--max-new-tokens", "2", "--workers", "0"]


def test_eval_refuses_a_folder_holding_an_evaluation_before_loading_anything(tmp_path, capsys):
    (tmp_path / "summary.json").write_text('{"pass@1": 0.5}')
    code, out, err = _rlvr([*EVAL, "--model", str(tmp_path / "no-such-model"), "--out", str(tmp_path)], capsys)
    assert code == 2 and not out
    line = _one_line_error(err)
    assert f"--out {tmp_path} already holds an evaluation (summary.json)" in line
    assert "--overwrite" in line and "no-such-model" not in line  # refused before the model was looked at
    assert (tmp_path / "summary.json").read_text() == '{"pass@1": 0.5}'


def test_eval_refuses_a_file_as_its_out_folder(tmp_path, capsys):
    target = tmp_path / "results"
    target.write_text("keep me")
    code, out, err = _rlvr([*EVAL, "--model", str(tmp_path / "no-such-model"), "--out", str(target)], capsys)
    assert code == 2 and "pass@1" not in out
    assert f"--out {target} is a file, not a folder" in _one_line_error(err)
    assert target.read_text() == "keep me"


def test_eval_writes_into_a_new_folder_and_replaces_only_with_overwrite(tiny_model, tmp_path, capsys):
    out = tmp_path / "evals" / "first"
    code, _, err = _rlvr([*EVAL, "--model", str(tiny_model), "--out", str(out)], capsys)
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["problems"] == 2
    (out / "summary.json").write_text('{"marker": 1}')
    code, _, err = _rlvr([*EVAL, "--model", str(tiny_model), "--out", str(out)], capsys)
    assert code == 2 and "already holds an evaluation" in err
    assert json.loads((out / "summary.json").read_text()) == {"marker": 1}
    code, _, err = _rlvr([*EVAL, "--model", str(tiny_model), "--out", str(out), "--overwrite"], capsys)
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["problems"] == 2


def _completions(tmp_path: Path) -> Path:
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"completion": "\\boxed{4}", "answer": "4"}) + "\n")
    return src


def test_verify_refuses_an_existing_output_before_reading_the_input(tmp_path, capsys):
    out = tmp_path / "scored.jsonl"
    out.write_text("old\n")
    code, _, err = _rlvr(["verify", "--verifier", "math", "--input", str(tmp_path / "missing.jsonl"),
                          "--output", str(out), "--workers", "0"], capsys)
    assert code == 2
    line = _one_line_error(err)
    assert f"--output {out} already exists" in line and "--overwrite" in line
    assert out.read_text() == "old\n"
    code, _, err = _rlvr(["verify", "--verifier", "math", "--input", str(_completions(tmp_path)), "--output", str(out),
                          "--workers", "0", "--overwrite"], capsys)
    assert code == 0, err
    assert json.loads(out.read_text())["reward"]["score"] == 1.0


def test_verify_creates_missing_folders_and_refuses_a_folder(tmp_path, capsys):
    src = _completions(tmp_path)
    out = tmp_path / "a" / "b" / "scored.jsonl"
    code, _, err = _rlvr(["verify", "--verifier", "math", "--input", str(src), "--output", str(out), "--workers", "0"],
                         capsys)
    assert code == 0, err
    assert json.loads(out.read_text())["reward"]["status"] == "ok"
    code, _, err = _rlvr(["verify", "--verifier", "math", "--input", str(src), "--output", str(tmp_path / "a"),
                          "--workers", "0", "--overwrite"], capsys)
    assert code == 2
    assert f"--output {tmp_path / 'a'} is a folder, not a file" in _one_line_error(err)


def test_an_output_under_a_file_is_one_line(tmp_path, capsys):
    src = _completions(tmp_path)
    blocker = tmp_path / "plain_file"
    blocker.write_text("")
    code, _, err = _rlvr(["verify", "--verifier", "math", "--input", str(src), "--output", str(blocker / "out.jsonl"),
                          "--workers", "0"], capsys)
    assert code == 2
    line = _one_line_error(err)
    assert f"--output {blocker / 'out.jsonl'}: cannot write" in line and str(blocker) in line


def test_audit_json_is_checked_first_and_its_folders_created(tmp_path, capsys):
    rows = tmp_path / "audit.json"
    rows.write_text("[]")
    code, out, err = _rlvr(["verifiers", "audit", "numeric", "--json", str(rows)], capsys)
    assert code == 2 and "audit of verifier" not in out  # nothing ran
    assert f"--json {rows} already exists" in _one_line_error(err)
    assert rows.read_text() == "[]"
    nested = tmp_path / "reports" / "numeric.json"
    code, _, err = _rlvr(["verifiers", "audit", "numeric", "--json", str(nested)], capsys)
    assert code == 0, err
    assert json.loads(nested.read_text())
    code, _, err = _rlvr(["verifiers", "audit", "numeric", "--json", str(rows), "--overwrite"], capsys)
    assert code == 0, err
    assert json.loads(rows.read_text())


def test_preferences_refuses_an_existing_out_before_loading_the_model(tmp_path, capsys):
    pairs = tmp_path / "prefs.jsonl"
    pairs.write_text('{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n')
    code, _, err = _rlvr(["preferences", "--model", str(tmp_path / "no-such-model"), "--task", "arithmetic",
                          "--out", str(pairs)], capsys)
    assert code == 2
    line = _one_line_error(err)
    assert f"--out {pairs} already exists" in line and "--overwrite" in line and "no-such-model" not in line
    code, _, err = _rlvr(["preferences", "--model", str(tmp_path / "no-such-model"), "--task", "arithmetic",
                          "--out", str(tmp_path)], capsys)
    assert code == 2 and f"--out {tmp_path} is a folder, not a file" in _one_line_error(err)
    # with --overwrite (or a new file) the next check is the model's, and nothing was created on the way
    code, _, err = _rlvr(["preferences", "--model", str(tmp_path / "no-such-model"), "--task", "arithmetic",
                          "--out", str(pairs), "--overwrite"], capsys)
    assert code == 2 and "no-such-model" in _one_line_error(err)
    assert pairs.read_text().startswith('{"prompt": "1+1="')


# ---------------------------------------------------------------------------------------------
# sampling flags: one line naming the flag, not the Python API's argument
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, expected", [
    (["--temperature", "0"], "--temperature must be > 0 when sampling, got 0; for greedy decoding use --greedy"),
    (["--top-p", "0"], "--top-p must lie in (0, 1], got 0"),
    (["--top-p", "1.5"], "--top-p must lie in (0, 1], got 1.5"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1, got 0"),
])
def test_eval_rejects_bad_sampling_flags_in_one_line(tmp_path, capsys, flags, expected):
    code, _, err = _rlvr([*EVAL, "--model", str(tmp_path / "no-such-model"), *flags], capsys)
    assert code == 2
    line = _one_line_error(err)
    assert expected in line and "greedy=True" not in line


def test_eval_greedy_ignores_the_temperature(tmp_path, capsys):
    code, _, err = _rlvr([*EVAL, "--model", str(tmp_path / "no-such-model"), "--greedy", "--temperature", "0"], capsys)
    assert code == 2 and "--temperature" not in err and "no-such-model" in err  # got as far as the model


@pytest.mark.parametrize("flags, expected", [
    (["--temperature", "0"], "--temperature must be > 0, got 0"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1, got 0"),
])
def test_preferences_rejects_bad_sampling_flags_in_one_line(tmp_path, capsys, flags, expected):
    code, _, err = _rlvr(["preferences", "--model", str(tmp_path / "m"), "--task", "arithmetic",
                          "--out", str(tmp_path / "p.jsonl"), *flags], capsys)
    assert code == 2 and expected in _one_line_error(err)


# ---------------------------------------------------------------------------------------------
# a reader that stops early: `rlvr tasks show ... | head -1`
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["tasks", "show", "arithmetic", "-n", "400"],
                                  ["tasks", "show", "arithmetic", "-n", "400", "--json"]])
def test_output_cut_short_by_the_reader_is_not_an_error(argv):
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.cli", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline()  # like `head -1`: one line, then the pipe closes
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


# ---------------------------------------------------------------------------------------------
# a verifier that fails on every item: the cause shown, and no silent success
# ---------------------------------------------------------------------------------------------

BROKEN_VERIFIER = '''
class Broken:
    name = "broken"
    kind = "other"

    def score(self, completion, reference):
        raise RuntimeError("reference has no field 'x'")
'''


@pytest.fixture
def broken_verifier(tmp_path, monkeypatch):
    (tmp_path / "broken_verifier_mod.py").write_text(BROKEN_VERIFIER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return "broken_verifier_mod:Broken"


def test_verify_shows_the_first_error_and_fails_when_nothing_was_scored(broken_verifier, tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"completion": str(i), "answer": str(i)}) + "\n" for i in range(4)))
    code, out, err = _rlvr(["verify", "--verifier", broken_verifier, "--input", str(src), "--workers", "0"], capsys)
    assert "status         error 4" in out
    assert code == 1
    assert f"{src}:1" in err and "RuntimeError: reference has no field 'x'" in err
    assert "nothing was scored (error 4 of 4 items)" in err


def test_verify_with_some_errors_shows_the_first_and_succeeds(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"completion": "\\boxed{4}", "answer": "4"}) + "\n"
                   + json.dumps({"completion": "\\boxed{4}", "answer": "4", "reference": {"nothing": 1}}) + "\n")
    code, out, err = _rlvr(["verify", "--verifier", "math", "--input", str(src), "--workers", "0"], capsys)
    assert code == 0, err
    assert "error 1" in out and f"{src}:2" in err


def test_an_audit_in_which_nothing_was_scored_does_not_pass(broken_verifier, capsys):
    from rlvr.verifiers.audit import audit, format_report

    report = audit(broken_verifier, timeout_s=5)
    assert report.rows and all(r.status == "error" for r in report.rows)
    assert not report.ok
    text = format_report(report)
    assert "result: PASS" not in text
    assert "no probe was scored" in text and "RuntimeError: reference has no field 'x'" in text
    code, out, _ = _rlvr(["verifiers", "audit", broken_verifier], capsys)
    assert code == 1 and "result: FAIL" in out


@pytest.mark.parametrize("argv, expected", [
    (["eval", "--samples", "0"], "--samples must be at least 1, got 0"),
    (["eval", "--batch-prompts", "0"], "--batch-prompts must be at least 1, got 0"),
    (["eval", "--timeout", "0"], "--timeout must be > 0, got 0"),
    (["eval", "--workers", "-1"], "--workers must be at least 0, got -1"),
    (["eval", "--limit", "0"], "--limit must be at least 1, got 0"),
    (["verify", "--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["verify", "--timeout", "0"], "--timeout must be > 0, got 0"),
    (["verifiers", "audit", "numeric", "--timeout", "-1"], "--timeout must be > 0, got -1"),
    (["preferences", "--workers", "-1"], "--workers must be at least 0, got -1"),
])
def test_counts_and_deadlines_out_of_range_are_one_line(tmp_path, capsys, argv, expected):
    src = _completions(tmp_path)
    extra = {"eval": [*EVAL[1:], "--model", str(tmp_path / "m")], "verify": ["--verifier", "math", "--input", str(src)],
             "verifiers": [], "preferences": ["--model", str(tmp_path / "m"), "--task", "arithmetic",
                                              "--out", str(tmp_path / "new" / "p.jsonl")]}[argv[0]]
    code, _, err = _rlvr([argv[0], *extra, *argv[1:]], capsys)
    assert code == 2 and expected in _one_line_error(err)
    assert not (tmp_path / "new").exists()  # refused before the output path was made
