"""Ingest: landed failure-log files -> `failure_logs` rows, every bad line a `quarantine` row;
the gateway's call logs -> `interactions` and `feedback`, and the failures they signal.

Reads: files, folders or s3:// prefixes of `.jsonl` / `.jsonl.gz` (the configured
landing by default). Writes: `ingest_batches`, `failure_logs`, `quarantine`, one
DuckLake commit per file; for a gateway file also `interactions`, `feedback`.

The path of one line, in order:
1. `sources`   finds the landed files and skips those already ingested at their current
               version (size and mtime, or size and S3 ETag), without reading them.
2. `batch`     makes one file one batch (`batch_id` = sha256 of its bytes) and drives the
               rest; a file already in `ingest_batches` is reported and skipped, and
               one that grew by appends is read from its first new line (`appends`).
3. `lines`     cuts the file into numbered lines (Arrow, no Python loop per line).
4. `scan`      derives each line's features: the native scanner (`native/`) for plainly
               well-formed lines, DuckDB's feature query (`features`) for every other
               line; a differential test holds the two to identical rows.
5. `checks`    the Great Expectations suite over those features: the first failing
               expectation is the line's `kind`, worded as a `reason` a person can act on.
6. `chunks`    stages valid rows as Parquet and bad lines verbatim for `quarantine`;
               a line repeating an earlier line or a log already in the lake is
               quarantined as `repeated_log`, naming what it repeats.
`progress` draws the progress bar of a large file.

A file under `<landing>/gateway/` (or elsewhere, when its first line is a gateway record)
is the gateway's call log (`gateway_records` is its format): `gateway` writes its calls and feedback as `interactions` and `feedback` rows,
and `signals` derives the failures they show without a person (a reply breaking the
request's JSON schema, a tool call breaking its tool's schema or written as text the
server could not parse: `tool_call_signals`, negative feedback with a correction; the
JSON check they share is `json_replies`); those failure logs come back through `batch`
like any landed file.
`failure_rate` reads the production failure rate of each model version from real traffic.

A log's `log_id` is the sha256 of its canonical JSON, so the same log is one row
however often it lands.
"""
