"""The cycle's configuration: every stage's frozen dataclass, filled from the `[cycle]`
section of flywheel.toml and `FLYWHEEL_CYCLE_*` variables.

Each stage owns its config class and validates it in `__post_init__`; this module only
walks the nested tables (`[cycle.train.grpo]`), checks every key and value type against
the dataclass's fields, and rebuilds each level with `dataclasses.replace`, so the
stage's own checks run on whatever an operator wrote. It knows no stage's fields by
name. A variable names a setting's path: `cycle.train.grpo.lr` is
`FLYWHEEL_CYCLE_TRAIN_GRPO_LR`, and wins over the file, as for every other section.
TOML has no null, so a field whose default is None (e.g. `evaluate.scheduler_address`)
can be set but not set back to None.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from storage.config_file import ConfigError, load_toml, parse_env_value
from tasks.curate.curation import CurateConfig
from tasks.release.evaluate import EvalConfig
from tasks.release.gate import GateConfig
from tasks.ingest.batch import IngestConfig
from tasks.round.rollout import RolloutConfig
from tasks.round.train import TrainStageConfig
from tasks.round.verify import VerifyStageConfig

D = typing.TypeVar("D")


@dataclass(frozen=True)
class CycleConfig:
    """Every stage's config; flow parameters override the few a run usually changes."""

    ingest: IngestConfig = field(default_factory=IngestConfig)
    curate: CurateConfig = field(default_factory=CurateConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    verify: VerifyStageConfig = field(default_factory=VerifyStageConfig)
    train: TrainStageConfig = field(default_factory=TrainStageConfig)
    evaluate: EvalConfig = field(default_factory=EvalConfig)
    gate: GateConfig = field(default_factory=GateConfig)


def cycle_config() -> CycleConfig:
    """The cycle's config as flywheel.toml and the environment say now.

    Stage tasks call this when they start instead of reading a constant fixed at import:
    a worker started before flywheel.toml changed runs the new values, and a resumed
    cycle runs its remaining stages with the config in force then, which is what a
    rerun in a fresh process (the usual case) would do anyway, so reading once per flow
    run would promise no more. It costs one small TOML parse per stage, against stages
    that take seconds to hours. Every read validates the whole section, so a bad value
    fails the cycle's first task, before any stage has done work.
    """
    return cycle_config_from(load_toml().get("cycle", {}), env=os.environ)


def cycle_config_from(section: Any, env: Mapping[str, str] | None = None) -> CycleConfig:
    """CycleConfig from a parsed `[cycle]` table (and FLYWHEEL_CYCLE_* variables in env);
    anything unusable raises ConfigError naming the setting's path."""
    return fill(CycleConfig(), section, "cycle", env or {})


def fill(default: D, table: Any, path: str, env: Mapping[str, str]) -> D:
    """`default` with the keys of `table` (and matching variables) set, level by level."""
    if not isinstance(table, dict):
        raise ConfigError(f"{path} must be a table ([{path}] in flywheel.toml), not {_kind(table)}")
    hints = typing.get_type_hints(type(default))
    names = [f.name for f in dataclasses.fields(default)]
    unknown = sorted(set(table) - set(names))
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]} is not a setting; known: {', '.join(names)}")
    changes = {}
    for name in names:
        key, hint, current = f"{path}.{name}", hints[name], getattr(default, name)
        variable = "FLYWHEEL_" + key.upper().replace(".", "_")
        if dataclasses.is_dataclass(hint):
            value = fill(current, table.get(name, {}), key, env)
        elif variable in env:
            value = check_value(parse_env_value(env[variable], hint, variable), hint, variable)
        elif name in table:
            value = check_value(table[name], hint, key)
        else:
            continue
        if value is not current:
            changes[name] = value
    if not changes:
        return default
    try:
        return dataclasses.replace(default, **changes)
    except (TypeError, ValueError) as exc:  # the stage's own __post_init__ said no
        raise ConfigError(f"{path}: {exc}") from exc


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
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
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
