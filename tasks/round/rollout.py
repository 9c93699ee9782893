"""Rollout stage: pick tasks, sample G completions each with the policy, write `rollouts`.

Selection leaves out retired tasks (solved reliably, `routes`), balances domains (round-robin over domains) and follows a curriculum: a task
whose recent pass rate is strictly between 0 and 1 teaches the most (its group will
have reward variance), an unseen task comes next, a task always passed or always
failed last. The policy samples through trainer.engine (vLLM everywhere; the
transformers engine as the reference). Rows are ids by content: rollout_id = sha256 of
(policy_version, round, task_id, sample_idx), so rerunning a round writes nothing new.
The stage samples adaptively and routes each task by difficulty (tasks/round/adaptive.py,
routing.py), writing `rollouts`, `verdicts` and `routes` in one commit.
Not here: scoring (tasks/round/scoring.py), training (tasks/round/train.py).
"""
from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa

from storage.config_file import lake_settings
from storage.lake import append_rows, transaction
from storage.lake_turn import lake_released
from storage.schemas import ROUTES, SCHEMAS
from tasks.curate.holdout import is_heldout
from tasks.release.models import local_model_dir
from tasks.round.adaptive import routes_table, sample_and_route, sample_wave, template_args
from tasks.round.routing import RoutingConfig
from tasks.round.verify import VerifyStageConfig, verdict_counts
from trainer.engine import PROMPT_TOO_LONG, PROMPT_UNRENDERABLE, EngineConfig, Sample, prompt_problems
from verifiers.verdict import INFRA_STATUSES_SQL

if TYPE_CHECKING:
    from tasks.stages import StageKey


@dataclass(frozen=True)
class RolloutConfig:
    tasks_per_round: int = 64
    engine: EngineConfig = field(default_factory=EngineConfig)
    # Share of the round given to tasks with a pass rate in (0, 1) when there are enough.
    curriculum: bool = True
    domains: tuple[str, ...] = ()
    """Train only on tasks of these domains (empty: all). A policy that cannot yet
    write code wastes a round on code tasks: every group scores 0 and is dropped."""
    recent_rounds: int = 3  # pass rates look at this many most recent rounds per task
    heldout_fraction: float = 0.1  # must equal EvalConfig.heldout_fraction
    seed: int = 0
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    """Adaptive sampling and routing by difficulty (tasks/round/routing.py)."""
    max_staleness: int = 1
    """Round r is sampled by the policy round r - max_staleness trained from (production
    for the first rounds), so its sampling runs while earlier rounds train (flows/
    flywheel.py); the trainer corrects with the truncated importance weight against
    the sampled logprobs (trainer/loss.py). 0: the synchronous loop, each round sampled
    by the policy it trains."""

    def __post_init__(self) -> None:
        if self.tasks_per_round < 1:
            raise ValueError("RolloutConfig.tasks_per_round must be >= 1")
        if self.recent_rounds < 1:
            raise ValueError("RolloutConfig.recent_rounds must be >= 1")
        if self.max_staleness < 0:
            raise ValueError("RolloutConfig.max_staleness must be >= 0 (0: sample each round with the policy it trains)")
        if any(not isinstance(d, str) or not d for d in self.domains):
            raise ValueError(f"RolloutConfig.domains must be domain names, got {self.domains!r}")


# A task's recent rounds are its last `recent_rounds` (cycle, round) pairs in time: round
# numbers restart at 0 in every cycle, so they order rounds only within one cycle. A cycle
# orders by when it started (`cycles`); rollouts of a cycle with no row there (a bare
# `run_rollouts`) count as the oldest.
CYCLE_STARTS_SQL = "SELECT cycle_id, min(started_at) AS started_at FROM lake.cycles GROUP BY cycle_id"


def _scored_by_recency(key: str) -> str:
    """A WITH clause: `scored`, every judged sample with its task, its domain and the
    recency of its round among the rounds of its `key` (1 = the latest)."""
    return f"""
WITH started AS ({CYCLE_STARTS_SQL}),
scored AS (
    SELECT t.task_id, t.domain, v.passed,
           dense_rank() OVER (PARTITION BY {key}
                              ORDER BY c.started_at DESC NULLS LAST, r.cycle_id DESC, r.round DESC) AS recency
    FROM lake.rollouts r JOIN lake.verdicts v USING (rollout_id) JOIN lake.tasks t USING (task_id)
         LEFT JOIN started c ON c.cycle_id = r.cycle_id
    WHERE v.status NOT IN {INFRA_STATUSES_SQL}
)"""


