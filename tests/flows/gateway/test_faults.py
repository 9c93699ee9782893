"""Requests JSON cannot carry on and upstreams that fail midway: the client gets a clear
4xx or 502 (never a 500), the SDK raises, and nothing is logged that no client saw."""
from __future__ import annotations

import time

import httpx
import openai
import pytest

from flows.gateway.calls import replica_of
from tests.flows.gateway.conftest import ADMIN_KEY, KEY, shipped_records, start_gateway, start_upstream_script
from tests.flows.gateway.faulty_upstream import SLOW_S

pytestmark = pytest.mark.timeout(300)
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def upstream():
    process, url = start_upstream_script("tests.flows.gateway.faulty_upstream", "v-faulty")
    yield url
    process.kill()


@pytest.fixture
def gateway(tmp_path, upstream):
    gateway = start_gateway(tmp_path / "home", upstream)
    yield gateway
    gateway.stop()


def post(gateway, path: str, content: bytes, key: str = KEY) -> httpx.Response:
    return httpx.post(f"{gateway.url}{path}", content=content, timeout=30,
                      headers={"Authorization": f"Bearer {key}", "content-type": "application/json"})


def test_what_json_cannot_carry_on_is_a_400_and_a_wrong_shape_a_422(gateway):
    answer = gateway.client().chat.completions.create(model="flywheel", messages=CHAT)
    cases = {  # each was a 500 once: the spool, httpx or the response renderer met it later
        b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}': (400, "NaN is not JSON"),
        b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}': (400, "lone UTF-16 surrogate"),
        b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}": (400, "nested too deeply"),  # RecursionError
        b'{"messages": [{"role": "user", "content": "hi"}], "stream": true, "stream_options": "x"}':
            (422, "`stream_options` must be an object"),
        b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}': (422, "`stream` must be true or false"),
    }
    for body, (status, phrase) in cases.items():
        response = post(gateway, "/v1/chat/completions", body)
        assert (response.status_code, phrase in response.json()["error"]["message"]) == (status, True), body
    feedback = b'{"id": "%s", "label": "bad", "correction": {"answer": Infinity}}' % answer.id.encode()
    response = post(gateway, "/v1/feedback", feedback)
    assert response.status_code == 400 and "Infinity is not JSON" in response.json()["error"]["message"]
    admin = post(gateway, "/admin/upstream", b'{"url": "%s", "version": 5}' % gateway.url.encode(), key=ADMIN_KEY)
    assert admin.status_code == 422 and "`version` (a string" in admin.json()["error"]["message"]
    assert post(gateway, "/v1/chat/completions", b"{oops", key="sk-nobody").status_code == 401  # key first
    with pytest.raises(openai.NotFoundError, match="this gateway serves /v1/chat/completions"):
        gateway.client().completions.create(model="flywheel", prompt="hi")
    assert replica_of("foo-bar") == ""
    with pytest.raises(openai.NotFoundError, match="no call with completion id 'foo-bar' was logged by this"):
        gateway.client().post("/feedback", body={"id": "foo-bar", "label": "bad"}, cast_to=object)
    assert gateway.client().chat.completions.create(model="flywheel", messages=CHAT).choices  # still serving
    gateway.stop()
    assert "Traceback" not in gateway.log()
    assert [r["type"] for r in shipped_records(gateway.landing)] == ["call", "call"]


def test_an_error_or_a_broken_chunk_mid_stream_reaches_the_client_and_the_call_is_not_logged(gateway):
    stream = gateway.client().chat.completions.create(
        model="flywheel", messages=[{"role": "user", "content": "stream-error"}], stream=True)
    with pytest.raises(openai.APIError, match="Internal server error"):
        list(stream)
    garbage = gateway.client().chat.completions.create(
        model="flywheel", messages=[{"role": "user", "content": "stream-garbage"}], stream=True)
    with pytest.raises(openai.APIError, match="sent a chunk that is no JSON object"):  # was a dropped connection
        list(garbage)
    whole = list(gateway.client().chat.completions.create(model="flywheel", messages=CHAT, stream=True))
    assert whole[-1].choices[0].finish_reason == "stop"
    gateway.stop()
    assert "failed mid-stream" in gateway.log() and "Traceback" not in gateway.log()
    records = shipped_records(gateway.landing)
    assert [r["response"]["choices"][0]["message"]["content"] for r in records] == ["partial "]


def test_an_upstream_reply_that_is_no_json_object_is_a_502_and_not_logged(gateway):
    client = gateway.client()
    for mode, phrase in (("not-json", "Expecting value"), ("a-list", "no object"), ("nan", "NaN is not JSON"),
                         ("surrogate", "lone UTF-16 surrogate")):
        with pytest.raises(openai.InternalServerError) as failed:
            client.chat.completions.create(model="flywheel", messages=[{"role": "user", "content": mode}])
        assert failed.value.status_code == 502 and phrase in failed.value.message, (mode, failed.value.message)
    gateway.stop()
    assert shipped_records(gateway.landing) == [] and "Traceback" not in gateway.log()


def test_a_client_gone_before_its_answer_came_is_not_logged(gateway):
    slow = b'{"messages": [{"role": "user", "content": "slow"}]}'
    with pytest.raises(httpx.ReadTimeout):  # an SDK's timeout, whose retry would be a call of its own
        httpx.post(f"{gateway.url}/v1/chat/completions", content=slow, timeout=1,
                   headers={"Authorization": f"Bearer {KEY}"})
    time.sleep(SLOW_S)
    while httpx.get(f"{gateway.url}/health").json()["in_flight"]:
        time.sleep(0.1)
    answered = gateway.client().chat.completions.create(model="flywheel", messages=CHAT)
    gateway.stop()
    assert [r["id"] for r in shipped_records(gateway.landing)] == [answered.id]
