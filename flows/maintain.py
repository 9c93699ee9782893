"""The `lake-maintenance` flow: merge the lake's small files and delete what nothing reads,
then the training checkpoints of completed cycles (tasks/round/checkpoints.py), when
`[maintenance] model_weights_days` asks, old models' weights, and on a lake in a bucket,
this machine's copies of the models it holds (tasks/release/retention.py).

Scheduled daily by default (`[schedule] maintenance_cron`), at an hour the nightly
cycle has finished: on an embedded (SQLite) catalog, a commit from another process
mid-maintenance fails with "database is locked", and the flow's retries run it again
later (each maintenance call commits on its own, so a retry picks up where it stopped).
The policy is `[maintenance]` of flywheel.toml (storage/maintenance.py).
"""
from __future__ import annotations

from prefect import flow

from storage.maintenance import maintain_configured_lake
from tasks.release.retention import drop_configured_copies, drop_configured_weights
from tasks.round.checkpoints import drop_configured_checkpoints


@flow(name="lake-maintenance", log_prints=True, retries=3, retry_delay_seconds=600)
def lake_maintenance_flow() -> dict:
    report = maintain_configured_lake().as_dict()
    dropped, weights, copies = drop_configured_checkpoints(), drop_configured_weights(), drop_configured_copies()
    report.update(checkpoint_jobs_dropped=dropped.jobs, checkpoint_bytes_freed=dropped.bytes,
                  model_weights_dropped=weights.models, model_weights_bytes_freed=weights.bytes,
                  local_model_copies_dropped=copies.models, local_model_copies_bytes_freed=copies.bytes)
    print(f"lake maintenance: {report}")
    return report
