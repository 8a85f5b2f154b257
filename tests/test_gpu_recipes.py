"""The GPU recipes (rlvr/configs/gpu_*.yaml) stay runnable without a GPU to run them on.

Each recipe is a config for one 80 GB GPU with the published numbers it should reach (docs/real-models.md,
"GPU recipes"); nobody here can run it at its real size. So every file the glob finds is checked two
ways: as written, through the validation `rlvr train` does (schema, presets, the compatibility table,
at load and at start on one CUDA device) plus the vLLM options it names; and shrunk to the tiny model on
the CPU (HF engine, float32, a few tokens, one step), trained for real. A key renamed or removed from
the schema, an option vLLM's engine no longer takes, or a suite option its task no longer reads fails
here, not in the first GPU run that tries the recipe.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from rlvr.config import RunConfig, build_config, load_config
from rlvr.config.compatibility import check_compatibility
from rlvr.modeling.loading import is_hub_id

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "rlvr" / "configs").glob("gpu_*.yaml"))


def _vllm_engine_options() -> set[str]:
    """The keyword options ``VLLMEngine.__init__`` takes, read from its source: ``build_engine`` checks
    ``engine.options`` against that signature, and importing the module would import vLLM (seconds,
    and absent where it is not installed)."""
    tree = ast.parse((ROOT / "rlvr" / "engines" / "vllm.py").read_text())
    engine = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "VLLMEngine")
    init = next(node for node in engine.body if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    return {arg.arg for arg in init.args.kwonlyargs}


def test_the_glob_finds_the_recipes():
    assert {path.name for path in RECIPES} >= {"gpu_ppo_gsm8k_qwen05b.yaml", "gpu_countdown_qwen3b.yaml",
                                                 "gpu_drgrpo_math_qwen15b.yaml"}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda path: path.stem)
def test_recipe_as_written_passes_what_rlvr_train_checks_on_one_gpu(recipe):
    import torch

    config = load_config(RunConfig, recipe)  # what `rlvr train RECIPE` does: schema, presets, load-time rules
    check_compatibility(config, "start", world_size=1, device=torch.device("cuda"))
    assert (config.engine.name, config.model.dtype) == ("vllm", "bfloat16")
    unknown = set(config.engine.options) - _vllm_engine_options()
    assert not unknown, f"{recipe.name}: engine.options the vllm engine does not take: {sorted(unknown)}"
    text = recipe.read_text()
    # the model is the hub's: a hub id (rlvr downloads it into the hub cache on first use)
    assert is_hub_id(config.model.path), f"{recipe.name}: model.path {config.model.path!r} is not a hub id"
    assert "NOT reproduced" in text and "https://" in text, f"{recipe.name}: say where the numbers come from"


@pytest.fixture(scope="module")
def long_context_tiny_model(tmp_path_factory) -> Path:
    """The tiny model with room for real benchmark prompts: its character tokenizer spends a token per
    character, and MATH problems under a system message run past the default 256 positions."""
    from rlvr.modeling.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden_size=32, intermediate_size=64,
                            num_layers=1, num_heads=2, max_positions=4096, seed=0)


def shrink(raw: dict, model: Path, out: Path) -> tuple[dict, list[str]]:
    """``raw`` (a recipe as read from YAML) and the overrides that shrink it to one CPU step of the tiny
    model; everything else stays as the recipe writes it. vLLM's options leave with vLLM (the HF engine
    takes other ones, and a dict override merges into them rather than replacing them)."""
    raw = dict(raw)
    raw["engine"] = {key: value for key, value in raw["engine"].items() if key != "options"}
    algorithm, train = raw.get("algorithm", {}), raw.get("train", {})
    overrides = [
        f"out={out}", f"model.path={model}", "model.dtype=float32", "engine.name=hf", "train.device=cpu",
        "train.steps=1",
        f"train.prompts_per_step={max(2, algorithm.get('minibatches', 1))}",  # a minibatch needs a prompt
        f"train.group_size={min(2, train.get('group_size', 8))}",
        "generation.max_new_tokens=4", "eval.max_new_tokens=4", "eval.limit=2", "eval.at_start=false",
        "checkpoint.every=0", "checkpoint.at_end=false", "checkpoint.final_model=false",
        "log.progress=false", "log.plot=false",
    ]
    overrides += [f"data.{i}.limit=8" for i in range(len(raw["data"]))]
    return raw, overrides


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda path: path.stem)
def test_recipe_trains_one_step_at_a_tiny_shape(recipe, long_context_tiny_model, data_dir, tmp_path):
    from rlvr.recipes import train

    raw, overrides = shrink(yaml.safe_load(recipe.read_text()), long_context_tiny_model, tmp_path / "run")
    config = build_config(RunConfig, raw, overrides, source=str(recipe))
    assert config.algorithm == load_config(RunConfig, recipe).algorithm  # the recipe's algorithm, unshrunk
    summary = train(config)
    assert summary["steps"] == 1, summary
    evaluation = summary["evaluations"]["1"]  # the end-of-run evaluation, on every held-out suite of the recipe
    evaluated = {key.split("/")[1] for key in evaluation if key.startswith("eval/") and key.count("/") == 2}
    assert len(evaluated) == max(1, len(config.eval.tasks)), evaluation
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
