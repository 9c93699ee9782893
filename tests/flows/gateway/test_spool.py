"""flows/gateway/spool.py: durable appends with group commit, idempotent feedback, batches."""
from __future__ import annotations

import asyncio
import json
import sqlite3
import time

import pytest

from flows.gateway.spool import Spool, UnknownCall, UnknownChoice


def call(i: int, **extra) -> dict:
    return {"type": "call", "id": f"chatcmpl-{i}", "ts": "2025-01-01T00:00:00Z", "status": 200,
            "request": {"messages": [{"role": "user", "content": f"question {i}"}]}, **extra}


def feedback(completion_id: str, label: str = "bad") -> dict:
    return {"type": "feedback", "id": completion_id, "ts": "2025-01-01T00:00:01Z", "label": label,
            "score": None, "correction": None, "comment": None}


def append_calls(spool: Spool, records: list[dict]) -> list[int]:
    async def all_at_once():
        return await asyncio.gather(*(spool.append_call(r) for r in records))
    return asyncio.run(all_at_once())


def test_concurrent_appends_are_committed_with_unique_increasing_seqs(tmp_path):
    records = [call(i) for i in range(300)]
    with Spool(tmp_path / "spool") as spool:
        seqs = append_calls(spool, records)
        gateway = spool.gateway_id
    assert sorted(seqs) == list(range(1, 301))
    assert all(r["seq"] == s and r["gateway"] == gateway for r, s in zip(records, seqs))

    with Spool(tmp_path / "spool") as reopened:
        assert reopened.pending()[0] == 300
        assert all(reopened.has_call(f"chatcmpl-{i}") for i in range(300))
        lines = reopened.batch_lines(reopened.plan_batch())
    stored = [json.loads(line) for line in lines]
    assert [r["seq"] for r in stored] == list(range(1, 301))
    assert {r["id"]: r["seq"] for r in stored} == {r["id"]: r["seq"] for r in records}
    assert stored[0]["request"] == records[stored[0]["seq"] - 1]["request"]


def test_concurrent_appends_share_commits_and_sequential_ones_do_not(tmp_path):
    with Spool(tmp_path / "spool") as spool:
        append_calls(spool, [call(i) for i in range(200)])
        grouped = spool.commits

        async def one_by_one():
            for i in range(200, 220):
                await spool.append_call(call(i))
        before = spool.commits
        asyncio.run(one_by_one())
        sequential = spool.commits - before
    assert grouped <= 20, f"200 concurrent appends took {grouped} commits"
    assert sequential == 20


def test_gateway_id_and_seqs_survive_reopening_and_shipping(tmp_path):
    with Spool(tmp_path / "spool") as spool:
        gateway = spool.gateway_id
        append_calls(spool, [call(i) for i in range(3)])
        spool.mark_shipped(spool.plan_batch())  # deletes records 1-3: their seqs must stay used
    with Spool(tmp_path / "spool") as reopened:
        assert reopened.gateway_id == gateway and len(gateway) == 12
        assert append_calls(reopened, [call(3)]) == [4]
        assert reopened.has_call("chatcmpl-0")  # the index outlives shipping
    with Spool(tmp_path / "other") as other:
        assert other.gateway_id != gateway


def test_feedback_is_stored_once_per_completion(tmp_path):
    with Spool(tmp_path / "spool") as spool:
        append_calls(spool, [call(1)])
        first = feedback("chatcmpl-1", "bad")
        stored, created = asyncio.run(spool.append_feedback(first))
        assert created and stored["seq"] == first["seq"] == 2 and stored["label"] == "bad"

        again, created = asyncio.run(spool.append_feedback(feedback("chatcmpl-1", "good")))
        assert (again, created) == (stored, False)
        assert spool.pending()[0] == 2

        spool.mark_shipped(spool.plan_batch())
        after_shipping, created = asyncio.run(spool.append_feedback(feedback("chatcmpl-1", "good")))
        assert (after_shipping, created) == (stored, False)


def test_feedback_joins_a_call_shipped_earlier_and_rejects_unknown_ids(tmp_path):
    with Spool(tmp_path / "spool") as spool:
        append_calls(spool, [call(1)])
        spool.mark_shipped(spool.plan_batch())
        _, created = asyncio.run(spool.append_feedback(feedback("chatcmpl-1")))
        assert created
        with pytest.raises(UnknownCall, match="chatcmpl-nope"):
            asyncio.run(spool.append_feedback(feedback("chatcmpl-nope")))
        assert spool.pending()[0] == 1


def test_feedback_naming_a_choice_its_call_lacks_is_refused_and_nothing_is_written(tmp_path):
    sampled = {"choices": [{"index": i, "message": {"role": "assistant", "content": str(i)}} for i in range(2)]}
    with Spool(tmp_path / "spool") as spool:
        append_calls(spool, [call(1, response=sampled), call(2, response={"choices": []})])
        with pytest.raises(UnknownChoice, match="has 2 choice\\(s\\), indexed from 0: `choice` 2"):
            asyncio.run(spool.append_feedback({**feedback("chatcmpl-1"), "choice": 2}))
        assert spool.pending()[0] == 2
        stored, created = asyncio.run(spool.append_feedback({**feedback("chatcmpl-1"), "choice": 1}))
        assert created and stored["choice"] == 1
        # feedback that names no choice is about the call, whatever its response holds
        assert asyncio.run(spool.append_feedback(feedback("chatcmpl-2")))[1]


