"""One Responses API call (`POST /v1/responses`) through the gateway: forward, log durably, then release.

The same promise as a chat completion (flows/gateway/calls.py): the client gets its answer
only after the call record is committed to the spool. A stream's events are forwarded as
the upstream sends them, except the one that ends it (`response.completed`, or
`response.incomplete` for a reply cut short), which waits for the commit: it carries the
whole `response` object, and that object is what is logged. An `error` or
`response.failed` event reaches the client and the call is not logged, nor one whose
stream ends without its last event.

The gateway mints the response id (`resp_` + 32 hex digits, `resp_<replica>-` + 32 for a
named replica) and writes it, with the model name the client asked for, into every
`response` object it passes on, so feedback joins to exactly one call. The upstream is
told not to store responses (`store: false`): the ids it would keep them under are
never seen by a client, and the gateway serves no `previous_response_id` (the request
checks in app.py refuse it, saying to send the conversation as `input`).

Records carry `api: "responses"`; ingest reads them as chat calls (tasks/ingest/responses_api.py).
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
from fastapi.responses import JSONResponse, StreamingResponse

from flows.gateway.calls import (Api, UpstreamRelease, answer, call_record, new_completion_id, reply_object,
                                 stream_call, utc_now)
from flows.gateway.metrics import CallMeter
from flows.gateway.spool import Spool
from flows.gateway.upstreams import Upstream, UpstreamPool
from tasks.ingest.responses_api import RESPONSES

RESPONSES_API = Api("/v1/responses", "resp_", RESPONSES, (("store", False),))
FINAL_EVENTS = ("response.completed", "response.incomplete")
FAILED_EVENTS = ("error", "response.failed")

log = logging.getLogger("flywheel.gateway")


async def respond(request: dict, model_name: str, pool: UpstreamPool, client: httpx.AsyncClient, spool: Spool,
                  meter: CallMeter, replica: str = "", gone: Callable[[], Awaitable[bool]] | None = None,
                  ) -> JSONResponse | StreamingResponse:
    if not request.get("stream"):
        return await answer(request, model_name, pool, client, spool, meter, replica, gone, RESPONSES_API)
    call = (utc_now(), time.perf_counter(), new_completion_id(replica, RESPONSES_API.id_prefix))
    return await stream_call(request, pool, client, meter, RESPONSES_API,
                             lambda response, release, upstream: _relay(response, release, upstream, request,
                                                                         model_name, spool, call))


async def _relay(response: httpx.Response, release: UpstreamRelease, upstream: Upstream, request: dict,
                 model_name: str, spool: Spool, call: tuple[str, float, str]) -> AsyncIterator[bytes]:
    received, started, response_id = call
    meter = release.meter
    try:
        async for event in _events(response):
            try:
                data = reply_object(event.encode())
            except ValueError as exc:  # a proxy's page or a broken server mid-stream
                data = {"type": "error", "code": "upstream_error", "param": None, "sequence_number": None,
                        "message": f"upstream {upstream.version} sent an event that is no JSON object: {exc}"}
            kind = data.get("type")
            if isinstance(data.get("response"), dict):
                data["response"] = {**data["response"], "id": response_id, "model": model_name}
            frame = f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()
            if kind in FAILED_EVENTS:
                log.warning("gateway: upstream %s failed mid-stream: %s", upstream.version, event[:500])
                meter.status = 502
                meter.failed(upstream.version, "error_event")
                meter.sending()
                yield frame
                return
            if kind in FINAL_EVENTS and isinstance(data.get("response"), dict):
                await spool.append_call(call_record(response_id, received, upstream, request, data["response"],
                                                    True, started, RESPONSES_API))
                meter.status, meter.usage = 200, data["response"].get("usage")
                meter.sending()
                yield frame
                return
            meter.sending()
            yield frame
        raise httpx.RemoteProtocolError(f"upstream {upstream.version} ended its stream without {FINAL_EVENTS[0]}")
    except Exception as exc:
        meter.broke(upstream.version, exc)
        raise
    finally:
        await release()


async def _events(response: httpx.Response) -> AsyncIterator[str]:
    """The data of each server-sent event (its `data:` lines joined; `event:` names are
    in the data's `type` too, so they are written anew from it)."""
    data: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line.strip() and data:
            yield "\n".join(data)
            data = []
    if data:
        yield "\n".join(data)
