"""One batch's chunks become staged rows: judge each line's feature row, stage the rest.

Per chunk (tasks/ingest/scan.py has already scanned it), the lines the native scanner
called clean are derived straight from the scan; GX judges their distinct feature
rows (`judge_lines`); valid non-repeats are written as Parquet by DuckDB and bad lines
and repeats become quarantine rows. Lines that need more care wait in a `SetAside`
for the batch's end, where DuckDB's full feature query derives them all at once and
GX judges their new shapes in one call: the lines the scanner did not call clean (rare
and small: a float, a repeated key, a broken line) and clean lines of a shape this
process has not judged yet. Up to `defer_lines` of them wait; past that a chunk
handles its own (its slow lines through the full query, its new shapes through GX).

Repeats within the batch are found per chunk; repeats of logs already in the lake are
found once, when the batch commits (`quarantine_lake_repeats`, `drop_lake_repeats`).

Memory per chunk stays in DuckDB or Arrow; only distinct feature rows and the odd bad
line reach Python.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from storage.lake import StagedRows
from storage.schemas import SCHEMAS
from tasks.ingest.features import LOG_ONLY, feature_sql
from tasks.ingest.lines import Cut
from tasks.ingest.scan import LINE_COLUMNS, clean_features_sql, slow_lines
from tasks.ingest.checks import LogRules, explain, first_failures

# Scratch tables of one batch, beside the lake: the rows being judged (a view), the
# lines left out of the Parquet, the logs staged so far (repeats across chunks are
# found by a hash join on these instead of re-reading the staged Parquet), and the
# full query's rows for lines it derives.
_ROWS, _DROP, _SEEN = "temp.main._ingest_rows", "temp.main._ingest_drop", "temp.main._ingest_seen"
_SLOW = "temp.main._ingest_slow_rows"
_LAKE_HITS = "temp.main._ingest_lake_hits"  # staged logs found in the lake at the batch's end
# Beside the log columns, the first 128 bits of log_id as two integers (k1, k2): repeats
# are found by hash joins on fixed-width keys, not on 64-character strings. A chance
# collision of 128 bits of SHA-256 needs ~2^64 logs. tasks/ingest/scan.py reads the
# same big-endian integers from the scanner's digests.
_KEYED = ("SELECT *, ('0x' || log_id[1:16])::UBIGINT AS k1, ('0x' || log_id[17:32])::UBIGINT AS k2 "
          "FROM ({})")
KEYS = ("k1", "k2")


@dataclass
class SetAside:
    """Lines (LINE_COLUMNS) waiting for the batch's end, at most `limit` of them."""

    limit: int
    tables: list[pa.Table] = field(default_factory=list)

    @property
    def room(self) -> int:
        return self.limit - sum(t.num_rows for t in self.tables)

    def add(self, lines: pa.Table) -> None:
        if lines.num_rows:
            self.tables.append(lines.select(LINE_COLUMNS))


