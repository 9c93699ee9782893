"""One chat completion through the gateway: forward, log durably, then release.

The client's response is released only after its call record is committed to the spool,
so a call a client saw answered is never lost, whatever happens to the gateway next.
A stream is forwarded chunk by chunk as the upstream produces it, except its final chunks
(the ones carrying finish_reason or usage) and `[DONE]`, which wait for the commit: a client
whose stream breaks before them knows its answer is incomplete, and that call is not logged.
An error event the upstream sends mid-stream (vLLM does when generation fails, then
`[DONE]`) reaches the client, whose SDK raises it; that call is not logged either, nor one
whose upstream sent a chunk that is no JSON object (the client gets an error event of the
same shape, naming the upstream, rather than a dropped connection). A
client gone while its (unstreamed) answer was being made is not logged: it never saw it,
and its SDK's retry is a call of its own.

A reply the upstream sends with status 200 that is no JSON object (or holds what JSON
cannot carry on: flows/json_body.py) is the upstream's failure, a 502, and not logged.

The gateway mints the completion id (`chatcmpl-` + 32 hex digits, or `chatcmpl-<replica>-`
+ 32 hex digits for a named replica) instead of passing the upstream's on: ids stay unique
across upstreams, swaps and replicas, feedback joins to exactly one call, and any replica
can tell which one logged it (`replica_of`). The response names the model the client
asked for; the version that answered is in the `x-flywheel-model-version` header and in
the log.

A call whose upstream cannot be reached, or dies before sending a response head, is sent
once more, to the pool's other upstream (`send_call`): nothing has reached the client or the
log yet, so the client just gets its answer from the one that is up, and the log names that
one. Nothing is retried once a head has arrived: an upstream's own error status reaches the
client as it was said, and a stream or body that breaks midway fails as it is.
"""
from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import datetime, timezone

import anyio
import httpx
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from flows.gateway.metrics import CallMeter
from flows.gateway.spool import Spool
from flows.gateway.streams import StreamAssembly, is_final
from flows.gateway.upstreams import Upstream, UpstreamPool
from flows.json_body import parse_json_body

VERSION_HEADER = "x-flywheel-model-version"

log = logging.getLogger("flywheel.gateway")

# What `client.send(..., stream=True)` raises when no response head came back: the upstream
# refused or never accepted the connection, reset it, or closed it with the call in flight
# (a dead server). httpx returns nothing until the whole head is parsed, so a server that
# dies halfway through writing it (one write in uvicorn) counts as unreached too; its status
# was never seen. Left out: ReadTimeout and WriteTimeout (the server is alive but slow, and
# sending its work elsewhere doubles the load on a pool already behind), PoolTimeout and
# LocalProtocolError (the gateway's own trouble, the other upstream would meet it too).
UNREACHED = (httpx.ConnectError, httpx.ConnectTimeout, httpx.WriteError, httpx.ReadError,
             httpx.RemoteProtocolError)


@dataclass(frozen=True)
class Api:
    """One OpenAI API the gateway serves: where the upstream answers it, how its ids start,
    what every forwarded body of it carries, and the `api` its call records name."""

    path: str
    id_prefix: str
    record_api: str | None = None
    """None: a chat completion (records without `api`)."""
    overrides: tuple[tuple[str, object], ...] = ()


CHAT = Api("/v1/chat/completions", "chatcmpl-")


def new_completion_id(replica: str = "", prefix: str = CHAT.id_prefix) -> str:
    return f"{prefix}{replica}-{uuid.uuid4().hex}" if replica else f"{prefix}{uuid.uuid4().hex}"


_NAMED_ID = re.compile(r"(?:chatcmpl-|resp_)([a-z0-9]{1,32})-[0-9a-f]{32}")


def replica_of(completion_id: str) -> str:
    """The replica named in an id `new_completion_id` minted; "" for an unnamed gateway's
    (or for an id no gateway minted, which no replica logged)."""
    named = _NAMED_ID.fullmatch(completion_id)
    return named.group(1) if named else ""


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def call_record(completion_id: str, received: str, upstream: Upstream, request: dict, response: dict,
                stream: bool, started: float, api: Api = CHAT) -> dict:
    return {"type": "call", "id": completion_id, "ts": received, "model_version": upstream.version,
            "request": request, "response": response, "status": 200, "stream": stream,
            "latency_ms": round((time.perf_counter() - started) * 1000, 3), "usage": response.get("usage"),
            **({"api": api.record_api} if api.record_api else {})}


