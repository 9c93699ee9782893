"""Training checkpoints no cycle will read again, deleted by lake maintenance.

A train job keeps its newest DeepSpeed checkpoint (weights and AdamW state: 2.0 GiB for
SmolLM2-135M, about 16 bytes a parameter under ZeRO-2) for two readers: its own rerun,
and the next job trained from its model, which starts from those AdamW moments
(trainer/ds_train.py: carry_optimizer). Once the job's cycle has completed, the only
model anything trains from again is production, where the next cycle starts. Every
other job's checkpoint is disk a nightly cycle adds and nothing reads: three rounds a
night of a 7B model would add about a third of a terabyte.

Left alone: jobs of cycles running or failed (a failed cycle's rerun resumes its job),
the production model's job, and every job's exported `model/` folder, which is a
model's weights (its `uri` on a local lake) and can still be promoted by hand. A model
promoted by hand later, whose checkpoint went, trains its first job with fresh AdamW
moments, as the job's log says: nothing fails.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import duckdb

from storage.config_file import lake_settings
from storage.lake import open_lake
from trainer.job import checkpoint_dir, jobs_root


@dataclass(frozen=True)
class CheckpointsDropped:
    jobs: int
    """Jobs whose checkpoints were deleted."""
    bytes: int


def drop_finished_checkpoints(con: duckdb.DuckDBPyConnection, root: Path) -> CheckpointsDropped:
    """Delete the checkpoints of every job in `root` whose model came out of a completed
    cycle and is not production (the rule in the module docstring)."""
    done = {version for (version,) in con.execute(
        "SELECT m.policy_version FROM lake.models m JOIN lake.cycles c USING (cycle_id) "
        "WHERE c.status = 'completed' AND m.status <> 'production'").fetchall()}
    jobs, freed = 0, 0
    for job in sorted(Path(root).iterdir()) if Path(root).is_dir() else []:
        ckpt = checkpoint_dir(job)
        if job.name in done and ckpt.is_dir() and not ckpt.is_symlink():
            freed += sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file() and not f.is_symlink())
            shutil.rmtree(ckpt)
            jobs += 1
    return CheckpointsDropped(jobs=jobs, bytes=freed)


def drop_configured_checkpoints() -> CheckpointsDropped:
    """`drop_finished_checkpoints` on the lake and home flywheel.toml names: what the
    maintenance flow and `flywheel lake maintain` run."""
    settings = lake_settings()
    con = open_lake(settings, read_only=True)
    try:
        return drop_finished_checkpoints(con, jobs_root(settings.home))
    finally:
        con.close()