@contextlib.contextmanager
def batch_tables(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """The batch's scratch tables, with the in-memory database as the default meanwhile:
    while the lake is the default, every statement, even one on temp tables alone, first
    asks the DuckLake catalog for its snapshot (~5 ms a statement, a dozen per chunk)."""
    default = con.execute("SELECT current_database()").fetchone()[0]
    con.execute("USE memory")
    con.execute("CREATE OR REPLACE TEMP TABLE _ingest_seen (k1 UBIGINT, k2 UBIGINT, line_no BIGINT)")
    con.execute("CREATE OR REPLACE TEMP TABLE _ingest_drop (line_no BIGINT)")
    try:
        yield
    finally:
        con.execute(f"DROP VIEW IF EXISTS {_ROWS}")
        for name in (_DROP, _SEEN, _SLOW, _LAKE_HITS):
            con.execute(f"DROP TABLE IF EXISTS {name}")
        con.execute(f"USE {default}")


@dataclass(frozen=True)
class JudgedChunk:
    """A chunk whose lines are judged (its rows in the _ROWS view), not yet staged."""

    lines: pa.Table
    n_rows: int
    """Rows of _ROWS that are this chunk's to stage (not held for the batch's end)."""
    bad_lines: dict[int, str]
    held: list[int]


def judge_chunk(con: duckdb.DuckDBPyConnection, chunk: pa.Table, rules: LogRules,
                verdicts: dict[tuple, str | None], aside: SetAside) -> JudgedChunk:
    """Derive and judge one scanned chunk's rows. Lines that fit in `aside` wait there;
    `verdicts` carries GX's verdicts between chunks and batches."""
    slow = slow_lines(chunk)
    waits = slow.num_rows <= aside.room
    # Several record batches let DuckDB scan the chunk on all its threads.
    con.register("_ingest_chunk", pa.Table.from_batches(chunk.to_batches(max_chunksize=8192)))
    rows = clean_features_sql(rules, "_ingest_chunk")
    if waits:
        aside.add(slow)
    else:
        con.register("_ingest_slow", slow)
        con.execute(f"CREATE OR REPLACE TEMP TABLE _ingest_slow_rows AS "
                    f"{_KEYED.format(feature_sql(rules, '_ingest_slow'))}")
        con.unregister("_ingest_slow")
        rows = f"{rows} UNION ALL BY NAME SELECT * FROM {_SLOW}"
    con.execute(f"CREATE OR REPLACE TEMP VIEW _ingest_rows AS {rows}")
    bad_lines, held = judge_lines(con, rules, verdicts, hold_at_most=aside.room)
    aside.add(chunk.filter(pc.is_in(chunk["line_no"], value_set=pa.array(held, pa.int64()))))
    n_rows = chunk.num_rows - (slow.num_rows if waits else 0) - len(held)
    return JudgedChunk(chunk, n_rows, bad_lines, held)


def stage_chunk(con: duckdb.DuckDBPyConnection, judged: JudgedChunk, staged: StagedRows, batch_id: str,
                cycle_id: str, rules: LogRules) -> tuple[int, int]:
    """Stage a judged chunk; (rows kept, rows quarantined)."""
    try:
        return _stage_judged(con, judged.lines, judged.n_rows, judged.bad_lines, judged.held, staged,
                             batch_id, cycle_id, rules)
    finally:
        con.unregister("_ingest_chunk")


def judge_set_aside(cursor: duckdb.DuckDBPyConnection, aside: SetAside, rules: LogRules,
                    verdicts: dict[tuple, str | None]) -> tuple[pa.Table, pa.Table] | None:
    """(lines, full rows) of the set-aside lines, derived by the full feature query, with
    their new shapes judged into `verdicts` in one GX call. It needs only its own cursor,
    so it runs in a thread while the connection stages the last chunk."""
    if not aside.tables:
        return None
    lines = pa.concat_tables(aside.tables)
    cursor.register("_ingest_aside", lines)
    rows = cursor.sql(_KEYED.format(feature_sql(rules, "_ingest_aside"))).to_arrow_table()
    features = rows.drop_columns([*LOG_ONLY, *KEYS, "line_no"])
    keys = list(zip(*(column.to_pylist() for column in features.columns)))
    unseen = list({key: i for i, key in enumerate(keys) if key not in verdicts}.values())
    if unseen:
        failures = first_failures(features.take(unseen).to_pandas(), rules)
        verdicts.update((keys[i], failures.get(position)) for position, i in enumerate(unseen))
    return lines, rows


def stage_set_aside(con: duckdb.DuckDBPyConnection, judged: tuple[pa.Table, pa.Table] | None, staged: StagedRows,
                    batch_id: str, cycle_id: str, rules: LogRules,
                    verdicts: dict[tuple, str | None]) -> tuple[int, int]:
    """Stage what `judge_set_aside` derived; (rows kept, rows quarantined)."""
    if judged is None:
        return 0, 0
    lines, rows = judged
    con.register("_ingest_aside_rows", rows)
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE _ingest_slow_rows AS SELECT * FROM _ingest_aside_rows")
    finally:
        con.unregister("_ingest_aside_rows")
    con.execute(f"CREATE OR REPLACE TEMP VIEW _ingest_rows AS SELECT * FROM {_SLOW}")
    bad_lines, _ = judge_lines(con, rules, verdicts)  # every shape is known by now: no GX call
    return _stage_judged(con, lines, lines.num_rows, bad_lines, [], staged, batch_id, cycle_id, rules)


def _stage_judged(con: duckdb.DuckDBPyConnection, lines: pa.Table, n_rows: int, bad_lines: dict[int, str],
                  held: list[int], staged: StagedRows, batch_id: str, cycle_id: str,
                  rules: LogRules) -> tuple[int, int]:
    """Stage the `n_rows` judged rows of _ROWS (those not `held` for later): valid
    non-repeats as logs, the rest (raw from `lines`) as quarantine."""
    _set_lines(con, [*bad_lines, *held])
    repeats = find_repeats(con)
    _set_lines(con, repeats, keep=True)
    kept = f"SELECT * FROM {_ROWS} WHERE line_no NOT IN (SELECT line_no FROM {_DROP})"
    staged.stage_query("failure_logs", f"""
        SELECT log_id, {_literal(batch_id)} AS batch_id, line_no, request_id, ts, model, domain, verifier,
               messages, response, failure_kind, failure_detail, reference, meta, {_literal(cycle_id)} AS cycle_id,
               chat_template_kwargs
        FROM ({kept})""")
    con.execute(f"INSERT INTO {_SEEN} SELECT k1, k2, line_no FROM ({kept})")
    con.execute(f"DROP VIEW {_ROWS}")
    quarantined = _quarantine_rows(lines, bad_lines, repeats, batch_id, cycle_id, rules)
    staged.stage("quarantine", quarantined)
    return n_rows - len(bad_lines) - len(repeats), quarantined.num_rows


def judge_lines(con: duckdb.DuckDBPyConnection, rules: LogRules, verdicts: dict[tuple, str | None], *,
                hold_at_most: int = 0) -> tuple[dict[int, str], list[int]]:
    """({line_no: kind} for the lines of _ROWS the GX suite rejects, lines held unjudged).

    Every expectation of the suite is row-wise over the features, so lines with equal
    feature rows share one verdict: GX validates each distinct feature row (tens per
    batch, not tens of thousands of lines) and its verdict applies to all its lines.
    A feature row already judged (`verdicts`) is not validated again. A GX call costs
    ~0.25 s however few its rows, so when new feature rows cover at most
    `hold_at_most` lines (the odd line of a new shape), those lines are held instead.
    """
    groups = con.sql(f"""SELECT * EXCLUDE (line_no), count(*) AS n_lines, list(line_no) AS line_nos
        FROM (SELECT * EXCLUDE ({', '.join([*LOG_ONLY, *KEYS])}) FROM {_ROWS}) GROUP BY ALL""").to_arrow_table()
    features = groups.drop_columns(["n_lines", "line_nos"])
    keys = list(zip(*(column.to_pylist() for column in features.columns)))
    unseen = [i for i, key in enumerate(keys) if key not in verdicts]
    line_nos = groups.column("line_nos")
    if unseen and sum(groups.column("n_lines")[i].as_py() for i in unseen) <= hold_at_most:
        return _lines_of(keys, line_nos, verdicts), [n for i in unseen for n in line_nos[i].as_py()]
    if unseen:
        failures = first_failures(features.take(unseen).to_pandas(), rules)
        verdicts.update((keys[i], failures.get(position)) for position, i in enumerate(unseen))
    return _lines_of(keys, line_nos, verdicts), []


def _lines_of(keys: list[tuple], line_nos: pa.ChunkedArray, verdicts: dict[tuple, str | None]) -> dict[int, str]:
    """{line_no: kind} of the groups judged invalid."""
    return {line_no: kind for i, key in enumerate(keys) if (kind := verdicts.get(key))
            for line_no in line_nos[i].as_py()}


def _set_lines(con: duckdb.DuckDBPyConnection, line_nos, *, keep: bool = False) -> None:
    """Make _DROP hold `line_nos` (added to what it holds when `keep`)."""
    if not keep:
        con.execute(f"DELETE FROM {_DROP}")
    if line_nos:  # one list parameter: registering an Arrow table costs ~6 ms a call
        con.execute(f"INSERT INTO {_DROP} SELECT unnest(?::BIGINT[])", [list(line_nos)])


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# Valid lines identical to an earlier valid line of these rows or to one staged from an
# earlier chunk of this batch. Logs already in the lake are looked up once per batch
# (`unstage_lake_repeats`): a probe of the lake per chunk costs a scan of its log ids each time.
_REPEATS_SQL = f"""
WITH ids AS MATERIALIZED (SELECT k1, k2, line_no FROM {_ROWS}
                          WHERE line_no NOT IN (SELECT line_no FROM {_DROP})),
-- a hash aggregate, not a window: only ids seen twice need their first line
twice AS (SELECT k1, k2, min(line_no) AS first_line FROM ids GROUP BY k1, k2 HAVING count(*) > 1)
SELECT c.line_no, coalesce(s.line_no, t.first_line) AS first_line
FROM ids c
LEFT JOIN twice t USING (k1, k2)
LEFT JOIN {_SEEN} s USING (k1, k2)
WHERE s.line_no IS NOT NULL OR t.first_line <> c.line_no
"""


def find_repeats(con: duckdb.DuckDBPyConnection) -> dict[int, str]:
    """{line_no: reason} for valid lines repeating a line of this batch staged before them."""
    return {line_no: f"identical to line {first_line} of this file"
            for line_no, first_line in con.sql(_REPEATS_SQL).fetchall()}


def quarantine_lake_repeats(con: duckdb.DuckDBPyConnection, staged: StagedRows,
                            reread: Callable[[], Iterator[pa.Table]], batch_id: str, cycle_id: str) -> int:
    """Stage quarantine rows for the staged logs identical to a log already in the lake;
    how many there are. `drop_lake_repeats` then takes them out of the batch's logs.

    One probe of the lake per batch, over every log staged. A hit is rare (a log
    exported twice), so it may cost more: its verbatim line is read again from the file
    (`reread`: the batch's chunks, as tasks/ingest/lines.py reads them).
    """
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _ingest_lake_hits AS
        WITH staged AS (SELECT printf('%016x%016x', k1, k2) AS prefix, line_no FROM {_SEEN})
        SELECT s.line_no, f.log_id, f.batch_id, f.line_no AS lake_line FROM staged s
        JOIN (SELECT left(log_id, 32) AS prefix, any_value(log_id) AS log_id, any_value(batch_id) AS batch_id,
                     min(line_no) AS line_no FROM lake.failure_logs
              WHERE left(log_id, 32) IN (SELECT prefix FROM staged) GROUP BY prefix) f USING (prefix)""")
    hits, last = con.execute(f"SELECT count(*), max(line_no) FROM {_LAKE_HITS}").fetchone()
    for lines in reread() if hits else ():
        if lines.num_rows and lines["line_no"][0].as_py() > last:
            break
        con.register("_ingest_reread", lines)
        try:
            staged.stage_query("quarantine", f"""
                SELECT {_literal(batch_id)} AS batch_id, h.line_no, rtrim(l.raw, chr(13) || chr(10)) AS raw,
                       'repeated_log' AS kind,
                       'identical to log ' || left(h.log_id, 16) || ' already ingested (batch '
                         || left(h.batch_id, 16) || ', line ' || h.lake_line || ')' AS reason,
                       {_literal(cycle_id)} AS cycle_id
                FROM _ingest_reread l JOIN {_LAKE_HITS} h USING (line_no) ORDER BY h.line_no""")
        finally:
            con.unregister("_ingest_reread")
    return hits


def stage_cut(staged: StagedRows, cut: Cut, batch_id: str, cycle_id: str) -> int:
    """Stage the quarantine row that says where a gzip's data stopped early (1 row).
    Without it, data cut between two lines, or damaged before the first, would land as
    a smaller (or empty) batch with no word of what was lost."""
    where = f"before line {cut.line_no}" if not cut.partial else f"inside line {cut.line_no}"
    staged.stage("quarantine", pa.Table.from_pylist([{
        "batch_id": batch_id, "line_no": cut.line_no, "raw": cut.partial.decode("utf-8", "replace"),
        "kind": "gzip_cut", "cycle_id": cycle_id,
        "reason": (f"the gzip data ends {where} ({cut.error}): the file was cut short or damaged; the lines "
                   "before it landed; copy the file again and ingest the copy")}], schema=SCHEMAS["quarantine"]))
    return 1


def drop_lake_repeats(con: duckdb.DuckDBPyConnection, batch_id: str) -> None:
    """Delete the lake repeats `quarantine_lake_repeats` found from this batch's logs,
    in the transaction that registers them (a DuckLake delete file: the staged
    Parquet is not rewritten, and no snapshot ever shows the repeats)."""
    if con.execute(f"SELECT count(*) FROM {_LAKE_HITS}").fetchone()[0]:
        con.execute(f"DELETE FROM lake.failure_logs WHERE batch_id = ? "
                    f"AND line_no IN (SELECT line_no FROM {_LAKE_HITS})", [batch_id])


def _quarantine_rows(lines: pa.Table, bad_lines: dict[int, str], repeats: dict[int, str],
                     batch_id: str, cycle_id: str, rules: LogRules) -> pa.Table:
    if not bad_lines and not repeats:
        return SCHEMAS["quarantine"].empty_table()
    wanted = pa.array(sorted(set(bad_lines) | set(repeats)), pa.int64())
    lines = lines.filter(pc.is_in(lines["line_no"], value_set=wanted))
    rows = []
    for line_no, raw in zip(lines["line_no"].to_pylist(), lines["raw"].to_pylist(), strict=True):
        raw = raw.rstrip("\r\n")  # the chunk keeps each line's ending; the verbatim line has none
        kind = bad_lines.get(line_no, "repeated_log")
        reason = repeats[line_no] if kind == "repeated_log" else explain(kind, raw, rules)
        rows.append({"batch_id": batch_id, "line_no": line_no, "raw": raw, "kind": kind,
                     "reason": reason, "cycle_id": cycle_id})
    return pa.Table.from_pylist(rows, schema=SCHEMAS["quarantine"])
