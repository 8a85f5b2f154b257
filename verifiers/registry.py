"""Name -> verifier factory: ``@register_verifier`` in-process, ``rlvr.verifiers`` entry points
for third-party packages (see :mod:`rlvr.verifiers.plugins` for how names are found and loaded).

A factory is a class (or any callable) that takes the verifier's options as keyword arguments and
returns an object with ``name`` and ``score``. Third-party packages declare theirs in
``pyproject.toml``::

    [project.entry-points."rlvr.verifiers"]
    my_check = "my_package.rewards:MyCheck"

A TRL-style reward function ``f(prompts, completions, **columns)`` can be published the same way
(``accuracy = "my_package.rewards:accuracy"``): it is wrapped as a ``trl`` verifier when first used.

No packaging is needed to use one's own verifier: its import path is a name too, wherever a verifier
name goes (``verifier.name``, a problem's ``verifier``, ``--verifier``)::

    verifier: {name: "my_rewards:Exact"}          # a class with score(), a verifier object,
    verifier: {name: "my_rewards:accuracy"}       # or a TRL reward function

Plugins are imported when their name is first asked for; one that fails to import is listed as
broken (``rlvr verifiers list``) and raises :class:`~rlvr.verifiers.errors.PluginLoadError` with
the reason when used, without taking the other verifiers down.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from rlvr.verifiers.errors import PluginLoadError
from rlvr.verifiers.plugins import Registry, build_with_options, check_options, is_import_path, keyword_options

ENTRY_POINT_GROUP = "rlvr.verifiers"
VERIFIERS: Registry[Callable[..., Any]] = Registry("verifier", entry_point_group=ENTRY_POINT_GROUP, import_paths=True)

__all__ = ["ENTRY_POINT_GROUP", "VERIFIERS", "describe_verifier", "get_verifier", "keyword_options",
           "list_verifiers", "register_verifier", "verifier_factory", "verifier_options"]


def register_verifier(name: str, *, overwrite: bool = False) -> Callable:
    """Decorator that registers a verifier class (or factory function) under ``name``.

    Registering a different object under a taken name is an error unless ``overwrite=True``. A
    class without its own ``name`` attribute gets ``name`` set to the registered name.
    """

    def decorate(factory: Callable) -> Callable:
        if isinstance(factory, type) and getattr(factory, "name", None) in (None, "verifier"):
            factory.name = name  # type: ignore[attr-defined]
        return VERIFIERS.register(name, factory, overwrite=overwrite)

    return decorate


def list_verifiers() -> list[str]:
    """Sorted names of every registered verifier (built-ins and entry-point plugins, none imported)."""
    return VERIFIERS.names()


def verifier_factory(name: str) -> Callable[..., Any]:
    """The class or factory registered under ``name``; an unknown name lists the valid ones.

    A TRL-style reward function (``f(prompts, completions, **columns)``, e.g. published by an
    entry point) is wrapped as a ``trl`` verifier, so it is used by name like any other.
    """
    factory = VERIFIERS.get(name)
    if is_import_path(name) and name not in VERIFIERS.names():
        return _path_factory(name, factory)
    if is_trl_function(factory):
        from rlvr.verifiers.trl import trl_factory

        factory = VERIFIERS.register(name, trl_factory(factory), overwrite=True)
    return factory


def _path_factory(name: str, obj: Any) -> Callable[..., Any]:
    """The factory for a verifier named by import path: a verifier class, a verifier object, or a
    TRL reward function (wrapped as the ``trl`` verifier is); anything else is refused."""
    if isinstance(obj, type):
        if callable(getattr(obj, "score", None)):
            if getattr(obj, "name", None) in (None, "verifier"):
                obj.name = name  # type: ignore[attr-defined]
            return obj
        raise PluginLoadError(f"verifier {name!r}: class {obj.__qualname__} has no score(completion, reference) method, "
                              "so it is not a verifier")
    if callable(getattr(obj, "score", None)):  # a ready verifier object: every use shares it
        def ready() -> Any:
            return obj

        ready.__qualname__ = ready.__name__ = name
        return ready
    if is_trl_function(obj):
        from rlvr.verifiers.trl import trl_factory

        return trl_factory(obj)
    what = f"a function with parameters ({', '.join(_parameters(obj))})" if callable(obj) else f"a {type(obj).__name__}"
    raise PluginLoadError(f"verifier {name!r} is {what}, not a verifier: name a class with a score(completion, reference) "
                          "method, a verifier object, or a TRL reward function f(prompts, completions, **columns)")


def _parameters(func: Callable) -> list[str]:
    try:
        return list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return ["?"]


def is_trl_function(obj: Any) -> bool:
    """A plain function whose first two parameters are ``prompts`` and ``completions`` (TRL's reward
    function signature), as opposed to a verifier class or factory."""
    if isinstance(obj, type) or not callable(obj) or getattr(obj, "_rlvr_trl_factory", False):
        return False
    try:
        names = list(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return False
    return names[:2] == ["prompts", "completions"]


def verifier_options(factory: Callable) -> list[str] | None:
    """Keyword options a factory accepts, or None when it takes ``**kwargs`` (anything goes)."""
    return keyword_options(factory)


def check_verifier(name: str, options: dict | None = None) -> Callable[..., Any]:
    """The factory of ``name`` after checking that it loads and takes every option in ``options``
    (nothing is built). Errors name the verifier and list the valid names or options."""
    factory = verifier_factory(name)
    check_options(f"verifier {name!r}", factory, dict(options or {}))
    return factory


def get_verifier(name: str, **options: Any) -> Any:
    """Build the verifier registered under ``name`` with ``options`` as keyword arguments.

    An option the verifier does not take is an :class:`~rlvr.verifiers.errors.OptionError` that
    lists the ones it does; a bad option *value* (rejected by the verifier's constructor) is a
    :class:`~rlvr.verifiers.errors.UserError` naming the verifier.
    """
    verifier = build_with_options(f"verifier {name!r}", check_verifier(name, options), options)
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
