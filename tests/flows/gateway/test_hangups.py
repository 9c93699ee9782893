"""A client that hangs up before its stream starts: the upstream lease comes back, the
upstream stream is cut, and nothing is logged (the call was never answered)."""
from __future__ import annotations

import asyncio
import json
import socket
import time
from contextlib import AsyncExitStack

import httpx
import pytest
from starlette.requests import ClientDisconnect

from flows.gateway.calls import LeasedStream, UpstreamRelease
from flows.gateway.metrics import GatewayMetrics
from tests.flows.gateway.conftest import KEY, shipped_records, start_gateway, start_upstream_script

pytestmark = pytest.mark.timeout(300)
HEAD_DELAY_S, CHUNKS = 1.5, 40  # the upstream's whole answer takes 1.5 + 40 x 0.25 = 11.5 s


def test_a_client_gone_before_the_response_head_returns_the_lease_and_cuts_the_upstream(tmp_path):
    upstream, url = start_upstream_script("tests.flows.gateway.slow_upstream", "v-slow", str(HEAD_DELAY_S),
                                          str(CHUNKS))
    gateway = start_gateway(tmp_path / "home", url)
    try:
        body = json.dumps({"model": "flywheel", "messages": [{"role": "user", "content": "Count."}],
                           "stream": True}).encode()
        host, port = gateway.url.removeprefix("http://").split(":")
        client = socket.create_connection((host, int(port)))
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
                       + f"authorization: Bearer {KEY}\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
        started = time.monotonic()
        while httpx.get(f"{gateway.url}/health").json()["in_flight"] == 0:  # the gateway holds the call
            assert time.monotonic() - started < HEAD_DELAY_S, "the call never reached the upstream"
            time.sleep(0.02)
        client.close()  # gone while the gateway waits for the upstream's head
        while httpx.get(f"{gateway.url}/health").json()["in_flight"] != 0:
            # back soon after the head comes, not when the upstream's answer would end
            assert time.monotonic() - started < HEAD_DELAY_S + CHUNKS * 0.25 * 0.6, "the lease was not returned"
            time.sleep(0.05)
        for _ in range(100):
            stats = httpx.get(f"{url}/stats").json()
            if stats["cut"]:
                break
            time.sleep(0.1)
        assert stats == {"finished": 0, "cut": 1}  # the gateway closed the upstream stream
    finally:
        gateway.stop()
        upstream.kill()
    assert shipped_records(gateway.landing) == []  # never answered: not logged


def test_a_stream_ended_at_its_head_by_an_asgi_2_4_server_still_returns_the_lease():
    """Under ASGI spec 2.4 a server's `send` raises once the client is gone, so the
    response can end before its body generator ever runs (its `finally` with it)."""
    returned = []

    async def never_started():
        yield b"data: {}\n\n"

    async def gone(message: dict) -> None:
        raise OSError("client disconnected")

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    async def run() -> None:
        lease = AsyncExitStack()
        lease.callback(returned.append, "lease")
        upstream_response = httpx.Response(200, content=b"")
        stream = LeasedStream(never_started(), UpstreamRelease(upstream_response, lease, meter),
                              media_type="text/event-stream")
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}}
        with pytest.raises(ClientDisconnect):
            await stream(scope, receive, gone)
        await stream.release()  # once only, whoever gets there first
        assert upstream_response.is_closed

    metrics = GatewayMetrics()
    meter = metrics.call("chat")
    asyncio.run(run())
    assert returned == ["lease"]
    # counted once, as a call whose client left (the release ran twice)
    assert metrics.registry.get_sample_value("flywheel_gateway_calls_total", {
        "api": "chat", "stream": "false", "status": "499", "version": ""}) == 1
