"""What a valid failure log is, line by line: every malformed kind is kept with its reason,
and the message shapes real clients write (content parts, tool-call turns) land as text."""
from __future__ import annotations

import json

import pytest

from storage.lake import open_lake
from tasks.ingest.batch import IngestConfig, ingest_file
from tests.tasks.logs import MALFORMED, valid_log, write_logs

CFG = IngestConfig(chunk_lines=1000)


def test_every_malformed_kind_is_quarantined_verbatim_with_its_reason(lake_settings, tmp_path):
    lines = [line for line, _ in MALFORMED.values()]
    path = write_logs(tmp_path / "mixed.jsonl", 20, extra_lines=lines)
    con = open_lake(lake_settings)
    result = ingest_file(con, path, str(path), CFG, "c1")
    assert (result.rows_ok, result.rows_quarantined) == (20, len(MALFORMED))
    got = {row[0]: row[1:] for row in con.execute(
        "SELECT line_no, kind, reason, raw FROM lake.quarantine ORDER BY line_no").fetchall()}
    for offset, (kind, (line, phrase)) in enumerate(MALFORMED.items()):
        got_kind, reason, raw = got[21 + offset]
        assert got_kind == kind, (kind, reason)
        assert phrase in reason, (kind, reason)
        assert raw == line


def test_text_parts_land_as_text_and_a_part_that_is_no_text_is_quarantined_with_why(lake_settings, tmp_path):
    # OpenAI's chat format lets a content be a list of parts; SDKs and frameworks send it
    def parts(*texts, role="user"):
        return {"role": role, "name": "ada", "content": [{"type": "text", "text": t} for t in texts]}

    system = {"role": "system", "content": "Answer briefly."}
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    lines = [
        json.dumps({**valid_log(0), "messages": [system, parts("What is", "17*23?")]}),
        json.dumps({**valid_log(1), "messages": [{"role": "user", "content": [image, {"type": "text", "text": "?"}]}]}),
        json.dumps({**valid_log(2), "messages": [{"role": "user", "content": []}]}),
        json.dumps({**valid_log(3), "messages": [parts("   ")]}),
    ]
    path = write_logs(tmp_path / "parts.jsonl", 0, extra_lines=lines)
    con = open_lake(lake_settings)
    result = ingest_file(con, path, str(path), CFG, "c1")
    assert (result.rows_ok, result.rows_quarantined) == (1, 3)
    messages = json.loads(con.execute("SELECT messages FROM lake.failure_logs").fetchone()[0])
    assert messages == [system, {"role": "user", "name": "ada", "content": "What is\n17*23?"}]
    reasons = con.execute("SELECT line_no, kind, reason FROM lake.quarantine ORDER BY line_no").fetchall()
    assert reasons == [
        (2, "wrong_type", "messages[0].content part 0 is 'image_url', not text: only text can be sampled and "
                          "trained on"),
        (3, "wrong_type", "messages[0].content is an empty list of parts"),
        (4, "empty_content", "messages[0].content is empty")]


