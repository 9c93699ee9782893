"""Routing by difficulty: the pure decision, and the rollout stage sampling in waves."""
from __future__ import annotations

import json
import string
from dataclasses import replace
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from flows.demo.tiny_model import init_model
from storage.lake import append_rows, open_lake
from storage.schemas import SCHEMAS
from tasks.round.rollout import RolloutConfig, sample_round
from tasks.round.routing import History, RoutingConfig, decide, evidence, first_wave, needs_more, wilson
from tasks.round.verify import VerifyStageConfig
from trainer.engine import EngineConfig

CFG = RoutingConfig()


def test_the_wilson_interval_is_sound_at_the_edges():
    assert wilson(0, 4, 0.95)[0] == 0.0 and wilson(0, 4, 0.95)[1] == pytest.approx(0.490, abs=1e-3)
    assert wilson(16, 16, 0.95)[0] == pytest.approx(0.806, abs=1e-3) and wilson(16, 16, 0.95)[1] == 1.0
    low, high = wilson(3, 10, 0.95)
    assert low < 0.3 < high
    assert wilson(0, 0, 0.95) == (0.0, 1.0)


def test_each_outcome_has_one_route_and_says_why():
    assert decide(2, 4, History(), True, CFG).route == "rl"
    unsolved = decide(0, 4, History(), True, CFG)
    assert unsolved.route == "sft" and "reference" in unsolved.reason
    no_reference = decide(0, 4, History(), False, CFG)
    assert no_reference.route == "skip" and "no reference solution: kept for later" in no_reference.reason
    assert decide(0, 4, History(), True, RoutingConfig(sft=False)).route == "skip"
    assert decide(4, 4, History(), True, CFG).route == "skip"  # solved once is not yet reliable
    retired = decide(4, 4, History(samples=12, passes=12), True, CFG)
    assert retired.route == "retire" and "16 of 16" in retired.reason
    assert decide(4, 4, History(samples=12, passes=9), True, CFG).route == "skip"
    assert decide(0, 0, History(), True, CFG).route == "skip"  # infra failures judge nothing


def test_only_undecided_tasks_get_more_samples():
    assert needs_more(1, 4, History())  # mixed: RL wants the whole group
    assert not needs_more(0, 4, History()) and not needs_more(4, 4, History(8, 8))
    assert needs_more(0, 4, History(8, 3))  # uniform now, mixed before: undecided
    assert needs_more(4, 4, History(8, 0)) and needs_more(0, 1, History(8, 8))  # uniform, but not as before
    assert not needs_more(0, 1, History(8, 0))


def test_a_task_whose_recent_samples_agreed_gets_a_smaller_first_wave():
    cfg = RoutingConfig(first_samples=4, first_samples_after=1)
    assert first_wave(History(), cfg) == 4  # no history
    assert first_wave(History(8, 0), cfg) == 1 and first_wave(History(4, 4), cfg) == 1  # hopeless; solved
    assert first_wave(History(8, 3), cfg) == 4  # mixed: maybe RL
    assert first_wave(History(3, 0), cfg) == 4  # too few samples to call it
    with pytest.raises(ValueError, match="first_samples_after"):
        RoutingConfig(first_samples_after=0)


def test_a_task_with_little_history_goes_by_its_domains():
    cfg = RoutingConfig(first_samples=4, first_samples_after=1, domain_samples=32)
    never = History(64, 0)  # the model has not passed one task of the domain lately
    assert evidence(History(), never, cfg) == never and first_wave(never, cfg) == 1
    assert evidence(History(2, 0), never, cfg) == never  # too little of its own
    assert evidence(History(8, 3), never, cfg) == History(8, 3)  # its own history, when it has one
    assert evidence(History(), History(64, 5), cfg) == History()  # a mixed domain says nothing
    assert evidence(History(), History(16, 0), cfg) == History()  # too few domain samples
    assert evidence(History(), never, replace(cfg, domain_samples=0)) == History()  # off
    # a new task's one sample that passes where the domain never did: undecided, topped up
    assert needs_more(1, 1, never) and not needs_more(0, 1, never)
    with pytest.raises(ValueError, match="domain_samples"):
        RoutingConfig(domain_samples=-1)


def add_exact_tasks(con, n: int, accepted: list[str] | None = None, prefix: str = "t") -> None:
    """One-character tasks the untrained tiny model passes about 60% of the time: any
    letter or digit is accepted (its vocabulary is ASCII), punctuation is not."""
    accepted = accepted or list(string.ascii_lowercase + string.digits)
    rows = [{"task_id": f"{prefix}{i:02d}", "domain": "trivia", "prompt": f"Say one letter ({i})",
             "messages": json.dumps([{"role": "user", "content": f"Say one letter ({i})"}]), "verifier": "exact",
             "spec": json.dumps({"answer": accepted}), "source_log_ids": [],
             "created_at": datetime.now(timezone.utc), "cycle_id": "c0"} for i in range(n)]
    append_rows(con, "tasks", pa.Table.from_pylist(rows, schema=SCHEMAS["tasks"]))


