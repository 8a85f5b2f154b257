"""One small registry for every extension point: verifiers, task suites, engines, advantage
estimators, policy losses, loss aggregations and KL estimators.

A name comes from one of three places, and all three behave the same once looked up:

* **in-process registration**, the decorator ``@REGISTRY.register("name")`` next to the code;
* **a lazy built-in**, ``REGISTRY.lazy("vllm", "rlvr.engines.vllm:VLLMEngine", install="pip install
  'rlvr[vllm]'")``: imported on first use, so an optional package that is missing costs nothing
  until it is asked for, and then fails with the install hint instead of an import traceback;
* **an entry point** of an installed package, in the registry's group (``rlvr.verifiers``,
  ``rlvr.tasks``, ``rlvr.engines``, ``rlvr.advantage_estimators``, ``rlvr.policy_losses``,
  ``rlvr.loss_aggregations``, ``rlvr.kl_estimators``)::

      # a plugin's pyproject.toml
      [project.entry-points."rlvr.advantage_estimators"]
      my_baseline = "my_package.advantages:my_baseline"

  Entry points are listed on first use and imported only when their name is asked for. A name
  registered in-process wins over an entry point of the same name.

A registry made with ``import_paths=True`` (verifiers) also takes an **import path** as a name,
``"my_package.module:Attribute"``, without any registration: it is imported on first use, like a
lazy entry. A module in the current directory is found as ``python -m`` would find it. Such names
are never listed; the errors say whether the module is missing, fails to import, or lacks the
attribute.

Listing never imports anything (``names()``); ``status(name)`` imports one entry and says whether
it loads. Unknown names raise :class:`UnknownNameError` listing the valid ones; a plugin that fails
to import raises :class:`PluginLoadError` naming its target and the reason. Config fields are
validated with :meth:`Registry.check`, so a plugin's name is as valid as a built-in one.

This module is standard library only: the verifier and task registries use it in processes that
never import torch.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
import threading
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable, Generic, Iterable, TypeVar

from rlvr.verifiers.errors import OptionError, PluginLoadError, UnknownNameError, UserError

T = TypeVar("T")

_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def is_import_path(name: object) -> bool:
    """True for ``"package.module:Attribute"`` (dotted module, colon, dotted attribute)."""
    return isinstance(name, str) and bool(_IMPORT_PATH.match(name))


@dataclass(frozen=True)
class _Lazy:
    target: str  # "module:attr"
    install: str | None  # how to get the missing package, for built-ins with optional dependencies
    source: str  # "built-in" or "entry point of <distribution>"


class Registry(Generic[T]):
    """Names -> objects (classes, factories or functions) of one kind.

    Args:
        kind: what one entry is, for messages ("verifier", "advantage estimator").
        entry_point_group: the ``importlib.metadata`` group third-party packages declare entries in.

    Example::

        LOSSES = Registry("policy loss", entry_point_group="rlvr.policy_losses")

        @LOSSES.register("ppo_clip")
        def ppo_clip(logp, old_logp, advantages, **hparams): ...

        assert LOSSES.get("ppo_clip") is ppo_clip
        try:
            LOSSES.check("ppo_clp")
        except UnknownNameError as exc:
            print(exc)               # unknown policy loss 'ppo_clp'; valid policy losses: ppo_clip
    """

    def __init__(self, kind: str, *, entry_point_group: str | None = None, plural: str | None = None,
                 import_paths: bool = False):
        self.kind = kind
        self.import_paths = import_paths  # "package.module:Attribute" names are valid too
        self.plural = plural or _plural(kind)
        self.entry_point_group = entry_point_group
        self._loaded: dict[str, T] = {}
        self._lazy: dict[str, _Lazy] = {}
        self._failed: dict[str, PluginLoadError] = {}
        self._scanned = entry_point_group is None
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ filling
    def register(self, name: str, obj: T | None = None, *, overwrite: bool = False) -> Any:
        """Register ``obj`` under ``name``; without ``obj``, a decorator. A different object under a
        taken name is an error unless ``overwrite=True`` (the same one again, e.g. after a module
        reload, is fine)."""

        def decorate(item: T) -> T:
            with self._lock:
                existing = self._loaded.get(name)
                if existing is not None and not overwrite and _origin(existing) != _origin(item):
                    raise ValueError(f"{self.kind} {name!r} is already registered by {existing!r}; pass overwrite=True")
                self._loaded[name] = item
                self._failed.pop(name, None)
            return item

        return decorate if obj is None else decorate(obj)

    def lazy(self, name: str, target: str, *, install: str | None = None) -> None:
        """Register ``"module:attr"`` under ``name``, imported on first use. ``install`` says how to
        get the package it needs (printed when the import fails)."""
        if ":" not in target:
            raise ValueError(f"lazy target {target!r} must look like 'package.module:attribute'")
        with self._lock:
            self._lazy[name] = _Lazy(target, install, "built-in")

    def copy(self) -> "Registry[T]":
        """An independent copy (tests swap a registry for a copy and register freely in it)."""
        new = Registry(self.kind, entry_point_group=self.entry_point_group, plural=self.plural,
                       import_paths=self.import_paths)
        with self._lock:
            new._loaded, new._lazy, new._failed = dict(self._loaded), dict(self._lazy), dict(self._failed)
            new._scanned = self._scanned
        return new

    def unregister(self, name: str) -> None:
        """Forget ``name`` (tests, and plugins that replace a built-in under a new name)."""
        with self._lock:
            self._loaded.pop(name, None)
            self._lazy.pop(name, None)
            self._failed.pop(name, None)

    def _scan(self) -> None:
        if self._scanned:
            return
        with self._lock:
            if self._scanned:
                return
            self._scanned = True
            for ep in metadata.entry_points(group=self.entry_point_group):
                if ep.name in self._loaded or ep.name in self._lazy:
                    continue
                dist = getattr(ep, "dist", None)
                source = f"entry point of {dist.name} {dist.version}" if dist is not None else "entry point"
                self._lazy[ep.name] = _Lazy(ep.value, None, source)

    def rescan(self) -> None:
        """Read the entry points again (after installing a plugin into a running interpreter)."""
        with self._lock:
            self._scanned = self.entry_point_group is None
            self._lazy = {n: e for n, e in self._lazy.items() if e.source == "built-in"}
            self._failed.clear()

    # ------------------------------------------------------------------ looking up
    def names(self) -> list[str]:
        """Every known name, sorted, without importing anything."""
        self._scan()
        with self._lock:
            return sorted(set(self._loaded) | set(self._lazy))

    def __contains__(self, name: object) -> bool:
        """A known name, or (``import_paths``) a well-formed import path (checked, not imported)."""
        return isinstance(name, str) and (name in self.names() or (self.import_paths and is_import_path(name)))

    def check(self, name: str) -> str:
        """``name`` if it is known (nothing is imported), else :class:`UnknownNameError`."""
        if name not in self:
            raise self.unknown(name)
        return name

    def unknown(self, name: Any) -> UnknownNameError:
        known = self.names()
        paths = "; or an import path, 'package.module:Attribute'" if self.import_paths else ""
        return UnknownNameError(f"unknown {self.kind} {name!r}; valid {self.plural}: {', '.join(known) or '(none)'}{paths}")

    def get(self, name: str) -> T:
        """The object registered under ``name``, importing a lazy entry on first use."""
        self._scan()
        with self._lock:
            if name in self._loaded:
                return self._loaded[name]
            if name in self._failed:
                raise self._failed[name]
            entry = self._lazy.get(name)
        if entry is None and self.import_paths and is_import_path(name):
            obj = import_path(name, self.kind)  # not remembered under the name: a path is never listed
            with self._lock:
                return self._loaded.get(name, obj)
        if entry is None:
            raise self.unknown(name)
        try:
            obj = import_target(entry.target)
        except Exception as exc:
            error = self._load_error(name, entry, exc)
            with self._lock:
                self._failed[name] = error
            raise error from exc
        with self._lock:
            return self._loaded.setdefault(name, obj)

    def _load_error(self, name: str, entry: _Lazy, exc: Exception) -> PluginLoadError:
        reason = f"{type(exc).__name__}: {exc}"
        if entry.install and isinstance(exc, ImportError):
            return PluginLoadError(f"{self.kind} {name!r} needs a package that is not installed ({reason}); "
                                   f"install it with: {entry.install}")
        return PluginLoadError(f"{self.kind} {name!r} ({entry.target}, {entry.source}) failed to load: {reason}")

    __getitem__ = get

    def status(self, name: str) -> tuple[bool, str]:
        """``(True, "")`` when ``name`` loads, else ``(False, the full reason)``."""
        try:
            self.get(name)
        except PluginLoadError as exc:
            return False, str(exc)
        return True, ""

    def source(self, name: str) -> str:
        """Where ``name`` comes from: "registered", "built-in (lazy)" or the entry point's package."""
        self._scan()
        entry = self._lazy.get(name)
        if entry is None:
            return "registered"
        return entry.source

    def items(self) -> Iterable[tuple[str, T]]:
        """``(name, object)`` for every name that loads (broken plugins are skipped)."""
        for name in self.names():
            ok, _ = self.status(name)
            if ok:
                yield name, self.get(name)


