"""An upstream that answers in the shapes `vllm serve` sends for the traffic real apps make.

`python -m tests.flows.gateway.vllm_like_upstream PORT VERSION` lists VERSION on /v1/models.
A chat completion's last message content picks the reply (the tiny model the other tests
serve cannot reason, call several tools at once or break a tool call on purpose):
- `reasoning`: a reasoning parser's reply: `message.reasoning` beside `content` (vLLM's
  name since 0.10; `reasoning-content` spells it `reasoning_content`, as older vLLM and
  DeepSeek's API do);
- `thinking-cut`: cut at max_tokens while still thinking: reasoning, `content` null,
  finish_reason `length`;
- `tools`: two parallel tool calls, `content` null, finish_reason `tool_calls`;
- `broken-tool`: one tool call whose arguments are not JSON (a real model's slip);
- `hermes-unparsed`, `llama3-unparsed`, `mistral-unparsed`: a call whose JSON the tool
  parser could not read, handed back as `content` (no `tool_calls`, finish_reason `stop`)
  as vLLM's parsers do in a reply not streamed (a stream's parser sends partial calls);
- `samples`: each choice says its index (`sample 0`, `sample 1`, ...);
- `echo`: the body the upstream received, as the reply's content;
- anything else: a plain answer.
A Responses API call (`/v1/responses`) gets one short answer, streamed when asked.
Every reply has `n` choices and, when asked (`logprobs`, `top_logprobs`), per-token
logprobs. A stream is cut from the same reply as vLLM cuts one: a role chunk, then small
deltas (a tool call's id and name first, its arguments in fragments) interleaved across
choices and parallel tool calls, a finish chunk per choice, and a usage-only last chunk
when `stream_options.include_usage` is set.
"""
from __future__ import annotations

import json
import sys
from http.server import ThreadingHTTPServer

from tests.flows.gateway.upstream_handler import ScriptedUpstream

USAGE = {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}
THOUGHT = "The user asks for 2+2. Adding gives 4."
CALLS = [("get_weather", '{"city": "Oslo", "unit": "celsius"}'), ("get_time", '{"tz": "Europe/Oslo"}')]
UNPARSED = {  # hermes and llama3_json return the whole output, mistral drops its [TOOL_CALLS] token
    "hermes-unparsed": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}\n'
                       '</tool_call>',
    "llama3-unparsed": '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "celsius"}',
    "mistral-unparsed": "[{\"name\": \"get_weather\", \"arguments\": {\"city\": 'Oslo'}}]",
}


def message(mode: str, request: dict, index: int = 0) -> tuple[dict, str]:
    """(the choice's message, its finish_reason) for a mode."""
    if isinstance(mode, str) and mode in UNPARSED:  # a content of parts (an image) is a list
        return {"role": "assistant", "content": UNPARSED[mode]}, "stop"
    if mode == "samples":
        return {"role": "assistant", "content": f"sample {index}"}, "stop"
    if mode in ("reasoning", "reasoning-content"):
        name = "reasoning" if mode == "reasoning" else "reasoning_content"
        return {"role": "assistant", "content": "The answer is 4.", name: THOUGHT}, "stop"
    if mode == "thinking-cut":
        return {"role": "assistant", "content": None, "reasoning": THOUGHT}, "length"
    if mode in ("tools", "broken-tool"):
        calls = CALLS if mode == "tools" else [("get_weather", '{"city": "Oslo", "unit": ')]
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"chatcmpl-tool-{i}", "type": "function", "function": {"name": name, "arguments": arguments}}
            for i, (name, arguments) in enumerate(calls)]}, "tool_calls"
    if mode == "echo":
        return {"role": "assistant", "content": json.dumps(request)}, "stop"
    return {"role": "assistant", "content": f"answer to {mode}"}, "stop"


def logprobs(text: str, top: int) -> dict:
    return {"content": [{"token": token, "logprob": -0.5, "bytes": list(token.encode()),
                         "top_logprobs": [{"token": token, "logprob": -0.5, "bytes": list(token.encode())}] * top}
                        for token in pieces(text)]}


