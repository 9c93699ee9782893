"""Evaluation sets in the lake: register a JSONL file as a version of a named set.

A version is the sha256 of the file's bytes, decompressed when gzipped (HumanEval ships
as .jsonl.gz) (`eval_version`): registering the same bytes again writes nothing,
changed bytes add a new version beside the old ones, which stay queryable (`SELECT ...
WHERE eval_version = ...`). Rows are `{"id", "domain", "prompt", "reference",
"verifier"?}` where the id is a string or an integer (stored as text), the prompt is a
string or chat messages (a content may be text parts) and the reference has the shape
its verifier scores (`verifiers.registry.reference_problem`); a line of HumanEval, MBPP
or GSM8K as published is read as such an item (tasks/curate/suites.py). A bad line
refuses the whole file, naming the line: a set is registered whole or not at all.
Decontamination compares against every version ever registered: an item that was in an
old version may still be in someone's evaluation.

This module does not score anything; `tasks.curate.curation` and the evaluation stage read
`eval_items`.
"""
from __future__ import annotations

import codecs
import gzip
import hashlib
import json
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import pyarrow as pa

from storage.lake import append_rows, transaction
from storage.schemas import SCHEMAS
from tasks.curate.suites import SuiteLineError, suite_item
from tasks.ingest.checks import message_text
from verifiers.registry import VerifierConfig, reference_problem


class EvalsetError(ValueError):
    """An evaluation file cannot be registered; the message names the line and the fix."""


@dataclass(frozen=True)
class Registration:
    eval_set: str
    eval_version: str
    items: int
    added: bool  # False: this exact file was registered before, nothing written


