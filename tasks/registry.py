"""Name -> task suite factory: ``@register_task`` in-process, ``rlvr.tasks`` entry points for
third-party packages (see :mod:`rlvr.verifiers.plugins` for how names are found and loaded)::

    # a plugin's pyproject.toml
    [project.entry-points."rlvr.tasks"]
    my_suite = "my_package.suites:MySuite"

Entry points are listed on first use and imported only when their suite is asked for; a suite
registered in-process with the same name wins.
"""

from __future__ import annotations

from typing import Any, Callable

from rlvr.verifiers.plugins import Registry, check_options, keyword_options

ENTRY_POINT_GROUP = "rlvr.tasks"
TASKS: Registry[Callable[..., Any]] = Registry("task", entry_point_group=ENTRY_POINT_GROUP)


def register_task(name: str, *, overwrite: bool = False) -> Callable:
    """Decorator registering a suite class (or factory) called as ``factory(path=..., split=..., **options)``.

    Registering a different object under a taken name is an error unless ``overwrite=True`` (the
    same class registered again, e.g. by a module reload, is fine).
    """
    return lambda factory: TASKS.register(name, factory, overwrite=overwrite)


def list_tasks() -> list[str]:
    """Sorted names of every registered task suite (built-in and plugins, none imported)."""
    return TASKS.names()


def task_factory(name: str) -> Callable[..., Any]:
    """The class or factory registered under ``name`` (a plugin is imported here). An unknown
    name lists the registered suites; a plugin that fails to import names its entry point."""
    return TASKS.get(name)


def held_out_split(task: str) -> str:
    """The split an evaluation of ``task`` reads when none is named: ``test`` where the suite has one
    (or does not declare its splits, or reads any split of the user's data), else its first split
    other than ``train``."""
    try:
        splits = tuple(getattr(task_factory(task), "splits", None) or ())
    except Exception:  # an unknown or broken suite fails later, where it is loaded, with its own message
        return "test"
    if not splits or "test" in splits:
        return "test"
    return next((split for split in splits if split != "train"), splits[0])


def check_task(name: str, options: dict | None = None) -> Callable[..., Any]:
    """The factory of ``name`` after checking that it loads and takes every option in ``options``."""
    factory = task_factory(name)
    check_options(f"task {name!r}", factory, dict(options or {}), exclude=("self", "path", "split"))
    return factory


def get_task(name: str, path: str | None = None, split: str = "train", **options: Any):
    """Build the suite ``name`` (an iterable of :class:`~rlvr.tasks.base.Problem`).

    ``path`` points at a local copy of the data (or a Hugging Face dataset name) for suites that
    read data; generated suites ignore it. An unknown name lists the registered suites; an option
    the suite does not take lists the ones it does (``path`` and ``split`` are arguments, not options).
    """
    factory = check_task(name, options)
    return factory(path=path, split=split, **options)


def task_options(factory: Callable) -> list[str] | None:
    """The keyword options a suite accepts besides ``path`` and ``split`` (None when it takes ``**kwargs``)."""
    return keyword_options(factory, exclude=("self", "path", "split"))
