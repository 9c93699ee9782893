"""Where the lake lives: one frozen settings object, validated on construction.

The same code serves the embedded default (a folder) and the cluster (S3 data, a
PostgreSQL catalog); only these values differ. Reading `flywheel.toml` and
`FLYWHEEL_*` variables is storage/config_file.py's job; this module only says
what a valid setting is.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


@dataclass(frozen=True)
class LakeSettings:
    home: Path = Path(".flywheel")
    """Local state: the SQLite catalog (embedded), Parquet data when no S3 is set,
    DuckDB's extension folder, reports. `FLYWHEEL_HOME`."""
    s3_endpoint: str = ""
    """host:port of any S3 API (MinIO, SeaweedFS, AWS). Empty = data stays in `home`."""
    s3_bucket: str = "flywheel"
    s3_access_key: str = ""
    s3_secret_key: str = ""
    s3_region: str = "us-east-1"
    s3_secure: bool = False
    """https to the endpoint; compose's MinIO speaks plain http on its network."""
    catalog_dsn: str = ""
    """libpq DSN of a PostgreSQL catalog (`FLYWHEEL_CATALOG_DSN`), for several writers.
    Empty = a SQLite catalog file in `home`, which lets readers in other processes
    see committed snapshots while one writer commits."""
    lake_prefix: str = "lake/"
    """Key prefix of the lake's Parquet files inside the bucket."""
    landing_prefix: str = "landing/"
    """Key prefix where serving stacks drop failure logs."""
    duckdb_memory_limit: str = "1GB"
    """DuckDB's buffer pool cap per connection. An ingest holds one chunk's derived rows
    (tasks/ingest/batch.py bounds that), so a 1,000,000-line file peaks at ~0.77 GB resident
    either way; at 256MB DuckDB spilled those rows to disk and ingest ran 1.5x slower."""
    duckdb_threads: int = 2

    def __post_init__(self) -> None:
        # "~/.flywheel" in flywheel.toml or a .env file reaches here unexpanded (no shell saw it)
        object.__setattr__(self, "home", Path(self.home).expanduser())
        if self.s3_endpoint:
            if "://" in self.s3_endpoint:
                raise ValueError(
                    f"s3_endpoint must be host:port without a scheme, got {self.s3_endpoint!r}; "
                    "set s3_secure=true for https")
            if not _BUCKET_NAME.fullmatch(self.s3_bucket):
                raise ValueError(
                    f"s3_bucket {self.s3_bucket!r} is not a valid bucket name: 3-63 characters of "
                    "lowercase letters, digits, '.' and '-', starting and ending with a letter or digit")
            if not (self.s3_access_key and self.s3_secret_key):
                raise ValueError("an S3 endpoint needs FLYWHEEL_S3_ACCESS_KEY and FLYWHEEL_S3_SECRET_KEY")
        if self.duckdb_threads < 1:
            raise ValueError(f"duckdb_threads must be at least 1, got {self.duckdb_threads}")
        for name in ("lake_prefix", "landing_prefix"):
            value = getattr(self, name)
            if value.startswith("/") or not value.endswith("/"):
                raise ValueError(f"{name} must be a relative key prefix ending in '/', got {value!r}")

    @property
    def uses_s3(self) -> bool:
        return bool(self.s3_endpoint)

    @property
    def data_path(self) -> str:
        """Where DuckLake writes Parquet: the bucket, or a folder under home."""
        if self.uses_s3:
            return f"s3://{self.s3_bucket}/{self.lake_prefix}"
        return str((self.home / "data").resolve()) + "/"

    @property
    def landing_uri(self) -> str:
        """Where serving stacks drop failure logs: the landing prefix of the bucket, or of home."""
        if self.uses_s3:
            return f"s3://{self.s3_bucket}/{self.landing_prefix}"
        return str((self.home / self.landing_prefix).resolve())

    @property
    def catalog_uri(self) -> str:
        if self.catalog_dsn:
            return f"ducklake:postgres:{self.catalog_dsn}"
        return f"ducklake:sqlite:{(self.home / 'catalog.sqlite').resolve()}"
