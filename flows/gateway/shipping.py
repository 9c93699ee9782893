"""Shipping the spool to the landing prefix as JSONL.gz files, exactly once.

A batch goes through three steps, each durable before the next starts:
plan (spool.plan_batch fixes its seqs and key) -> write the file -> mark_shipped.
A crash before the plan leaves records un-batched: a later batch ships them. A crash
after it leaves a planned batch, which the next `ship_due` ships again first. The key
comes from the batch's bounds and the bytes are deterministic (gzip with mtime=0), so
shipping a batch again overwrites its file with identical bytes: no record lands
twice, and ingest, which keys files by content hash, sees nothing new.

Ships when the un-batched records reach `max_bytes` or the oldest is `max_age_s` old,
from a background thread, and everything on a graceful stop. Deliberately not here:
reading the shipped files back (tasks/ingest/). The same thread prunes the spool's
index of old shipped batches (`keep_index_s`).
"""
from __future__ import annotations

import gzip
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from flows.gateway.spool import Batch, Spool
from storage.objects import ObjectStore, parse_s3_uri
from storage.settings import LakeSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShippingConfig:
    max_bytes: int = 4 << 20
    """Ship when the un-batched records reach this many bytes of JSON; also the most one
    file holds (about), so a backlog after an outage ships in pieces of this size."""
    max_age_s: float = 60.0
    """...or when the oldest un-batched record is this many seconds old."""
    poll_s: float = 1.0
    """How often the background thread checks; a record waits at most max_age_s + poll_s."""
    keep_index_s: float = 30 * 86400.0
    """The spool's index of calls (what feedback joins to) keeps a shipped batch's rows
    this long; the thread prunes older ones (`Spool.prune`) every `prune_every_s`."""
    prune_every_s: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_age_s", "poll_s", "keep_index_s", "prune_every_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"ShippingConfig.{name} must be a positive number, got {value!r}")


def encode_batch(lines: list[str]) -> bytes:
    """A batch's file: its JSON lines, each ending in a newline, gzipped with mtime=0 so
    the same lines always give the same bytes."""
    return gzip.compress("".join(line + "\n" for line in lines).encode(), compresslevel=6, mtime=0)


class Landing:
    """Where batch files go: `settings.landing_uri`, a local folder or an s3:// prefix."""

    def __init__(self, settings: LakeSettings) -> None:
        self.uri = settings.landing_uri
        self._store = ObjectStore(settings) if settings.uses_s3 else None
        self._bucket_ready = False

    def put(self, key: str, data: bytes) -> str:
        """Write `data` at `key` under the landing prefix, replacing what is there; the
        URI written. Returns only once the file is durable."""
        if self._store is None:
            return _put_local(Path(self.uri) / key, data)
        bucket, prefix = parse_s3_uri(self.uri)
        if not self._bucket_ready:  # once, and lazily, so an S3 outage at startup is just a retry
            self._store.ensure_bucket(bucket)
            self._bucket_ready = True
        with tempfile.TemporaryDirectory(prefix="flywheel-ship-") as folder:
            path = Path(folder) / "batch.jsonl.gz"
            path.write_bytes(data)
            return self._store.upload(path, bucket, prefix + key)


class Shipper:
    def __init__(self, spool: Spool, settings: LakeSettings, cfg: ShippingConfig = ShippingConfig()) -> None:
        self.spool, self.cfg = spool, cfg
        self.landing = Landing(settings)
        # ship_due may be called by hand while the thread runs; one shipment at a time.
        self._shipping = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.batches_shipped = 0
        self.failures = 0
        """Rounds of the thread's shipping that failed (each is retried at the next poll)."""

    def ship_due(self, now: float | None = None) -> list[str]:
        """Re-ship batches a crash left planned, then ship new batches while the pending
        records are due by size or age. The URIs written."""
        with self._shipping:
            uris = [self._ship(batch) for batch in self.spool.unshipped_batches()]
            while (batch := self._plan(due_at=time.time() if now is None else now)) is not None:
                uris.append(self._ship(batch))
            return uris

    def ship_all(self) -> list[str]:
        """Ship everything pending, due or not (a graceful stop). The URIs written."""
        with self._shipping:
            uris = [self._ship(batch) for batch in self.spool.unshipped_batches()]
            while (batch := self._plan(due_at=None)) is not None:
                uris.append(self._ship(batch))
            return uris

    def start(self) -> None:
        """Ship from a daemon thread every `poll_s` until `stop`."""
        if self._thread is not None:
            raise RuntimeError("this Shipper is already started; stop() it before starting again")
        self._stop.clear()
        self._thread = threading.Thread(target=self._ship_forever, name="spool-shipper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, then ship everything pending. Its errors are raised: the
        records stay in the spool and ship on the next start."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self.ship_all()

    def _ship_forever(self) -> None:
        pruned_at = 0.0
        while True:
            try:
                self.ship_due()
            except Exception:  # an unreachable landing must not end shipping: retry next poll
                self.failures += 1
                log.exception("shipping the gateway spool failed; retrying in %.1f s", self.cfg.poll_s)
            if time.monotonic() - pruned_at >= self.cfg.prune_every_s:
                pruned_at = time.monotonic()
                try:
                    if any((deleted := self.spool.prune(self.cfg.keep_index_s)).values()):
                        log.info("pruned the spool's index: %s", deleted)
                except Exception:  # a full disk, say: the index only grows until the next try
                    log.exception("pruning the gateway spool failed; retrying in %.0f s", self.cfg.prune_every_s)
            if self._stop.wait(self.cfg.poll_s):
                return

    def _plan(self, due_at: float | None) -> Batch | None:
        """The next batch of pending records; with `due_at` (a time.time()), only if they
        are due by size or age then. At most about `max_bytes` a batch."""
        count, size, oldest = self.spool.pending()
        if not count:
            return None
        if due_at is not None and size < self.cfg.max_bytes and due_at - oldest < self.cfg.max_age_s:
            return None
        return self.spool.plan_batch(None if size <= self.cfg.max_bytes
                                     else max(1, count * self.cfg.max_bytes // size))

    def _ship(self, batch: Batch) -> str:
        uri = self.landing.put(batch.key, encode_batch(self.spool.batch_lines(batch)))
        self.spool.mark_shipped(batch)
        self.batches_shipped += 1
        return uri


def _put_local(target: Path, data: bytes) -> str:
    """Write atomically and durably: a temp file beside the target (its name does not end
    in .jsonl.gz, so ingest never reads a half-written file), fsync, rename, fsync the
    folder so the rename itself survives power loss."""
    if target.exists() and target.read_bytes() == data:
        # Landed before a crash: keep its mtime, so ingest skips it unread. The crash may
        # have come before the folder's fsync, hence this one.
        _fsync_folder(target.parent)
        return str(target)
    _make_folder_durably(target.parent)
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    _fsync_folder(target.parent)
    return str(target)


def _make_folder_durably(folder: Path) -> None:
    if folder.is_dir():
        return
    _make_folder_durably(folder.parent)
    folder.mkdir(exist_ok=True)
    _fsync_folder(folder.parent)


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