def _plural(noun: str) -> str:
    if noun.endswith("y"):
        return noun[:-1] + "ies"
    return noun + ("es" if noun.endswith(("s", "x", "ch", "sh")) else "s")


def import_path(name: str, kind: str = "plugin") -> Any:
    """The object at ``"package.module:Attribute"``; a :class:`PluginLoadError` that says which part
    failed (no such module, the module raised on import, no such attribute) names ``kind``."""
    module_name, _, attr = name.partition(":")
    try:
        obj: Any = _import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise PluginLoadError(f"{kind} {name!r}: no module named {exc.name!r} (looked in the current directory "
                                  "and on sys.path)") from exc
        raise PluginLoadError(f"{kind} {name!r}: importing {module_name} failed: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        raise PluginLoadError(f"{kind} {name!r}: importing {module_name} failed: {type(exc).__name__}: {exc}") from exc
    where = module_name
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in vars(obj) if not n.startswith("_")) if hasattr(obj, "__dict__") else []
            listed = f"; it has: {', '.join(public[:12])}{', ...' if len(public) > 12 else ''}" if public else ""
            raise PluginLoadError(f"{kind} {name!r}: {where} has no attribute {part!r}{listed}")
        obj, where = getattr(obj, part), f"{where}.{part}"
    return obj


