"""Every ``rlvr`` command in README.md and docs/ works as written.

* A synopsis (a line with ``[optional]`` parts, ``a | b`` choices or CAPITAL placeholders such as
  ``PATH``) must name a real command, and every ``--flag`` in it must be one of that command's.
* A concrete example in a code block runs for real, in a folder prepared like a user's after the
  quickstart: ``runs/quickstart/final`` (a tiny model), ``my.jsonl``, ``my_sft.jsonl``,
  ``completions.jsonl``, ``cfg.yaml``, plus every file a doc shows whole (a yaml block starting
  with ``# NAME.yaml``); it must exit 0.
* A concrete ``rlvr train`` / ``rlvr sft`` example in running text (inline code) is loaded and
  validated with its overrides (a real run would take minutes); other inline examples are parsed.

``rlvr quickstart`` itself runs in tests/test_quickstart.py (slow).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from rlvr.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLACEHOLDER = re.compile(r"(?<![\w.-])(?:[A-Z][A-Z_]*[A-Z]|[NSTK])(?:\.yaml|\.jsonl)?(?![\w-])")
NOT_COMMANDS = ("python", "toml", "text")  # code blocks in these languages hold no shell commands (text: output)


def _commands() -> list[tuple[str, str, bool]]:
    """``(where, command, in_code_block)`` for every ``rlvr ...`` command in the docs."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        rel = doc.relative_to(ROOT)
        for block in re.finditer(r"^```(\w*)\n(.*?)^```[ \t]*$", text, re.S | re.M):
            if block.group(1) in NOT_COMMANDS:
                continue
            start = text[: block.start()].count("\n") + 2
            lines = block.group(2).split("\n")
            i = 0
            while i < len(lines):
                line, n = lines[i], i
                while line.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line.rstrip()[:-1] + " " + lines[i].strip()
                line = line.split(" # ")[0].split("  #")[0].strip()
                for part in line.split("&&"):
                    part = part.strip()
                    if part.startswith("rlvr "):
                        found.append((f"{rel}:{start + n}", part, True))
                i += 1
        prose = re.sub(r"^```.*?^```[ \t]*$", "", text, flags=re.S | re.M)
        for span in re.finditer(r"`(rlvr [^`]+)`", prose):
            line_no = text[: text.find(span.group(0))].count("\n") + 1
            found.append((f"{rel}:{line_no}", span.group(1), False))
    return found


COMMANDS = _commands()


def _doc_files() -> dict[str, str]:
    """Files the docs show whole: a yaml code block whose first line is ``# NAME`` (a comment, so the
    block stays valid when copied), or a json/jsonl block right after a line ending in ``NAME`:``
    (JSON has no comments)."""
    files = {}
    for doc in DOCS:
        text = doc.read_text()
        for block in re.finditer(r"^```yaml\n# ([\w.-]+)\n(.*?)^```[ \t]*$", text, re.S | re.M):
            files[block.group(1)] = block.group(2)
        for block in re.finditer(r"`([\w.-]+\.jsonl?)`:\n\n```jsonl?\n(.*?)^```[ \t]*$", text, re.S | re.M):
            files[block.group(1)] = block.group(2)
    return files


DOC_FILES = _doc_files()


def _is_synopsis(command: str) -> bool:
    return "[" in command or " | " in command or "..." in command or bool(PLACEHOLDER.search(command))


def _subparser(words: list[str]):
    """The argparse parser of the (sub)command that ``words`` name, and the words after it."""
    parser = build_parser()
    rest = list(words[1:])
    while rest:
        actions = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
        if not actions or rest[0] not in actions[0].choices:
            break
        parser = actions[0].choices[rest.pop(0)]
    return parser, rest


def test_the_docs_have_commands():
    assert len(COMMANDS) >= 15
    assert any(not _is_synopsis(c) and block for _, c, block in COMMANDS)