def test_the_stage_samples_in_waves_and_records_one_route_per_task(lake_settings, tmp_path):
    con = open_lake(lake_settings)
    add_exact_tasks(con, 16)
    model = init_model(tmp_path / "m")
    cfg = RolloutConfig(tasks_per_round=16, heldout_fraction=0.0, routing=RoutingConfig(first_samples=2),
                        engine=EngineConfig(backend="transformers", n=6, max_tokens=1))
    counts = sample_round(con, model, "v0", "c1", cfg, 0, VerifyStageConfig())
    groups = con.execute("""
        SELECT r.task_id, count(*), count(*) FILTER (WHERE v.passed), list(r.sample_idx ORDER BY r.sample_idx),
               any_value(x.route), any_value(x.samples), any_value(x.passes)
        FROM lake.rollouts r JOIN lake.verdicts v USING (rollout_id) JOIN lake.routes x USING (task_id)
        GROUP BY r.task_id ORDER BY r.task_id""").fetchall()
    assert len(groups) == 16  # every task: its rollouts, a verdict for each, one route
    for task, n, passes, idx, route, samples, route_passes in groups:
        assert idx == list(range(n)) and (samples, route_passes) == (n, passes), task
        assert n in (2, 6), task  # first wave only, or topped up to the whole group
        assert route == ("rl" if 0 < passes < n else "sft" if passes == 0 else "skip"), task
    first_wave_uniform = sum(n == 2 for _, n, *_ in groups)
    assert 0 < first_wave_uniform < 16, "the seed should give both kinds; pick another"
    assert counts["samples_saved"] == 4 * first_wave_uniform
    assert counts["rollouts"] == sum(n for _, n, *_ in groups) == counts["verified"]
    assert counts["route_rl"] + counts["route_sft"] + counts["route_skip"] == 16
    assert sample_round(con, model, "v0", "c1", cfg, 0, VerifyStageConfig())["rollouts"] == 0  # rerun

    # the next round: a task whose 2 samples agreed gets a first wave of 1, and is topped up
    # to the whole group only if that sample disagrees with them
    agreed = {task: passes for task, n, passes, *_ in groups if n == 2}
    cfg = replace(cfg, routing=RoutingConfig(first_samples=2, first_samples_after=1))
    counts = sample_round(con, model, "v0", "c1", cfg, 1, VerifyStageConfig())
    again = con.execute("SELECT task_id, list(v.passed ORDER BY r.sample_idx) FROM lake.rollouts r "
                        "JOIN lake.verdicts v USING (rollout_id) WHERE r.round = 1 GROUP BY task_id").fetchall()
    sizes = {task: len(passed) for task, passed in again}
    for task, passed in again:
        if task not in agreed:
            assert sizes[task] in (2, 6), task
        elif passed[0] == (agreed[task] == 2):
            assert sizes[task] == 1, task  # agreed with its history: decided on one sample
        else:
            assert sizes[task] == 6, task  # disagreed: undecided, the whole group
    assert any(sizes[task] == 1 for task in agreed), "the seed should give a one-sample wave; pick another"
    assert counts["samples_saved"] == sum(6 - n for task, n in sizes.items() if n < 6)


def test_a_new_task_of_a_domain_never_passed_is_checked_with_one_sample(lake_settings, tmp_path):
    con = open_lake(lake_settings)
    never = ["!!"]  # two characters: one token of the tiny model cannot say it
    add_exact_tasks(con, 4, never, prefix="old")
    model = init_model(tmp_path / "m")
    cfg = RolloutConfig(tasks_per_round=8, heldout_fraction=0.0,
                        routing=RoutingConfig(first_samples=2, first_samples_after=1, domain_samples=8),
                        engine=EngineConfig(backend="transformers", n=6, max_tokens=1))
    sample_round(con, model, "v0", "c1", cfg, 0, VerifyStageConfig())
    add_exact_tasks(con, 4, never, prefix="new")
    counts = sample_round(con, model, "v0", "c1", cfg, 1, VerifyStageConfig())
    sizes = dict(con.execute("SELECT task_id, count(*) FROM lake.rollouts WHERE round = 1 GROUP BY 1").fetchall())
    # the old tasks by their own 2 failed samples, the new ones by the domain's 8
    assert sizes == {f"{prefix}{i:02d}": 1 for prefix in ("old", "new") for i in range(4)}
    assert counts["samples_saved"] == 8 * 5 and counts["route_sft"] == 8


def test_retired_tasks_are_not_selected_again(lake_settings, tmp_path):
    con = open_lake(lake_settings)
    add_exact_tasks(con, 3)
    append_rows(con, "routes", pa.Table.from_pylist([{
        "task_id": "t00", "round": 0, "policy_version": "v0", "domain": "trivia", "samples": 16, "passes": 16,
        "pass_rate": 1.0, "pass_low": 0.81, "pass_high": 1.0, "route": "retire", "reason": "solved",
        "cycle_id": "c0"}], schema=SCHEMAS["routes"]))
    cfg = RolloutConfig(tasks_per_round=3, heldout_fraction=0.0, routing=RoutingConfig(adaptive=False),
                        engine=EngineConfig(backend="transformers", n=2, max_tokens=1))
    counts = sample_round(con, init_model(tmp_path / "m"), "v1", "c1", cfg, 0, VerifyStageConfig())
    assert counts["tasks"] == 2 and counts["samples_saved"] == 0 and counts["rollouts"] == 4
    chosen = {r[0] for r in con.execute("SELECT DISTINCT task_id FROM lake.rollouts").fetchall()}
    assert chosen == {"t01", "t02"}
