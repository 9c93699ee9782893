"""Gateway files -> `interactions` and `feedback` rows, and failure logs through the normal ingest.

A file the gateway shipped (`<landing>/gateway/<gateway id>/<first_seq>-<last_seq>.jsonl.gz`,
format: tasks/ingest/gateway_records.py) is one batch, `batch_id` = sha256 of its bytes,
as for a failure-log file: a file shipped twice, under any name, is ingested once. Each
line is a call or a feedback record; any other line is a `quarantine` row with its reason.
A record already in the lake (same completion id) is skipped, so overlapping files add
only what is new.

The failure logs the records signal (tasks/ingest/signals.py) are not written here: they
are written to a JSONL file and ingested by `batch.ingest_file` like any landed file, so
the GX suite, dedup and everything downstream apply unchanged. That makes two commits, in
this order:

1. the derived failure logs, as a batch of their own (source `<file uri>#signals`);
2. the calls, feedback and broken lines, with the file's `ingest_batches` row.

The second commit marks the file done (a later scan skips it unread), so a crash between
the two leaves it not done: the rerun reads it again, derives the same logs from the same
file and lake, byte for byte (fixed order, fixed JSON), and the first commit is skipped by
its sha. Had the lake changed in between (a call's file ingested meanwhile), the rerun's
file differs and the normal ingest quarantines the logs already in as `repeated_log`:
nothing is lost or doubled either way. Deriving from lake rows after the second commit
would need a "done" marker of its own; this order needs none.

A feedback's call is in the same file or in the lake. Files may be ingested out of seq
order (a scan lists names), so a feedback may arrive before its call: its row is written
at once and its failure log when its call arrives; whichever batch completes the pair
derives it, about the `choice` the feedback names (kept in its `feedback` row).

Not here: validating failure logs (the normal ingest does), concurrent ingests of files
holding the same records (each may write them once), and scoring anything.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import random
import tempfile
import time
import zlib
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import pyarrow as pa

from storage.lake import append_rows, transaction
from storage.schemas import SCHEMAS
from storage.settings import LakeSettings
from tasks.ingest.batch import BatchResult, IngestConfig, ingest_file
from tasks.ingest.gateway_records import FEEDBACK_FIELDS, RECORD_TYPES, feedback_problem
from tasks.ingest.responses_api import RESPONSES, chat_view, request_problem
from tasks.ingest.signals import (call_failures, feedback_failure, feedback_row, interaction_row, is_trainable,
                                  json_text, parse_ts)
from tasks.ingest.sources import local_version

CALL_FIELDS = {"gateway": str, "seq": int, "model_version": str, "request": dict, "status": int}


@dataclass
class GatewayRecords:
    """One file's records, the first of each completion id, and its broken lines."""

    calls: dict[str, dict] = field(default_factory=dict)
    feedback: dict[str, dict] = field(default_factory=dict)
    broken: list[dict] = field(default_factory=list)
    """`quarantine` rows without `batch_id` and `cycle_id`."""


def ingest_gateway_file(con: duckdb.DuckDBPyConnection, settings: LakeSettings, path: Path, source_uri: str,
                        cfg: IngestConfig, cycle_id: str, *, source_version: str | None = None) -> BatchResult:
    """Ingest one gateway file as one batch (see the module docstring); `source_version`
    as for `batch.ingest_file`."""
    started = time.perf_counter()
    source_version = source_version or local_version(path)
    data = path.read_bytes()  # a shipment is small (one spool segment): read whole
    batch_id = hashlib.sha256(data).hexdigest()
    records = parse_records(*read_lines(data))
    # Several writers on a PostgreSQL catalog can conflict at commit; the batch is redone.
    for attempt in range(cfg.commit_attempts):
        if con.execute("SELECT count(*) FROM lake.ingest_batches WHERE batch_id = ?", [batch_id]).fetchone()[0]:
            return BatchResult(batch_id, source_uri, 0, 0, True, time.perf_counter() - started)
        try:
            counts = _ingest(con, settings, records, (source_uri, source_version, batch_id), cfg, cycle_id)
            return BatchResult(batch_id, source_uri, skipped=False, seconds=time.perf_counter() - started, **counts)
        except duckdb.TransactionException:
            if attempt + 1 == cfg.commit_attempts:
                raise
        time.sleep(random.uniform(0.05, 0.5) * (attempt + 1))
    raise AssertionError("unreachable")


