"""Feedback across replicas: a call's feedback is recorded by the replica that logged it.

Replicas behind one balancer each keep their own spool, so the replica a client's
feedback reaches may not know the call. Every id a named replica mints says who logged
it (`chatcmpl-<replica>-...`, flows/gateway/calls.py), and the replica that receives
feedback for another's call passes it on, once, with the client's own key (replicas
share client keys) and a header that stops it going further. The owner answers as it
would a direct post: recorded, already recorded (idempotent), 409 for other content, 404
for a call it never logged. An owner that cannot be reached gets the client a 503: the
feedback is not recorded anywhere, and the client can send it again.
"""
from __future__ import annotations

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse

FORWARDED_HEADER = "x-flywheel-forwarded-by"


def forwarded(request: Request) -> bool:
    return FORWARDED_HEADER in request.headers


async def pass_feedback_on(client: httpx.AsyncClient, owner: str, peer_url: str, body: dict,
                           request: Request, replica: str) -> JSONResponse:
    """POST `body` to the owner replica's /v1/feedback; its answer, status and all, or a 503."""
    try:
        response = await client.post(f"{peer_url}/v1/feedback", json=body, timeout=30.0, headers={
            "authorization": request.headers.get("authorization", ""), FORWARDED_HEADER: replica})
        return JSONResponse(response.json(), status_code=response.status_code)
    except (httpx.HTTPError, ValueError) as exc:
        return JSONResponse({"error": {
            "message": f"completion {body['id']!r} was logged by replica {owner!r}, which could not be reached "
                       f"({type(exc).__name__}: {exc}); the feedback was not recorded, send it again",
            "type": "upstream_error", "code": "replica_unreachable"}}, status_code=503)
