"""A rich progress bar for ingesting one large file: bytes done, lines and lines/s."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn


@contextlib.contextmanager
def ingest_progress(path: Path, label: str, min_bytes: int) -> Iterator[Callable[[int, int], None]]:
    """Yields advance(lines_in_chunk, bytes_read_so_far); silent for small files."""
    size = path.stat().st_size
    if size < min_bytes:
        yield lambda lines, consumed: None
        return
    columns = (TextColumn("[bold]ingest[/bold] {task.description}"), BarColumn(),
               TextColumn("{task.fields[lines]:,} lines"), TextColumn("{task.fields[rate]:,.0f} lines/s"),
               TimeRemainingColumn())
    started = time.perf_counter()
    with Progress(*columns, console=Console(stderr=True), transient=False) as progress:
        # gzip: bytes read are uncompressed, so the bar's total is only an estimate
        bar = progress.add_task(Path(label).name, total=None if label.endswith(".gz") else size,
                                lines=0, rate=0.0)
        seen = 0

        def advance(lines: int, consumed: int) -> None:
            nonlocal seen
            seen += lines
            rate = seen / max(time.perf_counter() - started, 1e-9)
            progress.update(bar, completed=consumed, lines=seen, rate=rate)

        yield advance

