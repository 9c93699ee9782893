"""flows/gateway/shipping.py: batches land by size, by age and on stop, exactly once, also
across SIGKILLs of a process appending under load."""
from __future__ import annotations

import asyncio
import gzip
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.gateway.shipping import Landing, Shipper, ShippingConfig, encode_batch
from flows.gateway.spool import Spool
from storage.objects import ObjectStore
from storage.settings import LakeSettings

ROOT = Path(__file__).resolve().parents[3]


def call(i: int) -> dict:
    return {"type": "call", "id": f"chatcmpl-{i:04d}", "ts": "2025-01-01T00:00:00Z", "status": 200,
            "request": {"messages": [{"role": "user", "content": "q" * 100}]}}


def append(spool: Spool, numbers: range) -> None:
    async def all_at_once():
        await asyncio.gather(*(spool.append_call(call(i)) for i in numbers))
    asyncio.run(all_at_once())


def landed_files(settings: LakeSettings) -> list[Path]:
    return sorted(Path(settings.landing_uri).rglob("*.jsonl.gz"))


def records_in(files: list[Path]) -> list[dict]:
    return [json.loads(line) for f in files for line in gzip.decompress(f.read_bytes()).decode().splitlines()]


@pytest.fixture
def spool(tmp_path):
    with Spool(tmp_path / "spool") as spool:
        yield spool


@pytest.mark.parametrize("field, value", [("max_bytes", 0), ("max_age_s", -1.0), ("poll_s", 0), ("poll_s", True),
                                          ("keep_index_s", 0), ("prune_every_s", -1)])
def test_config_rejects_values_that_are_not_positive(field, value):
    with pytest.raises(ValueError, match=f"{field} must be a positive number"):
        ShippingConfig(**{field: value})


def test_ships_when_pending_records_reach_max_bytes(spool, lake_settings):
    append(spool, range(10))
    size, now = spool.pending()[1], time.time()
    assert Shipper(spool, lake_settings, ShippingConfig(max_bytes=size + 1)).ship_due(now) == []
    [uri] = Shipper(spool, lake_settings, ShippingConfig(max_bytes=size)).ship_due(now)
    assert uri == f"{lake_settings.landing_uri}/gateway/{spool.gateway_id}/000000000001-000000000010.jsonl.gz"
    assert [r["seq"] for r in records_in(landed_files(lake_settings))] == list(range(1, 11))
    assert spool.pending()[0] == 0 and spool.unshipped_batches() == []


def test_ships_when_the_oldest_pending_record_reaches_max_age(spool, lake_settings):
    shipper = Shipper(spool, lake_settings, ShippingConfig(max_age_s=60))
    append(spool, range(3))
    oldest = spool.pending()[2]
    assert shipper.ship_due(now=oldest + 59) == []
    assert len(shipper.ship_due(now=oldest + 60)) == 1
    assert shipper.ship_due(now=oldest + 600) == []  # nothing pending: no empty files
    assert [r["id"] for r in records_in(landed_files(lake_settings))] == [f"chatcmpl-{i:04d}" for i in range(3)]


def test_a_backlog_ships_in_files_of_about_max_bytes(spool, lake_settings):
    append(spool, range(100))
    max_bytes = spool.pending()[1] // 100 * 30
    shipper = Shipper(spool, lake_settings, ShippingConfig(max_bytes=max_bytes))
    assert len(shipper.ship_due(time.time())) == 3  # what is left is under max_bytes and not old
    assert 0 < spool.pending()[1] < max_bytes
    assert len(shipper.ship_all()) == 1
    files = landed_files(lake_settings)
    sizes = [len(gzip.decompress(f.read_bytes())) for f in files]
    assert all(0.9 * max_bytes < size < 1.05 * max_bytes for size in sizes[:-1]), (sizes, max_bytes)
    assert [r["seq"] for r in records_in(files)] == list(range(1, 101))


