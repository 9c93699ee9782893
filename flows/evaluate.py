"""The `evaluate` flow: one model against production, on demand.

Run from the UI, the webhook (`POST /hooks/evaluate`) or `prefect deployment run
evaluate/evaluate` when the question is "is this model better than production?"
outside a cycle: after registering a new evaluation set, for a candidate a cycle
left undecided, or for a model registered by hand. It calls the cycle's own
`evaluate_task`, so the numbers mean what they mean in a cycle: both models
sampled on the newest version of every registered evaluation set, contaminated
items excluded, the gate's paired bootstrap deciding. Nothing changes in `models`
unless `apply_gate` is set, in which case `promote_task` applies the decision
exactly as a cycle would.

An evaluation is keyed by its id as a cycle stage is keyed by its cycle: its
`evaluations` rows and `cycle_stages` records carry the id in `cycle_id`, so a
rerun with the same `evaluation_id` returns the finished result instead of
sampling again. It writes no `cycles` row (it is not a cycle) and has no
`fresh-failures` set (those are one cycle's held-out tasks; the cycle that trained
the model scored them).
"""
from __future__ import annotations

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run

from flows.evaluate_params import EvaluateParams
from storage.config_file import lake_settings
from storage.lake import open_lake
from tasks.cycle.prefect_tasks import evaluate_task, promote_task
from tasks.release.gate import GateConfig
from tasks.release.models import ModelNotFound, newest_candidate, production_version
from tasks.reports.cycle_report import evaluation_table


# No retries: a model that is not in the lake will not appear on a second try.
@task(name="pick-models")
def pick_models_task(policy_version: str | None) -> dict:
    """The model to evaluate (default: the newest candidate) and the production model."""
    con = open_lake(lake_settings(), read_only=True)
    try:
        production = production_version(con)
        candidate = policy_version or newest_candidate(con)
        if not con.execute("SELECT count(*) FROM lake.models WHERE policy_version = ?", [candidate]).fetchone()[0]:
            raise ModelNotFound(f"no model {candidate!r} in the lake (`flywheel model list` shows them)")
    finally:
        con.close()
    if candidate == production:
        raise ValueError(f"{candidate} is the production model: there is nothing to compare it with")
    return {"candidate": candidate, "production": production}


@task(name="publish-evaluation")
def publish_task(evaluation_id: str, models: dict, result: dict, applied: dict | None) -> None:
    """The pass@1 table and the gate's answer as Prefect artifacts of this run."""
    con = open_lake(lake_settings(), read_only=True)
    try:
        table = evaluation_table(con, evaluation_id, GateConfig())
    finally:
        con.close()
    create_table_artifact(table or [{"policy_version": None}], key="flywheel-evaluation",
                          description=f"evaluation {evaluation_id}: pass@1 with intervals")
    decision = result.get("decision")
    verdict = (f"**{'PROMOTE' if decision['promoted'] else 'REJECT'}** — {decision['reason']}"
               if decision else f"no decision: {result.get('reason')}")
    action = ("applied to `models`: " + applied["reason"] if applied is not None
              else "not applied (`apply_gate` is off); `models` is unchanged")
    create_markdown_artifact(
        f"# evaluation `{evaluation_id}`\n\ncandidate `{models['candidate']}` against production "
        f"`{models['production']}`\n\n{verdict}\n\n{action}\n",
        key="flywheel-gate", description=f"evaluation {evaluation_id}: the gate's decision")


@flow(name="evaluate", log_prints=True)
def evaluate_flow(params: EvaluateParams = EvaluateParams()) -> dict:
    evaluation_id = params.evaluation_id or f"eval-{flow_run.get_id() or 'local'}"
    models = pick_models_task(params.policy_version)
    result = evaluate_task(evaluation_id, models["candidate"], models["production"], params.eval_samples)
    applied = promote_task(evaluation_id, models["candidate"], result) if params.apply_gate else None
    publish_task(evaluation_id, models, result, applied)
    return {"evaluation_id": evaluation_id, **models, "decision": result.get("decision"),
            "candidate_scores": result.get("candidate"), "production_scores": result.get("production"),
            "applied": applied}
