"""The one config loader: every component's config from `flywheel.toml` and `FLYWHEEL_*`
variables, by one set of rules for every section ([lake], [schedule], [webhook], [cycle]).

Each component owns a frozen dataclass beside its code and validates it in
`__post_init__`; this module only fills them. It walks nested tables
(`[cycle.train.grpo]`), refuses a key the dataclass has no field for, checks each value's
type against the field's hint (from the file or a variable alike), and builds each level
through the class, so the component's own checks judge whatever an operator wrote. It
knows no component's fields by name. Precedence: variable > flywheel.toml > the
dataclass default. A variable names a setting's path: `[schedule] cycle_cron` is
`FLYWHEEL_SCHEDULE_CYCLE_CRON`, `[cycle.train.grpo] lr` is `FLYWHEEL_CYCLE_TRAIN_GRPO_LR`;
the lake's keep their short names (`FLYWHEEL_HOME`, `FLYWHEEL_S3_ENDPOINT`, ...). Every
refusal is a ConfigError naming the setting's path or variable. TOML has no null, so a
field whose default is None can be set but not set back to None.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import json
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from storage.settings import LakeSettings

C = TypeVar("C")


class ConfigError(ValueError):
    """flywheel.toml or a FLYWHEEL_* variable holds a value that cannot be used."""


def config_path() -> Path:
    return Path(os.environ.get("FLYWHEEL_CONFIG", "flywheel.toml"))


# The file's top-level tables, each read by its component (`load_section` and
# tasks/cycle/config.py); a table of another name is a typo whose settings would be lost.
SECTIONS = ("lake", "cycle", "gateway", "webhook", "schedule", "maintenance")


def load_toml(path: Path | None = None) -> dict[str, Any]:
    """The parsed file, {} when there is none (every setting then has its default)."""
    path = path or config_path()
    if not path.exists():
        return {}
    try:
        toml = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} (FLYWHEEL_CONFIG) cannot be read as a TOML file: {exc}") from exc
    unknown = sorted(set(toml) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{path}: [{unknown[0]}] is not a section flywheel reads; known: "
                          f"{', '.join(SECTIONS)}")
    return toml


def load_section(cls: type[C], section: str, *, env_prefix: str | None = None,
                 toml: dict[str, Any] | None = None) -> C:
    """`cls` from toml[section] (default: the file flywheel.toml names) and the environment;
    variables are `env_prefix + FIELD`, by default `FLYWHEEL_<SECTION>_<FIELD>`."""
    toml = load_toml() if toml is None else toml
    return fill(cls, toml.get(section, {}), section, os.environ, env_prefix)


def lake_settings(toml: dict[str, Any] | None = None) -> LakeSettings:
    return load_section(LakeSettings, "lake", env_prefix="FLYWHEEL_", toml=toml)


def fill(cls: type[C], table: Any, path: str, env: Mapping[str, str], prefix: str | None = None,
         base: C | None = None) -> C:
    """`cls` with the keys of `table` (a parsed TOML table at `path`) and the variables
    `prefix + FIELD` in `env` set, level by level; what neither names keeps `base`'s value
    (or the class default when there is no base: a config such as the webhook's may have
    no valid instance until its secret is read)."""
    if not isinstance(table, dict):
        raise ConfigError(f"{path} must be a table ([{path}] in flywheel.toml), not {_kind(table)}")
    prefix = "FLYWHEEL_" + path.upper().replace(".", "_") + "_" if prefix is None else prefix
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    unknown = sorted(set(table) - {f.name for f in fields})
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]} is not a setting; known: {', '.join(f.name for f in fields)}")
    values = {}
    for f in fields:
        key, hint, variable = f"{path}.{f.name}", hints[f.name], prefix + f.name.upper()
        if dataclasses.is_dataclass(hint):
            current = getattr(base, f.name) if base is not None else _default(f)
            value = fill(hint, table.get(f.name, {}), key, env, variable + "_", current)
            if value is not current:
                values[f.name] = value
        elif variable in env:
            values[f.name] = check_value(parse_env_value(env[variable], hint, variable), hint, variable)
        elif f.name in table:
            values[f.name] = check_value(table[f.name], hint, key)
    if base is not None and not values:
        return base
    try:
        return cls(**values) if base is None else dataclasses.replace(base, **values)
    except (TypeError, ValueError) as exc:  # the component's own __post_init__ said no
        raise ConfigError(f"{path}: {exc}") from exc


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def parse_env_value(raw: str, hint: Any, name: str) -> Any:
    """A variable's text as the value a TOML file would hold for a field typed `hint`:
    `X | None` reads as X, a Literal as its values' type, a number, true/false (also
    1/0, yes/no), a list or table as JSON; anything else is the text itself."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        hint = next(arm for arm in typing.get_args(hint) if arm is not type(None))
        origin = typing.get_origin(hint)
    if origin is Literal:
        hint = type(typing.get_args(hint)[0])
    if hint is bool:
        if raw.lower() not in {"1", "0", "true", "false", "yes", "no"}:
            raise ConfigError(f"{name} = {raw!r}: expected true or false")
        return raw.lower() in {"1", "true", "yes"}
    if hint in (int, float):
        try:
            return hint(raw)
        except ValueError:
            raise ConfigError(f"{name} = {raw!r}: expected {_name(hint)}") from None
    if origin in (dict, list, tuple, collections.abc.Mapping):
        try:
            return json.loads(raw)  # check_value turns a list into the field's tuple
        except json.JSONDecodeError:
            raise ConfigError(f"{name} = {raw!r}: expected JSON") from None
    return raw


