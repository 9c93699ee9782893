"""Per-line features in two paths: a native scan for the clean lines, DuckDB for the rest.

DuckDB's feature query (tasks/ingest/features.py) defines every feature, but it
parses each line and its nested values several times over. Nearly every production
line is a plain, well-formed log, so `scan_lines` first runs the native scanner
(tasks/ingest/native/logscan.c, one strict C pass per line, on two threads): for a line it calls
clean, every feature and every failure_logs value is fixed by what it read, and
`clean_features_sql` only copies them, adding the few that need DuckDB's own
functions (the timestamp cast, the verifier of a domain). The lines it does not call
clean (bad JSON, a wrong type, a float, a repeated key...) go through the full query
(`slow_lines`). Either way the Great Expectations suite judges the feature rows;
nothing here decides validity. tests/tasks/ingest/test_scan.py holds the two paths
to the same rows.
"""
from __future__ import annotations

import binascii
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.ingest.native import _logscan
from tasks.ingest.lines import WHOLE_FILE, Cut, Start, read_chunks
from tasks.ingest.checks import LogRules

# Order of the scanner's outputs (tasks/ingest/native/logscan.c: the B_* and S_* enums). The decoded
# ts text (None here) only feeds the scanner's own conversion, which comes back as "ts".
_BYTE_COLUMNS = ("clean", "c_id", "c_meta", "c_verifier", "c_detail", "answer_ok", "code_ok", "schema_ok")
_TEXT_COLUMNS = ("request_id", None, "model", "domain", "verifier", "response", "failure_kind",
                 "failure_detail", "messages", "reference", "meta")
_FLAGS = ("clean", "answer_ok", "code_ok", "schema_ok")
LINE_COLUMNS = ["line_no", "raw", "nbytes", "utf8_ok"]
"""A chunk's own columns (tasks/ingest/lines.py), which feature_sql reads."""
_TYPE_CODES = "CASE {} WHEN 1 THEN 'VARCHAR' WHEN 2 THEN 'OBJECT' WHEN 3 THEN 'NULL' END"
_THREADS = 2
_POOL = ThreadPoolExecutor(_THREADS, thread_name_prefix="logscan")


class ScannedChunks:
    """read_chunks' steps, each through `scan_lines`, read one step ahead in a thread.

    Reading and scanning chunk i+1 (C and numpy, mostly free of the GIL) overlaps
    DuckDB's work on chunk i, so both cores stay busy. The reader scans chunk i+1
    only once chunk i is taken, so at most two scanned chunks are held at once (and
    the next block, read early to say which chunk is the file's last). The thread
    starts at once, so the first chunk is read while the caller does something else
    (hashes the file); `close` (or leaving the `with`) stops it.
    """

    def __init__(self, path: Path, rules: LogRules, chunk_lines: int, chunk_bytes: int,
                 start: Start = WHOLE_FILE) -> None:
        self.cut: Cut | None = None
        """Where a gzip's data stopped early, once every chunk has been taken."""
        self._ready: queue.Queue = queue.Queue(maxsize=1)
        self._taken = threading.Semaphore(0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, args=(path, rules, chunk_lines, chunk_bytes, start),
                                        name="ingest-read-ahead", daemon=True)
        self._thread.start()

    def _produce(self, path: Path, rules: LogRules, chunk_lines: int, chunk_bytes: int, start: Start) -> None:
        try:
            steps = read_chunks(path, chunk_lines, chunk_bytes, start, on_cut=self._found_cut)
            following = next(steps, None)
            while following is not None:
                chunk, consumed = following
                scanned = scan_lines(chunk, rules)
                del chunk, following  # not held here while the consumer works on it
                following = next(steps, None)  # read before handing over, to say which chunk is last
                if not _offer(self._ready, self._stop, (scanned, consumed, following is None)):
                    return
                del scanned
                while not self._taken.acquire(timeout=0.1):
                    if self._stop.is_set():
                        return
            _offer(self._ready, self._stop, _DONE)
        except BaseException as error:  # re-raised in the consumer, where the batch fails
            _offer(self._ready, self._stop, error)

    def _found_cut(self, cut: Cut) -> None:
        self.cut = cut

    def __iter__(self) -> Iterator[tuple[pa.Table, int, bool]]:
        """(scanned chunk, bytes read so far, whether it is the file's last chunk)"""
        while (item := self._ready.get()) is not _DONE:
            self._taken.release()
            if isinstance(item, BaseException):
                raise item
            yield item
            del item  # the caller is done with this chunk once it asks for the next

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> ScannedChunks:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_DONE = object()