def _ingest(con: duckdb.DuckDBPyConnection, settings: LakeSettings, records: GatewayRecords,
            source: tuple[str, str, str], cfg: IngestConfig, cycle_id: str) -> dict:
    source_uri, source_version, batch_id = source
    new_calls = _without(records.calls, _lake_ids(con, "interactions", list(records.calls)))
    new_feedback = _without(records.feedback, _lake_ids(con, "feedback", list(records.feedback)))
    elsewhere = [i for i in new_feedback if i not in records.calls]
    known_calls = {**lake_calls(con, elsewhere), **records.calls}
    logs, kinds = derive_failure_logs(new_calls, known_calls, new_feedback, lake_feedback(con, list(new_calls)),
                                      cfg.rules.domain_map)
    derived = ingest_failure_logs(con, settings, logs, (source_uri, batch_id), cfg, cycle_id)
    rows = {"interactions": [interaction_row(call, kinds[i]) for i, call in new_calls.items()],
            "feedback": [feedback_row(fb, is_trainable(fb)) for fb in new_feedback.values()],
            "quarantine": records.broken}
    with transaction(con, message=f"ingest gateway batch {batch_id[:16]} from {source_uri}"):
        for table, table_rows in rows.items():
            append_rows(con, table, pa.Table.from_pylist(
                [{**row, "batch_id": batch_id, "cycle_id": cycle_id} for row in table_rows], schema=SCHEMAS[table]))
        append_rows(con, "ingest_batches", pa.Table.from_pylist([{
            "batch_id": batch_id, "source_uri": source_uri, "rows_ok": len(new_calls) + len(new_feedback),
            "rows_quarantined": len(records.broken), "ingested_at": datetime.now(timezone.utc),
            "cycle_id": cycle_id, "source_version": source_version, "first_line": 1}],
            schema=SCHEMAS["ingest_batches"]))
    return {"rows_ok": derived.rows_ok if derived else 0,
            "rows_quarantined": len(records.broken) + (derived.rows_quarantined if derived else 0),
            "interactions": len(new_calls), "feedback": len(new_feedback)}


def derive_failure_logs(new_calls: dict[str, dict], known_calls: dict[str, dict], new_feedback: dict[str, dict],
                        waiting: dict[str, dict], domains: Collection[str]) -> tuple[list[dict], dict[str, list[str]]]:
    """The failure logs a batch completes, in a fixed order, and each new call's failure kinds.

    new_calls, new_feedback: the batch's records not yet in the lake, in file order;
    known_calls: every call a new feedback may be about (the file's and the lake's);
    waiting: feedback already in the lake whose call is new in this batch.
    """
    logs, kinds = [], {}
    for completion_id, call in new_calls.items():
        failures = call_failures(chat_view(call))
        kinds[completion_id] = list(dict.fromkeys(f["failure"]["kind"] for f in failures))
        logs += failures
    pairs = [(fb, known_calls.get(i)) for i, fb in new_feedback.items()]
    pairs += [(waiting[i], call) for i, call in new_calls.items() if i in waiting]
    for fb, call in pairs:
        log = feedback_failure(fb, chat_view(call), domains) if call is not None else None
        if log is not None:
            logs.append(log)
    return logs, kinds


def ingest_failure_logs(con: duckdb.DuckDBPyConnection, settings: LakeSettings, logs: list[dict],
                        source: tuple[str, str], cfg: IngestConfig, cycle_id: str) -> BatchResult | None:
    """Ingest derived logs through the normal path, as a batch of their own (None: no logs).
    The file's bytes are a function of `logs` alone, so the same logs are the same batch."""
    if not logs:
        return None
    source_uri, batch_id = source
    with tempfile.TemporaryDirectory(dir=settings.home) as tmp:
        path = Path(tmp) / f"{batch_id}.jsonl"
        path.write_bytes("".join(json_text(log) + "\n" for log in logs).encode())
        return ingest_file(con, path, f"{source_uri}#signals", cfg, cycle_id, source_version=batch_id)


def read_lines(data: bytes) -> tuple[list[bytes], str | None]:
    """The file's lines, and why it cannot be read to its end (None: it can). Gzip is
    told by its magic bytes: a downloaded object's local name says nothing."""
    if data[:2] != b"\x1f\x8b":
        return data.split(b"\n"), None
    lines: list[bytes] = []
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as handle:
            for line in handle:
                lines.append(line)
    except (OSError, EOFError, zlib.error) as exc:  # a truncated or corrupt gzip keeps what it had
        return lines, f"{type(exc).__name__}: {exc}"
    return lines, None


def parse_records(lines: list[bytes], unreadable: str | None = None) -> GatewayRecords:
    """Records by completion id (a repeat within the file is the same record shipped again)
    and every line that is not a record, as a quarantine row with its reason."""
    records = GatewayRecords()
    for line_no, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        text, record, kind, reason = parse_line(raw)
        if record is None:
            records.broken.append({"line_no": line_no, "raw": text, "kind": kind, "reason": reason})
        else:
            (records.calls if record["type"] == "call" else records.feedback).setdefault(record["id"], record)
    if unreadable:
        records.broken.append({"line_no": len(lines) + 1, "raw": "", "kind": "unreadable_file",
                               "reason": f"the file cannot be read past line {len(lines)}: {unreadable}"})
    return records


