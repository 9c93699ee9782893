"""Fill every component's config from `flywheel.toml` and `FLYWHEEL_*` variables.

Each component owns a frozen dataclass beside its code; this module only fills
them. Precedence: environment > flywheel.toml > the dataclass default. The lake's
variables keep their short names (`FLYWHEEL_HOME`, `FLYWHEEL_S3_ENDPOINT`, ...);
other sections read `FLYWHEEL_<SECTION>_<FIELD>`, e.g. `FLYWHEEL_INGEST_CHUNK_LINES`.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import json
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from storage.settings import LakeSettings

C = TypeVar("C")


class ConfigError(ValueError):
    """flywheel.toml or a FLYWHEEL_* variable holds a value that cannot be used."""


def config_path() -> Path:
    return Path(os.environ.get("FLYWHEEL_CONFIG", "flywheel.toml"))


def load_toml(path: Path | None = None) -> dict[str, Any]:
    path = path or config_path()
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc


def load_section(cls: type[C], section: str, *, env_prefix: str | None = None,
                 toml: dict[str, Any] | None = None) -> C:
    """Instantiate `cls` from toml[section] overridden by environment variables."""
    toml = load_toml() if toml is None else toml
    values = dict(toml.get(section, {}))
    unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ConfigError(f"flywheel.toml [{section}]: unknown keys {sorted(unknown)}")
    prefix = env_prefix if env_prefix is not None else f"FLYWHEEL_{section.upper()}_"
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        raw = os.environ.get(prefix + field.name.upper())
        if raw is not None:
            values[field.name] = _parse_env(raw, hints[field.name], prefix + field.name.upper())
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[{section}] configuration is invalid: {exc}") from exc


def lake_settings(toml: dict[str, Any] | None = None) -> LakeSettings:
    return load_section(LakeSettings, "lake", env_prefix="FLYWHEEL_", toml=toml)


def parse_env_value(raw: str, hint: Any, name: str) -> Any:
    """A variable's value for a field typed `hint`, also for the hints nested configs use
    (tasks/cycle/config.py): `X | None` reads as X, a Literal as its values' type, a
    Mapping as a dict (JSON)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        hint = next(arm for arm in typing.get_args(hint) if arm is not type(None))
    elif origin is typing.Literal:
        hint = type(typing.get_args(hint)[0])
    elif origin is collections.abc.Mapping:
        hint = dict
    return _parse_env(raw, hint, name)


def _parse_env(raw: str, hint: Any, name: str) -> Any:
    origin = typing.get_origin(hint) or hint
    if hint is bool:
        if raw.lower() not in {"1", "0", "true", "false", "yes", "no"}:
            raise ConfigError(f"{name}={raw!r}: expected true or false")
        return raw.lower() in {"1", "true", "yes"}
    if hint in (int, float):
        try:
            return hint(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r}: expected a number") from None
    if origin in (dict, list, tuple):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            raise ConfigError(f"{name}: expected JSON, got {raw!r}") from None
        return tuple(value) if origin is tuple else value
    return raw