def _offer(ready: queue.Queue, stop: threading.Event, item) -> bool:
    """Put `item` unless the consumer has stopped; False when it has."""
    while not stop.is_set():
        try:
            ready.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def scan_lines(chunk: pa.Table, rules: LogRules) -> pa.Table:
    """`chunk` (line_no, raw, nbytes, utf8_ok) with the scanner's columns beside it.

    Each Arrow chunk of `raw` is scanned where it lies (no copy), split over the scanning threads.
    """
    limits = (rules.max_messages, rules.max_content_chars, rules.max_response_chars)
    lengths = chunk.column("nbytes").combine_chunks().to_numpy()
    work, row = [], 0
    for raw in chunk.column("raw").chunks:
        offsets = np.frombuffer(raw.buffers()[1], dtype=np.int64)[raw.offset:raw.offset + len(raw) + 1]
        data = raw.buffers()[2] or pa.py_buffer(b"")
        for lo, hi in _thread_ranges(len(raw)):
            work.append((data, offsets[lo:hi].tobytes(), lengths[row + lo:row + hi].tobytes()))
        row += len(raw)
    parts = list(_POOL.map(lambda args: _logscan.scan(*args, *limits), work))
    table = chunk
    flags = {name: np.frombuffer(b"".join(p[0][i] for p in parts), dtype=np.uint8)
             for i, name in enumerate(_BYTE_COLUMNS)}
    for name, values in flags.items():
        table = table.append_column(name, pa.array(values.astype(bool) if name in _FLAGS else values))
    ids, rows = b"".join(p[1] for p in parts), chunk.num_rows
    # k1, k2: the digest's first 16 bytes as big-endian integers, the repeat keys of
    # tasks/ingest/chunks.py (which reads them from the hex id the same way)
    keys = np.frombuffer(ids, dtype=">u8").reshape(rows, 4)
    for i, name in enumerate(("k1", "k2")):
        table = table.append_column(name, pa.array(keys[:, i].astype(np.uint64)))
    # the hex id as DuckDB's lower(hex(...)) spells it, one C call for the whole chunk
    table = table.append_column("log_id", pa.LargeStringArray.from_buffers(
        rows, pa.py_buffer(np.arange(0, 64 * rows + 1, 64, dtype=np.int64)), pa.py_buffer(binascii.hexlify(ids))))
    stamps = np.frombuffer(b"".join(p[3] for p in parts), dtype=np.int64)
    table = table.append_column("ts", pa.array(stamps, pa.timestamp("us", tz="UTC"), mask=flags["clean"] == 0))
    for i, name in enumerate(_TEXT_COLUMNS):
        if name is None:
            continue
        table = table.append_column(name, pa.chunked_array([_text_array(p[2][i]) for p in parts],
                                                           pa.large_string()))
    return table


def _thread_ranges(rows: int) -> list[tuple[int, int]]:
    """`rows` split into one contiguous range per scanning thread (fewer for tiny chunks)."""
    bounds = sorted({rows * i // _THREADS for i in range(_THREADS + 1)})
    return list(zip(bounds[:-1], bounds[1:])) or [(0, 0)]


def _text_array(column: tuple[bytes, bytes, bytes]) -> pa.Array:
    valid, offsets, data = column
    mask = np.frombuffer(valid, dtype=np.uint8).astype(bool)
    return pa.LargeStringArray.from_buffers(len(mask), pa.py_buffer(offsets), pa.py_buffer(data),
                                            pa.py_buffer(np.packbits(mask, bitorder="little")),
                                            null_count=int(len(mask) - mask.sum()))


def clean_features_sql(rules: LogRules, source: str) -> str:
    """feature_sql's rows for the clean lines of `source` (a `scan_lines` table), copied
    from the scan; `slow_lines` picks the others for the full query."""
    verifier_of_domain = " ".join(f"WHEN '{d}' THEN '{v}'" for d, v in rules.domain_map.items())
    text = "'VARCHAR'"
    return f"""
SELECT line_no, utf8_ok, true AS is_json, true AS depth_ok, true AS digits_ok, 'OBJECT' AS top_type,
  nbytes <= {rules.max_line_bytes} AS size_ok, true AS has_required,
  'ARRAY' AS t_messages, {text} AS t_response, {text} AS t_domain, 'OBJECT' AS t_reference,
  {text} AS t_ts, {text} AS t_model, 'OBJECT' AS t_failure, {text} AS t_failure_kind,
  {_TYPE_CODES.format('c_id')} AS t_id, {_TYPE_CODES.format('c_meta')} AS t_meta,
  {_TYPE_CODES.format('c_verifier')} AS t_verifier, {_TYPE_CODES.format('c_detail')} AS t_failure_detail,
  NULL::VARCHAR AS t_chat_template_kwargs,
  true AS messages_well_typed, true AS roles_ok, true AS content_ok, true AS size_limits_ok,
  domain, verifier,
  CASE coalesce(verifier, CASE domain {verifier_of_domain} END)
    WHEN 'math' THEN answer_ok WHEN 'exact' THEN answer_ok WHEN 'code' THEN code_ok
    WHEN 'json_schema' THEN schema_ok END AS reference_ok,
  true AS ts_ok, true AS template_args_ok,
  log_id, k1, k2, request_id, ts, model,
  messages, response, failure_kind, failure_detail, reference, meta, NULL::VARCHAR AS chat_template_kwargs
FROM {source} WHERE clean
"""


def slow_lines(scanned: pa.Table) -> pa.Table:
    """The lines of a `scan_lines` table the scanner did not call clean, as feature_sql reads them."""
    return scanned.filter(pc.invert(scanned["clean"])).select(LINE_COLUMNS)
