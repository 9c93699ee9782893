"""Evaluation: every item x sample scored and written, contamination excluded with evidence."""
import json
import os
from dataclasses import replace
from datetime import datetime, timezone

import duckdb
import pyarrow as pa
import pytest

from storage.lake import append_rows, open_lake, transaction
from storage.schemas import SCHEMAS
from storage.settings import LakeSettings
from tasks.release.evaluate import FRESH_SET, EvalConfig, EvalSummary, Policy, evaluate_policies, lineage
from tasks.curate.evalsets import register_evalset
from tasks.curate.holdout import is_heldout
from tasks.curate.similarity.normalize import content_hash
from trainer.engine import EngineConfig, Sample

os.environ.setdefault("OMP_NUM_THREADS", "1")

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
LEAKED = ("Omar plants seven rows of tulips with twelve bulbs in each row, and a quarter of the bulbs "
          "never flower. How many tulips flower?")
ITEMS = [
    {"id": "a1", "domain": "math", "prompt": "What is 17+23?", "reference": {"answer": "40"}},
    {"id": "a2", "domain": "math", "prompt": "What is 5*6?", "reference": {"answer": "30"}},
    {"id": "a3", "domain": "math", "prompt": LEAKED, "reference": {"answer": "63"}},
    {"id": "q1", "domain": "qa", "verifier": "exact", "prompt": "Capital of France?",
     "reference": {"answer": "Paris"}},
]
G = 4
# What the engine answers to each prompt, sample by sample.
ANSWERS = {
    "What is 17+23?": ["\\boxed{40}", "\\boxed{40}", "\\boxed{40}", "\\boxed{41}"],  # 3/4
    "What is 5*6?": ["\\boxed{30}", "\\boxed{31}", "\\boxed{32}", "\\boxed{33}"],      # 1/4
    LEAKED: ["\\boxed{63}"] * 4,                                                     # memorised
    "Capital of France?": ["", "Paris", "paris.", "London"],                         # 2/4, 1 format error
}
FRESH = [f"What is {i}+{i}?" for i in range(2, 14)]


def evaluate_policy(con: duckdb.DuckDBPyConnection, model_dir: str, policy_version: str, cfg: EvalConfig,
                    cycle_id: str, *, generate, also_check: tuple[str, ...] = ()) -> EvalSummary:
    """`evaluate_policies` for one model, sampled by a one-model engine (`generate`)."""
    def each(runs, engine_cfg, domains):
        return [generate(model, prompts, engine_cfg, run_domains)
                for (model, prompts), run_domains in zip(runs, domains, strict=True)]
    return evaluate_policies(con, [Policy(model_dir, policy_version, also_check)], cfg, cycle_id,
                             generate_each=each)[0]



def table_engine(model_dir, prompts, cfg, domains=None):
    """Answers from ANSWERS (fresh tasks: right on even samples); the qa item runs out of tokens."""
    out = []
    for p, messages in enumerate(prompts):
        text = messages[-1]["content"]
        if text in ANSWERS:
            answers = ANSWERS[text]
        else:
            a = int(text.split()[2].split("+")[0])
            answers = [f"\\boxed{{{2 * a if s % 2 == 0 else 0}}}" for s in range(cfg.n)]
        for s in range(cfg.n):
            tokens = list(range(len(answers[s]) + 1))
            out.append(Sample(p, s, [1, 2], answers[s], tokens, [-0.1] * len(tokens),
                              "length" if text == "Capital of France?" else "stop"))
    return out


def _rows(table, rows):
    return pa.Table.from_pylist([{**r, "cycle_id": r.get("cycle_id", "c1")} for r in rows], schema=SCHEMAS[table])


def _task(prompt, answer, cycle="c1"):
    return {"task_id": content_hash(prompt), "domain": "math", "prompt": prompt,
            "messages": json.dumps([{"role": "user", "content": prompt}]), "verifier": "math",
            "spec": json.dumps({"answer": answer}), "source_log_ids": [], "created_at": NOW, "cycle_id": cycle}


