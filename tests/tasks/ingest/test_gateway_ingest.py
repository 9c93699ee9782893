"""Gateway files: every call and feedback lands in the lake, the failures they signal land as
failure logs through the normal ingest, and a file ingested twice (or its copy) writes nothing."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from storage.lake import open_lake
from storage.objects import ObjectStore
from tasks.ingest import batch
from tasks.ingest.batch import IngestConfig, ingest_source
from tasks.ingest.failure_rate import production_failure_rate
from tasks.ingest.gateway import derive_failure_logs, ingest_failure_logs, parse_records, read_lines
from tasks.stages import StageKey

CFG = IngestConfig(chunk_lines=1000)
PERSON = {"type": "object", "required": ["name", "age"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
WEATHER = {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}


def call(n: int, content: str | None, *, version: str = "v1", status: int = 200, tool_calls=None,
         **request) -> dict:
    message = {"role": "assistant", "content": content, **({"tool_calls": tool_calls} if tool_calls else {})}
    return {"type": "call", "id": f"chatcmpl-{n}", "seq": n, "gateway": "gw-a", "ts": f"2026-12-01T10:00:{n:02d}Z",
            "model_version": version, "status": status, "stream": n % 2 == 0, "latency_ms": 100.0 + n,
            "usage": {"prompt_tokens": 20, "completion_tokens": 5},
            "request": {"model": "flywheel", "messages": [{"role": "user", "content": f"Question {n}: what is 8*9?"}],
                        **request},
            "response": {"id": f"chatcmpl-{n}", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}}


def feedback(n: int, seq: int, *, label: str = "bad", correction: dict | None = None) -> dict:
    return {"type": "feedback", "id": f"chatcmpl-{n}", "seq": seq, "gateway": "gw-a",
            "ts": f"2026-12-01T11:00:{n:02d}Z", "label": label, "score": None, "correction": correction,
            "comment": None}


def person_format() -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}}


def weather_tool() -> dict:
    return {"tools": [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}}]}


def first_file_records() -> list[dict]:
    return [
        call(1, '{"name": "Ada", "age": 36}', **person_format()),                       # passes
        call(2, '{"name": "Ada", "age": "old"}', **person_format()),                    # json failure
        call(3, None, tool_calls=[{"id": "t", "type": "function",
                                   "function": {"name": "weather", "arguments": '{"town": "Oslo"}'}}],
             **weather_tool()),                                                         # tool_call failure
        call(4, "71"),                                                                  # corrected below
        call(5, "70", version="v2"),                                                    # bad, no correction
        call(6, "72", version="v2"),                                                    # good
        call(7, "upstream timed out", status=502),                                      # not answered
        feedback(4, 8, correction={"answer": "72"}),
        feedback(5, 9),
        feedback(6, 10, label="good"),
    ]


def write_gateway_file(folder: Path, records: list[dict], *, extra_lines: list[str] = ()) -> Path:
    seqs = [r["seq"] for r in records]
    path = folder / "gateway" / "gw-a" / f"{min(seqs)}-{max(seqs)}.jsonl.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as handle:
        for line in [json.dumps(r) for r in records] + list(extra_lines):
            handle.write(line + "\n")
    return path


def _rows(con, sql: str, params: list | None = None) -> list[tuple]:
    return con.execute(sql, params).fetchall()


def _counts(con) -> dict[str, int]:
    return {t: _rows(con, f"SELECT count(*) FROM lake.{t}")[0][0]
            for t in ("interactions", "feedback", "failure_logs", "quarantine", "ingest_batches")}


@pytest.fixture
def landing(lake_settings) -> Path:
    return Path(lake_settings.landing_uri)


def test_a_gateway_file_lands_as_interactions_feedback_and_failure_logs(lake_settings, landing):
    path = write_gateway_file(landing, first_file_records())
    con = open_lake(lake_settings)
    result = ingest_source(con, lake_settings, str(path), CFG, "c1")
    assert (result.interactions, result.feedback, result.rows_ok, result.rows_quarantined) == (7, 3, 3, 0)
    kinds = dict(_rows(con, "SELECT completion_id, failure_kinds FROM lake.interactions"))
    assert kinds == {"chatcmpl-1": [], "chatcmpl-2": ["json"], "chatcmpl-3": ["tool_call"], "chatcmpl-4": [],
                     "chatcmpl-5": [], "chatcmpl-6": [], "chatcmpl-7": []}
    assert _rows(con, "SELECT seq, model_version, status, stream, latency_ms, prompt_tokens, batch_id, cycle_id "
                      "FROM lake.interactions WHERE completion_id = 'chatcmpl-2'") == [
        (2, "v1", 200, True, 102.0, 20, result.batch_id, "c1")]
    assert _rows(con, "SELECT completion_id, label, negative, trainable FROM lake.feedback ORDER BY 1") == [
        ("chatcmpl-4", "bad", True, True), ("chatcmpl-5", "bad", True, False), ("chatcmpl-6", "good", False, False)]
    logs = _rows(con, "SELECT request_id, failure_kind, domain, reference, batch_id, model "
                      "FROM lake.failure_logs ORDER BY 1")
    assert [row[:3] for row in logs] == [("chatcmpl-2:json", "json", "json"),
                                         ("chatcmpl-3:tool_call", "tool_call", "json"),
                                         ("chatcmpl-4:feedback", "feedback", "math")]
    assert json.loads(logs[2][3]) == {"answer": "72"}  # chatcmpl-5's uncorrected feedback is no log
    batches = dict(_rows(con, "SELECT source_uri, batch_id FROM lake.ingest_batches"))
    assert set(batches) == {str(path), f"{path}#signals"} and batches[str(path)] == result.batch_id
    assert {row[4] for row in logs} == {batches[f"{path}#signals"]}
    assert _rows(con, "SELECT rows_ok, rows_quarantined FROM lake.ingest_batches WHERE batch_id = ?",
                 [result.batch_id]) == [(10, 0)]  # a gateway batch counts its records
    rates = production_failure_rate(lake_settings)
    assert rates == [
        {"model_version": "v1", "calls": 4, "failed": 3, "signal_failures": 2, "negative_feedback": 1,
         "negative_without_correction": 0, "rate": 0.75},
        {"model_version": "v2", "calls": 2, "failed": 1, "signal_failures": 0, "negative_feedback": 1,
         "negative_without_correction": 1, "rate": 0.5}]
    assert production_failure_rate(lake_settings, "v2") == rates[1:]


def test_a_correction_of_an_image_question_is_quarantined_with_why_and_its_call_lands(lake_settings, landing):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    asked = call(1, "2", messages=[{"role": "user", "content": [{"type": "text", "text": "How many cats?"}, image]}])
    path = write_gateway_file(landing, [asked, feedback(1, 2, correction={"answer": "3"})])
    con = open_lake(lake_settings)
    result = ingest_source(con, lake_settings, str(path), CFG, "c1")
    assert (result.interactions, result.feedback, result.rows_ok, result.rows_quarantined) == (1, 1, 0, 1)
    assert _rows(con, "SELECT kind, reason FROM lake.quarantine") == [
        ("wrong_type", "messages[0].content part 1 is 'image_url', not text: only text can be sampled and trained on")]


def test_the_failure_rate_narrows_to_tags_and_splits_by_one(lake_settings, landing):
    def tagged(n: int, content: str, **metadata) -> dict:
        return call(n, content, metadata=metadata) if metadata else call(n, content)

    records = [tagged(1, "72", team="a", feature="sums"), tagged(2, "71", team="a", feature="sums"),
               tagged(3, "72", team="a", feature="tax"), tagged(4, "70", team="b", feature="sums"),
               tagged(5, "70"), feedback(2, 6, correction={"answer": "72"}), feedback(4, 7), feedback(5, 8)]
    con = open_lake(lake_settings)
    ingest_source(con, lake_settings, str(write_gateway_file(landing, records)), CFG, "c1")
    rates = production_failure_rate(lake_settings, "v1", by_tag="feature")
    assert [(r["tag"], r["calls"], r["failed"]) for r in rates] == [("sums", 3, 2), ("tax", 1, 0), (None, 1, 1)]
    [team_a] = production_failure_rate(lake_settings, tags={"team": "a"})
    assert (team_a["calls"], team_a["failed"], team_a["rate"]) == (3, 1, 1 / 3) and "tag" not in team_a
    narrowed = production_failure_rate(lake_settings, tags={"team": "a", "feature": "sums"}, by_tag="team")
    assert [(r["tag"], r["calls"], r["failed"]) for r in narrowed] == [("a", 2, 1)]
    assert production_failure_rate(lake_settings, tags={"team": "c"}) == []
    # a key is read as a key: no path of its own reaches another field of the request
    assert production_failure_rate(lake_settings, tags={"team\" || '": "a"}) == []


def test_the_same_file_again_or_a_byte_identical_copy_writes_nothing(lake_settings, landing):
    path = write_gateway_file(landing, first_file_records())
    con = open_lake(lake_settings)
    first = ingest_source(con, lake_settings, str(path), CFG, "c1")
    before, snapshots = _counts(con), _rows(con, "SELECT count(*) FROM ducklake_snapshots('lake')")
    copy = path.with_name("1-10-shipped-again.jsonl.gz")
    shutil.copyfile(path, copy)
    for uri in (path, copy):
        again = ingest_source(con, lake_settings, str(uri), CFG, "c2")
        assert again.skipped and again.batch_id == first.batch_id
    assert _counts(con) == before and _rows(con, "SELECT count(*) FROM ducklake_snapshots('lake')") == snapshots


def test_records_already_in_the_lake_are_skipped_in_a_new_file(lake_settings, landing):
    records = first_file_records()
    con = open_lake(lake_settings)
    ingest_source(con, lake_settings, str(write_gateway_file(landing, records[:4])), CFG, "c1")
    # a reshipped overlap: calls 3-4 again with what came after them
    result = ingest_source(con, lake_settings, str(write_gateway_file(landing, records[2:])), CFG, "c2")
    assert (result.interactions, result.feedback, result.rows_ok) == (3, 3, 1)
    assert _counts(con)["interactions"] == 7 and _counts(con)["failure_logs"] == 3 and _counts(con)["quarantine"] == 0


def test_feedback_joins_its_call_from_an_earlier_or_a_later_file(lake_settings, landing):
    con = open_lake(lake_settings)
    calls = [call(1, "71"), call(2, "68")]
    later = [feedback(1, 3, correction={"answer": "72"}), feedback(2, 4, correction={"answer": "72"})]
    ingest_source(con, lake_settings, str(write_gateway_file(landing, calls[:1])), CFG, "c1")
    # the feedback file arrives before the second call's file
    feedback_file = ingest_source(con, lake_settings, str(write_gateway_file(landing, later)), CFG, "c1")
    assert (feedback_file.feedback, feedback_file.rows_ok) == (2, 1)
    call_file = ingest_source(con, lake_settings, str(write_gateway_file(landing, calls[1:])), CFG, "c1")
    assert (call_file.interactions, call_file.rows_ok) == (1, 1)
    logs = _rows(con, "SELECT request_id, response FROM lake.failure_logs ORDER BY 1")
    assert logs == [("chatcmpl-1:feedback", "71"), ("chatcmpl-2:feedback", "68")]
    assert _counts(con)["quarantine"] == 0


def test_an_unparsed_tool_call_and_feedback_on_a_later_choice_land_as_their_logs(lake_settings, landing):
    unparsed = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}\n</tool_call>'
    sampled = call(2, "71")
    sampled["request"]["n"] = 2
    sampled["response"]["choices"].append({"index": 1, "message": {"role": "assistant", "content": "70"},
                                           "finish_reason": "stop"})
    records = [call(1, unparsed, **weather_tool()), sampled,
               {**feedback(2, 3, correction={"answer": "72"}), "choice": 1}]
    con = open_lake(lake_settings)
    result = ingest_source(con, lake_settings, str(write_gateway_file(landing, records)), CFG, "c1")
    assert (result.interactions, result.feedback, result.rows_ok, result.rows_quarantined) == (2, 1, 2, 0)
    assert _rows(con, "SELECT request_id, failure_kind, response FROM lake.failure_logs ORDER BY 1") == [
        ("chatcmpl-1:tool_call", "tool_call", unparsed), ("chatcmpl-2:feedback", "feedback", "70")]


def test_feedback_on_a_later_choice_that_arrives_before_its_call_judges_that_choice(lake_settings, landing):
    """The lake's feedback row keeps its `choice`: when the call lands in a later file, the
    log is about the sample the user judged, not choice 0."""
    sampled = call(2, "71")
    sampled["request"]["n"] = 2
    sampled["response"]["choices"].append({"index": 1, "message": {"role": "assistant", "content": "70"},
                                           "finish_reason": "stop"})
    con = open_lake(lake_settings)
    first = ingest_source(con, lake_settings, str(write_gateway_file(
        landing, [{**feedback(2, 3, correction={"answer": "72"}), "choice": 1}])), CFG, "c1")
    assert (first.feedback, first.rows_ok) == (1, 0)  # its call is not in yet
    assert _rows(con, "SELECT choice FROM lake.feedback") == [(1,)]
    ingest_source(con, lake_settings, str(write_gateway_file(landing, [sampled])), CFG, "c1")
    assert _rows(con, "SELECT request_id, response FROM lake.failure_logs") == [("chatcmpl-2:feedback", "70")]


def test_broken_lines_are_quarantined_and_the_rest_lands(lake_settings, landing):
    bad_record = json.dumps({**call(8, "x"), "seq": "eight"})
    path = write_gateway_file(landing, [call(1, "71")],
                              extra_lines=['{"type": "call", "id": ', "[1, 2]", bad_record,
                                           json.dumps({"type": "ping", "id": "x"}),
                                           "[" * 5000 + "]" * 5000])  # a RecursionError failed the file
    con = open_lake(lake_settings)
    result = ingest_source(con, lake_settings, str(path), CFG, "c1")
    assert (result.interactions, result.rows_quarantined) == (1, 5)
    rows = _rows(con, "SELECT line_no, kind, reason, raw FROM lake.quarantine ORDER BY line_no")
    assert [r[:2] for r in rows] == [(2, "bad_json"), (3, "not_object"), (4, "bad_record"), (5, "bad_record"),
                                     (6, "too_deep")]
    assert rows[0][2].startswith("not valid JSON") and rows[0][3] == '{"type": "call", "id": '
    assert rows[2][2] == "call `seq` must be int, got str" and rows[3][2].startswith("`type` must be one of call")
    assert _rows(con, "SELECT rows_ok, rows_quarantined FROM lake.ingest_batches") == [(1, 5)]


def test_a_truncated_file_keeps_what_it_had(lake_settings, landing):
    path = write_gateway_file(landing, [call(n, str(n)) for n in range(1, 40)])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    con = open_lake(lake_settings)
    result = ingest_source(con, lake_settings, str(path), CFG, "c1")
    (kind, reason), = _rows(con, "SELECT kind, reason FROM lake.quarantine WHERE kind = 'unreadable_file'")
    assert "cannot be read past line" in reason and 0 < result.interactions < 39


def test_a_crash_between_the_two_commits_is_finished_by_the_rerun(lake_settings, landing):
    path = write_gateway_file(landing, first_file_records())
    con = open_lake(lake_settings)
    # what the first commit of the crashed run left: the derived logs, and nothing else
    records = parse_records(*read_lines(path.read_bytes()))
    logs, _ = derive_failure_logs(records.calls, records.calls, records.feedback, {}, CFG.rules.domain_map)
    batch_id = batch.file_sha256(path)
    assert ingest_failure_logs(con, lake_settings, logs, (str(path), batch_id), CFG, "c1").rows_ok == 3
    rerun = ingest_source(con, lake_settings, str(path), CFG, "c1")
    assert (rerun.interactions, rerun.rows_ok, rerun.rows_quarantined) == (7, 0, 0)  # the derived batch: known
    assert _counts(con) == {"interactions": 7, "feedback": 3, "failure_logs": 3, "quarantine": 0,
                            "ingest_batches": 2}


def test_the_cycles_ingest_stage_and_the_flows_task_route_gateway_files(lake_settings, landing, tmp_path,
                                                                        monkeypatch):
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(tmp_path / "absent.toml"))
    write_gateway_file(landing, first_file_records()[:4])
    con = open_lake(lake_settings)
    counts = batch.run(con, CFG, StageKey("c1"))
    assert counts == {"files": 1, "skipped": 0, "rows_ok": 2, "rows_quarantined": 0, "interactions": 4,
                      "feedback": 0}
    assert batch.run(con, CFG, StageKey("c2"))["skipped"] == 1  # unchanged: not even read
    later = write_gateway_file(landing, first_file_records()[4:])
    assert batch.ingest_file_task.fn(str(later), CFG, "c3")["interactions"] == 3


def test_a_gateway_file_on_s3_lands(s3_lake_settings, tmp_path):
    store, bucket = ObjectStore(s3_lake_settings), s3_lake_settings.s3_bucket
    store.ensure_bucket()
    local = write_gateway_file(tmp_path, first_file_records())
    uri = store.upload(local, bucket, "landing/gateway/gw-a/1-10.jsonl.gz")
    con = open_lake(s3_lake_settings)
    result = ingest_source(con, s3_lake_settings, uri, CFG, "c1")
    assert (result.interactions, result.feedback, result.rows_ok) == (7, 3, 3)
    assert ingest_source(con, s3_lake_settings, uri, CFG, "c2").skipped
    assert production_failure_rate(s3_lake_settings, "v1")[0]["failed"] == 3


def test_a_shipment_outside_the_landing_is_still_read_as_gateway_records(lake_settings, tmp_path):
    # copied out of its landing (or from another deployment) and named by hand: its first
    # line says what it is; read as failure logs, all ten records would be quarantined
    path = write_gateway_file(tmp_path / "copied", first_file_records())
    elsewhere = path.rename(tmp_path / "shipment.jsonl.gz")
    con = open_lake(lake_settings)
    result = ingest_source(con, lake_settings, str(elsewhere), CFG, "c1")
    assert (result.interactions, result.feedback, result.rows_ok, result.rows_quarantined) == (7, 3, 3, 0)
    # and a failure-log file beside it still goes the normal way
    logs = tmp_path / "failures.jsonl"
    logs.write_text(json.dumps({"type": "call", "messages": []}) + "\n")  # `type` alone makes no record
    as_logs = ingest_source(con, lake_settings, str(logs), CFG, "c1")
    assert (as_logs.interactions, as_logs.rows_quarantined) == (0, 1)
