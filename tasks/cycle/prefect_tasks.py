"""The Prefect layer: one generic task runs any stage of `tasks.stages.STAGES`; a few
small tasks open and close a cycle, pick the models an on-demand evaluation compares,
publish reports and track runs in MLflow. None holds SQL or writes the lake itself: each
calls one plain function, and passes and returns small values (ids, counts), never tables.
"""
from __future__ import annotations

from prefect import get_run_logger, task
from prefect.futures import PrefectFuture

from storage.config_file import lake_settings
from storage.lake import open_lake
from tasks.cycle.config import cycle_config
from tasks.cycle.state import begin_cycle, finish_cycle, run_stage
from tasks.release.models import pick_models
from tasks.reports.cycle_report import publish_evaluation, report_cycle
from tasks.reports.tracking import track_cycle, track_evaluation
from tasks.stages import STAGES, StageKey

_ROUND_STAGES = ("rollout", "verify", "train")


@task(name="stage")
def _stage(name: str, key: StageKey, overrides: dict) -> dict:
    stage = STAGES[name]
    config = cycle_config(overrides)
    cfg = stage_config(config, stage.config)
    return run_stage(key.cycle_id, name, lambda con: stage.run(con, cfg, key), key.round)


def stage_config(config, names: str | tuple[str, ...] | None):
    """The section(s) of the cycle's config a stage takes (`Stage.config`)."""
    if names is None:
        return None
    return getattr(config, names) if isinstance(names, str) else tuple(getattr(config, n) for n in names)


def stage_task(name: str, key: StageKey, overrides: dict | None = None) -> dict:
    """Run stage `name` for `key` as a Prefect task (inside a flow), once per (cycle,
    stage, round): a finished stage returns its recorded counts. `overrides` are the
    run's own settings (`flows.cycle_params.CycleParams.overrides`)."""
    return _configured(name, key)(name, key, overrides or {})


def stage_submit(name: str, key: StageKey, overrides: dict | None = None) -> PrefectFuture:
    """`stage_task` started in the flow's task runner; the future's `result()` is its counts."""
    return _configured(name, key).submit(name, key, overrides or {})


def _configured(name: str, key: StageKey):
    retries = STAGES[name].retries
    label = f"{name} round {key.round}" if name in _ROUND_STAGES else name
    return _stage.with_options(name=name, task_run_name=label, retries=retries,
                               retry_delay_seconds=[2, 10][:retries] or 0)


@task(name="begin-cycle", retries=2, retry_delay_seconds=[2, 10])
def begin_task(cycle_id: str) -> str:
    """Open (or reopen) the cycle's row; return the production model it starts from."""
    cycle_config()  # a bad [cycle] in flywheel.toml fails here, before any stage has worked
    return begin_cycle(cycle_id)


@task(name="finish-cycle", retries=2, retry_delay_seconds=[2, 10])
def finish_task(cycle_id: str) -> dict:
    return finish_cycle(cycle_id, "completed")


@task(name="report")
def report_task(cycle_id: str, overrides: dict | None = None) -> dict:
    """The cycle's report (files, Prefect artifacts), then its MLflow runs; `overrides`
    are the run's settings, so the tracked params are the ones the cycle ran with."""
    folder = report_cycle(cycle_id)
    return {"folder": str(folder), "tracking": _warn_untracked(track_cycle(cycle_id, overrides, folder))}


# No retries: a model that is not in the lake will not appear on a second try.
@task(name="pick-models")
def pick_models_task(policy_version: str | None) -> dict:
    """The model to evaluate (default: the newest candidate) and the production model."""
    con = open_lake(lake_settings(), read_only=True)
    try:
        return pick_models(con, policy_version)
    finally:
        con.close()


@task(name="publish-evaluation")
def publish_task(evaluation_id: str, models: dict, applied: dict | None, overrides: dict | None = None) -> dict:
    publish_evaluation(evaluation_id, models, applied)
    return _warn_untracked(track_evaluation(evaluation_id, models, applied, overrides))


def _warn_untracked(outcome: dict) -> dict:
    """Tracking never fails a run (tasks.reports.tracking); say so in the run's own log."""
    if not outcome["tracked"]:
        get_run_logger().warning("not tracked in MLflow (%s): %s", outcome["uri"], outcome["error"])
    return outcome


def mark_failed(flow, flow_run, state) -> None:
    """Flow failure hook: the cycle's row says failed, with the reason."""
    params = (flow_run.parameters or {}).get("params") or {}
    cycle_id = params.get("cycle_id") or f"cycle-{flow_run.id}"
    finish_cycle(cycle_id, "failed", reason=(state.message or "failed")[:1000])

