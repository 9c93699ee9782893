"""Train stage: scored rollouts of one round -> DeepSpeed GRPO job -> candidate model.

Exports the round's rollouts joined with their verdicts to a Parquet snapshot (the
trainer never reads the lake), runs the job (trainer.launch: one DeepSpeed process
per device, through the `deepspeed` launcher when there are several), then writes
the job's per-step metrics to `train_steps` and the new policy to `models` (status
`candidate`, with its parent) in one DuckLake commit. The
policy version is a content hash of (parent, round, rollout ids, config), so a rerun
of the same round resumes the same job directory and writes nothing twice.
`run` (the stage) then stores the folder in the bucket when the lake is on S3, so any
worker can load it; `train_policy` alone leaves `uri` the local folder.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from storage.config_file import lake_settings
from storage.lake import append_rows, transaction
from storage.schemas import SCHEMAS
from trainer.grpo import GRPOConfig
from trainer.job import TrainJob, read_metrics, write_job
from tasks.release.models import local_model_dir, publish_model
from trainer.launch import run_training
from trainer.rollout_data import group_rollouts, read_rollouts

if TYPE_CHECKING:
    from tasks.stages import StageKey


class NothingToLearn(Exception):
    """Every group of the round has one reward for all its samples (all pass or all fail):
    GRPO's advantages are all zero. With a real model that is common, not an error."""

    def __init__(self, groups_dropped: int) -> None:
        super().__init__(f"all {groups_dropped} groups have zero reward variance: nothing to learn from")
        self.groups_dropped = groups_dropped


@dataclass(frozen=True)
class TrainStageConfig:
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    n_procs: int = 1             # DeepSpeed processes (1-2 on CPU, one per GPU on a GPU worker)
    device: str = "auto"         # auto | cpu
    timeout_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.n_procs < 1:
            raise ValueError("TrainStageConfig.n_procs must be >= 1")
        if self.device not in ("auto", "cpu"):
            raise ValueError("TrainStageConfig.device must be 'auto' or 'cpu'")


EXPORT_SQL = """
SELECT r.rollout_id, r.task_id, r.sample_idx, r.prompt_token_ids, r.token_ids, r.logprobs,
       v.reward, v.status
FROM lake.rollouts r JOIN lake.verdicts v USING (rollout_id)
WHERE r.policy_version = ? AND r.round = ? AND r.cycle_id = ?
ORDER BY r.task_id, r.sample_idx
"""


def export_rollouts(con: duckdb.DuckDBPyConnection, policy_version: str, round_idx: int, path: Path,
                    cycle_id: str) -> pa.Table:
    table = con.execute(EXPORT_SQL, [policy_version, round_idx, cycle_id]).to_arrow_table()
    if table.num_rows == 0:
        raise ValueError(f"no scored rollouts for policy {policy_version} round {round_idx}; "
                         "run the rollout and verify stages first")
    pq.write_table(table, path)
    return table


def new_policy_version(parent: str, round_idx: int, rollout_ids: list[str], cfg: TrainStageConfig) -> str:
    key = json.dumps([parent, round_idx, sorted(rollout_ids), asdict(cfg.grpo)], sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()


def train_step_rows(metrics: list[dict], policy_version: str, cycle_id: str) -> pa.Table:
    names = [f.name for f in SCHEMAS["train_steps"]]
    rows = [{**{k: m.get(k) for k in names}, "policy_version": policy_version, "cycle_id": cycle_id}
            for m in metrics]
    return pa.Table.from_pylist(rows, schema=SCHEMAS["train_steps"])


def model_row(policy_version: str, parent: str, uri: str, cycle_id: str) -> pa.Table:
    return pa.Table.from_pylist([{
        "policy_version": policy_version, "parent_version": parent, "uri": uri, "status": "candidate",
        "reason": "trained by GRPO", "created_at": datetime.now(timezone.utc), "cycle_id": cycle_id}],
        schema=SCHEMAS["models"])


def train_policy(con: duckdb.DuckDBPyConnection, base_model: str | Path, parent_version: str, round_idx: int,
                 jobs_root: str | Path, cycle_id: str, cfg: TrainStageConfig = TrainStageConfig()) -> str:
    """Train on the round's rollouts; returns the new candidate's policy_version. Raises
    NothingToLearn, before any job starts, when no group has reward variance."""
    staging = Path(jobs_root) / f"export-{parent_version[:16]}-{round_idx}.parquet"
    staging.parent.mkdir(parents=True, exist_ok=True)
    exported = export_rollouts(con, parent_version, round_idx, staging, cycle_id)
    groups = group_rollouts(read_rollouts(staging), cfg.grpo.scale_by_std)
    if groups.groups_kept == 0:
        staging.unlink()
        raise NothingToLearn(groups.groups_dropped)
    version = new_policy_version(parent_version, round_idx, exported["rollout_id"].to_pylist(), cfg)
    known = con.execute("SELECT count(*) FROM lake.models WHERE policy_version = ?", [version]).fetchone()[0]
    if known:
        return version
    job_dir = Path(jobs_root) / version
    rollouts = job_dir / "rollouts.parquet"
    job_dir.mkdir(parents=True, exist_ok=True)
    staging.replace(rollouts)
    write_job(job_dir, TrainJob(base_model=str(base_model), rollouts=str(rollouts), config=cfg.grpo))
    trained = run_training(job_dir, cfg.n_procs, cfg.device, cfg.timeout_s)
    with transaction(con, f"train {version[:12]} from {parent_version[:12]}"):
        append_rows(con, "train_steps", train_step_rows(read_metrics(job_dir), version, cycle_id))
        append_rows(con, "models", model_row(version, parent_version, str(trained), cycle_id))
    return version


def run(con: duckdb.DuckDBPyConnection, cfg: TrainStageConfig, key: StageKey) -> dict:
    """The train stage: GRPO on the round's scored rollouts. Its `policy_version` is the
    new candidate, or the key's policy unchanged when no rollout of the round was scored
    or no group has anything to learn (recorded in the counts; the cycle goes on)."""
    scored = con.execute("SELECT count(*) FROM lake.rollouts r JOIN lake.verdicts v USING (rollout_id) "
                         "WHERE r.cycle_id = ? AND r.round = ?", [key.cycle_id, key.round]).fetchone()[0]
    if scored == 0:
        return {"policy_version": key.policy, "trained": False}
    settings = lake_settings()
    base = local_model_dir(settings, con, key.policy)
    try:
        version = train_policy(con, base, key.policy, key.round, settings.home / "jobs", key.cycle_id, cfg)
    except NothingToLearn as nothing:
        return {"policy_version": key.policy, "trained": False, "groups_kept": 0,
                "groups_dropped": nothing.groups_dropped, "reason": str(nothing)}
    if settings.uses_s3:
        uri = publish_model(settings, local_model_dir(settings, con, version), version)
        with transaction(con, message=f"model {version[:12]} stored at {uri}"):
            con.execute("UPDATE lake.models SET uri = ? WHERE policy_version = ?", [uri, version])
    # every step row carries the job's group counts
    steps = con.execute("SELECT count(*), max(groups_kept), max(groups_dropped) FROM lake.train_steps "
                        "WHERE policy_version = ?", [version]).fetchone()
    return {"policy_version": version, "trained": True, "steps": steps[0],
            "groups_kept": int(steps[1] or 0), "groups_dropped": int(steps[2] or 0)}
