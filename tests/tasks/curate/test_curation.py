"""Curation: one decision per log with its evidence, tasks, incremental = one big run."""
import gzip
import json
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from storage.lake import append_rows, open_lake, transaction
from storage.schemas import SCHEMAS
from storage.settings import LakeSettings
from tasks.curate import decontaminate
from tasks.curate.curation import Candidate, CurateConfig, curate, eval_index, mark_duplicates
from tasks.curate.existing import ExistingTasks
from tasks.curate.similarity.minhash import MinHashConfig
from tasks.curate.similarity.normalize import content_hash
from flows.demo.data.generate import DemoDataConfig, generate_demo_data
from tasks.curate.evalsets import register_evalset
from tasks.ingest.batch import IngestConfig, ingest_file

CFG = CurateConfig()
STORY = ("Maria buys three notebooks at the corner shop for four dollars each and two pens for one "
         "dollar each. She pays with a twenty dollar bill. How much change does she get back?")
LEAKED = ("Omar plants seven rows of tulips with twelve bulbs in each row, and a quarter of the bulbs "
          "never flower. How many tulips flower?")


def _log(i: int, content: str, reference: dict, domain: str = "math") -> dict:
    return {"id": f"req-{i}", "ts": f"2026-11-30T12:{i:02d}:00Z", "model": "policy-v3", "domain": domain,
            "messages": [{"role": "user", "content": content}], "response": "no idea",
            "failure": {"kind": "wrong_answer"}, "reference": reference}


def _ingest(con, path: Path, logs: list[dict], cycle: str) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in logs))
    ingest_file(con, path, str(path), IngestConfig(chunk_lines=1000), cycle)


def _decisions(con) -> dict[str, tuple]:
    rows = con.execute("SELECT f.request_id, d.decision, d.evidence, d.task_id FROM lake.decisions d "
                       "JOIN lake.failure_logs f USING (log_id)").fetchall()
    return {r[0]: (r[1], json.loads(r[2]), r[3]) for r in rows}


def test_every_decision_kind_with_its_evidence(lake_settings, tmp_path):
    con = open_lake(lake_settings)
    evals = tmp_path / "evals.jsonl"
    evals.write_text(json.dumps({"id": "e7", "domain": "math", "prompt": LEAKED, "reference": {"answer": "63"}}))
    register_evalset(con, "school", evals)
    logs = [
        _log(1, STORY, {"answer": "3"}),
        _log(2, "  " + STORY.upper(), {"answer": "3"}),                     # same prompt, reformatted
        _log(3, STORY.replace("corner shop", "corner store"), {"answer": "3"}),  # one word edited
        _log(4, "Please answer carefully. " + LEAKED.replace(",", ""), {"answer": "63"}),
        _log(5, "Return the user as JSON.", {"schema": {"type": "objekt"}}, domain="json"),
        _log(6, "Write add(a, b).", {"entry_point": "add", "tests": "def check(f):\n    assert f(2, 3) == 5\n",
                                     "solution": "def add(a, b):\n    return a - b\n"}, domain="code"),
        _log(7, "What is 17*23?", {"answer": "391"}),
    ]
    _ingest(con, tmp_path / "logs.jsonl", logs, "c1")
    counts = curate(con, CFG, "c1")
    assert (counts.logs, counts.kept, counts.duplicate, counts.near_duplicate, counts.contaminated,
            counts.unverifiable) == (7, 2, 1, 1, 1, 2)
    got = _decisions(con)
    kept_task = got["req-1"][2]
    assert got["req-1"][0] == "kept" and got["req-7"][0] == "kept"
    assert got["req-2"] == ("duplicate", {"method": "exact", "task_id": kept_task}, kept_task)
    decision, evidence, task = got["req-3"]
    assert (decision, task, evidence["task_id"]) == ("near_duplicate", kept_task, kept_task)
    assert evidence["similarity"] >= CFG.minhash.threshold
    decision, evidence, task = got["req-4"]
    assert (decision, task, evidence["eval_set"], evidence["item_id"]) == ("contaminated", None, "school", "e7")
    assert len(evidence["ngram"].split()) == CFG.decontam.ngram
    assert got["req-5"][0] == "unverifiable" and "invalid schema" in got["req-5"][1]["detail"]
    assert got["req-6"][0] == "unverifiable" and got["req-6"][1]["status"] == "wrong"
    tasks = con.execute("SELECT task_id, verifier, source_log_ids FROM lake.tasks ORDER BY verifier").fetchall()
    assert len(tasks) == 2 and {t[1] for t in tasks} == {"math"}
    assert len(next(t for t in tasks if t[0] == kept_task)[2]) == 2  # the log and its exact copy
    assert curate(con, CFG, "c2").logs == 0  # rerun: nothing undecided, nothing written


