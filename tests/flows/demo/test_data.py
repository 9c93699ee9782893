"""`generate_demo_data` writes what its manifest says, in the layout others code against."""
import gzip
import json
import re
import unicodedata
from datetime import datetime
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from flows.demo.data_command import demo_data_command
from flows.demo.data.generate import MALFORMED_KINDS, REFORMAT_KINDS, DemoDataConfig, Manifest, generate_demo_data
from flows.demo.data.similarity import prompt_text, word_jaccard, words
from flows.demo.data.vocab import PREAMBLES

MANIFEST_KEYS = {"seed", "logs", "files", "clean", "exact_duplicates", "near_duplicates", "eval_leaks", "malformed"}
ROLES = {"system", "user", "assistant", "tool"}


def read_lines(out: Path, name: str) -> list[str]:
    opener = gzip.open if name.endswith(".gz") else open
    with opener(out / name, "rt", encoding="utf-8", newline="\n") as handle:
        return handle.read().split("\n")[:-1]


def problem(line: str) -> str | None:
    """An independent reading of the failure-log contract of docs/architecture.md: which rule a line breaks."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        return "not_json"
    if not isinstance(rec, dict):
        return "not_object"
    if len(line.encode()) > 64 * 1024:
        return "oversized_line"
    if any(k not in rec for k in ("model", "ts", "domain", "failure")) or "kind" not in rec["failure"]:
        return "missing_field"
    if "messages" not in rec:
        return "missing_messages"
    if not isinstance(rec["messages"], list):
        return "messages_not_list"
    for m in rec["messages"]:
        if not isinstance(m.get("content"), str):
            return "wrong_types"
        if m["role"] not in ROLES:
            return "unknown_role"
        if not m["content"]:
            return "empty_content"
    if "response" not in rec:
        return "missing_response"
    if rec["domain"] not in ("math", "code", "json"):
        return "unknown_domain"
    if "reference" not in rec:
        return "missing_reference"
    needed = {"math": {"answer"}, "code": {"entry_point", "tests"}, "json": {"schema"}}[rec["domain"]]
    if not needed <= set(rec["reference"]):
        return "bad_reference_shape"
    try:
        datetime.fromisoformat(rec["ts"].replace("Z", "+00:00"))
    except ValueError:
        return "bad_ts"
    return None


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    manifest = generate_demo_data(out, DemoDataConfig(logs=3000, seed=11, lines_per_file=1200, blank_line_share=0.01))
    lines = {name: read_lines(out, name) for name in manifest.files}
    records = {}
    for text in lines.values():
        for line in text:
            if line and problem(line) is None:
                rec = json.loads(line)
                records[rec["id"]] = rec
    items = {}
    for domain in ("math", "code", "json"):
        for line in (out / "evalsets" / f"{domain}.jsonl").read_text().splitlines():
            item = json.loads(line)
            items[item["id"]] = item
    return out, manifest, lines, records, items


def test_layout_files_and_manifest_keys(demo):
    out, manifest, lines, records, items = demo
    assert manifest.files == ["landing/logs-000.jsonl", "landing/logs-001.jsonl.gz", "landing/logs-002.jsonl"]
    assert gzip.open(out / manifest.files[1]).read(1) == b"{"  # really gzip
    assert all(len(text) <= 1200 for text in lines.values())
    assert sum(1 for text in lines.values() for line in text if line) == 3000
    assert sum(1 for text in lines.values() for line in text if not line) > 0  # blank lines ingest must skip
    assert set(json.loads((out / "manifest.json").read_text())) == MANIFEST_KEYS
    assert Manifest.read(out / "manifest.json") == manifest
    assert sorted(p.name for p in (out / "evalsets").iterdir()) == ["code.jsonl", "json.jsonl", "math.jsonl"]


def test_manifest_accounts_for_every_line_exactly_once(demo):
    _, manifest, _, records, _ = demo
    planted = [d["id"] for d in manifest.exact_duplicates + manifest.near_duplicates + manifest.eval_leaks]
    assert len(manifest.clean) + len(planted) + len(manifest.malformed) == 3000
    assert sorted(manifest.clean + planted) == sorted(records)  # ids unique, nothing unaccounted
    assert len(manifest.exact_duplicates) == len(manifest.near_duplicates) == 150
    assert len(manifest.eval_leaks) == 90 and len(manifest.malformed) == 60


def test_malformed_lines_break_exactly_the_recorded_rule(demo):
    _, manifest, lines, _, _ = demo
    bad = {(m["file"], m["line_no"]): m["kind"] for m in manifest.malformed}
    for name, text in lines.items():
        for line_no, line in enumerate(text, start=1):
            if line:
                assert problem(line) == bad.get((name, line_no)), (name, line_no, line[:200])
            else:
                assert (name, line_no) not in bad
    assert set(bad.values()) == set(MALFORMED_KINDS)


def test_every_malformed_kind_appears_from_200_logs(tmp_path):
    manifest = generate_demo_data(tmp_path, DemoDataConfig(logs=200, seed=5))
    assert sorted({m["kind"] for m in manifest.malformed}) == sorted(MALFORMED_KINDS)


def test_a_tiny_run_still_writes_every_named_file(tmp_path):
    manifest = generate_demo_data(tmp_path, DemoDataConfig(logs=1, seed=1))
    assert len(manifest.clean) == 1 and all((tmp_path / name).exists() for name in manifest.files)
    assert read_lines(tmp_path, manifest.files[1]) == []


def test_exact_duplicates_repeat_the_question_from_another_user(demo):
    _, manifest, _, records, _ = demo
    clean = set(manifest.clean)
    for dup in manifest.exact_duplicates:
        copy, original = records[dup["id"]], records[dup["of"]]
        assert dup["of"] in clean
        assert json.dumps(copy["messages"]) == json.dumps(original["messages"])
        assert copy["reference"] == original["reference"]
        assert copy["ts"] >= original["ts"] and copy["meta"] != original["meta"]


def _normalised(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def test_near_duplicates_are_small_findable_edits(demo):
    _, manifest, _, records, _ = demo
    kinds = set()
    for near in manifest.near_duplicates:
        copy, original = prompt_text(records[near["id"]]["messages"]), prompt_text(records[near["of"]]["messages"])
        assert word_jaccard(copy, original) >= 0.85, near
        assert _normalised(copy) != _normalised(original), near  # not an exact duplicate in disguise
        assert records[near["id"]]["reference"] == records[near["of"]]["reference"]
        kinds.add(near["edit"].split(" ")[0].rstrip(":"))
    assert kinds >= {"substituted", "inserted", "deleted", "typo", "punctuation"}


def _same_words_up_to_a_preamble(leaked: list[str], prompt: list[str]) -> bool:
    """The item's words with its preamble moved, or with one preamble sentence added at an end."""
    if sorted(leaked) == sorted(prompt):
        return True
    return any(leaked in (words(p) + prompt, prompt + words(p)) for p in PREAMBLES)


