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


def _format_errors(cls: type[BaseModel], exc: ValidationError, source: str, overrides: Sequence[str] = ()) -> str:
    """One line per mistake, each blamed on where it was written: the ``key=value`` override that set
    the key, else ``source`` (the YAML file)."""
    lines: list[tuple[str, str]] = []  # (where, text)
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        key = ".".join(loc) or "(top level)"
        where = _override_of(loc, overrides) or source
        if err["type"] == "extra_forbidden":
            valid = _valid_keys(cls, loc[:-1])
            lines.append((where, f"{key}: unknown key; valid keys here: {', '.join(valid)}"
                                 f"{_did_you_mean(cls, loc, valid)}"))
        elif not loc:  # a cross-field check: its message names the keys itself
            lines.append((source, err["msg"].removeprefix("Value error, ")))
        elif err["type"] == "value_error":  # a registry or plugin check: the message says what is valid
            error = err.get("ctx", {}).get("error")
            if isinstance(error, FieldError):  # blamed on the field's own source, not the section's
                key = f"{key}.{error.field}"
                where = _override_of([*loc, error.field], overrides) or source
            lines.append((where, f"{key}: {err['msg'].removeprefix('Value error, ')}"))
        else:
            got = err.get("input")
            got_text = f" (got {got!r})" if not isinstance(got, dict) else ""
            lines.append((where, f"{key}: {err['msg']}{got_text}"))
    sources = {where for where, _ in lines}
    if len(lines) == 1:  # one mistake: one line
        return f"invalid config ({lines[0][0]}): {lines[0][1]}"
    if len(sources) == 1:
        return "\n".join([f"invalid config ({sources.pop()}):", *(f"  {text}" for _, text in lines)])
    return "\n".join(["invalid config:", *(f"  in {where}: {text}" for where, text in lines)])


def _override_of(loc: list[str], overrides: Sequence[str]) -> str | None:
    """``override KEY=VALUE`` for the last override that set ``loc`` or a section above it; None when the
    key came from the file (or a default)."""
    dotted = ".".join(loc)
    for pair in reversed(list(overrides)):
        key = pair.split("=", 1)[0]
        if dotted == key or dotted.startswith(key + ".") or key.startswith(dotted + "."):
            return f"override {pair}"
    return None


def _did_you_mean(cls: type[BaseModel], loc: list[str], valid: list[str]) -> str:
    """``. Did you mean X?`` for an unknown key: the closest keys of its section (difflib), else a key of
    that name in another section (``train.lr``: optim.lr); empty when nothing is close. Keys are spelled
    whole, as an override writes them."""
    import difflib

    name, parent = loc[-1], "".join(f"{part}." for part in loc[:-1])
    close = [parent + match for match in difflib.get_close_matches(name, valid, n=2, cutoff=0.6)]
    if not close:
        from rlvr.config.keys import config_keys

        close = [k.path.replace(".N.", ".0.") for k in config_keys(cls) if k.name == name][:2]
    return f". Did you mean {' or '.join(close)}?" if close else ""


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
        raise ConfigError(_format_errors(cls, exc, source, overrides)) from None


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
