"""What a user needs to match another trainer's settings (issue 16, section 3): raw prompts or a
template file, verifiers by import path, the run's first lines about each suite, an eval that
warns when it is not held out, timestamps and logging time in metrics.jsonl, and switches for the
end-of-run artefacts."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from rlvr.rollout.chat import encode_prompts, render_prompt, resolve_chat_template
from rlvr.config import ConfigError, RunConfig, build_config
from rlvr.config import SFTConfig
from rlvr.verifiers.errors import InvalidValueError, MissingFileError, PluginLoadError

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3="}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from rlvr.modeling.loading import load_tokenizer

    return load_tokenizer(tiny_model)


class PlainTokenizer:
    """A tokenizer with a chat template that adds a BOS (id 1) by default, as Llama's does."""

    chat_template = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    bos_token = "<s>"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, chat_template=None):
        import jinja2

        return jinja2.Template(chat_template or self.chat_template).render(messages=messages, bos_token=self.bos_token)

    def __call__(self, texts, add_special_tokens=True):
        return {"input_ids": [([1] if add_special_tokens else []) + [ord(c) for c in t] for t in texts]}


# ---- 1. chat_template: auto | none | PATH ------------------------------------------------------

def test_none_renders_the_contents_as_plain_text_with_the_tokenizers_special_tokens():
    tok = PlainTokenizer()
    assert render_prompt(tok, MESSAGES) == "<s><system>Be brief.<user>2+3=<assistant>"  # auto: the template
    assert render_prompt(tok, MESSAGES, "none") == "Be brief.\n\n2+3="
    auto, raw = encode_prompts(tok, [MESSAGES]), encode_prompts(tok, [MESSAGES], "none")
    assert auto[0][:2] == [ord("<"), ord("s")]  # the template wrote the BOS text; no second BOS id
    assert raw[0] == [1] + [ord(c) for c in "Be brief.\n\n2+3="]  # as tokenizer(text) encodes it: BOS id first


def test_a_template_file_is_rendered_and_writes_its_own_special_tokens(tmp_path, tokenizer):
    path = tmp_path / "qa.jinja"
    path.write_text("Q: {{ messages[-1]['content'] }}\nA:")
    assert render_prompt(tokenizer, MESSAGES, str(path)) == "Q: 2+3=\nA:"
    (ids,) = encode_prompts(tokenizer, [MESSAGES], str(path))
    assert ids == tokenizer("Q: 2+3=\nA:", add_special_tokens=False)["input_ids"]
    assert resolve_chat_template(str(path)).describe() == f"chat template {path}"


def test_bad_chat_template_settings_fail_naming_the_field(tmp_path):
    with pytest.raises(MissingFileError, match=r"--chat-template: 'nope.jinja' is neither auto nor none nor a Jinja"):
        resolve_chat_template("nope.jinja", where="--chat-template")
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content }}")
    with pytest.raises(InvalidValueError, match=r"broken.jinja is not a valid Jinja template \(line 1"):
        resolve_chat_template(str(broken))
    raw = {"model": {"path": "m"}, "data": [{"task": "arithmetic", "chat_template": "nope.jinja"}]}
    with pytest.raises(ConfigError, match=r"data\.0\.chat_template: .*'nope.jinja' is neither auto nor none"):
        build_config(RunConfig, raw)
    assert build_config(RunConfig, raw, ["data.0.chat_template=none"]).data[0].chat_template == "none"
    assert build_config(SFTConfig, {"model": {"path": "m"}, "data": {"chat_template": "none"}}).data[0].chat_template == "none"


def test_each_suite_encodes_with_its_own_template(tokenizer):
    from rlvr.rollout.suites import PromptEncoder, load_suite

    options = {"style": "bare", "max_digits": 1, "n": 3}
    templated = load_suite("arithmetic", path=None, split="test", options=options, limit=None, suite="train/a")
    raw = load_suite("arithmetic", path=None, split="test", options=options, limit=None, chat_template="none",
                     suite="eval/b")
    encode = PromptEncoder.for_suites(tokenizer, {"a": templated}, {"b": raw})
    text = templated[0].prompt[-1]["content"]
    assert encode(templated[0]) == [tokenizer.bos_token_id] + tokenizer(text)["input_ids"]  # the tiny template: BOS + text
    assert encode(raw[0]) == tokenizer(text)["input_ids"]  # this tokenizer adds no BOS of its own
    assert PromptEncoder(tokenizer, "none")(templated[0]) == encode(raw[0])


