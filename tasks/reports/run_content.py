"""What an MLflow run of a cycle, a training job or an evaluation holds, read from the lake.

Plain values only (`RunContent`: tags, params, step-indexed metrics, JSON files); writing
them to MLflow is `tasks.reports.tracking`, which says what each run holds and why runs
are written after the fact. SQL only reads, so a past cycle's runs can be rebuilt from
the lake at any time.
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from tasks.release.gate import GateConfig
from tasks.reports.cycle_report import evaluation_table, funnel

# train_steps columns logged as per-step metrics (kl_reference, a flag, becomes a tag)
STEP_METRICS = ("loss", "reward_mean", "reward_std", "kl", "entropy", "clip_frac", "resp_len_mean",
                "groups_kept", "groups_dropped", "tokens_per_s", "sft_loss", "sft_tokens")


@dataclass(frozen=True)
class RunContent:
    """What one MLflow run gets: plain values read from the lake."""
    name: str
    tags: dict[str, str]
    params: dict[str, str] = field(default_factory=dict)
    metrics: list[tuple[str, float, int]] = field(default_factory=list)  # (key, value, step)
    files: dict[str, Any] = field(default_factory=dict)  # artifact name -> JSON-able content
    folder: Path | None = None  # a folder logged as artifacts as it is (the report)


def cycle_content(con: duckdb.DuckDBPyConnection, cycle_id: str, config: Any,
                  report_folder: Path | None = None) -> tuple[RunContent, list[RunContent]]:
    """The cycle's run and one run per training job it ran, from the lake."""
    gate = gate_row(con, cycle_id)
    status = con.execute("SELECT status, snapshot_id FROM lake.cycles WHERE cycle_id = ?", [cycle_id]).fetchone()
    tags = {**_id_tags("cycle", cycle_id), **_gate_tags(gate)}
    if status:
        tags.update({"flywheel.status": str(status[0]), "flywheel.snapshot_id": str(status[1])})
    metrics = stage_metrics(con, cycle_id) + route_metrics(con, cycle_id)
    metrics += [(f"funnel/{_part(r['stage'])}", float(r["rows"]), 0) for r in funnel(con, cycle_id)]
    roles = {gate["candidate"]: "candidate", gate["production"]: "production"} if gate else {}
    metrics += pass_at_1_metrics(con, cycle_id, roles) + _gate_metrics(gate)
    files = {"gate.json": gate["decision"]} if gate else {}
    if gate:
        files["lineage.json"] = lineage(con, gate["candidate"])
    parent = RunContent(cycle_id, tags, flat_params(config), metrics, files, report_folder)
    return parent, job_contents(con, cycle_id, config)


def job_contents(con: duckdb.DuckDBPyConnection, cycle_id: str, config: Any) -> list[RunContent]:
    """One run per model this cycle trained, its optimiser steps as step-indexed metrics."""
    steps = con.execute("SELECT * FROM lake.train_steps WHERE cycle_id = ? ORDER BY policy_version, step",
                        [cycle_id])
    names = [d[0] for d in steps.description]  # `*`: a column this lake lacks is simply absent
    by_job: dict[str, list[dict]] = {}
    for row in steps.fetchall():
        record = dict(zip(names, row))
        by_job.setdefault(record["policy_version"], []).append(record)
    rounds = {counts.get("policy_version"): (r, secs) for r, secs, counts in _stage_rows(con, cycle_id, "train")}
    params = flat_params(config.train, "train.") if config is not None else {}
    jobs = []
    for version, rows in by_job.items():
        tags = _job_tags(cycle_id, version, model_row(con, version) or {}, rows)
        metrics = [(name, float(r[name]), int(r["step"])) for r in rows for name in STEP_METRICS
                   if r.get(name) is not None]
        if version in rounds:
            tags["flywheel.round"] = str(rounds[version][0])
            metrics.append(("train_stage_seconds", float(rounds[version][1]), 0))
        jobs.append(RunContent(f"{cycle_id} train {version[:12]}", tags, params, metrics))
    return jobs


def _job_tags(cycle_id: str, version: str, model: dict, rows: list[dict]) -> dict[str, str]:
    """The model the job made and its lineage; its status is the one when tracked."""
    tags = {"flywheel.kind": "train_job", "flywheel.cycle_id": cycle_id, "flywheel.policy_version": version}
    tags.update({f"flywheel.{name}": str(model.get(column)) for name, column in (
        ("parent_version", "parent_version"), ("model_uri", "uri"), ("model_status", "status"),
        ("model_reason", "reason"))})
    # without a reference model (kl_coef = 0), `kl` is to the policy that sampled the rollouts
    tags["flywheel.kl_to"] = "reference" if any(r.get("kl_reference") for r in rows) else "rollout policy"
    return tags


def evaluation_content(con: duckdb.DuckDBPyConnection, evaluation_id: str, models: dict, applied: dict | None,
                       config: Any) -> RunContent:
    """An on-demand evaluation's run: the candidate and production, pass@1, the gate."""
    gate = gate_row(con, evaluation_id, models["candidate"])
    tags = {**_id_tags("evaluation", evaluation_id), **_gate_tags(gate),
            "flywheel.candidate": str(models["candidate"]), "flywheel.production": str(models["production"]),
            "flywheel.applied": "false" if applied is None else applied.get("reason", "true")}
    params = {}
    if config is not None:
        params = {**flat_params(config.evaluate, "evaluate."), **flat_params(config.gate, "gate.")}
    roles = {models["candidate"]: "candidate", models["production"]: "production"}
    files = {"lineage.json": lineage(con, models["candidate"])}
    if gate:
        files["gate.json"] = gate["decision"]
    return RunContent(evaluation_id, tags, params,
                      pass_at_1_metrics(con, evaluation_id, roles) + _gate_metrics(gate), files)


