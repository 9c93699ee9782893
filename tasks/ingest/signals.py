"""Failure signals without a person: which gateway calls and feedback are failure logs.

Pure rules over the gateway's records (format: tasks/ingest/gateway_records.py); no I/O.
An answered call (status 200) failed when its reply broke a constraint the API carried:
- `response_format` `json_schema` (or vLLM's `structured_outputs.json`): the reply is not
  JSON, not an object, or violates the schema (the `json_schema` verifier's own check, so
  curation judges the log alike); a reply with no content at all (a reasoning model cut
  at max_tokens while thinking) is a failure too, said as such;
- `response_format` `json_object`: the reply is not a JSON object;
- a tool call: its arguments break its tool's `parameters`, it names no tool of the
  request, or the model wrote it as text the server could not parse
  (tasks/ingest/tool_call_signals.py says which calls are judged, and against what).
Negative feedback with a usable correction is a failure too; the correction is its
reference, and the reply it is about is the choice the feedback names (choice 0 unless
it names another).

Each failure is an ordinary failure log (docs/architecture.md, "failure-log format"), so
the normal ingest validates and dedups it. The constraint the API carried outside the
messages is written into the prompt as a system line: rollouts sample from the messages
alone, without constrained decoding, and a prompt that does not say "JSON matching this
schema" asks for something other than what the reference checks.

Not here: whether a reply is right beyond its format (only a person's correction says
that), and calls that were not answered.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Collection
from datetime import datetime

from tasks.ingest.gateway_records import CORRECTION_KINDS, correction_problem, is_negative
from tasks.ingest.json_replies import OBJECT_SCHEMA, json_text, object_problem, short, usable_schema
from tasks.ingest.responses_api import chat_view
from tasks.ingest.tool_call_signals import TOOL_LINE, tool_failures, written_call

JSON_LINE = "Reply with only a JSON object that matches this JSON Schema: {schema}"
REASONING_FIELDS = ("reasoning", "reasoning_content")
"""Where a reasoning parser puts the model's thoughts: vLLM's name since 0.10, and the
older one (DeepSeek's API, vLLM before)."""


def call_failures(call: dict) -> list[dict]:
    """The failure logs of one call record: each choice's reply against the response
    format, then each of its tool calls against its tool.

    A request with `n` > 1 got several samples of one prompt; each is judged, since a
    prompt the model answers well only some of the time is the failure RL learns most from.
    """
    if call.get("status") != 200:
        return []
    return [failure for index, (message, finish) in enumerate(reply_choices(call))
            for failure in _choice_failures(call, message, finish, "" if index == 0 else f"choice{index}:")]


def _choice_failures(call: dict, message: dict, finish_reason, id_prefix: str) -> list[dict]:
    request, failures = call["request"], []
    schema = response_schema(request)
    text = text_of(message.get("content"))
    # A reply that only calls tools has not answered yet: the format binds the answer. A
    # call the model wrote as text, which the server could not parse, is no answer either.
    written = written_call(request, text)
    answered = (bool(text) or not message.get("tool_calls")) and written is None
    if schema is not None and answered:
        problem = object_problem(text, schema) if text.strip() else no_answer(message, finish_reason)
        if problem:
            failures.append(_failure_log(
                call, f"{id_prefix}json", kind="json", domain="json", detail=problem, reference={"schema": schema},
                messages=prompt_messages(request, JSON_LINE.format(schema=json_text(schema))),
                response=reply_text(message)))
    for tool in tool_failures(request, message, text, written):
        failures.append(_failure_log(
            call, id_prefix + tool.id_suffix, kind="tool_call", domain="json", detail=tool.detail,
            reference={"schema": tool.schema},
            messages=prompt_messages(request, TOOL_LINE.format(name=tool.tool, schema=json_text(tool.schema))),
            response=tool.response))
    return failures


def feedback_failure(feedback: dict, call: dict, domains: Collection[str]) -> dict | None:
    """The failure log of a negative feedback with a usable correction, or None.

    `domains`: the known domains (the domain map); a correction's `domain` wins when it
    is one of them.
    """
    if not is_trainable(feedback) or call.get("status") != 200:
        return None
    correction, request = feedback["correction"], call["request"]
    kind = next(k for k in CORRECTION_KINDS if k in correction)
    domain, reference = CORRECTION_REFERENCES[kind](correction, request)
    if correction.get("domain") in domains:
        domain = correction["domain"]
    schema = response_schema(request)
    constraint = None if schema is None else JSON_LINE.format(schema=json_text(schema))
    # A person's correction may rest on an image the request carried: the log keeps it, so
    # ingest quarantines it with why, rather than training the answer on the words alone.
    return _failure_log(call, "feedback", kind="feedback", domain=domain, detail=_feedback_detail(feedback),
                        reference=reference, messages=prompt_messages(request, constraint, keep_non_text=True),
                        response=reply_text(reply_message(call, feedback.get("choice") or 0)))


def is_trainable(feedback: dict) -> bool:
    """Negative with a usable correction: it becomes a failure log once its call is known."""
    correction = feedback.get("correction")
    return is_negative(feedback) and correction is not None and correction_problem(correction) is None


def interaction_row(call: dict, failure_kinds: list[str]) -> dict:
    """An `interactions` row (without `batch_id` and `cycle_id`, which the batch adds): the
    request and response as they were said, whichever API said them; usage in chat's names."""
    usage = chat_view(call).get("usage")
    usage = usage if isinstance(usage, dict) else {}
    return {"completion_id": call["id"], "gateway": call.get("gateway"), "seq": call.get("seq"),
            "ts": parse_ts(call["ts"]), "model_version": call.get("model_version"), "status": call.get("status"),
            "stream": call.get("stream"), "latency_ms": call.get("latency_ms"),
            "prompt_tokens": _count(usage.get("prompt_tokens")),
            "completion_tokens": _count(usage.get("completion_tokens")),
            "failure_kinds": list(failure_kinds), "request": json_text(call["request"]),
            "response": None if call.get("response") is None else json_text(call["response"]),
            "api": call.get("api") or "chat"}


def feedback_row(feedback: dict, became_failure: bool) -> dict:
    """A `feedback` row (without `batch_id` and `cycle_id`)."""
    score = feedback.get("score")
    correction = feedback.get("correction")
    return {"completion_id": feedback["id"], "ts": parse_ts(feedback["ts"]), "label": feedback.get("label"),
            "score": None if score is None else float(score), "negative": is_negative(feedback),
            "correction": None if correction is None else json_text(correction),
            "comment": feedback.get("comment"), "trainable": became_failure, "choice": feedback.get("choice") or 0}


def response_schema(request: dict) -> dict | None:
    """The JSON Schema a request's `response_format` holds the reply to, or None."""
    declared = declared_schema(request)
    if declared is not None:
        return declared
    fmt = request.get("response_format")
    wants_object = isinstance(fmt, dict) and fmt.get("type") == "json_object"
    return OBJECT_SCHEMA if wants_object or _vllm_outputs(request).get("json_object") is True else None


def declared_schema(request: dict) -> dict | None:
    """The schema of a `json_schema` response format, or else of vLLM's own parameters
    for it (`structured_outputs.json`, before 0.11 `guided_json`: a schema or its JSON
    text), which apps written for vLLM send instead; one the validator cannot use judges
    nothing (the request was malformed, not the reply)."""
    fmt = request.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("json_schema"), dict):
        schema = fmt["json_schema"].get("schema")
    else:
        schema = _vllm_outputs(request).get("json")
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except (ValueError, RecursionError):
                return None
    return schema if usable_schema(schema) else None


