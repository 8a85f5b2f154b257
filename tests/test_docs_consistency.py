"""README.md and docs/ agree with the code and with themselves.

* The README's Commands table lists every command of ``rlvr`` (``rlvr.cli.build_parser``), and only those.
* Every repository path the docs quote (``rlvr/recipes/grpo.py``, ``tests/test_tasks_*.py``) exists; a
  name quoted with its file (``train`` in ``rlvr/recipes/sft.py:train``, "`RankSampler` in
  `rlvr/rollout/sampler.py`") is defined there; a quoted module (``rlvr.rollout.suites.PromptEncoder``)
  imports.
* Numbers the docs quote from files of the repository match them: the case set's size, the
  quickstart's packaged config, the quickstart's durations wherever they are given, and the README's
  sample output of the default run.
* A JSONL sample in the docs is valid JSONL as printed (a reader copies it).
* The README's intro does not call a feature missing that its own sections document.
* The README stays a reference: short, undated, the two commands first, a picture of a run.

tests/test_docs.py runs the docs' commands and Python examples.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path

import pytest

from rlvr.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
TOP_FOLDERS = ("rlvr", "verifiers", "tasks", "sandbox", "tests", "benchmarks", "docs")
#: Paths the docs name on purpose although they do not exist (a file the design avoided).
NOT_FILES = {("docs/design-notes.md", "rlvr/registry.py")}


def _rel(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


def _prose(text: str) -> str:
    """The text outside code blocks (line numbers kept: a block becomes blank lines)."""
    return re.sub(r"^```.*?^```[ \t]*$", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)


def _line(text: str, pos: int) -> int:
    return text[:pos].count("\n") + 1


# ---------------------------------------------------------------------------------------------
# the Commands table
# ---------------------------------------------------------------------------------------------

def _commands_table() -> list[str]:
    """The first cell of each row of the README's Commands table."""
    section = README.read_text().split("## Commands", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `rlvr")]
    assert rows, "README.md: no Commands table"
    return [row.split("|")[1].strip() for row in rows]


def _cli_commands() -> set[str]:
    action = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return set(action.choices)


def test_the_commands_table_lists_every_command():
    listed = {name for cell in _commands_table() for name in re.findall(r"`rlvr ([a-z][\w-]*)", cell)}
    assert listed <= _cli_commands(), f"README.md Commands table names no such command: {listed - _cli_commands()}"
    assert _cli_commands() <= listed, f"README.md Commands table lacks: {sorted(_cli_commands() - listed)}"


def test_the_readme_intro_does_not_deny_what_its_sections_document():
    text = README.read_text()
    intro = text.split("\n## ", 1)[0]
    if "torchrun" in text:  # "Scaling out" documents data-parallel training
        assert not re.search(r"Not yet:[^.]*multi-GPU", intro), "README.md intro says multi-GPU training is not there"


#: The install commands CI (.ci/run) and a reader run, in this order, as the README's first code blocks.
README_COMMANDS = ["pip install -e . torch==2.13.0 && rlvr quickstart",
                   "pip install -e '.[test]' torch==2.13.0 && python -m pytest"]


def test_the_readme_is_a_short_undated_reference_that_starts_with_the_two_commands():
    """Measurements and their history live in docs/ and benchmarks/README.md; the README holds what
    stays true: under 12,000 characters, no dates or remarks on how busy a machine was, the two
    commands right after the intro, and the quickstart's metrics plot shown."""
    text = README.read_text()
    assert len(text) < 12_000, f"README.md has {len(text)} characters; move measurements to docs/"
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "README.md holds a date"
    assert not re.search(r"idle speed|idle day|evening|busy machine", text), "README.md remarks on machine load"
    blocks = re.findall(r"^```\w*\n(.*?)^```", text, re.S | re.M)
    assert [b.strip() for b in blocks[:2]] == README_COMMANDS
    assert text.index("```") < text.index("\n## ", text.index("\n## ") + 1), "the commands come after a short intro"
    images = re.findall(r"!\[[^]]*\]\(([^)]+\.png)\)", text)
    assert images and all((ROOT / image).is_file() for image in images), images
    links = re.findall(r"\]\(([^)#:]+)\)", text)  # relative links: docs pages, the plot
    assert [link for link in links if not (ROOT / link).is_file()] == [], "README.md links to missing files"


# ---------------------------------------------------------------------------------------------
# quoted paths, names and modules
# ---------------------------------------------------------------------------------------------

PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(TOP_FOLDERS) + r")/[\w./*-]*[\w*])(?::([A-Za-z_]\w*))?")