def test_eval_leaks_are_reformatted_items_with_their_reference(demo):
    _, manifest, _, records, items = demo
    assert {leak["reformat"] for leak in manifest.eval_leaks} == set(REFORMAT_KINDS)
    for leak in manifest.eval_leaks:
        rec, item = records[leak["id"]], items[leak["item_id"]]
        assert rec["reference"] == item["reference"] and rec["domain"] == item["domain"] == leak["eval_set"]
        prompt = item["prompt"] if isinstance(item["prompt"], str) else item["prompt"][-1]["content"]
        leaked = next(m["content"] for m in rec["messages"] if m["role"] == "user")
        assert leaked != prompt, leak
        if leak["reformat"] in ("reordered_preamble", "combined"):
            assert _same_words_up_to_a_preamble(words(leaked), words(prompt)), leak
        else:
            assert words(leaked) == words(prompt), leak
        if leak["reformat"] == "fullwidth_digits":
            assert any("０" <= ch <= "９" for ch in leaked)


def test_eval_sets_hold_distinct_items_some_as_chat(demo):
    _, _, _, _, items = demo
    assert len(items) == 300
    assert all(set(item) <= {"id", "domain", "prompt", "reference", "verifier"} for item in items.values())
    assert any(isinstance(item["prompt"], list) for item in items.values())
    texts = [prompt_text(i["prompt"]) if isinstance(i["prompt"], list) else i["prompt"] for i in items.values()]
    assert len({tuple(words(t)) for t in texts}) == 300


def test_worker_processes_change_nothing_in_the_output(tmp_path):
    serial = generate_demo_data(tmp_path / "serial", DemoDataConfig(logs=1500, seed=8, workers=0))
    forked = generate_demo_data(tmp_path / "forked", DemoDataConfig(logs=1500, seed=8, workers=2))
    assert serial == forked
    for path in sorted((tmp_path / "serial").rglob("*.*")):
        assert path.read_bytes() == (tmp_path / "forked" / path.relative_to(tmp_path / "serial")).read_bytes(), path


def test_clean_logs_share_no_word_run_with_eval_items(demo):
    _, manifest, _, records, items = demo
    grams, short = set(), []
    for item in items.values():
        for text in (item["prompt"],) if isinstance(item["prompt"], str) else [m["content"] for m in item["prompt"]]:
            w = words(text)
            grams.update(" ".join(w[i:i + 13]) for i in range(len(w) - 12))
            short += [" " + " ".join(w) + " "] if len(w) < 13 and item["prompt"] == text else []
    for log_id in manifest.clean:
        w = words(records[log_id]["messages"][0]["content"]) if records[log_id]["messages"][0]["role"] == "user" \
            else words(records[log_id]["messages"][1]["content"])
        assert not grams.intersection(" ".join(w[i:i + 13]) for i in range(len(w) - 12)), log_id
        joined = " " + " ".join(w) + " "
        assert not any(s in joined for s in short), log_id


