import json
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from storage.lake import append_rows, open_lake
from storage.schemas import SCHEMAS
from tasks.round.rollout import RolloutConfig, run_rollouts, select_tasks
from trainer.engine import EngineConfig
from flows.demo.tiny_model import init_model


def cand(task_id, domain, pass_rate):
    return {"task_id": task_id, "domain": domain, "messages": "[]", "pass_rate": pass_rate}


def test_selection_prefers_informative_tasks_and_balances_domains():
    candidates = [cand("m-solved", "math", 1.0), cand("m-mixed", "math", 0.5), cand("m-new", "math", None),
                  cand("m-failed", "math", 0.0), cand("c-mixed", "code", 0.25), cand("c-solved", "code", 1.0)]
    chosen = [c["task_id"] for c in select_tasks(candidates, RolloutConfig(tasks_per_round=4))]
    assert set(chosen[:2]) == {"m-mixed", "c-mixed"}  # pass rate in (0, 1), one per domain
    assert "m-new" in chosen and len(chosen) == 4
    flat = select_tasks(candidates, RolloutConfig(tasks_per_round=6, curriculum=False))
    assert sorted(c["task_id"] for c in flat) == sorted(c["task_id"] for c in candidates)
    only_math = select_tasks(candidates, RolloutConfig(tasks_per_round=6, domains=("math",)))
    assert sorted(c["task_id"] for c in only_math) == ["m-failed", "m-mixed", "m-new", "m-solved"]
    with pytest.raises(ValueError, match="domains"):
        RolloutConfig(domains=("",))


def add_tasks(con, problems):
    rows = [{"task_id": f"add-{a}-{b}", "domain": "math", "prompt": f"What is {a}+{b}?",
             "messages": json.dumps([{"role": "user", "content": f"What is {a}+{b}?"}]), "verifier": "math",
             "spec": json.dumps({"answer": str(a + b)}), "source_log_ids": [], "created_at": datetime.now(timezone.utc),
             "cycle_id": "c0"} for a, b in problems]
    append_rows(con, "tasks", pa.Table.from_pylist(rows, schema=SCHEMAS["tasks"]))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return init_model(tmp_path_factory.mktemp("policy") / "m")


def test_rollouts_are_written_once_per_round(lake_settings, tiny):
    con = open_lake(lake_settings)
    add_tasks(con, [(12, 30), (45, 11), (70, 7)])
    cfg = RolloutConfig(tasks_per_round=2, engine=EngineConfig(backend="transformers", n=3, max_tokens=5))
    assert run_rollouts(con, tiny, "v0", "c1", cfg, round_idx=0) == 6
    assert run_rollouts(con, tiny, "v0", "c1", cfg, round_idx=0) == 0  # rerun: nothing new
    rows = con.execute("SELECT task_id, sample_idx, len(token_ids) = len(logprobs), finish_reason "
                       "FROM lake.rollouts ORDER BY task_id, sample_idx").fetchall()
    assert len({r[0] for r in rows}) == 2 and [r[1] for r in rows] == [0, 1, 2, 0, 1, 2]
    assert all(r[2] and r[3] in ("stop", "length") for r in rows)
