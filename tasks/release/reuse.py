"""Reuse a policy's earlier evaluation of an unchanged item instead of sampling it again.

Every cycle evaluates production beside the candidate. Production is the model the
cycle before evaluated (as its production, or as the candidate it then promoted), on
the same versions of the registered sets. Its samples and verdicts on those items are
draws from a distribution fixed by its weights (`policy_version` is their content hash),
the item and the evaluation's settings, so with `[cycle.evaluate] reuse = true` they are
taken from that evaluation rather than drawn again: about half the sampling of every
evaluate stage after the first (`bench/eval_reuse.py`: 1.72x on the tiny demo's).

Off by default, because the gate then judges against a draw that has survived a
decision. A promoted candidate was promoted partly because its draw came out high (the
winner's curse), and a production model that fended off a candidate did so partly
because its draw did; a fresh draw regresses to the mean, a reused one does not. So
reuse makes the gate more conservative, never more permissive, by the bias of the
reused draw. In a normal model of the tiny demo's gate (each model's pass@1 off by
sigma = 0.0076, the paired interval +/-0.021), a candidate promoted at a true gain of
+0.04 (promoted 96% of the time) carries +0.0005 into the next cycle's baseline; at a
true gain of +0.021 (promoted half the time), +0.0043, 0.57 sigma. Turn it on where
evaluation costs more than an occasional missed marginal promotion.

What counts as the same settings (`settings_key`): everything that changes a sample or
its verdict: the engine's sampling (backend, G, token budgets, temperature, seed,
context, dtype), the verifier config (domain map, sandbox limits, timeouts) and the
verifiers' own source, so that a fixed verifier never hands back a stale verdict. Not
in it: memory, timeouts of the engine process, warm or cold engine, fan-out.

What is never reused: items of the `fresh-failures` set (they are this cycle's new tasks
and have no version), an item whose earlier evaluation is incomplete (fewer than G
samples), and the contamination flag: it is recomputed every time, since the tasks a
lineage has trained on grow from cycle to cycle.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path

import duckdb

from trainer.engine import EngineConfig
from verifiers.registry import VerifierConfig

_VERIFIERS_DIR = Path(__file__).resolve().parents[2] / "verifiers"
# EngineConfig fields that do not change what is sampled, only how the engine runs.
_ENGINE_RUNTIME = ("gpu_memory_utilization", "cpu_kv_cache_gib", "timeout_s", "warm")


@lru_cache(maxsize=1)
def verifier_source_digest() -> str:
    """sha256 of the verifiers package's Python source."""
    digest = hashlib.sha256()
    for path in sorted(_VERIFIERS_DIR.rglob("*.py")):
        digest.update(path.relative_to(_VERIFIERS_DIR).as_posix().encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def settings_key(engine: EngineConfig, verifiers: VerifierConfig) -> str:
    """The hash of everything besides weights and item that decides an evaluation's rows."""
    sampling = {k: v for k, v in asdict(engine).items() if k not in _ENGINE_RUNTIME}
    blob = json.dumps({"engine": sampling, "verifiers": asdict(verifiers),
                       "verifier_source": verifier_source_digest()}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


_EARLIER_SQL = """
SELECT * EXCLUDE (contaminated) FROM lake.evaluations
WHERE policy_version = ? AND settings = ? AND cycle_id <> ? AND eval_version IS NOT NULL
  AND list_contains(?, eval_set || chr(0) || eval_version || chr(0) || item_id)
-- one evaluation per item: the one that sampled it (later copies hold the same rows)
QUALIFY dense_rank() OVER (PARTITION BY eval_set, eval_version, item_id
                           ORDER BY coalesce(reused_from, cycle_id), cycle_id) = 1
"""


def earlier_rows(con: duckdb.DuckDBPyConnection, policy_version: str, items: list, settings: str,
                 samples: int, cycle_id: str) -> dict[tuple[str, str], list[dict]]:
    """(eval_set, item_id) -> the `samples` rows an earlier evaluation of this policy wrote for
    the item under these settings, in sample order; items without a complete one are absent.

    `items`: `tasks.release.evaluate.Item`s; those without an eval_version are skipped.
    The rows keep their origin in `reused_from`; the caller stamps this cycle and the
    contamination flag on them.
    """
    keys = [f"{i.eval_set}\0{i.eval_version}\0{i.item_id}" for i in items if i.eval_version is not None]
    if not keys:
        return {}
    cursor = con.execute(_EARLIER_SQL, [policy_version, settings, cycle_id, keys])
    columns = [d[0] for d in cursor.description]
    found: dict[tuple[str, str], list[dict]] = {}
    for values in cursor.fetchall():
        row = dict(zip(columns, values, strict=True))
        found.setdefault((row["eval_set"], row["item_id"]), []).append(row)
    out = {}
    for key, rows in found.items():
        rows.sort(key=lambda r: r["sample_idx"])
        if [r["sample_idx"] for r in rows] == list(range(samples)):
            out[key] = [{**r, "reused_from": r["reused_from"] or r["cycle_id"]} for r in rows]
    return out
