"""The cycle's stages as Prefect tasks: each opens the lake, runs its plain stage
function once per (cycle, stage, round) through `run_stage`, and returns small values
(counts, version strings), never tables. Tasks that touch the network or the object
store retry with backoff; compute stages do not (a retry would only repeat the crash).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import replace

import duckdb
from prefect import task

from storage.config_file import lake_settings
from storage.lake import open_lake, transaction
from tasks.curate.curation import curate
from tasks.cycle.config import cycle_config
from tasks.cycle.state import begin_cycle, finish_cycle, run_stage
from tasks.release.evaluate import Policy, evaluate_policies
from tasks.release.gate import GateDecision, decide
from tasks.ingest.batch import ingest_source
from tasks.ingest.sources import find_sources, split_unchanged
from tasks.release.models import local_model_dir, production_version, publish_model
from tasks.release.promote import record_gate
from tasks.reports.cycle_report import build_report, publish_report
from tasks.round.rollout import run_rollouts
from tasks.round.train import train_policy
from tasks.round.verify import verify_stage


def _landing(paths: list[str]) -> list[str]:
    settings = lake_settings()
    if paths:
        return paths
    if settings.uses_s3:
        return [f"s3://{settings.s3_bucket}/{settings.landing_prefix}"]
    folder = settings.home / settings.landing_prefix
    folder.mkdir(parents=True, exist_ok=True)
    return [str(folder)]


@task(name="begin-cycle", retries=2, retry_delay_seconds=[2, 10])
def begin_task(cycle_id: str) -> str:
    """Open (or reopen) the cycle's row; return the production model it starts from."""
    cycle_config()  # a bad [cycle] in flywheel.toml fails here, before any stage has worked
    begin_cycle(cycle_id)
    with _lake() as con:
        return production_version(con)


@task(name="ingest-landing", retries=2, retry_delay_seconds=[2, 10])
def ingest_landing_task(cycle_id: str, paths: list[str]) -> dict:
    cfg = cycle_config().ingest

    def work(con: duckdb.DuckDBPyConnection) -> dict:
        settings = lake_settings()
        pending, unchanged = split_unchanged(con, find_sources(_landing(paths), settings, allow_empty=True))
        results = [ingest_source(con, settings, source.uri, cfg, cycle_id) for source in pending]
        return {"files": len(results) + len(unchanged), "skipped": sum(r.skipped for r in results) + len(unchanged),
                "rows_ok": sum(r.rows_ok for r in results),
                "rows_quarantined": sum(r.rows_quarantined for r in results)}
    return run_stage(cycle_id, "ingest", work)


@task(name="curate")
def curate_task(cycle_id: str) -> dict:
    cfg = cycle_config().curate
    return run_stage(cycle_id, "curate", lambda con: dataclasses.asdict(curate(con, cfg, cycle_id)))


@task(name="rollout", task_run_name="rollout round {round_idx}")
def rollout_task(cycle_id: str, round_idx: int, policy: str, tasks_per_round: int, samples: int) -> dict:
    configured = cycle_config().rollout
    cfg = replace(configured, tasks_per_round=tasks_per_round, engine=replace(configured.engine, n=samples))

    def work(con: duckdb.DuckDBPyConnection) -> dict:
        model_dir = local_model_dir(lake_settings(), con, policy)
        return {"rollouts": run_rollouts(con, model_dir, policy, cycle_id, cfg, round_idx)}
    return run_stage(cycle_id, "rollout", work, round_idx)


@task(name="verify", task_run_name="verify round {round_idx}")
def verify_task(cycle_id: str, round_idx: int) -> dict:
    cfg = cycle_config().verify
    return run_stage(cycle_id, "verify", lambda con: verify_stage(con, cycle_id, round_idx, cfg), round_idx)


