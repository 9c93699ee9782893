"""Ingest: valid rows land, every bad line is kept with its reason, batches are atomic."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from storage.lake import open_lake
from storage.objects import ObjectStore
from tasks.ingest.batch import IngestConfig, ingest_file, ingest_source
from tasks.ingest.sources import IngestError, discover_sources
from tasks.ingest.checks import forget_verdicts
from tests.tasks.logs import MALFORMED, valid_log, write_logs

CFG = IngestConfig(chunk_lines=1000)


def _count(con, table: str) -> int:
    return con.execute(f"SELECT count(*) FROM lake.{table}").fetchone()[0]


def test_valid_rows_land_with_their_fields(lake_settings, tmp_path):
    path = write_logs(tmp_path / "logs.jsonl", 50)
    con = open_lake(lake_settings)
    result = ingest_file(con, path, str(path), CFG, "c1")
    assert (result.rows_ok, result.rows_quarantined, result.skipped) == (50, 0, False)
    row = con.execute("SELECT request_id, domain, model, failure_kind, failure_detail, reference, messages, meta, "
                      "ts, cycle_id, line_no FROM lake.failure_logs WHERE line_no = 1").fetchone()
    first = valid_log(0)
    assert row[:5] == ("req-0-0", "math", "policy-v3", "wrong_answer", "user marked incorrect")
    assert json.loads(row[5]) == first["reference"] and json.loads(row[6]) == first["messages"]
    assert json.loads(row[7]) == {"tenant": "acme"}
    assert row[8].isoformat().startswith("2026-11-30T12:00:00") and row[9:] == ("c1", 1)
    batch = con.execute("SELECT batch_id, rows_ok, rows_quarantined FROM lake.ingest_batches").fetchone()
    assert batch == (result.batch_id, 50, 0)


def test_the_same_file_twice_writes_nothing_the_second_time(lake_settings, tmp_path):
    path = write_logs(tmp_path / "logs.jsonl", 30)
    con = open_lake(lake_settings)
    first = ingest_file(con, path, str(path), CFG, "c1")
    snapshots = con.execute("SELECT count(*) FROM ducklake_snapshots('lake')").fetchone()[0]
    again = ingest_file(con, path, str(path), CFG, "c2")
    assert again.skipped and again.batch_id == first.batch_id and again.rows_ok == 0
    assert _count(con, "failure_logs") == 30
    assert con.execute("SELECT count(*) FROM ducklake_snapshots('lake')").fetchone()[0] == snapshots


def test_repeated_logs_are_quarantined_not_duplicated(lake_settings, tmp_path):
    one = write_logs(tmp_path / "one.jsonl", 10)
    # a different file (new batch) that repeats 3 logs of the first and one of itself
    repeat = json.dumps(valid_log(2))
    two = write_logs(tmp_path / "two.jsonl", 5, seed=7, extra_lines=[repeat, json.dumps(valid_log(0, seed=7)),
                                                                     json.dumps(valid_log(5)), "   "])
    con = open_lake(lake_settings)
    ingest_file(con, one, str(one), CFG, "c1")
    result = ingest_file(con, two, str(two), CFG, "c1")
    assert (result.rows_ok, result.rows_quarantined) == (5, 3)
    reasons = [r[0] for r in con.execute("SELECT reason FROM lake.quarantine ORDER BY line_no").fetchall()]
    assert reasons[0].startswith("identical to log") and "line 3" in reasons[0]
    assert reasons[1] == "identical to line 1 of this file"
    assert _count(con, "failure_logs") == 15


def test_logs_already_in_the_lake_leave_every_chunk_staged(lake_settings, tmp_path):
    """The lake is probed once per batch, after every chunk is staged: the hits, from any
    chunk, are taken out of the batch's logs and quarantined with their lines verbatim."""
    con = open_lake(lake_settings)
    old = write_logs(tmp_path / "old.jsonl", 10)
    ingest_file(con, old, str(old), CFG, "c1")
    lines = [json.dumps(valid_log(i, seed=3)) for i in range(2500)]  # three chunks of CFG
    hits = {5: 2, 1700: 4, 2400: 4}  # line_no (1-based) -> which old log it repeats
    for line_no, i in hits.items():
        lines[line_no - 1] = json.dumps(valid_log(i)) + "  \r"  # the verbatim line keeps its spaces
    path = tmp_path / "new.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = ingest_file(con, path, str(path), CFG, "c2")
    assert (result.rows_ok, result.rows_quarantined) == (2497, 3)
    rows = con.execute("SELECT line_no, kind, reason, raw FROM lake.quarantine ORDER BY line_no").fetchall()
    assert [r[0] for r in rows] == [5, 1700, 2400] and {r[1] for r in rows} == {"repeated_log"}
    assert rows[0][2].startswith("identical to log") and rows[0][2].endswith(", line 3)")
    assert rows[1][2].endswith(", line 5)")
    assert rows[2][2] == "identical to line 1700 of this file"  # a repeat within the file is named so first
    assert rows[0][3] == json.dumps(valid_log(2)) + "  "
    assert _count(con, "failure_logs") == 10 + 2497
    assert con.execute("SELECT count(DISTINCT log_id) FROM lake.failure_logs").fetchone()[0] == 10 + 2497
    assert con.execute("SELECT rows_ok, rows_quarantined FROM lake.ingest_batches WHERE cycle_id = 'c2'"
                       ).fetchone() == (2497, 3)
    # the repeats were deleted in the batch's own commit: no snapshot ever held them
    changes = con.execute("SELECT changes FROM ducklake_snapshots('lake') ORDER BY snapshot_id DESC LIMIT 1"
                          ).fetchone()[0]
    assert "tables_inserted_into" in changes and "tables_deleted_from" not in changes, changes