def check_value(value: Any, hint: Any, key: str) -> Any:
    """`value` if a TOML value of that type can fill a field typed `hint` (lists become
    tuples, integers floats); otherwise a ConfigError saying what was expected."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        # `type(...) in`: True == 1, but `true` is not a ZeRO stage
        if value in args and type(value) in {type(a) for a in args}:
            return value
        raise ConfigError(f"{key} = {value!r}: expected one of {', '.join(map(repr, args))}")
    if origin in (typing.Union, types.UnionType):
        arms = [a for a in args if a is not type(None)]
        for arm in arms:
            try:
                return check_value(value, arm, key)
            except ConfigError:
                pass
        raise ConfigError(f"{key} = {value!r}: expected {' or '.join(_name(a) for a in arms)}")
    if hint is float and type(value) is int:
        return float(value)  # `lr = 1` is as good as `lr = 1.0`
    if hint is Path and type(value) is str:
        if not value.strip():  # Path("") is ".": an empty FLYWHEEL_HOME would put the lake wherever one stands
            raise ConfigError(f"{key} is empty: name a folder (or leave the setting out for its default)")
        return Path(value)
    if hint in (int, float, str, bool):
        if type(value) is hint:
            return value
        raise ConfigError(f"{key} = {value!r}: expected {_name(hint)}, not {_kind(value)}")
    if origin in (dict, collections.abc.Mapping) and isinstance(value, dict):
        return {k: check_value(v, args[1], f"{key}.{k}") for k, v in value.items()}
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis and isinstance(value, list):
        return tuple(check_value(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
    raise ConfigError(f"{key} = {value!r}: expected {_name(hint)}, not {_kind(value)}")


def _name(hint: Any) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", Path: "a path"}
    if hint in names:
        return names[hint]
    origin = typing.get_origin(hint)
    if origin in (dict, collections.abc.Mapping):
        return "a table"
    return "a list" if origin is tuple else str(hint)


def _kind(value: Any) -> str:
    kinds = {bool: "true/false", int: "an integer", float: "a decimal number", str: "a string", list: "a list",
             dict: "a table"}
    return kinds.get(type(value), type(value).__name__)
