"""Split a landed file into numbered lines as Arrow tables, without a Python loop per line.

A block of the file is read at once; memchr finds the newlines and the Arrow array
of lines is a zero-copy view of the block (each value keeps its line ending, which
JSON parsing skips as whitespace; `nbytes` is the length without it). Blank lines
are dropped but still counted, so `line_no` is the line's number in the file. A UTF-8
byte order mark at the start of the file is skipped (Windows tools write one).
Undecodable UTF-8 becomes a visible U+FFFD (flagged in `utf8_ok`, so validation
quarantines the line) instead of aborting the batch. A gzip cut short (a partial upload,
a writer killed mid-file) or damaged ends where its readable data ends: the lines before
land, and the reader is told where it stopped (`Cut`), so the batch says so in one
quarantine row (with what was read of the cut line), even when the data stopped between
two lines or before the first.

Only the lines themselves are decided here; what makes a line valid is tasks/ingest/checks.py.
"""
from __future__ import annotations

import codecs
import gzip
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from tasks.ingest.native import _logscan

_BOM = codecs.BOM_UTF8
# bytes.isspace(): a line of only these is blank, and blank lines separate records
_SPACE = np.array([0x20, 0x09, 0x0A, 0x0B, 0x0C, 0x0D], dtype=np.uint8)


def first_line(path: Path, limit: int = 8 << 20) -> bytes:
    """The file's first non-blank line (its first `limit` bytes at most: a gateway call
    record holds a request of up to 1 MB and its reply), gzip or plain; b"" for a file
    with none or a gzip that does not open."""
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    try:
        with (gzip.open(path, "rb") if gzipped else open(path, "rb")) as handle:
            for line in iter(lambda: handle.readline(limit), b""):
                if line.removeprefix(_BOM).strip():
                    return line.removeprefix(_BOM)
    except (OSError, EOFError):  # a corrupt gzip: the normal ingest reports what it can read
        return b""
    return b""


@dataclass(frozen=True)
class Start:
    """Where a batch's lines start in its file: at byte `offset`, the file's line `line_no`
    (a plain file that grew by appends since an earlier batch took its first lines:
    tasks/ingest/batch.py: appended_start)."""

    offset: int = 0
    line_no: int = 1


WHOLE_FILE = Start()


@dataclass(frozen=True)
class Cut:
    """Where a gzip's data stopped before its end (cut short or damaged)."""

    line_no: int
    """The first line not read whole."""
    partial: bytes
    """What was read of it: b"" when the data stopped between lines."""
    error: str