def test_the_thread_ships_what_comes_due(spool, lake_settings):
    shipper = Shipper(spool, lake_settings, ShippingConfig(max_age_s=0.1, poll_s=0.02))
    shipper.start()
    try:
        append(spool, range(5))
        deadline = time.monotonic() + 10
        while not landed_files(lake_settings) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(records_in(landed_files(lake_settings))) == 5
    finally:
        shipper.stop()


def test_the_thread_prunes_the_index_of_batches_older_than_keep_index_s(spool, lake_settings):
    append(spool, range(3))
    Shipper(spool, lake_settings).ship_all()  # an old batch ...
    append(spool, range(3, 5))
    shipper = Shipper(spool, lake_settings, ShippingConfig(max_age_s=0.01, poll_s=0.02, keep_index_s=0.05,
                                                           prune_every_s=0.05))
    shipper.start()  # ... then a newer one shipped by the thread, which prunes the old one's calls
    try:
        deadline = time.monotonic() + 10
        while spool.has_call("chatcmpl-0000") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not any(spool.has_call(f"chatcmpl-{i:04d}") for i in range(3))
        assert spool.has_call("chatcmpl-0004")
    finally:
        shipper.stop()
    assert len(records_in(landed_files(lake_settings))) == 5


def test_stop_ships_what_is_not_yet_due(spool, lake_settings):
    shipper = Shipper(spool, lake_settings, ShippingConfig(max_age_s=3600, poll_s=0.02))
    shipper.start()
    append(spool, range(3))
    time.sleep(0.1)
    assert landed_files(lake_settings) == []
    shipper.stop()
    assert len(records_in(landed_files(lake_settings))) == 3 and spool.pending()[0] == 0


def test_a_batch_planned_before_a_crash_ships_with_its_planned_bounds(spool, lake_settings):
    append(spool, range(5))
    planned = spool.plan_batch()  # ... and the process died
    append(spool, range(5, 8))
    uris = Shipper(spool, lake_settings).ship_all()
    assert [Path(u).name for u in uris] == ["000000000001-000000000005.jsonl.gz", "000000000006-000000000008.jsonl.gz"]
    assert Path(uris[0]).name == Path(planned.key).name
    assert [r["seq"] for r in records_in(landed_files(lake_settings))] == list(range(1, 9))


def test_a_batch_written_before_a_crash_is_rewritten_identically_and_once(spool, lake_settings):
    append(spool, range(5))
    batch = spool.plan_batch()
    first_uri = Landing(lake_settings).put(batch.key, encode_batch(spool.batch_lines(batch)))
    first_bytes = Path(first_uri).read_bytes()  # ... and the process died before mark_shipped

    assert Shipper(spool, lake_settings).ship_due() == [first_uri]
    assert landed_files(lake_settings) == [Path(first_uri)]
    assert Path(first_uri).read_bytes() == first_bytes
    assert [r["seq"] for r in records_in([Path(first_uri)])] == [1, 2, 3, 4, 5]
    assert spool.unshipped_batches() == []


def test_the_same_lines_always_give_the_same_bytes():
    lines = ['{"a":1}', '{"b":2}']
    assert encode_batch(lines) == encode_batch(list(lines))
    assert gzip.decompress(encode_batch(lines)) == b'{"a":1}\n{"b":2}\n'


def test_ships_to_s3_exactly_once(spool, s3_lake_settings):
    append(spool, range(4))
    batch = spool.plan_batch()
    Landing(s3_lake_settings).put(batch.key, encode_batch(spool.batch_lines(batch)))  # then a crash
    store, bucket, prefix = ObjectStore(s3_lake_settings), s3_lake_settings.s3_bucket, s3_lake_settings.landing_prefix
    etag = store.stat(bucket, prefix + batch.key).etag
    append(spool, range(4, 6))
    uris = Shipper(spool, s3_lake_settings).ship_all()
    assert store.stat(bucket, prefix + batch.key).etag == etag  # the same bytes again
    assert uris == [f"s3://{bucket}/{prefix}{batch.key}",
                    f"s3://{bucket}/{prefix}gateway/{spool.gateway_id}/000000000005-000000000006.jsonl.gz"]
    keys = sorted(info.key for info in store.list(bucket, prefix))
    assert keys == [u.removeprefix(f"s3://{bucket}/") for u in uris]
    records = [json.loads(line) for key in keys
               for line in gzip.decompress(store.client.get_object(bucket, key).read()).decode().splitlines()]
    assert [r["id"] for r in records] == [f"chatcmpl-{i:04d}" for i in range(6)]


