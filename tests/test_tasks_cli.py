"""``rlvr tasks list`` and ``rlvr tasks show`` (parsed by their own sub-parser, as rlvr.cli assembles it)."""

from __future__ import annotations

import argparse
import json

import pytest

from rlvr.commands import tasks as tasks_command


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rlvr")
    tasks_command.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_every_option_has_help():
    parser = argparse.ArgumentParser(prog="rlvr")
    sub = parser.add_subparsers(dest="command")
    tasks_command.add_parser(sub)
    tasks_parser = sub.choices["tasks"]
    leaves = next(a for a in tasks_parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(leaves) == {"list", "show"}
    for leaf in leaves.values():
        assert callable(leaf.get_default("func"))
        for action in leaf._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help, (leaf.prog, action.dest)


def test_list_shows_sizes_and_verifiers(data_dir, capsys):
    assert run(["tasks", "list"]) == 0
    out = capsys.readouterr().out
    table, environments = out.split("\n\n", 1)
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    # other test modules register environments of their own at import, so check membership, not the whole line
    assert environments.startswith("environments")
    listed = environments.split(":", 1)[1].strip().split(", ")
    assert {"python", "tools"} <= set(listed)
    assert "numeric" in rows["tool_arithmetic"] and "train 10,000, dev 500, test 500" in rows["tool_arithmetic"]
    assert "math" in rows["gsm8k"] and "train 7,473, test 1,319" in rows["gsm8k"]
    assert "code" in rows["humaneval"] and "test 164" in rows["humaneval"]
    assert "test 500, train 374, validation 90, prompt 10" in rows["mbpp"]
    assert "test 5,000, train 4,500" in rows["math"]
    assert "countdown" in rows["countdown"] and "test 256" in rows["countdown"]
    assert "train 10,000, dev 500, test 500" in rows["arithmetic"]
    assert "needs --path" in rows["custom"]
    assert "dataset=" in rows["reasoning_gym"] or "pip install reasoning-gym" in rows["reasoning_gym"]


def test_list_without_sizes_is_instant(capsys):
    assert run(["tasks", "list", "--no-sizes"]) == 0
    out = capsys.readouterr().out
    assert "mbpp" in out and "test, train, validation, prompt" in out


def test_show_prints_messages_prompt_reference_and_solution(data_dir, capsys):
    assert run(["tasks", "show", "gsm8k", "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gsm8k [test]: 1,319 problems, verifier math")
    assert "gsm8k/test/0" in out and "gsm8k/test/1" in out and "gsm8k/test/2" not in out
    assert "[user]" in out and "Janet" in out and '"answer": "18"' in out and "#### 18" in out


def test_show_with_options_split_and_json(capsys):
    assert run(["tasks", "show", "arithmetic", "-n", "1", "--split", "dev", "--option", "style=bare",
                "--option", "max_digits=1", "--json"]) == 0
    [line] = capsys.readouterr().out.strip().splitlines()
    record = json.loads(line)
    assert record["id"] == "arithmetic/dev/0" and record["text"].endswith("=") and record["verifier"] == "numeric"
    assert record["messages"] == [{"role": "user", "content": record["text"]}]


def test_show_with_a_model_uses_its_chat_template(monkeypatch, capsys):
    import transformers

    class FakeTokenizer:
        chat_template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert not tokenize and add_generation_prompt
            return "".join(f"<|{m['role']}|>{m['content']}" for m in messages) + "<|assistant|>"

    loaded = []
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        classmethod(lambda cls, path: loaded.append(path) or FakeTokenizer()))
    assert run(["tasks", "show", "countdown", "-n", "1", "--split", "train", "--model", "some/model"]) == 0
    out = capsys.readouterr().out
    assert loaded == ["some/model"]
    assert "prompt text (chat template of some/model):\n<|user|>Using the numbers" in out
    assert "<|assistant|>" in out and "messages:" not in out


def test_show_errors_are_messages_not_tracebacks(capsys):
    assert run(["tasks", "show", "nope"]) == 2
    assert "unknown task 'nope'" in capsys.readouterr().err
    assert run(["tasks", "show", "gsm8k", "--split", "dev"]) == 2
    assert "valid splits: train, test" in capsys.readouterr().err
    assert run(["tasks", "show", "arithmetic", "--option", "bogus"]) == 2
    assert "key=value" in capsys.readouterr().err
    assert run(["tasks", "show", "custom"]) == 2
    assert "pass path=" in capsys.readouterr().err


@pytest.mark.parametrize("pairs,expected", [
    (["n=5", "ops=+-", "style=bare"], {"n": 5, "ops": "+-", "style": "bare"}),
    (["use_all=true", "config={min_terms: 3}"], {"use_all": True, "config": {"min_terms": 3}}),
    (["instruction="], {"instruction": ""}),
])
def test_option_parsing(pairs, expected):
    assert tasks_command.parse_options(pairs) == expected
