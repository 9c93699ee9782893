"""Registering evaluation sets as versions (tasks/curate/evalsets.py)."""
import json

import pytest

from storage.lake import open_lake
from tasks.curate.evalsets import EvalsetError, all_eval_prompts, list_evalsets, register_evalset

ITEMS = [
    {"id": "m1", "domain": "math", "prompt": "What is 17*23?", "reference": {"answer": "391"}},
    {"id": "m2", "domain": "math", "prompt": [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "What is 2+40?"}],
     "reference": {"answer": "42"}, "verifier": "exact"},
]


def _write(path, items):
    path.write_text("".join(json.dumps(i) + "\n" for i in items) + "\n")
    return path


def test_same_file_twice_is_a_no_op_and_a_changed_file_is_a_new_version(lake_settings, tmp_path):
    con = open_lake(lake_settings)
    path = _write(tmp_path / "math.jsonl", ITEMS)
    first = register_evalset(con, "math", path)
    again = register_evalset(con, "math", path)
    assert (first.added, first.items, again.added, again.eval_version) == (True, 2, False, first.eval_version)
    assert con.execute("SELECT count(*) FROM lake.eval_items").fetchone()[0] == 2
    changed = register_evalset(con, "math", _write(tmp_path / "math.jsonl", ITEMS + [
        {"id": "m3", "domain": "math", "prompt": "What is 5*5?", "reference": {"answer": "25"}}]))
    assert changed.added and changed.eval_version != first.eval_version
    versions = list_evalsets(con)
    assert [(v["eval_version"], v["items"], v["latest"]) for v in versions] == [
        (changed.eval_version, 3, True), (first.eval_version, 2, False)]
    old = con.execute("SELECT item_id FROM lake.eval_items WHERE eval_version = ? ORDER BY item_id",
                      [first.eval_version]).fetchall()
    assert old == [("m1",), ("m2",)]  # the old version stays queryable
    assert len(all_eval_prompts(con)) == 3  # one per distinct prompt, across versions


def test_a_byte_order_mark_before_the_first_line_is_not_its_content(lake_settings, tmp_path):
    path = _write(tmp_path / "math.jsonl", ITEMS)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # as Windows tools write UTF-8
    assert register_evalset(open_lake(lake_settings), "math", path).items == 2


def test_chat_prompts_keep_their_messages_and_verifier(lake_settings, tmp_path):
    con = open_lake(lake_settings)
    register_evalset(con, "math", _write(tmp_path / "m.jsonl", ITEMS))
    prompt, messages, verifier = con.execute(
        "SELECT prompt, messages, verifier FROM lake.eval_items WHERE item_id = 'm2'").fetchone()
    assert prompt == "Be brief.\nWhat is 2+40?" and verifier == "exact"
    assert json.loads(messages)[1] == {"role": "user", "content": "What is 2+40?"}
    assert con.execute("SELECT verifier FROM lake.eval_items WHERE item_id = 'm1'").fetchone() == ("math",)


def test_a_content_of_text_parts_is_its_text(lake_settings, tmp_path):
    """OpenAI's content parts, as exported chat data carries them: joined as ingest joins them."""
    con = open_lake(lake_settings)
    parts = {"id": "p1", "domain": "math", "reference": {"answer": "42"}, "prompt": [
        {"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "text", "text": "2+40?"}]}]}
    register_evalset(con, "math", _write(tmp_path / "parts.jsonl", [parts]))
    prompt, messages = con.execute("SELECT prompt, messages FROM lake.eval_items").fetchone()
    assert prompt == "What is\n2+40?" and json.loads(messages) == [{"role": "user", "content": "What is\n2+40?"}]


@pytest.mark.parametrize("line, message", [
    ("not json", "line 2: not JSON"),
    (json.dumps({"id": "x", "domain": "math", "prompt": "", "reference": {"answer": "1"}}), "line 2: prompt"),
    (json.dumps({"id": "x", "domain": "poetry", "prompt": "Hi", "reference": {}}), "line 2: no verifier"),
    (json.dumps({"id": "m1", "domain": "math", "prompt": "Hi", "reference": {"answer": "1"}}), "appears twice"),
    (json.dumps({"id": "x", "verifier": ["math"], "prompt": "Hi", "reference": {"answer": "1"}}),
     "line 2: verifier must be a string, got list"),
    (json.dumps({"id": "x", "domain": {"name": "math"}, "prompt": "Hi", "reference": {"answer": "1"}}),
     "line 2: domain must be a string, got dict"),
    (json.dumps({"id": "x", "domain": {"name": "math"}, "verifier": "math", "prompt": "Hi", "reference": {"answer": "1"}}),
     "line 2: domain must be a string, got dict"),
    (json.dumps({"id": True, "domain": "math", "prompt": "Hi", "reference": {"answer": "1"}}),
     "line 2: expected an object with an \"id\" \\(a string or an integer\\)"),
    # references their verifier cannot score: every sample would be a format_error
    (json.dumps({"id": "x", "domain": "math", "prompt": "Hi", "reference": {"foo": "4"}}),
     "line 2: item 'x': reference for verifier 'math' needs `answer`"),
    (json.dumps({"id": "x", "domain": "json", "prompt": "Hi", "reference": {"answer": {"a": 1}}}),
     "line 2: item 'x': reference for verifier 'json_schema' needs `schema`"),
    (json.dumps({"id": "x", "domain": "json", "prompt": "Hi", "reference": {"schema": {"type": "thing"}}}),
     "line 2: item 'x': reference for verifier 'json_schema' schema:"),
    (json.dumps({"id": "x", "domain": "math", "reference": {"answer": "1"}, "prompt": [{"role": "user", "content": [
        {"type": "text", "text": "How many?"}, {"type": "image_url", "image_url": {"url": "data:,"}}]}]}),
     "line 2: prompt\\[0\\] must be .* a string or a list of text parts \\(no images"),
    ('{"id": "x", "domain": "math", "prompt": "\udcff", "reference": {"answer": "1"}}', "line 2: not valid UTF-8"),
])
def test_bad_lines_are_refused_with_their_line_number(lake_settings, tmp_path, line, message):
    con = open_lake(lake_settings)
    path = tmp_path / "bad.jsonl"
    # surrogateescape: "\udcff" is written as the lone byte 0xff, which is no UTF-8
    path.write_bytes((json.dumps(ITEMS[0]) + "\n" + line + "\n").encode("utf-8", "surrogateescape"))
    with pytest.raises(EvalsetError, match=message):
        register_evalset(con, "math", path)
    assert con.execute("SELECT count(*) FROM lake.eval_items").fetchone()[0] == 0


def test_an_integer_id_is_stored_as_text_and_a_known_verifier_takes_any_domain(lake_settings, tmp_path):
    con = open_lake(lake_settings)
    register_evalset(con, "trivia", _write(tmp_path / "t.jsonl", [
        {"id": 7, "domain": "trivia", "verifier": "exact", "prompt": "Capital of France?", "reference": {"answer": "Paris"}}]))
    assert con.execute("SELECT item_id, domain, verifier FROM lake.eval_items").fetchall() == [("7", "trivia", "exact")]
