"""Copy the folder of every `models` row into another lake: the models' half of `flywheel lake move`.

A row's `uri` is absolute (a folder on this machine, or s3://bucket/models/<version>/),
so a lake that moves must take its model folders along and record where they are now.
Where a model lives in a lake is `tasks.release.models`' to say (`copy_model`, through
`publish_model`); this module only walks the rows. It writes no table: it returns the
rewritten rows, which storage/lake_move.py commits with every other table, so a move
killed after copying folders leaves no row pointing at them and a rerun copies them again
(same version, same place). A model whose weights lake maintenance deleted moves as its
row alone, its uri as it was.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa

from storage.lake import LakeError
from storage.lake_move import source_rows
from storage.objects import ObjectStore, parse_s3_uri
from storage.schemas import SCHEMAS
from storage.settings import LakeSettings
from tasks.release.models import copy_model


@dataclass(frozen=True)
class MovedModels:
    rows: pa.Table
    """The source's `models` rows, each `uri` the destination's copy."""
    folders: int
    bytes: int


def check_model_folders(src: duckdb.DuckDBPyConnection, source: LakeSettings) -> None:
    """A LakeError naming the first model of the source (`src`, opened at the snapshot a move
    copies) whose row says it has weights and whose folder is gone: checked before a move
    writes anything."""
    for model in _with_weights(_models(src)):
        _check_present(source, model["policy_version"], model["uri"])


def move_model_folders(src: duckdb.DuckDBPyConnection, source: LakeSettings, dest: LakeSettings) -> MovedModels:
    """Copy the folder of every model of the source (`src`) that still has its weights into
    `dest`, and return the source's rows with their new uris."""
    rows = _models(src)
    models = rows.select(["policy_version", "uri"]).to_pylist()
    uris, size = {}, 0
    for model in _with_weights(rows):
        uris[model["policy_version"]], copied = _copy_folder(source, dest, model["policy_version"], model["uri"])
        size += copied
    new_uris = pa.array([uris.get(m["policy_version"], m["uri"]) for m in models], pa.string())
    rows = rows.set_column(rows.schema.get_field_index("uri"), SCHEMAS["models"].field("uri"), new_uris)
    return MovedModels(rows, len(uris), size)


def _models(src: duckdb.DuckDBPyConnection) -> pa.Table:
    return pa.Table.from_batches(list(source_rows(src, "models")), schema=SCHEMAS["models"])


def _with_weights(rows: pa.Table) -> list[dict]:
    return [m for m in rows.select(["policy_version", "uri", "weights_deleted_at"]).to_pylist()
            if m["weights_deleted_at"] is None]


def _check_present(source: LakeSettings, version: str, uri: str) -> None:
    if uri.startswith("s3://"):
        bucket, prefix = parse_s3_uri(uri)
        present = any(True for _ in ObjectStore(source).list(bucket, prefix.rstrip("/") + "/config.json"))
    else:
        present = (Path(uri) / "config.json").is_file()
    if not present:
        raise LakeError(f"model {version[:12]}'s folder {uri} is gone though its row says it has weights: put "
                        "the folder back, then move again")


def _copy_folder(source: LakeSettings, dest: LakeSettings, version: str, uri: str) -> tuple[str, int]:
    """The destination's uri of the model at `uri`, and its bytes. A folder in the source's
    bucket is downloaded first into a scratch folder in the destination's home, not the
    source's: a move leaves the source as it was."""
    if not uri.startswith("s3://"):
        return copy_model(dest, Path(uri), version), _size(Path(uri))
    dest.home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.home, prefix=".move-") as scratch:
        bucket, prefix = parse_s3_uri(uri)
        folder = ObjectStore(source).download_dir(bucket, prefix, Path(scratch))
        return copy_model(dest, folder, version), _size(folder)


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
