"""Demo failure logs with known defects planted in known places: `flywheel demo-data`.

Writes, under one folder:
- `landing/logs-000.jsonl`, `logs-001.jsonl.gz`, ... one failure log per line in the
  failure-log format of docs/architecture.md (every other file gzipped, at most `lines_per_file` lines each, a few
  blank lines that ingest must skip);
- `evalsets/{math,code,json}.jsonl`: evaluation items `{id, domain, prompt, reference}`;
- `manifest.json`: which log ids are clean, which are exact or near duplicates of which,
  which are reformatted eval items, and which (file, line) is malformed and how.
Later stages measure dedup, decontamination and ingest validation against the manifest.

Output depends only on the config: every random choice comes from `random.Random`
streams seeded from `seed`, gzip headers carry no timestamp, so the same seed gives the
same bytes. Logs stream to disk; memory holds the eval items, a bounded pool of
originals to duplicate, and one 8-byte digest per clean prompt.
"""
import gzip
import io
import json
import math
import random
import time
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from flows.demo.data.domains import DEFAULT_VERIFIERS, conversation, sample_domain, sample_task
from flows.demo.data.evalsets import build_evalsets, eval_size
from flows.demo.data.candidates import Candidates, worker_count
from flows.demo.data.guard import Guard
from flows.demo.data.planting import MALFORMED_KINDS, REFORMAT_KINDS, malformed_line, near_duplicate, reformat, reformat_applies

__all__ = ["DemoDataConfig", "Manifest", "generate_demo_data", "MALFORMED_KINDS", "REFORMAT_KINDS"]

