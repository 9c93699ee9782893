"""`flywheel webhook`: signed HTTP triggers for deployments (Prefect OSS has none).

- `POST /hooks/{deployment}`: body = the deployment's parameters as JSON, signed
  as flows/webhook/signatures.py describes. 202 {"flow_run_id": ...} when a run was created.
- `POST /hooks/s3-events`: MinIO/S3 bucket notifications (signed, or MinIO's
  `Authorization: Bearer <FLYWHEEL_WEBHOOK_TOKEN>`); new log files under the landing
  prefix become one `ingest` run for exactly those objects.
- `GET /healthz`.

Every check happens before anything is created, in this order: size (413), signature
(401), deployment (404), JSON (400), parameters (422, strict: JSON's own types, no
coercion of `true` or "3" to a count). A delivery is identified by
the `Idempotency-Key` header, else `X-GitHub-Delivery`, else `X-Request-Id`, else
the signed timestamp and body; a replay answers the first response and creates no
second run, across restarts (flows/webhook/deliveries.py). The signature covers the body and
timestamp, not the path: a body signed for one deployment must also validate
against the other's parameter model to be accepted there.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from flows.webhook import signatures
from flows.webhook.deliveries import DeliveryStore
from flows.deployments import DEPLOYMENTS, IngestParams
from flows.json_body import parse_json_body
from flows.webhook.s3_events import EventError, landed_objects
from storage.settings import LakeSettings

KEY_HEADERS = ("idempotency-key", "x-github-delivery", "x-request-id")


@dataclass(frozen=True)
class WebhookConfig:
    """`[webhook]` in flywheel.toml; secrets belong in the environment (`FLYWHEEL_WEBHOOK_*`)."""

    secret: str = field(default="", repr=False)
    """FLYWHEEL_WEBHOOK_SECRET: HMAC secrets, comma-separated; all are accepted (rotation)."""
    token: str = field(default="", repr=False)
    """FLYWHEEL_WEBHOOK_TOKEN: bearer tokens MinIO may send to /hooks/s3-events; empty = signature only."""
    tolerance_s: int = 300
    """How far a signed timestamp may be from now, either way."""
    max_body_bytes: int = 1 << 20
    replay_wait_s: float = 30.0
    """How long a duplicate waits for the first delivery's response before answering 409."""
    store: str = ""
    """SQLite file remembering deliveries; empty = FLYWHEEL_HOME/webhook-deliveries.sqlite."""
    retention_days: float = 7.0

    def __post_init__(self) -> None:
        if not self.secrets:
            raise ValueError("FLYWHEEL_WEBHOOK_SECRET is empty: set one or more comma-separated "
                             "secrets, e.g. `openssl rand -hex 32`")
        if any(len(s) < 16 for s in self.secrets + self.tokens):
            raise ValueError("webhook secrets and tokens must be at least 16 characters (`openssl rand -hex 32`)")
        if not 1 <= self.tolerance_s <= 3600:
            raise ValueError(f"tolerance_s must be within 1..3600 seconds, got {self.tolerance_s}")
        if not 1 <= self.max_body_bytes <= 64 << 20:
            raise ValueError(f"max_body_bytes must be within 1..64 MiB, got {self.max_body_bytes}")

    @property
    def secrets(self) -> tuple[str, ...]:
        return tuple(s.strip() for s in self.secret.split(",") if s.strip())

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(s.strip() for s in self.token.split(",") if s.strip())


class Rejection(Exception):
    def __init__(self, status_code: int, detail: Any) -> None:
        super().__init__(detail)
        self.status_code, self.detail = status_code, detail


