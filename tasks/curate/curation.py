"""Curation: every undecided failure log becomes a task or a recorded reason why not.

For each log (in arrival order: ts, then log_id) one decision, tested in this order:
- contaminated: its prompt copies an item of any registered evaluation set, any version
  (`tasks.curate.decontaminate`; evidence names the item and the n-gram or similarity);
- unverifiable: no verifier for it, or its verifier fails the gold self-test on its
  own reference (evidence: the verdict's status and detail);
- duplicate: its normalised prompt (`tasks.curate.similarity.normalize.content_hash`, which is also the
  task id) is already a task, from an earlier cycle or earlier in this batch;
- near_duplicate: word-shingle Jaccard >= the MinHash threshold with an existing task
  or an earlier kept log of this batch (LSH candidates, exact Jaccard verified);
- kept: it becomes a task.
Dedup compares only against *kept* tasks, greedily in arrival order (each log joins
the most similar earlier task, or founds its own). Unlike connected components, that
rule gives the same decisions whether logs arrive in one cycle or many, because a log's
fate depends only on the tasks that existed before it.

The other direction too: evaluation items that tasks of earlier cycles already copy
(`tasks.curate.coverage`; they matter when a set is registered after those tasks) become
`eval_coverage` rows, each (item version, task) once.

Each chunk of `chunk_logs` logs is written in one DuckLake commit (tasks, decisions, band keys,
signatures; the run's eval coverage and its marks with the first), so a crash loses at
most the chunk in progress and a rerun decides only the logs still undecided, as the
run would have.
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import duckdb
import jsonschema
import numpy as np
import pyarrow as pa

from storage.lake import append_rows, transaction
from storage.schemas import DECISIONS, SCHEMAS
from tasks.curate import coverage
from tasks.curate import decontaminate
from tasks.curate.existing import BANDS_TABLE, SIGNATURES_TABLE, ExistingTasks, backfill, band_rows
from tasks.curate.similarity import minhash
from tasks.curate.evalsets import all_eval_prompts, prompt_text
from tasks.curate.similarity.normalize import content_hash, tokenize_batch
from verifiers.registry import VerifierConfig, self_test
from verifiers.verdict import Verdict

if TYPE_CHECKING:
    from tasks.stages import StageKey


@dataclass(frozen=True)
class CurateConfig:
    """minhash: near-duplicate settings. decontam: evaluation-leak settings.
    verifiers: which verifier a domain uses. self_test_workers: gold self-tests run
    concurrently (code ones wait on a sandbox process)."""

    minhash: minhash.MinHashConfig = field(default_factory=minhash.MinHashConfig)
    decontam: decontaminate.DecontamConfig = field(default_factory=decontaminate.DecontamConfig)
    verifiers: VerifierConfig = field(default_factory=VerifierConfig)
    self_test_workers: int = 4
    # Logs decided per commit: a chunk's candidates (~10 KB a log while curated) are what
    # curation holds in memory, beside the lake's band keys; a 190k-log batch in one piece
    # took 3.2 GB (bench/growth.py).
    chunk_logs: int = 50_000

    def __post_init__(self) -> None:
        for name in ("self_test_workers", "chunk_logs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class CurationCounts:
    logs: int
    kept: int
    duplicate: int
    near_duplicate: int
    contaminated: int
    unverifiable: int
    coverage_rows: int  # eval_coverage rows this run added
    seconds: float


@dataclass
class Candidate:
    log_id: str
    domain: str | None
    messages: list[dict]
    prompt: str
    spec: dict
    task_id: str
    verifier: str | None = None
    verifier_problem: str | None = None
    decision: str | None = None
    evidence: dict = field(default_factory=dict)
    decided_task: str | None = None
    template_args: str | None = None
    """The log's chat_template_kwargs (JSON text), which its task keeps."""


