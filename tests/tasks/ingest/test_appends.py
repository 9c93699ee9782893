"""A landed file that grew by appends is read from its first new line (tasks/ingest/appends.py)."""
from __future__ import annotations

import json

from storage.lake import open_lake
from tasks.ingest.batch import IngestConfig, ingest_file
from tests.tasks.logs import valid_log

CFG = IngestConfig(chunk_lines=1000)


def test_a_file_that_grew_by_appends_is_read_from_its_new_lines(lake_settings, tmp_path):
    """An application appending to one file a day, ingested every few minutes: each ingest
    takes the new lines, and none already in comes back as a repeated_log; a last line cut
    mid-write is read again once complete."""
    con = open_lake(lake_settings)
    path = tmp_path / "today.jsonl"
    lines = [json.dumps(valid_log(i)) for i in range(6)]
    path.write_text("\n".join(lines[:3]) + "\n" + lines[3][:40])  # the writer is mid-line
    first = ingest_file(con, path, str(path), CFG, "c1")
    assert (first.rows_ok, first.rows_quarantined, first.first_line) == (3, 1, 1)
    with open(path, "a") as handle:
        handle.write(lines[3][40:] + "\n" + lines[4] + "\n")
    grown = ingest_file(con, path, str(path), CFG, "c2")
    assert (grown.rows_ok, grown.rows_quarantined, grown.first_line, grown.skipped) == (2, 0, 4, False)
    with open(path, "a") as handle:
        handle.write(lines[5] + "\n")
    assert ingest_file(con, path, str(path), CFG, "c3").first_line == 6
    assert ingest_file(con, path, str(path), CFG, "c4").skipped  # unchanged since
    landed = con.execute("SELECT request_id, line_no FROM lake.failure_logs ORDER BY line_no").fetchall()
    assert landed == [(f"req-0-{i}", i + 1) for i in range(6)]
    assert con.execute("SELECT line_no, kind FROM lake.quarantine").fetchall() == [(4, "bad_json")]
    assert con.execute("SELECT first_line FROM lake.ingest_batches ORDER BY ingested_at").fetchall() == [
        (1,), (4,), (6,)]
    path.write_text("\n".join(lines[1:]) + "\n")  # rewritten, not appended to: read whole
    rewritten = ingest_file(con, path, str(path), CFG, "c5")
    assert (rewritten.first_line, rewritten.rows_ok, rewritten.rows_quarantined) == (1, 0, 5)