def test_a_task_keeps_the_chat_template_arguments_of_its_log_and_dedup_ignores_them(lake_settings, tmp_path):
    """The arguments production rendered the prompt with go with the task (rollouts render it
    so); the same messages with other arguments are the same task (an exact duplicate)."""
    con = open_lake(lake_settings)
    no_thinking = {"enable_thinking": False}
    logs = [{**_log(1, STORY, {"answer": "3"}), "chat_template_kwargs": no_thinking},
            _log(2, STORY, {"answer": "3"}), _log(3, "What is 17*23?", {"answer": "391"})]
    _ingest(con, tmp_path / "logs.jsonl", logs, "c1")
    counts = curate(con, CFG, "c1")
    assert (counts.kept, counts.duplicate) == (2, 1)
    tasks = dict(con.execute("SELECT prompt, chat_template_kwargs FROM lake.tasks").fetchall())
    assert json.loads(tasks[STORY]) == no_thinking and tasks["What is 17*23?"] is None


def test_a_log_whose_messages_have_no_text_is_unverifiable_not_a_crash(lake_settings, tmp_path):
    # ingest refuses such logs now; a lake filled before it did may still hold them
    con = open_lake(lake_settings)
    _ingest(con, tmp_path / "logs.jsonl", [_log(1, STORY, {"answer": "3"})], "c1")
    broken = {"log_id": "old-broken", "batch_id": "b-old", "line_no": 1, "request_id": "req-old", "domain": "math",
              "messages": json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant"}]),
              "response": "x", "failure_kind": "wrong_answer", "reference": json.dumps({"answer": "3"}),
              "meta": "{}", "model": "m", "ts": datetime(2026, 11, 30, 12, tzinfo=timezone.utc)}
    with transaction(con):
        append_rows(con, "failure_logs", pa.Table.from_pylist([broken], schema=SCHEMAS["failure_logs"]))
    counts = curate(con, CFG, "c1")
    assert (counts.logs, counts.kept, counts.unverifiable) == (2, 1, 1)
    assert _decisions(con)["req-old"][:2] == ("unverifiable", {"reason": "a message has no text content"})