def load_undecided(con: duckdb.DuckDBPyConnection, cfg: CurateConfig, limit: int | None = None) -> list[Candidate]:
    """Logs without a decision, oldest first (the first `limit`), as candidate tasks.

    The order and the limit are taken over (log_id, ts) alone and only the chosen logs'
    messages are read: sorting 900k undecided logs with their messages in one window ran
    out of DuckDB's 1 GB (bench/growth.py)."""
    rows = con.execute("""
        WITH chosen AS (
            SELECT log_id, min(ts) AS ts FROM lake.failure_logs f
            WHERE NOT EXISTS (SELECT 1 FROM lake.decisions d WHERE d.log_id = f.log_id)
            GROUP BY log_id ORDER BY ts, log_id LIMIT ?)
        SELECT log_id, domain, verifier, messages, reference, chat_template_kwargs
        FROM lake.failure_logs JOIN chosen USING (log_id, ts)
        QUALIFY row_number() OVER (PARTITION BY log_id) = 1
        ORDER BY ts, log_id""", [limit]).fetchall()
    out = []
    for log_id, domain, verifier, messages, reference, template_args in rows:
        parsed = json.loads(messages)
        try:
            prompt = prompt_text(parsed)
        except (KeyError, TypeError):
            # a message with no text: ingest refuses these since 2026-12-07, and a lake may
            # hold some from before; a bad row is a decision, not a crash of every curation
            cand = Candidate(log_id, domain, parsed, "", json.loads(reference), content_hash(""))
            cand.decision, cand.evidence = "unverifiable", {"reason": "a message has no text content"}
            out.append(cand)
            continue
        cand = Candidate(log_id, domain, parsed, prompt, json.loads(reference), content_hash(prompt),
                         template_args=template_args)
        try:
            cand.verifier = cfg.verifiers.verifier_for(domain, verifier)
        except ValueError as exc:
            cand.verifier_problem = str(exc)
        out.append(cand)
    return out


def mark_contaminated(cands: list[Candidate], index: decontaminate.EvalIndex | None,
                      cfg: CurateConfig) -> None:
    if index is None or not cands:
        return
    for hit in decontaminate.find_contamination([c.prompt for c in cands], index, cfg.decontam):
        cand = cands[hit.record]
        cand.decision, cand.evidence = "contaminated", hit.evidence


def mark_unverifiable(cands: list[Candidate], cfg: CurateConfig) -> None:
    """Gold self-test once per distinct (verifier, spec); failures are unverifiable."""
    for cand in cands:
        if cand.decision is None and cand.verifier_problem:
            cand.decision, cand.evidence = "unverifiable", {"reason": cand.verifier_problem}
    todo = [c for c in cands if c.decision is None]
    keys = {(c.verifier, json.dumps(c.spec, sort_keys=True)) for c in todo}
    with ThreadPoolExecutor(cfg.self_test_workers) as pool:
        verdicts = dict(zip(keys, pool.map(lambda key: _self_test(key[0], json.loads(key[1]), cfg), keys)))
    for cand in todo:
        verdict = verdicts[(cand.verifier, json.dumps(cand.spec, sort_keys=True))]
        if not verdict.passed:
            cand.decision = "unverifiable"
            cand.evidence = {"verifier": cand.verifier, "status": verdict.status, "detail": verdict.detail}


def _self_test(verifier: str, spec: dict, cfg: CurateConfig) -> Verdict:
    # docs/architecture.md gives JSON tasks a reference of {"schema": ...} alone, and the registry's
    # self-test needs an example answer, so such a task could never pass. Until the
    # registry checks schema-only specs itself (as it checks code specs without a
    # solution), a well-formed schema is what proves the task usable.
    if verifier == "json_schema" and "answer" not in spec and isinstance(spec.get("schema"), dict):
        try:
            jsonschema.validators.validator_for(spec["schema"]).check_schema(spec["schema"])
        except jsonschema.SchemaError as exc:
            return Verdict(reward=0.0, passed=False, status="format_error", detail=f"invalid schema: {exc.message}")
        return Verdict(reward=1.0, passed=True, status="ok", detail="no answer: schema is well-formed")
    return self_test(verifier, spec, cfg.verifiers)