def _quoted_paths() -> list[tuple[str, str, str | None]]:
    """``(where, path, name)`` for every repository path quoted in the docs (``name``: after ``path:``)."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for m in PATH.finditer(text):
            path = m.group(1)
            in_backticks = text[m.start() - 1: m.start()] == "`"
            if "." not in path.rsplit("/", 1)[-1] and not in_backticks:
                continue  # "100-140 tests/s" is not a path
            if (_rel(doc), path) not in NOT_FILES:
                found.append((f"{_rel(doc)}:{_line(text, m.start())}", path, m.group(2)))
    return found


QUOTED_PATHS = _quoted_paths()


def test_the_docs_quote_paths():
    assert len(QUOTED_PATHS) >= 40


@pytest.mark.parametrize("where, path, name", QUOTED_PATHS)
def test_quoted_paths_exist(where, path, name):
    matches = list(ROOT.glob(path)) if "*" in path else [ROOT / path] if (ROOT / path).exists() else []
    assert matches, f"{where}: {path} does not exist"
    if name and path.endswith(".py"):
        assert name in _defined(ROOT / path), f"{where}: {path} defines no {name}"


def _defined(path: Path) -> set[str]:
    """The names a module defines at its top level and in its classes."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    names.add(target.id)
    return names


def _names_in_files() -> list[tuple[str, str, str]]:
    """``(where, name, path)`` for every "`NAME` in `PATH.py`" of the docs' prose."""
    found = []
    for doc in DOCS:
        text = _prose(doc.read_text())
        for m in re.finditer(r"`([A-Za-z_]\w*)(?:\(\))?` in `((?:" + "|".join(TOP_FOLDERS) + r")/[\w/]+\.py)`", text):
            found.append((f"{_rel(doc)}:{_line(text, m.start())}", m.group(1), m.group(2)))
    return found


@pytest.mark.parametrize("where, name, path", _names_in_files())
def test_a_name_quoted_with_its_file_is_defined_there(where, name, path):
    assert (ROOT / path).is_file(), f"{where}: {path} does not exist"
    assert name in _defined(ROOT / path), f"{where}: {path} defines no {name}"


def _quoted_modules() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = _prose(doc.read_text())
        for m in re.finditer(r"`(rlvr(?:\.[A-Za-z_]\w*)+)`", text):
            found.append((f"{_rel(doc)}:{_line(text, m.start())}", m.group(1)))
    return found


@pytest.mark.parametrize("where, dotted", _quoted_modules())
def test_quoted_modules_import(where, dotted):
    parts = dotted.split(".")
    for i in range(len(parts), 1, -1):  # the longest importable prefix, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attribute in parts[i:]:
            assert hasattr(obj, attribute), f"{where}: {dotted}: {'.'.join(parts[:i])} has no {attribute}"
            obj = getattr(obj, attribute)
        return
    pytest.fail(f"{where}: {dotted} does not import")


# ---------------------------------------------------------------------------------------------
# numbers quoted from the repository
# ---------------------------------------------------------------------------------------------

def test_the_case_set_counts_match_cases_jsonl():
    cases = [json.loads(line) for line in (ROOT / "tests/verifier_cases/cases.jsonl").read_text().splitlines() if line]
    categories = {case["category"] for case in cases}
    text = (ROOT / "docs/verifiers.md").read_text()
    quoted = re.findall(r"([\d,]+) hand-made cases(?: in (\d+) categories)?", text)
    assert quoted, "docs/verifiers.md quotes no case count"
    for count, in_categories in quoted:
        assert int(count.replace(",", "")) == len(cases), f"docs/verifiers.md: {count} hand-made cases, cases.jsonl has {len(cases)}"
        if in_categories:
            assert int(in_categories) == len(categories), (
                f"docs/verifiers.md: {in_categories} categories, cases.jsonl has {len(categories)}")


