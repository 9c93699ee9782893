"""flows/webhook/deliveries.py: exactly one owner per delivery, across threads and store instances."""
from __future__ import annotations

import threading
import time

from flows.webhook.deliveries import DeliveryStore


def test_one_owner_among_concurrent_reservations_from_separate_connections(tmp_path):
    path = tmp_path / "d.sqlite"
    stores = [DeliveryStore(path) for _ in range(8)]  # as if 8 webhook processes shared the file
    outcomes: list[str] = []
    barrier = threading.Barrier(len(stores))

    def race(store: DeliveryStore) -> None:
        barrier.wait()
        outcomes.append(store.reserve("ingest:key:k1", "h").outcome)

    threads = [threading.Thread(target=race, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["owner"] + ["pending"] * 7


def test_finished_delivery_replays_and_survives_reopening(tmp_path):
    store = DeliveryStore(tmp_path / "d.sqlite")
    assert store.reserve("k", "h").outcome == "owner"
    store.finish("k", 202, '{"flow_run_id": "r1"}')
    store.close()
    again = DeliveryStore(tmp_path / "d.sqlite").reserve("k", "h")
    assert (again.outcome, again.status_code, again.response) == ("done", 202, '{"flow_run_id": "r1"}')


def test_a_different_body_under_the_same_key_conflicts(tmp_path):
    store = DeliveryStore(tmp_path / "d.sqlite")
    store.reserve("k", "h1")
    assert store.reserve("k", "h2").outcome == "conflict"


def test_released_and_stale_reservations_can_be_taken_over(tmp_path):
    store = DeliveryStore(tmp_path / "d.sqlite", stale_s=0.2)
    store.reserve("k", "h")
    store.release("k")
    assert store.reserve("k", "h").outcome == "owner"
    assert store.reserve("k", "h").outcome == "pending"
    time.sleep(0.3)
    assert store.reserve("k", "h").outcome == "owner"  # the owner died; Prefect's idempotency key guards the run


def test_prune_forgets_only_old_finished_deliveries(tmp_path):
    store = DeliveryStore(tmp_path / "d.sqlite")
    for key in ("old", "pending"):
        store.reserve(key, "h")
    store.finish("old", 202, "{}")
    time.sleep(0.05)
    assert store.prune(older_than_s=0.01) == 1
    assert store.reserve("pending", "h").outcome == "pending"