class Hooks:
    """What the routes share: config, the delivery store, one Prefect client."""

    def __init__(self, cfg: WebhookConfig, settings: LakeSettings) -> None:
        self.cfg, self.settings = cfg, settings
        self.store_path = Path(cfg.store) if cfg.store else settings.home / "webhook-deliveries.sqlite"
        self.store: DeliveryStore | None = None
        self.client: Any = None
        self.deployment_ids: dict[str, Any] = {}

    async def read_body(self, request: Request) -> bytes:
        limit = self.cfg.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise Rejection(413, f"body larger than {limit} bytes")
        body = bytearray()
        async for chunk in request.stream():  # a lying or absent Content-Length is caught here
            body += chunk
            if len(body) > limit:
                raise Rejection(413, f"body larger than {limit} bytes")
        return bytes(body)

    def authenticate(self, request: Request, body: bytes) -> int:
        try:
            return signatures.verify(request.headers.get("flywheel-signature"), body, self.cfg.secrets,
                                     time.time(), self.cfg.tolerance_s)
        except signatures.SignatureError as exc:
            raise Rejection(401, str(exc)) from None

    async def run_once(self, key: str, body_sha256: str, deployment: str, parameters: dict) -> JSONResponse:
        """Create the run unless this delivery was seen; a duplicate gets the first answer."""
        deadline = time.monotonic() + self.cfg.replay_wait_s
        delay = 0.01
        while True:
            seen = self.store.reserve(key, body_sha256)
            if seen.outcome == "owner":
                break
            if seen.outcome == "done":
                return JSONResponse(json.loads(seen.response), seen.status_code,
                                    headers={"Idempotent-Replayed": "true"})
            if seen.outcome == "conflict":
                raise Rejection(422, "this delivery key was already used with a different body")
            if time.monotonic() > deadline:
                raise Rejection(409, "a delivery with this key is still being processed; retry later")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)
        try:
            run_id = await self.create_run(deployment, parameters, key)
        except BaseException:
            self.store.release(key)  # the sender's retry must be able to succeed
            raise
        content = {"flow_run_id": run_id, "deployment": deployment}
        self.store.finish(key, 202, json.dumps(content))
        return JSONResponse(content, 202)

    async def create_run(self, deployment: str, parameters: dict, key: str) -> str:
        import httpx
        from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError

        try:
            deployment_id = await self.deployment_id(deployment)
            run = await self.client.create_flow_run_from_deployment(
                deployment_id, parameters=parameters, tags=["webhook"],
                # the server's own dedup: a stale reservation taken over cannot make a second run
                idempotency_key=f"flywheel-webhook:{key}")
        except ObjectNotFound:
            self.deployment_ids.pop(deployment, None)
            raise Rejection(503, f"deployment {deployment!r} is not registered; run `flywheel serve`") from None
        except PrefectHTTPStatusError as exc:
            raise Rejection(502, f"Prefect refused the run: {exc.response.text[:500]}") from None
        except httpx.HTTPError as exc:
            raise Rejection(503, f"Prefect server unreachable: {type(exc).__name__}") from None
        return str(run.id)

    async def deployment_id(self, name: str) -> Any:
        from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

        if name not in self.deployment_ids:
            found = await self.client.read_deployments(
                deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[name])), limit=1)
            if not found:
                raise Rejection(503, f"deployment {name!r} is not registered; run `flywheel serve`")
            self.deployment_ids[name] = found[0].id
        return self.deployment_ids[name]


def delivery_key(request: Request, scope: str, timestamp: int, body: bytes) -> str:
    for header in KEY_HEADERS:
        value = request.headers.get(header)
        if value:
            if len(value) > 200:
                raise Rejection(400, f"{header} longer than 200 characters")
            return f"{scope}:key:{value}"
    # No key: the signed bytes themselves, so a captured request replayed verbatim
    # inside the timestamp window creates nothing either.
    return f"{scope}:sig:{hashlib.sha256(str(timestamp).encode() + b'.' + body).hexdigest()}"


def parse_json(body: bytes) -> Any:
    try:
        return parse_json_body(body)
    except ValueError as exc:
        raise Rejection(400, f"body is not JSON: {exc}") from None


def create_app(cfg: WebhookConfig, settings: LakeSettings) -> FastAPI:
    hooks = Hooks(cfg, settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        from prefect.client.orchestration import get_client

        hooks.store = DeliveryStore(hooks.store_path)
        hooks.store.prune(cfg.retention_days * 86400)
        async with get_client() as client:
            hooks.client = client
            yield
        hooks.store.close()

    app = FastAPI(title="flywheel webhook", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(Rejection)
    async def rejected(request: Request, exc: Rejection) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, exc.status_code)

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok", "deployments": sorted(DEPLOYMENTS)}

    @app.post("/hooks/s3-events")
    async def s3_events(request: Request) -> JSONResponse:
        body = await hooks.read_body(request)
        if not signatures.verify_bearer(request.headers.get("authorization"), cfg.tokens):
            hooks.authenticate(request, body)
        try:
            landed = landed_objects(parse_json(body), settings)
        except EventError as exc:
            raise Rejection(422, str(exc)) from None
        if not landed.uris:
            return JSONResponse({"flow_run_id": None, "ignored": landed.ignored}, 200)
        params = IngestParams(paths=landed.uris).model_dump(exclude_unset=True)
        # The same objects notified twice (MinIO retries) are one delivery.
        digest = hashlib.sha256("\n".join(f"{u} {m}" for u, m in zip(landed.uris, landed.markers)).encode())
        return await hooks.run_once(f"s3-events:{digest.hexdigest()}", digest.hexdigest(), "ingest", params)

    @app.post("/hooks/{deployment}")
    async def trigger(deployment: str, request: Request) -> JSONResponse:
        body = await hooks.read_body(request)
        timestamp = hooks.authenticate(request, body)
        spec = DEPLOYMENTS.get(deployment)
        if spec is None:
            raise Rejection(404, f"no deployment {deployment!r}; known: {sorted(DEPLOYMENTS)}")
        try:
            # strict: a sender's `true` or "3" for a count, or 1 for apply_gate, is a bug on its
            # side that lax coercion would turn into a run it did not mean
            params = spec.params.model_validate(parse_json(body), strict=True)
        except ValidationError as exc:
            raise Rejection(422, exc.errors(include_url=False, include_context=False, include_input=False)) from None
        key = delivery_key(request, deployment, timestamp, body)
        return await hooks.run_once(key, hashlib.sha256(body).hexdigest(), deployment,
                                    params.model_dump(exclude_unset=True))

    return app
