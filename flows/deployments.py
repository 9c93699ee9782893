"""The deployments flywheel registers with a Prefect server: one explicit table.

Each entry names its flow by import path, the work pool whose workers run it, when
it runs, and the Pydantic model of the parameters a caller may send. The webhook
validates request bodies against that model before it creates anything, and it can
do so without importing any flow (no GX, torch or vLLM in the webhook process).
Adding a deployment is adding one entry to `DEPLOYMENTS`.

A flow module that does not exist yet is skipped with a log line; any other import
error is a bug and propagates. This module does not talk to the server:
flows/cli/serve.py registers what `load_deployments` returns.
"""
from __future__ import annotations

import importlib
import inspect
import logging
import typing
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from prefect import Flow
from prefect.client.schemas.schedules import CronSchedule
from prefect.schedules import Cron, Interval, Schedule
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flows.cycle_params import CycleParams
from flows.evaluate_params import EvaluateParams
from storage.settings import LakeSettings

log = logging.getLogger("flywheel.deployments")

Pool = Literal["cpu", "gpu"]
POOLS: tuple[Pool, ...] = ("cpu", "gpu")


@dataclass(frozen=True)
class ScheduleConfig:
    """`[schedule]` in flywheel.toml; `FLYWHEEL_SCHEDULE_<FIELD>` overrides."""

    cycle_cron: str = "0 2 * * *"
    """When the whole cycle runs (cron, 5 fields). Default: nightly at 02:00."""
    ingest_interval_s: int = 600
    """Seconds between scheduled ingests of the landing prefix."""
    timezone: str = "UTC"
    """IANA zone the cron is read in (e.g. Europe/Paris)."""
    maintenance_cron: str = "0 6 * * *"
    """When the lake's small files are merged and unread files deleted (flows/maintain.py).
    Default: daily at 06:00, after the nightly cycle."""

    def __post_init__(self) -> None:
        for name in ("cycle_cron", "maintenance_cron"):
            cron = getattr(self, name)
            try:  # Prefect's own validator, so whatever passes here the server accepts
                CronSchedule(cron=cron, timezone=self.timezone)
            except ValidationError as exc:
                problems = "; ".join(e["msg"] for e in exc.errors())
                raise ValueError(
                    f"{name}={cron!r} timezone={self.timezone!r}: {problems}. "
                    "Use five cron fields, e.g. '0 2 * * *' (02:00 daily), and an IANA zone") from None
        if self.ingest_interval_s < 10:
            raise ValueError(f"ingest_interval_s must be at least 10 seconds, got {self.ingest_interval_s}")


class IngestParams(BaseModel):
    """What a caller may pass to `ingest` (mirrors flows/ingest.py:ingest_flow)."""

    model_config = ConfigDict(extra="forbid")
    paths: list[str] = Field(min_length=1, max_length=10_000,
                             description="Files, folders or s3://bucket/prefix URIs to ingest.")
    cycle_id: str = Field("manual", min_length=1, max_length=200)
    chunk_lines: int | None = Field(None, ge=1_000, le=1_000_000,
                                    description="Lines per step; default: [cycle.ingest] chunk_lines.")


class NoParams(BaseModel):
    """A flow that takes no parameters: its policy is flywheel.toml's."""

    model_config = ConfigDict(extra="forbid")


class CycleRequest(BaseModel):
    """What a caller may pass to `flywheel-cycle`: `{"params": {...}}`, all optional (the
    flow's own parameter model, imported from a module without torch or vLLM)."""

    model_config = ConfigDict(extra="forbid")
    params: CycleParams = Field(default_factory=CycleParams)


class EvaluateRequest(BaseModel):
    """What a caller may pass to `evaluate`: `{"params": {...}}`, all optional."""

    model_config = ConfigDict(extra="forbid")
    params: EvaluateParams = Field(default_factory=EvaluateParams)


@dataclass(frozen=True)
class DeploymentSpec:
    name: str
    flow_path: str
    """`module:attribute` of the Prefect flow."""
    pool: Pool
    """`gpu` for anything that rolls out, trains or evaluates a model."""
    params: type[BaseModel]
    schedule: Callable[[ScheduleConfig], Schedule] | None
    """None = on demand only (UI, webhook, `prefect deployment run`)."""
    description: str
    defaults: Callable[[LakeSettings], dict[str, Any]] | None = None
    """Parameters a scheduled run uses (computed at registration)."""


def cycle_schedule(cfg: ScheduleConfig) -> Schedule:
    return Cron(cfg.cycle_cron, timezone=cfg.timezone)


def maintenance_schedule(cfg: ScheduleConfig) -> Schedule:
    return Cron(cfg.maintenance_cron, timezone=cfg.timezone)


