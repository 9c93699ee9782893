"""A stream put back together is the chat.completion the same call gets unstreamed, for the
shapes vLLM streams: reasoning, parallel tool calls in fragments, `n` > 1, logprobs."""
from __future__ import annotations

import json

import pytest

from flows.gateway.streams import StreamAssembly
from tests.flows.gateway.vllm_like_upstream import completion, stream_events

MODES = ("reasoning", "reasoning-content", "thinking-cut", "tools", "broken-tool", "plain")


def assembled(request: dict) -> dict:
    assembly = StreamAssembly()
    for event in stream_events("v", request)[:-1]:  # the last is [DONE]
        assembly.add(json.loads(event.removeprefix(b"data: ")))
    return assembly.completion("chatcmpl-upstream", "v")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("extra", [{}, {"n": 2, "logprobs": True, "top_logprobs": 5}], ids=["one", "n2-logprobs"])
def test_a_stream_assembles_to_the_unstreamed_completion(mode, extra):
    # the gateway always asks for the usage chunk (flows/gateway/calls.py)
    request = {"messages": [{"role": "user", "content": mode}], "stream_options": {"include_usage": True}, **extra}
    assert assembled(request) == completion("v", request)


def test_reasoning_text_and_logprobs_are_joined_across_chunks():
    request = {"messages": [{"role": "user", "content": "reasoning"}], "logprobs": True,
               "stream_options": {"include_usage": True}}
    choice = assembled(request)["choices"][0]
    assert choice["message"]["reasoning"] == "The user asks for 2+2. Adding gives 4."
    assert "".join(t["token"] for t in choice["logprobs"]["content"]) == choice["message"]["content"]


def test_fields_no_one_named_are_kept_and_a_role_sent_twice_stays_one_role():
    assembly = StreamAssembly()
    chunks = [
        {"created": 5, "prompt_token_ids": [1, 2], "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "token_ids": [7]}]},
        {"created": 5, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi",
                                                          "function_call": {"name": "f", "arguments": "{\"a\""}},
                                    "token_ids": [8]}]},
        {"created": 5, "system_fingerprint": "fp", "choices": [
            {"index": 0, "delta": {"function_call": {"arguments": ": 1}"}}, "finish_reason": "stop",
             "stop_reason": 42, "token_ids": []}]},
    ]
    for chunk in chunks:
        assembly.add(chunk)
    body = assembly.completion("chatcmpl-x", "m")
    assert body["prompt_token_ids"] == [1, 2] and body["system_fingerprint"] == "fp"
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "hi", "function_call": {
        "name": "f", "arguments": "{\"a\": 1}"}}, "finish_reason": "stop", "token_ids": [7, 8], "stop_reason": 42,
        "logprobs": None}]