CANDIDATES_SQL = _scored_by_recency("t.task_id") + """
SELECT t.task_id, t.domain, t.messages, t.verifier, t.spec, t.prompt, t.chat_template_kwargs,
       avg(CASE WHEN s.passed THEN 1.0 ELSE 0.0 END) AS pass_rate,
       count(s.passed) AS recent_samples, count(s.passed) FILTER (WHERE s.passed) AS recent_passes
FROM lake.tasks t LEFT JOIN scored s ON s.task_id = t.task_id AND s.recency <= ?
WHERE t.task_id NOT IN (SELECT task_id FROM lake.routes WHERE route = 'retire')
GROUP BY t.task_id, t.domain, t.messages, t.verifier, t.spec, t.prompt, t.chat_template_kwargs
ORDER BY t.task_id
"""
# A domain's recent samples: those of its last `recent_rounds` rounds, as for a task.
DOMAIN_HISTORY_SQL = _scored_by_recency("t.domain") + """
SELECT domain, count(*) AS samples, count(*) FILTER (WHERE passed) AS passes
FROM scored WHERE recency <= ? GROUP BY domain
"""


def priority(pass_rate: float | None, curriculum: bool) -> int:
    """0 = most useful. Without a curriculum every task ranks the same."""
    if not curriculum:
        return 0
    if pass_rate is None:
        return 1
    return 0 if 0 < pass_rate < 1 else 2


def select_tasks(candidates: list[dict], cfg: RolloutConfig) -> list[dict]:
    """Up to tasks_per_round candidates of the configured domains: by curriculum
    priority, domains taking turns."""
    rng = random.Random(cfg.seed)
    if cfg.domains:
        candidates = [c for c in candidates if c["domain"] in cfg.domains]
    by_domain: dict[str, list[dict]] = {}
    for c in sorted(candidates, key=lambda c: (priority(c["pass_rate"], cfg.curriculum), rng.random())):
        by_domain.setdefault(c["domain"], []).append(c)
    chosen: list[dict] = []
    queues = [by_domain[d] for d in sorted(by_domain)]
    while len(chosen) < cfg.tasks_per_round and any(queues):
        # each round-robin pass takes the best remaining task of every domain, best first
        heads = sorted((q.pop(0) for q in queues if q), key=lambda c: priority(c["pass_rate"], cfg.curriculum))
        chosen.extend(heads[:cfg.tasks_per_round - len(chosen)])
    return chosen


def rollout_id(cycle_id: str, policy_version: str, round_idx: int, task_id: str, sample_idx: int) -> str:
    key = json.dumps([cycle_id, policy_version, round_idx, task_id, sample_idx])
    return hashlib.sha256(key.encode()).hexdigest()


def rollout_table(pairs: list[tuple[dict, Sample]], policy_version: str, round_idx: int,
                  cycle_id: str) -> pa.Table:
    """`rollouts` rows for (task, sample) pairs."""
    rows = [{
        "rollout_id": rollout_id(cycle_id, policy_version, round_idx, task["task_id"], s.sample_idx),
        "task_id": task["task_id"], "policy_version": policy_version, "round": round_idx,
        "sample_idx": s.sample_idx, "completion": s.text, "prompt_token_ids": s.prompt_token_ids,
        "token_ids": s.token_ids, "logprobs": s.logprobs, "finish_reason": s.finish_reason,
        "cycle_id": cycle_id} for task, s in pairs]
    return pa.Table.from_pylist(rows, schema=SCHEMAS["rollouts"])


def run_rollouts(con: duckdb.DuckDBPyConnection, model_dir: str | Path, policy_version: str,
                 cycle_id: str, cfg: RolloutConfig = RolloutConfig(), round_idx: int = 0) -> int:
    """Sample this round's tasks (engine.n each, unscored) and append the rollouts;
    returns rows written (0 on rerun)."""
    return sample_round(con, model_dir, policy_version, cycle_id, cfg, round_idx)["rollouts"]


def round_candidates(con: duckdb.DuckDBPyConnection, recent_rounds: int) -> list[dict]:
    """Every task not retired, with its pass rate and counts over its recent rounds, and
    its domain's counts over the domain's recent rounds."""
    cols = ["task_id", "domain", "messages", "verifier", "spec", "prompt", "chat_template_kwargs", "pass_rate",
            "recent_samples", "recent_passes"]
    domains = {d: (s, p) for d, s, p in con.execute(DOMAIN_HISTORY_SQL, [recent_rounds]).fetchall()}
    candidates = [dict(zip(cols, row)) for row in con.execute(CANDIDATES_SQL, [recent_rounds]).fetchall()]
    for c in candidates:
        c["domain_samples"], c["domain_passes"] = domains.get(c["domain"], (0, 0))
    return candidates


