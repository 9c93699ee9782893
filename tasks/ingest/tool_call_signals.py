"""Tool-call signals: which of a reply's tool calls failed, judged against the request's tools.

A tool call fails in one of two ways:
- the server returned it (`tool_calls`) and its arguments are not a JSON object matching
  its tool's `parameters`, or it names no tool of the request. Empty arguments (`""` or
  none, which some servers send for a function without parameters where OpenAI sends
  `"{}"`) are the call without arguments: a failure only when `parameters` rejects `{}`.
- the model wrote it as text that the server's tool parser could not read, so the reply
  has no `tool_calls` and its `content` holds the markup: vLLM's parsers
  (`--tool-call-parser`) hand the raw output back when its JSON is broken. Only markup no
  answer writes counts: a line opening with `<tool_call>` (hermes: Qwen, Hermes),
  `[TOOL_CALLS]` (mistral) or `<|python_tag|>` (Llama 3), outside code fences; or a
  content that is itself a call to one of the request's tools, as what vLLM's llama3_json
  and mistral parsers return on failure (`{"name": "<tool>", "parameters": ...`,
  `[{"name": "<tool>", "arguments": ...`, `<tool>{...`). Prose that mentions a tool is an
  answer, and is judged as one.

Which schema judges a call: its tool's, when it names one of the request's tools; else
the one tool `tool_choice` names, or the request's only tool. With several tools and no
name to go by, which schema the model meant is a guess, and a task built on a guess
teaches the wrong thing: no failure. Nor is a written call judged when `tool_choice` is
"none": the model was not to call, and the server did not parse.

Not here: building the failure logs (tasks/ingest/signals.py does, from each
`ToolFailure`), or whether the right tool was called with the right values.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from tasks.ingest.json_replies import OBJECT_SCHEMA, json_text, object_problem, short, usable_schema

TOOL_LINE = ("Call the tool `{name}`: reply with only its arguments, a JSON object that matches "
             "this JSON Schema: {schema}")
_MARKER = re.compile(r"^[ \t]*(<tool_call>|\[TOOL_CALLS\]|<\|python_tag\|>)", re.MULTILINE)
_FENCED = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_NAME = re.compile(r'"name"\s*:\s*"([^"\\]+)"')
_ARGUMENTS_KEY = re.compile(r'"(?:arguments|parameters)"\s*:')
_GLUED = re.compile(r"([A-Za-z0-9_-]+)\{")
"""A name glued to its arguments: mistral's format from its v11 tokenizer."""


@dataclass(frozen=True)
class ToolFailure:
    """One failed tool call of a reply."""

    id_suffix: str
    """`tool_call`, `tool_call:1`, ...: which call of the reply."""
    tool: str
    """The tool whose `parameters` judged it (and the prompt asks for)."""
    schema: dict
    detail: str
    response: str
    """What the model wrote: the call's arguments, or the whole text of a written call."""


@dataclass(frozen=True)
class WrittenCall:
    """A tool call the model wrote as text: how it was told, the tool it names, its body."""

    marker: str
    name: str | None
    payload: str


def tool_failures(request: dict, message: dict, text: str, written: WrittenCall | None) -> list[ToolFailure]:
    """The failures of one reply's tool calls: each call the server returned, or else the
    call the model wrote as text (`text`: the reply's content as text; `written`: what
    `written_call` found in it, which the caller also needs)."""
    tools = request_tools(request)
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        failures = (_returned_failure(tools, tool_call, index) for index, tool_call in enumerate(calls))
        return [failure for failure in failures if failure]
    failure = _written_failure(request, tools, written, text) if written else None
    return [failure] if failure else []


