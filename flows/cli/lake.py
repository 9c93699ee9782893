"""`flywheel lake maintain`: merge the lake's small files and delete files nothing reads,
and the training checkpoints of completed cycles, now. `flywheel lake move`: copy the lake
into another, empty one (a laptop's lake becoming the cluster's).

Maintenance is the same upkeep the `lake-maintenance` deployment runs on its schedule
(storage/maintenance.py); the policy is `[maintenance]` of flywheel.toml, and the
options here override it for one run.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Annotated

import duckdb
import typer

from flows.cli.show import plain, print_error, rich_console
from storage.config_file import ConfigError, fill, lake_settings, load_toml
from storage.lake import LakeError
from storage.objects import ObjectStoreError
from storage.settings import LakeSettings

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


@lake_app.command("move")
def move_command(
    to: Annotated[Path, typer.Option(
        "--to", exists=True, dir_okay=False, metavar="TOML", help=(
            "A TOML file whose \\[lake] table is the destination, in flywheel.toml's keys (home, "
            "s3_endpoint, s3_bucket, s3_access_key, s3_secret_key, catalog_dsn, ...). FLYWHEEL_* "
            "variables do not apply to it: they, with flywheel.toml, name the source."))],
) -> None:
    """Copy this lake (flywheel.toml and FLYWHEEL_*) into the empty lake the --to file names: every
    table's rows, and every model folder, its uri rewritten to the copy. One commit at the end:
    a move that stopped is run again. The source is left as it was; history is not kept."""
    from storage.lake import open_lake
    from storage.lake_move import MoveRefused, check_move, describe, move_tables
    from tasks.release.model_move import check_model_folders, move_model_folders

    console = rich_console()
    started = time.monotonic()
    try:
        source, dest = lake_settings(), destination_settings(to)
        snapshot = check_move(source, dest)
        src = open_lake(source, snapshot=snapshot)  # every read of the source sees this one snapshot
    except (ConfigError, LakeError, ObjectStoreError) as exc:
        print_error(console, exc)
        raise typer.Exit(2) from None
    with contextlib.closing(src):
        try:
            check_model_folders(src, source)
        except (LakeError, ObjectStoreError) as exc:
            print_error(console, exc)
            raise typer.Exit(2) from None
        try:
            models = move_model_folders(src, source, dest)
            tables = move_tables(src, source, dest, {"models": models.rows})
        except MoveRefused as exc:
            print_error(console, exc)
            raise typer.Exit(2) from None
        except (LakeError, duckdb.Error, ObjectStoreError, OSError) as exc:
            print_error(console, f"move stopped before its commit, the destination holds none of its rows: "
                                 f"{exc}; run the same command again (it copies everything again)")
            raise typer.Exit(1) from None
    moved = ", ".join(f"{table} {n:,}" for table, n in tables.rows.items() if n) or "none"
    empty = sum(1 for n in tables.rows.values() if not n)
    console.print(f"moved {plain(describe(source))} (snapshot {snapshot})\n   to {plain(describe(dest))} "
                  f"(snapshot {tables.snapshot})", soft_wrap=True)
    console.print(f"rows: {moved} ({empty} tables empty)", soft_wrap=True)
    console.print(f"model folders: {models.folders:,} ({models.bytes / 2**20:,.1f} MiB); table data: "
                  f"{tables.bytes / 2**20:,.1f} MiB; {time.monotonic() - started:.1f} s")
    console.print("history not kept: the destination starts at one snapshot holding these rows; the source's "
                  "snapshots (flywheel sql --snapshot, cycles.snapshot_id, models' past statuses) stay in the "
                  "source, which is unchanged: delete it once the destination serves you")


def destination_settings(path: Path) -> LakeSettings:
    """The `[lake]` table of `path`, by the loader's rules but without the environment.

    The destination is a file, not options or variables, because it is a second whole set
    of the settings every command reads from `[lake]`: the same keys, judged by the same
    loader and LakeSettings' own checks, its credentials kept out of the shell's history,
    while the variables and flywheel.toml stay the source's (applied to the destination
    too, an exported FLYWHEEL_HOME would point both lakes at one home). The cluster's own
    settings are variables of docker-compose.yml; the file says the same in [lake]'s keys.
    """
    toml = load_toml(path)
    if "lake" not in toml:
        raise ConfigError(f"{path} has no [lake] table: nothing in it says where the destination lake is")
    return fill(LakeSettings, toml["lake"], "lake", {}, "FLYWHEEL_")
