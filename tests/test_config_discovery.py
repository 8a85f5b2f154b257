"""Config discovery: ``rlvr config show`` prints every key of a recipe's config with its type, default and
description, and a misspelled key is answered with the closest valid ones, blamed on where it was
written (the ``key=value`` override or the YAML file)."""

from __future__ import annotations

import json

import pytest
import yaml

from rlvr.cli import build_parser, main
from rlvr.commands.config import RECIPES
from rlvr.config import ConfigError, RunConfig, load_config
from rlvr.config.keys import config_keys
from rlvr.verifiers.plugins import import_target


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_every_key_of_every_recipe_is_printed_with_a_description(recipe, capsys):
    keys = config_keys(import_target(RECIPES[recipe]))
    undescribed = [k.path for k in keys if not k.section and not k.description]
    assert not undescribed, f"rlvr {recipe}: keys without a description: {undescribed}"
    code, out, _ = run_cli(capsys, "config", "show", "--recipe", recipe, "--json")
    assert code == 0
    printed = [json.loads(line) for line in out.splitlines()]
    assert [p["key"] for p in printed] == [k.path for k in keys]
    assert {"train.seed", "optim.lr", "log.plot", "model.path"} <= {p["key"] for p in printed}


def test_config_show_text_gives_type_default_and_description(capsys):
    code, out, _ = run_cli(capsys, "config", "show")
    assert code == 0
    assert "train.steps = 100  (int >= 1)" in out
    assert "generation.max_new_tokens = 256  (int >= 1)" in out
    assert "log.completions_every = 1  (int >= 0)" in out and "completions.jsonl" in out
    assert "data.N.task = arithmetic  (str)" in out  # list entries by index
    assert "reward_model  (section, default null: unset)" in out


def test_defaults_are_the_effective_ones(capsys):
    """The RL preset fills algorithm.beta (0.04 for grpo, not the field's 0.0); SFT's optimizer has its own lr."""
    assert run_cli(capsys, "config", "show", "algorithm.beta")[1].startswith(
        "algorithm.beta = 0.04  (float >= 0; default set by algorithm.preset)")
    code, out, _ = run_cli(capsys, "config", "show", "--recipe", "sft", "optim.lr")
    assert code == 0 and out.splitlines()[0] == "optim.lr = 1e-05  (float > 0)"
    code, out, _ = run_cli(capsys, "config", "show", "generation")
    assert out.splitlines()[0] == "generation  (section)" and all(
        line.startswith(("generation", "    ")) for line in out.splitlines())
    assert run_cli(capsys, "config", "show", "data.0.path")[1].startswith("data.N.path = null")


def test_an_unknown_key_to_show_is_one_line_naming_the_closest(capsys):
    code, _, err = run_cli(capsys, "config", "show", "train.stepz")
    assert code == 2 and "Traceback" not in err
    assert err.splitlines()[0] == ("rlvr config: rlvr train's config has no key 'train.stepz'; did you mean train.steps "
                                   "or train.seed or train.strategy? top-level keys: algorithm, async_generation, "
                                   "checkpoint, critic, data, engine, environment, eval, generation, log, model, "
                                   "optim, out, process_reward, reward_model, train, verifier")


@pytest.mark.parametrize("command", ["train", "sft", "dpo", "train-rm", "train-prm"])
def test_the_training_commands_help_points_to_config_show(command):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices[command]
    assert f"rlvr config show --recipe {command}" in " ".join(sub.format_help().split())


# ---------------------------------------------------------------------------------------------
# did you mean, and the right source
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": {"path": "m"}, "train": {"stepz": 3}}))
    return path


def test_a_typo_in_the_file_is_blamed_on_the_file_with_the_closest_key(config_file):
    with pytest.raises(ConfigError) as info:
        load_config(RunConfig, config_file)
    message = str(info.value)
    assert message.startswith(f"invalid config ({config_file}): train.stepz: unknown key; valid keys here: ")
    assert message.endswith(". Did you mean train.steps?") and "\n" not in message


def test_a_typo_in_an_override_is_blamed_on_the_override(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump({"model": {"path": "m"}}))
    with pytest.raises(ConfigError) as info:
        load_config(RunConfig, path, ["train.steps=3", "generation.max_new_tokenz=8"])
    message = str(info.value)
    assert message.startswith("invalid config (override generation.max_new_tokenz=8): generation.max_new_tokenz: ")
    assert message.endswith("Did you mean generation.max_new_tokens?")


def test_a_key_in_the_wrong_section_names_where_it_lives(config_file):
    """No close spelling in train: the same name in another section is the likely meaning."""
    with pytest.raises(ConfigError) as info:
        load_config(RunConfig, config_file, ["train.lr=1e-5"])
    lines = str(info.value).splitlines()
    assert lines[0] == "invalid config:"  # two mistakes from two sources: each says its own
    assert lines[1].startswith(f"  in {config_file}: train.stepz: unknown key") and lines[1].endswith("train.steps?")
    assert lines[2].startswith("  in override train.lr=1e-5: train.lr: unknown key")
    assert lines[2].endswith("Did you mean critic.lr or optim.lr?")
