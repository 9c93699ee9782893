"""Responses API calls read as the chat calls they amount to: the same failure signals,
the same failure logs, and a clear refusal for what a chat log cannot hold."""
from __future__ import annotations

import json

import pytest

from tasks.ingest.gateway import parse_line
from tasks.ingest.responses_api import chat_request, chat_response, chat_view, request_problem
from tasks.ingest.signals import call_failures, feedback_failure, interaction_row
from tests.tasks.ingest.test_signals import PERSON, WEATHER, call, called, feedback, json_schema_format, tool
from verifiers.registry import DEFAULT_DOMAIN_MAP

# What vLLM's /v1/responses returns (its shapes, trimmed to the fields read here).
TOOLS = [{"type": "function", "name": "get_weather", "description": "the get_weather tool", "parameters": WEATHER}]


def message_item(text: str) -> dict:
    return {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": None}]}


def function_item(name: str, arguments: str) -> dict:
    return {"id": f"fc_{name}", "type": "function_call", "call_id": f"call_{name}", "name": name,
            "arguments": arguments, "status": "completed"}


def responses_call(output: list[dict], *, incomplete: str | None = None, **request) -> dict:
    """The gateway's record of a Responses call (the same one `call` of test_signals makes as chat)."""
    return {"type": "call", "api": "responses", "id": "chatcmpl-1", "seq": 7, "gateway": "gw-a",
            "ts": "2026-12-01T10:00:00.250Z", "model_version": "policy-v4", "status": 200, "stream": False,
            "latency_ms": 812.5, "usage": {"input_tokens": 31, "output_tokens": 9, "total_tokens": 40},
            "request": {"model": "flywheel", "input": "Who is Ada?", **request},
            "response": {"id": "chatcmpl-1", "object": "response", "model": "flywheel", "output": output,
                         "status": "incomplete" if incomplete else "completed",
                         "incomplete_details": {"reason": incomplete} if incomplete else None,
                         "usage": {"input_tokens": 31, "output_tokens": 9, "total_tokens": 40}}}


def test_a_whole_conversation_becomes_the_chat_request_it_amounts_to():
    body = {"model": "flywheel", "instructions": "Be brief.", "max_output_tokens": 64, "temperature": 0.2,
            "input": [
                {"role": "developer", "content": "Use tools."},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "Weather here?"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "look it up"}]},
                function_item("get_weather", '{"city": "Oslo"}'),
                function_item("get_time", "{}"),
                {"type": "function_call_output", "call_id": "call_get_weather", "output": "4 C"},
                {"type": "function_call_output", "call_id": "call_get_time", "output": [
                    {"type": "input_text", "text": "10:00"}]},
                {"role": "assistant", "content": [{"type": "output_text", "text": "4 C at 10:00."}]},
                {"role": "user", "content": "And tomorrow?"}],
            "tools": TOOLS, "tool_choice": {"type": "function", "name": "get_weather"},
            "text": {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}}
    assert request_problem(body) is None
    assert chat_request(body) == {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": "Use tools."},
            {"role": "user", "content": [{"type": "text", "text": "Weather here?"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
            {"role": "assistant", "content": None, "tool_calls": [called("get_weather", '{"city": "Oslo"}'),
                                                                  called("get_time", "{}")]},
            {"role": "tool", "tool_call_id": "call_get_weather", "content": "4 C"},
            {"role": "tool", "tool_call_id": "call_get_time", "content": [{"type": "text", "text": "10:00"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "4 C at 10:00."}]},
            {"role": "user", "content": "And tomorrow?"}],
        "temperature": 0.2, "max_tokens": 64,
        "response_format": json_schema_format(PERSON) | {"json_schema": {"name": "person", "schema": PERSON,
                                                                         "strict": True}},
        "tools": [tool("get_weather", WEATHER)],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}


def test_output_items_are_one_choice_and_a_cut_reply_finished_at_length():
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": [],
                 "content": [{"type": "reasoning_text", "text": "Ada was a mathematician."}]}
    both = chat_response(responses_call([reasoning, message_item("Ada "), message_item("Lovelace"),
                                         function_item("get_weather", '{"city": 1}')])["response"])
    assert both["choices"] == [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Ada Lovelace", "reasoning": "Ada was a mathematician.",
        "tool_calls": [called("get_weather", '{"city": 1}')]}}]
    assert both["usage"] == {"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40}
    cut = chat_response(responses_call([reasoning], incomplete="max_output_tokens")["response"])
    assert cut["choices"][0]["finish_reason"] == "length"
    assert cut["choices"][0]["message"]["content"] is None
    refused = chat_response(responses_call([{"type": "message", "role": "assistant", "content": [
        {"type": "refusal", "refusal": "I cannot help with that."}]}])["response"])
    assert refused["choices"][0]["message"] == {"role": "assistant", "content": None,
                                                "refusal": "I cannot help with that."}


@pytest.mark.parametrize("chat, responses", [
    pytest.param(call("Ada Lovelace, 36", response_format=json_schema_format(PERSON)),
                 responses_call([message_item("Ada Lovelace, 36")],
                                text={"format": {"type": "json_schema", "name": "reply", "schema": PERSON,
                                                 "strict": True}}), id="json_schema"),
    pytest.param(call("Ada", response_format={"type": "json_object"}),
                 responses_call([message_item("Ada")], text={"format": {"type": "json_object"}}), id="json_object"),
    pytest.param(call(None, tool_calls=[called("get_weather", '{"city": 1}')], tools=[tool("get_weather", WEATHER)]),
                 responses_call([function_item("get_weather", '{"city": 1}')], tools=TOOLS), id="tool_arguments"),
    pytest.param(call('{"name": "get_weather", "arguments": {"town": "Oslo"}}', tools=[tool("get_weather", WEATHER)]),
                 responses_call([message_item('{"name": "get_weather", "arguments": {"town": "Oslo"}}')],
                                tools=TOOLS), id="tool_call_written_as_text"),
])
def test_a_responses_call_fails_as_the_same_chat_call_does(chat, responses):
    expected = call_failures(chat)
    assert expected  # each case is a failure
    assert call_failures(chat_view(responses)) == expected
    assert interaction_row(responses, ["json"])["prompt_tokens"] == 31
    assert interaction_row(responses, ["json"])["api"] == "responses"
    assert interaction_row(chat, ["json"])["api"] == "chat"


def test_a_cut_structured_reply_says_it_was_cut():
    (log,) = call_failures(chat_view(responses_call(
        [], incomplete="max_output_tokens", text={"format": {"type": "json_schema", "name": "p", "schema": PERSON}})))
    assert log["failure"]["detail"] == "no answer: cut at the token limit (finish_reason length) before any content"


def test_feedback_on_a_responses_call_is_about_its_reply():
    responses = responses_call([message_item("Ada is 72.")], input=[{"role": "user", "content": "How old is Ada?"}])
    log = feedback_failure(feedback({"answer": "36"}), chat_view(responses), DEFAULT_DOMAIN_MAP)
    assert (log["messages"], log["response"], log["reference"]) == (
        [{"role": "user", "content": "How old is Ada?"}], "Ada is 72.", {"answer": "36"})


@pytest.mark.parametrize("body, problem", [
    ({"input": ""}, "`input` must be a non-empty string"),
    ({"input": []}, "`input` must be a non-empty string"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]: input items of type 'item_reference'"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]},
     "input[0]: content part 'input_file' is not served here"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]},
     "content part 'input_image' is not served here"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input[0]: a function_call item needs `call_id`"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]: only function tools"),
    ({"input": "hi", "tool_choice": {"type": "web_search"}}, "`tool_choice` must be"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "needs `schema`"),
    ({"input": "hi", "text": {"format": {"type": "grammar"}}}, "`text.format` must be"),
    ({"input": "hi", "instructions": ["be brief"]}, "`instructions` must be a string"),
])
def test_what_a_chat_log_cannot_hold_is_refused_saying_what(body, problem):
    assert problem in request_problem(body)


def test_a_shipped_responses_record_that_cannot_be_read_is_quarantined_with_why():
    record = responses_call([message_item("hi")])
    record["request"]["input"] = [{"type": "item_reference", "id": "msg_1"}]
    _, parsed, kind, reason = parse_line(json.dumps(record).encode())
    assert (parsed, kind) == (None, "bad_record")
    assert reason.startswith("call `request` (Responses API): input[0]: input items of type 'item_reference'")
    _, parsed, _, reason = parse_line(json.dumps({**record, "api": "completions"}).encode())
    assert parsed is None and "call `api` must be 'responses' or absent" in reason


def test_a_responses_calls_chat_template_arguments_reach_its_failure_logs():
    """Qwen3 served without thinking through /v1/responses: the task must be rolled out so too."""
    responses = responses_call([message_item("Ada")], text={"format": {"type": "json_object"}},
                               chat_template_kwargs={"enable_thinking": False})
    (log,) = call_failures(chat_view(responses))
    assert log["chat_template_kwargs"] == {"enable_thinking": False}
