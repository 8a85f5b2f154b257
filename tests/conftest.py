"""Shared fixtures: paths to the project and its benchmark data, and tiny models built locally."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.tasks.loading import data_dir_help, project_data_dir

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = project_data_dir()  # $RLVR_DATA_DIR, else ../shared/data beside the checkout
DATA_MISSING = f"benchmark data not found; {data_dir_help()}; or load the suites from the hub with path=NAME"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if DATA_DIR is None or not DATA_DIR.is_dir():
        pytest.skip(DATA_MISSING)
    return DATA_DIR


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray shared by every test that needs one; skipped where Ray is not installed. It claims 8
    logical CPUs (on any machine) so that the tests' runners, each holding actors of 1 CPU, fit side by side."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    ray.init(num_cpus=8, include_dashboard=False, configure_logging=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A randomly initialised tiny Llama with a character tokenizer, saved like a hub model."""
    from rlvr.modeling.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden_size=64, intermediate_size=128, seed=0)


@pytest.fixture(scope="session")
def taught_model(tmp_path_factory, tiny_model) -> Path:
    """The tiny model after a short SFT on 1-digit addition: right often, wrong sometimes."""
    from rlvr.recipes import sft
    from rlvr.config import build_config
    from rlvr.config import SFTConfig

    out = tmp_path_factory.mktemp("taught")
    config = build_config(SFTConfig, {
        "out": str(out), "model": {"path": str(tiny_model)},
        "data": {"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}, "limit": 2000},
        "optim": {"lr": 3e-3}, "train": {"steps": 60, "batch_size": 64},
        "log": {"progress": False},
    })
    sft.train(config)
    return out / "final"
