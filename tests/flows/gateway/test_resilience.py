"""Under load: SIGKILL loses no answered call and ships none twice; a swap fails no call;
a dead upstream's calls go to the other one (#19)."""
from __future__ import annotations

import random
import subprocess
import time
from collections import Counter

import httpx
import openai
import pytest

from flows.gateway.vllm_serve import free_port
from tests.flows.gateway.conftest import ADMIN_KEY, Load, shipped_records, start_gateway, start_upstream_script

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


def start_dying_upstream(version: str, answers: int, status: int = 200) -> tuple[subprocess.Popen, str]:
    """tests/flows/gateway/dying_upstream.py on a free port: answers `answers` calls (with
    `status`), then dies with the next one in flight."""
    return start_upstream_script("tests.flows.gateway.dying_upstream", version, str(answers), str(status))


def sdk_call(client, k: int, stream: bool) -> tuple[str, str]:
    """One call through the `openai` SDK: (completion id, version header)."""
    raw = client.chat.completions.with_raw_response.create(
        model="flywheel", messages=[{"role": "user", "content": f"What is {k}+1?"}], max_tokens=4, stream=stream)
    if stream:
        chunks = list(raw.parse())
        assert chunks[-1].choices[0].finish_reason, "the stream ended without its final chunk"
        return chunks[0].id, raw.headers["x-flywheel-model-version"]
    return raw.parse().id, raw.headers["x-flywheel-model-version"]


@pytest.mark.parametrize("dead", ["canary", "primary"])
def test_calls_to_a_dead_upstream_are_answered_and_logged_by_the_other_one(tmp_path, upstreams, dead):
    dying, dying_url = start_dying_upstream("v-dead", answers=0)
    primary, canary = (upstreams["v-a"].url, dying_url) if dead == "canary" else (dying_url, upstreams["v-a"].url)
    gateway = start_gateway(tmp_path / "home", primary)
    try:
        made = httpx.post(f"{gateway.url}/admin/upstream", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                          json={"url": canary, "canary_share": 0.5}, timeout=60)
        assert made.status_code == 200 and made.json()["canary_share"] == 0.5
        client = gateway.client()
        answered = [sdk_call(client, k, stream=k % 2 == 1) for k in range(32)]
        assert dying.wait(10) == 1  # it died with its first call in flight
        assert httpx.get(f"{gateway.url}/health").json()["in_flight"] == 0
        assert gateway.stop()
    finally:
        gateway.stop()
        dying.kill()
    assert [version for _id, version in answered] == ["v-a"] * 32
    logged = {r["id"]: r["model_version"] for r in shipped_records(gateway.landing) if r["type"] == "call"}
    assert logged == {completion_id: "v-a" for completion_id, _version in answered}
    retried = [line for line in gateway.log().splitlines() if "sending the call to v-a" in line]
    # ~half the calls went to v-dead (fewer than 2 of 32: p = 33 / 2^32): the first died in flight,
    # the rest found no server
    assert any("RemoteProtocolError" in line or "ReadError" in line for line in retried[:1])
    assert any("ConnectError" in line for line in retried[1:])


def test_a_lone_dead_upstream_gives_a_clear_502_and_only_answered_calls_are_logged(tmp_path):
    dying, url = start_dying_upstream("v-dead", answers=1)
    gateway = start_gateway(tmp_path / "home", url)
    try:
        client = gateway.client()
        answered, _version = sdk_call(client, 0, stream=False)
        failures = []
        for k, stream in enumerate((False, True, False), start=1):  # in flight when it dies, then refused
            with pytest.raises(openai.APIStatusError) as caught:
                sdk_call(client, k, stream)
            failures.append(caught.value)
        assert dying.wait(10) == 1
        assert httpx.get(f"{gateway.url}/health").json()["in_flight"] == 0
        assert gateway.stop()
    finally:
        gateway.stop()
        dying.kill()
    assert [f.status_code for f in failures] == [502] * 3
    messages = [f.body["message"] for f in failures]
    assert all(m.startswith("upstream v-dead failed: ") and "(after" not in m for m in messages), messages
    assert "RemoteProtocolError" in messages[0] or "ReadError" in messages[0]
    assert all("ConnectError" in m for m in messages[1:])
    calls = [r for r in shipped_records(gateway.landing) if r["type"] == "call"]
    assert [(r["id"], r["model_version"]) for r in calls] == [(answered, "v-dead")]


def test_an_error_status_an_upstream_sent_is_passed_on_not_retried(tmp_path):
    (overloaded, primary), (live, canary) = start_dying_upstream("v-503", 1000, 503), start_dying_upstream("v-b", 1000)
    gateway = start_gateway(tmp_path / "home", primary)
    try:
        made = httpx.post(f"{gateway.url}/admin/upstream", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                          json={"url": canary, "canary_share": 0.5}, timeout=60)
        assert made.status_code == 200
        client, outcomes = gateway.client(), []
        for k in range(16):
            try:
                outcomes.append(sdk_call(client, k, stream=False))
            except openai.APIStatusError as exc:
                outcomes.append((exc.status_code, exc.body["message"]))
        assert gateway.stop()
    finally:
        gateway.stop()
        overloaded.kill()
        live.kill()
    refused = [o for o in outcomes if o[0] == 503]
    answered = [o for o in outcomes if o[0] != 503]
    assert refused and answered  # ~half each: the 503s reached the client as v-503 said them
    assert all(message == "v-503 is overloaded" for _status, message in refused)
    assert all(version == "v-b" for _id, version in answered)
    logged = {r["id"]: r["model_version"] for r in shipped_records(gateway.landing) if r["type"] == "call"}
    assert logged == dict(answered)
    assert "sending the call to" not in gateway.log()