def ingest_schedule(cfg: ScheduleConfig) -> Schedule:
    return Interval(timedelta(seconds=cfg.ingest_interval_s))


def ingest_defaults(settings: LakeSettings) -> dict[str, Any]:
    return {"paths": [settings.landing_uri]}


DEPLOYMENTS: dict[str, DeploymentSpec] = {spec.name: spec for spec in (
    DeploymentSpec("flywheel-cycle", "flows.flywheel:flywheel_cycle", "gpu", CycleRequest, cycle_schedule,
                   "The whole cycle: ingest, curate, rollout, verify, train, evaluate, promote."),
    DeploymentSpec("ingest", "flows.ingest:ingest_flow", "cpu", IngestParams, ingest_schedule,
                   "Land new failure logs in the lake; bad lines go to quarantine.", ingest_defaults),
    DeploymentSpec("evaluate", "flows.evaluate:evaluate_flow", "gpu", EvaluateRequest, None,
                   "Evaluate a model (default: the newest candidate) against production on every "
                   "registered evaluation set; on demand."),
    DeploymentSpec("lake-maintenance", "flows.maintain:lake_maintenance_flow", "cpu", NoParams,
                   maintenance_schedule,
                   "Merge the lake's small files and delete files nothing reads ([maintenance])."),
)}


class DeploymentError(ValueError):
    """A deployment's table entry disagrees with its flow; the message says how."""


def load_flow(spec: DeploymentSpec) -> Flow | None:
    """Import the spec's flow; None when its module does not exist (yet)."""
    module_name, _, attribute = spec.flow_path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only the flow module itself being absent means "not built yet"; a missing
        # dependency inside an existing module is a real error and must surface.
        if exc.name != module_name:
            raise
        log.warning("deployment %r skipped: its flow module %s does not exist", spec.name, module_name)
        return None
    flow = getattr(module, attribute, None)
    if not isinstance(flow, Flow):
        raise DeploymentError(f"deployment {spec.name!r}: {spec.flow_path} is not a Prefect flow")
    check_params(spec, flow)
    return flow


def check_params(spec: DeploymentSpec, flow: Flow) -> None:
    """The parameter model must only name flow parameters and cover every required one
    a scheduled run does not get from `defaults`; otherwise runs would fail late."""
    signature = inspect.signature(flow.fn).parameters
    fields = set(spec.params.model_fields)
    unknown = fields - set(signature)
    if unknown:
        raise DeploymentError(
            f"deployment {spec.name!r}: {spec.params.__name__} has fields {sorted(unknown)} "
            f"that {spec.flow_path} does not accept")
    required = {n for n, p in signature.items() if p.default is inspect.Parameter.empty}
    missing = required - fields
    if missing:
        raise DeploymentError(
            f"deployment {spec.name!r}: {spec.flow_path} requires {sorted(missing)} but "
            f"{spec.params.__name__} does not let a caller pass them")
    hints = typing.get_type_hints(flow.fn)  # resolves `from __future__ import annotations` strings
    for name in fields:
        theirs, ours = hints.get(name), spec.params.model_fields[name].annotation
        if isinstance(theirs, type) and issubclass(theirs, BaseModel):
            if _shape(theirs) != _shape(ours):
                raise DeploymentError(
                    f"deployment {spec.name!r}: parameter {name!r} is {theirs.__name__} in {spec.flow_path} "
                    f"but {getattr(ours, '__name__', ours)} here has other fields or bounds; update the mirror")


def _shape(model: Any) -> Any:
    """A model's JSON schema without titles and descriptions: fields, types, bounds, defaults."""
    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k not in ("title", "description", "additionalProperties")}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    return strip(model.model_json_schema())


def load_deployments(schedule: ScheduleConfig, settings: LakeSettings,
                     working_dir: str) -> list[Any]:
    """RunnerDeployments for every table entry whose flow exists, ready to `apply()`."""
    from prefect.deployments.runner import EntrypointType

    found = []
    for spec in DEPLOYMENTS.values():
        flow = load_flow(spec)
        if flow is None:
            continue
        found.append(flow.to_deployment(
            name=spec.name,
            schedule=spec.schedule(schedule) if spec.schedule else None,
            parameters=spec.defaults(settings) if spec.defaults else None,
            description=spec.description,
            tags=["flywheel", spec.pool],
            work_pool_name=spec.pool,
            # The flow is imported as an installed module: workers need no code download,
            # only the same image/venv. working_dir keeps relative FLYWHEEL_HOME and
            # flywheel.toml meaning what they meant where `flywheel serve` ran.
            entrypoint_type=EntrypointType.MODULE_PATH,
            job_variables={"working_dir": working_dir},
        ))
    return found