def test_the_readme_quotes_the_packaged_quickstart_configs():
    from rlvr.configs import load_packaged

    rl, sft = load_packaged("quickstart.yaml"), load_packaged("quickstart_sft.yaml")
    text = " ".join(README.read_text().split())
    train = rl["train"]
    assert f"for {train['steps']:,} steps ({train['prompts_per_step']} prompts x {train['group_size']} samples" in text
    (lr,) = re.findall(r"GRPO at lr ([\d.e-]+)", text)
    assert float(lr) == rl["optim"]["lr"]
    assert f"accuracy on {rl['eval']['limit']} held-out" in text
    assert f"reaches {sft['eval']['stop_at_accuracy']:.2f}" in text


# ---------------------------------------------------------------------------------------------
# the quickstart's duration, said the same way everywhere
# ---------------------------------------------------------------------------------------------

def _results_table() -> str:
    """The current results table of docs/quickstart.md (the first table of its Results section)."""
    text = (ROOT / "docs/quickstart.md").read_text()
    return text.split("## Results", 1)[1].split("\n\n|", 1)[1].split("\n\n", 1)[0]


def _measured_seconds() -> list[int]:
    """The wall times of the current results table of docs/quickstart.md."""
    seconds = [int(s) for s in re.findall(r"\| (\d+) s \|", _results_table())]
    assert len(seconds) >= 3, "docs/quickstart.md: no wall times in the Results table"
    return seconds


def _minute_ranges(text: str) -> list[tuple[float, float]]:
    return [(float(a), float(b)) for a, b in re.findall(r"(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?) minutes", text)]


def _covers(span: tuple[float, float], seconds: list[int]) -> bool:
    """``span`` (minutes) holds the measured runs, rounded to whole minutes, and is no wider than 2 minutes."""
    low, high = round(min(seconds) / 60), round(max(seconds) / 60)
    return span[0] <= low and high <= span[1] and span[1] - span[0] <= 2


def test_the_readme_sample_output_is_the_measured_default_run():
    """The quickstart output the README shows is seed 0's row of docs/quickstart.md's Results table:
    its SFT steps, accuracy before -> after, gain and wall time."""
    row = next(line for line in _results_table().splitlines() if line.startswith("| 0 "))
    sft_steps, before, after, gain, wall = [cell.strip() for cell in row.strip("|").split("|")[1:]]
    text = README.read_text()
    assert f"SFT stopped after {sft_steps.replace(',', '')} steps" in text, "README.md: SFT steps of the sample output"
    assert f"before GRPO {before} -> after {after} ({gain})" in text, "README.md: accuracy of the sample output"
    assert f"wall time {wall.removesuffix(' s')} s;" in text, "README.md: wall time of the sample output"


@pytest.mark.parametrize("doc", [README, ROOT / "docs/quickstart.md"], ids=_rel)
def test_durations_in_the_docs_cover_the_measured_runs(doc):
    seconds = _measured_seconds()
    for span in _minute_ranges(doc.read_text()):
        assert _covers(span, seconds), f"{_rel(doc)}: '{span[0]:g}-{span[1]:g} minutes', measured {seconds} s"


def test_the_quickstart_help_gives_the_measured_duration():
    action = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    help_text = " ".join(action.choices["quickstart"].format_help().split())
    spans = _minute_ranges(help_text)
    assert spans and all(_covers(span, _measured_seconds()) for span in spans), spans


# ---------------------------------------------------------------------------------------------
# samples a reader copies
# ---------------------------------------------------------------------------------------------

def _jsonl_blocks() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(r"^```jsonl\n(.*?)^```[ \t]*$", text, re.S | re.M):
            found.append((f"{_rel(doc)}:{_line(text, m.start())}", m.group(1)))
    return found


@pytest.mark.parametrize("where, block", _jsonl_blocks())
def test_jsonl_samples_are_valid_jsonl(where, block):
    for i, line in enumerate(block.splitlines(), start=1):
        if line.strip():
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                pytest.fail(f"{where}: line {i} of the sample is not JSON ({exc.msg}): {line[:60]}")
            assert isinstance(value, dict), f"{where}: line {i} of the sample is not a JSON object"
