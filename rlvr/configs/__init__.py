"""Example run configs shipped with the package; ``load_packaged(name)`` reads one as a dict.

Light on purpose (yaml only): the command line reads defaults from here while printing ``--help``.
"""

from __future__ import annotations

from importlib import resources


def packaged_names() -> list[str]:
    """File names of the packaged configs, e.g. ``quickstart.yaml``."""
    return sorted(p.name for p in resources.files(__name__).iterdir() if p.name.endswith(".yaml"))


def load_packaged(name: str) -> dict:
    """The packaged config ``name`` (e.g. ``"quickstart.yaml"``) as a plain dict, before validation."""
    import yaml

    if name not in packaged_names():
        raise FileNotFoundError(f"no packaged config {name!r}; packaged: {', '.join(packaged_names())}")
    return yaml.safe_load(resources.files(__name__).joinpath(name).read_text())
