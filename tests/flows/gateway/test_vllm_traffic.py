"""What apps built on vLLM send through the gateway, with the `openai` SDK, against an upstream
answering in vLLM's shapes (tests/flows/gateway/vllm_like_upstream.py: reasoning, parallel
tool calls, a broken one, `n` samples, logprobs). Each call is logged whole, a streamed one
as the same call unstreamed would be, and ingest's signals judge both alike."""
from __future__ import annotations

import json

import openai
import pytest

from tasks.ingest.signals import call_failures, feedback_failure
from tests.flows.gateway.conftest import shipped_records, start_gateway, start_upstream_script
from tests.flows.gateway.vllm_like_upstream import THOUGHT, UNPARSED
from verifiers.registry import DEFAULT_DOMAIN_MAP

pytestmark = pytest.mark.timeout(300)
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
             "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
             "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"tz": {"type": "string"}}}}}]


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


CASES = {
    "reasoning": {"messages": ask("reasoning")},
    "reasoning_content": {"messages": ask("reasoning-content")},
    "thinking_cut": {"messages": ask("thinking-cut"), "max_completion_tokens": 16,
                     "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}},
    "parallel_tools": {"messages": ask("tools"), "tools": TOOLS, "tool_choice": "auto"},
    "broken_tool": {"messages": ask("broken-tool"), "tools": TOOLS, "tool_choice": "auto"},
    "n2_logprobs": {"messages": ask("reasoning"), "n": 2, "logprobs": True, "top_logprobs": 5},
}


@pytest.fixture(scope="module")
def upstream():
    process, url = start_upstream_script("tests.flows.gateway.vllm_like_upstream", "v-like")
    yield url
    process.kill()


@pytest.fixture
def gateway(tmp_path, upstream):
    gateway = start_gateway(tmp_path / "home", upstream)
    yield gateway
    gateway.stop()


def test_a_streamed_call_is_logged_and_judged_as_the_same_call_unstreamed(gateway):
    client, ids = gateway.client(), {}
    for name, kwargs in CASES.items():
        plain = client.chat.completions.create(model="flywheel", **kwargs)
        chunks = list(client.chat.completions.create(model="flywheel", stream=True, **kwargs))
        ids[name] = (plain.id, chunks[0].id)
        if name == "reasoning":  # the client sees the thoughts either way
            assert plain.choices[0].message.model_extra["reasoning"] == THOUGHT
            assert "".join(c.choices[0].delta.model_extra.get("reasoning") or "" for c in chunks) == THOUGHT
    for plain_id, stream_id in (ids["reasoning"], ids["n2_logprobs"]):  # the ids the SDK handed out
        for completion_id in (plain_id, stream_id):
            assert client.post("/feedback", body={"id": completion_id, "label": "bad"}, cast_to=object) == {
                "id": completion_id, "recorded": True}
    assert gateway.stop()

    records = {r["id"]: r for r in shipped_records(gateway.landing) if r["type"] == "call"}
    for name, (plain_id, stream_id) in ids.items():
        plain, stream = records[plain_id], records[stream_id]
        assert {**stream["response"], "id": plain_id} == plain["response"], name
        assert [(f["failure"]["kind"], f["failure"]["detail"]) for f in call_failures(stream)] == \
            [(f["failure"]["kind"], f["failure"]["detail"]) for f in call_failures(plain)], name
    reasoning = records[ids["reasoning"][1]]["response"]["choices"][0]["message"]
    assert reasoning["reasoning"] == THOUGHT and reasoning["content"] == "The answer is 4."
    assert records[ids["reasoning_content"][1]]["response"]["choices"][0]["message"]["reasoning_content"] == THOUGHT
    n2 = records[ids["n2_logprobs"][1]]["response"]["choices"]
    assert [c["index"] for c in n2] == [0, 1] and all(len(c["logprobs"]["content"][0]["top_logprobs"]) == 5
                                                      for c in n2)
    (cut,) = call_failures(records[ids["thinking_cut"][1]])
    assert cut["failure"]["detail"] == "no answer: cut at the token limit (finish_reason length) while still reasoning"
    calls = records[ids["parallel_tools"][1]]["response"]["choices"][0]
    assert calls["finish_reason"] == "tool_calls" and calls["message"]["content"] is None
    assert [json.loads(c["function"]["arguments"]) for c in calls["message"]["tool_calls"]] == [
        {"city": "Oslo", "unit": "celsius"}, {"tz": "Europe/Oslo"}]
    assert [f["failure"]["kind"] for f in call_failures(records[ids["broken_tool"][1]])] == ["tool_call"]


def test_a_call_vllms_tool_parser_could_not_read_is_a_tool_call_failure(gateway):
    client = gateway.client()
    answers = {mode: client.chat.completions.create(model="flywheel", messages=ask(mode), tools=TOOLS,
                                                    tool_choice="auto") for mode in UNPARSED}
    for mode, answer in answers.items():  # what the app got: prose, as far as the SDK can tell
        assert answer.choices[0].message.tool_calls is None and answer.choices[0].message.content == UNPARSED[mode]
    assert gateway.stop()
    records = {r["id"]: r for r in shipped_records(gateway.landing)}
    for mode, answer in answers.items():
        (log,) = call_failures(records[answer.id])
        assert (log["failure"]["kind"], log["response"]) == ("tool_call", UNPARSED[mode]), mode
        assert log["reference"] == {"schema": TOOLS[0]["function"]["parameters"]}, mode


def test_feedback_says_which_sample_of_an_n_call_it_is_about(gateway):
    client = gateway.client()
    sampled = client.chat.completions.create(model="flywheel", messages=ask("samples"), n=3)
    assert [c.message.content for c in sampled.choices] == ["sample 0", "sample 1", "sample 2"]
    said = {"id": sampled.id, "label": "bad", "correction": {"answer": "4"}}
    with pytest.raises(openai.UnprocessableEntityError, match="has 3 choice.* `choice` 3 is none of them"):
        client.post("/feedback", body={**said, "choice": 3}, cast_to=object)
    with pytest.raises(openai.UnprocessableEntityError, match="`choice` must be the index"):
        client.post("/feedback", body={**said, "choice": "second"}, cast_to=object)
    assert client.post("/feedback", body={**said, "choice": 1}, cast_to=object) == {"id": sampled.id,
                                                                                      "recorded": True}
    assert client.post("/feedback", body={**said, "choice": 1}, cast_to=object)["recorded"] is False
    with pytest.raises(openai.ConflictError):  # the same words about another sample are other feedback
        client.post("/feedback", body=said, cast_to=object)
    assert gateway.stop()
    call, feedback = shipped_records(gateway.landing)
    assert feedback["choice"] == 1
    assert feedback_failure(feedback, call, DEFAULT_DOMAIN_MAP)["response"] == "sample 1"


def test_vllm_parameters_reach_the_upstream_as_sent_and_usage_is_logged_whether_asked_or_not(gateway):
    client = gateway.client()
    sent = {"max_completion_tokens": 7, "seed": 3, "user": "u-17", "metadata": {"app": "notes"},
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
            "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    vllm_only = {"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1,
                 "chat_template_kwargs": {"enable_thinking": False}}
    echo = client.chat.completions.create(model="flywheel", messages=ask("echo"), extra_body=vllm_only, **sent)
    received = json.loads(echo.choices[0].message.content)
    assert received == {"model": "v-like", "messages": ask("echo"), **sent, **vllm_only}
    asked = list(client.chat.completions.create(model="flywheel", messages=ask("hi"), stream=True,
                                                stream_options={"include_usage": True}))
    assert asked[-1].choices == [] and asked[-1].usage.total_tokens == 21
    unasked = list(client.chat.completions.create(model="flywheel", messages=ask("hi"), stream=True))
    assert all(c.usage is None for c in unasked)
    assert gateway.stop()
    records = {r["id"]: r for r in shipped_records(gateway.landing)}
    assert records[echo.id]["request"] == {"model": "flywheel", "messages": ask("echo"), **sent, **vllm_only}
    assert records[asked[0].id]["usage"] == records[unasked[0].id]["usage"] == {
        "prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}


def test_an_image_is_passed_on_and_logged_and_one_past_the_size_limit_is_a_413_saying_which_setting(gateway):
    client = gateway.client()
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "iVBORw0KGgo" * 100}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}, image]}]
    seen = client.chat.completions.create(model="flywheel", messages=messages)
    huge = {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + "A" * (2 << 20)}}
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="flywheel", messages=[{"role": "user", "content": [huge]}])
    assert refused.value.status_code == 413
    assert "FLYWHEEL_GATEWAY_MAX_REQUEST_BYTES" in refused.value.message and "data: URL" in refused.value.message
    assert gateway.stop()
    assert "Traceback" not in gateway.log()
    [record] = shipped_records(gateway.landing)
    assert record["id"] == seen.id and record["request"]["messages"] == messages
