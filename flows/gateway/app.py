"""`flywheel gateway`: the OpenAI API in front of the production model, logging every call.

- `POST /v1/chat/completions`: streaming or not; `response_format`, `tools` and every other
  parameter pass through to the upstream (flows/gateway/calls.py).
- `POST /v1/responses`: OpenAI's Responses API, streaming or not, passed to the upstream's
  own (vLLM serves it); what a chat log cannot hold is refused (flows/gateway/responses.py).
- `GET /v1/models`: the one model clients name (`model_name`), whichever version serves it.
- `POST /v1/feedback`: a completion id plus a label or score, an optional correction, a
  comment, and which choice of an `n` > 1 call it is about (tasks/ingest/gateway_records.py);
  idempotent per completion id; feedback for another replica's call is passed to that
  replica (flows/gateway/replicas.py).
- `GET /health`: the versions serving; no key needed.
- `GET /metrics`: Prometheus's text format (flows/gateway/metrics.py); no key needed unless
  `metrics_public = false` (config.py says why).
- `POST /admin/upstream`, `DELETE /admin/canary`: switch the primary or set a canary by hand
  (admin keys only); in managed mode promotions do this on their own (flows/gateway/watch.py).
  `POST /admin/flush`: ship the spool now rather than at the next size or age mark.

Every check happens before anything reaches the upstream: key (401), the key's request
rate (429, flows/gateway/limits.py), size (413), JSON (400: flows/json_body.py), shape
(422). The key comes first, so a caller without one costs no body read or parse. Keys are
compared in constant time and never logged: the call log holds the request body only, and
uvicorn's access log holds no headers. Any other path answers in OpenAI's error shape too.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4
from starlette.exceptions import HTTPException

from flows.gateway import calls
from flows.gateway.config import GatewayConfig
from flows.gateway.limits import RateLimiter
from flows.gateway.metrics import CallMeter, GatewayMetrics, State
from flows.gateway.replicas import forwarded, pass_feedback_on
from flows.gateway.responses import respond
from flows.gateway.shipping import Shipper, ShippingConfig
from flows.gateway.spool import Spool, UnknownCall, UnknownChoice
from flows.gateway.upstreams import Upstream, UpstreamError, UpstreamPool, base_url, probe
from flows.http_server import CLIENT_IDLE_S
from flows.json_body import parse_json_body
from storage.settings import LakeSettings
from tasks.ingest.gateway_records import feedback_problem
from tasks.ingest.responses_api import request_problem

log = logging.getLogger("flywheel.gateway")


def error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> JSONResponse:
    """OpenAI's error shape, so the SDK raises its usual exceptions with this message."""
    return JSONResponse({"error": {"message": message, "type": kind, "code": code}}, status_code=status)


def spool_folder(cfg: GatewayConfig, settings: LakeSettings) -> Path:
    return Path(cfg.spool) if cfg.spool else settings.home / "gateway" / "spool"


