"""Tool-call signals (tasks/ingest/tool_call_signals.py): the calls a tool parser could not
read, and calls without arguments, as replies from vLLM's tool parsers and OpenAI look."""
from __future__ import annotations

import json

import pytest

from tasks.ingest.signals import call_failures
from tests.tasks.ingest.test_signals import PERSON, TIME, WEATHER, call, called, json_schema_format, tool

TOOLS = [tool("get_weather", WEATHER), tool("get_time", TIME)]
NO_PARAMETERS = {"type": "object", "properties": {}}

# What vLLM returns as `content` (no `tool_calls`, finish_reason "stop") when its parser
# fails on the model's output: hermes and llama3_json hand back the whole output, mistral
# the output without its [TOOL_CALLS] token (older tokenizers' JSON list, v11's name{args}).
UNPARSED = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}\n</tool_call>',
    "hermes_after_prose": 'Let me look that up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": Oslo}}\n'
                          '</tool_call>',
    "llama3_json": '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "celsius"}',
    "mistral": "[{\"name\": \"get_weather\", \"arguments\": {\"city\": 'Oslo'}}]",
    "mistral_v11": 'get_weather{"city": "Oslo", "unit": }',
    "mistral_token_kept": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo",}}]',
}


@pytest.mark.parametrize("parser", UNPARSED)
def test_a_call_the_tool_parser_could_not_read_is_a_tool_call_failure_of_the_tool_it_names(parser):
    content = UNPARSED[parser]
    (log,) = call_failures(call(content, tools=TOOLS, tool_choice="auto"))
    assert (log["id"], log["failure"]["kind"], log["domain"]) == ("chatcmpl-1:tool_call", "tool_call", "json")
    assert log["reference"] == {"schema": WEATHER} and log["response"] == content
    assert log["messages"][0]["content"].startswith("Call the tool `get_weather`: reply with only its arguments")
    detail = log["failure"]["detail"]
    assert "written as text" in detail and "did not parse into tool_calls: not JSON" in detail


def test_without_a_name_to_go_by_the_written_call_is_judged_only_against_a_tool_it_must_have_meant():
    nameless = "<tool_call>\n{'city': 'Oslo'}\n</tool_call>"
    (one,) = call_failures(call(nameless, tools=[tool("get_weather", WEATHER)]))
    assert one["reference"] == {"schema": WEATHER}
    # several tools: which schema it meant is a guess, unless tool_choice named the tool
    assert call_failures(call(nameless, tools=TOOLS)) == []
    chosen = {"type": "function", "function": {"name": "get_time"}}
    (named,) = call_failures(call(nameless, tools=TOOLS, tool_choice=chosen))
    assert named["reference"] == {"schema": TIME}


@pytest.mark.parametrize("content, request_", [
    ("I can call get_weather for you: which city?", {"tools": TOOLS}),             # prose naming a tool
    ("Wrap each call in <tool_call> tags, then JSON.", {"tools": TOOLS}),           # the tag in a sentence
    ("Like this:\n```\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}\n</tool_call>\n```",
     {"tools": TOOLS}),                                                             # an example in a fence
    ('{"city": "Oslo", "forecast": "rain"}', {"tools": TOOLS}),                     # JSON that calls nothing
    ('{"name": "Ada", "arguments": ["x"]}', {"tools": TOOLS}),                      # names no tool of the request
    (UNPARSED["hermes"], {"tools": TOOLS, "tool_choice": "none"}),                  # not allowed to call
    (UNPARSED["hermes"], {}),                                                       # no tools offered
])
def test_replies_that_are_no_written_call_are_no_tool_call_failures(content, request_):
    assert call_failures(call(content, **request_)) == []


def test_a_written_call_is_no_answer_to_judge_against_the_response_format():
    # the model meant to call a tool before answering: the format binds the answer
    logs = call_failures(call(UNPARSED["hermes"], tools=TOOLS, response_format=json_schema_format(PERSON)))
    assert [log["id"] for log in logs] == ["chatcmpl-1:tool_call"]


def test_a_written_call_in_a_later_choice_is_that_choices_failure():
    many = call("It is sunny in Oslo.", tools=TOOLS, n=2)
    many["response"]["choices"].append({"index": 1, "finish_reason": "stop", "message": {
        "role": "assistant", "content": UNPARSED["llama3_json"]}})
    assert [log["id"] for log in call_failures(many)] == ["chatcmpl-1:choice1:tool_call"]


@pytest.mark.parametrize("arguments", ["", None])
def test_empty_arguments_are_the_call_without_arguments(arguments):
    tools = [tool("now", NO_PARAMETERS), {"type": "function", "function": {"name": "ping"}}, tool("get_time", TIME)]
    calls = [called("now", arguments), called("ping", arguments), called("get_time", arguments)]
    assert call_failures(call(None, tools=tools, tool_calls=calls)) == []


def test_empty_arguments_of_a_tool_that_needs_some_are_a_failure_saying_so():
    (log,) = call_failures(call(None, tools=TOOLS, tool_calls=[called("get_weather", "")]))
    assert log["failure"]["detail"] == ("tool call 0 (get_weather): empty arguments, which as {} violates the "
                                        "schema: 1 schema error(s); at (root): 'city' is a required property")
    assert log["response"] == "" and log["reference"] == {"schema": WEATHER}
    # "{}" itself is judged as before
    (braces,) = call_failures(call(None, tools=TOOLS, tool_calls=[called("get_weather", "{}")]))
    assert braces["failure"]["detail"].startswith("tool call 0 (get_weather): violates the schema")
    assert json.loads(braces["response"]) == {}
