"""Calls made with OpenAI's Responses API (`POST /v1/responses`), read as the chat calls they amount to.

The gateway logs a Responses call as it was said (`api: "responses"`, the request body
and the `response` object the client received; tasks/ingest/gateway_records.py), and
ingest judges it with the same failure signals as a chat completion (tasks/ingest/
signals.py) by reading it through `chat_view`:

request
- `instructions` is a first system message; `input` a string is one user message;
- `input` items: messages (role and content; a content's `input_text` / `output_text`
  parts are text parts, `input_image` an image part), `function_call` items an assistant
  turn's tool calls (consecutive ones are one turn's parallel calls), `function_call_output`
  a tool message; `reasoning` items are left out, as chat templates leave out past thoughts;
- `text.format` is the `response_format` (`json_schema` or `json_object`);
- function `tools` and `tool_choice` in chat's nested shape; `max_output_tokens` is
  `max_tokens`;
response
- the `output` items are one choice: `output_text` parts its content, `refusal` parts its
  refusal, `function_call` items its tool calls, `reasoning` items its reasoning;
- finish_reason `length` when the reply was cut at `max_output_tokens`, `tool_calls`
  when it called tools, else `stop`; usage in chat's names.

What cannot be said as chat (an item that refers to one stored elsewhere, a hosted tool
such as web search, a file input) is refused by the gateway before the call is made
(`request_problem`), so every logged call can be judged.
"""
from __future__ import annotations

RESPONSES = "responses"
"""The `api` of a call record made with the Responses API (a record without `api` is a chat completion)."""

_TEXT_PARTS = ("input_text", "output_text", "text")
_SKIPPED_ITEMS = ("reasoning",)
_SAMPLING = ("temperature", "top_p", "seed", "top_k", "min_p", "repetition_penalty")
_PASSED_ON = (*_SAMPLING, "chat_template_kwargs")  # vLLM's: the template's arguments (Qwen3's enable_thinking)


def is_responses_call(call: dict) -> bool:
    return call.get("api") == RESPONSES


def chat_view(call: dict) -> dict:
    """The call as a chat completion call (a chat call as it is)."""
    if not is_responses_call(call):
        return call
    response = call.get("response")
    response = chat_response(response) if isinstance(response, dict) else response
    return {**call, "request": chat_request(call["request"]), "response": response,
            "usage": response.get("usage") if isinstance(response, dict) else None}


def request_problem(body: dict) -> str | None:
    """Why a Responses request cannot be logged as a chat (and so cannot be served here), or None."""
    items = body.get("input")
    if isinstance(items, str) and items:
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        return "`input` must be a non-empty string or a non-empty list of input items"
    if body.get("instructions") is not None and not isinstance(body["instructions"], str):
        return "`instructions` must be a string"
    for index, item in enumerate(items):
        problem = _item_problem(item)
        if problem:
            return f"input[{index}]: {problem}"
    for index, tool in enumerate(body.get("tools") or []):
        if not (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(tool.get("name"), str)):
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            return (f"tools[{index}]: only function tools ({{\"type\": \"function\", \"name\": ...}}) are served "
                    f"here, got {kind!r}; hosted tools run on OpenAI's servers, not on this model's")
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and not (choice.get("type") == "function" and isinstance(choice.get("name"), str)):
        return "`tool_choice` must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}"
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") in ("text", "json_object", "json_schema")):
        return "`text.format` must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or a json_schema format"
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and not isinstance(fmt.get("schema"), dict):
        return "`text.format` of type json_schema needs `schema`: a JSON Schema object"
    return None


