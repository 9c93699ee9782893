"""docker-compose's services, run natively, driven end to end through the webhook.

The same commands the compose file runs (Prefect server on PostgreSQL, an S3 server,
`flywheel serve --pool cpu --healthcheck`, `prefect worker start --pool gpu`,
`flywheel webhook`, `dask scheduler`, `dask worker`), on loopback
(`prefect_stack.run_cycle_through_stack`, the session's `stack_run`). A signed POST
names a landing file and the cpu worker's `ingest` run writes the lake; a second
signed POST starts `flywheel-cycle`, which the gpu pool's worker runs through every
stage to a promoted or rejected model, verifying on the Dask worker.
"""
from __future__ import annotations

import json

import httpx
import pytest

from storage.lake import open_lake
from tests.flows.prefect_stack import STACK_MIN_GAIN

pytestmark = pytest.mark.slow
STAGES = ["ingest", "curate", "rollout", "verify", "train", "evaluate", "gate", "promote"]


def _query(settings, sql: str, params: list | None = None) -> list[tuple]:
    con = open_lake(settings, read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


def test_a_signed_post_lands_logs_in_the_lake_through_the_whole_stack(stack_run):
    assert stack_run.ingest["state"] == "COMPLETED", stack_run.tails("cpu-worker", "webhook")
    settings, uri = stack_run.settings, stack_run.ingest["uri"]
    logs = _query(settings, "SELECT count(*) FROM failure_logs WHERE cycle_id = 'stack-test'")
    bad = _query(settings, "SELECT count(*) FROM quarantine WHERE cycle_id = 'stack-test'")
    sources = _query(settings, "SELECT source_uri FROM ingest_batches WHERE cycle_id = 'stack-test'")
    assert (logs, bad, sources) == ([(3,)], [(1,)], [(uri,)])
    assert stack_run.dask_workers == 1


def test_a_signed_post_runs_a_whole_cycle_on_the_gpu_pool(stack_run, prefect_server):
    run_id, cycle_id = stack_run.cycle["flow_run_id"], stack_run.cycle["cycle_id"]
    assert stack_run.cycle["state"] == "COMPLETED", stack_run.tails("gpu-worker", "webhook")
    run = httpx.get(f"{prefect_server.api_url}/flow_runs/{run_id}", timeout=30).json()
    assert run["work_pool_name"] == "gpu" and "webhook" in run["tags"]

    settings = stack_run.settings
    ((status, finished, counts),) = _query(settings, "SELECT status, finished_at IS NOT NULL, stage_counts "
                                                     "FROM cycles WHERE cycle_id = ?", [cycle_id])
    assert (status, finished) == ("completed", True)
    counts = json.loads(counts)
    assert set(STAGES) <= set(counts), counts
    assert counts["ingest"]["rows_ok"] == 40 and counts["curate"]["kept"] > 0
    # the rollout stage scores its own waves (routing needs the verdicts); verify finds none left
    assert counts["rollout"]["rollouts"] > 0 and counts["rollout"]["verified"] == counts["rollout"]["rollouts"]
    assert counts["verify"]["verified"] == 0

    ((version, parent, model_status, reason, uri),) = _query(
        settings, "SELECT policy_version, parent_version, status, reason, uri FROM models WHERE cycle_id = ?",
        [cycle_id])
    production = _query(settings, "SELECT policy_version FROM models WHERE cycle_id = 'setup'")
    assert parent == production[0][0] and uri.startswith(f"s3://{settings.s3_bucket}/models/")
    assert model_status in ("production", "rejected") and reason.startswith(f"gate in cycle {cycle_id}: ")
    assert f"min_gain {STACK_MIN_GAIN:+.3f}" in reason, reason  # the worker read the stack's flywheel.toml
    evaluated = dict(_query(settings, "SELECT policy_version, count(*) FROM evaluations WHERE cycle_id = ? "
                                      "GROUP BY 1", [cycle_id]))
    assert set(evaluated) == {version, production[0][0]}
    # the evaluate stage verified on the native Dask worker, not on a cluster of its own
    assert "verify" in stack_run.dask_task_prefixes  # tasks.round.scoring keys batches verify-<run>-<i>-try<n>
