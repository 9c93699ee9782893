"""Landing scans: a file already ingested at its current version is neither read nor downloaded again."""
from __future__ import annotations

import os

from storage.lake import open_lake
from storage.objects import ObjectStore
from tasks.ingest.batch import IngestConfig, ingest_source
from tasks.ingest.sources import find_sources, split_unchanged
from tests.tasks.logs import write_logs


def _scan(con, settings, where: str):
    pending, unchanged = split_unchanged(con, find_sources([where], settings, allow_empty=True))
    return [s.uri for s in pending], unchanged


def test_a_rescan_of_an_s3_landing_prefix_downloads_only_new_or_replaced_objects(s3_lake_settings, tmp_path,
                                                                                   monkeypatch):
    downloads = []
    download = ObjectStore.download
    monkeypatch.setattr(ObjectStore, "download",
                        lambda self, bucket, key, path: downloads.append(key) or download(self, bucket, key, path))
    store, bucket = ObjectStore(s3_lake_settings), s3_lake_settings.s3_bucket
    store.ensure_bucket()
    for name, seed in (("a", 1), ("b", 2)):
        store.upload(write_logs(tmp_path / f"{name}.jsonl", 5, seed=seed), bucket, f"landing/{name}.jsonl")
    con = open_lake(s3_lake_settings)
    landing = f"s3://{bucket}/landing/"
    pending, unchanged = _scan(con, s3_lake_settings, landing)
    assert unchanged == {} and len(pending) == 2
    batches = {uri: ingest_source(con, s3_lake_settings, uri, IngestConfig(), "c1").batch_id for uri in pending}
    downloads.clear()

    assert _scan(con, s3_lake_settings, landing) == ([], batches)  # nothing to read again
    assert downloads == []

    # a replaced object and a new one are ingested; the untouched one is still skipped
    store.upload(write_logs(tmp_path / "a2.jsonl", 7, seed=3), bucket, "landing/a.jsonl")
    store.upload(write_logs(tmp_path / "c.jsonl", 2, seed=4), bucket, "landing/c.jsonl")
    pending, unchanged = _scan(con, s3_lake_settings, landing)
    assert pending == [f"{landing}a.jsonl", f"{landing}c.jsonl"]
    assert unchanged == {f"{landing}b.jsonl": batches[f"{landing}b.jsonl"]}
    assert [ingest_source(con, s3_lake_settings, uri, IngestConfig(), "c2").rows_ok for uri in pending] == [7, 2]
    assert _scan(con, s3_lake_settings, landing)[0] == []
    assert downloads == ["landing/a.jsonl", "landing/c.jsonl"]


def test_a_touched_local_file_is_looked_at_again_and_its_content_decides(lake_settings, tmp_path):
    (tmp_path / "landing").mkdir()
    logs = write_logs(tmp_path / "landing" / "x.jsonl", 4)
    con = open_lake(lake_settings)
    landing = str(tmp_path / "landing")
    (uri,), _ = _scan(con, lake_settings, landing)
    first = ingest_source(con, lake_settings, uri, IngestConfig(), "c1")
    assert _scan(con, lake_settings, landing) == ([], {uri: first.batch_id})
    stat = logs.stat()
    os.utime(logs, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # same bytes, new mtime
    assert _scan(con, lake_settings, landing)[0] == [uri]
    again = ingest_source(con, lake_settings, uri, IngestConfig(), "c2")
    assert again.skipped and again.batch_id == first.batch_id  # the sha256 still recognises it
    logs.write_text(logs.read_text() + write_logs(tmp_path / "more.jsonl", 1, seed=8).read_text())
    assert _scan(con, lake_settings, landing)[0] == [uri]
    grown = ingest_source(con, lake_settings, uri, IngestConfig(), "c3")  # appended to: its new line is read
    assert (grown.skipped, grown.rows_ok, grown.rows_quarantined, grown.first_line) == (False, 1, 0, 5)
    assert _scan(con, lake_settings, landing)[0] == []
