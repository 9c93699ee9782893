import json

import pyarrow as pa
import pytest

from storage.lake import append_rows, open_lake
from storage.schemas import SCHEMAS
import pyarrow.parquet as pq

from tasks.round.rollout import RolloutConfig, run_rollouts, sample_round
from tasks.round.verify import VerifyStageConfig
from tasks.release.models import register_model
from tasks.round.train import NothingToLearn, TrainStageConfig, run, train_policy
from tasks.stages import StageKey
from tests.tasks.round.test_rollout import add_tasks
from trainer.engine import EngineConfig
from trainer.grpo import GRPOConfig
from flows.demo.tiny_model import init_model


def score(con, cycle_id):
    """Verdicts by a coin that alternates per sample, so every group has reward variance."""
    ids = con.execute("SELECT rollout_id, sample_idx FROM lake.rollouts ORDER BY rollout_id").fetchall()
    rows = [{"rollout_id": rid, "verifier": "math", "reward": float(idx % 2), "passed": bool(idx % 2),
             "status": "ok" if idx % 2 else "wrong", "components": json.dumps({}), "detail": "",
             "latency_ms": 1.0, "cycle_id": cycle_id} for rid, idx in ids]
    append_rows(con, "verdicts", pa.Table.from_pylist(rows, schema=SCHEMAS["verdicts"]))


@pytest.mark.slow
def test_train_writes_steps_and_a_candidate_once(lake_settings, tmp_path):
    con = open_lake(lake_settings)
    base = init_model(tmp_path / "base")
    add_tasks(con, [(12, 30), (45, 11), (70, 7), (21, 21)])
    run_rollouts(con, base, "v0", "c1", RolloutConfig(
        tasks_per_round=4, engine=EngineConfig(backend="transformers", n=4, max_tokens=5)))
    score(con, "c1")
    cfg = TrainStageConfig(grpo=GRPOConfig(steps=3, groups_per_step=2, checkpoint_every=3, max_tokens=5),
                           device="cpu")
    version = train_policy(con, base, "v0", 0, tmp_path / "jobs", "c1", cfg)
    steps = con.execute("SELECT step, groups_kept FROM lake.train_steps WHERE policy_version = ? ORDER BY step",
                        [version]).fetchall()
    assert steps == [(1, 4), (2, 4), (3, 4)]
    model = con.execute("SELECT parent_version, status, uri FROM lake.models WHERE policy_version = ?",
                        [version]).fetchall()
    assert model[0][:2] == ("v0", "candidate")
    assert train_policy(con, base, "v0", 0, tmp_path / "jobs", "c1", cfg) == version  # rerun: no new rows
    assert con.execute("SELECT count(*) FROM lake.models").fetchone()[0] == 1


def test_a_round_with_nothing_to_learn_is_recorded_and_the_policy_carries_on(lake_settings, tmp_path,
                                                                             monkeypatch):
    """All samples of every task failed (the common case with a real model): the train
    stage starts no job, records why, and hands the same policy to the next round."""
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    con = open_lake(lake_settings)
    base = init_model(tmp_path / "base")
    version = register_model(con, lake_settings, base, "test")
    add_tasks(con, [(12, 30), (45, 11)])
    run_rollouts(con, base, version, "c1", RolloutConfig(
        tasks_per_round=2, engine=EngineConfig(backend="transformers", n=3, max_tokens=4)))
    ids = con.execute("SELECT rollout_id FROM lake.rollouts").fetchall()
    append_rows(con, "verdicts", pa.Table.from_pylist([{
        "rollout_id": rid, "verifier": "math", "reward": 0.0, "passed": False, "status": "wrong",
        "components": "{}", "detail": "", "latency_ms": 1.0, "cycle_id": "c1"} for (rid,) in ids],
        schema=SCHEMAS["verdicts"]))
    cfg = TrainStageConfig(grpo=GRPOConfig(steps=1, groups_per_step=2, max_tokens=4), device="cpu")
    with pytest.raises(NothingToLearn, match="all 2 groups have zero reward variance"):
        train_policy(con, base, version, 0, tmp_path / "jobs", "c1", cfg)
    counts = run(con, cfg, StageKey("c1", 0, policy=version))
    assert counts == {"policy_version": version, "trained": False, "groups_kept": 0, "groups_dropped": 2,
                      "reason": "all 2 groups have zero reward variance and no task is routed to SFT with "
                                "a usable reference: nothing to learn from"}
    assert not list((lake_settings.home / "jobs").glob("*/job.json"))
    assert con.execute("SELECT count(*) FROM lake.models").fetchone()[0] == 1


