"""Name -> task suite factory, filled by ``@register_task`` and the ``rlvr.tasks`` entry points.

A third-party package adds suites without touching this repository::

    # its pyproject.toml
    [project.entry-points."rlvr.tasks"]
    my_suite = "my_package.suites:MySuite"

Entry points are listed on first use and imported only when their suite is asked for; a suite
registered in-process with the same name wins.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any, Callable

from rlvr.verifiers.registry import keyword_options

ENTRY_POINT_GROUP = "rlvr.tasks"

_REGISTRY: dict[str, Callable[..., Any]] = {}
_ENTRY_POINTS: dict[str, metadata.EntryPoint] = {}  # plugins, imported on first use
_entry_points_scanned = False


def register_task(name: str, *, overwrite: bool = False) -> Callable:
    """Decorator registering a suite class (or factory) called as ``factory(path=..., split=..., **options)``.

    Registering a different object under a taken name is an error unless ``overwrite=True`` (the
    same class registered again, e.g. by a module reload, is fine).
    """

    def decorate(factory: Callable) -> Callable:
        existing = _REGISTRY.get(name)
        if existing is not None and not overwrite and _origin(existing) != _origin(factory):
            raise ValueError(f"task {name!r} is already registered by {existing!r}; pass overwrite=True")
        _REGISTRY[name] = factory
        return factory

    return decorate


def _origin(factory: Callable) -> tuple:
    return (getattr(factory, "__module__", None), getattr(factory, "__qualname__", repr(factory)))


def _scan_entry_points() -> None:
    global _entry_points_scanned
    if not _entry_points_scanned:
        _entry_points_scanned = True
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            _ENTRY_POINTS.setdefault(ep.name, ep)


def list_tasks() -> list[str]:
    """Sorted names of every registered task suite (built-in and plugins)."""
    _scan_entry_points()
    return sorted(set(_REGISTRY) | set(_ENTRY_POINTS))


def task_factory(name: str) -> Callable[..., Any]:
    """The class or factory registered under ``name`` (a plugin is imported here). An unknown
    name lists the registered suites; a plugin that fails to import names its entry point."""
    _scan_entry_points()
    if name not in _REGISTRY and name in _ENTRY_POINTS:
        ep = _ENTRY_POINTS[name]
        try:
            _REGISTRY[name] = ep.load()
        except Exception as exc:
            raise ImportError(f"task plugin {name!r} ({ep.value}, entry point group {ENTRY_POINT_GROUP!r}) "
                              f"failed to import: {type(exc).__name__}: {exc}") from exc
    if name not in _REGISTRY:
        raise KeyError(f"unknown task {name!r}; registered tasks: {', '.join(list_tasks())}")
    return _REGISTRY[name]


def get_task(name: str, path: str | None = None, split: str = "train", **options: Any):
    """Build the suite ``name`` (an iterable of :class:`~tasks.base.Problem`).

    ``path`` points at a local copy of the data (or a Hugging Face dataset name) for suites that
    read data; generated suites ignore it. An unknown name lists the registered suites.
    """
    factory = task_factory(name)
    valid = task_options(factory)
    unknown = sorted(set(options) - set(valid)) if valid is not None else []
    if unknown:
        raise TypeError(f"task {name!r}: unknown option(s) {', '.join(unknown)}; valid options: {', '.join(valid) or 'none'}")
    return factory(path=path, split=split, **options)


def task_options(factory: Callable) -> list[str] | None:
    """The keyword options a suite accepts besides ``path`` and ``split`` (None when it takes ``**kwargs``)."""
    return keyword_options(factory, exclude=("self", "path", "split"))