def _vllm_outputs(request: dict) -> dict:
    outputs = request.get("structured_outputs")
    if isinstance(outputs, dict):
        return outputs
    return {"json": request["guided_json"]} if request.get("guided_json") is not None else {}


def prompt_messages(request: dict, constraint: str | None, *, keep_non_text: bool = False) -> list[dict]:
    """The request's messages as plain {role, content} pairs, with `constraint` (a system
    line) prepended to the first system message, or as a new first one.

    keep_non_text: a content with a part that is no text (an image) stays its list of
    parts; otherwise only its text parts are kept, which suffices for a failure of format.
    """
    messages = [_plain_message(m, keep_non_text) for m in request.get("messages") or []]
    if constraint:
        if messages and isinstance(messages[0], dict) and messages[0].get("role") == "system" \
                and isinstance(messages[0]["content"], str):
            messages[0] = {"role": "system", "content": f"{constraint}\n\n{messages[0]['content']}"}
        else:
            messages.insert(0, {"role": "system", "content": constraint})
    return messages


def reply_message(call: dict, choice: int = 0) -> dict:
    """`choices[choice].message` of the call's response ({} when it has no such choice):
    what a person's feedback on the call is about (the gateway refuses a feedback naming a
    choice its call lacks, unless its spool logged the call before it counted choices)."""
    choices = reply_choices(call)
    return choices[choice][0] if 0 <= choice < len(choices) else {}


def reply_choices(call: dict) -> list[tuple[dict, object]]:
    """(message, finish_reason) of every choice of the call's response, in choice order
    ({} for a choice without a message)."""
    response = call.get("response")
    choices = response.get("choices") if isinstance(response, dict) else None
    if not isinstance(choices, list):
        return []
    choices = [c if isinstance(c, dict) else {} for c in choices]
    return [(c["message"] if isinstance(c.get("message"), dict) else {}, c.get("finish_reason")) for c in choices]


