"""Config: presets, overrides, and errors that name the key and the valid choices."""

import pytest
import yaml

from rlvr.config import PRESETS, ConfigError, RunConfig, build_config, load_config, parse_overrides, save_config

from rlvr.config import SFTConfig
from rlvr.configs import load_packaged, packaged_names

BASE = {"model": {"path": "some/model"}}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_fills_algorithm_defaults(preset):
    config = build_config(RunConfig, BASE, [f"algorithm.preset={preset}"])
    for key, value in PRESETS[preset].items():
        assert getattr(config.algorithm, key) == value


def test_dapo_preset_is_clip_higher_token_mean_dynamic_sampling():
    a = build_config(RunConfig, BASE, ["algorithm.preset=dapo"]).algorithm
    assert (a.clip_low, a.clip_high, a.loss_agg, a.dynamic_sampling, a.overlong) == (0.2, 0.28, "token_mean", True, "soft")


def test_user_values_win_over_the_preset():
    config = build_config(RunConfig, {**BASE, "algorithm": {"preset": "dapo", "clip_high": 0.3}}, ["algorithm.beta=0.1"])
    assert config.algorithm.clip_high == 0.3 and config.algorithm.beta == 0.1
    assert config.algorithm.loss_agg == "token_mean"


def test_unknown_key_names_it_and_lists_valid_keys():
    with pytest.raises(ConfigError) as info:
        build_config(RunConfig, BASE, ["algorithm.clip_lo=0.1"])
    message = str(info.value)
    assert "algorithm.clip_lo" in message and "clip_low" in message and "clip_high" in message


def test_unknown_top_level_and_nested_list_keys():
    with pytest.raises(ConfigError, match=r"trian: unknown key; valid keys here: .*train"):
        build_config(RunConfig, {**BASE, "trian": {}})
    with pytest.raises(ConfigError, match=r"data\.0\.tsk: unknown key; valid keys here: .*task"):
        build_config(RunConfig, BASE, ["data.0.tsk=gsm8k"])


