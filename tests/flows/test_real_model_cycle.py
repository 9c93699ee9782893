"""A real instruct model through the whole loop: SmolLM2-135M-Instruct (BPE, ChatML).

`flywheel model import` of the GGUF that `make` installs, then one cycle under Prefect:
ingest -> curate -> one round (vLLM rollouts -> verify -> one DeepSpeed ZeRO-2 GRPO
step on 2 CPU ranks) -> evaluate (vLLM, both models) -> gate -> promote. The production
traffic is what a real model gets wrong: small sums it answers in sentences, a
function, a JSON extraction. Everything is sized from the model and the config: its
context, its stop token, a completion budget per domain.
"""
from __future__ import annotations

import json
import random
import textwrap

import pytest
from typer.testing import CliRunner

from flows.cli.app import app
from flows.demo.data.domains import sample_task
from storage.lake import open_lake
from storage.settings import LakeSettings

pytestmark = pytest.mark.slow

CONFIG = textwrap.dedent("""
    [cycle.rollout]
    tasks_per_round = 8
    [cycle.rollout.engine]
    n = 4
    temperature = 0.7
    max_tokens = 64
    max_tokens_by_domain = { code = 160, json = 96 }
    max_model_len = 1024
    [cycle.train]
    n_procs = 2
    [cycle.train.grpo]
    steps = 1
    groups_per_step = 8
    micro_tokens = 2048  # memory: see REAL_TOML in flows/demo/real_model.py
    temperature = 0.7
    max_tokens = 160
    checkpoint_every = 1
    lr = 1e-6
    [cycle.evaluate]
    k = 2
    [cycle.evaluate.engine]
    n = 2
    temperature = 0.7
    max_tokens = 64
    max_model_len = 1024
""")
# Sums SmolLM2 gets right sometimes (seen: 4 samples of "What is 4 + 5?" at 0.7 gave 3
# right), so their groups have reward variance and the step has something to learn.
SUMS = [(2, 3), (4, 5), (7, 1), (6, 2), (3, 3), (8, 4), (20, 30), (9, 9), (11, 2), (5, 4), (6, 3), (2, 7)]


def _log(i: int, domain: str, prompt: str, reference: dict) -> dict:
    return {"id": f"req-{i}", "ts": "2026-12-01T12:00:00Z", "model": "smollm2", "domain": domain,
            "messages": [{"role": "user", "content": prompt}], "response": "(the model's wrong answer)",
            "failure": {"kind": "wrong_answer"}, "reference": reference}


@pytest.fixture(scope="module")
def real_home(tmp_path_factory, smollm2):
    from tasks.curate.evalsets import register_evalset

    home = tmp_path_factory.mktemp("real") / "home"
    (home / "landing").mkdir(parents=True)
    (home / "flywheel.toml").write_text(CONFIG)
    rng = random.Random(7)
    logs = [_log(i, "math", f"What is {a} + {b}?", {"answer": str(a + b)}) for i, (a, b) in enumerate(SUMS)]
    logs += [_log(100 + i, d, (t := sample_task(d, rng))["prompt"], t["reference"])
             for i, d in enumerate(["code", "code", "json", "json"])]
    (home / "landing" / "traffic.jsonl").write_text("".join(json.dumps(r) + "\n" for r in logs))
    evalset = home / "sums.jsonl"
    evalset.write_text("".join(json.dumps({"id": f"e{i}", "domain": "math", "prompt": f"What is {a} plus {b}?",
                                           "reference": {"answer": str(a + b)}}) + "\n"
                               for i, (a, b) in enumerate([(1, 2), (3, 4), (5, 5), (10, 10)])))
    con = open_lake(LakeSettings(home=home))
    register_evalset(con, "sums", evalset)
    con.close()
    return home


def test_import_then_one_cycle_on_the_real_model(real_home, smollm2, monkeypatch):
    from prefect.testing.utilities import prefect_test_harness

    monkeypatch.setenv("FLYWHEEL_HOME", str(real_home))
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(real_home / "flywheel.toml"))
    imported = CliRunner().invoke(app, ["model", "import", str(smollm2), "--production"])
    assert imported.exit_code == 0, imported.output
    from flows.flywheel import CycleParams, flywheel_cycle

    with prefect_test_harness(server_startup_timeout=120):
        summary = flywheel_cycle(CycleParams(cycle_id="real-1", rounds=1))
    assert summary["status"] == "completed", summary
    con = open_lake(LakeSettings(home=real_home), read_only=True)
    q = lambda sql: con.execute(sql).fetchall()  # noqa: E731
    model = q("SELECT status, parameters, context_length, chat_template LIKE '%<|im_start|>%' FROM lake.models "
              "WHERE parent_version IS NULL")
    assert model[0][1:] == (134_515_008, 8192, True)
    # rollouts: G samples of each task, cut at the chat template's stop token or the domain's budget
    rollouts = q("SELECT t.domain, r.finish_reason, len(r.token_ids), r.token_ids[-1] FROM lake.rollouts r "
                 "JOIN lake.tasks t USING (task_id)")
    assert len(rollouts) % 4 == 0 and len(rollouts) >= 24
    budget = {"math": 64, "code": 160, "json": 96}
    for domain, finish, length, last in rollouts:
        assert (finish, last) == ("stop", 2) if finish == "stop" else length == budget[domain]
    statuses = dict(q("SELECT v.status, count(*) FROM lake.verdicts v GROUP BY 1"))
    assert statuses.get("ok", 0) > 0 and statuses.get("wrong", 0) > 0, statuses
    steps = q("SELECT step, groups_kept, groups_dropped FROM lake.train_steps")
    assert len(steps) == 1 and steps[0][1] >= 1, steps
    candidate = q("SELECT policy_version FROM lake.models WHERE parent_version IS NOT NULL")
    assert len(candidate) == 1
    scored = dict(q("SELECT policy_version, count(*) FROM lake.evaluations GROUP BY 1"))
    assert set(scored) == {candidate[0][0], q("SELECT policy_version FROM lake.models "
                                              "WHERE parent_version IS NULL")[0][0]}
    assert len(q("SELECT * FROM lake.gate_decisions")) == 1
    con.close()