@pytest.mark.slow
def test_unsolved_tasks_are_learned_from_their_references_in_the_same_job(lake_settings, tmp_path, monkeypatch):
    """The real model cannot add yet: every sample fails, every task is routed to SFT, and
    the round still trains, on the references written as the domain's answer format."""
    monkeypatch.setenv("FLYWHEEL_HOME", str(lake_settings.home))
    con = open_lake(lake_settings)
    base = init_model(tmp_path / "base")
    version = register_model(con, lake_settings, base, "test")
    add_tasks(con, [(12, 30), (45, 11), (70, 7), (21, 21)])
    rollout = RolloutConfig(tasks_per_round=4, heldout_fraction=0.0,
                            engine=EngineConfig(backend="transformers", n=4, max_tokens=4))
    counts = sample_round(con, base, version, "c1", rollout, 0, VerifyStageConfig())
    assert counts["route_sft"] == 4 and counts["samples_saved"] == 0  # n=4 = first wave
    cfg = TrainStageConfig(grpo=GRPOConfig(steps=2, groups_per_step=2, sft_per_step=2, max_tokens=4,
                                           max_epochs=1.0), sft_formats={"math": "{answer}"}, device="cpu")
    trained = run(con, cfg, StageKey("c1", 0, policy=version))
    assert trained["trained"] and trained["sft_rows"] == 4 and trained["groups_kept"] == 0
    steps = con.execute("SELECT step, sft_tokens, sft_loss, kl_reference FROM lake.train_steps ORDER BY step").fetchall()
    # 2 steps of 2 references, each its digits plus the end-of-turn token
    assert [(s[0], s[1]) for s in steps] == [(1, 6), (2, 6)] and all(s[2] > 0 and s[3] is False for s in steps)
    job = json.loads(next((lake_settings.home / "jobs").glob("*/job.json")).read_text())
    sft = pq.read_table(job["sft_rows"]).to_pylist()
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    assert sorted(tokenizer.decode(r["token_ids"][:-1]) for r in sft) == ["42", "42", "56", "77"]


def test_an_sft_tasks_prompt_is_rendered_with_its_chat_template_arguments(lake_settings, tmp_path):
    """A reference is taught after the prompt production sent: with Qwen3's thinking off,
    the empty think block the rollouts were sampled after."""
    from transformers import AutoTokenizer

    from tasks.round.train import export_sft
    from tests.trainer.chat_templates import QWEN3, with_chat_template
    from trainer.engine import encode_prompt

    base = with_chat_template(init_model(tmp_path / "base"), QWEN3)
    con = open_lake(lake_settings)
    add_tasks(con, [(12, 30)], template_args={"enable_thinking": False})
    route = {"task_id": "add-12-30", "round": 0, "policy_version": "v0", "domain": "math", "samples": 4,
             "passes": 0, "route": "sft", "reason": "unsolved", "cycle_id": "c1"}
    append_rows(con, "routes", pa.Table.from_pylist([route], schema=SCHEMAS["routes"]))
    path = tmp_path / "sft.parquet"
    cfg = TrainStageConfig(sft_formats={"math": "{answer}"}, device="cpu")
    assert export_sft(con, base, "v0", 0, path, "c1", cfg)["sft_rows"] == 1
    (row,) = pq.read_table(path).to_pylist()
    question = [{"role": "user", "content": "What is 12+30?"}]
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    assert row["prompt_token_ids"] == encode_prompt(tokenizer, question, {"enable_thinking": False})
