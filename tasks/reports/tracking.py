"""Experiment tracking: every cycle, training job and on-demand evaluation as an MLflow run.

Runs are written after the fact, from rows the stages already committed
(`tasks.reports.run_content` reads them), by the Prefect task that reports a cycle
(`track_cycle`) or an evaluation (`track_evaluation`). Nothing in a training step calls
MLflow, so tracking costs a step nothing and a cycle a few seconds at its end (importing
MLflow, opening its store, a few batched calls); a tracking server that is down, slow or
absent never touches a stage. Both entry points catch every error, log a warning and
return it: tracking never fails a cycle.

Where: `MLFLOW_TRACKING_URI` when set (compose: the `mlflow` service), else the embedded
store under FLYWHEEL_HOME/mlflow: runs in `mlflow.db` (SQLite, the backend MLflow 3
recommends over plain files), artifacts in `artifacts/`. Nothing to start, works offline.

Experiment `flywheel`; a run is found again by its tags `flywheel.kind` and
`flywheel.cycle_id` (an evaluation's id is its cycle id in the lake):
- cycle: params = the cycle's config, one per setting path; metrics = seconds per stage
  (step = round), the funnel's row counts, pass@1 per model role and evaluation set, the
  gate's numbers, routes per round (step = round) and tracking's own cost; tags = status,
  candidate, production, the gate's decision; artifacts = the report's files, `gate.json`,
  `lineage.json` (the candidate's `models` row and its ancestors').
- training job, a child run of its cycle: every `train_steps` column at its step; tags =
  the model it made (version, parent, uri, status when tracked) and what `kl` is to.
- evaluation: its config, pass@1 per role and set, the gate's numbers and decision.

Reruns are safe: a finished run is left as it is; an unfinished one (tracking died half
way) is deleted with its children and written again; a run is marked finished last.
Not here: reading the lake (run_content), MLflow's model registry (a model's files stay
where `models.uri` says; its run holds its lineage), logging during training.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import httpx

from storage.config_file import lake_settings
from storage.lake import open_lake
from tasks.cycle.config import cycle_config
from tasks.reports.run_content import RunContent, cycle_content, evaluation_content

log = logging.getLogger(__name__)

EXPERIMENT = "flywheel"
# MLflow's HTTP client retries a dead server for minutes (7 tries with backoff): one short
# probe first turns "no server" into one warning instead of a report task stuck that long.
PROBE_TIMEOUT_S = 5.0
_TAG_MAX, _PARAM_MAX = 8000, 6000  # MLflow's limits on a tag's and a param's value


def tracking_uri(home: Path) -> str:
    """MLFLOW_TRACKING_URI, else the embedded SQLite store under home/mlflow."""
    return os.environ.get("MLFLOW_TRACKING_URI") or embedded_uri(home)


def embedded_uri(home: Path) -> str:
    return f"sqlite:///{(Path(home) / 'mlflow' / 'mlflow.db').resolve()}"


def track_cycle(cycle_id: str, overrides: dict | None = None, report_folder: Path | None = None) -> dict:
    """Log the cycle (and its training jobs) to MLflow. Never raises: returns
    {"tracked": True, "run_id", "uri", "seconds", ...} or {"tracked": False, "error"}."""
    def write(client, experiment_id, started):
        con = open_lake(lake_settings(), read_only=True)
        try:
            parent, jobs = cycle_content(con, cycle_id, cycle_config(overrides or {}), report_folder)
            train_s = sum(secs for (key, secs, _) in parent.metrics if key == "stage_seconds/train")
        finally:
            con.close()
        return write_run(client, experiment_id, parent, jobs, started, train_s)
    return _safely("cycle", cycle_id, write)


def track_evaluation(evaluation_id: str, models: dict, applied: dict | None = None,
                     overrides: dict | None = None) -> dict:
    """Log an on-demand evaluation to MLflow; never raises (see track_cycle)."""
    def write(client, experiment_id, started):
        con = open_lake(lake_settings(), read_only=True)
        try:
            content = evaluation_content(con, evaluation_id, models, applied, cycle_config(overrides or {}))
        finally:
            con.close()
        return write_run(client, experiment_id, content, [], started)
    return _safely("evaluation", evaluation_id, write)


def _safely(kind: str, cycle_id: str, write) -> dict:
    """The boundary where tracking errors become data: a cycle's models and reports are
    already committed, and an experiment tracker being down must not fail them."""
    started = time.perf_counter()
    uri = "(unknown)"
    try:
        home = lake_settings().home
        uri = tracking_uri(home)
        client, experiment_id = open_experiment(uri, home)
        outcome = write(client, experiment_id, started)
        if uri.startswith(("http://", "https://")):  # where the UI shows it
            outcome["url"] = f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{outcome['run_id']}"
        return {"tracked": True, "uri": uri, **outcome}
    except Exception as exc:  # noqa: BLE001 - see the docstring: any failure is reported, not raised
        error = f"{type(exc).__name__}: {exc}"[:2000]
        # a server that is down needs no traceback; anything else does, to be fixed
        log.warning("MLflow tracking of %s %s at %s failed; the %s itself is unaffected: %s",
                    kind, cycle_id, uri, kind, error, exc_info=not isinstance(exc, ConnectionError))
        return {"tracked": False, "uri": uri, "error": error,
                "seconds": round(time.perf_counter() - started, 3)}


def open_experiment(uri: str, home: Path):
    """An MlflowClient on `uri` and the id of the `flywheel` experiment (created if new)."""
    # MLflow sends usage telemetry unless told not to; flywheel runs offline and calls no one.
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # and prints a "View run" line per run to stdout; the outcome carries the run's URL instead
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    if uri.startswith(("http://", "https://")):
        _probe(uri)
    from mlflow import MlflowClient  # imported here: ~1.5 s, paid only by the tasks that track
    from mlflow.exceptions import MlflowException

    embedded = uri == embedded_uri(home)
    if embedded:
        (Path(home) / "mlflow").mkdir(parents=True, exist_ok=True)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is not None:
        return client, experiment.experiment_id
    # A local store would put artifacts under the working directory (./mlruns); keep them
    # beside the runs. A server chooses its own (compose: proxied to its volume).
    location = (Path(home) / "mlflow" / "artifacts").resolve().as_uri() if embedded else None
    try:
        return client, client.create_experiment(EXPERIMENT, artifact_location=location)
    except MlflowException:
        experiment = client.get_experiment_by_name(EXPERIMENT)  # another process created it meanwhile
        if experiment is None:
            raise
        return client, experiment.experiment_id


def _probe(uri: str) -> None:
    """Raise if nothing answers at `uri`; any HTTP answer will do (a server may lack /health)."""
    try:
        httpx.get(uri.rstrip("/") + "/health", timeout=PROBE_TIMEOUT_S)
    except httpx.TransportError as exc:
        raise ConnectionError(f"no MLflow tracking server answers at {uri}: {exc}") from exc


def write_run(client, experiment_id: str, parent: RunContent, children: list[RunContent],
              started: float, train_seconds: float = 0.0) -> dict:
    """Create the run and its children, unless a finished run of the same cycle exists."""
    found = find_run(client, experiment_id, parent.tags)
    if found is not None and found.info.status == "FINISHED":
        return {"run_id": found.info.run_id, "written": False}
    if found is not None:  # tracking died half way: start this run over
        for child in _children(client, experiment_id, found.info.run_id):
            client.delete_run(child.info.run_id)
        client.delete_run(found.info.run_id)
    run_id = client.create_run(experiment_id, tags=_tags(parent.tags), run_name=parent.name).info.run_id
    for child in children:
        child_id = client.create_run(experiment_id, run_name=child.name,
                                     tags=_tags({**child.tags, "mlflow.parentRunId": run_id})).info.run_id
        log_content(client, child_id, child)
        client.set_terminated(child_id)
    log_content(client, run_id, parent)
    seconds = time.perf_counter() - started
    cost = [("tracking/seconds", seconds, 0)]
    if train_seconds > 0:  # its share of the training it tracks: per step, the same ratio
        cost.append(("tracking/share_of_training", seconds / train_seconds, 0))
    client.log_batch(run_id, metrics=_metrics(cost))
    client.set_terminated(run_id)  # last: an unfinished run is one to write again
    share = seconds / train_seconds if train_seconds > 0 else None
    return {"run_id": run_id, "written": True, "seconds": round(seconds, 3), "share_of_training": share,
            "runs": 1 + len(children)}


def find_run(client, experiment_id: str, tags: dict[str, str]):
    """The newest live run with the same `flywheel.kind` and `flywheel.cycle_id`, or None."""
    runs = client.search_runs([experiment_id], filter_string=_tag_filter(tags), max_results=1,
                              order_by=["attributes.start_time DESC"])
    return runs[0] if runs else None


def _children(client, experiment_id: str, run_id: str) -> list:
    return client.search_runs([experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{run_id}'")


def _tag_filter(tags: dict[str, str]) -> str:
    def quoted(value: str) -> str:
        if "'" in value:  # ids are ours (cycle-<uuid>, eval-<uuid>) or an operator's name
            raise ValueError(f"cannot search MLflow for an id with a quote: {value!r}")
        return f"'{value}'"
    return " and ".join(f"tags.`{k}` = {quoted(tags[k])}" for k in ("flywheel.kind", "flywheel.cycle_id"))


def log_content(client, run_id: str, content: RunContent) -> None:
    """One log_batch (MLflow splits it into requests of its limits) and the artifacts."""
    from mlflow.entities import Param, RunTag

    params = [Param(k, str(v)[:_PARAM_MAX]) for k, v in content.params.items()]
    tags = [RunTag(k, v) for k, v in _tags(content.tags).items()]
    client.log_batch(run_id, metrics=_metrics(content.metrics), params=params, tags=tags)
    for name, data in content.files.items():
        client.log_dict(run_id, data, name)
    if content.folder is not None and Path(content.folder).is_dir():
        client.log_artifacts(run_id, str(content.folder), "report")


def _metrics(rows: list[tuple[str, float, int]]) -> list:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    return [Metric(key, value, now, step) for key, value, step in rows]


def _tags(tags: dict[str, Any]) -> dict[str, str]:
    return {k: str(v)[:_TAG_MAX] for k, v in tags.items()}