@pytest.mark.parametrize("where, command", [(w, c) for w, c, _ in COMMANDS if _is_synopsis(c)])
def test_synopsis_names_real_flags(where, command):
    words = command.replace("[", " ").replace("]", " ").replace("|", " ").split()
    parser, rest = _subparser(words)
    assert parser.prog != "rlvr" or words[1].startswith("-") or words[1] in ("CMD", "..."), \
        f"{where}: unknown command in {command!r}"
    flags = {s for a in parser._actions for s in a.option_strings}
    for word in rest:
        flag = word.split("=")[0]
        if flag.startswith("--"):
            assert flag in flags, f"{where}: {flag} is not an option of `{parser.prog}` (has: {sorted(flags)})"


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory, tiny_model):
    """A working folder as a user has it after the quickstart, with the files the docs' examples use."""
    import shutil

    folder = tmp_path_factory.mktemp("user")
    shutil.copytree(tiny_model, folder / "runs" / "quickstart" / "final")
    rows = [{"q": f"What is {a} + {a}?", "a": str(2 * a)} for a in range(5)]
    (folder / "my.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "completions.jsonl").write_text("".join(
        json.dumps({"completion": f"so the answer is \\boxed{{{2 * a}}}", "answer": str(2 * a)}) + "\n" for a in range(5)))
    (folder / "my_sft.jsonl").write_text("".join(
        json.dumps({"prompt": f"{a}+{a}=", "completion": str(2 * a)}) + "\n" for a in range(20)))
    (folder / "rlvr").mkdir()  # the packaged configs where a checkout has them (`rlvr train rlvr/configs/...`)
    (folder / "rlvr" / "configs").symlink_to(ROOT / "rlvr" / "configs", target_is_directory=True)
    for name, text in DOC_FILES.items():  # files the docs show in full (a code block starting "# NAME")
        (folder / name).write_text(text)
    (folder / "cfg.yaml").write_text(yaml.safe_dump({
        "model": {"path": "runs/quickstart/final"},
        "data": [{"task": "arithmetic"}],
        "generation": {"max_new_tokens": 5},
    }))
    return folder


EXAMPLES = [(w, c) for w, c, block in COMMANDS if block and not _is_synopsis(c) and not c.startswith("rlvr quickstart")]


@pytest.mark.parametrize("where, command", EXAMPLES)
def test_examples_in_code_blocks_run(where, command, user_folder, monkeypatch, capsys):
    monkeypatch.chdir(user_folder)
    code = main(shlex.split(command)[1:])
    err = capsys.readouterr().err
    if code != 0 and "no local data" in err:
        from tests.conftest import DATA_MISSING

        pytest.skip(DATA_MISSING)
    assert code == 0, f"{where}: `{command}` exited {code}: {err[-2000:]}"


@pytest.mark.parametrize("where, command", [(w, c) for w, c, block in COMMANDS if not block and not _is_synopsis(c)])
def test_inline_examples_parse_and_validate(where, command, user_folder, monkeypatch):
    from rlvr.config import RunConfig, load_config
    from rlvr.config import SFTConfig

    monkeypatch.chdir(user_folder)
    words = shlex.split(command)
    parser, rest = _subparser(words)
    assert parser.prog != "rlvr" or words[1].startswith("-"), f"{where}: unknown command in {command!r}"
    if not rest:
        return  # a mention of a command by name (`rlvr eval`): it exists
    try:
        args = build_parser().parse_args(words[1:])  # SystemExit(2) on an unknown flag or command
    except SystemExit as exc:
        assert exc.code == 0, f"{where}: `{command}` does not parse"
        return
    if args.command in ("train", "sft") and getattr(args, "config", None):
        cls = RunConfig if args.command == "train" else SFTConfig
        load_config(cls, args.config, args.overrides)


# ---------------------------------------------------------------------------------------------
# Python examples: code blocks of the docs, and examples in docstrings, run as written
# ---------------------------------------------------------------------------------------------

import ast  # noqa: E402
import importlib  # noqa: E402
import textwrap  # noqa: E402

PACKAGES = {"rlvr": ROOT / "rlvr", "rlvr.verifiers": ROOT / "verifiers", "rlvr.tasks": ROOT / "tasks",
            "rlvr.sandbox": ROOT / "sandbox"}
NEEDS_STRONG_SANDBOX = ("rlvr.sandbox", "rlvr.verifiers.code")