def _item_problem(item) -> str | None:
    if not isinstance(item, dict):
        return f"an input item must be an object, got {type(item).__name__}"
    kind = item.get("type", "message")
    if kind == "message":
        if not isinstance(item.get("role"), str):
            return "a message needs a `role`"
        content = item.get("content")
        if isinstance(content, str):
            return None
        if not isinstance(content, list):
            return "a message's `content` must be a string or a list of content parts"
        for part in content:
            part_kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if part_kind in _TEXT_PARTS and isinstance(part.get("text"), str) or part_kind == "refusal":
                continue
            if part_kind == "input_image" and isinstance(part.get("image_url"), str):
                continue
            return (f"content part {part_kind!r} is not served here (text parts and input_image with an "
                    "image_url are; a file_id names a file this gateway cannot read)")
        return None
    if kind == "function_call":
        if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
            return "a function_call item needs `call_id`, `name` and `arguments` (strings)"
        return None
    if kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            return "a function_call_output item needs `call_id`"
        return None
    if kind in _SKIPPED_ITEMS:
        return None
    return (f"input items of type {kind!r} are not served here: send the conversation itself "
            "(messages, function_call and function_call_output items)")


def chat_request(body: dict) -> dict:
    """The chat completion request a Responses request amounts to (module docstring)."""
    messages = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    items = body.get("input")
    for item in [{"role": "user", "content": items}] if isinstance(items, str) else items or []:
        _add_item(messages, item)
    request = {"messages": messages, **{k: body[k] for k in _PASSED_ON if k in body}}
    if body.get("max_output_tokens") is not None:
        request["max_tokens"] = body["max_output_tokens"]
    fmt = body["text"].get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        request["response_format"] = {"type": "json_schema", "json_schema": {
            k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        request["response_format"] = {"type": "json_object"}
    tools = [{"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters", "strict")
                                               if tool.get(k) is not None}}
             for tool in body.get("tools") or [] if isinstance(tool, dict) and tool.get("type") == "function"]
    if tools:
        request["tools"] = tools
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and isinstance(choice.get("name"), str):
        request["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif isinstance(choice, str):
        request["tool_choice"] = choice
    return request


def _add_item(messages: list[dict], item: dict) -> None:
    kind = item.get("type", "message")
    if kind == "message":
        messages.append({"role": item["role"], "content": _chat_content(item.get("content"))})
    elif kind == "function_call":
        call = {"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and (last.get("tool_calls") or not last.get("content")):
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        messages.append({"role": "tool", "tool_call_id": item["call_id"],
                         "content": output if isinstance(output, str) else _chat_content(output)})


def _chat_content(content):
    """A Responses content as chat content: a string stays one; parts become chat parts."""
    if not isinstance(content, list):
        return content
    parts = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if part.get("type") in _TEXT_PARTS:
            parts.append({"type": "text", "text": part.get("text")})
        elif part.get("type") == "refusal":
            parts.append({"type": "text", "text": part.get("refusal")})
        elif part.get("type") == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url")}})
    return parts


def chat_response(response: dict) -> dict:
    """The chat.completion a `response` object amounts to: its output items as one choice."""
    text, refusal, reasoning, tool_calls = [], [], [], []
    for item in response.get("output") or []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and part.get("type") == "output_text":
                    text.append(part.get("text") or "")
                elif isinstance(part, dict) and part.get("type") == "refusal":
                    refusal.append(part.get("refusal") or "")
        elif item.get("type") == "function_call":
            tool_calls.append({"id": item.get("call_id"), "type": "function",
                               "function": {"name": item.get("name"), "arguments": item.get("arguments")}})
        elif item.get("type") == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning += [p.get("text") or "" for p in parts if isinstance(p, dict)]
    message = {"role": "assistant", "content": "".join(text) if text else None}
    if refusal:
        message["refusal"] = "".join(refusal)
    if reasoning:
        message["reasoning"] = "\n".join(reasoning)
    if tool_calls:
        message["tool_calls"] = tool_calls
    incomplete = response.get("incomplete_details") if isinstance(response.get("incomplete_details"), dict) else {}
    finish = {"max_output_tokens": "length", "content_filter": "content_filter"}.get(
        incomplete.get("reason"), "tool_calls" if tool_calls else "stop")
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else None
    return {"id": response.get("id"), "object": "chat.completion", "created": response.get("created_at"),
            "model": response.get("model"), "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": None if usage is None else {
                "prompt_tokens": usage.get("input_tokens"), "completion_tokens": usage.get("output_tokens"),
                "total_tokens": usage.get("total_tokens")}}
