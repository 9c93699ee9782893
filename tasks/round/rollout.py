"""Rollout stage: pick tasks, sample G completions each with the policy, write `rollouts`.

Selection balances domains (round-robin over domains) and follows a curriculum: a task
whose recent pass rate is strictly between 0 and 1 teaches the most (its group will
have reward variance), an unseen task comes next, a task always passed or always
failed last. The policy samples through trainer.engine (vLLM everywhere; the
transformers engine as the reference). Rows are ids by content: rollout_id = sha256 of
(policy_version, round, task_id, sample_idx), so rerunning a round writes nothing new.
Not here: scoring (tasks/round/scoring.py), training (tasks/round/train.py).
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa

from storage.config_file import lake_settings
from storage.lake import append_rows, transaction
from storage.schemas import SCHEMAS
from tasks.curate.holdout import is_heldout
from tasks.release.models import local_model_dir
from trainer.engine import EngineConfig, Sample, generate, prompt_fits
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

    def __post_init__(self) -> None:
        if self.tasks_per_round < 1:
            raise ValueError("RolloutConfig.tasks_per_round must be >= 1")
        if self.recent_rounds < 1:
            raise ValueError("RolloutConfig.recent_rounds must be >= 1")
        if any(not isinstance(d, str) or not d for d in self.domains):
            raise ValueError(f"RolloutConfig.domains must be domain names, got {self.domains!r}")


CANDIDATES_SQL = f"""
WITH scored AS (
    SELECT r.task_id, r.round, v.passed,
           dense_rank() OVER (PARTITION BY r.task_id ORDER BY r.round DESC) AS recency
    FROM lake.rollouts r JOIN lake.verdicts v USING (rollout_id)
    WHERE v.status NOT IN {INFRA_STATUSES_SQL}
)
SELECT t.task_id, t.domain, t.messages,
       avg(CASE WHEN s.passed THEN 1.0 ELSE 0.0 END) AS pass_rate
FROM lake.tasks t LEFT JOIN scored s ON s.task_id = t.task_id AND s.recency <= ?
GROUP BY t.task_id, t.domain, t.messages
ORDER BY t.task_id
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


def rollout_table(tasks: list[dict], samples: list[Sample], policy_version: str, round_idx: int,
                  cycle_id: str) -> pa.Table:
    rows = [{
        "rollout_id": rollout_id(cycle_id, policy_version, round_idx, tasks[s.prompt_idx]["task_id"], s.sample_idx),
        "task_id": tasks[s.prompt_idx]["task_id"], "policy_version": policy_version, "round": round_idx,
        "sample_idx": s.sample_idx, "completion": s.text, "prompt_token_ids": s.prompt_token_ids,
        "token_ids": s.token_ids, "logprobs": s.logprobs, "finish_reason": s.finish_reason,
        "cycle_id": cycle_id} for s in samples]
    return pa.Table.from_pylist(rows, schema=SCHEMAS["rollouts"])


def run_rollouts(con: duckdb.DuckDBPyConnection, model_dir: str | Path, policy_version: str,
                 cycle_id: str, cfg: RolloutConfig = RolloutConfig(), round_idx: int = 0) -> int:
    """Sample this round's tasks and append the rollouts; returns rows written (0 on rerun)."""
    return sample_round(con, model_dir, policy_version, cycle_id, cfg, round_idx)["rollouts"]


def sample_round(con: duckdb.DuckDBPyConnection, model_dir: str | Path, policy_version: str,
                 cycle_id: str, cfg: RolloutConfig, round_idx: int) -> dict:
    """`run_rollouts` with its counts: rollouts written and prompts left out as too long."""
    done = con.execute("SELECT count(*) FROM lake.rollouts WHERE cycle_id = ? AND round = ?",
                       [cycle_id, round_idx]).fetchone()[0]
    if done:
        return {"rollouts": 0, "prompts_too_long": 0}
    cols = ["task_id", "domain", "messages", "pass_rate"]
    candidates = [dict(zip(cols, row)) for row in con.execute(CANDIDATES_SQL, [cfg.recent_rounds]).fetchall()]
    # held-out tasks are the fresh-failures evaluation set: never trained on
    candidates = [c for c in candidates if not is_heldout(c["task_id"], cfg.heldout_fraction)]
    if cfg.domains:
        candidates = [c for c in candidates if c["domain"] in cfg.domains]
    # a prompt longer than the model's context would fail vLLM's whole batch: left out, counted
    fits = prompt_fits(model_dir, [json.loads(c["messages"]) for c in candidates], cfg.engine,
                       [c["domain"] for c in candidates])
    tasks = select_tasks([c for c, ok in zip(candidates, fits, strict=True) if ok], cfg)
    too_long = fits.count(False)
    if not tasks:
        return {"rollouts": 0, "prompts_too_long": too_long}
    samples = generate(model_dir, [json.loads(t["messages"]) for t in tasks], cfg.engine,
                       [t["domain"] for t in tasks])
    table = rollout_table(tasks, samples, policy_version, round_idx, cycle_id)
    with transaction(con, f"rollouts {policy_version} round {round_idx}"):
        return {"rollouts": append_rows(con, "rollouts", table), "prompts_too_long": too_long}


def run(con: duckdb.DuckDBPyConnection, cfg: RolloutConfig, key: StageKey) -> dict:
    """The rollout stage: the key's policy samples this round's tasks."""
    model_dir = local_model_dir(lake_settings(), con, key.policy)
    return sample_round(con, model_dir, key.policy, key.cycle_id, cfg, key.round)