def upstream_error(exc: Exception, upstream: Upstream, meter: CallMeter, earlier: str = "") -> JSONResponse:
    meter.failed(upstream.version, type(exc).__name__)
    message = f"upstream {upstream.version} failed: {type(exc).__name__}: {exc}"
    return JSONResponse({"error": {"message": message + (f" (after {earlier})" if earlier else ""),
                                   "type": "upstream_error"}}, status_code=502)


def passthrough(response: httpx.Response) -> JSONResponse:
    """An upstream's refusal (a bad request, a prompt too long) reaches the client as it was said."""
    try:
        body = response.json()
    except ValueError:
        body = {"error": {"message": response.text[:2000], "type": "upstream_error"}}
    return JSONResponse(body, status_code=response.status_code)


async def send_call(request: dict, pool: UpstreamPool, client: httpx.AsyncClient, meter: CallMeter,
                    api: Api = CHAT, **overrides) -> tuple[AsyncExitStack, Upstream, httpx.Response] | JSONResponse:
    """POST the call to the upstream the pool chooses and, if that one is UNREACHED, once to
    the pool's other upstream. Returns as soon as a response head is in, with the lease on
    the upstream that answered (the caller closes it when the call is over), or the 502."""
    await pool.opened()  # no lease may start on a server whose weights are being swapped
    upstream, earlier = pool.choose(), ""
    while True:
        meter.version = upstream.version
        try:
            async with AsyncExitStack() as held:
                await held.enter_async_context(pool.lease(upstream))
                body = upstream.forward_body(request, **dict(api.overrides), **overrides)
                response = await client.send(client.build_request("POST", f"{upstream.url}{api.path}", json=body),
                                             stream=True)
                return held.pop_all(), upstream, response
        except httpx.HTTPError as exc:
            if not isinstance(exc, UNREACHED) or earlier:
                return upstream_error(exc, upstream, meter, earlier)
            await pool.opened()
            other = pool.fallback(upstream)
            if other is None:
                return upstream_error(exc, upstream, meter, earlier)
            meter.fell_back(upstream.version, type(exc).__name__)
            earlier = f"{upstream.version} failed: {type(exc).__name__}: {exc}"
            log.warning("gateway: %s; sending the call to %s", earlier, other.version)
            upstream = other


async def complete(request: dict, model_name: str, pool: UpstreamPool, client: httpx.AsyncClient,
                   spool: Spool, meter: CallMeter, replica: str = "",
                   gone: Callable[[], Awaitable[bool]] | None = None) -> JSONResponse | StreamingResponse:
    """A chat completion. gone: says whether the client has hung up (Starlette's
    `request.is_disconnected`). meter: ended by the caller, or by the stream at its end."""
    if request.get("stream"):
        call = (utc_now(), time.perf_counter(), new_completion_id(replica))
        return await _stream(request, model_name, pool, client, spool, call, meter)
    return await answer(request, model_name, pool, client, spool, meter, replica, gone)


async def answer(request: dict, model_name: str, pool: UpstreamPool, client: httpx.AsyncClient, spool: Spool,
                 meter: CallMeter, replica: str = "", gone: Callable[[], Awaitable[bool]] | None = None,
                 api: Api = CHAT) -> JSONResponse:
    """An unstreamed call of `api`: its reply, logged before the client gets it."""
    received, started, completion_id = utc_now(), time.perf_counter(), new_completion_id(replica, api.id_prefix)
    sent = await send_call(request, pool, client, meter, api)
    if isinstance(sent, JSONResponse):
        return sent
    lease, upstream, response = sent
    async with lease:
        try:
            await response.aread()
        except httpx.HTTPError as exc:  # the head came, the body broke: not retried
            return upstream_error(exc, upstream, meter)
        finally:
            await response.aclose()
    if response.status_code != 200:
        return passthrough(response)
    try:
        body = reply_object(response.content)
    except ValueError as exc:
        return upstream_error(exc, upstream, meter)
    if gone is not None and await gone():
        return JSONResponse({}, status_code=499)  # nobody to send it to; nginx's "client closed request"
    body = {**body, "id": completion_id, "model": model_name}
    await spool.append_call(call_record(completion_id, received, upstream, request, body, False, started, api))
    meter.usage = body.get("usage")
    return JSONResponse(body, headers={VERSION_HEADER: upstream.version})


def reply_object(content: bytes) -> dict:
    parsed = parse_json_body(content)
    if not isinstance(parsed, dict):
        raise ValueError(f"its reply is JSON but no object: {content[:200]!r}")
    return parsed


