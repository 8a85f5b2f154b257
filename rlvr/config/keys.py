"""Every key of a config class, as a user writes it: the dotted path (``train.steps``, ``data.N.task``),
its type, its default and its description (the pydantic field's).

``rlvr config show`` prints them; :mod:`rlvr.config.loading` looks an unknown key up among them
("did you mean optim.lr?"). Defaults are the effective ones: a section's own default instance wins
over its class (SFT's ``optim.lr`` is 1e-05, not OptimConfig's 1e-06), and a config class's
``fill_defaults`` (the RL presets) wins over both.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any, Iterator

import annotated_types
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

#: How a list of sections is indexed in a dotted key (``data.N.task``; an override spells ``data.0.task``).
INDEX = "N"


@dataclass(frozen=True)
class ConfigKey:
    """One key of a config: ``path`` dotted, ``section`` when it holds keys of its own (no value to print)."""

    path: str
    type: str
    default: Any
    description: str
    section: bool = False
    preset: bool = False  # the default comes from fill_defaults (the RL preset), not the field

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]


def config_keys(cls: type[BaseModel]) -> list[ConfigKey]:
    """Every key of ``cls`` in declaration order, sections before their keys."""
    fill = getattr(cls, "fill_defaults", None)
    filled = fill({}) if fill is not None else {}
    return list(_walk(cls, "", _defaults_of(cls), filled))


def nested_model(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The section class inside ``annotation`` (``X``, ``Optional[X]``, ``list[X]``) and whether it is a
    list of them; ``(None, False)`` for a plain value."""
    for candidate in (annotation, *typing.get_args(annotation)):
        is_list = typing.get_origin(candidate) is list
        for inner in (candidate, *typing.get_args(candidate)):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                return inner, is_list or typing.get_origin(annotation) is list
    return None, False


def _defaults_of(cls: type[BaseModel]) -> dict[str, Any]:
    """Field defaults of ``cls`` (a required field has none: ``PydanticUndefined``)."""
    out = {}
    for name, field in cls.model_fields.items():
        out[name] = field.default_factory() if field.default_factory is not None else field.default
    return out


def _walk(cls: type[BaseModel], prefix: str, defaults: dict[str, Any], filled: dict[str, Any]) -> Iterator[ConfigKey]:
    for name, field in cls.model_fields.items():
        path = f"{prefix}{name}"
        default = defaults.get(name, PydanticUndefined)
        model, is_list = nested_model(field.annotation)
        description = field.description or ""
        if model is not None:
            if not description and model.__doc__ and model.__module__.startswith("rlvr."):
                description = " ".join(model.__doc__.strip().split("\n\n")[0].split())
            shown = [] if is_list and isinstance(default, list) else default
            yield ConfigKey(path, _type_name(field.annotation, field.metadata), _plain(shown), description, section=True)
            if is_list:
                inner = _defaults_of(model)
                yield from _walk(model, f"{path}.{INDEX}.", inner, {})
            else:
                inner = _plain(default) if isinstance(default, BaseModel) else _defaults_of(model)
                sub = filled.get(name) if isinstance(filled.get(name), dict) else {}
                yield from _walk(model, f"{path}.", {**_defaults_of(model), **inner}, sub)
            continue
        preset = name in filled
        value = filled[name] if preset else default
        yield ConfigKey(path, _type_name(field.annotation, field.metadata), _plain(value), description, preset=preset)


def _plain(value: Any) -> Any:
    """A default as YAML would hold it (a section as its mapping, a tuple as a list)."""
    if isinstance(value, BaseModel):
        return {k: getattr(value, k) for k in type(value).model_fields}
    if isinstance(value, tuple):
        return list(value)
    return value


def _type_name(annotation: Any, metadata: list | None = None) -> str:
    """``int >= 1``, ``float | null``, ``grpo | dapo | ...``, ``list of str``, ``mapping``."""
    text = _annotation_text(annotation)
    bounds = []
    for item in metadata or []:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(item, attr, None)
            if value is not None and isinstance(item, (annotated_types.BaseMetadata, annotated_types.Interval)):
                bounds.append(f"{sign} {value}")
    if not bounds:
        return text
    return f"{text}{', ' if '|' in text else ' '}{', '.join(bounds)}"  # int >= 1; int | null, >= 1


def _annotation_text(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_annotation_text(a) for a in args)
    if origin is typing.Annotated:
        base, *extra = args
        if base is int and any(getattr(e, "gt", None) == 0 for e in extra):
            return "int > 0"
        return _annotation_text(base)
    if origin is list:
        return f"list of {_annotation_text(args[0])}" if args else "list"
    if origin is tuple:
        return "[" + ", ".join(_annotation_text(a) for a in args) + "]"
    if origin is dict or annotation is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))
