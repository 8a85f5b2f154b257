"""Which features combine: the table of rlvr/config/compatibility.py, one case per rule.

Each refused pair fails at config load (``build_config`` raises a ConfigError naming both keys and the
fix) and ``rlvr train`` with it exits 2 with that one line and leaves no run folder. The rules that
need the world size or the device are refused by the start check (``join_run``) before the folder is
claimed. The model path of these configs does not exist: a refusal that came after the model folder
was checked would name the model instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from rlvr.cli import main
from rlvr.config import ConfigError, PRMConfig, RunConfig, build_config
from rlvr.config.compatibility import RULES, Rule, check_compatibility, render_markdown
from rlvr.verifiers.errors import InvalidValueError

ROOT = Path(__file__).resolve().parents[1]
NO_MODEL = "/nonexistent/model"
BASE = {
    "model": {"path": NO_MODEL},
    "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
    "generation": {"max_new_tokens": 3},
    "train": {"steps": 1, "prompts_per_step": 4, "group_size": 2, "device": "cpu"},
    "eval": {"at_start": False, "at_end": False},
    "log": {"progress": False, "plot_every": 0},
}
PRM_BASE = {"model": {"path": NO_MODEL}, "data": {"path": "steps.jsonl"}, "train": {"device": "cpu"}}

#: One example per rule of RULES, in its order: (overrides, the world size it runs on).
EXAMPLES: list[tuple[list[str], int]] = [
    (["async_generation.max_staleness=1", "engine.name=vllm"], 1),
    (["async_generation.max_staleness=0", "reward_model.path=/rm"], 1),
    (["async_generation.max_staleness=0", "algorithm.dynamic_sampling=true"], 1),
    (["async_generation.max_staleness=0", "train.strategy=fsdp2"], 1),
    (["async_generation.max_staleness=1", "algorithm.old_logprobs=engine"], 1),
    (["async_generation.max_staleness=0"], 2),
    (["process_reward.path=/prm", "reward_model.path=/rm"], 1),
    (["process_reward.path=/prm", "environment.name=python"], 1),
    (["process_reward.path=/prm", "async_generation.max_staleness=0"], 1),
    (["process_reward.path=/prm", "algorithm.guidance=solution"], 1),
    (["process_reward.path=/prm", "process_reward.use=token"], 1),
    (["reward_model.path=/rm", "environment.name=python"], 1),
    (["algorithm.preset=ppo", "algorithm.guidance=solution"], 1),
    (["algorithm.guidance=solution", "reward_model.path=/rm"], 1),
    (["algorithm.guidance=solution", "environment.name=python"], 1),
    (["algorithm.advantage=gae"], 1),
    (["algorithm.preset=ppo", "algorithm.advantage=rloo"], 1),
    (["algorithm.preset=ppo", "algorithm.dynamic_sampling=true"], 1),
    (["algorithm.preset=ppo", "algorithm.target_kl=0.1", "algorithm.kl_placement=loss"], 1),
    (["algorithm.preset=ppo", "model.lora={r: 8}", "critic.path=/some/rm"], 1),
    (["algorithm.lam=0.9"], 1),
    (["critic.lr=1e-3"], 1),
    (["algorithm.preset=ppo", "model.lora={r: 8}", "train.strategy=fsdp2"], 2),
    (["train.cpu_offload=true"], 1),
    (["train.cpu_offload=true", "train.strategy=fsdp2"], 1),
    (["train.strategy=fsdp2"], 1),  # rlvr train-prm
]


def _fragments(rule: Rule) -> list[str]:
    """What the refusal of ``rule`` must contain: both keys (the first may be one of several it names),
    the reason's and the fix's fixed start."""
    first = [rule.first.key] if "," not in rule.first.key else []
    return [*first, rule.second.key.split(",")[0].split(" ")[0], rule.reason.split("{")[0], rule.fix.split("{")[0]]


def _recipe(rule: Rule) -> tuple[type, dict, str]:
    return (PRMConfig, PRM_BASE, "train-prm") if rule.recipes == ("PRMConfig",) else (RunConfig, BASE, "train")


def test_every_rule_has_an_example():
    assert len(EXAMPLES) == len(RULES)


@pytest.mark.parametrize("index", range(len(RULES)), ids=[f"{r.first.key.split(',')[0]}+{r.second.key}"
                                                          for r in RULES])
def test_a_refused_pair_fails_before_any_work_and_leaves_no_folder(capsys, tmp_path, index):
    rule, (overrides, world_size) = RULES[index], EXAMPLES[index]
    cls, base, command = _recipe(rule)
    if rule.when == "load":
        with pytest.raises(ConfigError) as refused:
            build_config(cls, base, overrides)
        message = str(refused.value)
    else:  # the config loads; the start check refuses it with this world size and device
        config = build_config(cls, base, overrides)
        with pytest.raises(InvalidValueError) as refused:
            check_compatibility(config, "start", world_size=world_size, device=torch.device("cpu"))
        message = str(refused.value)
        check_compatibility(config, "start", world_size=1, device=torch.device("cuda"))  # the pair alone is fine
    for fragment in _fragments(rule):
        assert fragment in message, (fragment, message)
    if world_size > 1:  # several ranks need torchrun: the check above is the start check join_run runs
        return
    run = tmp_path / "run"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**base, "out": str(run)}))
    code = main([command, str(tmp_path / "c.yaml"), *overrides])
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if not line.startswith("(rlvr --debug")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert rule.reason.split("{")[0] in lines[0] and NO_MODEL not in lines[0], lines[0]
    assert not run.exists()


def test_a_suite_that_declares_its_environment_counts_as_episodes():
    """tool_arithmetic's problems play in the python environment: a reward model is refused at load,
    without environment.name."""
    data = [{"task": "tool_arithmetic"}]
    with pytest.raises(ConfigError, match="a learned reward model scores single completions"):
        build_config(RunConfig, {**BASE, "data": data}, ["reward_model.path=/rm"])
    build_config(RunConfig, {**BASE, "data": data})  # alone it loads


def test_tis_cap_is_refused_with_its_replacement(capsys, tmp_path):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**BASE, "out": str(tmp_path / "run")}))
    assert main(["train", str(tmp_path / "c.yaml"), "algorithm.tis_cap=2.0"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if not line.startswith("(rlvr --debug")]
    assert len(lines) == 1, err
    assert "algorithm.tis_cap" in lines[0] and "algorithm.off_policy: token_tis" in lines[0] \
        and "algorithm.off_policy_cap: 2.0" in lines[0], lines[0]
    config = build_config(RunConfig, BASE, ["algorithm.off_policy=token_tis", "algorithm.off_policy_cap=2.0"])
    assert (config.algorithm.off_policy, config.algorithm.off_policy_cap) == ("token_tis", 2.0)


def test_the_docs_show_the_table_as_generated():
    text = (ROOT / "docs" / "training.md").read_text()
    start = "<!-- compatibility: generated by rlvr.config.compatibility.render_markdown -->\n"
    assert start in text
    shown = text.split(start, 1)[1].split("<!-- /compatibility -->", 1)[0]
    assert shown == render_markdown(), ("docs/training.md is stale: paste the output of "
                                         "`python -m rlvr.config.compatibility` between the markers")