def _verified_pairs(cands: list[Candidate], existing: ExistingTasks, cfg: minhash.MinHashConfig):
    """(within-batch pairs i<j with Jaccard, batch-vs-existing (row, task id) pairs with
    Jaccard), verified, and the batch's signatures."""
    new = minhash.sketch_texts([c.prompt for c in cands], cfg)
    inner = minhash.candidate_pairs(new.keys, cfg)
    inner_sims = minhash.exact_jaccard(new.shingles, new.shingles, inner)
    rows, task_ids = existing.partners(new.keys)
    needed = sorted(set(task_ids))
    prompts = existing.prompts(needed)
    needed = [t for t in needed if t in prompts]  # a band row whose task is gone meets nothing
    local = {t: i for i, t in enumerate(needed)}
    hit = [k for k, t in enumerate(task_ids) if t in local]
    outer = np.stack([rows[hit], np.array([local[task_ids[k]] for k in hit], dtype=np.int64)], 1) \
        if hit else np.empty((0, 2), np.int64)
    old_shingles = minhash.shingle_batch(tokenize_batch([prompts[t] for t in needed]), cfg.ngram)
    outer_sims = minhash.exact_jaccard(new.shingles, old_shingles, outer)
    keep_in, keep_out = inner_sims >= cfg.threshold, outer_sims >= cfg.threshold
    outer_pairs = [(k, needed[t]) for k, t in outer[keep_out].tolist()]
    return inner[keep_in], inner_sims[keep_in], outer_pairs, outer_sims[keep_out], new.signatures


def mark_duplicates(cands: list[Candidate], existing: ExistingTasks,
                    cfg: minhash.MinHashConfig) -> np.ndarray:
    """Exact then near duplicates among the still-undecided candidates, greedily in order.

    Returns the signatures of the candidates (rows of `cands`, zeros for decided ones).
    """
    pool = [i for i, c in enumerate(cands) if c.decision is None]
    sigs = np.zeros((len(cands), cfg.num_perm), dtype=np.uint32)
    if not pool:
        return sigs
    inner, inner_sims, outer, outer_sims, pool_sigs = _verified_pairs([cands[i] for i in pool], existing, cfg)
    sigs[pool] = pool_sigs
    partners: dict[int, list[tuple[float, str, int]]] = {}
    for (k, t), s in zip(outer, outer_sims.tolist()):
        partners.setdefault(k, []).append((s, t, -1))
    for (a, b), s in zip(inner.tolist(), inner_sims.tolist()):
        partners.setdefault(b, []).append((s, cands[pool[a]].task_id, a))
    tasks = existing.known([cands[i].task_id for i in pool])  # grows with this batch's kept tasks
    kept_pool: set[int] = set()
    for k, i in enumerate(pool):
        cand = cands[i]
        if cand.task_id in tasks:
            cand.decision, cand.decided_task = "duplicate", cand.task_id
            cand.evidence = {"task_id": cand.task_id, "method": "exact"}
            continue
        near = [(s, t) for s, t, a in partners.get(k, []) if a == -1 or a in kept_pool]
        if near:
            s, t = max(near, key=lambda x: (x[0], x[1]))
            cand.decision, cand.decided_task = "near_duplicate", t
            cand.evidence = {"task_id": t, "similarity": round(s, 4), "method": "minhash"}
            continue
        cand.decision, cand.decided_task = "kept", cand.task_id
        tasks.add(cand.task_id)
        kept_pool.add(k)
    return sigs


