"""The `evaluate` flow: one model against production, on demand.

Run from the UI, the webhook (`POST /hooks/evaluate`) or `prefect deployment run
evaluate/evaluate` when the question is "is this model better than production?"
outside a cycle: after registering a new evaluation set, for a candidate a cycle
left undecided, or for a model registered by hand. It runs the cycle's own
evaluate and gate stages, so the numbers mean what they mean in a cycle: both models
sampled on the newest version of every registered evaluation set, contaminated
items excluded, the gate's paired bootstrap deciding. Nothing changes in `models`
unless `apply_gate` is set, in which case the promote stage applies the decision
exactly as a cycle would.

An evaluation is keyed by its id as a cycle stage is keyed by its cycle: its
`evaluations` rows and `cycle_stages` records carry the id in `cycle_id`, so a
rerun with the same `evaluation_id` returns the finished result instead of
sampling again. It writes no `cycles` row (it is not a cycle) and has no
`fresh-failures` set (those are one cycle's held-out tasks; the cycle that trained
the model scored them).
"""
from __future__ import annotations

from prefect import flow
from prefect.runtime import flow_run

from flows.evaluate_params import EvaluateParams
from tasks.cycle.prefect_tasks import pick_models_task, publish_task, stage_task
from tasks.stages import StageKey


@flow(name="evaluate", log_prints=True)
def evaluate_flow(params: EvaluateParams = EvaluateParams()) -> dict:
    evaluation_id = params.evaluation_id or f"eval-{flow_run.get_id() or 'local'}"
    models = pick_models_task(params.policy_version)
    key = StageKey(evaluation_id, policy=models["candidate"], production=models["production"])
    scores = stage_task("evaluate", key, params.overrides())
    gate = stage_task("gate", key, params.overrides())
    applied = stage_task("promote", key) if params.apply_gate else None
    publish_task(evaluation_id, models, applied, params.overrides())
    return {"evaluation_id": evaluation_id, **models, "decision": gate.get("decision"),
            "candidate_scores": scores.get("candidate"), "production_scores": scores.get("production"),
            "contaminated": scores.get("contaminated"), "left_out": scores.get("left_out"), "applied": applied}