def _rollout(task_prompt, policy):
    return {"rollout_id": f"r-{policy}-{content_hash(task_prompt)[:8]}", "task_id": content_hash(task_prompt),
            "policy_version": policy, "round": 0, "sample_idx": 0, "completion": "x", "prompt_token_ids": [1],
            "token_ids": [2], "logprobs": [-0.5], "finish_reason": "stop"}


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """One lake for the module (opening one costs seconds); tests write under distinct cycles."""
    tmp_path = tmp_path_factory.mktemp("lake")
    con = open_lake(LakeSettings(home=tmp_path / "home"))
    path = tmp_path / "arith.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in ITEMS))
    register_evalset(con, "arith", path)
    leak_task = "Please help with my homework. " + LEAKED  # a reformatted copy of item a3
    other_leak = "What is 5*6?"  # copies a2, but only an unrelated model trained on it
    tasks = [_task(leak_task, "63", "c0"), _task(other_leak, "30", "c0"), _task("What is 40+1?", "41", "c0")]
    tasks += [_task(p, str(2 * int(p.split()[2].split("+")[0]))) for p in FRESH]
    models = [{"policy_version": "prod", "parent_version": None, "uri": "m/prod", "status": "production",
               "reason": "seed", "created_at": NOW},
              {"policy_version": "cand", "parent_version": "prod", "uri": "m/cand", "status": "candidate",
               "reason": None, "created_at": NOW},
              {"policy_version": "other", "parent_version": None, "uri": "m/o", "status": "rejected",
               "reason": None, "created_at": NOW}]
    with transaction(con):
        append_rows(con, "tasks", _rows("tasks", tasks))
        append_rows(con, "models", _rows("models", models))
        append_rows(con, "rollouts", _rows("rollouts", [_rollout(leak_task, "prod"),
                                                        _rollout(other_leak, "other")]))
    yield con
    con.close()