def prompt_text(prompt: str | list[dict]) -> str:
    """The text that is compared: a string prompt, or every message's content in order."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(m["content"] for m in prompt)


def _messages(prompt, where: str) -> list[dict]:
    """An item's prompt as chat messages with string contents; a content may be given as
    OpenAI's text parts (joined as ingest joins them: tasks/ingest/checks.py), never an
    image: the prompt must be the same text for every model sampled."""
    if isinstance(prompt, str) and prompt.strip():
        return [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        raise EvalsetError(f"{where}: prompt must be a non-empty string or a list of "
                           '{"role", "content"} messages')
    messages = []
    for i, message in enumerate(prompt):
        text = message_text(message) if isinstance(message, dict) and isinstance(message.get("role"), str) else None
        if text is None:
            raise EvalsetError(f"{where}: prompt[{i}] must be a {{\"role\", \"content\"}} message whose content "
                               "is a string or a list of text parts (no images or audio)")
        messages.append({"role": message["role"], "content": text})
    return messages


def parse_items(data: bytes, name: str, verifiers: VerifierConfig) -> list[dict]:
    """One dict per non-blank line, with the columns of eval_items (minus bookkeeping)."""
    rows, seen = [], set()
    # bytes, split before decoding: a bad byte is refused with its line's number. A leading
    # BOM (Windows tools write one) is no part of line 1.
    for line_no, line in enumerate(data.removeprefix(codecs.BOM_UTF8).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{name} line {line_no}"
        row = _parse_item(line, line_no, where, verifiers)
        if row["item_id"] in seen:
            raise EvalsetError(f"{where}: id {row['item_id']!r} appears twice")
        seen.add(row["item_id"])
        rows.append(row)
    if not rows:
        raise EvalsetError(f"{name}: no items")
    return rows


def _parse_item(line: bytes, line_no: int, where: str, verifiers: VerifierConfig) -> dict:
    try:
        row = json.loads(line.decode("utf-8"))
        row = (suite_item(row, line_no) or row) if isinstance(row, dict) else row
    except UnicodeDecodeError as exc:
        raise EvalsetError(f"{where}: not valid UTF-8 ({exc.reason} at byte {exc.start + 1})") from None
    except json.JSONDecodeError as exc:
        raise EvalsetError(f"{where}: not JSON ({exc.msg})") from None
    except SuiteLineError as exc:
        raise EvalsetError(f"{where}: {exc}") from None
    # bool is an int to Python, but `true` is no id: it would be stored as "True".
    if (not isinstance(row, dict) or not isinstance(row.get("id"), (str, int))
            or isinstance(row.get("id"), bool)):
        raise EvalsetError(f'{where}: expected an object with an "id" (a string or an integer), or a line '
                           "of HumanEval, MBPP or GSM8K as published")
    if not isinstance(row.get("reference"), dict):
        raise EvalsetError(f'{where}: "reference" must be a JSON object')
    item_id = str(row["id"])
    messages = _messages(row.get("prompt"), where)
    try:
        verifier = verifiers.verifier_for(row.get("domain"), row.get("verifier"))
    except ValueError as exc:
        raise EvalsetError(f"{where}: {exc}") from None
    # Checked here, not at evaluation: an item its verifier cannot score would otherwise
    # be registered and then score every sample of every model as a format_error.
    problem = reference_problem(verifier, row["reference"])
    if problem:
        raise EvalsetError(f"{where}: item {item_id!r}: reference for verifier {verifier!r} {problem}")
    return {"item_id": item_id, "domain": row.get("domain"), "prompt": prompt_text(messages),
            "messages": json.dumps(messages), "reference": json.dumps(row["reference"]), "verifier": verifier}


def register_evalset(con: duckdb.DuckDBPyConnection, name: str, path: str | Path, *,
                     cycle_id: str = "manual", verifiers: VerifierConfig | None = None) -> Registration:
    """Add FILE as the newest version of evaluation set NAME (no-op if already there)."""
    if not name or not name.strip():
        raise EvalsetError("the evaluation set needs a name")
    data = _read_file(Path(path))
    version = hashlib.sha256(data).hexdigest()
    known = con.execute("SELECT count(*) FROM lake.eval_items WHERE eval_set = ? AND eval_version = ?",
                        [name, version]).fetchone()[0]
    if known:
        return Registration(name, version, int(known), added=False)
    rows = parse_items(data, str(path), verifiers or VerifierConfig())
    now = datetime.now(timezone.utc)
    table = pa.Table.from_pylist(
        [{**r, "eval_set": name, "eval_version": version, "added_at": now, "cycle_id": cycle_id}
         for r in rows], schema=SCHEMAS["eval_items"])
    with transaction(con, f"evalset add {name} {version[:12]}"):
        append_rows(con, "eval_items", table)
    return Registration(name, version, len(rows), added=True)


def _read_file(path: Path) -> bytes:
    data = path.read_bytes()
    if data[:2] != b"\x1f\x8b":
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as exc:  # a set is registered whole or not at all
        raise EvalsetError(f"{path}: a gzip file that does not decompress ({exc}); copy it again") from None


def list_evalsets(con: duckdb.DuckDBPyConnection) -> list[dict]:
    """Every registered version, newest first within a set; `latest` marks the newest."""
    rows = con.execute("""
        SELECT eval_set, eval_version, count(*) AS items, min(added_at) AS added_at
        FROM lake.eval_items GROUP BY eval_set, eval_version
        ORDER BY eval_set, added_at DESC, eval_version""").fetchall()
    out, seen = [], set()
    for eval_set, version, items, added_at in rows:
        out.append({"eval_set": eval_set, "eval_version": version, "items": int(items),
                    "added_at": added_at, "latest": eval_set not in seen})
        seen.add(eval_set)
    return out


def all_eval_prompts(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str, str]]:
    """(eval_set, item_id, prompt) of every item of every version, each distinct prompt once."""
    return [tuple(r) for r in con.execute("""
        SELECT DISTINCT eval_set, item_id, prompt FROM lake.eval_items
        ORDER BY eval_set, item_id, prompt""").fetchall()]


def eval_prompt_versions(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str, str, list[str]]]:
    """`all_eval_prompts`, in the same order, each with the versions that hold it."""
    return [(s, i, p, list(v)) for s, i, p, v in con.execute("""
        SELECT eval_set, item_id, prompt, list(DISTINCT eval_version ORDER BY eval_version)
        FROM lake.eval_items GROUP BY eval_set, item_id, prompt
        ORDER BY eval_set, item_id, prompt""").fetchall()]