CLEAN, DUPLICATE, NEAR, LEAK, BAD = range(5)
_POOL_CAP = 4096
_NEAR_MIN_WORDS = 20
_MAX_OVERSIZED = 20  # one ~80 KiB line each; enough to test, not enough to bloat big runs
_MODELS = ("policy-v3", "policy-v3", "policy-v3.1", "policy-v4-preview")
_TENANTS = ("acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "tyrell", "cyberdyne")
_REGIONS = ("eu-west", "us-east", "ap-south", "us-west")


@dataclass(frozen=True)
class DemoDataConfig:
    """What to generate. Shares are fractions of `logs`, the number of non-blank lines."""

    logs: int = 3000
    seed: int = 0
    exact_duplicate_share: float = 0.05  # same messages and reference as an earlier clean log
    near_duplicate_share: float = 0.05  # one small edit of an earlier clean log
    eval_leak_share: float = 0.03  # an evaluation item, reformatted, logged as a failure
    malformed_share: float = 0.02  # lines ingest must quarantine; every kind once if logs >= 200
    blank_line_share: float = 0.001  # empty lines between logs, not counted in `logs`
    eval_items_per_domain: int = 0  # 0: 100 per domain
    lines_per_file: int = 50_000
    workers: int = 0  # processes drawing candidate tasks; 0: none below 20k logs, else cores - 1 (output is the same)

    def __post_init__(self) -> None:
        if self.logs < 1:
            raise ValueError(f"logs={self.logs}: ask for at least 1 log line")
        shares = (self.exact_duplicate_share, self.near_duplicate_share, self.eval_leak_share, self.malformed_share)
        if any(not 0 <= s <= 1 for s in shares + (self.blank_line_share,)):
            raise ValueError("every *_share must lie in [0, 1]; they are fractions of `logs`, not percentages")
        if sum(shares) > 0.5:
            raise ValueError(f"planted shares add up to {sum(shares):.2f}; keep them <= 0.5 so most logs stay clean")
        if self.lines_per_file < 1:
            raise ValueError(f"lines_per_file={self.lines_per_file}: use a positive number (default 50000)")
        if self.workers < 0:
            raise ValueError(f"workers={self.workers}: use 0 (automatic) or a positive number of processes")
        if self.eval_items_per_domain < 0:
            raise ValueError("eval_items_per_domain must be >= 0 (0 picks the size automatically)")


@dataclass
class Manifest:
    """Where everything planted is. Ids are the logs' `id` fields; files are relative to the output folder."""

    seed: int
    logs: int
    files: list[str] = field(default_factory=list)
    clean: list[str] = field(default_factory=list)
    exact_duplicates: list[dict] = field(default_factory=list)  # {"id", "of"}
    near_duplicates: list[dict] = field(default_factory=list)  # {"id", "of", "edit"}
    eval_leaks: list[dict] = field(default_factory=list)  # {"id", "eval_set", "item_id", "reformat"}
    malformed: list[dict] = field(default_factory=list)  # {"file", "line_no" (1-based), "kind"}

    @classmethod
    def read(cls, path: str | Path) -> "Manifest":
        return cls(**json.loads(Path(path).read_text()))

    def write(self, path: Path) -> None:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # asdict would deep-copy
        path.write_text(json.dumps(fields, separators=(",", ":")))


def _plan(config: DemoDataConfig, rng: random.Random) -> bytearray:
    """The category of every line; the first clean lines come first so duplicates have originals."""
    n = config.logs
    counts = {DUPLICATE: round(n * config.exact_duplicate_share), NEAR: round(n * config.near_duplicate_share),
              LEAK: round(n * config.eval_leak_share), BAD: round(n * config.malformed_share)}
    if n >= 200:
        counts[BAD] = max(counts[BAD], len(MALFORMED_KINDS))
    clean = n - sum(counts.values())
    warm = min(clean, 20)
    rest = [CLEAN] * (clean - warm)
    for category, count in counts.items():
        rest += [category] * count
    rng.shuffle(rest)
    return bytearray([CLEAN] * warm + rest)


class _Writer:
    """Streams lines into the landing files, remembering the physical line number in each."""

    def __init__(self, out: Path, config: DemoDataConfig, rng: random.Random) -> None:
        files = max(2, math.ceil(config.logs / config.lines_per_file))
        self.per_file = math.ceil(config.logs / files)
        self.names = [f"landing/logs-{i:03d}.jsonl" + (".gz" if i % 2 else "") for i in range(files)]
        self.out, self.rng, self.blank = out, rng, config.blank_line_share
        self.logs, self.limit = config.logs, config.lines_per_file
        self.index, self.handle, self.line_no, self.buffer = -1, None, 0, []

    def write(self, logical: int, line: str) -> tuple[str, int]:
        if logical // self.per_file != self.index:
            self._open(logical // self.per_file)
        left = min(self.logs, self.per_file * (self.index + 1)) - logical
        if self.rng.random() < self.blank and self.line_no + left < self.limit:  # blanks never overfill a file
            self._put("")
        self._put(line)
        return self.names[self.index], self.line_no

    def _put(self, line: str) -> None:
        self.buffer.append(line + "\n")
        self.line_no += 1
        if len(self.buffer) >= 4096:
            self.handle.writelines(self.buffer)
            self.buffer.clear()

    def _open(self, index: int) -> None:
        self.close()
        self.index, self.line_no = index, 0
        path = self.out / self.names[index]
        raw = open(path, "wb")
        if path.suffix == ".gz":  # mtime=0 and no file name: same seed, same bytes
            raw = gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=3, mtime=0)
        self.handle = io.TextIOWrapper(raw, encoding="utf-8", newline="\n")

    def close(self) -> None:
        if self.handle:
            self.handle.writelines(self.buffer)
            self.buffer.clear()
            self.handle.close()
            self.handle = None

    def finish(self) -> None:
        """Close the last file; a run too small to reach every named file still creates it, empty."""
        self.close()
        for index in range(self.index + 1, len(self.names)):
            self._open(index)
            self.close()


class _Logs:
    """Builds log records: ids, timestamps, metadata around a task's messages."""

    def __init__(self, rng: random.Random) -> None:
        self.rng, self.clock = rng, 1_793_491_200  # 2026-11-01T00:00:00Z

    def record(self, domain: str, messages: list, response: str, failure: dict, reference: dict) -> dict:
        rng = self.rng
        self.clock += rng.randint(0, 6)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.clock))
        stamp += f".{rng.randrange(1000):03d}Z" if rng.random() < 0.3 else "Z"
        rec = {"id": f"req-{rng.getrandbits(96):024x}", "ts": stamp, "model": rng.choice(_MODELS),
               "domain": domain, "messages": messages, "response": response, "failure": failure,
               "reference": reference,
               "meta": {"tenant": rng.choice(_TENANTS), "user": f"u-{rng.getrandbits(32):08x}",
                        "region": rng.choice(_REGIONS), "latency_ms": rng.randint(80, 9000)}}
        if rng.random() < 0.1:
            rec["verifier"] = DEFAULT_VERIFIERS[domain]
        return rec

    def again(self, original: dict, messages: list) -> dict:
        """The same question from another user: new id, time and metadata, same task."""
        rec = self.record(original["domain"], messages, original["response"], original["failure"], original["reference"])
        if "verifier" in original:
            rec["verifier"] = original["verifier"]
        return rec


class _Pools:
    """Bounded reservoirs of earlier clean logs to duplicate; each original is used once."""

    def __init__(self, rng: random.Random) -> None:
        self.rng, self.long, self.short = rng, [], []

    def add(self, rec: dict, n_words: int) -> None:
        pool = self.long if n_words >= _NEAR_MIN_WORDS else self.short
        if len(pool) < _POOL_CAP:
            pool.append(rec)
        else:
            pool[self.rng.randrange(_POOL_CAP)] = rec

    def take(self, long_only: bool) -> dict | None:
        pools = [self.long] if long_only else [p for p in (self.long, self.short) if p]
        pools = [p for p in pools if p]
        if not pools:
            return None
        pool = self.rng.choices(pools, [len(p) for p in pools])[0]
        i = self.rng.randrange(len(pool))
        pool[i], pool[-1] = pool[-1], pool[i]
        return pool.pop()