class Gateway:
    """What the routes share: config, spool, shipper, upstreams, one HTTP client."""

    def __init__(self, cfg: GatewayConfig, settings: LakeSettings) -> None:
        if not cfg.client_keys:
            raise ValueError("the gateway needs client keys: set FLYWHEEL_GATEWAY_KEYS (comma-separated) "
                             "or [gateway] keys; it will not serve the model to anyone without one")
        self.cfg, self.settings = cfg, settings
        self.spool: Spool | None = None
        self.shipper: Shipper | None = None
        self.pool: UpstreamPool | None = None
        self.client: httpx.AsyncClient | None = None
        self.watcher: asyncio.Task | None = None
        self.watch = None  # managed mode's ProductionWatch
        self.limiter = RateLimiter(cfg.replica_rate_rps, cfg.burst) if cfg.rate_limit_rps else None
        self.metrics = GatewayMetrics()

    async def start(self) -> None:
        if not log.handlers:  # swaps and watch errors go where uvicorn's own messages go
            log.handlers, log.propagate = list(logging.getLogger("uvicorn").handlers), False
            log.setLevel(logging.INFO)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(self.cfg.upstream_timeout_s, connect=10.0),
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64,
                                                            keepalive_expiry=CLIENT_IDLE_S))
        self.spool = Spool(spool_folder(self.cfg, self.settings))
        self.shipper = Shipper(self.spool, self.settings,
                               ShippingConfig(max_bytes=self.cfg.ship_max_bytes, max_age_s=self.cfg.ship_max_age_s,
                                              keep_index_s=self.cfg.feedback_days * 86400))
        self.shipper.start()  # ships what a previous run left (a crash, a kill) first
        if self.cfg.upstream:
            self.pool = UpstreamPool(await self.external(self.cfg.upstream, self.cfg.upstream_version))
        else:
            from flows.gateway.watch import ProductionWatch

            self.watch = ProductionWatch(self)
            self.pool = UpstreamPool(await self.watch.first_upstream())
            self.watcher = asyncio.create_task(self.watch.run())

    async def external(self, url: str, version: str = "") -> Upstream:
        """An upstream the gateway does not own, named by URL; its version is `version` or
        the first model it lists."""
        url = base_url(url)
        ids = await probe(self.client, url)
        return Upstream(version or ids[0], url, ids[0])

    async def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()
            await asyncio.to_thread(self.watch.close)
        if self.shipper is not None:
            await asyncio.to_thread(self.shipper.stop)  # ships everything still in the spool
        if self.spool is not None:
            self.spool.close()
        if self.pool is not None:
            for upstream in self.pool.owned():
                await asyncio.to_thread(upstream.stop)
        if self.client is not None:
            await self.client.aclose()

    def authorized(self, request: Request, keys: frozenset[str]) -> bool:
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        presented = key.strip().encode()
        # every key is compared, so timing says nothing about which one almost matched
        return scheme.lower() == "bearer" and sum(hmac.compare_digest(presented, k.encode()) for k in keys) > 0

    def refuse(self, request: Request, admin: bool = False) -> JSONResponse | None:
        """The 401 for a request without a client key (or an admin key), else None."""
        if admin and not (self.cfg.admin_key_set and self.authorized(request, self.cfg.admin_key_set)):
            return error(401, "admin routes need an admin key (FLYWHEEL_GATEWAY_ADMIN_KEYS)", code="invalid_api_key")
        if not admin and not self.authorized(request, self.cfg.client_keys):
            return error(401, "missing or unknown API key", code="invalid_api_key")
        return None

    def throttle(self, request: Request, api: str) -> JSONResponse | None:
        """The 429 for a key past its request rate, else None (takes one request from its bucket).
        Feedback another replica passes on counts at both: the header that marks it is the
        client's to set too, so it buys no exemption."""
        if self.limiter is None:
            return None
        wait_s = self.limiter.wait_s(request.headers.get("authorization", ""))
        if not wait_s:
            return None
        self.metrics.rate_limited.labels(api).inc()
        share = (f" (this replica's share of the cluster's {self.cfg.rate_limit_rps:g})"
                 if self.cfg.replicas_sharing > 1 else "")
        response = error(429, f"rate limit of {self.cfg.replica_rate_rps:g} requests/s{share} (burst {self.cfg.burst}) "
                              f"for this key; retry in {wait_s:.2f} s", kind="rate_limit_error",
                         code="rate_limit_exceeded")
        response.headers.update(self.limiter.headers(wait_s))
        return response

    def too_large(self) -> JSONResponse:
        # A multimodal app's photo inlined as a base64 data: URL is the commonest body past the
        # limit: the 413 says which setting raises it, since the body is logged whole too.
        return error(413, f"request body over {self.cfg.max_request_bytes} bytes (the gateway's max_request_bytes, "
                          "FLYWHEEL_GATEWAY_MAX_REQUEST_BYTES; images inlined as base64 data: URLs count too)")

    async def read_json(self, request: Request) -> dict | JSONResponse:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.cfg.max_request_bytes:
            return self.too_large()
        body = bytearray()
        async for part in request.stream():  # a body without (or lying about) its length is counted too
            body += part
            if len(body) > self.cfg.max_request_bytes:
                return self.too_large()
        try:
            parsed = parse_json_body(bytes(body))
        except ValueError as exc:
            return error(400, f"request body is not JSON: {exc}")
        return parsed if isinstance(parsed, dict) else error(400, "request body must be a JSON object")

    async def scrape(self) -> bytes:
        """The metrics, with what the spool, shipper and pool count read now."""
        unshipped = await asyncio.to_thread(self.spool.unshipped)  # a read that may wait for the shipper's
        pool, in_flight = self.pool, {}
        for role, upstream in (("primary", pool.primary), ("canary", pool.canary),
                               *(("retiring", u) for u in pool.retiring)):
            if upstream is not None:  # a retiring upstream may be of a version still serving
                in_flight[role, upstream.version] = in_flight.get((role, upstream.version), 0) + upstream.in_flight
        return self.metrics.exposition(State(unshipped, in_flight, dict(pool.swaps), self.shipper.batches_shipped,
                                             self.shipper.failures))