def written_call(request: dict, text: str) -> WrittenCall | None:
    """The tool call `text` writes out in markup no answer writes (the module docstring
    says which), when the request offered tools it was allowed to call; else None."""
    tools = request_tools(request)
    if not tools or request.get("tool_choice") == "none" or not text:
        return None
    marked = _MARKER.search(_FENCED.sub("", text))
    if marked:
        payload = marked.string[marked.end():]
        if marked.group(1) == "<tool_call>":
            payload = payload.split("</tool_call>", 1)[0]
        return WrittenCall(marked.group(1), _named(payload), payload.strip())
    stripped = text.strip()
    named = _NAME.search(stripped)
    if stripped.startswith(("{", "[")) and named and named.group(1) in tools and _ARGUMENTS_KEY.search(stripped):
        return WrittenCall("bare JSON", named.group(1), stripped)
    glued = _GLUED.match(stripped)
    if glued and glued.group(1) in tools:
        return WrittenCall(f"{glued.group(1)}{{...}}", glued.group(1), stripped[len(glued.group(1)):])
    return None


def request_tools(request: dict) -> dict[str, dict]:
    """Tool name -> its parameters' schema (a tool without parameters takes an object)."""
    tools = {}
    for tool in request.get("tools") or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            tools[function["name"]] = parameters if isinstance(parameters, dict) else OBJECT_SCHEMA
    return tools


def _returned_failure(tools: dict[str, dict], tool_call, index: int) -> ToolFailure | None:
    function = tool_call.get("function") if isinstance(tool_call, dict) else None
    function = function if isinstance(function, dict) else {}
    name, arguments = function.get("name"), function.get("arguments")
    if name in tools:
        target, problem = name, None
    elif len(tools) == 1:
        # With one tool, the model can only have meant that one: the call is judged against
        # it. With several, which tool (so which schema) it meant is a guess: no failure.
        (target,) = tools
        problem = f"called unknown tool `{name}`; the request's only tool is `{target}`"
    else:
        return None
    schema = tools[target]
    if not usable_schema(schema):
        return None
    if arguments is None or arguments == "":
        text = ""
        problem = problem or _no_arguments_problem(schema)
    else:
        text = arguments if isinstance(arguments, str) else json_text(arguments)
        problem = problem or object_problem(text, schema)
    if problem is None:
        return None
    return ToolFailure("tool_call" if index == 0 else f"tool_call:{index}", target, schema,
                       short(f"tool call {index} ({name}): {problem}"), text)


def _no_arguments_problem(schema: dict) -> str | None:
    """Why a call without arguments is no call of a tool with `schema`, or None: it is the
    call with `{}`, so fine exactly when `{}` is."""
    problem = object_problem("{}", schema)
    return problem and f"empty arguments, which as {{}} {problem}"


def _written_failure(request: dict, tools: dict[str, dict], written: WrittenCall, text: str) -> ToolFailure | None:
    target = _written_target(request, tools, written.name)
    if target is None or not usable_schema(tools[target]):
        return None
    said = f"tool call written as text ({written.marker}) that the server did not parse into tool_calls"
    problem = _payload_problem(written.payload)
    return ToolFailure("tool_call", target, tools[target], short(f"{said}: {problem}" if problem else said), text)


def _written_target(request: dict, tools: dict[str, dict], name: str | None) -> str | None:
    if name in tools:
        return name
    choice = request.get("tool_choice")
    function = choice.get("function") if isinstance(choice, dict) else None
    chosen = function.get("name") if isinstance(function, dict) else None
    if chosen in tools:
        return chosen
    return next(iter(tools)) if len(tools) == 1 else None


def _named(payload: str) -> str | None:
    named = _NAME.search(payload) or _GLUED.match(payload.lstrip())
    return named.group(1) if named else None


def _payload_problem(payload: str) -> str | None:
    """Why the written call's JSON did not parse, which is usually why the server gave up;
    None when it is JSON (the server then wanted another shape: no `name`, say)."""
    glued = _GLUED.match(payload)
    try:
        json.loads(payload[len(glued.group(1)):] if glued else payload)
    except ValueError as exc:
        return f"not JSON: {exc}"
    return None
