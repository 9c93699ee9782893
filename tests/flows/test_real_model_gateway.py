"""The gateway in front of `vllm serve` of a real instruct model (SmolLM2-135M-Instruct: BPE
tokenizer, ChatML template, answers in sentences), driven by the `openai` SDK, its logs
taken through `flywheel ingest`; the server takes other weights of its architecture in
place, as the gateway's in-place swap loads a promoted policy."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from flows.gateway.vllm_serve import ServedModel
from storage.lake import open_lake
from storage.settings import LakeSettings
from tests.flows.gateway.conftest import recomputed, sampled_logprobs, shipped_records, start_gateway

pytestmark = pytest.mark.timeout(900)

ASK = [{"role": "user", "content": "What is 47 + 25?"}]


def test_a_real_model_behind_the_gateway_answers_streams_keeps_schemas_and_its_failures_reach_the_lake(
        tmp_path, smollm2):
    served = ServedModel.start(smollm2, "smollm2", tmp_path / "logs", max_model_len=2048,
                               reloadable=True).wait_ready(600)
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
        assert_reloads_in_place(served, smollm2, perturbed_copy(smollm2, tmp_path / "other"))
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


def perturbed_copy(model_dir: Path, out: Path) -> Path:
    """SmolLM2's architecture with other weights: the (tied) embedding and the final norm
    scaled, which the CPU reload must not leave reading the old copy of."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, out)
    weights = load_file(out / "model.safetensors")
    weights["model.embed_tokens.weight"] *= 1.1
    weights["model.norm.weight"] *= 1.3
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


def assert_reloads_in_place(served: ServedModel, first: Path, second: Path) -> None:
    """Load `second` into the running server and back: each time, the logprobs it returns
    (asked directly: these calls are not the gateway's) are transformers' on the folder it holds."""
    import openai

    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=120)
    for weights, other in ((first, second), (second, first), (first, second)):
        if served.model_dir != weights:
            assert served.can_reload(weights)
            print(f"SmolLM2: {weights.name} loaded in place in {served.reload(weights):.2f} s")
        _version, prompt_ids, ids, logprobs = sampled_logprobs(client, ASK[0]["content"], model=served.version)
        same = max(abs(a - b) for a, b in zip(logprobs, recomputed(weights, prompt_ids, ids)))
        different = max(abs(a - b) for a, b in zip(logprobs, recomputed(other, prompt_ids, ids)))
        print(f"SmolLM2 holding {weights.name}: max |logprob - transformers'| {same:.2e}, {different:.2f} "
              f"against the other weights")
        assert same < 1e-3 and different > 0.05
