"""Threads of one process on one lake: each takes the turn for its lake work and hands it
back while it waits, as an overlapped cycle's rollout and train stages do."""
from __future__ import annotations

import threading
from datetime import datetime, timezone

import pyarrow as pa

from storage.lake import append_rows, open_lake, transaction
from storage.lake_turn import lake_released, lake_turn
from storage.schemas import SCHEMAS
from storage.settings import LakeSettings


def _stage_row(stage: str, i: int) -> pa.Table:
    return pa.Table.from_pylist([{"stage": stage, "round": i, "seconds": 0.0, "counts": "{}",
                                  "finished_at": datetime.now(timezone.utc), "cycle_id": "c"}],
                                schema=SCHEMAS["cycle_stages"])


def _counts(settings: LakeSettings) -> dict[str, int]:
    con = open_lake(settings, read_only=True)
    try:
        return dict(con.execute("SELECT stage, count(*) FROM lake.cycle_stages GROUP BY 1").fetchall())
    finally:
        con.close()


def test_threads_that_open_read_and_commit_in_turns_lose_nothing(tmp_path):
    # Without the turn this failed 77 times in 90 ("database is locked" on a SQLite catalog).
    settings = LakeSettings(home=tmp_path / "lake")
    open_lake(settings).close()
    errors: list[BaseException] = []

    def writer(name: str) -> None:
        for i in range(12):
            try:
                with lake_turn():
                    con = open_lake(settings)
                    try:
                        con.execute("SELECT count(*) FROM lake.cycle_stages").fetchall()
                        with transaction(con, f"{name} {i}"):
                            append_rows(con, "cycle_stages", _stage_row(name, i))
                    finally:
                        con.close()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    threads = [threading.Thread(target=writer, args=(f"w{k}",)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _counts(settings) == {"w0": 12, "w1": 12, "w2": 12}


def test_a_stage_waiting_on_a_worker_lets_another_commit_then_commits_after_it(tmp_path):
    settings = LakeSettings(home=tmp_path / "lake")
    open_lake(settings).close()
    waiting, other_done = threading.Event(), threading.Event()
    seen: list[int] = []

    def long_stage() -> None:
        with lake_turn():
            con = open_lake(settings)
            # a result left unread holds SQLite's read lock: the other commit would fail
            con.execute("SELECT count(*) FROM lake.cycle_stages WHERE round = ?", [0]).fetchone()
            with lake_released(con):  # "training": the lake is the other thread's meanwhile
                waiting.set()
                assert other_done.wait(60)
            seen.append(con.execute("SELECT count(*) FROM lake.cycle_stages").fetchone()[0])
            with transaction(con, "long stage"):
                append_rows(con, "cycle_stages", _stage_row("long", 0))
            con.close()

    def short_stage() -> None:
        assert waiting.wait(60)
        with lake_turn():
            con = open_lake(settings)
            with transaction(con, "short stage"):
                append_rows(con, "cycle_stages", _stage_row("short", 0))
            con.close()
        other_done.set()

    threads = [threading.Thread(target=long_stage), threading.Thread(target=short_stage)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert seen == [1]  # the connection held across the wait sees the other commit
    assert _counts(settings) == {"long": 1, "short": 1}


def test_the_turn_nests_within_a_thread_and_released_outside_a_turn_does_nothing():
    with lake_turn():
        with lake_turn():
            with lake_released(None):
                # released: another thread can take the turn now
                taken = threading.Event()

                def take() -> None:
                    with lake_turn():
                        taken.set()

                t = threading.Thread(target=take)
                t.start()
                t.join(10)
                assert taken.is_set()
        # held again after the release: another thread has to wait
        blocked = threading.Event()

        def try_take() -> None:
            with lake_turn():
                blocked.set()

        t = threading.Thread(target=try_take, daemon=True)
        t.start()
        t.join(0.5)
        assert not blocked.is_set()
    t.join(10)
    assert blocked.is_set()
    with lake_released(None):  # outside a turn: nothing to close, nothing to release
        pass