def test_same_seed_same_bytes_other_seed_other_data(tmp_path):
    config = DemoDataConfig(logs=400, seed=3)
    first, second = generate_demo_data(tmp_path / "a", config), generate_demo_data(tmp_path / "b", config)
    assert first == second
    for path in sorted((tmp_path / "a").rglob("*.*")):
        assert path.read_bytes() == (tmp_path / "b" / path.relative_to(tmp_path / "a")).read_bytes(), path
    other = generate_demo_data(tmp_path / "c", DemoDataConfig(logs=400, seed=4))
    assert other.clean != first.clean


@pytest.mark.parametrize("bad, message", [
    (dict(logs=0), "at least 1"), (dict(malformed_share=-0.1), "share"),
    (dict(exact_duplicate_share=0.3, near_duplicate_share=0.3), "<= 0.5"), (dict(lines_per_file=0), "positive"),
])
def test_config_rejects_bad_values_with_a_fix(bad, message):
    with pytest.raises(ValueError, match=message):
        DemoDataConfig(**bad)


def test_cli_writes_demo_data(tmp_path):
    app = typer.Typer()  # the command alone: flows.cli.app would also import every other stage
    app.command("demo-data")(demo_data_command)
    app.command("unused")(lambda: None)  # two commands, so typer keeps the subcommand name
    result = CliRunner().invoke(app, ["demo-data", "--out", str(tmp_path), "--logs", "250", "--seed", "2"])
    assert result.exit_code == 0, result.output
    assert Manifest.read(tmp_path / "manifest.json").logs == 250
    assert "250 log lines" in result.output
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    refused = CliRunner().invoke(app, ["demo-data", "--out", str(a_file / "demo"), "--logs", "10"])
    assert refused.exit_code == 2 and "Not a directory" in refused.output and "Traceback" not in refused.output


def _pairs_above(texts: list[str], threshold: float) -> set[tuple[int, int]]:
    """Pairs of texts whose word 3-gram Jaccard exceeds `threshold`: datasketch LSH candidates, checked exactly."""
    from datasketch import MinHash, MinHashLSH

    shingle_sets = [{" ".join(w[i:i + 3]) for i in range(max(1, len(w) - 2))} for w in map(words, texts)]
    lsh = MinHashLSH(threshold=threshold - 0.2, num_perm=128)  # generous, so candidates miss nothing near 0.8
    signatures = MinHash.bulk([[s.encode() for s in shingles] for shingles in shingle_sets], num_perm=128)
    pairs = set()
    for i, signature in enumerate(signatures):
        for j in lsh.query(signature):
            a, b = shingle_sets[i], shingle_sets[j]
            if len(a & b) / len(a | b) > threshold:
                pairs.add((j, i))
        lsh.insert(i, signature)
    return pairs


def test_clean_logs_are_not_near_duplicates_of_each_other_or_of_eval_items(demo):
    _, manifest, _, records, items = demo
    clean = [prompt_text(records[i]["messages"]) for i in manifest.clean]
    evals = [i["prompt"] if isinstance(i["prompt"], str) else prompt_text(i["prompt"]) for i in items.values()]
    pairs = _pairs_above(clean + evals, 0.8)
    flagged = {i for pair in pairs for i in pair if i < len(clean)}
    assert len(flagged) < 0.005 * len(clean), [(clean[i][:80], (clean + evals)[j][:80]) for i, j in list(pairs)[:5]]
    # the same detector finds the planted near duplicates, so it could have found clean ones
    planted = [(prompt_text(records[d["of"]]["messages"]), prompt_text(records[d["id"]]["messages"]))
               for d in manifest.near_duplicates]
    found = _pairs_above([t for pair in planted for t in pair], 0.8)
    assert sum((2 * k, 2 * k + 1) in found for k in range(len(planted))) >= 0.95 * len(planted)


def test_a_third_of_clean_math_logs_are_two_digit_additions(demo):
    _, manifest, _, records, _ = demo
    math_logs = [records[i] for i in manifest.clean if records[i]["domain"] == "math"]
    additions = 0
    for rec in math_logs:
        numbers = re.fullmatch(r"\D*(\d\d)\D+(\d\d)\D*", rec["messages"][0]["content"])
        additions += bool(numbers) and str(int(numbers[1]) + int(numbers[2])) == rec["reference"]["answer"]
    assert 0.28 < additions / len(math_logs) < 0.4