def gate_row(con: duckdb.DuckDBPyConnection, cycle_id: str, candidate: str | None = None) -> dict | None:
    row = con.execute("SELECT candidate, production, promoted, reason, decision FROM lake.gate_decisions "
                      "WHERE cycle_id = ? AND candidate = coalesce(?, candidate) ORDER BY decided_at DESC LIMIT 1",
                      [cycle_id, candidate]).fetchone()
    if row is None:
        return None
    return dict(zip(("candidate", "production", "promoted", "reason"), row[:4]), decision=json.loads(row[4]))


def model_row(con: duckdb.DuckDBPyConnection, version: str) -> dict | None:
    cursor = con.execute("SELECT * FROM lake.models WHERE policy_version = ?", [version])
    row = cursor.fetchone()
    return None if row is None else {d[0]: _plain(v) for d, v in zip(cursor.description, row)}


def lineage(con: duckdb.DuckDBPyConnection, version: str | None) -> list[dict]:
    """The model's `models` row, then its parent's, up to the first model (or one not in the lake)."""
    chain, seen = [], set()
    while version is not None and version not in seen:
        seen.add(version)
        row = model_row(con, version)
        if row is None:
            break
        chain.append(row)
        version = row.get("parent_version")
    return chain


def stage_metrics(con: duckdb.DuckDBPyConnection, cycle_id: str) -> list[tuple[str, float, int]]:
    rows = con.execute("SELECT stage, coalesce(round, 0), seconds FROM lake.cycle_stages WHERE cycle_id = ? "
                       "ORDER BY finished_at", [cycle_id]).fetchall()
    return [(f"stage_seconds/{_part(stage)}", float(secs), int(r)) for stage, r, secs in rows]


def route_metrics(con: duckdb.DuckDBPyConnection, cycle_id: str) -> list[tuple[str, float, int]]:
    """Tasks per route (rl, sft, skip, retire) per round; none in a lake without `routes` rows."""
    exists = con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = 'lake' "
                         "AND table_name = 'routes'").fetchone()[0]
    if not exists:  # a lake no stage has opened for writing since the table was added
        return []
    rows = con.execute("SELECT route, round, count(*) FROM lake.routes WHERE cycle_id = ? "
                       "GROUP BY ALL ORDER BY ALL", [cycle_id]).fetchall()
    return [(f"routes/{_part(route)}", float(n), int(r)) for route, r, n in rows]


def pass_at_1_metrics(con: duckdb.DuckDBPyConnection, cycle_id: str, roles: dict) -> list[tuple[str, float, int]]:
    """pass@1 and its interval per model and set: keyed by role (candidate, production) where
    known, so runs of different cycles line up in MLflow's charts, else by version."""
    out = []
    for row in evaluation_table(con, cycle_id, GateConfig()):
        who = _part(roles.get(row["policy_version"], row["policy_version"]))
        which = "all" if row["eval_set"] == "(all)" else _part(row["eval_set"])
        out += [(f"{name}/{who}/{which}", float(row[column]), 0)
                for name, column in (("pass_at_1", "pass@1"), ("pass_at_1_low", "low"), ("pass_at_1_high", "high"))]
    return out


def _stage_rows(con: duckdb.DuckDBPyConnection, cycle_id: str, stage: str) -> list[tuple[int, float, dict]]:
    rows = con.execute("SELECT coalesce(round, 0), seconds, counts FROM lake.cycle_stages WHERE cycle_id = ? "
                       "AND stage = ?", [cycle_id, stage]).fetchall()
    return [(r, secs, json.loads(counts or "{}")) for r, secs, counts in rows]


def _id_tags(kind: str, cycle_id: str) -> dict[str, str]:
    return {"flywheel.kind": kind, "flywheel.cycle_id": cycle_id}


def _gate_tags(gate: dict | None) -> dict[str, str]:
    if gate is None:
        return {"flywheel.gate": "no decision"}
    return {"flywheel.candidate": str(gate["candidate"]), "flywheel.production": str(gate["production"]),
            "flywheel.gate": "promoted" if gate["promoted"] else "rejected",
            "flywheel.gate.reason": str(gate["reason"])}


def _gate_metrics(gate: dict | None) -> list[tuple[str, float, int]]:
    if gate is None:
        return []
    decision = gate["decision"]
    names = ("candidate", "production", "diff", "low", "high", "items", "unpaired")
    out = [(f"gate/{n}", float(decision[n]), 0) for n in names if isinstance(decision.get(n), (int, float))]
    return out + [("gate/promoted", float(bool(gate["promoted"])), 0)]


def flat_params(config: Any, prefix: str = "") -> dict[str, str]:
    """A config dataclass as {"train.grpo.lr": "3e-05", ...}: one MLflow param per setting path."""
    if config is None:
        return {}
    tree = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    out: dict[str, str] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flat_params(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(
                list(value) if isinstance(value, tuple) else value, default=str)
    return out


def _part(name: Any) -> str:
    """One component of a metric key: MLflow allows letters, digits and `_-. :` in names."""
    part = re.sub(r"[^\w.\- :]", "_", str(name)).strip()
    return "_" if part in ("", ".", "..") else part


def _plain(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value
