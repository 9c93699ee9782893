"""Adaptive sampling: sample a few, score them, and sample the rest of a group only
where the task's route is still undecided (tasks/round/routing.py says which).

One round's selected tasks go through at most two waves: a first wave of
`routing.first_wave` samples each (`first_samples`, fewer for a task whose recent
samples all agreed, or its domain's while it has few of its own), then the rest of the
group (engine.n) for the tasks `routing.needs_more` names. Each wave is scored as it
arrives (the rollout needs its verdicts to decide), so the round's rollouts, verdicts
and routes come out together and the rollout stage commits them in one transaction.
Sample ids continue across waves (0..n-1 per task), so a topped-up group is exactly a
fixed-G group to the trainer. Not here: picking the tasks (tasks/round/rollout.py),
writing the lake.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from storage.schemas import SCHEMAS
from tasks.round.routing import History, RoutingConfig, decide, evidence, first_wave, needs_more, wilson
from tasks.round.verify import VerifyStageConfig, score_rollouts
from trainer.engine import EngineConfig, Sample, generate
from verifiers.registry import VERIFIERS
from verifiers.verdict import INFRA_STATUSES


def first_sizes(tasks: list[dict], engine: EngineConfig, routing: RoutingConfig) -> list[int]:
    """Each task's first wave: engine.n for fixed G, else what its history calls for."""
    if not routing.adaptive:
        return [engine.n] * len(tasks)
    return [min(first_wave(_evidence(t, routing), routing), engine.n) for t in tasks]


def sample_wave(model_dir: str | Path, tasks: list[dict], engine: EngineConfig, sizes: list[int],
                first_idx: list[int], wave: int) -> list[tuple[dict, Sample]]:
    """`sizes[i]` samples of task i, numbered from `first_idx[i]`, one engine call per
    size; each wave has its own seed, so a top-up never repeats the first wave's samples."""
    pairs = []
    for n in sorted(set(sizes) - {0}):
        group = [i for i, size in enumerate(sizes) if size == n]
        cfg = replace(engine, n=n, seed=engine.seed + wave)
        samples = generate(model_dir, [json.loads(tasks[i]["messages"]) for i in group], cfg,
                           [tasks[i]["domain"] for i in group],
                           template_args=[template_args(tasks[i]) for i in group])
        pairs += [(tasks[group[s.prompt_idx]], replace(s, sample_idx=s.sample_idx + first_idx[group[s.prompt_idx]]))
                  for s in samples]
    return pairs


def template_args(task: dict) -> dict | None:
    """The chat template's arguments a task's prompt is rendered with (its
    `chat_template_kwargs`, from the production call it came from), None for the defaults."""
    stored = task.get("chat_template_kwargs")
    return json.loads(stored) if stored else None


def sample_and_route(model_dir: str | Path, tasks: list[dict], engine: EngineConfig, routing: RoutingConfig,
                     verify: VerifyStageConfig, make_rollouts, cycle_id: str) -> dict:
    """Sample, score and route `tasks`. `make_rollouts(pairs)` turns (task, Sample) pairs
    into `rollouts` rows. Returns the three tables and the counts."""
    first = first_sizes(tasks, engine, routing)
    rollouts = make_rollouts(sample_wave(model_dir, tasks, engine, first, [0] * len(tasks), wave=0))
    verdicts = score_rollouts(_scoring_rows(rollouts, tasks), verify, cycle_id)
    tally = _tally(rollouts, verdicts)
    undecided = [i for i, t in enumerate(tasks)
                 if first[i] < engine.n and needs_more(*tally.get(t["task_id"], (0, 0)), _evidence(t, routing))]
    if undecided:
        top_up = [tasks[i] for i in undecided]
        more = make_rollouts(sample_wave(model_dir, top_up, engine, [engine.n - first[i] for i in undecided],
                                         [first[i] for i in undecided], wave=1))
        more_verdicts = score_rollouts(_scoring_rows(more, top_up), verify, cycle_id)
        rollouts, verdicts = pa.concat_tables([rollouts, more]), pa.concat_tables([verdicts, more_verdicts])
        tally = _tally(rollouts, verdicts)
    saved = sum(engine.n - size for size in first) - sum(engine.n - first[i] for i in undecided)
    return {"rollouts": rollouts, "verdicts": verdicts, "routes": route_rows(tasks, tally, routing),
            "topped_up": len(undecided), "samples_saved": saved}


def _history(task: dict) -> History:
    return History(int(task.get("recent_samples") or 0), int(task.get("recent_passes") or 0))


def _evidence(task: dict, routing: RoutingConfig) -> History:
    """What the task's sampling goes by: its history, or its domain's (routing.evidence)."""
    domain = History(int(task.get("domain_samples") or 0), int(task.get("domain_passes") or 0))
    return evidence(_history(task), domain, routing)


def _scoring_rows(rollouts: pa.Table, tasks: list[dict]) -> list[dict]:
    by_id = {t["task_id"]: t for t in tasks}
    return [{"rollout_id": r["rollout_id"], "verifier": by_id[r["task_id"]]["verifier"],
             "spec": json.loads(by_id[r["task_id"]]["spec"]), "prompt": by_id[r["task_id"]]["prompt"],
             "completion": r["completion"]}
            for r in rollouts.select(["rollout_id", "task_id", "completion"]).to_pylist()]


def _tally(rollouts: pa.Table, verdicts: pa.Table) -> dict[str, tuple[int, int]]:
    """task_id -> (passes, judged samples); infra failures judge nothing and are left out."""
    task_of = dict(zip(rollouts["rollout_id"].to_pylist(), rollouts["task_id"].to_pylist(), strict=True))
    tally: dict[str, list[int]] = {}
    for rid, passed, status in zip(verdicts["rollout_id"].to_pylist(), verdicts["passed"].to_pylist(),
                                   verdicts["status"].to_pylist(), strict=True):
        if status in INFRA_STATUSES:
            continue
        counts = tally.setdefault(task_of[rid], [0, 0])
        counts[0] += bool(passed)
        counts[1] += 1
    return {task: (passes, judged) for task, (passes, judged) in tally.items()}


def has_reference(task: dict) -> bool:
    """Whether the task's spec holds a solution the supervised route can train on."""
    verifier = VERIFIERS.get(task["verifier"])
    return verifier is not None and verifier.gold_completion(json.loads(task["spec"])) is not None


def route_rows(tasks: list[dict], tally: dict[str, tuple[int, int]], routing: RoutingConfig) -> list[dict]:
    """One `routes` row per task (less the round's ids, which the caller adds)."""
    rows = []
    for task in tasks:
        passes, judged = tally.get(task["task_id"], (0, 0))
        route = decide(passes, judged, _history(task), has_reference(task), routing)
        low, high = wilson(passes, judged, routing.confidence)
        rows.append({"task_id": task["task_id"], "domain": task["domain"], "samples": judged, "passes": passes,
                     "pass_rate": passes / judged if judged else None, "pass_low": low, "pass_high": high,
                     "route": route.route, "reason": route.reason})
    return rows


def routes_table(rows: list[dict], policy_version: str, round_idx: int, cycle_id: str) -> pa.Table:
    return pa.Table.from_pylist([{**r, "policy_version": policy_version, "round": round_idx, "cycle_id": cycle_id}
                                 for r in rows], schema=SCHEMAS["routes"])