def test_a_repeat_in_a_later_chunk_names_the_first_line(lake_settings, tmp_path):
    # 1,500 logs are two chunks of CFG; the repeats of line 3 sit in the second one
    path = write_logs(tmp_path / "logs.jsonl", 1500, extra_lines=[json.dumps(valid_log(2))] * 2)
    con = open_lake(lake_settings)
    result = ingest_file(con, path, str(path), CFG, "c1")
    assert (result.rows_ok, result.rows_quarantined) == (1500, 2)
    rows = con.execute("SELECT line_no, kind, reason FROM lake.quarantine ORDER BY line_no").fetchall()
    assert rows == [(1501, "repeated_log", "identical to line 3 of this file"),
                    (1502, "repeated_log", "identical to line 3 of this file")]
    assert con.execute("SELECT count(DISTINCT log_id) FROM lake.failure_logs").fetchone()[0] == 1500


def test_gzip_folders_blank_lines_and_bad_utf8(lake_settings, tmp_path):
    folder = tmp_path / "landing"
    (folder / "nested").mkdir(parents=True)
    write_logs(folder / "a.jsonl.gz", 40, seed=1)
    raw = (json.dumps(valid_log(0, seed=2)) + "\n\n\n").encode() + b'{"id": "\xff\xfe"}\n'
    (folder / "nested" / "b.jsonl").write_bytes(raw)
    (folder / "notes.txt").write_text("not a log file")
    sources = discover_sources([str(folder)], lake_settings)
    assert [Path(s).name for s in sources] == ["a.jsonl.gz", "b.jsonl"]
    con = open_lake(lake_settings)
    results = [ingest_source(con, lake_settings, s, CFG, "c1") for s in sources]
    assert [(r.rows_ok, r.rows_quarantined) for r in results] == [(40, 0), (1, 1)]
    line_no, raw_line, kind = con.execute("SELECT line_no, raw, kind FROM lake.quarantine").fetchone()
    assert line_no == 4 and "\ufffd" in raw_line and kind == "bad_encoding"


def test_a_first_line_nested_past_pythons_limit_is_quarantined_not_a_crash(lake_settings, tmp_path):
    # the first line decides whether a file is a gateway shipment, read with Python's json
    deep = json.dumps(valid_log(0)).replace('"meta": {', '"meta": {"trace": ' + "[" * 3000 + "]" * 3000 + ", ")
    path = write_logs(tmp_path / "deep_first.jsonl", 0, extra_lines=[deep, json.dumps(valid_log(1))])
    con = open_lake(lake_settings)
    result = ingest_source(con, lake_settings, str(path), CFG, "c1")
    assert (result.rows_ok, result.rows_quarantined) == (1, 1)
    assert con.execute("SELECT line_no, kind FROM lake.quarantine").fetchall() == [(1, "too_deep")]