def pick_round_tasks(con: duckdb.DuckDBPyConnection, model_dir: str | Path,
                     cfg: RolloutConfig) -> tuple[list, Counter]:
    """This round's tasks, and how many candidates were left out, by reason: a prompt too
    long for the context (vLLM refuses a whole batch for one) or one the model's chat
    template refuses (trainer.engine.prompt_problems)."""
    candidates = round_candidates(con, cfg.recent_rounds)
    # held-out tasks are the fresh-failures evaluation set: never trained on
    candidates = [c for c in candidates if not is_heldout(c["task_id"], cfg.heldout_fraction)]
    if cfg.domains:
        candidates = [c for c in candidates if c["domain"] in cfg.domains]
    problems = prompt_problems(model_dir, [json.loads(c["messages"]) for c in candidates], cfg.engine,
                               [c["domain"] for c in candidates], [template_args(c) for c in candidates])
    usable = [c for c, problem in zip(candidates, problems, strict=True) if problem is None]
    return select_tasks(usable, cfg), Counter(p for p in problems if p is not None)


def _left_out(problems: Counter) -> dict:
    return {"prompts_too_long": problems[PROMPT_TOO_LONG], "prompts_unrenderable": problems[PROMPT_UNRENDERABLE]}


def sample_round(con: duckdb.DuckDBPyConnection, model_dir: str | Path, policy_version: str,
                 cycle_id: str, cfg: RolloutConfig, round_idx: int, verify: VerifyStageConfig | None = None) -> dict:
    """Sample the round's tasks and commit what came of it, with counts. With `verify`
    (the stage): sampled in waves, scored and routed (tasks/round/adaptive.py), and the
    round's rollouts, verdicts and routes land in one commit. Without: engine.n samples
    per task, unscored."""
    done = con.execute("SELECT count(*) FROM lake.rollouts WHERE cycle_id = ? AND round = ?",
                       [cycle_id, round_idx]).fetchone()[0]
    if done:
        return {"rollouts": 0, **_left_out(Counter())}
    tasks, problems = pick_round_tasks(con, model_dir, cfg)
    if not tasks:
        return {"rollouts": 0, **_left_out(problems)}

    def make_rollouts(pairs):
        return rollout_table(pairs, policy_version, round_idx, cycle_id)

    # sampling and scoring leave the lake to the stage an overlapped cycle trains meanwhile
    if verify is None:
        with lake_released(con):
            n = len(tasks)
            table = make_rollouts(sample_wave(model_dir, tasks, cfg.engine, [cfg.engine.n] * n, [0] * n, wave=0))
        with transaction(con, f"rollouts {policy_version} round {round_idx}"):
            return {"rollouts": append_rows(con, "rollouts", table), **_left_out(problems)}
    with lake_released(con):
        out = sample_and_route(model_dir, tasks, cfg.engine, cfg.routing, verify, make_rollouts, cycle_id)
    routes = routes_table(out["routes"], policy_version, round_idx, cycle_id)
    with transaction(con, f"rollouts, verdicts and routes {policy_version} round {round_idx}"):
        written = append_rows(con, "rollouts", out["rollouts"])
        append_rows(con, "verdicts", out["verdicts"])
        append_rows(con, "routes", routes)
    route_counts = Counter(routes["route"].to_pylist())
    return {"rollouts": written, **_left_out(problems), "tasks": len(tasks),
            "topped_up": out["topped_up"], "samples_saved": out["samples_saved"],
            **{f"route_{r}": route_counts.get(r, 0) for r in ROUTES}, **verdict_counts(out["verdicts"])}


def run(con: duckdb.DuckDBPyConnection, cfg: tuple[RolloutConfig, VerifyStageConfig], key: StageKey) -> dict:
    """The rollout stage: the key's policy samples this round's tasks in waves, scored
    with the verify section's verifiers, and routes each task."""
    rollout_cfg, verify_cfg = cfg
    model_dir = local_model_dir(lake_settings(), con, key.policy)
    return sample_round(con, model_dir, key.policy, key.cycle_id, rollout_cfg, key.round, verify_cfg)