class _LeakPicker:
    """Cycles through reformat kinds and eval items, reusing an item only after all were used."""

    def __init__(self, items: list[dict], rng: random.Random) -> None:
        self.rng, self.items, self.used = rng, items[:], set()
        rng.shuffle(self.items)
        self.kinds = list(REFORMAT_KINDS)
        rng.shuffle(self.kinds)
        self.turn = 0

    def next(self) -> tuple[dict, str]:
        kind = self.kinds[self.turn % len(self.kinds)]
        self.turn += 1
        for _ in range(2):
            for i, entry in enumerate(self.items):
                if i not in self.used and reformat_applies(kind, entry["text"], entry["preamble"]):
                    self.used.add(i)
                    return entry, kind
            self.used.clear()
        return self.items[0], "case"


def _leak_messages(entry: dict, kind: str, rng: random.Random) -> list[dict]:
    prompt = entry["item"]["prompt"]
    text, _ = reformat(kind, entry["text"], entry["preamble"], rng)
    if isinstance(prompt, str):
        return [{"role": "user", "content": text}]
    return [dict(m, content=text) if m["role"] == "user" else dict(m) for m in prompt]


def _write_evalsets(out: Path, items: list[dict]) -> None:
    (out / "evalsets").mkdir(parents=True, exist_ok=True)
    for domain in DEFAULT_VERIFIERS:
        lines = [json.dumps(e["item"], ensure_ascii=False) + "\n" for e in items if e["item"]["domain"] == domain]
        (out / "evalsets" / f"{domain}.jsonl").write_text("".join(lines), encoding="utf-8")


class _Generation:
    """One run's writers and state; `line` emits the log for one planned slot."""

    def __init__(self, out: Path, config: DemoDataConfig, candidates: Candidates, items: list, streams: dict) -> None:
        self.writer, self.logs = _Writer(out, config, streams["files"]), _Logs(streams["logs"])
        self.pools, self.leaks, self.plant = _Pools(streams["plant"]), _LeakPicker(items, streams["plant"]), streams["plant"]
        self.candidates, self.bad_tasks = candidates, streams["bad"]
        self.kinds = MALFORMED_KINDS[:]
        self.plant.shuffle(self.kinds)
        self.oversized = 0
        self.manifest = Manifest(seed=config.seed, logs=config.logs, files=self.writer.names)

    def line(self, logical: int, category: int) -> None:
        original = self.pools.take(long_only=category == NEAR) if category in (DUPLICATE, NEAR) else None
        if category == BAD:
            self._malformed(logical)
            return
        if category == DUPLICATE and original:
            rec = self.logs.again(original, original["messages"])
            self.manifest.exact_duplicates.append({"id": rec["id"], "of": original["id"]})
        elif category == NEAR and original:
            messages, edit = near_duplicate(original["messages"], self.plant)
            rec = self.logs.again(original, messages)
            self.manifest.near_duplicates.append({"id": rec["id"], "of": original["id"], "edit": edit})
        elif category == LEAK:
            rec = self._leak()
        else:  # clean, or a duplicate slot that came before any original it could copy
            task = self.candidates.next()
            rec = self.logs.record(task["domain"], conversation(task, self.plant), task["response"], task["failure"], task["reference"])
            self.pools.add(rec, task["words"])
            self.manifest.clean.append(rec["id"])
        self.writer.write(logical, json.dumps(rec, ensure_ascii=False))

    def _leak(self) -> dict:
        entry, kind = self.leaks.next()
        task = entry["task"]
        rec = self.logs.record(task["domain"], _leak_messages(entry, kind, self.plant), task["response"],
                               task["failure"], entry["item"]["reference"])
        self.manifest.eval_leaks.append({"id": rec["id"], "eval_set": task["domain"], "item_id": entry["item"]["id"],
                                         "reformat": kind})
        return rec

    def _malformed(self, logical: int) -> None:
        kind = self.kinds[len(self.manifest.malformed) % len(self.kinds)]
        if kind == "oversized_line":
            self.oversized += 1
            kind = kind if self.oversized <= _MAX_OVERSIZED else "not_json"
        task = sample_task(sample_domain(self.bad_tasks), self.bad_tasks)
        rec = self.logs.record(task["domain"], conversation(task, self.plant), task["response"], task["failure"], task["reference"])
        name, line_no = self.writer.write(logical, malformed_line(kind, rec, self.plant))
        self.manifest.malformed.append({"file": name, "line_no": line_no, "kind": kind})


def generate_demo_data(out_dir: str | Path, config: DemoDataConfig = DemoDataConfig()) -> Manifest:
    """Write landing logs, eval sets and the manifest under `out_dir`; return the manifest."""
    out = Path(out_dir)
    (out / "landing").mkdir(parents=True, exist_ok=True)
    streams = {name: random.Random(f"flywheel-demo:{config.seed}:{name}")
               for name in ("eval", "plan", "bad", "logs", "plant", "files")}
    guard = Guard(capacity=config.logs)
    items = build_evalsets(streams["eval"], eval_size(config.eval_items_per_domain), guard)
    _write_evalsets(out, items)
    with Candidates(config.seed, guard, worker_count(config.logs, config.workers)) as candidates:
        run = _Generation(out, config, candidates, items, streams)
        for logical, category in enumerate(_plan(config, streams["plan"])):
            run.line(logical, category)
        run.writer.finish()
    run.manifest.write(out / "manifest.json")
    return run.manifest
