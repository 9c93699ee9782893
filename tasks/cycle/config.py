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


def cycle_config(overrides: Mapping[str, Any] | None = None) -> CycleConfig:
    """The cycle's config as flywheel.toml and the environment say now.

    Stage tasks call this when they start instead of reading a constant fixed at import:
    a worker started before flywheel.toml changed runs the new values, and a resumed
    cycle runs its remaining stages with the config in force then, which is what a
    rerun in a fresh process (the usual case) would do anyway, so reading once per flow
    run would promise no more. It costs one small TOML parse per stage, against stages
    that take seconds to hours. Every read validates the whole section, so a bad value
    fails the cycle's first task, before any stage has done work. Every entry point
    (the cycle, the ingest flow, the CLI commands, the webhook's runs, the demo) reads
    its stage's config here; `overrides` are a run's own parameters (`with_overrides`).
    """
    return with_overrides(cycle_config_from(load_toml().get("cycle", {}), env=os.environ), overrides or {})


def with_overrides(config: D, overrides: Mapping[str, Any]) -> D:
    """`config` with a run's overrides set, each named by its path below [cycle]
    (`{"rollout.tasks_per_round": 8}`); a run's parameters win over the file, but only
    those the run gives. Each level is rebuilt with `dataclasses.replace`, so the
    stage's own checks judge the value."""
    for path, value in overrides.items():
        follower = _FOLLOWERS.get(path)
        if follower is not None:  # set first, so the pair is never out of bounds
            current = _get_path(config, follower.split("."))
            config = _set_path(config, follower.split("."), min(current, value), follower)
        config = _set_path(config, path.split("."), value, path)
    return config


# A setting bounded by another follows it down when a run overrides that one: pass@k
# needs k <= G, so a run sampling 2 answers per evaluation item reports pass@2.
_FOLLOWERS = {"evaluate.engine.n": "evaluate.k"}


def _get_path(node: Any, names: list[str]) -> Any:
    for name in names:
        node = getattr(node, name)
    return node


def _set_path(node: Any, names: list[str], value: Any, path: str) -> Any:
    if not dataclasses.is_dataclass(node) or names[0] not in {f.name for f in dataclasses.fields(node)}:
        raise ConfigError(f"cycle.{path} is not a setting")
    inner = value if len(names) == 1 else _set_path(getattr(node, names[0]), names[1:], value, path)
    try:
        return dataclasses.replace(node, **{names[0]: inner})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"cycle.{path} = {value!r}: {exc}") from exc


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
