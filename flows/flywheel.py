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

The rounds overlap (`[cycle.rollout] max_staleness`, default 1): round r is sampled by
the policy round r - 1 trained from, so its sampling runs while round r - 1 trains.
"""
from __future__ import annotations

from prefect import flow
from prefect.futures import PrefectFuture, wait
from prefect.runtime import flow_run

from flows.cycle_params import CycleParams
from tasks.cycle.config import cycle_config
from tasks.cycle.prefect_tasks import begin_task, finish_task, mark_failed, report_task, stage_submit, stage_task
from tasks.stages import StageKey
from trainer.warm_engine import shared_engine


@flow(name="flywheel-cycle", on_failure=[mark_failed], log_prints=True)
def flywheel_cycle(params: CycleParams = CycleParams()) -> dict:
    # One vLLM engine for the rounds and the evaluation: each policy's weights are loaded
    # into it in place (trainer/warm_engine.py); closed when the cycle ends, failed or not.
    with shared_engine() as engine:
        cycle_id = params.cycle_id or f"cycle-{flow_run.get_id() or 'local'}"
        run = params.overrides()
        production = begin_task(cycle_id)
        # read after the cycle's row exists: a bad override fails a recorded cycle
        cfg = cycle_config(run)
        if cfg.rollout.engine.backend == "vllm" and cfg.rollout.engine.warm:
            engine.start()  # its worker imports vLLM while ingest and curate run
        stage_task("ingest", StageKey(cycle_id, landing=tuple(params.landing)), run)
        stage_task("curate", StageKey(cycle_id), run)
        policy = train_rounds(cycle_id, production, params.rounds, cfg.rollout.max_staleness, run)
        release = StageKey(cycle_id, policy=policy, production=production)
        stage_task("evaluate", release, run)
        stage_task("gate", release, run)
        stage_task("promote", release, run)
        summary = finish_task(cycle_id)
        report = report_task(cycle_id, run)
        return {**summary, "report": report["folder"]}


def train_rounds(cycle_id: str, production: str, rounds: int, staleness: int, run: dict) -> str:
    """The rounds, each sampled by the policy `staleness` rounds older than the one it
    trains from (production for the first); returns the last round's policy.

    A round's rollout and verify stages run here while earlier rounds' train stages run
    in the flow's task runner; a train stage starts once its round is scored and the
    round before it has trained. The order depends on `staleness` only, never on
    timing, so a rerun samples and trains the same rounds. At 0 each round waits for
    the one before: the synchronous loop.
    """
    policies = [production]  # policies[r]: the policy round r trains from
    training: list[PrefectFuture] = []

    def policy(r: int) -> str:
        while len(policies) <= r:  # wait for the train stage that makes it
            policies.append(training[len(policies) - 1].result()["policy_version"])
        return policies[r]

    try:
        for r in range(rounds):
            behaviour = policy(max(0, r - staleness))
            sampled = StageKey(cycle_id, r, policy=behaviour)
            stage_task("rollout", sampled, run)
            stage_task("verify", sampled, run)
            base = policy(r)
            trains = StageKey(cycle_id, r, policy=base, behaviour="" if behaviour == base else behaviour)
            training.append(stage_submit("train", trains, run))
        return policy(rounds)
    finally:
        wait(training)  # a failed round never leaves a training job running unobserved