@task(name="train", task_run_name="train round {round_idx}")
def train_task(cycle_id: str, round_idx: int, policy: str, steps: int | None = None) -> str:
    """GRPO on the round's verified rollouts; returns the new policy (or `policy` if nothing to learn)."""
    configured = cycle_config().train
    cfg = configured if steps is None else replace(configured, grpo=replace(configured.grpo, steps=steps))

    def work(con: duckdb.DuckDBPyConnection) -> dict:
        settings = lake_settings()
        scored = con.execute("SELECT count(*) FROM lake.rollouts r JOIN lake.verdicts v USING (rollout_id) "
                             "WHERE r.cycle_id = ? AND r.round = ?", [cycle_id, round_idx]).fetchone()[0]
        if scored == 0:
            return {"policy_version": policy, "trained": False}
        base = local_model_dir(settings, con, policy)
        version = train_policy(con, base, policy, round_idx, settings.home / "jobs", cycle_id, cfg)
        if settings.uses_s3:
            uri = publish_model(settings, local_model_dir(settings, con, version), version)
            with transaction(con, message=f"model {version[:12]} stored at {uri}"):
                con.execute("UPDATE lake.models SET uri = ? WHERE policy_version = ?", [uri, version])
        # every step row carries the job's group counts
        steps = con.execute("SELECT count(*), max(groups_kept), max(groups_dropped) FROM lake.train_steps "
                            "WHERE policy_version = ?", [version]).fetchone()
        return {"policy_version": version, "trained": True, "steps": steps[0],
                "groups_kept": int(steps[1] or 0), "groups_dropped": int(steps[2] or 0)}
    return run_stage(cycle_id, "train", work, round_idx)["policy_version"]


@task(name="evaluate")
def evaluate_task(cycle_id: str, candidate: str, production: str, samples: int) -> dict:
    """Score candidate and production on every eval set; return the gate's decision."""
    config = cycle_config()
    cfg = replace(config.evaluate, engine=replace(config.evaluate.engine, n=samples), k=min(config.evaluate.k, samples))

    def work(con: duckdb.DuckDBPyConnection) -> dict:
        if candidate == production:
            return {"decision": None, "reason": "no new candidate this cycle (nothing was trained)"}
        settings = lake_settings()
        cand, prod = evaluate_policies(con, [
            Policy(str(local_model_dir(settings, con, candidate)), candidate),
            Policy(str(local_model_dir(settings, con, production)), production, also_check=(candidate,))],
            cfg, cycle_id)
        decision = decide(cand.item_scores, prod.item_scores, config.gate)
        return {"decision": decision.to_dict(), "candidate": cand.headline, "production": prod.headline,
                "contaminated": len(cand.contaminated)}
    return run_stage(cycle_id, "evaluate", work)


@task(name="promote")
def promote_task(cycle_id: str, candidate: str, evaluation: dict) -> dict:
    def work(con: duckdb.DuckDBPyConnection) -> dict:
        if evaluation.get("decision") is None:
            return {"promoted": False, "reason": evaluation.get("reason", "no decision")}
        decision = GateDecision.from_dict(evaluation["decision"])
        record_gate(con, candidate, decision, cycle_id)
        return {"promoted": decision.promoted, "reason": decision.reason}
    return run_stage(cycle_id, "promote", work)


@task(name="finish-cycle", retries=2, retry_delay_seconds=[2, 10])
def finish_task(cycle_id: str) -> dict:
    return finish_cycle(cycle_id, "completed")


@task(name="report")
def report_task(cycle_id: str) -> str:
    settings = lake_settings()
    with _lake() as con:
        row = con.execute("SELECT counts FROM lake.cycle_stages WHERE cycle_id = ? AND stage = 'evaluate'",
                          [cycle_id]).fetchone()
        saved = json.loads(row[0]).get("decision") if row is not None else None
        decision = GateDecision.from_dict(saved) if saved else None
        report = build_report(con, cycle_id, settings.home, gate=decision)
    publish_report(report)
    return str(settings.home / "reports" / cycle_id)


def mark_failed(flow, flow_run, state) -> None:
    """Flow failure hook: the cycle's row says failed, with the reason."""
    params = (flow_run.parameters or {}).get("params") or {}
    cycle_id = params.get("cycle_id") or f"cycle-{flow_run.id}"
    finish_cycle(cycle_id, "failed", reason=(state.message or "failed")[:1000])


class _lake:
    def __enter__(self) -> duckdb.DuckDBPyConnection:
        self.con = open_lake(lake_settings())
        return self.con

    def __exit__(self, *exc) -> None:
        self.con.close()