def test_paths_that_cannot_be_ingested_are_named(lake_settings, tmp_path):
    with pytest.raises(IngestError, match="no such file"):
        discover_sources([str(tmp_path / "missing.jsonl")], lake_settings)
    (tmp_path / "empty").mkdir()
    with pytest.raises(IngestError, match="no .jsonl"):
        discover_sources([str(tmp_path / "empty")], lake_settings)


def test_s3_landing_prefix_is_ingested_and_raw_files_stay(s3_lake_settings, tmp_path):
    store = ObjectStore(s3_lake_settings)
    store.ensure_bucket()
    bucket = s3_lake_settings.s3_bucket
    store.upload(write_logs(tmp_path / "x.jsonl", 25, seed=3), bucket, "landing/2026/x.jsonl")
    # y repeats a log of x: its staged Parquet on S3 is rewritten without it
    store.upload(write_logs(tmp_path / "y.jsonl.gz", 15, seed=4,
                            extra_lines=[MALFORMED["bad_role"][0], json.dumps(valid_log(7, seed=3))]),
                 bucket, "landing/2026/y.jsonl.gz")
    sources = discover_sources([f"s3://{bucket}/landing/"], s3_lake_settings)
    assert sources == [f"s3://{bucket}/landing/2026/x.jsonl", f"s3://{bucket}/landing/2026/y.jsonl.gz"]
    con = open_lake(s3_lake_settings)
    results = [ingest_source(con, s3_lake_settings, s, CFG, "c1") for s in sources]
    assert [(r.rows_ok, r.rows_quarantined) for r in results] == [(25, 0), (15, 2)]
    assert _count(con, "failure_logs") == 40
    assert con.execute("SELECT kind FROM lake.quarantine WHERE line_no = 17").fetchone() == ("repeated_log",)
    assert con.execute("SELECT source_uri FROM lake.ingest_batches ORDER BY 1").fetchall()[0][0] == sources[0]
    keys = {o.key for o in store.list(bucket, "landing/")}
    assert keys == {"landing/2026/x.jsonl", "landing/2026/y.jsonl.gz"}


_KILLABLE = textwrap.dedent("""
    import sys
    from pathlib import Path
    from storage.lake import open_lake
    from storage.settings import LakeSettings
    from tasks.ingest.batch import IngestConfig, ingest_file
    settings = LakeSettings(home=sys.argv[1])
    cfg = IngestConfig(chunk_lines=int(sys.argv[3]))
    r = ingest_file(open_lake(settings), Path(sys.argv[2]), sys.argv[2], cfg, "c")
    print(r.rows_ok, r.rows_quarantined, r.skipped)
""")