def parse_line(raw: bytes) -> tuple[str, dict | None, str | None, str | None]:
    """(the line as text, its record or None, the quarantine kind and reason when None)."""
    try:
        text = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        return raw.decode("utf-8", "replace").rstrip("\r\n"), None, "bad_encoding", f"not valid UTF-8: {exc.reason}"
    try:
        record = json.loads(text)
    except ValueError as exc:
        return text, None, "bad_json", f"not valid JSON: {exc}"
    except RecursionError:  # no gateway writes this (it refuses such a body): a file made elsewhere
        return text, None, "too_deep", "JSON nested too deeply for Python's parser"
    if not isinstance(record, dict):
        return text, None, "not_object", f"expected a JSON object per line, got a JSON {type(record).__name__}"
    problem = record_problem(record)
    return (text, None, "bad_record", problem) if problem else (text, record, None, None)


def record_problem(record: dict) -> str | None:
    """Why a JSON object is not a call or feedback record of the gateway's format, or None."""
    kind = record.get("type")
    if kind not in RECORD_TYPES:
        return f"`type` must be one of {', '.join(RECORD_TYPES)}; got {kind!r}"
    try:
        if parse_ts(record.get("ts")).tzinfo is None:
            return f"`ts` {record['ts']!r} needs a UTC offset (e.g. 2026-11-30T12:00:00Z)"
    except (TypeError, ValueError):
        return f"`ts` {record.get('ts')!r} is not an ISO-8601 timestamp"
    if kind == "feedback":
        problem = feedback_problem({name: record.get(name) for name in FEEDBACK_FIELDS})
        return problem and f"feedback: {problem}"
    if not isinstance(record.get("id"), str) or not record["id"]:
        return "call needs `id`: the completion id"
    for name, expected in CALL_FIELDS.items():
        value = record.get(name)
        if not isinstance(value, expected) or isinstance(value, bool):
            return f"call `{name}` must be {expected.__name__}, got {type(value).__name__}"
    if record.get("api") not in (None, RESPONSES):
        return f"call `api` must be {RESPONSES!r} or absent (a chat completion), got {record['api']!r}"
    if record.get("api") == RESPONSES:
        problem = request_problem(record["request"])
        if problem:
            return f"call `request` (Responses API): {problem}"
    elif not isinstance(record["request"].get("messages"), list):
        return "call `request.messages` must be an array"
    if record.get("response") is not None and not isinstance(record["response"], dict):
        return "call `response` must be an object or null"
    return None


def lake_calls(con: duckdb.DuckDBPyConnection, ids: list[str]) -> dict[str, dict]:
    """The call records in `interactions` with these completion ids, rebuilt as records."""
    rows = _lake_rows(con, "interactions",
                      "completion_id, gateway, seq, ts, model_version, status, request, response, api", ids)
    return {row[0]: {"type": "call", "id": row[0], "gateway": row[1], "seq": row[2], "ts": _iso(row[3]),
                     "model_version": row[4], "status": row[5], "request": json.loads(row[6]),
                     "response": None if row[7] is None else json.loads(row[7]),
                     **({"api": row[8]} if row[8] else {})} for row in rows}


def lake_feedback(con: duckdb.DuckDBPyConnection, ids: list[str]) -> dict[str, dict]:
    """The feedback records in `feedback` about these completion ids, rebuilt as records."""
    rows = _lake_rows(con, "feedback", "completion_id, ts, label, score, correction, comment, choice", ids)
    return {row[0]: {"type": "feedback", "id": row[0], "ts": _iso(row[1]), "label": row[2], "score": row[3],
                     "correction": None if row[4] is None else json.loads(row[4]), "comment": row[5],
                     "choice": row[6] or 0}  # null: a row from before the column, which took choice 0
            for row in rows}


def _lake_ids(con: duckdb.DuckDBPyConnection, table: str, ids: list[str]) -> set[str]:
    return {row[0] for row in _lake_rows(con, table, "completion_id", ids)}


def _lake_rows(con: duckdb.DuckDBPyConnection, table: str, columns: str, ids: list[str]) -> list[tuple]:
    if not ids:
        return []
    con.register("_gateway_ids", pa.table({"completion_id": pa.array(ids, pa.string())}))
    try:
        return con.execute(f"SELECT {columns} FROM lake.{table} "
                           "WHERE completion_id IN (SELECT completion_id FROM _gateway_ids) "
                           "ORDER BY completion_id").fetchall()
    finally:
        con.unregister("_gateway_ids")


def _without(records: dict[str, dict], known: set[str]) -> dict[str, dict]:
    return {i: record for i, record in records.items() if i not in known}


def _iso(ts: datetime) -> str:
    return ts.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