def read_chunks(path: Path, chunk_lines: int, chunk_bytes: int, start: Start = WHOLE_FILE,
                on_cut: Callable[[Cut], None] | None = None) -> Iterator[tuple[pa.Table, int]]:
    """(table of line_no, raw, nbytes, utf8_ok; bytes of the file read so far) per step,
    from `start`.

    A step holds at most `chunk_lines` non-blank lines and about `chunk_bytes` bytes.
    A gzip whose data stops early is read to that point; with `on_cut`, it is told
    where, and the cut line is its, not a last line.
    """
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
        size = probe.seek(0, 2) - start.offset
    # A plain file is read in equal blocks of at most chunk_bytes: no small last step,
    # whose fixed costs would buy few lines (its length is unknown inside a .gz).
    block_bytes = chunk_bytes if gzipped else -(-size // max(1, -(-size // chunk_bytes)))
    with (gzip.open(path, "rb") if gzipped else open(path, "rb")) as handle:
        if start.offset:
            handle.seek(start.offset)
        elif read_block(handle, len(_BOM))[0] != _BOM:  # a UTF-8 BOM (Windows tools write one) is no part of line 1
            handle.seek(0)
        next_no, consumed, carry, error = start.line_no, start.offset, b"", None
        while error is None:
            block, error = read_block(handle, block_bytes)
            if not block:
                break
            consumed += len(block)
            ends = newlines(block)
            if not len(ends):  # a line longer than a block
                carry += block
                continue
            parts = []
            if carry:  # the line begun in the previous block; the rest stays a view of this one
                head = carry + block[:ends[0] + 1]
                lines, next_no = split_lines(head, np.array([len(head) - 1]), 0, next_no)
                parts.append(lines)
            lines, next_no = split_lines(block, ends[1:] if carry else ends,
                                         int(ends[0]) + 1 if carry else 0, next_no)
            parts.append(lines)
            carry = block[ends[-1] + 1:]
            yield from _steps(pa.concat_tables(parts), chunk_lines, consumed)
        if error is not None and on_cut is not None:
            on_cut(Cut(next_no, carry, error))
        elif carry:  # the file's last line has no newline (or, unreported, the cut one)
            lines, _ = split_lines(carry, np.array([len(carry)]), 0, next_no)
            yield from _steps(lines, chunk_lines, consumed)


def read_block(handle, size: int) -> tuple[bytes, str | None]:
    """Up to `size` bytes of the file, and for a gzip cut short or damaged, what it holds
    before the damage and why it stops there. (`read` would drop the part of a block
    decoded before the error.)"""
    if not isinstance(handle, gzip.GzipFile):
        return handle.read(size), None
    parts, got = [], 0
    try:
        while got < size and (part := handle.read1(size - got)):
            parts.append(part)
            got += len(part)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        return b"".join(parts), str(exc) or type(exc).__name__
    return b"".join(parts), None


def newlines(block: bytes) -> np.ndarray:
    """Positions of b"\\n" in block (memchr, in tasks/ingest/native/logscan.c)."""
    return np.frombuffer(_logscan.newlines(block), dtype=np.int64)


def _steps(lines: pa.Table, chunk_lines: int, consumed: int) -> Iterator[tuple[pa.Table, int]]:
    for start in range(0, lines.num_rows, chunk_lines):
        yield lines.slice(start, chunk_lines), consumed


def split_lines(data: bytes, ends: np.ndarray, first: int, first_no: int) -> tuple[pa.Table, int]:
    """The non-blank lines of data[first:], which end at `ends` (newlines or the data's end).

    Returns them and the number of the line after them.
    """
    if not len(ends):
        return _decode(pa.table({"line_no": pa.array([], pa.int64()), "raw": pa.array([], pa.large_binary()),
                                 "nbytes": pa.array([], pa.int64())})), first_no
    buf = np.frombuffer(data, dtype=np.uint8)
    starts = np.concatenate(([first], ends[:-1] + 1))
    stops = _strip_carriage_returns(buf, starts, ends) if data.find(b"\r", first) >= 0 else ends
    keep = _non_blank(data, buf, starts, stops)
    # Each value runs from its start to the next line's start (line ending included),
    # so the block itself is the values buffer.
    offsets = np.append(starts, min(int(ends[-1]) + 1, len(data))).astype(np.int64)
    raw = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(starts),
                                           [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    table = pa.table({"line_no": np.arange(first_no, first_no + len(starts), dtype=np.int64),
                      "raw": raw, "nbytes": (stops - starts).astype(np.int64)})
    if not keep.all():
        table = table.filter(pa.array(keep))
    return _decode(table), first_no + len(starts)


def _strip_carriage_returns(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Line ends without trailing \\r (as bytes.rstrip(b"\\r\\n") strips them)."""
    stops = ends.copy()
    while True:
        trailing = (stops > starts) & (buf[np.maximum(stops - 1, 0)] == 0x0D)
        if not trailing.any():
            return stops
        stops[trailing] -= 1


def _non_blank(data: bytes, buf: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """Lines with a non-whitespace byte; only lines that start with whitespace are looked into."""
    keep = stops > starts
    suspects = np.flatnonzero(keep & np.isin(buf[np.minimum(starts, len(buf) - 1)], _SPACE))
    for i in suspects.tolist():
        keep[i] = not data[starts[i]:stops[i]].isspace()
    return keep


def _decode(table: pa.Table) -> pa.Table:
    raw = table.column("raw")
    try:  # validated in C++; the common case copies nothing
        text, utf8_ok = raw.cast(pa.large_string()), np.ones(table.num_rows, dtype=bool)
    except pa.ArrowInvalid:
        lines = raw.to_pylist()
        text = pa.array([line.decode("utf-8", errors="replace") for line in lines], pa.large_string())
        utf8_ok = np.array([_is_utf8(line) for line in lines], dtype=bool)
    return table.set_column(1, "raw", text).append_column("utf8_ok", pa.array(utf8_ok))


def _is_utf8(line: bytes) -> bool:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
