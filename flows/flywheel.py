"""The flywheel cycle: one Prefect flow, the pipeline in order.

ingest new landing files -> curate -> (rollout -> verify -> train) x rounds
-> evaluate -> gate -> promote -> report (files, Prefect artifacts, MLflow runs).
Every stage is `tasks.stages.STAGES[name]`
run by one generic Prefect task that records its completion in `cycle_stages`;
rerunning a cycle with the same cycle_id continues from the first stage that did not
finish. A stage that still fails after its retries marks the cycle `failed` with the
reason (the flow's failure hook), and since every stage commits its rows together,
nothing half-written becomes visible. Every vLLM sampling of the cycle (rollout waves,
evaluation) goes to one warm engine the flow holds (`EngineConfig.warm` turns it off).
"""
from __future__ import annotations

from prefect import flow
from prefect.runtime import flow_run

from flows.cycle_params import CycleParams
from tasks.cycle.prefect_tasks import begin_task, finish_task, mark_failed, report_task, stage_task
from tasks.stages import StageKey
from trainer.warm_engine import shared_engine


@flow(name="flywheel-cycle", on_failure=[mark_failed], log_prints=True)
def flywheel_cycle(params: CycleParams = CycleParams()) -> dict:
    # One vLLM engine for the rounds and the evaluation: each policy's weights are loaded
    # into it in place (trainer/warm_engine.py); closed when the cycle ends, failed or not.
    with shared_engine():
        cycle_id = params.cycle_id or f"cycle-{flow_run.get_id() or 'local'}"
        run = params.overrides()
        production = begin_task(cycle_id)
        stage_task("ingest", StageKey(cycle_id, landing=tuple(params.landing)), run)
        stage_task("curate", StageKey(cycle_id), run)
        policy = production
        for round_idx in range(params.rounds):
            key = StageKey(cycle_id, round_idx, policy=policy)
            stage_task("rollout", key, run)
            stage_task("verify", key, run)
            policy = stage_task("train", key, run)["policy_version"]
        release = StageKey(cycle_id, policy=policy, production=production)
        stage_task("evaluate", release, run)
        stage_task("gate", release, run)
        stage_task("promote", release, run)
        summary = finish_task(cycle_id)
        report_task(cycle_id, run)
        return summary
