"""Growth: ingest + curate into one lake that grows to --sizes logs; does the cost per log stay flat?

One lake (a temp folder, SQLite catalog, local Parquet) receives demo logs in batches,
each batch a fresh `generate_demo_data` seed (new log ids, prompts that may repeat
earlier ones), and each batch runs the product's stages in order: `batch.run` (ingest
stage, one DuckLake batch per landing file) then `curation.run` (curate stage, which
signs only the new logs and reads earlier tasks' persisted `minhash_signatures`). The
demo eval sets of the first seed are registered first, as the demo flow does, so
decontamination and eval coverage run as in production.

Two kinds of batch:
- growth: brings the lake to the next of --sizes (10k, then +90k, then +900k...);
- probe: --probe logs right after each growth batch, the same size every time, so its
  seconds per log show what a batch costs *because the lake is bigger* (incrementality);
  the growth batches mix that with the batch's own size.
The baseline of the ratio is the same pipeline on the smallest lake: the goal is
seconds per log at the largest size <= 1.5x that at the smallest. Curation's time is
split by phase (wrapping the functions `curate` calls), so a phase that grows with the
lake shows itself. Peak RSS is sampled per phase (this process; sandboxed self-tests run
in children). At the end, the README's example queries run through `storage.query.
run_query`, the path `flywheel sql` takes, and once through the CLI itself.

    nice -n 10 .venv/bin/python bench/growth.py [--sizes 10000,100000,1000000] [--probe 10000]
"""
from __future__ import annotations

import argparse
import functools
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.demo.data.generate import DemoDataConfig, generate_demo_data  # noqa: E402
from storage.lake import open_lake  # noqa: E402
from storage.query import run_query  # noqa: E402
from storage.settings import LakeSettings  # noqa: E402
from tasks.curate import coverage, curation, existing  # noqa: E402
from tasks.curate.evalsets import register_evalset  # noqa: E402
from tasks.ingest import batch  # noqa: E402
from tasks.stages import StageKey  # noqa: E402

# README's example queries ("Quick start", "Querying", "Bring a model", routing, gates,
# gateway); the log id of the decisions query is filled in from the lake.
QUERIES = (
    "SELECT kind, count(*) FROM quarantine GROUP BY ALL",
    "SELECT decision, count(*) FROM decisions GROUP BY ALL",
    "SELECT reason, count(*) FROM quarantine GROUP BY ALL ORDER BY 2 DESC",
    "SELECT * FROM ducklake_snapshots('lake')",
    "SELECT decision, evidence FROM decisions WHERE log_id = '{log_id}'",
    "SELECT * FROM eval_coverage",
    "SELECT policy_version, status, source, parameters, context_length FROM models",
    "SELECT route, count(*), round(avg(pass_rate), 2) FROM routes GROUP BY route",
    "SELECT * FROM gate_decisions",
    "SELECT model_version, count(*) AS calls, count(*) FILTER (WHERE len(failure_kinds) > 0) AS signalled "
    "FROM interactions GROUP BY ALL",
)
CURATE_PHASES = {curation: ("load_undecided", "mark_contaminated", "mark_unverifiable", "backfill",
                            "mark_duplicates", "write_results"),
                 existing: ("known_tasks", "band_partners", "fetch_prompts"),
                 coverage: ("load_catalog", "pending_coverage", "find_coverage", "new_coverage_rows")}


class PeakRss:
    """Largest resident set of this process while the block runs, sampled every 20 ms."""

    def __init__(self) -> None:
        self.peak, self._stop, self._proc = 0, threading.Event(), psutil.Process()

    def __enter__(self) -> "PeakRss":
        self.peak = self._proc.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def time_phases(seconds: dict[str, float]) -> None:
    """Wrap the functions `curate` calls so each call adds its wall time to `seconds`."""
    for module, names in CURATE_PHASES.items():
        for name in names:
            def timed(*args, _fn=getattr(module, name), _name=name, **kwargs):
                started = time.perf_counter()
                try:
                    return _fn(*args, **kwargs)
                finally:
                    seconds[_name] = seconds.get(_name, 0.0) + time.perf_counter() - started
            setattr(module, name, functools.wraps(getattr(module, name))(timed))