def chat_problem(body: dict, cfg: GatewayConfig) -> str | None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "`messages` must be a non-empty list of chat messages"
    if len(messages) > cfg.max_messages:
        return f"at most {cfg.max_messages} messages per request, got {len(messages)}"
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        return "every message must be an object with a `role`"
    if body.get("model") not in (None, cfg.model_name):
        return f"unknown model {body.get('model')!r}; this gateway serves {cfg.model_name!r}"
    if body.get("stream") not in (None, True, False):
        return f"`stream` must be true or false, got {body['stream']!r}"
    if body.get("stream_options") is not None and not isinstance(body["stream_options"], dict):
        return "`stream_options` must be an object, e.g. {\"include_usage\": true}"
    return None


def responses_problem(body: dict, cfg: GatewayConfig) -> str | None:
    """Why a Responses API request is not served here, or None: the gateway logs every
    call as the conversation it is, so what would leave that conversation elsewhere
    (a response stored upstream, a conversation object, a background job) is refused."""
    for name in ("previous_response_id", "conversation"):
        if body.get(name) is not None:
            return (f"`{name}` is not served: this gateway stores no responses; send the whole conversation "
                    "as `input` (earlier turns' output items included) and leave it out")
    if body.get("background"):
        return "`background` responses are not served: make the call in the foreground (or stream it)"
    if isinstance(body.get("input"), list) and len(body["input"]) > cfg.max_messages:
        return f"at most {cfg.max_messages} input items per request, got {len(body['input'])}"
    if body.get("model") not in (None, cfg.model_name):
        return f"unknown model {body.get('model')!r}; this gateway serves {cfg.model_name!r}"
    if body.get("stream") not in (None, True, False):
        return f"`stream` must be true or false, got {body['stream']!r}"
    return request_problem(body)


