"""The webhook's memory of deliveries: one SQLite file, so replays survive restarts.

A delivery is reserved before its run is created, and its response stored after:
`reserve` is one `INSERT OR IGNORE` inside `BEGIN IMMEDIATE`, so of any number of
concurrent duplicates (threads, or several webhook processes sharing the file)
exactly one becomes the owner; the others wait for the stored response. A failed
creation releases the reservation so the sender's retry can succeed.

If an owner dies between reserving and storing, its reservation goes stale after
`stale_s` and the next duplicate takes over. That can never make a second run:
the run itself is created with the delivery key as Prefect's idempotency key, so
the server hands back the run the dead owner may already have made.
"""
from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

_SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
    key TEXT PRIMARY KEY,
    body_sha256 TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'done')),
    status_code INTEGER,
    response TEXT,
    reserved_at REAL NOT NULL
)"""


@dataclass(frozen=True)
class Reservation:
    outcome: Literal["owner", "done", "pending", "conflict"]
    """owner: create the run; done: replay `response`; pending: another request is
    creating it; conflict: the key was used before with a different body."""
    status_code: int = 0
    response: str = ""


class DeliveryStore:
    def __init__(self, path: Path, stale_s: float = 120.0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.stale_s = stale_s
        # autocommit mode: transactions are the explicit BEGIN IMMEDIATE below
        self.con = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10)
        self.con.execute("PRAGMA journal_mode=WAL")
        self.con.execute("PRAGMA synchronous=NORMAL")
        self.con.execute(_SCHEMA)

    def close(self) -> None:
        self.con.close()

    def reserve(self, key: str, body_sha256: str) -> Reservation:
        now = time.time()
        self.con.execute("BEGIN IMMEDIATE")
        try:
            inserted = self.con.execute(
                "INSERT OR IGNORE INTO deliveries (key, body_sha256, state, reserved_at) VALUES (?, ?, 'pending', ?)",
                (key, body_sha256, now)).rowcount
            if inserted:
                return Reservation("owner")
            digest, state, code, response, reserved_at = self.con.execute(
                "SELECT body_sha256, state, status_code, response, reserved_at FROM deliveries WHERE key = ?",
                (key,)).fetchone()
            if digest != body_sha256:
                return Reservation("conflict")
            if state == "done":
                return Reservation("done", code, response)
            if now - reserved_at > self.stale_s:
                self.con.execute("UPDATE deliveries SET reserved_at = ? WHERE key = ?", (now, key))
                return Reservation("owner")
            return Reservation("pending")
        finally:
            self.con.execute("COMMIT")

    def finish(self, key: str, status_code: int, response: str) -> None:
        self.con.execute("UPDATE deliveries SET state = 'done', status_code = ?, response = ? WHERE key = ?",
                         (status_code, response, key))

    def release(self, key: str) -> None:
        self.con.execute("DELETE FROM deliveries WHERE key = ? AND state = 'pending'", (key,))

    def prune(self, older_than_s: float) -> int:
        """Forget deliveries older than the window any sender retries in."""
        return self.con.execute("DELETE FROM deliveries WHERE state = 'done' AND reserved_at < ?",
                                (time.time() - older_than_s,)).rowcount
