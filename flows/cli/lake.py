"""`flywheel lake maintain`: merge the lake's small files and delete files nothing reads,
and the training checkpoints of completed cycles, now.

The same upkeep the `lake-maintenance` deployment runs on its schedule
(storage/maintenance.py); the policy is `[maintenance]` of flywheel.toml, and the
options here override it for one run.
"""
from __future__ import annotations

from typing import Annotated

import duckdb
import typer

from flows.cli.show import print_error, rich_console
from storage.config_file import ConfigError
from storage.lake import LakeError
from storage.objects import ObjectStoreError

lake_app = typer.Typer(help="Upkeep of the lake itself.", no_args_is_help=True)


@lake_app.command("maintain")
def maintain_command(
    retention_days: Annotated[float | None, typer.Option(min=0, help=(
        "Expire snapshots older than this (time travel stops there); 0 keeps all. "
        "Default: \\[maintenance] snapshot_retention_days."))] = None,
    grace_hours: Annotated[float | None, typer.Option(min=0, help=(
        "Delete unreferenced files only once this old. Default: \\[maintenance] file_grace_hours."))] = None,
) -> None:
    """Merge small files, write inlined rows out, delete merged-away and orphaned files, the
    checkpoints of completed cycles, if asked (\\[maintenance] model_weights_days) old
    models' weights, and on a lake in a bucket this machine's copies of the models it holds."""
    from storage.maintenance import maintain_configured_lake
    from tasks.release.retention import drop_configured_copies, drop_configured_weights
    from tasks.round.checkpoints import drop_configured_checkpoints

    console = rich_console()
    try:
        report = maintain_configured_lake(snapshot_retention_days=retention_days, file_grace_hours=grace_hours)
        dropped, weights = drop_configured_checkpoints(), drop_configured_weights()
        copies = drop_configured_copies()
    except (ConfigError, LakeError) as exc:
        print_error(console, exc)
        raise typer.Exit(2) from None
    except (duckdb.Error, ObjectStoreError) as exc:
        print_error(console, f"maintenance stopped, nothing half done (run it again): {exc}")
        raise typer.Exit(1) from None
    console.print(f"data files read by the newest snapshot: {report.files_before:,} -> {report.files_after:,} "
                  f"({report.files_merged:,} merged into {report.files_written:,}; inlined rows of "
                  f"{report.tables_flushed} tables written out)")
    console.print(f"deleted: {report.files_deleted:,} unreferenced files, {report.orphans_deleted:,} orphaned files; "
                  f"snapshots expired {report.snapshots_expired:,}, kept {report.snapshots_left:,}; "
                  f"{report.seconds:.1f} s")
    console.print(f"training checkpoints of completed cycles deleted: {dropped.jobs:,} jobs, "
                  f"{dropped.bytes / 2**30:.2f} GiB; weights of old rejected and passed-over models deleted: "
                  f"{weights.models:,} models, {weights.bytes / 2**30:.2f} GiB (\\[maintenance] model_weights_days)")
    if copies.models:
        console.print(f"copies on this machine of models the bucket holds deleted: {copies.models:,} models, "
                      f"{copies.bytes / 2**30:.2f} GiB")
