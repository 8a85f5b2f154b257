"""The shared data loader and the ``custom`` suite: file formats, the hub path, where data is
found, and bad data (an error naming file, line and field, or skipped and counted)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from rlvr.tasks import get_task
from rlvr.tasks.loading import DATA_DIR_ENV, DataError, project_data_dir, read_records, resolve_source


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


ROWS = [{"question": "What is 2 + 2?", "answer": "4"}, {"question": "What is 3 * 3?", "answer": 9}]


# --- formats ----------------------------------------------------------------------------------------

def _formats(tmp_path: Path) -> dict[str, Path]:
    import pandas as pd

    jsonl = write_jsonl(tmp_path / "d.jsonl", ROWS)
    gz = tmp_path / "d.jsonl.gz"
    gz.write_bytes(gzip.compress(jsonl.read_bytes()))
    js = tmp_path / "d.json"
    js.write_text(json.dumps(ROWS))
    csv = tmp_path / "d.csv"
    pd.DataFrame(ROWS).to_csv(csv, index=False)
    parquet = tmp_path / "d.parquet"
    pd.DataFrame([{"question": r["question"], "answer": str(r["answer"])} for r in ROWS]).to_parquet(parquet)
    return {"jsonl": jsonl, "jsonl.gz": gz, "json": js, "csv": csv, "parquet": parquet}


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "json", "csv", "parquet"])
def test_custom_suite_reads_every_format(tmp_path, fmt):
    path = _formats(tmp_path)[fmt]
    suite = get_task("custom", path=str(path), prompt_field="question", answer_field="answer")
    assert len(suite) == 2 and suite.default_verifier == "math"
    p = suite[1]
    assert p.reference == {"answer": "9"} and p.verifier == "math" and p.id == "custom/train/1"
    assert p.prompt == [{"role": "user", "content": "What is 3 * 3?\n\nThink step by step, then write the final answer inside \\boxed{}."}]
    from rlvr.verifiers import get_verifier

    assert get_verifier(p.verifier).score("so \\boxed{9}", p.reference).score == 1.0


def test_locations_name_the_line_or_row(tmp_path):
    paths = _formats(tmp_path)
    assert [r.where for r in read_records(str(paths["jsonl"]))] == [f"{paths['jsonl']}:1", f"{paths['jsonl']}:2"]
    assert [r.where for r in read_records(str(paths["csv"]))] == [f"{paths['csv']}:2", f"{paths['csv']}:3"]
    assert read_records(str(paths["parquet"])).__next__().where == f"{paths['parquet']} row 1"
    # blank lines do not shift the line numbers
    gappy = tmp_path / "gappy.jsonl"
    gappy.write_text("\n" + json.dumps(ROWS[0]) + "\n\n" + json.dumps(ROWS[1]) + "\n")
    assert [(r.index, r.where.rsplit(":", 1)[1]) for r in read_records(str(gappy))] == [(0, "2"), (1, "4")]


def test_csv_cells_spanning_lines_keep_their_start_line(tmp_path):
    path = tmp_path / "multi.csv"
    path.write_text('prompt,answer\n"line one\nline two",1\nsecond,2\n')
    records = list(read_records(str(path)))
    assert [r.where.rsplit(":", 1)[1] for r in records] == ["2", "4"]


def test_chat_message_prompts_tests_and_reference_fields(tmp_path):
    chat = write_jsonl(tmp_path / "chat.jsonl", [
        {"messages": [{"role": "user", "content": "Sum 2 and 3."}], "nums": [2, 3], "target": 5, "uid": "a"}])
    suite = get_task("custom", path=str(chat), prompt_field="messages", verifier="countdown",
                     reference_fields={"numbers": "nums", "target": "target"}, id_field="uid", system_prompt="Be brief.")
    p = suite[0]
    assert p.id == "custom/train/a" and p.verifier == "countdown"
    assert p.prompt == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Sum 2 and 3."}]
    assert p.reference == {"numbers": [2, 3], "target": 5}

    import pandas as pd

    code = tmp_path / "code.csv"
    pd.DataFrame([{"text": "Write f doubling x.", "tests": json.dumps(["assert f(2) == 4", "assert f(0) == 0"]),
                   "sol": "```python\ndef f(x):\n    return 2 * x\n```"}]).to_csv(code, index=False)
    p = get_task("custom", path=str(code), prompt_field="text", tests_field="tests", solution_field="sol", instruction="")[0]
    assert p.verifier == "code" and p.reference == {"tests": ["assert f(2) == 4", "assert f(0) == 0"]}
    assert p.prompt == [{"role": "user", "content": "Write f doubling x."}] and p.solution.startswith("```python")


def test_folder_of_split_files(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "test.jsonl", ROWS[:1])
    assert len(get_task("custom", path=str(tmp_path), split="test", prompt_field="question", answer_field="answer")) == 1
    assert len(get_task("custom", path=str(tmp_path), split="train", prompt_field="question", answer_field="answer")) == 2
    with pytest.raises(ValueError, match="splits there: test, train"):
        get_task("custom", path=str(tmp_path), split="validation", prompt_field="question", answer_field="answer")


def test_custom_configuration_errors(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(ValueError, match="pass path="):
        get_task("custom", prompt_field="question", answer_field="answer")
    with pytest.raises(ValueError, match="name the gold column"):
        get_task("custom", path=str(path), prompt_field="question")
    with pytest.raises(ValueError, match="unknown verifier 'nope'; valid verifiers: .*math"):
        get_task("custom", path=str(path), prompt_field="question", answer_field="answer", verifier="nope")
    with pytest.raises(FileNotFoundError, match="neither a file"):
        get_task("custom", path=str(tmp_path / "missing.jsonl"), prompt_field="question", answer_field="answer")
    with pytest.raises(TypeError, match="unknown option.*prompt_column.*valid options: prompt_field"):
        get_task("custom", path=str(path), prompt_column="question", answer_field="answer")


# --- bad data ---------------------------------------------------------------------------------------

BAD = [
    {"question": "fine", "answer": "1"},
    {"question": "no answer here"},                 # line 2: missing field
    {"question": "   ", "answer": "2"},             # line 3: empty prompt
    "{not json",                                    # line 4: unparsable line
    {"question": "fine too", "answer": "3"},
    [1, 2],                                         # line 6: not an object
]


def test_bad_rows_raise_naming_file_line_and_field(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", BAD)
    with pytest.raises(DataError) as info:
        get_task("custom", path=str(path), prompt_field="question", answer_field="answer")
    assert str(info.value) == f"{path}:2: field 'answer': missing"
    assert (info.value.where, info.value.field) == (f"{path}:2", "answer")


def test_bad_rows_skipped_and_counted(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", BAD)
    suite = get_task("custom", path=str(path), prompt_field="question", answer_field="answer", on_error="skip")
    assert [p.reference["answer"] for p in suite] == ["1", "3"]
    assert suite.skipped == 4
    assert suite.errors == [
        f"{path}:2: field 'answer': missing",
        f"{path}:3: field 'question': is empty",
        f"{path}:4: invalid JSON (Expecting property name enclosed in double quotes at column 2)",
        f"{path}:6: expected an object, got list",
    ]
    with pytest.raises(ValueError, match="on_error must be one of raise, skip"):
        get_task("custom", path=str(path), prompt_field="question", answer_field="answer", on_error="ignore")


def test_benchmark_suites_report_bad_gold(tmp_path):
    gsm = write_jsonl(tmp_path / "gsm.jsonl", [
        {"question": "q1", "answer": "work\n#### 12"},
        {"question": "q2", "answer": "work but no final line"},
        {"question": "q3", "answer": "work\n#### twelve"},
        {"question": "q1", "answer": "dup id is fine: ids are row numbers\n#### 5"},
    ])
    with pytest.raises(DataError, match=r"gsm\.jsonl:2: field 'answer': no '#### N' final answer line"):
        get_task("gsm8k", path=str(gsm), split="test")
    suite = get_task("gsm8k", path=str(gsm), split="test", on_error="skip")
    assert len(suite) == 2 and suite.skipped == 2 and "is not a number" in suite.errors[1]

    math = write_jsonl(tmp_path / "math.jsonl", [{"problem": "p", "solution": "no box at all"}])
    with pytest.raises(DataError, match=r"math\.jsonl:1: field 'solution': no \\boxed\{\} final answer"):
        get_task("math", path=str(math), split="test")

    he = write_jsonl(tmp_path / "he.jsonl", [{"task_id": "X/0", "prompt": "def f(x):\n", "entry_point": "g",
                                             "test": "def check(c): pass", "canonical_solution": ""}])
    with pytest.raises(DataError, match=r"he\.jsonl:1: field 'entry_point': 'g' is not a function defined in the prompt"):
        get_task("humaneval", path=str(he), split="test")

    mbpp = write_jsonl(tmp_path / "mbpp.jsonl", [{"task_id": 11, "text": "t", "code": "x", "test_list": []}])
    with pytest.raises(DataError, match=r"mbpp\.jsonl:1: field 'test_list': is empty"):
        get_task("mbpp", path=str(mbpp), split="test")

    cd = write_jsonl(tmp_path / "cd.jsonl", [{"input": "1,1", "output": "7"}, {"input": "a,b", "output": "1"}])
    suite = get_task("countdown", path=str(cd), split="test", on_error="skip")
    assert suite.skipped == 2 and "no expression using each number at most once of [1, 1] reaches 7" in suite.errors[0]
    assert "field 'input': not a list of integers" in suite.errors[1]


# --- where data is found -----------------------------------------------------------------------------

def test_default_location_env_var_and_error(tmp_path, monkeypatch):
    (tmp_path / "gsm8k").mkdir()
    write_jsonl(tmp_path / "gsm8k" / "test.jsonl", [{"question": "q", "answer": "#### 3"}])
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    assert project_data_dir() == tmp_path
    suite = get_task("gsm8k", split="test")
    assert len(suite) == 1 and suite.source == str(tmp_path / "gsm8k" / "test.jsonl")
    with pytest.raises(FileNotFoundError, match=r"gsm8k: no local data \(gsm8k/train.jsonl or train.jsonl\); looked in: \$RLVR_DATA_DIR = .* \(exists\)\. "
                                                    r"Set RLVR_DATA_DIR .* or pass path= a local copy, or the "
                                                r"Hugging Face dataset 'openai/gsm8k'"):
        get_task("gsm8k", split="train")
    # a folder given as path is searched the same way
    assert len(get_task("gsm8k", path=str(tmp_path), split="test")) == 1
    assert len(get_task("gsm8k", path=str(tmp_path / "gsm8k"), split="test")) == 1


def test_project_data_dir_is_found_from_the_checkout(monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    found = project_data_dir()
    expected = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    assert found == (expected if expected.is_dir() else None)


def test_hub_names_go_through_datasets(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        return [{"question": "What is 1 + 1?", "answer": "Add.\n#### 2"}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr("rlvr.tasks.loading._unreachable", lambda endpoint: None)  # as if online (the hub probe)
    suite = get_task("gsm8k", path="openai/gsm8k", split="test")
    assert calls == [("openai/gsm8k", "main", "test")]
    assert suite[0].reference == {"answer": "2"} and suite[0].meta["source"] == "openai/gsm8k[test] row 1"
    calls.clear()
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config=None, split=None: calls.append((name, config, split)) or
                        [{"problem": "p", "answer": "204", "id": 60}])
    assert get_task("aime24", path="HuggingFaceH4/aime_2024", split="test")[0].reference == {"answer": "204"}
    assert calls == [("HuggingFaceH4/aime_2024", None, "train")]  # the hub keeps AIME 2024 as "train"
    calls.clear()
    get_task("custom", path="someone/data", split="validation", prompt_field="problem", answer_field="answer")
    assert calls == [("someone/data", None, "validation")]


def test_resolve_source_rules(tmp_path):
    f = write_jsonl(tmp_path / "x.jsonl", ROWS)
    assert resolve_source("s", str(f), ("a.jsonl",), "hub/x") == str(f)
    assert resolve_source("s", "owner/name", ("a.jsonl",), "hub/x") == "owner/name"
    with pytest.raises(FileNotFoundError, match="none of a.jsonl found in folder"):
        resolve_source("s", str(tmp_path), ("a.jsonl",), "hub/x")
    with pytest.raises(FileNotFoundError, match="neither a file, a folder nor a Hugging Face dataset name"):
        resolve_source("s", str(tmp_path / "nope.jsonl"), ("a.jsonl",), "hub/x")