def generate(folder: Path, logs: int, seed: int) -> Path:
    generate_demo_data(folder, DemoDataConfig(logs=logs, seed=seed))
    return folder


def register_evalsets(con, folder: Path) -> int:
    cfg = curation.CurateConfig()
    items = 0
    for file in sorted((folder / "evalsets").glob("*.jsonl")):
        items += register_evalset(con, file.stem, file, cycle_id="bench-setup", verifiers=cfg.verifiers).items
    return items


def run_batch(con, folder: Path, cycle_id: str, phases: dict[str, float]) -> dict:
    """The ingest stage over the batch's landing folder, then the curate stage."""
    ingest_cfg = batch.IngestConfig(progress_min_bytes=1 << 62)
    with PeakRss() as ingest_rss:
        started = time.perf_counter()
        ingested = batch.run(con, ingest_cfg, StageKey(cycle_id, landing=(str(folder / "landing"),)))
        ingest_s = time.perf_counter() - started
    phases.clear()
    with PeakRss() as curate_rss:
        started = time.perf_counter()
        curated = curation.run(con, curation.CurateConfig(), StageKey(cycle_id))
        curate_s = time.perf_counter() - started
    return {"ingest_s": ingest_s, "curate_s": curate_s, "rows_ok": ingested["rows_ok"],
            "quarantined": ingested["rows_quarantined"], "curated": curated["logs"], "kept": curated["kept"],
            "ingest_rss": ingest_rss.peak, "curate_rss": curate_rss.peak, "phases": dict(phases)}


def lake_counts(con) -> tuple[int, int, int]:
    return con.execute("SELECT (SELECT count(*) FROM lake.failure_logs), (SELECT count(*) FROM lake.tasks), "
                       "(SELECT count(*) FROM lake.minhash_signatures)").fetchone()


def time_queries(settings: LakeSettings) -> list[tuple[str, int, float, float]]:
    """(query, rows, seconds through run_query, seconds of the `flywheel sql` process)."""
    log_id = run_query(settings, "SELECT max(log_id) AS id FROM decisions")["id"][0].as_py()
    env = {**os.environ, "FLYWHEEL_HOME": str(settings.home)}
    cli = Path(sys.executable).with_name("flywheel")
    out = []
    for query in QUERIES:
        sql = query.format(log_id=log_id)
        started = time.perf_counter()
        rows = run_query(settings, sql).num_rows
        in_process = time.perf_counter() - started
        started = time.perf_counter()
        subprocess.run([str(cli), "sql", sql, "--format", "csv"], env=env, check=True,
                       stdout=subprocess.DEVNULL, cwd=settings.home)
        out.append((sql, rows, in_process, time.perf_counter() - started))
    return out


def print_table(rows: list[dict]) -> None:
    print(f"\n{'batch':<8}{'lake before':>12}{'new logs':>10}{'ingest s':>10}{'us/log':>8}{'curate s':>10}"
          f"{'us/log':>8}{'total us/log':>13}{'kept':>9}{'tasks after':>12}{'RSS ingest':>11}{'RSS curate':>11}")
    for r in rows:
        n = r["new"]
        print(f"{r['kind']:<8}{r['before']:>12,}{n:>10,}{r['ingest_s']:>10.1f}{r['ingest_s'] / n * 1e6:>8.0f}"
              f"{r['curate_s']:>10.1f}{r['curate_s'] / n * 1e6:>8.0f}"
              f"{(r['ingest_s'] + r['curate_s']) / n * 1e6:>13.0f}{r['kept']:>9,}{r['tasks']:>12,}"
              f"{r['ingest_rss'] / 2**20:>9.0f}MB{r['curate_rss'] / 2**20:>9.0f}MB")
    print("\ncurate phases, us per new log:")
    names = [n for names in CURATE_PHASES.values() for n in names]
    print(f"{'batch':<8}{'lake before':>12}" + "".join(f"{n[:14]:>15}" for n in names))
    for r in rows:
        print(f"{r['kind']:<8}{r['before']:>12,}"
              + "".join(f"{r['phases'].get(n, 0.0) / r['new'] * 1e6:>15.1f}" for n in names))


