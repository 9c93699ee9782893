"""A landed .jsonl.gz cut short or damaged: its whole lines land, and one row says where
its data stopped (tasks/ingest/lines.py: Cut)."""
from __future__ import annotations

import zlib

import pytest

from storage.lake import open_lake
from tasks.ingest.batch import IngestConfig, ingest_source
from tests.tasks.logs import write_logs

CFG = IngestConfig(chunk_lines=1000)


def test_a_gzip_cut_short_lands_its_whole_lines_and_quarantines_the_cut_one(lake_settings, tmp_path):
    # a partial upload, or a writer killed mid-file: its lines up to the cut are good logs
    whole = write_logs(tmp_path / "whole.jsonl.gz", 3000)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole.read_bytes()[:whole.stat().st_size // 2])
    con = open_lake(lake_settings)
    result = ingest_source(con, lake_settings, str(cut), CFG, "c1")
    assert result.rows_quarantined == 1 and 1000 < result.rows_ok < 2000
    assert con.execute("SELECT max(line_no) FROM lake.failure_logs").fetchone()[0] == result.rows_ok
    line_no, kind, reason, raw = con.execute("SELECT line_no, kind, reason, raw FROM lake.quarantine").fetchone()
    assert (line_no, kind) == (result.rows_ok + 1, "gzip_cut")
    assert reason.startswith(f"the gzip data ends inside line {line_no} (Compressed file ended") and raw


def _gzip_cut_after(lines: bytes) -> bytes:
    """A gzip stream holding exactly `lines`, stopped there: no more data, no trailer."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)  # 31: a gzip header
    return packer.compress(lines) + packer.flush(zlib.Z_FULL_FLUSH)


@pytest.mark.parametrize("damage, landed", [
    ("between two lines", 40),  # the copy stopped where a line ended: it looked complete
    ("before the first line", 0),  # not gzip data past its magic bytes: an empty batch said nothing
])
def test_a_gzip_that_stops_where_no_line_is_cut_still_says_so(lake_settings, tmp_path, damage, landed):
    lines = write_logs(tmp_path / "whole.jsonl", 40).read_bytes()
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(_gzip_cut_after(lines) if landed else b"\x1f\x8b" + b"\x00garbage" * 20)
    con = open_lake(lake_settings)
    result = ingest_source(con, lake_settings, str(path), CFG, "c1")
    assert (result.rows_ok, result.rows_quarantined) == (landed, 1)
    line_no, kind, reason, raw = con.execute("SELECT line_no, kind, reason, raw FROM lake.quarantine").fetchone()
    assert (line_no, kind, raw) == (landed + 1, "gzip_cut", "")
    assert reason.startswith(f"the gzip data ends before line {landed + 1} (") and "copy the file again" in reason