async def _stream(request: dict, model_name: str, pool: UpstreamPool, client: httpx.AsyncClient, spool: Spool,
                  call: tuple[str, float, str], meter: CallMeter) -> JSONResponse | StreamingResponse:
    wants_usage = bool((request.get("stream_options") or {}).get("include_usage"))
    # usage is always asked for, so the log has it; the client gets it only if it asked
    return await stream_call(
        request, pool, client, meter, CHAT,
        lambda response, release, upstream: _relay(response, release, upstream, request, model_name, spool, call,
                                                   wants_usage),
        stream_options={**(request.get("stream_options") or {}), "include_usage": True})


Relay = Callable[[httpx.Response, "UpstreamRelease", Upstream], AsyncIterator[bytes]]


async def stream_call(request: dict, pool: UpstreamPool, client: httpx.AsyncClient, meter: CallMeter, api: Api,
                      relay: Relay, **overrides) -> JSONResponse | StreamingResponse:
    """A streamed call of `api`: sent (send_call), an upstream's refusal passed on, else the
    events `relay` makes of the upstream's stream, the lease returned however it ends."""
    sent = await send_call(request, pool, client, meter, api, **overrides)
    if isinstance(sent, JSONResponse):
        return sent
    lease, upstream, response = sent
    if response.status_code != 200:
        async with lease:
            await response.aread()
            await response.aclose()
        return passthrough(response)
    release = UpstreamRelease(response, lease, meter)
    return LeasedStream(relay(response, release, upstream), release, media_type="text/event-stream",
                        headers={VERSION_HEADER: upstream.version})


class LeasedStream(StreamingResponse):
    """A stream that returns its upstream lease however the response ends.

    The relay's own `finally` runs only once its generator has started. A client gone
    before the first byte can end the response before that: under ASGI spec 2.4 the
    server's `send` raises at the response head and Starlette raises ClientDisconnect,
    skipping any background task. So the release also runs here, shielded, so a
    cancelled request still closes the upstream stream."""

    def __init__(self, content: AsyncIterator[bytes], release: UpstreamRelease, **kwargs) -> None:
        super().__init__(content, **kwargs)
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.release()


class UpstreamRelease:
    """Close the upstream stream and return the lease, once, whoever gets there first; the
    stream's call ends there, with the status its relay left in the meter (499 if none)."""

    def __init__(self, response: httpx.Response, lease: AsyncExitStack, meter: CallMeter) -> None:
        self.response, self.lease, self.meter, self.done = response, lease, meter, False

    async def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            await self.response.aclose()
        finally:
            await self.lease.aclose()
            self.meter.end(self.meter.status)


async def _relay(response: httpx.Response, release: UpstreamRelease, upstream: Upstream, request: dict, model_name: str,
                 spool: Spool, call: tuple[str, float, str], wants_usage: bool) -> AsyncIterator[bytes]:
    received, started, completion_id = call
    assembly, held, meter = StreamAssembly(), [], release.meter
    try:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            try:
                chunk = reply_object(data.encode())
            except ValueError as exc:  # a proxy's page or a broken server mid-stream: end it as vLLM would
                chunk = {"error": {"message": f"upstream {upstream.version} sent a chunk that is no JSON object: "
                                              f"{exc}", "type": "upstream_error", "param": None, "code": 502}}
                data = json.dumps(chunk)
            if "error" in chunk or chunk.get("object") == "error":  # generation failed midway (vLLM)
                log.warning("gateway: upstream %s failed mid-stream: %s", upstream.version, data[:500])
                meter.status = 502
                meter.failed(upstream.version, "error_event")
                meter.sending()
                yield f"data: {data}\n\n".encode() + b"data: [DONE]\n\n"
                return
            chunk = {**chunk, "id": completion_id, "model": model_name}
            assembly.add(chunk)
            if not chunk.get("choices") and not wants_usage:
                continue  # the usage-only chunk the gateway asked for on its own behalf
            if not wants_usage:
                chunk.pop("usage", None)
            event = f"data: {json.dumps(chunk)}\n\n".encode()
            if is_final(chunk):
                held.append(event)
            else:
                meter.sending()
                yield event
        else:  # the upstream hung up without [DONE]: not an answered call
            raise httpx.RemoteProtocolError(f"upstream {upstream.version} ended its stream without [DONE]")
        body = assembly.completion(completion_id, model_name)
        await spool.append_call(call_record(completion_id, received, upstream, request, body, True, started))
        meter.status, meter.usage = 200, body.get("usage")
        meter.sending()
        for event in held:
            yield event
        yield b"data: [DONE]\n\n"
    except Exception as exc:
        meter.broke(upstream.version, exc)
        raise
    finally:
        await release()