def create_app(cfg: GatewayConfig, settings: LakeSettings) -> FastAPI:
    gateway = Gateway(cfg, settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = FastAPI(title="flywheel gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.gateway = gateway

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", **gateway.pool.versions()}

    @app.get("/v1/models")
    async def models(request: Request):
        if refused := gateway.refuse(request):
            return refused
        return {"object": "list", "data": [{"id": cfg.model_name, "object": "model", "owned_by": "flywheel",
                                            "created": 0, "version": gateway.pool.primary.version}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await serve_call(gateway, request, gateway.metrics.call("chat"), chat_problem, calls.complete)

    @app.post("/v1/responses")
    async def responses(request: Request):
        return await serve_call(gateway, request, gateway.metrics.call("responses"), responses_problem, respond)

    @app.post("/v1/feedback")
    async def feedback(request: Request):
        answer = await record_feedback(gateway, request)
        status = answer.status_code if isinstance(answer, JSONResponse) else 200
        gateway.metrics.feedback_requests.labels(str(status)).inc()
        return answer

    @app.get("/metrics")
    async def metrics(request: Request):
        if not cfg.metrics_public and (refused := gateway.refuse(request, admin=True)):
            return refused
        return Response(await gateway.scrape(), media_type=CONTENT_TYPE_PLAIN_0_0_4)

    @app.exception_handler(HTTPException)
    async def no_such_route(_request: Request, exc: HTTPException) -> JSONResponse:
        return error(exc.status_code, f"{exc.detail}: this gateway serves /v1/chat/completions, /v1/responses, "
                                      "/v1/models, /v1/feedback, /health and /metrics", code="unknown_route")

    add_admin_routes(app, gateway)
    return app


async def serve_call(gateway: Gateway, request: Request, meter: CallMeter,
                     problem_of: Callable[[dict, GatewayConfig], str | None], forward: Callable[..., Awaitable]):
    """One call of an API: checked, then forwarded (`calls.complete`, `respond`); counted once
    at its end: here, or by a stream when it is over (calls.py: UpstreamRelease)."""
    cfg = gateway.cfg
    try:
        if refused := gateway.refuse(request) or gateway.throttle(request, meter.api):
            response = refused
        elif isinstance(body := await gateway.read_json(request), JSONResponse):
            response = body
        else:
            meter.stream = body.get("stream") is True
            problem = problem_of(body, cfg)
            response = error(422, problem) if problem else await forward(
                body, cfg.model_name, gateway.pool, gateway.client, gateway.spool, meter, cfg.replica,
                gone=request.is_disconnected)
    except asyncio.CancelledError:  # the client left and the server gave up on the handler
        meter.end(499)
        raise
    except Exception:  # a bug or a failed spool: FastAPI answers 500; counted, then raised on as it was
        meter.end(500)
        raise
    if not isinstance(response, calls.LeasedStream):
        meter.end(response.status_code)
    return response


def _content(record: dict) -> tuple:
    # A stored record from before feedback named choices has none: it was about choice 0.
    return (*(record.get(k) for k in ("label", "score", "correction", "comment")), record.get("choice") or 0)


async def record_feedback(gateway: Gateway, request: Request) -> dict | JSONResponse:
    """`POST /v1/feedback`: checked, passed on to the replica that logged the call, or
    spooled here (idempotent per completion id)."""
    cfg = gateway.cfg
    if refused := gateway.refuse(request) or gateway.throttle(request, "feedback"):
        return refused
    body = await gateway.read_json(request)
    if isinstance(body, JSONResponse):
        return body
    problem = feedback_problem(body)
    if problem:
        return error(422, problem)
    owner = calls.replica_of(body["id"])
    if owner and owner != cfg.replica and not forwarded(request):
        if owner not in cfg.peer_urls:
            return error(404, f"completion {body['id']!r} was logged by replica {owner!r}, which this gateway "
                              "has no address for (FLYWHEEL_GATEWAY_PEERS)", code="unknown_completion")
        return await pass_feedback_on(gateway.client, owner, cfg.peer_urls[owner], body, request, cfg.replica)
    record = {"type": "feedback", "id": body["id"], "ts": calls.utc_now(), "label": body.get("label"),
              "score": body.get("score"), "correction": body.get("correction"), "comment": body.get("comment"),
              "choice": body.get("choice") or 0}
    try:
        stored, created = await gateway.spool.append_feedback(record)
    except UnknownCall:
        return error(404, f"no call with completion id {body['id']!r} was logged by this gateway",
                     code="unknown_completion")
    except UnknownChoice as exc:
        return error(422, str(exc), code="unknown_choice")
    if created:
        gateway.metrics.feedback_recorded(record)
    if not created and _content(stored) != _content(record):
        return error(409, f"feedback for {body['id']!r} was already recorded (at {stored['ts']}) with "
                          "other content; the first feedback for a completion is kept", code="conflict")
    return {"id": body["id"], "recorded": created}


def add_admin_routes(app: FastAPI, gateway: Gateway) -> None:
    """The routes that change what serves or ship the spool now: admin keys only."""

    @app.post("/admin/upstream")
    async def admin_upstream(request: Request):
        if refused := gateway.refuse(request, admin=True):
            return refused
        body = await gateway.read_json(request)
        if isinstance(body, JSONResponse):
            return body
        if not isinstance(body.get("url"), str) or not isinstance(body.get("version", ""), str):
            return error(422, "needs `url`: the new upstream's base URL; optional `version` (a string: the "
                              "version it serves, logged with each call) and `canary_share`")
        share = body.get("canary_share", 0)
        try:
            upstream = await gateway.external(body["url"], body.get("version") or "")
            if share:
                await gateway.pool.set_canary(upstream, float(share), gateway.client, gateway.cfg.drain_s)
            else:
                await gateway.pool.switch(upstream, gateway.client, gateway.cfg.drain_s)
        except (UpstreamError, TypeError, ValueError) as exc:
            return error(422, str(exc))
        return gateway.pool.versions()

    @app.post("/admin/flush")
    async def admin_flush(request: Request):
        """Ship everything in the spool now (a batch job that must see its calls in the lake)."""
        if refused := gateway.refuse(request, admin=True):
            return refused
        return {"shipped": await asyncio.to_thread(gateway.shipper.ship_all)}

    @app.delete("/admin/canary")
    async def admin_canary(request: Request):
        if refused := gateway.refuse(request, admin=True):
            return refused
        await gateway.pool.set_canary(None, 0, gateway.client, gateway.cfg.drain_s)
        return gateway.pool.versions()