def test_sft_encodes_prompts_as_the_rl_recipes_do(tokenizer):
    from rlvr.recipes import sft
    from rlvr.rollout.suites import PromptEncoder
    from rlvr.tasks.base import Problem

    examples = [(MESSAGES, "5")]
    (templated, _, mask), (raw, completion, _) = sft._tokenize(tokenizer, [(examples, "auto"), (examples, "none")])
    assert mask is None  # a one-turn completion: every token is a loss token
    problem = Problem("x", MESSAGES, {}, "numeric")
    assert templated == PromptEncoder(tokenizer)(problem) and raw == PromptEncoder(tokenizer, "none")(problem)
    assert completion == tokenizer("5", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def test_eval_command_takes_a_chat_template(tiny_model, tmp_path, capsys):
    from rlvr.cli import main

    args = ["eval", "--model", str(tiny_model), "--task", "arithmetic", "--task-option", "style=bare", "--limit", "2",
            "--max-new-tokens", "2", "--greedy", "--workers", "0"]
    assert main(args + ["--chat-template", "none"]) == 0
    assert main(args + ["--chat-template", str(tmp_path / "missing.jinja")]) != 0
    assert "--chat-template: " in capsys.readouterr().err


def test_tasks_show_renders_with_a_chat_template(tiny_model, tmp_path, capsys):
    from rlvr.cli import main

    show = ["tasks", "show", "arithmetic", "-n", "1", "--option", "style=bare", "--json", "--model", str(tiny_model)]
    assert main(show) == 0
    assert json.loads(capsys.readouterr().out)["text"].startswith("<bos>")  # the tiny model's template writes BOS
    assert main(show + ["--chat-template", "none"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["text"] == record["messages"][0]["content"]
    template = tmp_path / "t.jinja"
    template.write_text("Q: {{ messages[0]['content'] }} A:")
    assert main(show + ["--chat-template", str(template)]) == 0
    assert json.loads(capsys.readouterr().out)["text"].startswith("Q: ")
    assert main(["tasks", "show", "arithmetic", "--chat-template", str(template)]) == 2
    assert "pass --model" in capsys.readouterr().err


# ---- 2. verifiers by import path ---------------------------------------------------------------

VERIFIER_MODULE = '''
from rlvr.verifiers import Reward


class Exact:
    def __init__(self, strip=True):
        self.strip = strip

    def score(self, completion, reference):
        text = completion.strip() if self.strip else completion
        return Reward(float(text == reference["answer"]))


def contains(prompts, completions, answer, **kwargs):
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]


class Ready:
    def score(self, completion, reference):
        return 0.5


READY = Ready()


def not_a_verifier(x, y):
    return 1.0


class NoScore:
    pass
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """``my_rewards.py`` in the current directory, which is not on sys.path (as under a console script)."""
    (tmp_path / "my_rewards.py").write_text(VERIFIER_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


def test_a_verifier_is_named_by_import_path(user_module):
    from rlvr.verifiers import get_verifier, list_verifiers

    assert get_verifier("my_rewards:Exact").score(" 4 ", {"answer": "4"}).score == 1.0
    assert get_verifier("my_rewards:Exact", strip=False).score(" 4 ", {"answer": "4"}).score == 0.0
    assert get_verifier("my_rewards:contains").score("it is 42", {"answer": "42"}).score == 1.0  # a TRL function
    assert get_verifier("my_rewards:READY").score("x", {}) == 0.5  # a verifier object
    assert not any(":" in name for name in list_verifiers())  # paths are never listed


@pytest.mark.parametrize("name, message", [
    ("no_such_pkg.rewards:Exact", r"verifier 'no_such_pkg.rewards:Exact': no module named 'no_such_pkg'"),
    ("my_rewards:Exakt", r"my_rewards has no attribute 'Exakt'; it has: .*Exact"),
    ("my_rewards:not_a_verifier", r"is a function with parameters \(x, y\), not a verifier"),
    ("my_rewards:NoScore", r"class NoScore has no score\(completion, reference\) method"),
])
def test_import_path_errors_say_what_is_wrong(user_module, name, message):
    from rlvr.verifiers import get_verifier

    with pytest.raises(PluginLoadError, match=message):
        get_verifier(name)


def test_import_paths_in_config_and_in_a_custom_suite(user_module, tmp_path):
    from rlvr.tasks import get_task

    config = build_config(RunConfig, {"model": {"path": "m"}, "verifier": {"name": "my_rewards:Exact",
                                                                          "options": {"strip": False}}})
    assert config.verifier.name == "my_rewards:Exact"
    with pytest.raises(ConfigError, match=r"verifier\.name: verifier 'my_rewards:Nope': my_rewards has no attribute"):
        build_config(RunConfig, {"model": {"path": "m"}, "verifier": {"name": "my_rewards:Nope"}})
    with pytest.raises(ConfigError, match=r"verifier\.options: verifier 'my_rewards:Exact': unknown option\(s\) strp"):
        build_config(RunConfig, {"model": {"path": "m"}, "verifier": {"name": "my_rewards:Exact", "options": {"strp": 1}}})
    (tmp_path / "d.jsonl").write_text(json.dumps({"prompt": "2+2=", "answer": "4"}) + "\n")
    suite = get_task("custom", path=str(tmp_path / "d.jsonl"), answer_field="answer", verifier="my_rewards:Exact")
    (problem,) = suite
    assert problem.verifier == "my_rewards:Exact" and problem.prompt[-1]["content"] == "2+2="  # no \boxed{} added
    with pytest.raises(InvalidValueError, match=r"custom: unknown verifier 'my rewards'; valid verifiers: .*math.*; or an import path"):
        get_task("custom", path=str(tmp_path / "d.jsonl"), answer_field="answer", verifier="my rewards")


def test_worker_processes_score_an_import_path_verifier(user_module):
    from rlvr.verifiers.runner import VerifierRunner

    with VerifierRunner(workers=1, timeout_s=60) as runner:
        rewards = runner.score_batch("my_rewards:Exact", ["4", "5"], [{"answer": "4"}] * 2)
    assert [r.score for r in rewards] == [1.0, 0.0] and all(r.status == "ok" for r in rewards)


# ---- 3, 4. the run's first lines: verifier, instruction, template; eval that is not held out ------

def _custom_config(data_file: Path, *overrides: str) -> RunConfig:
    raw = {"model": {"path": "m"}, "data": [{"task": "custom", "path": str(data_file), "options": {"answer_field": "a"}}]}
    return build_config(RunConfig, raw, list(overrides))


def test_first_lines_name_the_verifier_the_instruction_and_the_template(tmp_path):
    from rlvr.rollout.suites import describe_suites, load_eval_suites, load_training_suites

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "a": str(2 * i)}) + "\n" for i in range(4)))
    config = _custom_config(data, "eval.at_start=false", "eval.at_end=false")
    (line,) = describe_suites(config, *load_training_suites(config.data)[:1], load_eval_suites(config))
    assert line.startswith(f"train suite custom (data.0): 4 problems, split train, {data}; verifier math (the suite's "
                           "default; set data.0.options.verifier or verifier.name to change it); instruction added to "
                           "each prompt: 'Think step by step, then write the final answer inside \\\\boxed{}.' "
                           "(data.0.options.instruction: none drops it); chat_template auto")

    config = _custom_config(data, "data.0.options.instruction=none", "data.0.chat_template=none", "verifier.name=numeric",
                            "eval.at_start=false", "eval.at_end=false")
    suites, _ = load_training_suites(config.data)
    (line,) = describe_suites(config, suites, {})
    assert "verifier numeric (verifier.name); no instruction added; chat_template none" in line
    assert suites["custom"][0].prompt == [{"role": "user", "content": "0+0="}]


def test_the_default_eval_of_a_one_file_custom_suite_warns(tmp_path):
    from rlvr.rollout.suites import describe_suites, load_eval_suites, load_training_suites

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "a": str(2 * i)}) + "\n" for i in range(4)))
    config = _custom_config(data)
    lines = describe_suites(config, load_training_suites(config.data)[0], load_eval_suites(config))
    assert lines[1].startswith("eval suite custom (data.0): 4 problems, split test")
    assert lines[2] == (f"warning: eval suite 'custom' (split test): 4 of its 4 prompts are also training prompts ({data} is one "
                        "file: a custom suite reads it for every split), so its accuracy is not held-out accuracy; "
                        "set eval.tasks to held-out data (e.g. {task: custom, path: test.jsonl, ...}), or point the "
                        "suite at a folder holding train.jsonl and test.jsonl")
    held_out = build_config(RunConfig, {"model": {"path": "m"}, "data": [{"task": "arithmetic"}]})
    assert not [l for l in describe_suites(held_out, load_training_suites(held_out.data)[0], load_eval_suites(held_out))
                if l.startswith("warning")]  # disjoint splits: no warning


def test_instruction_none_means_no_instruction(tmp_path):
    from rlvr.tasks import get_task
    from rlvr.tasks.loading import instruction_text

    assert instruction_text("none", "default") == instruction_text("", "default") == ""
    assert instruction_text(None, "default") == "default" and instruction_text("Say it.", "default") == "Say it."
    (tmp_path / "d.jsonl").write_text(json.dumps({"prompt": "2+2=", "a": "4"}) + "\n")
    suite = get_task("custom", path=str(tmp_path / "d.jsonl"), answer_field="a", instruction="none")
    assert suite.instruction == "" and next(iter(suite)).prompt == [{"role": "user", "content": "2+2="}]


# ---- 5, 6. timestamps, logging time, end-of-run switches ----------------------------------------

def test_metrics_lines_carry_a_wall_clock_time(tmp_path):
    import time

    from rlvr.run.tracking import Tracker, read_metrics

    before = time.time()
    tracker = Tracker(tmp_path)
    tracker.log(1, {"reward/mean": 0.5})
    tracker.close()
    (record,) = read_metrics(tmp_path / "metrics.jsonl")
    assert record["step"] == 1 and before - 1 <= record["time"] <= time.time() + 1


def test_a_run_without_end_artefacts_logs_time_and_logging_time(tiny_model, tmp_path):
    from rlvr.recipes import grpo
    from rlvr.run.tracking import read_metrics

    raw = {
        "out": str(tmp_path / "run"), "model": {"path": str(tiny_model)},
        "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
        "generation": {"max_new_tokens": 2}, "algorithm": {"beta": 0.0},
        "train": {"steps": 3, "prompts_per_step": 2, "group_size": 2, "micro_batch_size": 4},
        "eval": {"at_start": False, "at_end": False},
        "checkpoint": {"every": 0, "at_end": False, "final_model": False},
        "log": {"progress": False, "plot": False, "plot_every": 1},
    }
    grpo.train(build_config(RunConfig, raw))
    run = tmp_path / "run"
    assert not (run / "final").exists() and not (run / "metrics.png").exists()
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())
    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[0]["time/log"] == 0.0 and all(r["time/log"] > 0 for r in records[1:])  # the metrics line at least
    assert records[0]["time"] <= records[1]["time"] <= records[2]["time"]
    assert (run / "summary.json").is_file()


def test_the_switches_default_to_writing_everything():
    config = build_config(RunConfig, {"model": {"path": "m"}})
    assert config.checkpoint.at_end and config.checkpoint.final_model and config.log.plot


def test_trl_mapping_doc_names_trl_options_and_real_keys():
    """docs/trl-mapping.md: every rlvr key it maps to is a real config key."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "trl-mapping.md").read_text()
    for option in ("learning_rate", "num_generations", "per_device_train_batch_size", "generation_batch_size",
                   "max_completion_length", "beta", "epsilon_high", "loss_type", "scale_rewards", "num_iterations",
                   "temperature", "top_p", "mask_truncated_completions", "reward_funcs", "reward_weights"):
        assert re.search(rf"`{option}\b", text), option
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        assert f"`loss_type: {loss_type}`" in text, loss_type

    fields = {f"{section}.{key}" for section, model in RunConfig.model_fields.items()
              for key in getattr(model.annotation, "model_fields", {})}
    fields |= {f"data[i].{k}" for k in RunConfig.model_fields["data"].annotation.__args__[0].model_fields}
    for key in set(re.findall(r"`((?:algorithm|train|generation|optim|verifier|checkpoint|log|eval|model|engine)\.\w+)",
                              text)):
        assert key in fields, f"docs/trl-mapping.md names {key}, which is not a config key"