def test_wrong_type_and_bad_choice_name_the_key():
    with pytest.raises(ConfigError, match=r"optim\.lr: .*valid number.*'fast'"):
        build_config(RunConfig, BASE, ["optim.lr=fast"])
    with pytest.raises(ConfigError, match=r"algorithm\.advantage: unknown advantage estimator 'ppo'; valid advantage estimators: dr_grpo, grpo, reinforce_pp, rloo"):
        build_config(RunConfig, BASE, ["algorithm.advantage=ppo"])
    with pytest.raises(ConfigError, match=r"algorithm\.preset: unknown preset 'ppo2'; valid presets: grpo"):
        build_config(RunConfig, BASE, ["algorithm.preset=ppo2"])


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["train.group_size=1"], "train.group_size"),
        (["algorithm.preset=dr_grpo", "train.group_size=1"], "train.group_size"),
        (["algorithm.minibatches=64", "train.prompts_per_step=8"], "algorithm.minibatches"),
        (["algorithm.overlong=soft", "algorithm.overlong_buffer=300", "generation.max_new_tokens=256"], "algorithm.overlong_buffer"),
        (["model.path="], "model.path"),
    ],
)
def test_impossible_combinations_are_rejected(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_config(RunConfig, BASE, overrides)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algorithm.lam=0.9"], r"algorithm\.lam: only the critic presets \(ppo, reinforce_baseline\) use it, and "
                                r"algorithm\.preset is 'grpo'"),
        (["algorithm.preset=rloo", "algorithm.value_clip=0.5"], r"algorithm\.value_clip: .* algorithm\.preset is 'rloo'"),
        (["critic.lr=1e-3"], r"critic\.lr: only the critic presets \(ppo, reinforce_baseline\) have a critic"),
        (["algorithm.advantage=gae"], r"algorithm\.advantage: gae needs a critic; valid presets for it: ppo, reinforce_baseline"),
        (["algorithm.preset=ppo", "algorithm.advantage=rloo"], r"algorithm\.advantage: the ppo preset's advantages come "
                                                               r"from its critic \(gae\), not 'rloo'"),
        (["algorithm.preset=ppo", "algorithm.dynamic_sampling=true"], r"algorithm\.dynamic_sampling: the ppo preset"),
        (["algorithm.preset=ppo", "algorithm.target_kl=0.1", "algorithm.kl_placement=loss"], r"algorithm\.target_kl"),
        (["algorithm.preset=ppo", "algorithm.target_kl=0.1", "algorithm.beta=0"], r"algorithm\.target_kl"),
        (["algorithm.preset=ppo", "model.lora={r: 8}", "critic.path=/some/rm"], r"critic\.path: with model\.lora"),
    ],
)
def test_critic_options_only_with_a_critic_preset_and_group_options_only_without(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_config(RunConfig, BASE, overrides)


def test_critic_presets_accept_their_options_and_need_no_groups():
    config = build_config(RunConfig, BASE, ["algorithm.preset=ppo", "train.group_size=1", "algorithm.lam=0.9",
                                            "critic.lr=1e-4", "algorithm.target_kl=0.05"])
    assert (config.algorithm.advantage, config.algorithm.lam, config.critic.lr) == ("gae", 0.9, 1e-4)
    baseline = build_config(RunConfig, BASE, ["algorithm.preset=reinforce_baseline"]).algorithm
    assert (baseline.policy_loss, baseline.lam, baseline.value_clip, baseline.ppo_epochs) == ("vanilla", 1.0, None, 1)


def test_a_saved_critic_free_config_loads_back_with_its_default_critic_section(tmp_path):
    """Every default is written out, the critic's too: reading it back must not count as setting them."""
    save_config(build_config(RunConfig, BASE, []), tmp_path / "config.yaml")
    assert "critic" in yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert load_config(RunConfig, tmp_path / "config.yaml").algorithm.preset == "grpo"


def test_overrides_parse_yaml_values_and_index_lists():
    assert parse_overrides(["a.b=3", "a.c=[1, 2]", "d=null", "e=true"]) == {"a": {"b": 3, "c": [1, 2]}, "d": None, "e": True}
    config = build_config(RunConfig, BASE, ["data.0.task=arithmetic", "data.1.task=arithmetic", "data.1.weight=3"])
    assert [d.weight for d in config.data] == [1.0, 3.0]
    with pytest.raises(ConfigError, match="not of the form key=value"):
        parse_overrides(["train.steps"])


def test_resolved_config_round_trips_with_every_default(tmp_path):
    config = build_config(RunConfig, BASE, ["algorithm.preset=rloo", "train.steps=7"])
    save_config(config, tmp_path / "config.yaml")
    written = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert written["algorithm"]["kl_placement"] == "reward" and written["optim"]["grad_clip"] == 1.0
    assert load_config(RunConfig, tmp_path / "config.yaml") == config


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(RunConfig, tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(RunConfig, bad)


@pytest.mark.parametrize("name", packaged_names())
def test_packaged_example_configs_validate(name):
    raw = load_packaged(name)
    from rlvr.config import DPOConfig, PRMConfig, RewardModelConfig

    rl = "grpo" in name or "ppo" in name  # arithmetic_grpo_rm.yaml trains a policy against a reward model
    cls = (SFTConfig if "sft" in name else RunConfig if rl else PRMConfig if "_prm" in name
           else RewardModelConfig if "_rm" in name
           else DPOConfig if "dpo" in name else RunConfig)
    config = build_config(cls, raw, ["model.path=some/model"], source=name)
    assert config.model.path == "some/model"


def test_an_unknown_packaged_config_lists_the_packaged_ones():
    with pytest.raises(FileNotFoundError, match="quickstart.yaml"):
        load_packaged("quickstrat.yaml")
