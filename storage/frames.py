"""The lake as polars DataFrames, for notebooks.

```python
from storage import frames
frames.tables()                                   # the lake's table names
logs = frames.table("failure_logs")               # a whole table
frames.query("SELECT domain, count(*) AS n FROM failure_logs GROUP BY ALL")
frames.table("models", snapshot=12)               # the lake as DuckLake snapshot 12 left it
```

Every read goes through `storage.query.run_query`: read-only (a write is refused with
the reason), the same lake `flywheel sql` reads (flywheel.toml and `FLYWHEEL_*`), and
DuckDB's Arrow result becomes a polars DataFrame without a copy. Nothing here caches:
each call sees the newest committed snapshot unless it names one.
"""
from __future__ import annotations

import polars as pl

from storage.config_file import lake_settings
from storage.query import run_query
from storage.schemas import SCHEMAS
from storage.settings import LakeSettings


def query(sql: str, *, snapshot: int | None = None, settings: LakeSettings | None = None) -> pl.DataFrame:
    """One read-only statement over the lake (tables by their plain names) as a DataFrame."""
    return pl.from_arrow(run_query(settings or lake_settings(), sql, snapshot=snapshot))


def table(name: str, *, snapshot: int | None = None, settings: LakeSettings | None = None) -> pl.DataFrame:
    """A whole table of the lake; the names are `tables()`."""
    if name not in SCHEMAS:
        raise ValueError(f"no table {name!r} in the lake; tables: {', '.join(tables())}")
    return query(f"SELECT * FROM lake.{name}", snapshot=snapshot, settings=settings)


def tables() -> list[str]:
    """The lake's tables (storage/schemas.py; docs/architecture.md describes each)."""
    return list(SCHEMAS)
