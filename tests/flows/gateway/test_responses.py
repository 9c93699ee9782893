"""OpenAI's Responses API through `flywheel gateway` in front of real `vllm serve`, driven by
the `openai` SDK: answered, streamed, logged as said, and judged by ingest as chat calls."""
from __future__ import annotations

import json
import subprocess
import sys

import openai
import pytest

from tests.flows.gateway.conftest import shipped_records, start_gateway

pytestmark = pytest.mark.timeout(600)
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


@pytest.fixture
def gateway(tmp_path, upstreams):
    running = start_gateway(tmp_path / "home", upstreams["v-a"].url)
    yield running
    running.stop()


def test_responses_streamed_or_not_are_answered_logged_and_judged_in_the_lake(gateway):
    from storage.lake import open_lake
    from storage.settings import LakeSettings
    from tasks.ingest.failure_rate import production_failure_rate

    client = gateway.client()
    # 3 tokens cannot hold the object the schema asks for: the reply is cut, not JSON
    cut = client.responses.create(model="flywheel", input="A person.", max_output_tokens=3,
                                  text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}})
    plain = client.responses.create(model="flywheel", instructions="Answer with a number.",
                                    input=[{"role": "user", "content": "What is 2+2?"}], max_output_tokens=4)
    events = list(client.responses.create(model="flywheel", input="What is 3+3?", max_output_tokens=4, stream=True))
    with client.responses.stream(model="flywheel", input="What is 4+4?", max_output_tokens=4) as stream:
        helped = stream.get_final_response()
    streamed = events[-1].response
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert {e.response.id for e in events if hasattr(e, "response")} == {streamed.id}
    ids = [cut.id, plain.id, streamed.id, helped.id]
    assert all(i.startswith("resp_") for i in ids) and len(set(ids)) == 4
    assert {cut.model, plain.model, streamed.model, helped.model} == {"flywheel"}
    assert streamed.output_text == "".join(e.delta for e in events if e.type == "response.output_text.delta")

    client.post("/feedback", body={"id": plain.id, "label": "bad", "correction": {"answer": "4"}}, cast_to=object)
    with pytest.raises(openai.UnprocessableEntityError, match="has 1 choice"):
        client.post("/feedback", body={"id": helped.id, "label": "bad", "choice": 1}, cast_to=object)
    assert gateway.stop()

    records = {r["id"]: r for r in shipped_records(gateway.landing) if r["type"] == "call"}
    assert set(records) == set(ids) and {r["api"] for r in records.values()} == {"responses"}
    assert records[streamed.id]["response"] == streamed.to_dict()
    assert records[plain.id]["response"]["output"] == plain.to_dict()["output"]
    assert records[plain.id]["request"] == {"model": "flywheel", "instructions": "Answer with a number.",
                                            "input": [{"role": "user", "content": "What is 2+2?"}],
                                            "max_output_tokens": 4}

    ingest = subprocess.run([sys.executable, "-m", "flows.cli.app", "ingest", str(gateway.landing)],
                            capture_output=True, text=True, env=gateway.env)
    assert ingest.returncode == 0, ingest.stdout + ingest.stderr
    con = open_lake(LakeSettings(home=gateway.home), read_only=True)
    logs = {row[0]: (row[1], json.loads(row[2])) for row in con.execute(
        "SELECT request_id, failure_kind, messages FROM failure_logs").fetchall()}
    assert {i: kind for i, (kind, _) in logs.items()} == {f"{cut.id}:json": "json", f"{plain.id}:feedback": "feedback"}
    assert logs[f"{cut.id}:json"][1][1] == {"role": "user", "content": "A person."}
    assert logs[f"{plain.id}:feedback"][1] == [{"role": "system", "content": "Answer with a number."},
                                              {"role": "user", "content": "What is 2+2?"}]
    rows = con.execute("SELECT api, count(*), sum(prompt_tokens > 0)::INT FROM interactions GROUP BY api").fetchall()
    assert rows == [("responses", 4, 4)]
    con.close()
    [rate] = production_failure_rate(LakeSettings(home=gateway.home))
    assert (rate["calls"], rate["failed"]) == (4, 2)


def test_what_the_gateway_cannot_log_as_a_conversation_is_refused_before_the_upstream(gateway):
    client = gateway.client()
    first = client.responses.create(model="flywheel", input="hi", max_output_tokens=2)
    refusals = {
        "previous_response_id": dict(input="and then?", previous_response_id=first.id),
        "hosted tools": dict(input="news?", tools=[{"type": "web_search"}]),
        "background": dict(input="hi", background=True),
        "item_reference": dict(input=[{"type": "item_reference", "id": first.output[0].id}]),
        "unknown model": dict(input="hi", model="gpt-4o"),
    }
    said = {}
    for name, kwargs in refusals.items():
        with pytest.raises(openai.UnprocessableEntityError) as refused:
            client.responses.create(**{"model": "flywheel", **kwargs})
        said[name] = refused.value.message
    assert "this gateway stores no responses; send the whole conversation as `input`" in said["previous_response_id"]
    assert "only function tools" in said["hosted tools"]
    assert "`background` responses are not served" in said["background"]
    assert "input items of type 'item_reference'" in said["item_reference"]
    assert "unknown model 'gpt-4o'" in said["unknown model"]
    assert gateway.stop()
    assert [r["id"] for r in shipped_records(gateway.landing)] == [first.id]
