"""The spool's SQLite file (flows/gateway/spool.py): its tables, how it is opened, the
gateway id it keeps, and the lock that gives it to one process."""
from __future__ import annotations

import fcntl
import sqlite3
import uuid
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY, appended_at REAL NOT NULL, size INTEGER NOT NULL, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS calls (id TEXT PRIMARY KEY, seq INTEGER NOT NULL, choices INTEGER) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS feedback (id TEXT PRIMARY KEY, seq INTEGER NOT NULL, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    first_seq INTEGER PRIMARY KEY, last_seq INTEGER NOT NULL, key TEXT NOT NULL, shipped_at REAL);
CREATE INDEX IF NOT EXISTS calls_by_seq ON calls (seq);
CREATE INDEX IF NOT EXISTS feedback_by_seq ON feedback (seq);
"""


def create_tables(con: sqlite3.Connection) -> None:
    """The tables, on a new file or one an older gateway made."""
    con.executescript(_SCHEMA)
    _count_choices(con)


def connect(path: Path) -> sqlite3.Connection:
    # Autocommit mode: the writer's transactions are its explicit BEGIN IMMEDIATE/COMMIT.
    con = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")  # fsync the WAL at every commit: durable on power loss too
    return con


def _count_choices(con: sqlite3.Connection) -> None:
    """Give a spool made before calls counted their choices the column (NULL for its calls)."""
    if "choices" not in [row[1] for row in con.execute("PRAGMA table_info(calls)")]:
        con.execute("ALTER TABLE calls ADD COLUMN choices INTEGER")


def load_meta(con: sqlite3.Connection) -> tuple[str, int]:
    """(gateway id, last seq handed out); the id is made on first open and kept for good."""
    con.execute("BEGIN IMMEDIATE")
    con.execute("INSERT OR IGNORE INTO meta VALUES ('gateway_id', ?)", (uuid.uuid4().hex[:12],))
    con.execute("INSERT OR IGNORE INTO meta VALUES ('last_seq', '0')")
    con.execute("COMMIT")
    meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
    return meta["gateway_id"], int(meta["last_seq"])


def lock_exclusively(path: Path):
    """Hold an exclusive lock on the spool for this process's lifetime. The writer counts
    seqs in memory, so two processes on one spool would hand out the same seq; the kernel
    drops the lock when the process dies, even by SIGKILL."""
    handle = open(path, "a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise RuntimeError(f"the spool in {path.parent} is in use by another Spool (another gateway "
                           "process, or an unclosed Spool in this one); give each gateway its own folder") from None
    return handle