@pytest.fixture(scope="module")
def scheduler():
    """One real Dask cluster for the module: starting one per evaluation costs seconds."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0",
                      silence_logs=40) as cluster:
        yield cluster.scheduler_address


@pytest.fixture
def cfg(scheduler):
    return EvalConfig(engine=EngineConfig(backend="transformers", n=G, max_tokens=8), k=2,
                      heldout_fraction=0.5, scheduler_address=scheduler)


def test_scores_every_item_and_excludes_the_leaked_one(lake, cfg):
    summary = evaluate_policy(lake, "unused-model-dir", "cand", cfg, "c1", generate=table_engine)
    fresh = [p for p in FRESH if is_heldout(content_hash(p), 0.5)]
    assert 0 < len(fresh) < len(FRESH), "the split holds some fresh tasks out and trains on the rest"
    n_rows = lake.execute("SELECT count(*) FROM lake.evaluations WHERE policy_version = 'cand' "
                          "AND cycle_id = 'c1'").fetchone()[0]
    assert n_rows == (len(ITEMS) + len(fresh)) * G

    [leak] = summary.contaminated
    assert (leak["eval_set"], leak["item_id"]) == ("arith", "a3")
    assert leak["task_id"] == content_hash("Please help with my homework. " + LEAKED)
    assert leak["evidence"]["method"] in ("overlap", "near_duplicate") and leak["evidence"]["item_id"] == "a3"

    scores = {(s["eval_set"], s["item_id"]): s["score"] for s in summary.item_scores}
    assert ("arith", "a3") not in scores and ("arith", "a2") in scores  # a2's copy: not this lineage
    assert scores[("arith", "a1")] == 0.75 and scores[("arith", "a2")] == 0.25 and scores[("arith", "q1")] == 0.5
    assert all(scores[(FRESH_SET, content_hash(p))] == 0.5 for p in fresh)
    assert summary.sets["arith"]["pass@1"] == pytest.approx((0.75 + 0.25 + 0.5) / 3)
    # pass@2 by hand: a1 (4,3) -> 1, a2 (4,1) -> 1 - 3/6, q1 (4,2) -> 1 - 1/6
    assert summary.sets["arith"]["pass@2"] == pytest.approx((1 + 0.5 + 5 / 6) / 3)
    assert summary.sets[FRESH_SET] == pytest.approx({"items": len(fresh), "unscored": 0, "pass@1": 0.5,
                                                     "pass@2": 5 / 6})
    assert summary.domains["qa"]["pass@1"] == 0.5
    head = summary.headline
    assert head["items"] == 3 + len(fresh)
    assert head["pass@1"] == pytest.approx((1.5 + 0.5 * len(fresh)) / (3 + len(fresh)))
    assert head["low"] <= head["pass@1"] <= head["high"]

    clean_samples = (3 + len(fresh)) * G
    proc = summary.process
    assert proc["samples"] == clean_samples
    assert proc["truncation_rate"] == pytest.approx(G / clean_samples)  # the qa item's samples
    assert proc["format_error_rate"] == pytest.approx(1 / clean_samples)  # its empty answer


def test_rerun_replaces_rows_and_lineage_follows_parents(lake, cfg):
    evaluate_policy(lake, "unused", "cand", cfg, "c1", generate=table_engine)
    first = lake.execute("SELECT count(*) FROM lake.evaluations").fetchone()[0]
    summary = evaluate_policy(lake, "unused", "cand", cfg, "c1", generate=table_engine)
    assert lake.execute("SELECT count(*) FROM lake.evaluations").fetchone()[0] == first
    assert lineage(lake, "cand") == ["cand", "prod"]
    # the production model's lineage has the leak too; a model with no lineage has none
    other = evaluate_policy(lake, "unused", "fresh-model", cfg, "c1", generate=table_engine)
    assert other.contaminated == [] and ("arith", "a3") in {(s["eval_set"], s["item_id"])
                                                            for s in other.item_scores}
    assert summary.headline["items"] + 1 == other.headline["items"]
    # checked against the candidate's lineage too, the other model loses the same item
    paired = evaluate_policy(lake, "unused", "fresh-model", cfg, "c1", also_check=("cand",),
                             generate=table_engine)
    assert [(c["item_id"], c["task_id"]) for c in paired.contaminated] == [
        (c["item_id"], c["task_id"]) for c in summary.contaminated]


def test_candidate_and_production_in_one_engine_call_match_one_call_each(lake, cfg):
    calls = []

    def each(runs, engine_cfg, domains):
        calls.append([model_dir for model_dir, _ in runs])
        return [table_engine(model_dir, prompts, engine_cfg) for model_dir, prompts in runs]

    both = evaluate_policies(lake, [Policy("cand-dir", "cand"), Policy("prod-dir", "prod", also_check=("cand",))],
                             cfg, "c3", generate_each=each)
    assert calls == [["cand-dir", "prod-dir"]]
    read = "SELECT * EXCLUDE (cycle_id) FROM lake.evaluations WHERE cycle_id = ? ORDER BY ALL"
    together = lake.execute(read, ["c3"]).fetchall()
    alone = [evaluate_policy(lake, "unused", "cand", cfg, "c4", generate=table_engine),
             evaluate_policy(lake, "unused", "prod", cfg, "c4", also_check=("cand",), generate=table_engine)]
    assert together == lake.execute(read, ["c4"]).fetchall() and len(together) > 0
    for joint, single in zip(both, alone, strict=True):
        assert {**joint.to_dict(), "cycle_id": None} == {**single.to_dict(), "cycle_id": None}


def test_engine_that_answers_fewer_models_than_asked_is_refused(lake, cfg):
    with pytest.raises(RuntimeError, match="answered 1 of 2 models"):
        evaluate_policies(lake, [Policy("a", "cand"), Policy("b", "prod")], cfg, "c5",
                          generate_each=lambda runs, c, d: [table_engine(*runs[0], c)])


def test_engine_that_drops_samples_is_refused(lake, cfg):
    def short(model_dir, prompts, cfg, domains=None):
        return table_engine(model_dir, prompts, cfg)[:-1]
    with pytest.raises(RuntimeError, match="expected one per item and sample"):
        evaluate_policy(lake, "unused", "cand", cfg, "c1", generate=short)


def test_with_the_real_engine_on_a_tiny_model(lake, tmp_path, scheduler):
    from flows.demo.tiny_model import init_model

    model_dir = init_model(tmp_path / "tiny")
    cfg = EvalConfig(engine=EngineConfig(backend="transformers", n=2, max_tokens=5, seed=1), k=2,
                     heldout_fraction=0.0, scheduler_address=scheduler)
    summary = evaluate_policies(lake, [Policy(str(model_dir), "cand")], cfg, "c2")[0]  # the real engine
    rows = lake.execute("SELECT item_id, completion_tokens, finish_reason FROM lake.evaluations "
                        "WHERE cycle_id = 'c2'").fetchall()
    assert len(rows) == len(ITEMS) * 2
    for _, tokens, reason in rows:  # "length" exactly when the model used all its tokens
        assert 1 <= tokens <= 5 and (reason == "length") == (tokens == 5 and reason != "stop")
    clean = [r for r in rows if r[0] != "a3"]
    assert summary.process["samples"] == len(clean)
    assert summary.process["tokens_per_answer"] == pytest.approx(sum(r[1] for r in clean) / len(clean))
    assert summary.process["truncation_rate"] == pytest.approx(
        sum(r[2] == "length" for r in clean) / len(clean))


def test_items_the_policys_chat_template_refuses_are_left_out_and_counted(tmp_path, scheduler):
    """Gemma's template refuses a system turn: that item is not sampled, counted by reason,
    and the other items are evaluated rather than the whole evaluation failing."""
    from flows.demo.tiny_model import init_model
    from tests.trainer.chat_templates import GEMMA, GEMMA_TOKENS, with_chat_template

    con = open_lake(LakeSettings(home=tmp_path / "home"))
    system = {"role": "system", "content": "Answer with a number."}
    items = [{"id": "plain", "domain": "math", "prompt": "What is 2+2?", "reference": {"answer": "4"}},
             {"id": "system", "domain": "math", "prompt": [system, {"role": "user", "content": "What is 3+3?"}],
              "reference": {"answer": "6"}}]
    (tmp_path / "set.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    register_evalset(con, "chat", tmp_path / "set.jsonl")
    policy = with_chat_template(init_model(tmp_path / "tiny"), GEMMA, GEMMA_TOKENS)
    cfg = EvalConfig(engine=EngineConfig(backend="transformers", n=2, max_tokens=3), k=2,
                     heldout_fraction=0.0, scheduler_address=scheduler)
    summary = evaluate_policies(con, [Policy(str(policy), "cand")], cfg, "c1")[0]  # the real engine
    assert summary.left_out == {"unrenderable": 1} and summary.headline["items"] == 1
    assert con.execute("SELECT DISTINCT item_id FROM lake.evaluations").fetchall() == [("plain",)]


def counting_engine(calls: list):
    """table_engine for any number of models, recording the prompts each was asked."""
    def each(runs, engine_cfg, domains):
        calls.append({model_dir: [m[-1]["content"] for m in prompts] for model_dir, prompts in runs})
        return [table_engine(model_dir, prompts, engine_cfg) for model_dir, prompts in runs]
    return each


def test_production_evaluated_last_cycle_is_not_sampled_again_on_the_registered_sets(lake, cfg):
    cfg = replace(cfg, reuse=True)
    calls = []
    read = ("SELECT item_id, sample_idx, reward, passed, status, completion_tokens, finish_reason "
            "FROM lake.evaluations WHERE policy_version = ? AND cycle_id = ? AND eval_set = 'arith' ORDER BY ALL")
    registered = {i["prompt"] for i in ITEMS}
    evaluate_policies(lake, [Policy("prod-dir", "prod-r")], cfg, "r1", generate_each=counting_engine(calls))
    assert registered <= set(calls[0]["prod-dir"])

    # next cycle: a new candidate beside the same production
    cand, prod = evaluate_policies(lake, [Policy("cand-dir", "cand-r"), Policy("prod-dir", "prod-r")], cfg, "r2",
                                   generate_each=counting_engine(calls))
    assert registered <= set(calls[1]["cand-dir"])
    assert not registered & set(calls[1].get("prod-dir", [])), "production's registered items were sampled again"
    assert (cand.reused, prod.reused) == (0, len(ITEMS))
    assert lake.execute(read, ["prod-r", "r2"]).fetchall() == lake.execute(read, ["prod-r", "r1"]).fetchall()
    origins = lake.execute("SELECT eval_set = 'arith', reused_from, settings FROM lake.evaluations "
                           "WHERE policy_version = 'prod-r' AND cycle_id = 'r2' GROUP BY ALL ORDER BY ALL").fetchall()
    settings = lake.execute("SELECT DISTINCT settings FROM lake.evaluations WHERE cycle_id = 'r1'").fetchall()
    assert [o[:2] for o in origins] == [(True, "r1")] and [(o[2],) for o in origins] == settings
    assert {s["item_id"]: s["score"] for s in prod.item_scores} == {"a1": 0.75, "a2": 0.25, "a3": 1.0, "q1": 0.5}

    # a third cycle reuses from the cycle that sampled, and another temperature samples again
    evaluate_policies(lake, [Policy("prod-dir", "prod-r")], cfg, "r3", generate_each=counting_engine(calls))
    assert len(calls) == 2, "every item reused and no fresh failure in r3: no engine call"
    assert lake.execute("SELECT DISTINCT reused_from FROM lake.evaluations WHERE cycle_id = 'r3' "
                        "AND eval_set = 'arith'").fetchall() == [("r1",)]
    evaluate_policies(lake, [Policy("prod-dir", "prod-r")], replace(cfg, engine=replace(cfg.engine, temperature=0.7)),
                      "r4", generate_each=counting_engine(calls))
    assert registered <= set(calls[2]["prod-dir"])


def test_reused_rows_are_checked_for_contamination_again(lake, cfg):
    """The leak is trained on after the first evaluation: the reused item is then excluded."""
    cfg = replace(cfg, reuse=True)
    calls = []
    first = evaluate_policies(lake, [Policy("m", "late-leak")], cfg, "l1", generate_each=counting_engine(calls))[0]
    assert first.contaminated == []
    with transaction(lake):
        append_rows(lake, "rollouts", _rows("rollouts", [_rollout("Please help with my homework. " + LEAKED,
                                                                  "late-leak")]))
    again = evaluate_policies(lake, [Policy("m", "late-leak")], cfg, "l2", generate_each=counting_engine(calls))[0]
    assert again.reused == len(ITEMS) and [c["item_id"] for c in again.contaminated] == ["a3"]
    flags = dict(lake.execute("SELECT item_id, bool_and(contaminated) FROM lake.evaluations WHERE cycle_id = 'l2' "
                              "AND eval_set = 'arith' GROUP BY 1").fetchall())
    assert flags == {"a1": False, "a2": False, "a3": True, "q1": False}
