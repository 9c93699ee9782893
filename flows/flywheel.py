"""The flywheel cycle: one Prefect flow, the pipeline in order.

ingest new landing files -> curate -> (rollout -> verify -> train) x rounds
-> evaluate -> promote -> report. Each stage is a Prefect task (tasks/cycle/prefect_tasks.py)
that records its completion in `cycle_stages`; rerunning a cycle with the same
cycle_id continues from the first stage that did not finish. A stage that still
fails after its retries marks the cycle `failed` with the reason (the flow's
failure hook), and since every stage commits its rows together, nothing
half-written becomes visible.
"""
from __future__ import annotations

from prefect import flow
from prefect.runtime import flow_run

from flows.cycle_params import CycleParams
from tasks.cycle.prefect_tasks import (begin_task, curate_task, evaluate_task, finish_task, ingest_landing_task,
                               mark_failed, promote_task, report_task, rollout_task, train_task,
                               verify_task)


@flow(name="flywheel-cycle", on_failure=[mark_failed], log_prints=True)
def flywheel_cycle(params: CycleParams = CycleParams()) -> dict:
    cycle_id = params.cycle_id or f"cycle-{flow_run.get_id() or 'local'}"
    production = begin_task(cycle_id)
    ingest_landing_task(cycle_id, params.landing)
    curate_task(cycle_id)
    policy = production
    for round_idx in range(params.rounds):
        rollout_task(cycle_id, round_idx, policy, params.tasks_per_round, params.samples_per_task)
        verify_task(cycle_id, round_idx)
        policy = train_task(cycle_id, round_idx, policy, params.train_steps)
    decision = evaluate_task(cycle_id, policy, production, params.eval_samples)
    promote_task(cycle_id, policy, decision)
    summary = finish_task(cycle_id)
    report_task(cycle_id)
    return summary
