"""Every table of the lake, its Arrow schema written once.

Writers build Arrow tables against these schemas and `storage.lake.append_rows`
refuses anything else, so no column type is ever inferred from data. JSON columns
are strings holding JSON text (DuckDB's json functions read them directly; a JSON
type would tie the files to one engine). Every row carries the `cycle_id` that
wrote it.
"""
from __future__ import annotations

import pyarrow as pa

_TS = pa.timestamp("us", tz="UTC")
_JSON = pa.string()  # JSON text; see the module docstring


def _schema(*fields: tuple[str, pa.DataType], added: tuple[tuple[str, pa.DataType], ...] = ()) -> pa.Schema:
    """`added`: columns a table gained after lakes already held it; they go last, where
    `storage.lake.ensure_tables` adds them to an existing table."""
    return pa.schema([pa.field(name, kind) for name, kind in fields] + [pa.field("cycle_id", pa.string())]
                     + [pa.field(name, kind) for name, kind in added])


SCHEMAS: dict[str, pa.Schema] = {
    # one row per landed file; batch_id = sha256 of the file's bytes
    "ingest_batches": _schema(
        ("batch_id", pa.string()), ("source_uri", pa.string()), ("rows_ok", pa.int64()),
        ("rows_quarantined", pa.int64()), ("ingested_at", _TS),
        # size and mtime (local) or size and ETag (S3) of the file as ingested: a landing
        # file seen again unchanged is skipped without being read or downloaded;
        # first_line: the file's first line the batch read (past 1: the file grew by
        # appends after an earlier batch took the lines before; NULL in older lakes: 1)
        added=(("source_version", pa.string()), ("first_line", pa.int64()))),
    # log_id = sha256 of the record's canonical JSON
    "failure_logs": _schema(
        ("log_id", pa.string()), ("batch_id", pa.string()), ("line_no", pa.int64()),
        ("request_id", pa.string()), ("ts", _TS), ("model", pa.string()), ("domain", pa.string()),
        ("verifier", pa.string()), ("messages", _JSON), ("response", pa.string()),
        ("failure_kind", pa.string()), ("failure_detail", pa.string()), ("reference", _JSON),
        ("meta", _JSON),
        # chat_template_kwargs: the chat template's arguments production rendered the prompt
        # with (an object of JSON scalars, e.g. {"enable_thinking": false}); NULL: the defaults
        added=(("chat_template_kwargs", _JSON),)),
    # every rejected line verbatim; `kind` is the machine-readable class of `reason`
    "quarantine": _schema(
        ("batch_id", pa.string()), ("line_no", pa.int64()), ("raw", pa.string()),
        ("kind", pa.string()), ("reason", pa.string())),
    # one row per call the gateway logged (tasks/ingest/gateway_records.py);
    # failure_kinds: the signals it failed (tasks/ingest/signals.py), empty when none;
    # api: "chat" (chat completions; null in rows from before the column) or "responses"
    "interactions": _schema(
        ("completion_id", pa.string()), ("gateway", pa.string()), ("seq", pa.int64()), ("ts", _TS),
        ("model_version", pa.string()), ("status", pa.int32()), ("stream", pa.bool_()),
        ("latency_ms", pa.float64()), ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()),
        ("failure_kinds", pa.list_(pa.string())), ("request", _JSON), ("response", _JSON),
        ("batch_id", pa.string()), added=(("api", pa.string()),)),
    # one row per feedback on a call (the first one the gateway got for it); trainable:
    # negative with a usable correction, so it is a failure log once its call is in the lake
    "feedback": _schema(
        ("completion_id", pa.string()), ("ts", _TS), ("label", pa.string()), ("score", pa.float64()),
        ("negative", pa.bool_()), ("correction", _JSON), ("comment", pa.string()), ("trainable", pa.bool_()),
        ("batch_id", pa.string()), added=(("choice", pa.int64()),)),
    # eval_version = sha256 of the registered file; old versions stay queryable
    "eval_items": _schema(
        ("eval_set", pa.string()), ("eval_version", pa.string()), ("item_id", pa.string()),
        ("domain", pa.string()), ("prompt", pa.string()), ("messages", _JSON),
        ("reference", _JSON), ("verifier", pa.string()), ("added_at", _TS)),
    "tasks": _schema(
        ("task_id", pa.string()), ("domain", pa.string()), ("prompt", pa.string()),
        ("messages", _JSON), ("verifier", pa.string()), ("spec", _JSON),
        ("source_log_ids", pa.list_(pa.string())), ("created_at", _TS),
        # chat_template_kwargs: its log's (rollouts render the prompt with them); NULL: the defaults
        added=(("chat_template_kwargs", _JSON),)),
    # MinHash signature of each kept task, so a cycle hashes only its new logs;
    # signature = num_perm little-endian uint32, comparable only within one scheme
    "minhash_signatures": _schema(
        ("task_id", pa.string()), ("scheme", pa.string()), ("signature", pa.binary())),
    # the LSH band keys of each kept task under one banding (`MinHashConfig.banding_scheme`):
    # curation joins a new batch's keys against them in DuckDB (tasks/curate/existing.py)
    "task_bands": _schema(("task_id", pa.string()), ("banding", pa.string()), ("keys", pa.list_(pa.uint64()))),
    # eval items that tasks already in the lake copy (decontamination run the other way,
    # for sets registered after those tasks): one row per (eval_set, eval_version,
    # item_id, task_id), written once, by curation, in the commit of its tasks/decisions
    "eval_coverage": _schema(
        ("eval_set", pa.string()), ("eval_version", pa.string()), ("item_id", pa.string()),
        ("task_id", pa.string()), ("method", pa.string()), ("evidence", _JSON), ("created_at", _TS)),
    # one row per (eval set version, curate run): every task created at or before
    # tasks_through has been checked against that version (as a log when it was curated,
    # or by coverage since), so a later run checks only newer tasks, or a newer version
    "coverage_checks": _schema(
        ("eval_set", pa.string()), ("eval_version", pa.string()), ("tasks_through", _TS)),
    "decisions": _schema(
        ("log_id", pa.string()), ("decision", pa.string()), ("evidence", _JSON),
        ("task_id", pa.string()), ("decided_at", _TS)),
    "rollouts": _schema(
        ("rollout_id", pa.string()), ("task_id", pa.string()), ("policy_version", pa.string()),
        ("round", pa.int32()), ("sample_idx", pa.int32()), ("completion", pa.string()),
        ("prompt_token_ids", pa.list_(pa.int32())), ("token_ids", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float32())), ("finish_reason", pa.string())),
    "verdicts": _schema(
        ("rollout_id", pa.string()), ("verifier", pa.string()), ("reward", pa.float64()),
        ("passed", pa.bool_()), ("status", pa.string()), ("components", _JSON),
        ("detail", pa.string()), ("latency_ms", pa.float64())),
    "train_steps": _schema(
        ("policy_version", pa.string()), ("step", pa.int64()), ("loss", pa.float64()),
        ("reward_mean", pa.float64()), ("reward_std", pa.float64()), ("kl", pa.float64()),
        ("entropy", pa.float64()), ("clip_frac", pa.float64()), ("resp_len_mean", pa.float64()),
        ("groups_kept", pa.int64()), ("groups_dropped", pa.int64()), ("tokens_per_s", pa.float64()),
        # kl_reference: `kl` is to a frozen reference model (the parent), not to the rollout
        # policy; sft_*: the supervised part of the step (tasks no sample solved)
        added=(("kl_reference", pa.bool_()), ("sft_loss", pa.float64()), ("sft_tokens", pa.int64()))),
    # one row per task of a round: what its samples showed and where it went. route:
    # rl (0 < passes < samples), sft (unsolved, trained on its reference solution), skip
    # (not trained this round: solved, or unsolved with no reference), retire (solved
    # reliably: not selected again). pass_low/high: the pass rate's Wilson interval.
    "routes": _schema(
        ("task_id", pa.string()), ("round", pa.int32()), ("policy_version", pa.string()),
        ("domain", pa.string()), ("samples", pa.int32()), ("passes", pa.int32()),
        ("pass_rate", pa.float64()), ("pass_low", pa.float64()), ("pass_high", pa.float64()),
        ("route", pa.string()), ("reason", pa.string())),
    # source .. chat_template: what an imported or registered model is (NULL for a trained
    # one, which has its parent's); weights_deleted_at: when lake maintenance deleted the
    # weights of a model no one serves (tasks/release/retention.py), NULL while they exist
    "models": _schema(
        ("policy_version", pa.string()), ("parent_version", pa.string()), ("uri", pa.string()),
        ("status", pa.string()), ("reason", pa.string()), ("created_at", _TS),
        added=(("source", pa.string()), ("sha256", pa.string()), ("parameters", pa.int64()),
               ("context_length", pa.int32()), ("chat_template", pa.string()), ("weights_deleted_at", _TS))),
    # contaminated items are scored but kept out of every headline number
    "evaluations": _schema(
        ("policy_version", pa.string()), ("eval_set", pa.string()), ("eval_version", pa.string()),
        ("item_id", pa.string()), ("contaminated", pa.bool_()),
        ("domain", pa.string()), ("sample_idx", pa.int32()), ("reward", pa.float64()),
        ("passed", pa.bool_()), ("status", pa.string()), ("completion_tokens", pa.int32()),
        ("finish_reason", pa.string()),
        # settings: hash of the sampling and verifier settings (tasks.release.reuse);
        # reused_from: the cycle that sampled this row when this cycle reused it, else null
        added=(("settings", pa.string()), ("reused_from", pa.string()))),
    # the gate's decision on one candidate against production in one cycle (or
    # evaluation); `decision` holds the whole decision (interval, per-domain results)
    "gate_decisions": _schema(
        ("candidate", pa.string()), ("production", pa.string()), ("promoted", pa.bool_()),
        ("reason", pa.string()), ("decision", _JSON), ("decided_at", _TS)),
    # one row per completed stage of a cycle; a rerun of the cycle skips these stages
    "cycle_stages": _schema(
        ("stage", pa.string()), ("round", pa.int32()), ("seconds", pa.float64()),
        ("counts", _JSON), ("finished_at", _TS)),
    "cycles": _schema(
        ("started_at", _TS), ("finished_at", _TS), ("status", pa.string()),
        ("snapshot_id", pa.int64()), ("stage_seconds", _JSON), ("stage_counts", _JSON),
        ("reason", pa.string())),
}

DECISIONS = ("kept", "duplicate", "near_duplicate", "contaminated", "unverifiable")
MODEL_STATUSES = ("candidate", "production", "rejected", "retired")
ROUTES = ("rl", "sft", "skip", "retire")


def empty_table(name: str) -> pa.Table:
    return SCHEMAS[name].empty_table()
