"""Name -> task suite factory, filled by ``@register_task`` (and the ``rlvr.tasks`` entry points)."""

from __future__ import annotations

from importlib import metadata
from typing import Any, Callable

ENTRY_POINT_GROUP = "rlvr.tasks"

_REGISTRY: dict[str, Callable[..., Any]] = {}
_ENTRY_POINTS: dict[str, metadata.EntryPoint] = {}  # plugins, imported on first use
_entry_points_scanned = False


def register_task(name: str) -> Callable:
    """Decorator registering a suite class (or factory) called as ``factory(path=..., split=..., **options)``."""

    def decorate(factory: Callable) -> Callable:
        _REGISTRY[name] = factory
        return factory

    return decorate


def _scan_entry_points() -> None:
    global _entry_points_scanned
    if not _entry_points_scanned:
        _entry_points_scanned = True
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            _ENTRY_POINTS.setdefault(ep.name, ep)


def list_tasks() -> list[str]:
    """Sorted names of every registered task suite."""
    _scan_entry_points()
    return sorted(set(_REGISTRY) | set(_ENTRY_POINTS))


def get_task(name: str, path: str | None = None, split: str = "train", **options: Any):
    """Build the suite ``name`` (an iterable of :class:`~tasks.base.Problem`).

    ``path`` points at a local copy of the data (or a Hugging Face dataset name) for suites that
    read data; generated suites ignore it. An unknown name lists the registered suites.
    """
    _scan_entry_points()
    if name not in _REGISTRY and name in _ENTRY_POINTS:
        _REGISTRY[name] = _ENTRY_POINTS[name].load()
    if name not in _REGISTRY:
        raise KeyError(f"unknown task {name!r}; registered tasks: {', '.join(list_tasks())}")
    return _REGISTRY[name](path=path, split=split, **options)
