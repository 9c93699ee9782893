"""Which landed files to ingest: discovery of files and S3 objects, and skipping unchanged ones.

A landing folder or prefix only grows (raw files are never deleted), and the
scheduled ingest looks at all of it every few minutes. Each file ingested records
its `source_version` (size and mtime for a local file, size and ETag for an S3
object) in `ingest_batches`; a file whose version is already there is reported as
already ingested without being read, hashed or downloaded. Any other file is
ingested as usual, and its sha256 still makes a copy of known content a no-op.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
from prefect import task

from storage.config_file import lake_settings
from storage.lake import open_lake
from storage.objects import ObjectInfo, ObjectStore, parse_s3_uri
from storage.settings import LakeSettings

SUFFIXES = (".jsonl", ".jsonl.gz")


class IngestError(ValueError):
    """A path to ingest cannot be used; the message names it and says why."""


@dataclass(frozen=True)
class Source:
    uri: str
    version: str
    """Changes whenever the file's bytes can have changed (see the module docstring)."""


def local_version(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def object_version(info: ObjectInfo) -> str:
    return f"{info.size}:{info.etag}"


def version_size(version: str) -> int | None:
    """The byte size a version above records (None: not one of theirs)."""
    size = version.split(":", 1)[0]
    return int(size) if size.isdigit() else None


def find_sources(paths: list[str], settings: LakeSettings, *, allow_empty: bool = False) -> list[Source]:
    """Expand files, folders and s3:// keys or prefixes into sorted sources.

    An s3:// URI naming one object is that object alone (bucket notifications name
    exactly the new files); otherwise it is a prefix. A folder or prefix holding no
    log files is an error unless `allow_empty` (a scheduled ingest finding nothing new).
    """
    found: list[Source] = []
    for item in paths:
        if item.startswith("s3://"):
            found += _find_s3(item, settings, allow_empty)
            continue
        path = Path(item)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES))
            if not files and not allow_empty:
                raise IngestError(f"{item}: folder holds no .jsonl or .jsonl.gz files")
            found += [Source(str(p.resolve()), local_version(p)) for p in files]
        elif path.is_file():
            found.append(Source(str(path.resolve()), local_version(path)))
        else:
            raise IngestError(f"{item}: no such file or folder")
    return found


def discover_sources(paths: list[str], settings: LakeSettings, *, allow_empty: bool = False) -> list[str]:
    """The URIs of `find_sources`."""
    return [source.uri for source in find_sources(paths, settings, allow_empty=allow_empty)]


def _find_s3(uri: str, settings: LakeSettings, allow_empty: bool) -> list[Source]:
    bucket, prefix = parse_s3_uri(uri)
    objects = {o.key: o for o in ObjectStore(settings).list(bucket, prefix)}
    if prefix in objects:
        return [Source(uri, object_version(objects[prefix]))]
    logs = sorted(k for k in objects if k.endswith(SUFFIXES))
    if not logs and not allow_empty:
        raise IngestError(f"{uri}: no .jsonl or .jsonl.gz objects under this prefix")
    return [Source(f"s3://{bucket}/{key}", object_version(objects[key])) for key in logs]


def split_unchanged(con: duckdb.DuckDBPyConnection, sources: list[Source]) -> tuple[list[Source], dict[str, str]]:
    """(sources to ingest, {uri: batch_id} of those ingested before at this very version)."""
    if not sources:
        return [], {}
    con.register("_ingest_sources", pa.table({"source_uri": [s.uri for s in sources],
                                              "source_version": [s.version for s in sources]}))
    try:
        seen = dict(con.execute("""
            SELECT b.source_uri, any_value(b.batch_id) FROM lake.ingest_batches b
            JOIN _ingest_sources s USING (source_uri, source_version) GROUP BY b.source_uri""").fetchall())
    finally:
        con.unregister("_ingest_sources")
    return [s for s in sources if s.uri not in seen], seen


@task(name="discover-landing", retries=2, retry_delay_seconds=[2, 10])
def discover_task(paths: list[str]) -> dict:
    """{"pending": [uri, ...], "unchanged": {uri: batch_id}} for the files under `paths`."""
    settings = lake_settings()
    sources = find_sources(paths, settings, allow_empty=True)
    con = open_lake(settings)
    try:
        pending, unchanged = split_unchanged(con, sources)
    finally:
        con.close()
    return {"pending": [s.uri for s in pending], "unchanged": unchanged}