def print_ratios(rows: list[dict]) -> None:
    for kind in ("growth", "probe"):
        sel = [r for r in rows if r["kind"] == kind]
        if len(sel) < 2:
            continue
        first, last = sel[0], sel[-1]
        for label, key in (("ingest", ("ingest_s",)), ("curate", ("curate_s",)),
                           ("ingest+curate", ("ingest_s", "curate_s"))):
            a = sum(first[k] for k in key) / first["new"]
            b = sum(last[k] for k in key) / last["new"]
            print(f"ratio {kind} s/log, {last['new']:,} logs into {last['before']:,} vs {first['new']:,} into "
                  f"{first['before']:,}, {label}: {b / a:.2f}x"
                  f"{'' if kind == 'probe' or label != 'ingest+curate' else ' (goal <= 1.5x)'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000",
                        help="lake sizes (logs) the growth batches reach, comma-separated")
    parser.add_argument("--probe", type=int, default=10_000, help="logs of the fixed-size batch after each growth")
    parser.add_argument("--keep", help="keep the lake in this folder instead of deleting it")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    phases: dict[str, float] = {}
    time_phases(phases)
    tmp = Path(tempfile.mkdtemp(prefix="flywheel-growth-"))
    home = Path(args.keep) if args.keep else tmp / "lake"
    settings = LakeSettings(home=home)
    os.environ["FLYWHEEL_HOME"] = str(home)  # the ingest stage reads the lake's settings itself
    print(f"lake {home}; DuckDB memory_limit {settings.duckdb_memory_limit}, threads {settings.duckdb_threads}; "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
    rows, logs, seed, gen_s = [], 0, 100, 0.0
    con = open_lake(settings)
    try:
        plan = []
        for size in sizes:
            plan += [("growth", size - logs)] + ([("probe", args.probe)] if args.probe else [])
            logs = size + args.probe
        for kind, n in plan:
            started = time.perf_counter()
            folder = generate(tmp / f"gen-{seed}", n, seed)
            gen_s += time.perf_counter() - started
            if seed == 100:
                print(f"registered {register_evalsets(con, folder)} eval items")
            before = lake_counts(con)[0]
            row = run_batch(con, folder, f"bench-{seed}", phases)
            shutil.rmtree(folder)
            logs_after, tasks, signed = lake_counts(con)
            row.update(kind=kind, before=before, new=n, tasks=tasks)
            rows.append(row)
            print(f"{kind} seed {seed}: {n:,} logs into a lake of {before:,}: ingest {row['ingest_s']:.1f} s, "
                  f"curate {row['curate_s']:.1f} s ({row['curated']:,} decided, {row['kept']:,} kept); lake now "
                  f"{logs_after:,} logs, {tasks:,} tasks, {signed:,} signatures; load {os.getloadavg()[0]:.1f}",
                  flush=True)
            seed += 1
        con.close()
        print_table(rows)
        print_ratios(rows)
        print(f"generation (not counted): {gen_s:.0f} s; peak RSS of the process "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB (generation included)")
        print(f"\nREADME queries on the {logs_after:,}-log lake (run_query = the path `flywheel sql` takes; "
              f"CLI = the whole `flywheel sql` process):")
        for sql, n, in_process, cli in time_queries(settings):
            print(f"{in_process:>7.3f} s run_query {cli:>6.2f} s CLI {n:>6} rows  {sql}")
        print(f"lake on disk: {sum(f.stat().st_size for f in home.rglob('*') if f.is_file()) / 1e6:,.0f} MB; "
              f"load average {os.getloadavg()[0]:.1f} at end")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