def test_an_assistant_turn_that_only_called_tools_lands_with_its_calls_as_text(lake_settings, tmp_path):
    # an agent's conversation as OpenAI's API carries it: content null beside tool_calls
    call = {"id": "t1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
    turns = [{"role": "user", "content": "Weather in Oslo, in Fahrenheit?"},
             {"role": "assistant", "content": None, "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "t1", "content": "5C"}]
    empty = [turns[0], {**turns[1], "content": ""}, turns[2]]  # "" beside the calls, as some frameworks write
    lines = [json.dumps({**valid_log(0), "messages": turns}), json.dumps({**valid_log(2), "messages": empty}),
             json.dumps({**valid_log(1), "messages": [turns[0], {"role": "assistant", "content": None}]})]
    path = write_logs(tmp_path / "agent.jsonl", 0, extra_lines=lines)
    con = open_lake(lake_settings)
    result = ingest_file(con, path, str(path), CFG, "c1")
    assert (result.rows_ok, result.rows_quarantined) == (2, 1)
    calls_text = '[{"name":"weather","arguments":"{\\"city\\": \\"Oslo\\"}"}]'
    for (stored,) in con.execute("SELECT messages FROM lake.failure_logs").fetchall():
        assert json.loads(stored) == [turns[0], {"role": "assistant", "content": calls_text}, turns[2]]
    (reason,) = con.execute("SELECT reason FROM lake.quarantine").fetchone()
    assert reason.startswith("messages[1].content must be a string or a list of text parts (or, in an assistant "
                             "turn with tool_calls, null), got null")


def test_a_reasoning_models_turns_land_with_their_thoughts_and_a_turn_of_thoughts_alone_says_why(lake_settings,
                                                                                                   tmp_path):
    # chat JSONL from apps on vLLM or DeepSeek: the assistant's thoughts beside its answer
    user = {"role": "user", "content": "What is 2+2?"}
    thought = "Two and two make four."
    answered = [{**user}, {"role": "assistant", "content": "4", "reasoning_content": thought}, user]
    lines = [json.dumps({**valid_log(0), "messages": answered}),
             json.dumps({**valid_log(1), "messages": [user, {"role": "assistant", "content": "4", "reasoning": thought},
                                                      user]}),
             json.dumps({**valid_log(2), "messages": [user, {"role": "assistant", "content": None,
                                                             "reasoning_content": thought}, user]}),
             json.dumps({**valid_log(3), "messages": [user, {"role": "assistant", "content": "", "reasoning": thought},
                                                      user]})]
    path = write_logs(tmp_path / "reasoning.jsonl", 0, extra_lines=lines)
    con = open_lake(lake_settings)
    result = ingest_file(con, path, str(path), CFG, "c1")
    assert (result.rows_ok, result.rows_quarantined) == (2, 2)
    (stored,) = con.execute("SELECT messages FROM lake.failure_logs WHERE line_no = 1").fetchone()
    assert json.loads(stored) == answered
    said = ("messages[1] holds only a reasoning model's thoughts (`reasoning_content`), no content: a turn cut at "
            "max_tokens while thinking gave no answer; drop the turn or put its answer in `content`")
    assert con.execute("SELECT line_no, kind, reason FROM lake.quarantine ORDER BY line_no").fetchall() == [
        (3, "wrong_type", said), (4, "empty_content", said)]


def test_a_broken_message_beside_good_ones_is_quarantined(lake_settings, tmp_path):
    # these passed once (a NULL beside TRUE in the type check counted as TRUE) and then
    # broke curation, which reads every message's content
    user = {"role": "user", "content": "What is 2+2?"}
    lines = [json.dumps({**valid_log(0), "messages": [user, {"role": "assistant"}]}),
             json.dumps({**valid_log(1), "messages": [user, "What is 3+3?"]}),
             json.dumps({**valid_log(2), "messages": [user, {"content": "no role"}]})]
    path = write_logs(tmp_path / "broken.jsonl", 0, extra_lines=lines)
    con = open_lake(lake_settings)
    result = ingest_file(con, path, str(path), CFG, "c1")
    assert (result.rows_ok, result.rows_quarantined) == (0, 3)
    reasons = [r for (r,) in con.execute("SELECT reason FROM lake.quarantine ORDER BY line_no").fetchall()]
    assert reasons[0].startswith("messages[1].content must be a string") and reasons[0].endswith("got null")
    assert reasons[1:] == ["messages[1] must be an object with role and content, got a string",
                           "messages[1].role must be a string, got null"]


@pytest.mark.parametrize("line, reason", [
    ('{"id": "a", "ts": oops}', "not valid JSON: Expecting value at column 19"),
    # json's message for this one ends "... starting at": the column is said once
    ('{"id": "a", "response": "cut off', "not valid JSON: Unterminated string starting at column 25"),
])
def test_bad_json_reason_names_the_column_once(lake_settings, tmp_path, line, reason):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    con = open_lake(lake_settings)
    ingest_file(con, path, str(path), CFG, "c1")
    assert con.execute("SELECT reason FROM lake.quarantine").fetchone()[0] == reason


def test_logs_written_as_one_json_array_are_refused_with_how_to_write_them(lake_settings, tmp_path):
    logs = [valid_log(i) for i in range(3)]
    small, big = tmp_path / "small.json", tmp_path / "big.json"
    small.write_text(json.dumps(logs))  # json.dump(logs, f): the commonest wrong shape
    big.write_text(json.dumps(logs * 300))  # over the line limit
    con = open_lake(lake_settings)
    for path in (small, big):
        assert (ingest_file(con, path, str(path), CFG, "c1").rows_quarantined) == 1
    reasons = sorted(r for (r,) in con.execute("SELECT reason FROM lake.quarantine").fetchall())
    assert reasons[0] == "expected a JSON object per line, got a JSON list"
    assert reasons[1].startswith("line is ") and reasons[1].endswith(
        "over the 65,536-byte limit; it starts with '[': ingest reads JSON Lines, one object per line")


def test_lines_python_cannot_read_as_duckdb_does_are_quarantined_with_a_reason(lake_settings, tmp_path):
    # Python's json reads what DuckDB refuses (a lone surrogate, as a JS exporter writes when it
    # cuts an emoji in two) and refuses what DuckDB reads (nesting past its recursion limit, an
    # integer past int()'s digits). Each of these once failed the whole batch (its reason was
    # written with Python's json) or landed a log that curation could not read.
    deep = "[" * 3000 + "]" * 3000
    lone_surrogate = json.dumps(valid_log(1)).replace('"req-0-1"', '"req-\\ud83d"')
    deep_reference = json.dumps(valid_log(2)).replace('{"answer": ', '{"steps": ' + deep + ', "answer": ')
    deep_wrong_type = json.dumps({**valid_log(3), "meta": []}).replace('"meta": []', '"meta": ' + deep)
    deep_message = json.dumps(valid_log(4)).replace('"role": "user"', '"role": "user", "trace": ' + deep)
    truncated_deep = deep_reference[:len(deep_reference) // 2]
    path = write_logs(tmp_path / "odd.jsonl", 1, extra_lines=[
        lone_surrogate, deep_reference, deep_wrong_type, deep_message, truncated_deep,
        json.dumps(valid_log(5)).replace('{"answer": ', '{"steps": ' + "[" * 60 + "]" * 60 + ', "answer": '),
        json.dumps({**valid_log(6), "reference": {"answer": "7"}}).replace('"7"', "7" * 4301),
        json.dumps({**valid_log(7), "meta": {"score": 0.5}}).replace("0.5", "0." + "5" * 5000)])
    con = open_lake(lake_settings)
    result = ingest_file(con, path, str(path), CFG, "c1")
    assert (result.rows_ok, result.rows_quarantined) == (3, 6)
    got = con.execute("SELECT line_no, kind, reason FROM lake.quarantine ORDER BY line_no").fetchall()
    assert [(line_no, kind) for line_no, kind, _ in got] == [
        (2, "bad_json"), (3, "too_deep"), (4, "too_deep"), (5, "too_deep"), (6, "bad_json"), (8, "number_too_long")]
    assert "surrogate" in got[0][2]
    assert all(reason == "JSON nested more than 100 levels deep: later stages could not read it"
               for _, _, reason in got[1:4])
    assert got[4][2].startswith("not valid JSON")
    assert got[5][2].startswith("a number has more than 4,300 digits")
    for reference, meta in con.execute("SELECT reference, meta FROM lake.failure_logs WHERE line_no > 1").fetchall():
        assert json.loads(reference) and json.loads(meta)  # what curation reads, as it reads it


def test_nan_and_infinity_are_no_json_but_the_words_in_a_string_are_text(lake_settings, tmp_path):
    # Python's json.dumps writes NaN and Infinity, and DuckDB's parser and Python's json read
    # them: a reference answer of NaN landed, and curation kept a task any "NaN" reply solves.
    nan_answer = json.dumps({**valid_log(1), "reference": {"answer": 0.5}}).replace("0.5", "NaN")
    infinite_meta = json.dumps({**valid_log(2), "meta": {"score": 0.5}}).replace("0.5", "-Infinity")
    words = {**valid_log(3), "response": "NaN", "meta": {"note": "to Infinity and beyond", "NaN": 1}}
    path = write_logs(tmp_path / "nan.jsonl", 0, extra_lines=[nan_answer, infinite_meta, json.dumps(words)])
    con = open_lake(lake_settings)
    result = ingest_file(con, path, str(path), CFG, "c1")
    assert (result.rows_ok, result.rows_quarantined) == (1, 2)
    got = con.execute("SELECT line_no, kind, reason FROM lake.quarantine ORDER BY line_no").fetchall()
    assert [(line_no, kind) for line_no, kind, _ in got] == [(1, "bad_json"), (2, "bad_json")]
    assert all("NaN and Infinity are not JSON numbers" in reason and "allow_nan=False" in reason
               for _, _, reason in got)
    assert con.execute("SELECT response FROM lake.failure_logs").fetchone() == ("NaN",)


def test_a_utf16_file_is_quarantined_saying_so(lake_settings, tmp_path):
    # Windows PowerShell's `>` and Out-File write UTF-16: every line is refused, and says why
    path = tmp_path / "exported.jsonl"
    path.write_text("\n".join(json.dumps(valid_log(i)) for i in range(3)) + "\n", encoding="utf-16")
    con = open_lake(lake_settings)
    result = ingest_file(con, path, str(path), CFG, "c1")
    assert (result.rows_ok, result.rows_quarantined) == (0, 4)  # the last newline's zero byte is a line
    reasons = [r for (r,) in con.execute("SELECT reason FROM lake.quarantine ORDER BY line_no").fetchall()]
    assert all(r.endswith("the file looks UTF-16 (Windows PowerShell writes it): save it as UTF-8")
               for r in reasons), reasons


def test_an_integer_id_is_kept_as_its_text_and_other_ids_say_what_they_must_be(lake_settings, tmp_path):
    # database exports number their requests; the log is good, only its optional id is an integer
    lines = [json.dumps({**valid_log(0), "id": 12345}), json.dumps({**valid_log(1), "id": -7}),
             json.dumps({**valid_log(2), "id": None}), json.dumps({**valid_log(3), "id": 1.5}),
             json.dumps({**valid_log(4), "id": True}), json.dumps({**valid_log(5), "id": 10**30})]
    path = write_logs(tmp_path / "ids.jsonl", 0, extra_lines=lines)
    con = open_lake(lake_settings)
    result = ingest_file(con, path, str(path), CFG, "c1")
    assert (result.rows_ok, result.rows_quarantined) == (3, 3)
    assert con.execute("SELECT request_id FROM lake.failure_logs ORDER BY line_no").fetchall() == [
        ("12345",), ("-7",), (None,)]
    assert [r for (r,) in con.execute("SELECT reason FROM lake.quarantine ORDER BY line_no").fetchall()] == [
        "`id` must be a string or an integer, got a number", "`id` must be a string or an integer, got a boolean",
        "`id` is an integer past 64 bits: write it as a string"]


def test_legacy_function_calls_and_refusals_say_how_to_write_them(lake_settings, tmp_path):
    user = {"role": "user", "content": "Weather in Oslo?"}
    lines = [json.dumps({**valid_log(0), "messages": [
                 user, {"role": "assistant", "content": None, "function_call": {"name": "w", "arguments": "{}"}}]}),
             json.dumps({**valid_log(1), "messages": [user, {"role": "function", "name": "w", "content": "5C"}]}),
             json.dumps({**valid_log(2), "messages": [
                 user, {"role": "assistant", "content": None, "refusal": "I can't help."}, user]})]
    path = write_logs(tmp_path / "legacy.jsonl", 0, extra_lines=lines)
    con = open_lake(lake_settings)
    assert ingest_file(con, path, str(path), CFG, "c1").rows_quarantined == 3
    assert [r for (r,) in con.execute("SELECT reason FROM lake.quarantine ORDER BY line_no").fetchall()] == [
        "messages[1] has the legacy `function_call`: write it as `tool_calls`",
        "messages[1].role 'function' is not one of system, user, assistant, tool "
        "(the legacy `function` role is `tool`)",
        "messages[1] is a refusal with null content: put the refusal's text in `content`"]


def test_a_reply_left_in_messages_instead_of_response_says_where_it_goes(lake_settings, tmp_path):
    # chat exports (OpenAI fine-tuning files among them) end the conversation with the reply
    log = {key: value for key, value in valid_log(0).items() if key != "response"}
    log["messages"] = [*log["messages"], {"role": "assistant", "content": "80"}]
    path = write_logs(tmp_path / "export.jsonl", 0, extra_lines=[json.dumps(log)])
    con = open_lake(lake_settings)
    assert ingest_file(con, path, str(path), CFG, "c1").rows_quarantined == 1
    assert con.execute("SELECT reason FROM lake.quarantine").fetchone()[0] == (
        "missing required field `response`; the last message is the assistant's: its reply goes in `response`, "
        "and `messages` ends before it")


def test_chat_template_arguments_land_with_their_log_and_ones_that_would_change_more_than_the_text_are_refused(
        lake_settings, tmp_path):
    """`chat_template_kwargs` (Qwen3's enable_thinking) is kept with its log; a log whose
    arguments are no object, hold a nested value, repeat a name or set an argument of
    apply_chat_template itself is quarantined with why. None, null and {} are the template's
    defaults alike, and keep the log's id what it was without the field."""
    log = valid_log(0)
    without = json.dumps(log)
    lines = [json.dumps({**log, "chat_template_kwargs": {"enable_thinking": False}}), without,
             json.dumps({**valid_log(1), "chat_template_kwargs": None}),
             json.dumps({**valid_log(2), "chat_template_kwargs": {}}),
             json.dumps({**valid_log(3), "chat_template_kwargs": ["enable_thinking"]}),
             json.dumps({**valid_log(4), "chat_template_kwargs": {"enable_thinking": False, "tools": None}}),
             json.dumps({**valid_log(5), "chat_template_kwargs": {"budget": {"tokens": 64}}}),
             json.dumps(valid_log(6))[:-1] + ', "chat_template_kwargs": {"thinking": true, "thinking": false}}']
    path = write_logs(tmp_path / "template_args.jsonl", 0, extra_lines=lines)
    con = open_lake(lake_settings)
    result = ingest_file(con, path, str(path), CFG, "c1")
    assert (result.rows_ok, result.rows_quarantined) == (4, 4)
    rows = con.execute("SELECT line_no, chat_template_kwargs FROM lake.failure_logs ORDER BY line_no").fetchall()
    assert rows == [(1, '{"enable_thinking":false}'), (2, None), (3, None), (4, None)]
    reasons = con.execute("SELECT line_no, kind, reason FROM lake.quarantine ORDER BY line_no").fetchall()
    assert [(n, kind) for n, kind, _ in reasons] == [(5, "wrong_type"), (6, "bad_template_args"),
                                                     (7, "bad_template_args"), (8, "bad_template_args")]
    assert reasons[0][2] == "`chat_template_kwargs` must be an object, got an array"
    assert "sets `tools`" in reasons[1][2] and "change more than the prompt's text" in reasons[1][2]
    assert "`chat_template_kwargs.budget` is an object" in reasons[2][2]
    assert reasons[3][2] == "`chat_template_kwargs` names one argument twice"
    # the same logs without the field are the logs already in (same id); with arguments, another
    again = write_logs(tmp_path / "again.jsonl", 0, extra_lines=[json.dumps(valid_log(i)) for i in (1, 2)])
    assert ingest_file(con, again, str(again), CFG, "c2").rows_quarantined == 2
    assert {kind for (kind,) in con.execute("SELECT kind FROM lake.quarantine WHERE line_no < 3").fetchall()} == {
        "repeated_log"}


def test_the_refused_template_arguments_are_every_parameter_of_apply_chat_template():
    import inspect

    from transformers import PreTrainedTokenizerBase

    from tasks.ingest.checks import REFUSED_TEMPLATE_ARGS

    parameters = set(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters) - {"self", "kwargs"}
    assert parameters <= set(REFUSED_TEMPLATE_ARGS)
