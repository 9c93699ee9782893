"""A landed file that grew since it was ingested: only its new lines are the next batch.

An application that appends its failures to one file a day, ingested every ten minutes,
changes the file between ingests. Read whole as a new batch, every line already in the
lake would come back as a `repeated_log` quarantine row, each time: the day's 144
ingests of a 10,000-line file would quarantine some 700,000 rows that are no failure
of anyone's. So a plain file whose bytes begin with exactly the bytes of the last batch
taken from the same `source_uri` (its sha256 is that batch's id) is read from the first
line that batch did not hold whole: a last line that was cut short then (a writer mid-
line; it was quarantined as broken JSON) is read again, now complete. Its batch id is
still the sha256 of the whole file, so the same version of the file is one batch, and a
file that was rewritten rather than appended to is read whole, as before.

Not here: gzip files (a `.gz` is written once), and what a line is (lines.py).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb

from tasks.ingest.lines import WHOLE_FILE, Start
from tasks.ingest.sources import version_size

_BLOCK = 8 << 20


def appended_start(con: duckdb.DuckDBPyConnection, path: Path, source_uri: str) -> tuple[Start, str | None]:
    """Where the batch of `path` starts, and the file's sha256 when it was read to say so
    (None: not read, the caller hashes it)."""
    earlier = con.execute(
        "SELECT batch_id, source_version FROM lake.ingest_batches WHERE source_uri = ? "
        "AND source_version IS NOT NULL ORDER BY ingested_at DESC LIMIT 1", [source_uri]).fetchone()
    earlier_size = version_size(earlier[1]) if earlier else None
    with open(path, "rb") as handle:
        gzipped = handle.read(2) == b"\x1f\x8b"
        size = handle.seek(0, 2)
    if earlier_size is None or gzipped or not 0 < earlier_size < size:
        return WHOLE_FILE, None
    prefix, whole, newlines, last_newline = _read_prefix(path, earlier_size)
    if prefix != earlier[0] or last_newline < 0:
        return WHOLE_FILE, whole
    return Start(offset=last_newline + 1, line_no=newlines + 1), whole


def _read_prefix(path: Path, prefix_bytes: int) -> tuple[str, str, int, int]:
    """(sha256 of the first `prefix_bytes`, sha256 of the file, newlines in the prefix,
    offset of its last newline or -1), in one pass over the file."""
    digest, newlines, last_newline, read = hashlib.sha256(), 0, -1, 0
    prefix_digest = None
    with open(path, "rb") as handle:
        while block := handle.read(_BLOCK):
            head = block[:max(0, prefix_bytes - read)]
            if head:
                newlines += head.count(b"\n")
                found = head.rfind(b"\n")
                last_newline = read + found if found >= 0 else last_newline
            if prefix_digest is None and read + len(block) >= prefix_bytes:
                digest.update(head)
                prefix_digest = digest.copy().hexdigest()
                digest.update(block[len(head):])
            else:
                digest.update(block)
            read += len(block)
    return prefix_digest or "", digest.hexdigest(), newlines, last_newline