def test_a_spool_made_before_calls_counted_choices_takes_any_choice_for_its_old_calls(tmp_path):
    folder = tmp_path / "spool"
    folder.mkdir()
    old = sqlite3.connect(folder / "spool.sqlite")
    old.execute("CREATE TABLE calls (id TEXT PRIMARY KEY, seq INTEGER NOT NULL) WITHOUT ROWID")
    old.execute("INSERT INTO calls VALUES ('chatcmpl-old', 1)")
    old.commit()
    old.close()
    with Spool(folder) as spool:
        append_calls(spool, [call(2, response={"choices": [{"index": 0}]})])
        assert asyncio.run(spool.append_feedback({**feedback("chatcmpl-old"), "choice": 3}))[1]
        with pytest.raises(UnknownChoice):
            asyncio.run(spool.append_feedback({**feedback("chatcmpl-2"), "choice": 1}))


@pytest.mark.parametrize("record, message", [
    ({"type": "call"}, "needs `id`"),
    ({"type": "call", "id": 7}, "needs `id`"),
    ({"type": "call", "id": ""}, "needs `id`"),
    ({"id": "chatcmpl-1"}, "`type` must be one of"),
    ({"type": "completion", "id": "chatcmpl-1"}, "got 'completion'"),
    ({"type": "feedback", "id": "chatcmpl-1"}, "use append_feedback"),
    ("not a dict", "must be a dict"),
])
def test_bad_records_are_rejected_saying_why(tmp_path, record, message):
    with Spool(tmp_path / "spool") as spool:
        with pytest.raises(ValueError, match=message):
            asyncio.run(spool.append_call(record))
        assert spool.pending()[0] == 0


def test_a_bad_record_fails_alone_in_its_group(tmp_path):
    with Spool(tmp_path / "spool") as spool:
        append_calls(spool, [call(1)])

        async def mixed():
            return await asyncio.gather(spool.append_call(call(2)), spool.append_call(call(1)),
                                        spool.append_call(call(3, latency_ms=float("nan"))),
                                        spool.append_call(call(4)), return_exceptions=True)
        ok2, duplicate, nan, ok4 = asyncio.run(mixed())
        assert isinstance(duplicate, ValueError) and "already in the spool" in str(duplicate)
        assert isinstance(nan, ValueError)
        assert (ok2, ok4) == (2, 3)  # failed appends use up no seq
        assert not spool.has_call("chatcmpl-3")


def test_batches_take_pending_records_in_order(tmp_path):
    with Spool(tmp_path / "spool") as spool:
        assert spool.pending() == (0, 0, None) and spool.plan_batch() is None
        before = time.time()
        append_calls(spool, [call(i) for i in range(5)])
        count, size, oldest = spool.pending()
        assert count == 5 and before <= oldest <= time.time()
        assert size == sum(len(line) for line in spool.batch_lines(spool.plan_batch(5))) > 0

        append_calls(spool, [call(i) for i in range(5, 10)])
        second = spool.plan_batch(max_records=2)
        assert (second.first_seq, second.last_seq) == (6, 7)
        assert second.key == f"gateway/{spool.gateway_id}/000000000006-000000000007.jsonl.gz"
        assert spool.pending()[0] == 3
        assert [(b.first_seq, b.last_seq) for b in spool.unshipped_batches()] == [(1, 5), (6, 7)]

        spool.mark_shipped(second)
        assert [b.first_seq for b in spool.unshipped_batches()] == [1]
        assert spool.batch_lines(second) == []
        with pytest.raises(ValueError, match="max_records"):
            spool.plan_batch(0)


def test_a_closed_spool_refuses_appends_and_a_second_spool_on_the_same_folder(tmp_path):
    spool = Spool(tmp_path / "spool")
    with pytest.raises(RuntimeError, match="in use by another Spool"):
        Spool(tmp_path / "spool")
    spool.close()
    spool.close()
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(spool.append_call(call(1)))
    with pytest.raises(RuntimeError, match="closed"):
        spool.pending()
    Spool(tmp_path / "spool").close()  # closing released the folder


def test_prune_drops_the_index_of_old_shipped_batches_but_the_newest_and_anything_unshipped(tmp_path):
    with Spool(tmp_path / "spool") as spool:
        append_calls(spool, [call(i) for i in range(3)])            # seqs 1-3
        asyncio.run(spool.append_feedback(feedback("chatcmpl-0")))  # seq 4
        spool.mark_shipped(spool.plan_batch())                      # batch 1-4, shipped
        append_calls(spool, [call(i) for i in range(3, 5)])         # seqs 5-6
        crashed = spool.plan_batch()                                # batch 5-6, planned, not shipped
        append_calls(spool, [call(5)])                              # seq 7
        spool.mark_shipped(spool.plan_batch())                      # batch 7, shipped
        append_calls(spool, [call(6)])                              # seq 8, pending

        assert spool.prune(keep_s=3600) == {"calls": 0, "feedback": 0, "batches": 0}  # all recent
        later = time.time() + 7200
        # only what lies before the unshipped batch goes
        assert spool.prune(keep_s=3600, now=later) == {"calls": 3, "feedback": 1, "batches": 1}
        assert not any(spool.has_call(f"chatcmpl-{i}") for i in range(3))
        assert all(spool.has_call(f"chatcmpl-{i}") for i in range(3, 7))
        with pytest.raises(UnknownCall, match="feedback window"):
            asyncio.run(spool.append_feedback(feedback("chatcmpl-0")))

        spool.mark_shipped(crashed)
        assert spool.prune(keep_s=3600, now=later) == {"calls": 2, "feedback": 0, "batches": 1}
        assert spool.has_call("chatcmpl-5") and spool.has_call("chatcmpl-6")  # the newest batch, pending
        # the newest batch still marks what is batched: the pending record ships next, seqs go on
        assert [(b.first_seq, b.last_seq) for b in [spool.plan_batch()]] == [(8, 8)]
        assert append_calls(spool, [call(7)]) == [9]
        with pytest.raises(ValueError, match="keep_s"):
            spool.prune(keep_s=-1)
