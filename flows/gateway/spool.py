"""The gateway's durable spool: every record is on disk before its call is answered.

One SQLite file per gateway, in WAL mode with synchronous=FULL, so a committed record
survives SIGKILL and power loss. Request handlers append concurrently; a commit per
request would cap throughput at one disk flush per call, so appends go to ONE writer
thread that takes everything waiting, inserts it in one transaction and commits once
(group commit), then wakes each caller. The shipper's writes (planning and finishing
batches) go through the same thread, so SQLite never sees two writers. Reads use a
second connection: WAL lets them run while the writer commits.

`plan_batch` durably fixes which seqs form the next shipped file before a byte of it is
written (shipping.py), so a batch re-shipped after a crash is the same file under the
same key: that is what makes shipping exactly-once.

Tables (created by spool_file.py, which opens the file):
  meta(key, value)             the gateway id (made once) and the last seq handed out
  records(seq, appended_at, size, record)   the JSON of records not yet shipped
  calls(id, seq, choices)      every call ever logged: feedback joins to it after shipping;
                               choices: how many its response has (a Responses API call
                               has one; NULL: logged before spools counted them, so a
                               feedback's `choice` goes unchecked)
  feedback(id, seq, record)    every feedback ever logged; the JSON is kept so a repeated
                               feedback gets the stored one back even after shipping
  batches(first_seq, last_seq, key, shipped_at)

`prune` bounds the index: calls/feedback/batches grow by one small row per record, so
the rows of batches shipped longer ago than the feedback window go (the newest batch
always stays: it marks what is batched). Feedback for a pruned call is an unknown call.

Deliberately not here: HTTP, and the file format on the landing side (shipping.py).
"""
from __future__ import annotations

import asyncio
import json
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from flows.gateway.spool_file import connect, create_tables, load_meta, lock_exclusively
from tasks.ingest.gateway_records import GATEWAY_FOLDER, RECORD_TYPES
from tasks.ingest.responses_api import RESPONSES

# Rows deleted per writer job when pruning, so appends wait for at most one such slice.
_PRUNE_SLICE = 5000
# Batches are contiguous and planned in seq order, so the newest one bounds what is batched.
_LAST_BATCHED = "coalesce((SELECT last_seq FROM batches ORDER BY first_seq DESC LIMIT 1), 0)"


class UnknownCall(LookupError):
    """Feedback names a completion id that this spool never logged."""


class UnknownChoice(LookupError):
    """Feedback names a choice (an index) that its call's response does not have."""


@dataclass(frozen=True)
class Batch:
    """Records first_seq..last_seq, shipped as one file."""
    first_seq: int
    last_seq: int
    key: str
    """Relative to the landing prefix: gateway/<gateway id>/<first_seq>-<last_seq>.jsonl.gz."""


@dataclass(frozen=True)
class _Job:
    run: Callable[[sqlite3.Connection], Any]
    done: Future


_STOP = object()