def test_sigkill_under_load_ships_every_answered_call_exactly_once(tmp_path):
    rng = random.Random(20250101)
    spool_folder, home = tmp_path / "spool", tmp_path / "home"
    answered: dict[str, int] = {}
    # Kills that landed inside a shipment: batches planned, and files written but not marked.
    planned, written = 0, {}
    for run in range(5):
        out = tmp_path / f"run{run}.out"
        child = _start_writer(spool_folder, home, out, tmp_path / f"run{run}.err")
        _wait_for_first_answer(child, out, tmp_path / f"run{run}.err")
        time.sleep(rng.uniform(0.2, 1.0))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        answered.update(_answers(out))
        cut_planned, cut_written = _cut_shipments(spool_folder, home)
        planned, written = planned + cut_planned, written | cut_written
    drain = subprocess.run([sys.executable, "-m", "tests.flows.gateway.spool_writer", str(spool_folder), str(home),
                            "--drain"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert drain.returncode == 0, drain.stderr

    settings = LakeSettings(home=home)
    shipped: dict[str, list[int]] = {}
    for path in landed_files(settings):
        records = records_in([path])
        first, last = (int(n) for n in path.name.removesuffix(".jsonl.gz").split("-"))
        assert [r["seq"] for r in records] == list(range(first, last + 1)), path.name
        for record in records:
            shipped.setdefault(record["id"], []).append(record["seq"])
    lost = [i for i in answered if i not in shipped]
    duplicated = [i for i, seqs in shipped.items() if len(seqs) > 1]
    print(f"\nkill test: answered={len(answered)} shipped={len(shipped)} lost={len(lost)} "
          f"duplicated={len(duplicated)} files={len(landed_files(settings))} "
          f"cut shipments: planned={planned} written={len(written)}")
    assert len(answered) > 1000
    assert lost == [] and duplicated == []
    assert all(shipped[i] == [seq] for i, seq in answered.items())
    assert all(path.read_bytes() == data for path, data in written.items())  # re-shipped identically
    with Spool(spool_folder) as spool:
        assert spool.pending()[0] == 0 and spool.unshipped_batches() == []


def _start_writer(spool_folder: Path, home: Path, out: Path, err: Path) -> subprocess.Popen:
    with open(out, "wb") as stdout, open(err, "wb") as stderr:  # files, not pipes: nothing blocks the child
        return subprocess.Popen([sys.executable, "-m", "tests.flows.gateway.spool_writer", str(spool_folder),
                                 str(home)], cwd=ROOT, stdout=stdout, stderr=stderr)


def _wait_for_first_answer(child: subprocess.Popen, out: Path, err: Path) -> None:
    deadline = time.monotonic() + 30
    while not out.read_bytes().count(b"\n"):
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()
            pytest.fail(f"the writer answered nothing (exit {child.poll()}):\n{err.read_text()[-3000:]}")
        time.sleep(0.02)


def _cut_shipments(spool_folder: Path, home: Path) -> tuple[int, dict[Path, bytes]]:
    """Batches a kill left planned but not marked shipped: (how many had no file yet,
    {file: bytes} of those whose file had landed)."""
    landing = Path(LakeSettings(home=home).landing_uri)
    with Spool(spool_folder) as spool:
        files = [landing / batch.key for batch in spool.unshipped_batches()]
    return sum(not f.exists() for f in files), {f: f.read_bytes() for f in files if f.exists()}


def _answers(out: Path) -> dict[str, int]:
    """{id: seq} of the lines the child finished printing (a kill can cut the last one)."""
    text = out.read_text()
    complete = text[:text.rfind("\n") + 1]
    return {line.split()[1]: int(line.split()[0]) for line in complete.splitlines()}
