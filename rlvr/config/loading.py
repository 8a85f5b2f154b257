"""Loading a config: a YAML file, ``key=value`` overrides on top, validation with errors that name the
key and the valid choices, and writing the resolved config back out."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Sequence, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from rlvr.config.sections import FieldError
from rlvr.verifiers.errors import UserError


C = TypeVar("C", bound=BaseModel)


class ConfigError(UserError, ValueError):
    """A config that cannot be used; the message names the key(s) and the valid choices."""


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``["train.lr=1e-4", "model.lora.r=8"]`` -> a nested dict. Values are parsed as YAML."""
    nested: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"override {pair!r} is not of the form key=value (e.g. train.steps=100)")
        key, raw = pair.split("=", 1)
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {pair!r} has an empty key")
        value = yaml.safe_load(raw) if raw.strip() else ""
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {pair!r} sets inside {part!r}, which is not a section")
        node[parts[-1]] = value
    return nested


def deep_merge(base: dict, update: dict) -> dict:
    """``update`` on top of ``base``, recursing into dicts (lists and scalars are replaced)."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        current = out.get(key)
        indexed = isinstance(value, dict) and bool(value) and all(str(k).isdigit() for k in value)
        if isinstance(value, dict) and isinstance(current, dict) and not indexed:
            out[key] = deep_merge(current, value)
        elif indexed:
            # "data.0.task=gsm8k": index into a list (the file's, or a fresh one); a single mapping
            # where a list is allowed (SFT's data) counts as a list of one
            items = list(current) if isinstance(current, list) else [current] if isinstance(current, dict) else []
            for index in sorted(value, key=int):
                i = int(index)
                if i > len(items):
                    raise ConfigError(f"{key}.{i}: list index out of range (the list has {len(items)} items)")
                if i == len(items):
                    items.append({})
                items[i] = deep_merge(items[i], value[index]) if isinstance(value[index], dict) else value[index]
            out[key] = items
        else:
            out[key] = copy.deepcopy(value)
    return out


def _format_errors(cls: type[BaseModel], exc: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        key = ".".join(loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            valid = _valid_keys(cls, loc[:-1])
            lines.append(f"  {key}: unknown key; valid keys here: {', '.join(valid)}")
        elif not loc:  # a cross-field check: its message names the keys itself
            lines.append(f"  {err['msg'].removeprefix('Value error, ')}")
        elif err["type"] == "value_error":  # a registry or plugin check: the message says what is valid
            error = err.get("ctx", {}).get("error")
            if isinstance(error, FieldError):
                key = f"{key}.{error.field}"
            lines.append(f"  {key}: {err['msg'].removeprefix('Value error, ')}")
        else:
            got = err.get("input")
            got_text = f" (got {got!r})" if not isinstance(got, dict) else ""
            lines.append(f"  {key}: {err['msg']}{got_text}")
    if len(lines) == 2:  # one mistake: one line
        return f"{lines[0]} {lines[1].strip()}"
    return "\n".join(lines)


def _valid_keys(cls: type[BaseModel], loc: list[str]) -> list[str]:
    model: Any = cls
    for part in loc:
        if part.isdigit():
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        annotation = field.annotation
        for candidate in (annotation, *getattr(annotation, "__args__", ())):
            for inner in (candidate, *getattr(candidate, "__args__", ())):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    model = inner
                    break
    return sorted(getattr(model, "model_fields", {}))


def build_config(cls: type[C], raw: dict | None, overrides: Sequence[str] = (), source: str = "config") -> C:
    """Validate ``raw`` (from YAML) with ``overrides`` applied on top. A config class with a ``fill_defaults``
    classmethod (the RL config's presets) gets the merged dict first."""
    merged = deep_merge(raw or {}, parse_overrides(overrides))
    fill = getattr(cls, "fill_defaults", None)
    if fill is not None:
        merged = fill(merged)
    try:
        return cls.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_format_errors(cls, exc, source)) from None


def load_config(cls: type[C], path: str | Path | None, overrides: Sequence[str] = ()) -> C:
    """Read a YAML config file (or none: all defaults) and apply ``key=value`` overrides."""
    raw: dict = {}
    source = "overrides"
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        source = str(path)
    return build_config(cls, raw, overrides, source)


def save_config(config: BaseModel, path: str | Path) -> None:
    """Write the resolved config, every default spelled out, as YAML."""
    Path(path).write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
