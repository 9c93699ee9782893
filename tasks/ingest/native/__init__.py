"""Ingest's strict line scanner in C (`logscan.c`, built as `_logscan` by the editable
install): one pass per line that derives every feature, stored value, timestamp and
log id of a plainly well-formed log, on two threads. Anything it does not call clean
goes through DuckDB's feature query (tasks/ingest/features.py), which defines the
features."""