def no_answer(message: dict, finish_reason) -> str:
    """Why a reply with no text broke its format: a reasoning model cut at max_tokens
    while still thinking (content null, its thoughts in `reasoning`) is the common case,
    and "not JSON: Expecting value" would send a reader looking for garbage."""
    thinking = any(isinstance(message.get(name), str) and message[name].strip() for name in REASONING_FIELDS)
    if finish_reason == "length":
        return ("no answer: cut at the token limit (finish_reason length) "
                + ("while still reasoning" if thinking else "before any content"))
    said = [f"finish_reason {finish_reason}"] if finish_reason else []
    said += ["only reasoning"] if thinking else []
    return "no answer: empty content" + (f" ({', '.join(said)})" if said else "")


def reply_text(message: dict) -> str:
    """What the model wrote: the text, or its tool calls when it wrote none."""
    return text_of(message.get("content")) or tool_calls_text(message.get("tool_calls"))


def text_of(content) -> str:
    """A message content as text: a string, or the text parts of a list of content parts
    joined by newlines (images and other parts are not text a rollout can sample)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content
                         if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str))
    return ""


def parse_ts(ts: str) -> datetime:
    return datetime.fromisoformat(ts)


def _failure_log(call: dict, id_suffix: str, *, kind: str, domain: str, detail: str, reference: dict,
                 messages: list[dict], response: str) -> dict:
    log = {"id": f"{call['id']}:{id_suffix}", "ts": call["ts"], "model": call.get("model_version"),
           "domain": domain, "messages": messages, "response": response,
           "failure": {"kind": kind, "detail": detail}, "reference": reference,
           "meta": {"source": "gateway", "gateway": call.get("gateway"), "completion_id": call["id"]}}
    # The template's arguments (Qwen3's enable_thinking) are part of the prompt production
    # rendered: without them rollouts would sample a mode production never used. Passed on
    # as sent: ingest refuses, with its reason, arguments that would change more than the text.
    template_args = call["request"].get("chat_template_kwargs")
    if isinstance(template_args, dict) and template_args:
        log["chat_template_kwargs"] = template_args
    return log


def _answer_reference(correction: dict, request: dict) -> tuple[str, dict]:
    return "math", {"answer": correction["answer"]}


def _tests_reference(correction: dict, request: dict) -> tuple[str, dict]:
    reference = {"tests": correction["tests"], "entry_point": correction["entry_point"]}
    if correction.get("solution"):
        reference["solution"] = correction["solution"]
    return "code", reference


def _object_reference(correction: dict, request: dict) -> tuple[str, dict]:
    # The call's own schema when it declared one: the corrected object must match it, and
    # any other object matching it is as right. Without one, only that object is.
    schema = declared_schema(request)
    return "json", {"schema": {"const": correction["object"]} if schema is None else schema,
                    "answer": correction["object"]}


# correction kind -> (its default domain, the failure log's reference)
CORRECTION_REFERENCES: dict[str, Callable[[dict, dict], tuple[str, dict]]] = {
    "answer": _answer_reference, "tests": _tests_reference, "object": _object_reference,
}


def _feedback_detail(feedback: dict) -> str:
    if feedback.get("comment"):
        return short(f"user feedback: {feedback['comment']}")
    said = [f"label {feedback['label']}"] if feedback.get("label") else []
    said += [f"score {feedback['score']}"] if feedback.get("score") is not None else []
    return f"user feedback: {', '.join(said)}"


def _plain_message(message, keep_non_text: bool):
    if not isinstance(message, dict):
        return message  # ingest quarantines the log and says why
    role, content = message.get("role"), message.get("content")
    if not (keep_non_text and _has_non_text_part(content)):
        content = text_of(content) or tool_calls_text(message.get("tool_calls"))
    # `developer` is OpenAI's newer name for the system role.
    return {"role": "system" if role == "developer" else role, "content": content}


def _has_non_text_part(content) -> bool:
    return isinstance(content, list) and any(
        not (isinstance(part, dict) and part.get("type") == "text") for part in content)


def tool_calls_text(tool_calls) -> str:
    """An assistant turn that only called tools, as text: the calls in compact JSON."""
    if not isinstance(tool_calls, list) or not tool_calls:
        return ""
    calls = [c.get("function") for c in tool_calls if isinstance(c, dict)]
    return json_text([{"name": f.get("name"), "arguments": f.get("arguments")} for f in calls if isinstance(f, dict)])


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