def _python_blocks() -> list[tuple[str, str]]:
    """``(where, source)`` of every python code block in README.md and docs/, one per file (a file's
    blocks run in order in one namespace, as a reader runs them)."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        blocks = list(re.finditer(r"^```python\n(.*?)^```[ \t]*$", text, re.S | re.M))
        if blocks:
            line = text[: blocks[0].start()].count("\n") + 1
            found.append((f"{doc.relative_to(ROOT)}:{line}", "\n".join(b.group(1) for b in blocks)))
    return found


def _docstring_examples() -> list[tuple[str, str, str]]:
    """``(where, module name, source)`` of every example in a docstring: the block after
    ``Example::`` / ``Examples::``, or an indented block that starts with an import."""
    found = []
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            module = ".".join([package, *parts])
            tree = ast.parse(path.read_text())
            for node in [tree, *ast.walk(tree)]:
                if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                doc = ast.get_docstring(node, clean=True)
                if not doc:
                    continue
                lines = doc.split("\n")
                for i, line in enumerate(lines):
                    block = _indented_block(lines, i + 1) if line.rstrip().endswith("::") or line == "" else None
                    if not block:
                        continue
                    first = block.lstrip().split("\n", 1)[0]
                    example = line.strip().lower().startswith(("example::", "examples::"))
                    if example or (line == "" and first.startswith(("from rlvr", "import rlvr"))):
                        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)}"
                        found.append((where, module, block))
    return list({(w, m, b): None for w, m, b in found})


def _indented_block(lines: list[str], start: int) -> str | None:
    i = start
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i >= len(lines) or not lines[i].startswith("    "):
        return None
    block = []
    while i < len(lines) and (not lines[i].strip() or lines[i].startswith("    ")):
        block.append(lines[i])
        i += 1
    return textwrap.dedent("\n".join(block)).strip() + "\n"


def test_the_docs_have_python_examples():
    assert len(_python_blocks()) >= 4 and len(_docstring_examples()) >= 10


@pytest.mark.parametrize("where, source", _python_blocks())
def test_python_blocks_of_the_docs_run(where, source, user_folder, monkeypatch, private_registries):
    monkeypatch.chdir(user_folder)
    if "rlvr.sandbox" in source:
        _skip_without_strong_sandbox()
    try:
        assert_runs(source, where, {"__name__": f"docs_example_{abs(hash(where))}"})
    except FileNotFoundError as exc:
        if "no local data" not in str(exc):
            raise
        from tests.conftest import DATA_MISSING

        pytest.skip(DATA_MISSING)


@pytest.mark.parametrize("where, module, source", _docstring_examples())
def test_docstring_examples_run(where, module, source, user_folder, monkeypatch, private_registries):
    monkeypatch.chdir(user_folder)
    if module.startswith(NEEDS_STRONG_SANDBOX) or "run_tests(" in source or "execute(" in source:
        _skip_without_strong_sandbox()
    namespace = dict(vars(importlib.import_module(module)))
    namespace["__name__"] = f"docstring_example_{abs(hash(where))}"
    assert_runs(source, where, namespace)


def assert_runs(source: str, where: str, namespace: dict) -> None:
    """Run an example; its own ``assert`` lines check what its comments claim."""
    code = compile(source, where, "exec")
    exec(code, namespace)  # an exception fails the test with the example's file and line


@pytest.fixture
def private_registries(monkeypatch):
    """Examples register plugins (``@register_task("squares")``): into copies, not the real registries."""
    import rlvr.algorithms.advantages as advantages
    import rlvr.algorithms.losses as losses
    import rlvr.engines as engines
    import rlvr.tasks as tasks
    import rlvr.tasks.environments as environments
    import rlvr.tasks.registry as task_registry
    import rlvr.verifiers as verifiers
    import rlvr.verifiers.registry as verifier_registry

    for owners, name in [((task_registry, tasks), "TASKS"), ((verifier_registry, verifiers), "VERIFIERS"),
                         ((advantages,), "ADVANTAGE_ESTIMATORS"), ((losses,), "POLICY_LOSSES"),
                         ((losses,), "LOSS_AGGREGATIONS"), ((losses,), "KL_ESTIMATORS"), ((engines,), "ENGINES"),
                         ((environments,), "ENVIRONMENTS")]:
        private = getattr(owners[0], name).copy()
        for owner in owners:
            monkeypatch.setattr(owner, name, private)


def _skip_without_strong_sandbox():
    from rlvr.sandbox import capabilities

    if capabilities()["isolation"] != "strong":
        pytest.skip("needs the strong sandbox (apt-get install bubblewrap)")
