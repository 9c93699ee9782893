import time

from verifiers import json_schema

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "email": {"type": "string", "format": "email"},
                   "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "email"],
    "additionalProperties": False,
}
SPEC = {"schema": SCHEMA, "answer": {"name": "Ada", "email": "ada@example.com", "age": 36}}


def test_gold_scores_one_and_wrong_scores_zero():
    gold = json_schema.verify(SPEC, json_schema.gold_completion(SPEC))
    assert (gold.reward, gold.passed, gold.components) == (1.0, True, {"parsed": 1.0, "valid": 1.0})
    wrong = json_schema.verify(SPEC, '{"name": "Ada", "email": "ada@example.com", "age": -1}')
    assert (wrong.reward, wrong.status, wrong.components) == (0.0, "wrong", {"parsed": 1.0, "valid": 0.0})
    assert "age" in wrong.detail


def test_format_is_checked():
    bad_email = json_schema.verify(SPEC, '{"name": "Ada", "email": "not an address"}')
    assert bad_email.status == "wrong" and "email" in bad_email.detail


def test_takes_last_outermost_object_with_braces_in_strings():
    text = ('Draft: {"name": "x"}\nFinal:\n```json\n{"name": "a } { b", "email": "a@b.co", '
            '"age": 3}\n```\nDone {not json')
    assert json_schema.find_last_value(text, arrays=False) == {"name": "a } { b", "email": "a@b.co", "age": 3}
    assert json_schema.find_last_value('{"a": {"b": {"c": 1}}}', arrays=False) == {"a": {"b": {"c": 1}}}
    assert json_schema.verify(SPEC, text).passed


def test_no_object_is_a_format_error_and_huge_inputs_are_bounded():
    assert json_schema.verify(SPEC, "no json here [1, 2]").status == "format_error"
    started = time.process_time()  # CPU time (0.12 s here): a busy machine must not fail it
    verdict = json_schema.verify(SPEC, "{" * 1_000_000)
    assert verdict.status == "format_error" and time.process_time() - started < 2.0


def test_invalid_schema_is_reported_as_invalid_spec():
    verdict = json_schema.verify({"schema": {"type": "nonsense"}}, "{}")
    assert verdict.status == "format_error" and verdict.detail.startswith("invalid spec")


def test_an_array_schema_is_answered_by_an_array():
    spec = {"schema": {"type": "array", "items": {"type": "object", "required": ["name"]}, "minItems": 1}}
    assert json_schema.verify(spec, 'Here:\n```json\n[{"name": "Ada"}, {"name": "Bob"}]\n```').passed
    assert json_schema.verify(spec, "[]").status == "wrong"
    # An object schema still looks for objects only: a footnote after the object is no answer.
    assert json_schema.verify(SPEC, '{"name": "Ada", "email": "ada@example.com"}\n\n[1] from the text').passed


def test_an_array_holding_the_object_is_an_array_not_the_object():
    ada = {"name": "Ada", "email": "ada@example.com"}
    assert json_schema.find_last_value('[{"name": "Ada", "email": "ada@example.com"}] [2]', arrays=False) == [ada]
    assert json_schema.find_last_value('[[{"name": "Ada"}]]', arrays=False) == [[{"name": "Ada"}]]
    verdict = json_schema.verify(SPEC, 'Here: [{"name": "Ada", "email": "ada@example.com"}]')
    assert verdict.status == "wrong" and "not of type 'object'" in verdict.detail


def test_nan_is_not_a_number_that_meets_every_bound():
    spec = {"schema": {"type": "object", "required": ["score"],
                       "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}}}}
    assert json_schema.verify(spec, '{"score": 0.5}').passed
    for reply in ('{"score": NaN}', '{"score": Infinity}', '{"score": -Infinity}'):
        assert json_schema.verify(spec, reply).status == "format_error", reply


def test_nesting_past_the_parsers_depth_is_no_object_not_a_crash():
    for schema, reply in [({"type": "object"}, '{"a":' * 100_000), ({"type": "array"}, "[" * 1_000_000)]:
        verdict = json_schema.verify({"schema": schema}, reply)
        assert verdict.status == "format_error", verdict
    assert json_schema.verify({"schema": {"type": "object"}}, '{"a":' * 100_000 + '{"ok": 1}').passed
