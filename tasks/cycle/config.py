"""The cycle's configuration: every stage's frozen dataclass, filled from the `[cycle]`
section of flywheel.toml and `FLYWHEEL_CYCLE_*` variables, and a run's overrides.

Each stage owns its config class and validates it in `__post_init__`. Reading the file
and the variables is storage/config_file.py's `fill`, the loader every section goes
through ([lake], [schedule], [webhook] too), so one set of rules holds everywhere: a
variable names a setting's path (`cycle.train.grpo.lr` is `FLYWHEEL_CYCLE_TRAIN_GRPO_LR`)
and wins over the file; an unknown key or a bad value is a ConfigError naming the path.
This module adds what only the cycle has: one field per stage, and a run's parameters
set by path (`with_overrides`).
"""
from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from storage.config_file import ConfigError, fill, load_toml
from tasks.curate.curation import CurateConfig
from tasks.release.evaluate import EvalConfig
from tasks.release.gate import GateConfig
from tasks.ingest.batch import IngestConfig
from tasks.round.rollout import RolloutConfig
from tasks.round.train import TrainStageConfig
from tasks.round.verify import VerifyStageConfig
from verifiers.registry import DEFAULT_DOMAIN_MAP, VerifierConfig

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
    domains: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_DOMAIN_MAP))
    """domain -> verifier, for every stage: ingest's known domains, curation's self-test,
    verification and evaluation all read this one map (`one_domain_map`)."""

    def __post_init__(self) -> None:
        try:
            VerifierConfig(domain_map=self.domains)  # names only known verifiers
        except ValueError as exc:
            raise ValueError(f"domains: {exc}") from None
        object.__setattr__(self, "domains", dict(self.domains))
        # The trainer recomputes the rollouts' logprobs at their sampling temperature: any
        # other value makes every importance ratio wrong from the first token.
        sampled, trained = self.rollout.engine.temperature, self.train.grpo.temperature
        if sampled != trained:
            raise ConfigError(f"cycle.train.grpo.temperature ({trained}) must equal "
                              f"cycle.rollout.engine.temperature ({sampled}), the temperature the rollouts "
                              "were sampled at; set both")
        # Rounds sampled by an older policy are corrected only by the importance weight.
        if self.rollout.max_staleness and self.train.grpo.tis_cap is None:
            raise ConfigError("cycle.rollout.max_staleness > 0 samples rounds with an older policy, which only "
                              "cycle.train.grpo.tis_cap corrects: set tis_cap (default 2.0) or max_staleness = 0")


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
    return one_domain_map(fill(CycleConfig, section, "cycle", env or {}))


# Where each stage keeps its copy of the domain map. These paths predate [cycle.domains]
# and still work as ways to set the one map; they can no longer disagree.
_DOMAIN_MAP_PATHS = ("ingest.rules.domain_map", "curate.verifiers.domain_map",
                     "verify.verifiers.domain_map", "evaluate.verifiers.domain_map")


def one_domain_map(config: CycleConfig) -> CycleConfig:
    """`config` with one domain map in every stage: the one set, in `[cycle.domains]` or
    at any stage's older path, else the default. Two different maps are a ConfigError:
    a domain that ingest accepts but verification cannot score is a silent loss."""
    paths = ("domains",) + _DOMAIN_MAP_PATHS
    chosen = {path: dict(_get_path(config, path.split("."))) for path in paths}
    chosen = {path: m for path, m in chosen.items() if m != dict(DEFAULT_DOMAIN_MAP)}
    if not chosen:
        return config
    distinct = {tuple(sorted(m.items())) for m in chosen.values()}
    if len(distinct) > 1:
        raise ConfigError("the domain map is set differently at " + ", ".join(f"cycle.{p}" for p in chosen)
                          + "; set it once, in [cycle.domains]")
    domain_map = next(iter(chosen.values()))
    for path in paths:
        config = _set_path(config, path.split("."), domain_map, path)
    return config