def test_a_batch_killed_before_commit_leaves_no_rows_and_reruns_once(lake_settings, tmp_path):
    path = write_logs(tmp_path / "big.jsonl", 40_000)
    open_lake(lake_settings).close()
    data = lake_settings.home / "data"
    proc = subprocess.Popen([sys.executable, "-c", _KILLABLE, str(lake_settings.home), str(path), "2000"],
                            stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(data.rglob("*.parquet")):  # data written, commit not yet done
        assert proc.poll() is None, "ingest finished before it could be killed; make the file larger"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    con = open_lake(lake_settings)
    assert [_count(con, t) for t in ("failure_logs", "quarantine", "ingest_batches")] == [0, 0, 0]
    con.close()
    rerun = subprocess.run([sys.executable, "-c", _KILLABLE, str(lake_settings.home), str(path), "2000"],
                           capture_output=True, text=True, check=True)
    assert rerun.stdout.split()[-3:] == ["40000", "0", "False"]
    con = open_lake(lake_settings)
    assert _count(con, "failure_logs") == 40_000
    assert con.execute("SELECT count(DISTINCT log_id) FROM lake.failure_logs").fetchone()[0] == 40_000


@pytest.mark.slow
def test_a_million_lines_ingest_in_bounded_memory(lake_settings, tmp_path):
    """Peak RSS of the ingesting process stays under 1 GB for a 1,000,000-line file."""
    path = tmp_path / "million.jsonl"
    line = json.dumps(valid_log(0))
    with open(path, "w") as handle:
        for i in range(1_000_000):
            handle.write(line.replace('"req-0-0"', f'"req-{i}"').replace("ticket 0-0", f"ticket {i}") + "\n")
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across execve, so a child forked from
    # a big pytest process would report the parent's peak.
    script = _KILLABLE + ("print([l.split()[1] for l in open('/proc/self/status') "
                          "if l.startswith('VmHWM')][0])\n")
    out = subprocess.run([sys.executable, "-c", script, str(lake_settings.home), str(path),
                          str(IngestConfig().chunk_lines)],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[-4:-1] == ["1000000", "0", "False"]
    peak_mb = int(out[-1]) / 1024
    print(f"peak RSS {peak_mb:.0f} MB for 1,000,000 lines")
    assert peak_mb < 1024


# demo-data's name for each planted malformation -> the quarantine kind ingest gives it
DEMO_KIND_TO_QUARANTINE = {
    "not_json": "bad_json", "not_object": "not_object", "missing_messages": "missing_field",
    "messages_not_list": "wrong_type", "unknown_role": "bad_role", "empty_content": "empty_content",
    "missing_response": "missing_field", "unknown_domain": "unknown_domain",
    "missing_reference": "missing_field", "bad_reference_shape": "bad_reference", "bad_ts": "bad_ts",
    "oversized_line": "line_too_large", "wrong_types": "wrong_type", "missing_field": "missing_field",
}


def test_demo_data_malformed_lines_are_all_caught_and_nothing_else(lake_settings, tmp_path):
    from flows.demo.data.generate import MALFORMED_KINDS, DemoDataConfig, generate_demo_data

    assert set(MALFORMED_KINDS) == set(DEMO_KIND_TO_QUARANTINE)
    manifest = generate_demo_data(tmp_path / "demo", DemoDataConfig(logs=1500, seed=3, lines_per_file=600))
    con = open_lake(lake_settings)
    for uri in discover_sources([str(tmp_path / "demo" / "landing")], lake_settings):
        ingest_source(con, lake_settings, uri, CFG, "demo")
    files = dict(con.execute("SELECT batch_id, source_uri FROM lake.ingest_batches").fetchall())
    got = {(Path(files[b]).name, line): kind for b, line, kind in con.execute(
        "SELECT batch_id, line_no, kind FROM lake.quarantine").fetchall()}
    planted = {(Path(m["file"]).name, m["line_no"]): DEMO_KIND_TO_QUARANTINE[m["kind"]] for m in manifest.malformed}
    assert got == planted
    logged = manifest.logs - len(manifest.malformed)
    assert con.execute("SELECT count(*) FROM lake.failure_logs").fetchone()[0] == logged


def test_an_s3_uri_naming_one_object_is_that_object_alone(s3_lake_settings, tmp_path):
    store = ObjectStore(s3_lake_settings)
    store.ensure_bucket()
    bucket = s3_lake_settings.s3_bucket
    store.upload(write_logs(tmp_path / "x.jsonl", 3), bucket, "landing/x.jsonl")
    store.upload(write_logs(tmp_path / "x.jsonl.gz", 3, seed=1), bucket, "landing/x.jsonl.gz")
    assert discover_sources([f"s3://{bucket}/landing/x.jsonl"], s3_lake_settings) == [f"s3://{bucket}/landing/x.jsonl"]
    assert discover_sources([f"s3://{bucket}/nothing/"], s3_lake_settings, allow_empty=True) == []
    with pytest.raises(IngestError, match="no .jsonl"):
        discover_sources([f"s3://{bucket}/nothing/"], s3_lake_settings)


def test_lines_of_new_shapes_in_later_chunks_wait_for_one_gx_call(lake_settings, tmp_path, monkeypatch):
    """Deferring the odd broken line changes no verdict, only how often GX is called."""
    import tasks.ingest.chunks as ingest

    calls = []
    judge = ingest.first_failures
    monkeypatch.setattr(ingest, "first_failures", lambda frame, rules: calls.append(len(frame)) or judge(frame, rules))
    broken = [line for line, _ in MALFORMED.values()]
    path = write_logs(tmp_path / "spread.jsonl", 3000, extra_lines=[])
    lines = path.read_text().splitlines()
    for offset, line in enumerate(broken):  # into the second and third chunks
        lines.insert(1200 + 97 * offset, line)
    # a valid log of a new shape (its own verifier) is deferred too, and so is its repeat
    novel = json.dumps({**valid_log(7, seed=5), "verifier": "exact"})
    lines[1500:1500] = [novel]
    lines.append(novel)
    path.write_text("\n".join(lines) + "\n")
    outcomes = {}
    for defer in (0, 1000):
        con = open_lake(dataclasses.replace(lake_settings, home=tmp_path / f"lake-{defer}"))
        calls.clear()
        forget_verdicts()  # as a fresh process: nothing judged yet
        ingest_file(con, path, str(path), IngestConfig(chunk_lines=1000, defer_lines=defer), "c1")
        outcomes[defer] = (con.execute("SELECT line_no, kind, reason FROM lake.quarantine ORDER BY line_no").fetchall(),
                           con.execute("SELECT sum(line_no), count(*) FROM lake.failure_logs").fetchone())
        con.close()
        # chunk 1, then chunks 2 and 3 each meet new shapes (undeferred), or once at the end
        assert len(calls) == (2 if defer else 3), calls
    assert outcomes[0] == outcomes[1000]
    assert len(outcomes[0][0]) == len(broken) + 1 and outcomes[0][0][-1][1] == "repeated_log"
    assert outcomes[0][1][1] == 3001


def test_a_later_batch_of_known_shapes_asks_gx_nothing_and_gets_the_same_verdicts(lake_settings, tmp_path,
                                                                                    monkeypatch):
    """Verdicts outlive their batch within a process; the outcome is what a fresh process gets."""
    import tasks.ingest.chunks as ingest

    calls = []
    judge = ingest.first_failures
    monkeypatch.setattr(ingest, "first_failures", lambda frame, rules: calls.append(len(frame)) or judge(frame, rules))
    broken = [line for line, _ in MALFORMED.values()]
    first = write_logs(tmp_path / "first.jsonl", 200, extra_lines=broken)
    second = write_logs(tmp_path / "second.jsonl", 300, seed=9, extra_lines=broken[::-1])
    forget_verdicts()
    outcomes = []
    for warm in (True, False):
        con = open_lake(dataclasses.replace(lake_settings, home=tmp_path / f"lake-{warm}"))
        if warm:
            ingest_file(con, first, str(first), IngestConfig(), "c1")
        else:
            forget_verdicts()
        calls.clear()
        ingest_file(con, second, str(second), IngestConfig(), "c1")
        outcomes.append((len(calls), con.execute("SELECT line_no, kind, reason FROM lake.quarantine "
                                                 "WHERE batch_id IN (SELECT batch_id FROM lake.ingest_batches "
                                                 "WHERE source_uri LIKE '%second.jsonl') ORDER BY line_no").fetchall()))
        con.close()
    (warm_calls, warm_rows), (cold_calls, cold_rows) = outcomes
    assert (warm_calls, cold_calls) == (0, 1)
    assert warm_rows == cold_rows and len(warm_rows) == len(broken)


def test_remembered_verdicts_start_afresh_past_their_bound(monkeypatch):
    import tasks.ingest.checks as log_checks
    from tasks.ingest.checks import LogRules, known_verdicts

    monkeypatch.setattr(log_checks, "VERDICTS_KEPT", 3)
    forget_verdicts()
    held = known_verdicts(LogRules())
    held.update({(i,): None for i in range(4)})
    assert known_verdicts(LogRules(max_messages=7)) == {}  # other rules, other verdicts
    fresh = known_verdicts(LogRules())
    assert fresh == {} and fresh is not held and len(held) == 4  # a batch holding the old one keeps it
    fresh[(0,)] = "bad_json"
    assert known_verdicts(LogRules()) is fresh


def test_a_batch_failing_while_its_set_aside_lines_are_judged_leaves_nothing(lake_settings, tmp_path, monkeypatch):
    """The last chunk's staging fails while the set-aside lines are judged beside it: the
    error surfaces, nothing is committed, and the rerun ingests the batch exactly once."""
    import tasks.ingest.batch as ingest

    path = write_logs(tmp_path / "logs.jsonl", 300, extra_lines=[line for line, _ in MALFORMED.values()])
    con = open_lake(lake_settings)
    ingest_file(con, write_logs(tmp_path / "warm.jsonl", 5, seed=3), "warm", CFG, "c0")  # shapes known: lines wait
    stage = ingest.stage_chunk

    def failing(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(ingest, "stage_chunk", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        ingest_file(con, path, str(path), CFG, "c1")
    assert [_count(con, t) for t in ("failure_logs", "quarantine", "ingest_batches")] == [5, 0, 1]
    monkeypatch.setattr(ingest, "stage_chunk", stage)
    result = ingest_file(con, path, str(path), CFG, "c1")
    assert (result.rows_ok, result.rows_quarantined) == (300, len(MALFORMED))
    assert _count(con, "failure_logs") == 305