class Spool:
    def __init__(self, folder: Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "spool.sqlite"
        self._lock_file = lock_exclusively(folder / "spool.lock")
        self._writer = connect(self.path)
        create_tables(self._writer)
        self.gateway_id, self._last_seq = load_meta(self._writer)
        self._reader = connect(self.path)
        self._read_lock = threading.Lock()
        self.commits = 0
        """Transactions the writer committed; far fewer than appends under concurrency."""
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._closing = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._write_forever, name="spool-writer", daemon=True)
        self._thread.start()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- appends (request handlers) --------------------------------------------------

    async def append_call(self, record: dict) -> int:
        """Log an answered call; once this returns, the record is committed to disk.
        Sets record["seq"] and record["gateway"] and returns the seq."""
        _check_record(record, "call")
        seq = await asyncio.wrap_future(self._enqueue(partial(self._insert_call, record)))
        record["seq"], record["gateway"] = seq, self.gateway_id
        return seq

    async def append_feedback(self, record: dict) -> tuple[dict, bool]:
        """(stored record, created). Feedback for a completion that already has some is
        not written again: the stored one comes back with created=False. Raises
        UnknownCall when no call with record["id"] was logged."""
        _check_record(record, "feedback")
        stored, created = await asyncio.wrap_future(self._enqueue(partial(self._insert_feedback, record)))
        if created:
            record["seq"], record["gateway"] = stored["seq"], stored["gateway"]
        return stored, created

    # -- the shipper's side (call from a plain thread: these block) ------------------

    def plan_batch(self, max_records: int | None = None) -> Batch | None:
        """Durably group the oldest un-batched records (all, or at most `max_records`)
        into the next batch; None when nothing is pending."""
        if max_records is not None and max_records < 1:
            raise ValueError(f"max_records must be a positive number or None (all), got {max_records!r}")
        return self._enqueue(partial(self._insert_batch, max_records)).result()

    def mark_shipped(self, batch: Batch) -> None:
        """Record that `batch` is landed and drop its records' JSON (the call and
        feedback index rows stay)."""
        self._enqueue(partial(_finish_batch, batch)).result()

    def prune(self, keep_s: float, now: float | None = None) -> dict[str, int]:
        """Drop the call ids, feedback and batch rows of batches shipped more than `keep_s`
        seconds before `now` (time.time()), the newest batch excepted; counts deleted."""
        if keep_s < 0:
            raise ValueError(f"keep_s must be >= 0 seconds, got {keep_s!r}")
        # Batches are contiguous in seq order: everything before the first batch that is
        # unshipped or recent is shipped and old (an unshipped one keeps its records).
        cutoff = self._read(
            "SELECT max(last_seq) FROM batches WHERE first_seq < (SELECT max(first_seq) FROM batches) "
            "AND first_seq < coalesce((SELECT min(first_seq) FROM batches "
            "WHERE shipped_at IS NULL OR shipped_at >= ?), 9223372036854775807)",
            ((time.time() if now is None else now) - keep_s,))[0][0]
        deleted = {"calls": 0, "feedback": 0, "batches": 0}
        if cutoff is None:
            return deleted
        for table, key, seq in (("calls", "id", "seq"), ("feedback", "id", "seq"),
                                ("batches", "first_seq", "last_seq")):
            while True:  # in slices, each its own commit: appends get the writer in between
                n = self._enqueue(partial(_delete_slice, table, key, seq, cutoff)).result()
                deleted[table] += n
                if n < _PRUNE_SLICE:
                    break
        return deleted

    def unshipped_batches(self) -> list[Batch]:
        """Batches planned but not marked shipped, oldest first: what a crash left behind."""
        rows = self._read("SELECT first_seq, last_seq, key FROM batches WHERE shipped_at IS NULL ORDER BY first_seq")
        return [Batch(*row) for row in rows]

    def batch_lines(self, batch: Batch) -> list[str]:
        """The JSON text of the batch's records, in seq order."""
        rows = self._read("SELECT record FROM records WHERE seq BETWEEN ? AND ? ORDER BY seq",
                          (batch.first_seq, batch.last_seq))
        return [text for (text,) in rows]

    def unshipped(self) -> tuple[int, int, float | None]:
        """(records not shipped yet, batched or not, their JSON bytes, time.time() of the
        oldest one's append or None): a shipped batch's records leave the table."""
        [(count, size, oldest)] = self._read(
            "SELECT count(*), coalesce(sum(size), 0), min(appended_at) FROM records")
        return count, size, oldest

    def has_call(self, completion_id: str) -> bool:
        return bool(self._read("SELECT 1 FROM calls WHERE id = ?", (completion_id,)))

    def pending(self) -> tuple[int, int, float | None]:
        """(records not in any batch, their JSON bytes, time.time() of the oldest one's
        append or None)."""
        # One statement, so the three numbers come from one snapshot.
        [(count, size, oldest)] = self._read(
            f"SELECT count(*), coalesce(sum(size), 0), min(appended_at) FROM records WHERE seq > {_LAST_BATCHED}")
        return count, size, oldest

    def close(self) -> None:
        """Finish what was handed to the writer, then close. Idempotent."""
        with self._closing:
            if self._closed:
                return
            self._closed = True
            self._jobs.put(_STOP)
        self._thread.join()
        with self._read_lock:
            self._reader.close()
        self._lock_file.close()

    # -- the writer thread -----------------------------------------------------------

    def _enqueue(self, run: Callable[[sqlite3.Connection], Any]) -> Future:
        done: Future = Future()
        # Under the lock, so no job can be queued behind _STOP and never answered.
        with self._closing:
            if self._closed:
                raise RuntimeError(f"the spool {self.path} is closed; nothing more can be appended")
            self._jobs.put(_Job(run, done))
        return done

    def _write_forever(self) -> None:
        stopping = False
        while not stopping:
            group = [self._jobs.get()]
            while True:  # everything that queued up during the last commit joins this one
                try:
                    group.append(self._jobs.get_nowait())
                except queue.Empty:
                    break
            stopping = any(job is _STOP for job in group)
            self._commit_group([job for job in group if job is not _STOP])
        self._writer.close()

    def _commit_group(self, group: list[_Job]) -> None:
        # A caller that gave up (its asyncio task was cancelled) before we start is skipped:
        # its response is never released, so its record must not be logged either.
        group = [job for job in group if job.done.set_running_or_notify_cancel()]
        if not group:
            return
        committed_seq = self._last_seq
        try:
            self._writer.execute("BEGIN IMMEDIATE")
            outcomes = [self._run_job(job) for job in group]
            if self._last_seq != committed_seq:
                self._writer.execute("UPDATE meta SET value = ? WHERE key = 'last_seq'", (str(self._last_seq),))
            self._writer.execute("COMMIT")
            self.commits += 1
        except Exception as exc:  # the disk or database failed: nothing in this group is durable
            if self._writer.in_transaction:
                self._writer.execute("ROLLBACK")
            self._last_seq = committed_seq
            for job in group:
                job.done.set_exception(exc)
            return
        for job, (ok, value) in zip(group, outcomes):
            if ok:
                job.done.set_result(value)
            else:
                job.done.set_exception(value)

    def _run_job(self, job: _Job) -> tuple[bool, Any]:
        """(True, result) or (False, exception); a failed job leaves no trace in the group."""
        seq_before = self._last_seq
        self._writer.execute("SAVEPOINT job")
        try:
            value = job.run(self._writer)
        except Exception as exc:  # one caller's bad record is that caller's error, not the group's
            self._writer.execute("ROLLBACK TO job")
            self._writer.execute("RELEASE job")
            self._last_seq = seq_before
            return False, exc
        self._writer.execute("RELEASE job")
        return True, value

    def _insert_record(self, con: sqlite3.Connection, record: dict) -> dict:
        self._last_seq += 1
        stored = {**record, "seq": self._last_seq, "gateway": self.gateway_id}
        text = json.dumps(stored, allow_nan=False, separators=(",", ":"))  # ASCII, so len is bytes
        con.execute("INSERT INTO records (seq, appended_at, size, record) VALUES (?, ?, ?, ?)",
                    (self._last_seq, time.time(), len(text), text))
        return stored

    def _insert_call(self, record: dict, con: sqlite3.Connection) -> int:
        seen = con.execute("SELECT seq FROM calls WHERE id = ?", (record["id"],)).fetchone()
        if seen:
            raise ValueError(f"call {record['id']!r} is already in the spool (seq {seen[0]}): "
                             "completion ids must be unique")
        stored = self._insert_record(con, record)
        response = record.get("response")
        choices = response.get("choices") if isinstance(response, dict) else None
        count = len(choices) if isinstance(choices, list) else 1 if record.get("api") == RESPONSES else None
        con.execute("INSERT INTO calls (id, seq, choices) VALUES (?, ?, ?)", (record["id"], stored["seq"], count))
        return stored["seq"]

    def _insert_feedback(self, record: dict, con: sqlite3.Connection) -> tuple[dict, bool]:
        known = con.execute("SELECT record FROM feedback WHERE id = ?", (record["id"],)).fetchone()
        if known:
            return json.loads(known[0]), False
        call = con.execute("SELECT choices FROM calls WHERE id = ?", (record["id"],)).fetchone()
        if not call:
            raise UnknownCall(f"no call with completion id {record['id']!r} was logged by gateway "
                              f"{self.gateway_id}, or not within its feedback window: feedback must name "
                              "the id a completion returned")
        choice = record.get("choice") or 0
        if call[0] is not None and choice >= max(call[0], 1):  # choice 0 names the call even without choices
            raise UnknownChoice(f"completion {record['id']!r} has {call[0]} choice(s), indexed from 0: "
                                f"`choice` {choice} is none of them")
        stored = self._insert_record(con, record)
        con.execute("INSERT INTO feedback (id, seq, record) VALUES (?, ?, ?)",
                    (record["id"], stored["seq"], json.dumps(stored, separators=(",", ":"))))
        return stored, True

    def _insert_batch(self, max_records: int | None, con: sqlite3.Connection) -> Batch | None:
        first, last = con.execute(
            f"SELECT min(seq), max(seq) FROM (SELECT seq FROM records WHERE seq > {_LAST_BATCHED} "
            "ORDER BY seq LIMIT ?)", (-1 if max_records is None else max_records,)).fetchone()
        if first is None:
            return None
        batch = Batch(first, last, batch_key(self.gateway_id, first, last))
        con.execute("INSERT INTO batches (first_seq, last_seq, key) VALUES (?, ?, ?)", (first, last, batch.key))
        return batch

    def _read(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._read_lock:
            if self._closed:
                raise RuntimeError(f"the spool {self.path} is closed")
            return self._reader.execute(sql, params).fetchall()


def batch_key(gateway_id: str, first_seq: int, last_seq: int) -> str:
    """Deterministic from the bounds, so a re-shipped batch overwrites its own file."""
    return f"{GATEWAY_FOLDER}{gateway_id}/{first_seq:012d}-{last_seq:012d}.jsonl.gz"


def _finish_batch(batch: Batch, con: sqlite3.Connection) -> None:
    updated = con.execute("UPDATE batches SET shipped_at = ? WHERE first_seq = ? AND last_seq = ?",
                          (time.time(), batch.first_seq, batch.last_seq)).rowcount
    if not updated:
        raise ValueError(f"no batch {batch.first_seq}-{batch.last_seq} was planned in this spool")
    con.execute("DELETE FROM records WHERE seq BETWEEN ? AND ?", (batch.first_seq, batch.last_seq))


def _delete_slice(table: str, key: str, seq: str, cutoff: int, con: sqlite3.Connection) -> int:
    return con.execute(f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} WHERE {seq} <= ? "
                       f"LIMIT {_PRUNE_SLICE})", (cutoff,)).rowcount


def _check_record(record: Any, expected_type: str) -> None:
    if not isinstance(record, dict):
        raise ValueError(f"a record must be a dict, got {type(record).__name__}")
    kind = record.get("type")
    if kind not in RECORD_TYPES:
        raise ValueError(f"record `type` must be one of {list(RECORD_TYPES)}, got {kind!r}")
    if kind != expected_type:
        raise ValueError(f"this method appends {expected_type!r} records, got a {kind!r} record; "
                         f"use append_{kind}")
    if not isinstance(record.get("id"), str) or not record["id"]:
        raise ValueError(f"a {kind} record needs `id`, the completion id as a non-empty string; "
                         f"got {record.get('id')!r}")
