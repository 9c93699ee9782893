import json
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from storage.lake import append_rows, open_lake
from storage.schemas import SCHEMAS
from tasks.round.rollout import RolloutConfig, round_candidates, run_rollouts, sample_round, select_tasks
from tests.trainer.chat_templates import GEMMA, GEMMA_TOKENS, QWEN3, with_chat_template
from trainer.engine import EngineConfig, encode_prompt
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


def add_tasks(con, problems, before=(), template_args=None):
    """Addition tasks; `before`: turns of the logged conversation ahead of the question;
    `template_args`: the chat template's arguments production rendered them with."""
    rows = [{"task_id": f"add-{a}-{b}", "domain": "math", "prompt": f"What is {a}+{b}?",
             "messages": json.dumps([*before, {"role": "user", "content": f"What is {a}+{b}?"}]), "verifier": "math",
             "spec": json.dumps({"answer": str(a + b)}), "source_log_ids": [], "created_at": datetime.now(timezone.utc),
             "cycle_id": "c0", "chat_template_kwargs": json.dumps(template_args) if template_args else None}
            for a, b in problems]
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


def test_tasks_the_policys_chat_template_refuses_are_left_out_and_counted(lake_settings, tmp_path):
    """Gemma's template refuses a system turn and two user turns in a row: those tasks are
    left out and counted, and the round samples the rest rather than failing."""
    policy = with_chat_template(init_model(tmp_path / "m"), GEMMA, GEMMA_TOKENS)
    con = open_lake(lake_settings)
    add_tasks(con, [(12, 30), (45, 11)])
    add_tasks(con, [(70, 7)], before=[{"role": "system", "content": "Answer with a number."}])
    add_tasks(con, [(3, 4)], before=[{"role": "user", "content": "Hi."}])
    cfg = RolloutConfig(tasks_per_round=8, heldout_fraction=0.0,
                        engine=EngineConfig(backend="transformers", n=2, max_tokens=3))
    counts = sample_round(con, policy, "v0", "c1", cfg, 0)
    assert counts == {"rollouts": 4, "prompts_too_long": 0, "prompts_unrenderable": 2}
    assert con.execute("SELECT DISTINCT task_id FROM lake.rollouts ORDER BY 1").fetchall() == [
        ("add-12-30",), ("add-45-11",)]


def test_a_task_is_rolled_out_from_the_prompt_its_chat_template_arguments_render(lake_settings, tmp_path):
    """A task from a Qwen3 call that turned thinking off is sampled (and so trained) from the
    prompt with the empty think block production sent; a task without arguments from the default."""
    from transformers import AutoTokenizer

    policy = with_chat_template(init_model(tmp_path / "m"), QWEN3)
    con = open_lake(lake_settings)
    add_tasks(con, [(12, 30)], template_args={"enable_thinking": False})
    add_tasks(con, [(45, 11)])
    cfg = RolloutConfig(tasks_per_round=8, heldout_fraction=0.0,
                        engine=EngineConfig(backend="transformers", n=2, max_tokens=3))
    assert sample_round(con, policy, "v0", "c1", cfg, 0)["rollouts"] == 4
    tokenizer = AutoTokenizer.from_pretrained(str(policy))
    stored = dict(con.execute("SELECT DISTINCT task_id, prompt_token_ids FROM lake.rollouts").fetchall())
    question = [{"role": "user", "content": "What is 12+30?"}]
    assert stored["add-12-30"] == encode_prompt(tokenizer, question, {"enable_thinking": False})
    assert tokenizer.decode(stored["add-12-30"]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tokenizer.decode(stored["add-45-11"]).endswith("<|im_start|>assistant\n")


def scored_round(con, cycle_id, round_idx, passed, task_id="add-1-2"):
    """Four scored samples of one task in one round, all passing or all failing."""
    ids = [f"{cycle_id}-{round_idx}-{task_id}-{i}" for i in range(4)]
    append_rows(con, "rollouts", pa.Table.from_pylist([{
        "rollout_id": rid, "task_id": task_id, "policy_version": "v0", "round": round_idx, "sample_idx": i,
        "completion": "3" if passed else "4", "prompt_token_ids": [1], "token_ids": [2], "logprobs": [-0.5],
        "finish_reason": "stop", "cycle_id": cycle_id} for i, rid in enumerate(ids)], schema=SCHEMAS["rollouts"]))
    append_rows(con, "verdicts", pa.Table.from_pylist([{
        "rollout_id": rid, "verifier": "math", "reward": float(passed), "passed": passed, "status": "ok",
        "components": "{}", "detail": "", "latency_ms": 1.0, "cycle_id": cycle_id} for rid in ids],
        schema=SCHEMAS["verdicts"]))


def test_recent_rounds_are_the_latest_in_time_across_cycles(lake_settings):
    """Round numbers restart in every cycle: the recent rounds are the last (cycle, round)
    pairs by the cycle's start, not the highest round numbers of all cycles together."""
    con = open_lake(lake_settings)
    add_tasks(con, [(1, 2)])
    # the earlier cycle's id sorts last, so only its start time can put it first
    for cycle_id, hour in (("zz-earlier", 1), ("aa-later", 2)):
        append_rows(con, "cycles", pa.Table.from_pylist([{
            "started_at": datetime(2026, 12, 1, hour, tzinfo=timezone.utc), "finished_at": None, "status": "done",
            "snapshot_id": None, "stage_seconds": "{}", "stage_counts": "{}", "reason": None,
            "cycle_id": cycle_id}], schema=SCHEMAS["cycles"]))
    for round_idx in (0, 1):
        scored_round(con, "zz-earlier", round_idx, passed=False)
        scored_round(con, "aa-later", round_idx, passed=True)

    def recent(rounds):
        (task,) = round_candidates(con, rounds)
        return task["recent_samples"], task["recent_passes"]

    assert recent(2) == (8, 8)  # the later cycle's two rounds only
    assert recent(3) == (12, 8)  # and the earlier cycle's last round
    assert recent(4) == (16, 8)


def test_a_task_carries_its_domains_recent_samples(lake_settings):
    """A new task's first wave may go by its domain's history (routing.evidence): the
    samples of the domain's last rounds, whichever of its tasks they came from."""
    con = open_lake(lake_settings)
    add_tasks(con, [(1, 2), (2, 3), (5, 5)])
    scored_round(con, "c1", 0, passed=True, task_id="add-1-2")
    scored_round(con, "c1", 1, passed=False, task_id="add-2-3")
    scored_round(con, "c1", 2, passed=False, task_id="add-1-2")

    def domain_and_own(rounds):
        new = {c["task_id"]: c for c in round_candidates(con, rounds)}["add-5-5"]
        return (new["domain_samples"], new["domain_passes"]), (new["recent_samples"], new["recent_passes"])

    assert domain_and_own(2) == ((8, 0), (0, 0))  # the domain's rounds 2 and 1; the task has none
    assert domain_and_own(3) == ((12, 4), (0, 0))
