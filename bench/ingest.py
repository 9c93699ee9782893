"""Ingest throughput: flywheel vs DuckDB's raw JSON-to-Parquet copy, same file, same run.

flywheel validates every line (features from the native scan, or DuckDB's query for
the lines it leaves, judged by the Great Expectations suite), checks repeats against
the lake, stages Parquet and commits the batch atomically;
the baseline only parses the top level and writes Parquet. Both read the same plain
.jsonl file. --chunk-mb trades memory for fewer, larger steps.

    .venv/bin/python bench/ingest.py [--logs 200000] [--runs 3] [--chunk-mb 32]
"""
from __future__ import annotations

import argparse
import gzip
import shutil
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from storage.lake import open_lake  # noqa: E402
from storage.settings import LakeSettings  # noqa: E402
from flows.demo.data.generate import DemoDataConfig, generate_demo_data  # noqa: E402
from tasks.ingest.batch import IngestConfig, ingest_file  # noqa: E402
from tasks.ingest.features import feature_sql  # noqa: E402
from tasks.ingest.lines import read_chunks  # noqa: E402
from tasks.ingest.checks import forget_verdicts  # noqa: E402


def make_file(folder: Path, logs: int) -> Path:
    """One plain .jsonl of `logs` demo failure logs (the few malformed ones the generator always plants included)."""
    generate_demo_data(folder / "demo", DemoDataConfig(logs=logs, seed=7, malformed_share=0.0,
                                                      blank_line_share=0.0, lines_per_file=logs + 1))
    out = folder / "bench.jsonl"
    with open(out, "wb") as sink:
        for part in sorted((folder / "demo" / "landing").iterdir()):
            with (gzip.open(part, "rb") if part.name.endswith(".gz") else open(part, "rb")) as src:
                shutil.copyfileobj(src, sink)
    return out


def run_flywheel(path: Path, home: Path, cfg: IngestConfig) -> tuple[float, int]:
    settings = LakeSettings(home=home)
    con = open_lake(settings)
    forget_verdicts()  # each run starts as a fresh process would, knowing only the warm-up's shapes
    warm = path.with_name("warm.jsonl")  # first call imports GX and builds the suite
    warm.write_bytes(b"".join(path.open("rb").readlines()[:50]))
    ingest_file(con, warm, "warm", cfg, "bench")
    started = time.perf_counter()
    result = ingest_file(con, path, str(path), cfg, "bench")
    return time.perf_counter() - started, result.rows_ok + result.rows_quarantined


def run_duckdb(path: Path, out: Path) -> float:
    con = duckdb.connect(config={"threads": 2})
    started = time.perf_counter()
    # maximum_depth=1: top-level fields parsed, nested values kept as JSON (as flywheel
    # stores them); deeper type inference fails on logs whose nested shapes vary.
    # ignore_errors: the baseline drops the malformed lines flywheel quarantines.
    con.execute(f"COPY (SELECT * FROM read_json('{path}', format='newline_delimited', maximum_depth=1, ignore_errors=true)) "
                f"TO '{out}' (FORMAT parquet)")
    return time.perf_counter() - started


def run_features(path: Path, cfg: IngestConfig) -> float:
    """DuckDB's full feature query alone over the file's lines already in memory: what
    every line cost before the native scan (now it derives only the lines the scan
    leaves), and alone already under half the baseline's rate."""
    con = duckdb.connect(config={"threads": 2})
    lines = [chunk for chunk, _ in read_chunks(path, cfg.chunk_lines, cfg.chunk_bytes)]
    started = time.perf_counter()
    for chunk in lines:
        con.register("lines", pa.Table.from_batches(chunk.to_batches(max_chunksize=8192)))
        con.execute(f"CREATE OR REPLACE TEMP TABLE features AS {feature_sql(cfg.rules, 'lines')}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3, help="interleaved runs of each side; the best counts")
    parser.add_argument("--chunk-mb", type=int, default=IngestConfig().chunk_bytes >> 20,
                        help="IngestConfig.chunk_bytes in MiB")
    args = parser.parse_args()
    cfg = IngestConfig(chunk_bytes=args.chunk_mb << 20, progress_min_bytes=1 << 62)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = make_file(folder, args.logs)
        lines = sum(1 for _ in path.open("rb"))
        # Interleaved, best of --runs for each: on this shared 2-core VM one run's time
        # varies by 20-40%; the best of several is the steadiest estimate of either side.
        raw_s = ours_s = float("inf")
        for run in range(args.runs):
            raw_s = min(raw_s, run_duckdb(path, folder / f"raw{run}.parquet"))
            seconds, rows = run_flywheel(path, folder / f"home{run}", cfg)
            ours_s = min(ours_s, seconds)
        features_s = run_features(path, cfg)
        assert rows == lines - 50 or rows == lines, (rows, lines)
        mb = path.stat().st_size / 1e6
        print(f"file: {lines:,} lines, {mb:,.0f} MB")
        print(f"duckdb raw COPY read_json -> parquet: {lines / raw_s:>10,.0f} lines/s ({raw_s:.2f} s)")
        print(f"flywheel ingest (validate+stage+commit, {args.chunk_mb} MiB chunks): "
              f"{lines / ours_s:>10,.0f} lines/s ({ours_s:.2f} s)")
        print(f"  for scale, DuckDB's full feature query alone: {lines / features_s:>10,.0f} lines/s "
              f"({features_s:.2f} s, {raw_s / features_s:.2f}x raw; flywheel runs it on unclean lines only)")
        print(f"ratio flywheel / duckdb raw: {raw_s / ours_s:.2f}x (goal >= 0.5x)")


if __name__ == "__main__":
    main()
