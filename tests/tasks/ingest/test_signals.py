"""Failure signals: which gateway calls and feedback become failure logs, and what those logs hold."""
from __future__ import annotations

import json

import pytest

from tasks.ingest.gateway_records import feedback_problem
from tasks.ingest.signals import call_failures, feedback_failure, feedback_row, interaction_row, is_trainable
from verifiers.registry import DEFAULT_DOMAIN_MAP, VERIFIERS, self_test, verify

PERSON = {"type": "object", "required": ["name", "age"], "additionalProperties": False,
          "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}}}
WEATHER = {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}
TIME = {"type": "object", "properties": {"zone": {"type": "string"}}}
DOMAINS = dict(DEFAULT_DOMAIN_MAP, trivia="exact")


def tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"the {name} tool", "parameters": parameters}}


def called(name: str, arguments: str) -> dict:
    return {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": arguments}}


def call(content: str | None = "fine", *, status: int = 200, tool_calls: list | None = None,
         messages: list | None = None, **request) -> dict:
    message = {"role": "assistant", "content": content, **({"tool_calls": tool_calls} if tool_calls else {})}
    return {"type": "call", "id": "chatcmpl-1", "seq": 7, "gateway": "gw-a", "ts": "2026-12-01T10:00:00.250Z",
            "model_version": "policy-v4", "status": status, "stream": False, "latency_ms": 812.5,
            "usage": {"prompt_tokens": 31, "completion_tokens": 9},
            "request": {"model": "flywheel", "messages": messages or [{"role": "user", "content": "Who is Ada?"}],
                        **request},
            "response": {"id": "chatcmpl-1", "object": "chat.completion",
                         "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}}


def json_schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}


def feedback(correction: dict | None = None, *, label: str | None = "bad", score: float | None = None,
             comment: str | None = None) -> dict:
    return {"type": "feedback", "id": "chatcmpl-1", "seq": 9, "gateway": "gw-a", "ts": "2026-12-01T10:05:00Z",
            "label": label, "score": score, "correction": correction, "comment": comment}


def _json_line(schema: dict) -> str:
    return "Reply with only a JSON object that matches this JSON Schema: " + json.dumps(schema, separators=(",", ":"))


# -- response_format -------------------------------------------------------------------

def test_a_reply_matching_its_schema_is_no_failure():
    assert call_failures(call('{"name": "Ada", "age": 36}', response_format=json_schema_format(PERSON))) == []


def test_a_reply_that_is_not_json_is_a_json_failure_with_the_schema_in_the_prompt():
    (log,) = call_failures(call("Ada Lovelace, 36", response_format=json_schema_format(PERSON)))
    assert log["id"] == "chatcmpl-1:json" and log["failure"]["kind"] == "json" and log["domain"] == "json"
    assert log["failure"]["detail"].startswith("not JSON: Expecting value")
    assert log["reference"] == {"schema": PERSON}
    assert log["messages"] == [{"role": "system", "content": _json_line(PERSON)},
                               {"role": "user", "content": "Who is Ada?"}]
    assert log["response"] == "Ada Lovelace, 36"
    assert (log["ts"], log["model"]) == ("2026-12-01T10:00:00.250Z", "policy-v4")
    assert log["meta"] == {"source": "gateway", "gateway": "gw-a", "completion_id": "chatcmpl-1"}


def test_a_schema_violation_names_the_first_violation_and_its_verifier_fails_it_too():
    (log,) = call_failures(call('{"name": "Ada", "age": -3}', response_format=json_schema_format(PERSON)))
    assert log["failure"]["detail"].startswith("violates the schema:") and "age" in log["failure"]["detail"]
    # curation's verifier agrees the logged reply is a failure
    assert not verify(DEFAULT_DOMAIN_MAP[log["domain"]], log["reference"], log["response"]).passed


def test_the_constraint_is_prepended_to_an_existing_system_message():
    messages = [{"role": "system", "content": "You extract people."}, {"role": "user", "content": "Ada, 36"}]
    (log,) = call_failures(call("[]", messages=messages, response_format=json_schema_format(PERSON)))
    assert log["failure"]["detail"] == "not a JSON object: a JSON array"
    assert log["messages"] == [{"role": "system", "content": _json_line(PERSON) + "\n\nYou extract people."},
                               {"role": "user", "content": "Ada, 36"}]


def test_json_object_format_wants_any_object():
    fmt = {"type": "json_object"}
    assert call_failures(call('{"anything": [1, 2]}', response_format=fmt)) == []
    (log,) = call_failures(call('"just a string"', response_format=fmt))
    assert log["reference"] == {"schema": {"type": "object"}}
    assert log["failure"]["detail"] == "not a JSON object: a JSON string"


def test_unconstrained_unanswered_or_unjudgeable_calls_are_no_failures():
    assert call_failures(call("plain prose")) == []
    assert call_failures(call("not json", status=502, response_format=json_schema_format(PERSON))) == []
    broken_schema = {"type": "object", "properties": {"age": {"type": "integer", "minimum": "zero"}}}
    assert call_failures(call("not json", response_format=json_schema_format(broken_schema))) == []
    # a reply that only calls a tool has not answered yet: the format binds the answer
    tools = [tool("weather", WEATHER)]
    assert call_failures(call(None, tools=tools, tool_calls=[called("weather", '{"city": "Oslo"}')],
                              response_format=json_schema_format(PERSON))) == []


def test_a_reasoning_model_cut_while_thinking_failed_its_format_and_the_detail_says_so():
    # vLLM with a reasoning parser: the thoughts in `reasoning`, no content, cut at max_tokens
    cut = call(None, response_format=json_schema_format(PERSON))
    cut["response"]["choices"][0] = {"index": 0, "finish_reason": "length", "message": {
        "role": "assistant", "content": None, "reasoning": "Ada Lovelace was born in 1815, so..."}}
    (log,) = call_failures(cut)
    assert log["failure"]["detail"] == "no answer: cut at the token limit (finish_reason length) while still reasoning"
    assert log["response"] == "" and log["reference"] == {"schema": PERSON}
    empty = call("", response_format={"type": "json_object"})
    empty["response"]["choices"][0]["message"]["reasoning_content"] = "Nothing to say."
    (log,) = call_failures(empty)
    assert log["failure"]["detail"] == "no answer: empty content (finish_reason stop, only reasoning)"
    answered = call('{"name": "Ada", "age": 36}', response_format=json_schema_format(PERSON))
    answered["response"]["choices"][0]["message"]["reasoning"] = "Born 1815, died at 36."
    assert call_failures(answered) == []


def test_vllms_own_structured_output_parameters_are_judged_like_response_format():
    # apps written for vLLM send the schema in extra_body: `structured_outputs` (or, before
    # vLLM 0.11, `guided_json`, also as JSON text)
    for request in ({"structured_outputs": {"json": PERSON}}, {"structured_outputs": {"json": json.dumps(PERSON)}},
                    {"guided_json": PERSON}):
        assert call_failures(call('{"name": "Ada", "age": 36}', **request)) == []
        (log,) = call_failures(call("Ada, 36", **request))
        assert log["reference"] == {"schema": PERSON} and log["messages"][0]["content"] == _json_line(PERSON)
    (log,) = call_failures(call("[1]", structured_outputs={"json_object": True}))
    assert log["failure"]["detail"] == "not a JSON object: a JSON array"
    assert call_failures(call("Ada", structured_outputs={"regex": "[A-Z][a-z]+"})) == []
    assert call_failures(call("Ada", structured_outputs={"json": "{not a schema"})) == []


def test_content_parts_are_joined_and_developer_is_system():
    messages = [{"role": "developer", "content": [{"type": "text", "text": "Be terse."}]},
                {"role": "user", "content": [{"type": "text", "text": "Who is Ada?"},
                                             {"type": "image_url", "image_url": {"url": "data:..."}},
                                             {"type": "text", "text": "Answer in JSON."}]}]
    (log,) = call_failures(call("no", messages=messages, response_format={"type": "json_object"}))
    assert log["messages"] == [
        {"role": "system", "content": _json_line({"type": "object"}) + "\n\nBe terse."},
        {"role": "user", "content": "Who is Ada?\nAnswer in JSON."}]


# -- tool calls ------------------------------------------------------------------------

def test_good_tool_calls_are_no_failures():
    tools = [tool("weather", WEATHER), tool("time", TIME)]
    assert call_failures(call(None, tools=tools, tool_calls=[called("weather", '{"city": "Oslo"}'),
                                                            called("time", "{}")])) == []


def test_bad_arguments_are_tool_call_failures_with_the_tool_in_the_prompt():
    tools = [tool("weather", WEATHER), tool("time", TIME)]
    failures = call_failures(call(None, tools=tools, tool_calls=[
        called("weather", '{"town": "Oslo"}'), called("time", '{"zone": 1}'), called("weather", "Oslo")]))
    assert [f["id"] for f in failures] == ["chatcmpl-1:tool_call", "chatcmpl-1:tool_call:1", "chatcmpl-1:tool_call:2"]
    first = failures[0]
    assert (first["failure"]["kind"], first["domain"]) == ("tool_call", "json")
    assert "'city' is a required property" in first["failure"]["detail"]
    assert first["reference"] == {"schema": WEATHER} and first["response"] == '{"town": "Oslo"}'
    assert first["messages"][0] == {"role": "system", "content": (
        "Call the tool `weather`: reply with only its arguments, a JSON object that matches this JSON Schema: "
        + json.dumps(WEATHER, separators=(",", ":")))}
    assert failures[1]["reference"] == {"schema": TIME}
    assert "not JSON" in failures[2]["failure"]["detail"] and failures[2]["response"] == "Oslo"
    assert all(not verify("json_schema", f["reference"], f["response"]).passed for f in failures)


def test_an_unknown_tool_is_a_failure_only_when_the_request_had_one_tool():
    (log,) = call_failures(call(None, tools=[tool("weather", WEATHER)],
                                tool_calls=[called("forecast", '{"city": "Oslo"}')]))
    assert "unknown tool `forecast`" in log["failure"]["detail"] and log["reference"] == {"schema": WEATHER}
    assert log["messages"][0]["content"].startswith("Call the tool `weather`:")
    two = [tool("weather", WEATHER), tool("time", TIME)]
    assert call_failures(call(None, tools=two, tool_calls=[called("forecast", '{"city": "Oslo"}')])) == []


def test_every_choice_of_an_n_sample_call_is_judged():
    """n=3: the first sample kept the format, the second did not: a prompt the model
    answers right only some of the time is still a failure, with that sample's reply."""
    many = call('{"name": "Ada", "age": 36}', response_format=json_schema_format(PERSON), n=3)
    many["response"]["choices"] += [
        {"index": 1, "message": {"role": "assistant", "content": "Ada, 36"}, "finish_reason": "stop"},
        {"index": 2, "message": {"role": "assistant", "content": None,
                                 "tool_calls": [called("weather", "Oslo")]}, "finish_reason": "tool_calls"}]
    many["request"]["tools"] = [tool("weather", WEATHER)]
    failures = call_failures(many)
    assert [f["id"] for f in failures] == ["chatcmpl-1:choice1:json", "chatcmpl-1:choice2:tool_call"]
    assert failures[0]["response"] == "Ada, 36" and "not JSON" in failures[0]["failure"]["detail"]
    assert failures[1]["response"] == "Oslo" and failures[1]["reference"] == {"schema": WEATHER}


def test_every_failure_log_of_a_call_keeps_its_chat_template_arguments():
    """A Qwen3 app that turns thinking off sends `chat_template_kwargs`: the prompt it
    rendered is part of the failure, so each log of the call carries them (a call without
    them, or with an empty object, gives logs without)."""
    no_thinking = {"enable_thinking": False}
    failures = call_failures(call("Ada, 36", response_format=json_schema_format(PERSON),
                                  tools=[tool("weather", WEATHER)], tool_calls=[called("weather", "Oslo")],
                                  chat_template_kwargs=no_thinking))
    corrected = feedback_failure(feedback({"answer": "72"}), call("71", chat_template_kwargs=no_thinking), DOMAINS)
    assert [f["failure"]["kind"] for f in [*failures, corrected]] == ["json", "tool_call", "feedback"]
    assert all(f["chat_template_kwargs"] == no_thinking for f in [*failures, corrected])
    for request in ({}, {"chat_template_kwargs": {}}):
        (plain,) = call_failures(call("Ada, 36", response_format=json_schema_format(PERSON), **request))
        assert "chat_template_kwargs" not in plain


# -- feedback --------------------------------------------------------------------------

def test_an_answer_correction_is_a_math_failure_whose_gold_passes():
    log = feedback_failure(feedback({"answer": "72"}, comment="it is 72"), call("71"), DOMAINS)
    assert (log["id"], log["domain"], log["failure"]["kind"]) == ("chatcmpl-1:feedback", "math", "feedback")
    assert log["reference"] == {"answer": "72"} and log["response"] == "71"
    assert log["failure"]["detail"] == "user feedback: it is 72"
    assert log["messages"] == [{"role": "user", "content": "Who is Ada?"}]
    assert self_test("math", log["reference"]).passed


def test_a_correction_of_an_image_question_keeps_the_image_for_ingest_to_refuse():
    # the answer may rest on the image: trained on the words alone it would teach a guess
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    asked = [{"role": "system", "content": "Be terse."},
             {"role": "user", "content": [{"type": "text", "text": "How many cats?"}, image]}]
    log = feedback_failure(feedback({"answer": "3"}), call("2", messages=asked), DOMAINS)
    assert log["messages"] == asked
    texts = [{"role": "user", "content": [{"type": "text", "text": "How many"}, {"type": "text", "text": "cats?"}]}]
    log = feedback_failure(feedback({"answer": "3"}), call("2", messages=texts), DOMAINS)
    assert log["messages"] == [{"role": "user", "content": "How many\ncats?"}]


def test_a_tests_correction_is_a_code_failure():
    tests = "def check(candidate):\n    assert candidate(2) == 4\n"
    log = feedback_failure(feedback({"tests": tests, "entry_point": "double"}), call("def double(x): return x"),
                           DOMAINS)
    assert log["domain"] == "code" and log["reference"] == {"tests": tests, "entry_point": "double"}
    solved = feedback({"tests": tests, "entry_point": "double", "solution": "def double(x):\n    return 2 * x\n"})
    assert feedback_failure(solved, call("x"), DOMAINS)["reference"]["solution"].startswith("def double")
    assert VERIFIERS["code"].reference_problem(log["reference"]) is None


def test_an_object_correction_uses_the_calls_schema_or_else_the_object_itself():
    fixed = {"name": "Ada", "age": 36}
    log = feedback_failure(feedback({"object": fixed}), call('{"name": "Ada", "age": 63}',
                                                            response_format=json_schema_format(PERSON)), DOMAINS)
    assert log["domain"] == "json" and log["reference"] == {"schema": PERSON, "answer": fixed}
    assert log["messages"][0] == {"role": "system", "content": _json_line(PERSON)}
    plain = feedback_failure(feedback({"object": fixed}), call("Ada is 63"), DOMAINS)
    assert plain["reference"] == {"schema": {"const": fixed}, "answer": fixed}
    assert plain["messages"] == [{"role": "user", "content": "Who is Ada?"}]
    assert self_test("json_schema", log["reference"]).passed and self_test("json_schema", plain["reference"]).passed


def test_a_corrections_domain_wins_only_when_known():
    def domain(said: str) -> str:
        return feedback_failure(feedback({"answer": "Paris", "domain": said}), call("Rome"), DOMAINS)["domain"]

    assert (domain("trivia"), domain("geo")) == ("trivia", "math")


@pytest.mark.parametrize("said", [
    {"label": "bad", "correction": None},                       # negative, nothing to train on
    {"label": "good", "correction": {"answer": "72"}},          # positive
    {"label": None, "score": 0.9, "correction": {"answer": "72"}},
    {"label": "bad", "correction": {"answer": "72", "object": {}}},  # not a usable correction
])
def test_feedback_without_a_usable_negative_correction_is_no_failure(said):
    fb = {**feedback(), **said}
    assert feedback_failure(fb, call("71"), DOMAINS) is None and not is_trainable(fb)


def test_feedback_on_an_n_sample_call_is_about_the_choice_it_names_else_the_first():
    many = call("71", n=3)
    many["response"]["choices"] += [{"index": i, "message": {"role": "assistant", "content": text},
                                     "finish_reason": "stop"} for i, text in ((1, "70"), (2, "73"))]
    said = feedback({"answer": "72"})
    assert feedback_failure(said, many, DOMAINS)["response"] == "71"
    assert feedback_failure({**said, "choice": 2}, many, DOMAINS)["response"] == "73"
    # a record the gateway did not write may name a choice the call lacks: the correction stands
    assert feedback_failure({**said, "choice": 5}, many, DOMAINS)["response"] == ""


@pytest.mark.parametrize("choice, problem", [
    (None, None), (0, None), (2, None), (-1, "`choice` must be the index"), (True, "`choice` must be the index"),
    ("1", "`choice` must be the index"), (1.0, "`choice` must be the index")])
def test_feedback_may_name_its_choice_by_index(choice, problem):
    said = feedback_problem({"id": "chatcmpl-1", "label": "bad", "choice": choice})
    assert said == problem if problem is None else said.startswith(problem)


def test_a_low_score_with_a_correction_is_negative():
    fb = feedback({"answer": "72"}, label=None, score=0.2)
    assert feedback_failure(fb, call("71"), DOMAINS)["failure"]["detail"] == "user feedback: score 0.2"


# -- rows ------------------------------------------------------------------------------

def test_rows_hold_the_record():
    row = interaction_row(call("71"), ["json"])
    assert row["completion_id"] == "chatcmpl-1" and row["seq"] == 7 and row["status"] == 200
    assert (row["prompt_tokens"], row["completion_tokens"], row["failure_kinds"]) == (31, 9, ["json"])
    assert row["ts"].isoformat() == "2026-12-01T10:00:00.250000+00:00"
    assert json.loads(row["request"])["messages"][0]["content"] == "Who is Ada?"
    fb = feedback_row(feedback({"answer": "72"}, label=None, score=0.2), became_failure=True)
    assert (fb["negative"], fb["trainable"], fb["score"], json.loads(fb["correction"])) == (True, True, 0.2,
                                                                                           {"answer": "72"})
