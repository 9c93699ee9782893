"""The gateway in front of `vllm serve` of a real instruct model (SmolLM2-135M-Instruct: BPE
tokenizer, ChatML template, answers in sentences), driven by the `openai` SDK, its logs
taken through `flywheel ingest`."""
from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest

from flows.gateway.vllm_serve import ServedModel
from storage.lake import open_lake
from storage.settings import LakeSettings
from tests.flows.gateway.conftest import shipped_records, start_gateway

pytestmark = pytest.mark.timeout(900)

ASK = [{"role": "user", "content": "What is 47 + 25?"}]


def test_a_real_model_behind_the_gateway_answers_streams_keeps_schemas_and_its_failures_reach_the_lake(
        tmp_path, smollm2):
    served = ServedModel.start(smollm2, "smollm2", tmp_path / "logs", max_model_len=2048).wait_ready(600)
    gateway = None
    try:
        gateway = start_gateway(tmp_path / "home", served.url)
        client = gateway.client().with_options(timeout=120)
        answer = client.chat.completions.create(model="flywheel", messages=ASK, max_tokens=48, temperature=0)
        text = answer.choices[0].message.content
        # the template's end-of-turn token stops the answer and is not part of it
        assert text.strip() and "<|im_end|>" not in text and answer.choices[0].finish_reason == "stop"
        chunks = list(client.chat.completions.create(model="flywheel", messages=ASK, max_tokens=48, temperature=0,
                                                     stream=True))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        schema = {"type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"],
                  "additionalProperties": False}
        structured = client.chat.completions.create(
            model="flywheel", max_tokens=48, temperature=0,
            messages=[{"role": "user", "content": "Add 47 and 25. Reply with JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "sum", "schema": schema}})
        jsonschema.validate(json.loads(structured.choices[0].message.content), schema)
        tool = {"type": "function", "function": {"name": "add", "parameters": {
            "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"]}}}
        called = client.chat.completions.create(
            model="flywheel", max_tokens=48, temperature=0, tools=[tool],
            messages=[{"role": "user", "content": "Add 47 and 25 with the tool."}],
            tool_choice={"type": "function", "function": {"name": "add"}})
        arguments = json.loads(called.choices[0].message.tool_calls[0].function.arguments)
        jsonschema.validate(arguments, tool["function"]["parameters"])
        client.post("/feedback", cast_to=object,
                    body={"id": answer.id, "label": "bad", "correction": {"answer": "72"}, "comment": "say 72"})
        assert gateway.stop()  # a graceful stop ships the spool
    finally:
        if gateway is not None:
            gateway.stop()
        served.stop()

    records = {r["id"]: r for r in shipped_records(gateway.landing) if r["type"] == "call"}
    assert set(records) == {answer.id, chunks[0].id, structured.id, called.id}
    assert records[answer.id]["response"]["choices"][0]["message"]["content"] == text
    assert records[chunks[0].id]["response"]["choices"][0]["message"]["content"] == streamed
    assert {r["model_version"] for r in records.values()} == {"smollm2"}
    assert all(r["usage"]["prompt_tokens"] > 10 for r in records.values())  # the ChatML template's tokens

    ingest = subprocess.run([sys.executable, "-m", "flows.cli.app", "ingest", str(gateway.landing)],
                            capture_output=True, text=True, env=gateway.env)
    assert ingest.returncode == 0, ingest.stdout + ingest.stderr
    con = open_lake(LakeSettings(home=gateway.home), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM interactions").fetchone()[0] == 4
        # the schema was kept and the tool's arguments fit: the only failure is the feedback's
        [(request_id, kind, reference)] = con.execute(
            "SELECT request_id, failure_kind, reference FROM failure_logs").fetchall()
    finally:
        con.close()
    assert (request_id, kind) == (f"{answer.id}:feedback", "feedback") and "72" in reference