def test_eval_items_covered_by_earlier_tasks_are_reported(lake_settings, tmp_path):
    con = open_lake(lake_settings)
    _ingest(con, tmp_path / "logs.jsonl", [_log(1, LEAKED, {"answer": "63"}), _log(2, STORY, {"answer": "3"})], "c1")
    curate(con, CFG, "c1")  # no eval set yet: both become tasks
    evals = tmp_path / "evals.jsonl"
    evals.write_text(json.dumps({"id": "e7", "domain": "math", "prompt": LEAKED.upper(), "reference": {"answer": "63"}}))
    register_evalset(con, "school", evals)
    covered = covered_eval_items(con, CFG, exclude_cycle="c2")
    assert [(c["eval_set"], c["item_id"], c["evidence"]["method"]) for c in covered] == [("school", "e7", "exact")]
    assert covered_eval_items(con, CFG, exclude_cycle="c1") == []


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, list[Path]]:
    """Demo data, its logs cut in two files at the median timestamp (two cycles' landings)."""
    out = tmp_path_factory.mktemp("demo")
    generate_demo_data(out, DemoDataConfig(logs=1500, seed=3))
    lines = []
    for path in sorted((out / "landing").iterdir()):
        with (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()) as handle:
            lines += [line for line in handle if line.strip()]

    def when(line: str) -> str:
        try:
            return str(json.loads(line).get("ts", ""))
        except (ValueError, AttributeError):
            return ""  # malformed lines: quarantined whichever file holds them

    lines.sort(key=when)
    halves = [out / "early.jsonl", out / "late.jsonl"]
    halves[0].write_text("".join(lines[: len(lines) // 2]))
    halves[1].write_text("".join(lines[len(lines) // 2:]))
    return out, halves


def _demo_decisions(settings: LakeSettings, demo: Path, halves: list[Path], cycles: int,
                    cfg: CurateConfig = CFG) -> dict[str, tuple]:
    con = open_lake(settings)
    for path in sorted((demo / "evalsets").iterdir()):
        register_evalset(con, path.stem, path)
    for n, path in enumerate(halves):
        ingest_file(con, path, str(path), IngestConfig(chunk_lines=1000), f"c{n}")
        if cycles == 2 or n == 1:
            assert curate(con, cfg, f"c{n}").logs > 0
    return _decisions(con)


@pytest.mark.slow
def test_demo_figures_and_incremental_runs_match_one_big_run(demo, tmp_path):
    out, halves = demo
    whole = _demo_decisions(LakeSettings(home=tmp_path / "one"), out, halves, cycles=1)
    manifest = json.loads((out / "manifest.json").read_text())

    def share(entries, ok):
        return sum(whole[e["id"]][0] in ok for e in entries) / len(entries)

    assert share(manifest["exact_duplicates"], {"duplicate"}) >= 0.99
    assert share(manifest["near_duplicates"], {"near_duplicate", "duplicate"}) >= 0.95
    assert share(manifest["eval_leaks"], {"contaminated"}) >= 0.99
    clean = Counter(whole[i][0] for i in manifest["clean"])
    assert (len(manifest["clean"]) - clean["kept"]) / len(manifest["clean"]) < 0.01, clean
    split = _demo_decisions(LakeSettings(home=tmp_path / "two"), out, halves, cycles=2)
    assert {k: (v[0], v[2]) for k, v in split.items()} == {k: (v[0], v[2]) for k, v in whole.items()}
    # one run in commits of 97 logs decides as one commit does (each chunk sees the last's tasks)
    chunked = _demo_decisions(LakeSettings(home=tmp_path / "chunks"), out, halves, cycles=1,
                              cfg=CurateConfig(chunk_logs=97))
    assert {k: (v[0], v[2]) for k, v in chunked.items()} == {k: (v[0], v[2]) for k, v in whole.items()}


def test_near_duplicates_join_the_most_similar_earlier_task_and_keep_the_rest():
    base = ("Maria buys three notebooks at the corner shop for four dollars each and then "
            "pays with a twenty dollar bill. How much change does she get back from the cashier?")
    texts = [
        "Omar plants seven rows of tulips with twelve bulbs in each row and loses a quarter of them to frost.",
        base,
        base.upper(),                                         # shouted: the same normalised prompt
        base.replace("corner shop", "corner store") + "!!",  # one word edited, punctuation
        base.split(". ")[0] + ". How many notebooks could she buy with forty dollars instead?",
    ]
    cfg = MinHashConfig()
    cands = [Candidate(str(i), "math", [], t, {}, content_hash(t)) for i, t in enumerate(texts)]
    mark_duplicates(cands, ExistingTasks.none(cfg), cfg)
    assert [c.decision for c in cands] == ["kept", "kept", "duplicate", "near_duplicate", "kept"]
    assert cands[2].decided_task == cands[3].decided_task == cands[1].task_id  # only kept tasks are joined
    assert cands[3].evidence["similarity"] >= cfg.threshold  # a shared opening alone is not enough (4)


def covered_eval_items(con: duckdb.DuckDBPyConnection, cfg: CurateConfig,
                       exclude_cycle: str | None = None) -> list[dict]:
    """Eval items already covered by tasks (of cycles other than `exclude_cycle`):
    one row per (item, covering task) with the decontamination evidence, computed now.
    `curate` records the same relation (the test holds the table to it), per item version, in the `eval_coverage` table."""
    index = eval_index(con, cfg)
    rows = con.execute("SELECT task_id, prompt FROM lake.tasks WHERE cycle_id IS DISTINCT FROM ? "
                       "ORDER BY task_id", [exclude_cycle]).fetchall()
    if index is None or not rows:
        return []
    hits = decontaminate.find_contamination([r[1] for r in rows], index, cfg.decontam)
    return [{"eval_set": h.evidence["eval_set"], "item_id": h.evidence["item_id"],
             "task_id": rows[h.record][0], "evidence": h.evidence} for h in hits]


def test_band_keys_are_written_with_their_tasks_and_made_again_alike_for_older_lakes(lake_settings, tmp_path):
    from tasks.curate import existing
    from tasks.curate.similarity import minhash

    con = open_lake(lake_settings)
    prompts = [STORY, LEAKED, "What is 17*23?"]
    _ingest(con, tmp_path / "logs.jsonl", [_log(1, STORY, {"answer": "3"}), _log(2, LEAKED, {"answer": "63"}),
                                           _log(3, prompts[2], {"answer": "391"})], "c1")
    curate(con, CFG, "c1")
    expected = {content_hash(p): k.tolist() for p, k in zip(prompts, minhash.sketch_texts(prompts, CFG.minhash).keys)}

    def stored() -> dict[str, list[int]]:
        return dict(con.execute("SELECT task_id, keys FROM lake.task_bands WHERE banding = ?",
                                [CFG.minhash.banding_scheme]).fetchall())

    assert stored() == expected  # written in the commit of their tasks
    # a lake from before band keys were kept, one task without a signature either
    con.execute("DELETE FROM lake.task_bands")
    con.execute("DELETE FROM lake.minhash_signatures WHERE task_id = ?", [content_hash(STORY)])
    assert existing.backfill(con, CFG.minhash, "c2", block=2) == 3  # blocks of 2: a ragged last one
    assert stored() == expected
    assert existing.backfill(con, CFG.minhash, "c3") == 0  # once


def test_an_older_lake_still_finds_near_duplicates_of_its_tasks(lake_settings, tmp_path):
    con = open_lake(lake_settings)
    _ingest(con, tmp_path / "a.jsonl", [_log(1, STORY, {"answer": "3"})], "c1")
    curate(con, CFG, "c1")
    con.execute("DELETE FROM lake.task_bands")
    _ingest(con, tmp_path / "b.jsonl", [_log(2, STORY.replace("corner shop", "corner store"), {"answer": "3"}),
                                        _log(3, STORY, {"answer": "3"})], "c2")
    curate(con, CFG, "c2")
    got = _decisions(con)
    assert got["req-2"][0] == "near_duplicate" and got["req-2"][2] == content_hash(STORY)
    assert got["req-3"][0] == "duplicate"


def test_the_lake_probe_finds_the_pairs_the_in_memory_probe_finds(lake_settings):
    from storage.lake import append_rows
    from tasks.curate import existing
    from tasks.curate.similarity import bands

    con = open_lake(lake_settings)
    rng = np.random.default_rng(3)
    n_old, n_new, width = 500, 200, CFG.minhash.banding[0]
    old = rng.integers(0, 1 << 63, size=(n_old, width), dtype=np.uint64)
    new = rng.integers(0, 1 << 63, size=(n_new, width), dtype=np.uint64)
    for k in range(60):  # planted: a shared key in the same band (a pair), in another band (no pair)
        a, b, band = int(rng.integers(n_new)), int(rng.integers(n_old)), int(rng.integers(width))
        if k % 3:
            new[a, band] = old[b, band]
        else:
            new[a, band] = old[b, (band + 1) % width]
    new[7] = old[11]  # every band shared: still one pair
    ids = [f"t{i:04d}" for i in range(n_old)]
    append_rows(con, existing.BANDS_TABLE, existing.band_rows(ids, old, CFG.minhash.banding_scheme, "c1"))
    append_rows(con, existing.BANDS_TABLE, existing.band_rows(ids[:5], old[:5] + np.uint64(1), "another", "c1"))
    rows, task_ids = existing.ExistingTasks(CFG.minhash, con).partners(new)
    expected = {(int(a), ids[int(b)]) for a, b in bands.probe_pairs(new, old)}
    assert len(expected) >= 40 and (7, "t0011") in expected
    assert sorted(zip(rows.tolist(), task_ids)) == sorted(expected)