def write_results(con: duckdb.DuckDBPyConnection, cands: list[Candidate], sigs: np.ndarray,
                  covered: pa.Table, marks: pa.Table, cfg: CurateConfig, cycle_id: str, now: datetime) -> None:
    kept = [c for c in cands if c.decision == "kept"]
    sources: dict[str, list[str]] = {c.task_id: [c.log_id] for c in kept}
    for c in cands:
        if c.decision == "duplicate" and c.decided_task in sources:
            sources[c.decided_task].append(c.log_id)
    tasks = pa.Table.from_pylist([{
        "task_id": c.task_id, "domain": c.domain, "prompt": c.prompt, "messages": json.dumps(c.messages),
        "verifier": c.verifier, "spec": json.dumps(c.spec, sort_keys=True),
        "source_log_ids": sources[c.task_id], "created_at": now, "cycle_id": cycle_id,
        "chat_template_kwargs": c.template_args} for c in kept],
        schema=SCHEMAS["tasks"])
    decisions = pa.Table.from_pylist([{
        "log_id": c.log_id, "decision": c.decision, "evidence": json.dumps(c.evidence, sort_keys=True),
        "task_id": c.decided_task, "decided_at": now, "cycle_id": cycle_id} for c in cands],
        schema=SCHEMAS["decisions"])
    message = f"curate {cycle_id}: {len(kept)} tasks from {len(cands)} logs, {covered.num_rows} eval coverage rows"
    with transaction(con, message):
        append_rows(con, "tasks", tasks)
        append_rows(con, "decisions", decisions)
        append_rows(con, coverage.COVERAGE_TABLE, covered)
        append_rows(con, coverage.CHECKS_TABLE, marks)
        rows = [{"task_id": c.task_id, "scheme": cfg.minhash.scheme,
                 "signature": sigs[i].astype("<u4").tobytes(), "cycle_id": cycle_id}
                for i, c in enumerate(cands) if c.decision == "kept"]
        append_rows(con, SIGNATURES_TABLE, pa.Table.from_pylist(rows, schema=SCHEMAS[SIGNATURES_TABLE]))
        rows_kept = [i for i, c in enumerate(cands) if c.decision == "kept"]
        keys = minhash.band_keys(sigs[rows_kept], cfg.minhash)
        append_rows(con, BANDS_TABLE, band_rows([cands[i].task_id for i in rows_kept], keys,
                                                cfg.minhash.banding_scheme, cycle_id))


def eval_index(con: duckdb.DuckDBPyConnection, cfg: CurateConfig) -> decontaminate.EvalIndex | None:
    items = [decontaminate.EvalItem(*row) for row in all_eval_prompts(con)]
    return decontaminate.build_eval_index(items, cfg.decontam) if items else None


def curate(con: duckdb.DuckDBPyConnection, cfg: CurateConfig, cycle_id: str) -> CurationCounts:
    """Decide every undecided log, `cfg.chunk_logs` at a time in arrival order, and record
    eval items that earlier tasks cover. Each chunk is one commit (tasks, decisions,
    signatures; the first also the coverage and its marks), and the next chunk sees its
    tasks, so the decisions are those of one big run, with memory bounded by a chunk."""
    started, now = time.perf_counter(), datetime.now(timezone.utc)
    catalog = coverage.load_catalog(con, cfg.decontam)
    # this run's logs are checked against every item as they are curated, so only
    # earlier tasks can cover an item, and only items of versions newer than their mark
    pending = coverage.pending_coverage(con, catalog, cfg.decontam)
    covered = coverage.new_coverage_rows(con, pending.rows, cycle_id, now)
    marks = coverage.check_marks(pending.checked, now, cycle_id)
    backfill(con, cfg.minhash, cycle_id)  # tasks from before band keys were kept: once
    count = dict.fromkeys(DECISIONS, 0)
    logs, coverage_rows = 0, covered.num_rows
    coverage_news = bool(covered.num_rows or pending.tasks_checked)  # marks to write even without logs
    while True:
        cands = load_undecided(con, cfg, limit=cfg.chunk_logs)
        mark_contaminated(cands, catalog.index if catalog else None, cfg)
        mark_unverifiable(cands, cfg)
        sigs = (mark_duplicates(cands, ExistingTasks(cfg.minhash, con), cfg.minhash) if cands
                else np.zeros((0, cfg.minhash.num_perm), dtype=np.uint32))
        if cands or coverage_news:
            write_results(con, cands, sigs, covered, marks, cfg, cycle_id, now)
        covered, marks, coverage_news = covered.slice(0, 0), marks.slice(0, 0), False  # written once
        logs += len(cands)
        for c in cands:
            count[c.decision] += 1
        if len(cands) < cfg.chunk_logs:
            break
    return CurationCounts(logs=logs, coverage_rows=coverage_rows, seconds=time.perf_counter() - started, **count)


def run(con: duckdb.DuckDBPyConnection, cfg: CurateConfig, key: StageKey) -> dict:
    """The curate stage: `curate` for the key's cycle."""
    return asdict(curate(con, cfg, key.cycle_id))
