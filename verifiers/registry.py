"""Name -> verifier factory, filled by ``@register_verifier`` and the ``rlvr.verifiers`` entry points.

A factory is a class (or any callable) that takes the verifier's options as keyword arguments and
returns an object with ``name`` and ``score``. Third-party packages declare theirs in
``pyproject.toml``::

    [project.entry-points."rlvr.verifiers"]
    my_check = "my_package.rewards:MyCheck"
"""

from __future__ import annotations

import inspect
from importlib import metadata
from typing import Any, Callable

ENTRY_POINT_GROUP = "rlvr.verifiers"

_REGISTRY: dict[str, Callable[..., Any]] = {}
_entry_points_loaded = False


def register_verifier(name: str, *, overwrite: bool = False) -> Callable:
    """Decorator that registers a verifier class (or factory function) under ``name``.

    Registering a different object under a taken name is an error unless ``overwrite=True``.
    """

    def decorate(factory: Callable) -> Callable:
        existing = _REGISTRY.get(name)
        if existing is not None and not overwrite and _origin(existing) != _origin(factory):
            raise ValueError(f"verifier {name!r} is already registered by {existing!r}; pass overwrite=True")
        if isinstance(factory, type) and getattr(factory, "name", None) in (None, "verifier"):
            factory.name = name  # type: ignore[attr-defined]
        _REGISTRY[name] = factory
        return factory

    return decorate


def _origin(factory: Callable) -> tuple:
    # A module that is imported twice (reload, test collection) re-registers an equal factory.
    return (getattr(factory, "__module__", None), getattr(factory, "__qualname__", repr(factory)))


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _REGISTRY:
            continue
        try:
            _REGISTRY[ep.name] = ep.load()
        except Exception as exc:  # a broken plugin must not take the built-ins down with it
            _REGISTRY[ep.name] = _broken_plugin(ep.name, ep.value, exc)


def _broken_plugin(name: str, target: str, exc: Exception) -> Callable:
    def fail(**_options: Any) -> Any:
        raise ImportError(f"verifier plugin {name!r} ({target}) failed to load: {exc!r}") from exc

    return fail


def list_verifiers() -> list[str]:
    """Sorted names of every registered verifier (built-ins and entry-point plugins)."""
    _load_entry_points()
    return sorted(_REGISTRY)


def verifier_factory(name: str) -> Callable[..., Any]:
    """The class or factory registered under ``name``; unknown names list the valid ones."""
    _load_entry_points()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown verifier {name!r}; registered verifiers: {', '.join(list_verifiers())}") from None


def get_verifier(name: str, **options: Any) -> Any:
    """Build the verifier registered under ``name`` with ``options`` as keyword arguments.

    An option the verifier does not take is an error that lists the ones it does.
    """
    factory = verifier_factory(name)
    accepted = verifier_options(factory)
    if accepted is not None:
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            valid = ", ".join(accepted) or "(none)"
            raise TypeError(f"verifier {name!r} got unknown option(s) {unknown}; valid options: {valid}")
    verifier = factory(**options)
    if not hasattr(verifier, "score"):
        raise TypeError(f"verifier factory {name!r} returned {verifier!r}, which has no score() method")
    return verifier


def describe_verifier(name: str) -> dict[str, Any]:
    """``{"name", "description", "options": {option: default or "<required>"}}`` for listings."""
    factory = verifier_factory(name)
    doc = (getattr(factory, "description", "") or (inspect.getdoc(factory) or "").split("\n")[0]).strip()
    options: dict[str, Any] = {}
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        params = []
    for p in params:
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self":
            options[p.name] = "<required>" if p.default is inspect.Parameter.empty else p.default
        elif p.kind is p.VAR_KEYWORD:
            options["**" + p.name] = "<any>"
    return {"name": name, "description": doc, "options": options}


def verifier_options(factory: Callable) -> list[str] | None:
    """Keyword options a factory accepts, or None when it takes ``**kwargs`` (anything goes)."""
    return keyword_options(factory)


def keyword_options(factory: Callable, exclude: tuple[str, ...] = ("self",)) -> list[str] | None:
    """Names a callable accepts as keyword arguments (minus ``exclude``); None when it takes
    ``**kwargs``. Shared by the verifier and task registries to reject unknown options."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in exclude]