def _import_module(module_name: str) -> Any:
    """``importlib.import_module``, retried with the current directory on ``sys.path`` (a console
    script's path does not hold it, ``python -m`` does) when the module is not found."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top = module_name.split(".")[0]
        cwd = os.getcwd()
        here = os.path.exists(os.path.join(cwd, top)) or os.path.exists(os.path.join(cwd, top + ".py"))
        if exc.name != top or not here or cwd in sys.path or "" in sys.path:
            raise
        sys.path.append(cwd)
        importlib.invalidate_caches()
        return importlib.import_module(module_name)


def import_target(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _origin(obj: Any) -> tuple:
    return (getattr(obj, "__module__", None), getattr(obj, "__qualname__", repr(obj)))


# ---------------------------------------------------------------------------------------------
# Options: the keyword arguments a factory takes
# ---------------------------------------------------------------------------------------------


def keyword_options(factory: Callable, exclude: tuple[str, ...] = ("self",)) -> list[str] | None:
    """Names ``factory`` accepts as keyword arguments (minus ``exclude``); None when it takes
    ``**kwargs`` (anything goes)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in exclude]


def build_with_options(what: str, factory: Callable, options: dict) -> Any:
    """``factory(**options)``, with a constructor's refusal reported as one :class:`OptionError` naming
    ``what`` (``"verifier 'math'"``, ``"environment 'tools'"``): any exception, since a plugin raises
    what it likes; a :class:`UserError` it raises is already one line and passes through unchanged."""
    try:
        return factory(**options)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001  (a plugin's constructor may raise anything)
        raise OptionError(f"{what} rejected its options {sorted(options)}: {type(exc).__name__}: "
                          f"{str(exc)[:300]}") from exc


def check_options(what: str, factory: Callable, options: dict, exclude: tuple[str, ...] = ("self",)) -> None:
    """:class:`OptionError` naming the options of ``options`` that ``factory`` does not take, and
    the ones it does. ``what`` names the plugin in the message (``"verifier 'math'"``)."""
    valid = keyword_options(factory, exclude)
    if valid is None:
        return
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise OptionError(f"{what}: unknown option(s) {', '.join(unknown)}; valid options: {', '.join(valid) or '(none)'}")
