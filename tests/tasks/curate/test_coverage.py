"""Eval coverage written by curation (tasks/curate/coverage.py, tasks/curate/curation.py): which eval
items tasks of earlier cycles copy, by which task, with what evidence; each row once."""
import json
from pathlib import Path

from storage.lake import open_lake
from tasks.curate.curation import CurateConfig, curate
from tasks.curate.evalsets import register_evalset
from tasks.ingest.batch import IngestConfig, ingest_file

CFG = CurateConfig()
STORY = ("Maria buys three notebooks at the corner shop for four dollars each and two pens for one "
         "dollar each. She pays with a twenty dollar bill. How much change does she get back?")
LEAKED = ("Omar plants seven rows of tulips with twelve bulbs in each row, and a quarter of the bulbs "
          "never flower. How many tulips flower?")
OTHER = "A train leaves at noon at sixty miles an hour; how far has it gone by three o'clock?"


def _ingest(con, path: Path, prompts: list[str], cycle: str) -> None:
    logs = [{"id": f"{cycle}-{i}", "ts": f"2026-11-30T12:{i:02d}:00Z", "model": "policy-v3", "domain": "math",
             "messages": [{"role": "user", "content": p}], "response": "no idea",
             "failure": {"kind": "wrong_answer"}, "reference": {"answer": "1"}} for i, p in enumerate(prompts)]
    path.write_text("".join(json.dumps(r) + "\n" for r in logs))
    ingest_file(con, path, str(path), IngestConfig(chunk_lines=1000), cycle)


def _evalset(con, tmp_path: Path, name: str, items: list[tuple[str, str]]) -> str:
    path = tmp_path / f"{name}-{len(items)}.jsonl"
    path.write_text("".join(json.dumps({"id": i, "domain": "math", "prompt": p, "reference": {"answer": "1"}}) + "\n"
                            for i, p in items))
    return register_evalset(con, name, path).eval_version


def _coverage(con) -> list[tuple]:
    return con.execute("""
        SELECT c.eval_set, c.eval_version, c.item_id, t.prompt, c.method, c.evidence, c.cycle_id
        FROM lake.eval_coverage c JOIN lake.tasks t USING (task_id)
        ORDER BY c.eval_set, c.eval_version, c.item_id""").fetchall()


def test_items_covered_by_earlier_tasks_are_persisted_once(lake_settings, tmp_path):
    con = open_lake(lake_settings)
    _ingest(con, tmp_path / "c1.jsonl", [LEAKED, STORY], "c1")
    assert curate(con, CFG, "c1").coverage_rows == 0  # no eval set yet: both become tasks
    # registered after the tasks: reformatted copy of one task, and an unrelated item
    v1 = _evalset(con, tmp_path, "school", [("e7", "  " + LEAKED.upper()), ("e8", OTHER)])
    _ingest(con, tmp_path / "c2.jsonl", [OTHER + " Explain."], "c2")  # contaminated by e8, not a task
    counts = curate(con, CFG, "c2")
    assert (counts.logs, counts.contaminated, counts.coverage_rows) == (1, 1, 1)
    ((eval_set, version, item, prompt, method, evidence, cycle),) = _coverage(con)
    assert (eval_set, version, item, prompt, method, cycle) == ("school", v1, "e7", LEAKED, "exact", "c2")
    assert json.loads(evidence) == {}  # an exact match needs no more evidence than its method

    # reruns and later cycles add nothing for coverage already recorded
    assert curate(con, CFG, "c3").coverage_rows == 0
    _ingest(con, tmp_path / "c4.jsonl", ["What is 17*23?"], "c4")
    assert curate(con, CFG, "c4").coverage_rows == 0
    assert len(_coverage(con)) == 1

    # a new version still holding the item, and another set with the same prompt: each
    # (item version, task) is its own row; the copy in the other set names the match
    v2 = _evalset(con, tmp_path, "school", [("e7", "  " + LEAKED.upper()), ("e8", OTHER), ("e9", "Why?")])
    _evalset(con, tmp_path, "quiz", [("q1", LEAKED.lower())])
    assert curate(con, CFG, "c5").coverage_rows == 2
    rows = _coverage(con)
    assert [(r[0], r[1], r[2], r[6]) for r in rows] == sorted(
        [("quiz", rows[0][1], "q1", "c5"), ("school", v1, "e7", "c2"), ("school", v2, "e7", "c5")])
    named = {r[0]: json.loads(r[5]).get("same_prompt_as") for r in rows if r[6] == "c5"}
    assert named in ({"quiz": {"eval_set": "school", "item_id": "e7"}, "school": None},  # e7 matched
                     {"quiz": None, "school": {"eval_set": "quiz", "item_id": "q1"}})  # or q1 did


def test_overlap_evidence_answers_why_an_item_is_covered(lake_settings, tmp_path):
    con = open_lake(lake_settings)
    _ingest(con, tmp_path / "c1.jsonl", ["Please answer carefully. " + LEAKED.replace(",", ""), STORY], "c1")
    curate(con, CFG, "c1")
    _evalset(con, tmp_path, "school", [("e7", LEAKED)])
    assert curate(con, CFG, "c2").coverage_rows == 1
    (row,) = _coverage(con)
    assert (row[2], row[3].startswith("Please answer carefully"), row[4]) == ("e7", True, "overlap")
    evidence = json.loads(row[5])
    assert evidence["coverage"] >= CFG.decontam.min_coverage
    assert len(evidence["ngram"].split()) == CFG.decontam.ngram


def test_a_run_checks_only_tasks_newer_than_each_versions_mark(lake_settings, tmp_path):
    from tasks.curate.coverage import load_catalog, pending_coverage

    def pending(con):
        return pending_coverage(con, load_catalog(con, CFG.decontam), CFG.decontam)

    con = open_lake(lake_settings)
    _ingest(con, tmp_path / "c1.jsonl", [LEAKED, STORY], "c1")
    curate(con, CFG, "c1")
    assert pending(con).tasks_checked == 0  # no eval set: nothing to check against
    _evalset(con, tmp_path, "school", [("e7", LEAKED.upper())])
    first = pending(con)
    assert (first.tasks_checked, [r["item_id"] for r in first.rows]) == (2, ["e7"])
    assert curate(con, CFG, "c2").coverage_rows == 1
    assert pending(con).tasks_checked == 0  # both tasks are marked as checked against that version
    _ingest(con, tmp_path / "c3.jsonl", [OTHER], "c3")
    curate(con, CFG, "c3")  # a new task, checked as a log against every version
    assert pending(con).tasks_checked == 0
    _evalset(con, tmp_path, "quiz", [("q1", OTHER.lower()), ("q2", STORY)])
    later = pending(con)  # only the new set, against all three tasks
    assert later.tasks_checked == 3 and [r["item_id"] for r in later.rows] == ["q1", "q2"]
    assert curate(con, CFG, "c4").coverage_rows == 2
    assert pending(con).tasks_checked == 0 and curate(con, CFG, "c5").coverage_rows == 0
