"""One thread of a process works on the lake at a time; a thread lets go while it waits.

Why: when a cycle overlaps stages (round r trains while round r+1 samples, flows/
flywheel.py), two threads of one process hold DuckDB connections to the same lake. On a
SQLite catalog, DuckDB's sqlite extension sets no busy timeout, so a second connection
that attaches or reads while the first commits fails at once with "database is locked",
and a failed commit can leave a hot journal that locks every later opener (seen here:
three threads, each opening, reading and committing 30 times: 77 of the 90 failed). With one
turn for the process they made all their commits. A connection that stays open while
another thread commits is harmless: it sees the new snapshots, and its own later commit
is retried by DuckLake against them.

So a stage takes the turn for all its lake work (`lake_turn`, tasks/cycle/state.py:
`run_stage`) and hands it back while it waits on a worker process, vLLM sampling or
DeepSpeed training (`lake_released`): that wait is what the other thread's lake work
fits into. Both nest and both are no-ops where they do not apply (`lake_released`
outside a turn), so a stage called without a flow behaves as before. A connection held
across the wait must hold no unread result (`lake_released` closes it).
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import duckdb

_TURN = threading.Lock()
_held = threading.local()  # depth: how many `lake_turn` blocks this thread is inside


@contextlib.contextmanager
def lake_turn() -> Iterator[None]:
    """This thread's turn on the lake (reentrant within the thread)."""
    depth = getattr(_held, "depth", 0)
    if depth:
        _held.depth = depth + 1
        try:
            yield
        finally:
            _held.depth = depth
        return
    with _TURN:
        _held.depth = 1
        try:
            yield
        finally:
            _held.depth = 0


@contextlib.contextmanager
def lake_released(con: duckdb.DuckDBPyConnection | None) -> Iterator[None]:
    """Hand the turn back for a wait that does not use `con`; take it again after.

    A result not read to its end (a `fetchone()`) keeps its SQLite read transaction
    open, and while it is open the other thread's commit fails at once ("database is
    locked"; seen in an overlapped cycle, reproduced with one `fetchone`), so `con` is
    given one small statement first, which closes whatever result it still held (None:
    the thread holds no connection)."""
    depth = getattr(_held, "depth", 0)
    if not depth:
        yield
        return
    if con is not None:
        con.execute("SELECT 1").fetchall()
    _held.depth = 0
    _TURN.release()
    try:
        yield
    finally:
        _TURN.acquire()
        _held.depth = depth
