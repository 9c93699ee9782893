"""`flywheel verify IN.jsonl [--out OUT.jsonl]`: re-score completions, e.g. after a verifier fix.

Each input line is {"verifier": ..., "spec": {...}, "completion": "..."} (or "domain"
instead of "verifier"; a spec may be JSON text holding the object, as `tasks.spec` is; an optional "prompt", the task's prompt, which math's hacking
rules read for the question's numbers; an optional "id" or "rollout_id" is echoed). Each output line is
that row's verdict (reward, passed, status, components, detail, verifier, latency_ms),
in input order. A line that is not UTF-8, not a JSON object, or whose "verifier" or
"domain" is not a string becomes a format_error verdict line saying why: one bad line
never stops the file. Blank lines are skipped. An --out path that cannot be written
(no such folder, a directory) is refused before anything is scored.

Serial by default. `--dask` fans out on DASK_SCHEDULER_ADDRESS, else on a LocalCluster
started for the call; its worker processes re-import this CLI (multiprocessing spawn),
which costs several seconds here, so for repeated use point DASK_SCHEDULER_ADDRESS at a
running scheduler.
"""
from __future__ import annotations

import codecs
import json
import logging
import os
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from storage.config_file import ConfigError
from verifiers.verdict import failed

if TYPE_CHECKING:
    from verifiers.registry import VerifierConfig


def parse_line(line: bytes, line_no: int) -> tuple[dict | None, dict | None]:
    """(row, None) for a usable line, else (None, the error verdict line)."""
    try:
        # Decoded line by line, as ingest reads logs: bad bytes cost their line only.
        row = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as error:
        reason = f"line {line_no}: not valid UTF-8 ({error.reason} at byte {error.start + 1})"
    except json.JSONDecodeError as error:
        reason = f"line {line_no}: not JSON ({error.msg} at column {error.colno})"
    else:
        if isinstance(row, dict):
            return _spec_as_object(row), None
        reason = f"line {line_no}: expected a JSON object, got {type(row).__name__}"
    verdict_line = failed("format_error", reason).to_dict()
    verdict_line.update({"verifier": "", "latency_ms": 0.0, "line": line_no})
    return None, verdict_line


def _spec_as_object(row: dict) -> dict:
    """A spec given as the lake stores it (`tasks.spec` is JSON text, and `flywheel sql
    --format json` exports it so) is read as the object it holds."""
    spec = row.get("spec")
    if isinstance(spec, str) and spec.lstrip().startswith("{"):
        try:
            return {**row, "spec": json.loads(spec)}
        except json.JSONDecodeError:
            pass  # scored as given: the verifier says the spec is no object
    return row


def read_lines(path: Path) -> list[bytes]:
    """The file's lines, undecoded (each is decoded on its own), without a leading BOM:
    it is no part of line 1 (Windows tools write one)."""
    data = path.read_bytes()
    return data.removeprefix(codecs.BOM_UTF8).splitlines()


def out_problem(out: Path) -> str | None:
    """Why verdicts cannot be written to `out`, or None: asked before any scoring, so a
    typo in the path does not cost the whole run's work."""
    if out.is_dir():
        return f"--out {out} is a directory; name a file in it"
    if not out.parent.is_dir():
        return f"--out {out}: folder {out.parent} does not exist"
    if not os.access(out.parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        return f"--out {out}: not writable"
    return None


def verify_lines(lines: list[bytes], config: VerifierConfig, *, dask: bool, batch_size: int,
                 workers: int, progress: bool) -> list[dict]:
    """One output dict per non-blank input line, in order."""
    from tasks.round.scoring import verify_rollouts, verify_row

    parsed = [parse_line(line, no) for no, line in enumerate(lines, 1) if line.strip()]
    rows = [row for row, _ in parsed if row is not None]
    if dask:
        verdicts = iter(verify_rollouts(rows, config, batch_size=batch_size, progress=progress,
                                        n_workers=workers))
    else:
        verdicts = (verify_row(row, config) for row in rows)
    return [error if row is None else next(verdicts) for row, error in parsed]


def verify_command(
    input_path: Path = typer.Argument(..., metavar="IN.jsonl", exists=True, dir_okay=False,
                                      help="rows of {verifier, spec, completion}"),
    out: Path = typer.Option(None, "--out", "-o", help="write verdict lines here (default: stdout)"),
    dask: bool = typer.Option(False, "--dask", help="fan out on Dask (DASK_SCHEDULER_ADDRESS or a LocalCluster)"),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="rows per Dask task"),
    workers: int = typer.Option(2, "--workers", min=1, help="LocalCluster worker processes (no external scheduler)"),
) -> None:
    """Verify completions from a JSONL file; one verdict line per input line, in order."""
    from tasks.cycle.config import cycle_config

    problem = out_problem(out) if out is not None else None
    if problem:
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)
    if dask:
        # This terminal is for verdicts and the progress bar, not the scheduler's diary.
        logging.getLogger("distributed").setLevel(logging.WARNING)
    try:
        config = cycle_config().verify.verifiers  # the cycle's own: domain map, sandbox limits
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    results = verify_lines(read_lines(input_path), config, dask=dask, batch_size=batch_size, workers=workers,
                           progress=dask and out is not None)
    text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in results)
    if out is None:
        sys.stdout.write(text)
        sys.stdout.flush()  # before the summary on stderr, so a terminal shows them in order
    else:
        out.write_text(text, encoding="utf-8")
    counts = Counter(r["status"] for r in results)
    passed = sum(r["passed"] for r in results)
    summary = ", ".join(f"{status} {n}" for status, n in sorted(counts.items()))
    typer.echo(f"verified {len(results)} rows: {passed} passed ({summary})", err=True)
