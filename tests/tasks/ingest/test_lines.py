"""Line splitting for ingest: numbers, blank lines, line endings and bad UTF-8, across blocks."""
from __future__ import annotations

import gzip

import pytest

from tasks.ingest.lines import newlines, read_chunks

_LINES = [b'{"a": 1}', b"", b"   ", b"\t", b'{"x": "\xff"}', b"[1,2]\r", b"abc\r\r", b"\r", b' {"b": 2}',
          b"x" * 3000, b"\xc3\xa9t\xc3\xa9", b"\x0c\x1c"]


def _expected(lines: list[bytes]) -> list[tuple[int, str, bool]]:
    """What Python's own line iteration gives: the reference the fast reader must match."""
    out = []
    for number, line in enumerate(lines, start=1):
        line = line.rstrip(b"\r\n")
        if line and not line.isspace():
            try:
                out.append((number, line.decode(), True))
            except UnicodeDecodeError:
                out.append((number, line.decode(errors="replace"), False))
    return out


def _read(path, chunk_lines: int, chunk_bytes: int) -> list[tuple[int, str, bool]]:
    out = []
    for chunk, _ in read_chunks(path, chunk_lines, chunk_bytes):
        assert chunk.num_rows <= chunk_lines
        for number, raw, nbytes, ok in zip(*(chunk[c].to_pylist() for c in ("line_no", "raw", "nbytes", "utf8_ok"))):
            line = raw.rstrip("\r\n")
            assert not ok or nbytes == len(line.encode())  # the size check sees the line without its ending
            out.append((number, line, ok))
    return out


@pytest.mark.parametrize("trailing_newline", [True, False])
@pytest.mark.parametrize("gzipped", [False, True])
def test_lines_match_python_line_iteration_at_any_block_size(tmp_path, trailing_newline, gzipped):
    lines = _LINES * 7
    data = b"\n".join(lines) + (b"\n" if trailing_newline else b"")
    path = tmp_path / ("logs.jsonl.gz" if gzipped else "logs.jsonl")
    path.write_bytes(gzip.compress(data) if gzipped else data)
    want = _expected(data.split(b"\n")[:len(lines)])
    assert any(not ok for _, _, ok in want) and want[-1][0] > len(want)  # the fixture has bad and blank lines
    for chunk_lines, chunk_bytes in [(1_000, 1 << 20), (3, 7), (1, 1), (5, 4096)]:
        assert _read(path, chunk_lines, chunk_bytes) == want, (chunk_lines, chunk_bytes)


def test_an_empty_file_has_no_lines(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    assert list(read_chunks(path, 10, 1 << 20)) == []


def test_newlines_are_found_at_every_position():
    block = b"ab\n\ncd\n" * 1000 + b"\n"
    assert newlines(block).tolist() == [i for i, byte in enumerate(block) if byte == 0x0A]
    assert newlines(memoryview(block)[1:]).tolist() == [i - 1 for i, byte in enumerate(block) if byte == 0x0A]
    assert newlines(b"no newline").tolist() == []
    assert newlines(b"").tolist() == []


def test_first_line_skips_blank_lines_reads_gzip_and_survives_a_broken_one(tmp_path):
    from tasks.ingest.lines import first_line

    plain, packed, broken = tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz", tmp_path / "c.jsonl.gz"
    plain.write_bytes(b"\n  \n{\"a\": 1}\n{\"b\": 2}\n")
    packed.write_bytes(gzip.compress(b"\xef\xbb\xbf{\"c\": 3}\n"))  # with a UTF-8 BOM
    broken.write_bytes(b"\x1f\x8b" + b"\x00" * 20)
    assert first_line(plain) == b"{\"a\": 1}\n" and first_line(packed) == b"{\"c\": 3}\n"
    assert first_line(broken) == b"" and first_line(tmp_path / "a.jsonl", limit=4) == b"{\"a\""


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_byte_order_mark_is_no_part_of_the_first_line(tmp_path, gzipped):
    data = b"\xef\xbb\xbf" + b'{"a": 1}\n{"b": "\xef\xbb\xbf"}\n'  # a BOM inside a later line is content
    path = tmp_path / ("bom.jsonl.gz" if gzipped else "bom.jsonl")
    path.write_bytes(gzip.compress(data) if gzipped else data)
    assert _read(path, 10, 4) == [(1, '{"a": 1}', True), (2, '{"b": "\ufeff"}', True)]