def pieces(text: str, size: int = 5) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def completion(version: str, request: dict) -> dict:
    mode = request["messages"][-1]["content"]
    choices = []
    for index in range(request.get("n") or 1):
        reply, finish = message(mode, request, index)
        wants = request.get("logprobs") and reply.get("content")
        choices.append({"index": index, "message": reply, "finish_reason": finish, "stop_reason": None,
                        "logprobs": logprobs(reply["content"], request.get("top_logprobs") or 0) if wants else None})
    return {"id": "chatcmpl-upstream", "object": "chat.completion", "created": 1700000000, "model": version,
            "choices": choices, "usage": USAGE}


def deltas(choice: dict) -> list[dict]:
    """One choice as the stream choices vLLM sends for it, in order."""
    reply, out = choice["message"], [{"delta": {"role": "assistant", "content": ""}}]
    for name in ("reasoning", "reasoning_content"):
        out += [{"delta": {name: part}} for part in pieces(reply.get(name) or "")]
    tokens = (choice.get("logprobs") or {}).get("content") or []
    for i, part in enumerate(pieces(reply.get("content") or "")):
        out.append({"delta": {"content": part}, "logprobs": {"content": [tokens[i]]} if tokens else None})
    calls = reply.get("tool_calls") or []
    for i, call in enumerate(calls):
        out.append({"delta": {"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                              "function": {"name": call["function"]["name"]}}]}})
    fragments = [pieces(call["function"]["arguments"], 7) for call in calls]
    for step in range(max(map(len, fragments), default=0)):  # parallel calls' arguments interleaved
        out += [{"delta": {"tool_calls": [{"index": i, "function": {"arguments": parts[step]}}]}}
                for i, parts in enumerate(fragments) if step < len(parts)]
    out.append({"delta": {"content": ""}, "finish_reason": choice["finish_reason"], "stop_reason": None})
    return out


def stream_events(version: str, request: dict) -> list[bytes]:
    whole = completion(version, request)
    per_choice = [[{"index": c["index"], "logprobs": None, "finish_reason": None, **d} for d in deltas(c)]
                  for c in whole["choices"]]
    head = {"id": "chatcmpl-upstream", "object": "chat.completion.chunk", "created": whole["created"],
            "model": version}
    events = []
    for step in range(max(map(len, per_choice))):  # n choices interleaved, as vLLM's engine yields them
        events += [{**head, "choices": [parts[step]]} for parts in per_choice if step < len(parts)]
    if (request.get("stream_options") or {}).get("include_usage"):
        events.append({**head, "choices": [], "usage": USAGE})
    return [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]


RESPONSE_USAGE = {"input_tokens": 7, "output_tokens": 5, "total_tokens": 12}


def response_object(version: str, status: str = "completed") -> dict:
    """A Responses API reply as vLLM's /v1/responses sends one: a message of one text part."""
    return {"id": "resp_upstream", "object": "response", "created_at": 1700000000, "model": version,
            "status": status, "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": status,
                                          "content": [{"type": "output_text", "text": "ok", "annotations": []}]}],
            "usage": RESPONSE_USAGE, "tools": [], "tool_choice": "auto", "parallel_tool_calls": True}


def response_events(version: str) -> bytes:
    events = [{"type": "response.created", "response": response_object(version, "in_progress")},
              {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0,
               "delta": "ok"},
              {"type": "response.completed", "response": response_object(version)}]
    return b"".join(f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': i})}\n\n".encode()
                    for i, e in enumerate(events))


def handler(version: str) -> type[ScriptedUpstream]:
    class Handler(ScriptedUpstream):

        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
            if self.path == "/v1/responses":  # whatever the input, one short answer (`usage`: RESPONSE_USAGE)
                self.reply(response_events(version) if request.get("stream") else
                           json.dumps(response_object(version)).encode(),
                           "text/event-stream" if request.get("stream") else "application/json")
                return
            if not request.get("stream"):
                self.reply(json.dumps(completion(version, request)).encode())
                return
            self.reply(b"".join(stream_events(version, request)), "text/event-stream")

    Handler.version = version
    return Handler


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), handler(sys.argv[2])).serve_forever()
