"""Under load: SIGKILL loses no answered call and ships none twice; a swap fails no call."""
from __future__ import annotations

import random
import time
from collections import Counter

import httpx
import pytest

from flows.gateway.vllm_serve import free_port
from tests.flows.gateway.conftest import ADMIN_KEY, Load, shipped_records, start_gateway

pytestmark = pytest.mark.timeout(600)


def test_sigkill_under_load_loses_no_answered_call_and_ships_none_twice(tmp_path, upstreams):
    rng = random.Random(20261204)
    home, port = tmp_path / "home", free_port()
    env = {"FLYWHEEL_GATEWAY_SHIP_MAX_AGE_S": "0.5"}  # ship often, so kills land mid-shipping too
    gateway = start_gateway(home, upstreams["v-a"].url, env=env, port=port)
    kills = 4
    with Load(gateway.url, tolerate_outage=True) as load:
        for _ in range(kills):
            time.sleep(rng.uniform(1.0, 4.0))
            gateway.kill()
            gateway = start_gateway(home, upstreams["v-a"].url, env=env, port=port)
        time.sleep(1.0)
    assert gateway.stop()
    shipped = Counter(r["id"] for r in shipped_records(home / "landing") if r["type"] == "call")
    answered = {completion_id for completion_id, _version in load.answered}
    lost = answered - set(shipped)
    twice = [i for i, n in shipped.items() if n > 1]
    print(f"kill test: {kills} SIGKILLs, {len(answered)} calls answered, {len(shipped)} shipped, "
          f"{len(lost)} lost, {len(twice)} shipped twice")
    assert len(answered) > 50
    assert lost == set() and twice == []


def test_switching_and_canary_under_load_fail_no_call(tmp_path, upstreams):
    gateway = start_gateway(tmp_path / "home", upstreams["v-a"].url)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    try:
        with Load(gateway.url) as load:
            time.sleep(1.5)
            switched = httpx.post(f"{gateway.url}/admin/upstream", headers=admin, timeout=60,
                                  json={"url": upstreams["v-b"].url})
            assert switched.status_code == 200 and switched.json()["primary"] == "v-b"
            time.sleep(1.5)
            canary = httpx.post(f"{gateway.url}/admin/upstream", headers=admin, timeout=60,
                                json={"url": upstreams["v-a"].url, "canary_share": 0.5})
            assert {k: canary.json()[k] for k in ("primary", "canary", "canary_share")} == {
                "primary": "v-b", "canary": "v-a", "canary_share": 0.5}
            time.sleep(2.0)
            back = httpx.post(f"{gateway.url}/admin/upstream", headers=admin, timeout=60,  # a rollback
                              json={"url": upstreams["v-a"].url})
            assert back.json()["primary"] == "v-a" and back.json()["canary"] is None
            time.sleep(1.5)
    finally:
        gateway.stop()
    versions = [version for _id, version in load.answered]
    print(f"swap test: {len(versions)} calls, {len(load.failures)} failed, by version {Counter(versions)}")
    assert load.failures == []
    assert versions[0] == "v-a" and versions[-1] == "v-a" and "v-b" in versions
    logged = {r["id"]: r["model_version"] for r in shipped_records(gateway.landing) if r["type"] == "call"}
    assert all(logged[completion_id] == version for completion_id, version in load.answered)
