"""Who may trigger a run: the webhook's signature and token checks.

Scheme (Stripe's): header `Flywheel-Signature: t=<unix seconds>,v1=<hex>` where
hex = HMAC-SHA256(secret, "<t>.<raw body>"). Several `v1=` entries and several
secrets are accepted so a secret can be rotated without dropping deliveries. The
timestamp bounds how long a captured request stays replayable; the webhook's
delivery store (flows/webhook/deliveries.py) closes that window too.

Every comparison goes through `hmac.compare_digest`, so response time does not
reveal how many leading characters of a guess were right.
"""
from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence


class SignatureError(ValueError):
    """The request is not signed by a holder of a current secret; says why (never leaks a secret)."""


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The header value a sender puts in `Flywheel-Signature`."""
    return f"t={timestamp},v1={_digest(secret, timestamp, body)}"


def _digest(secret: str, timestamp: int, body: bytes) -> str:
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def parse_header(header: str) -> tuple[int, list[str]]:
    """'t=1700000000,v1=ab..,v1=cd..' -> (1700000000, ['ab..', 'cd..'])."""
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t":
            # ASCII digits only (str.isdigit takes "²" too) and no more than a clock can
            # show: a 400-digit t would overflow the float compared with now
            if not (value.isascii() and value.isdigit() and len(value) <= 12):
                raise SignatureError("Flywheel-Signature: t must be unix seconds")
            timestamp = int(value)
        elif key == "v1" and value:
            candidates.append(value.strip().lower())
    if timestamp is None or not candidates:
        raise SignatureError("Flywheel-Signature must look like t=<unix seconds>,v1=<hex hmac-sha256>")
    return timestamp, candidates


def verify(header: str | None, body: bytes, secrets: Sequence[str], now: float, tolerance_s: int) -> int:
    """Check the header against every secret; return the signed timestamp."""
    if not header:
        raise SignatureError("missing Flywheel-Signature header")
    timestamp, candidates = parse_header(header)
    if abs(now - timestamp) > tolerance_s:
        raise SignatureError(f"timestamp outside the allowed ±{tolerance_s}s (check the sender's clock)")
    matched = False
    for secret in secrets:
        expected = _digest(secret, timestamp, body)
        for candidate in candidates:
            # no early exit: the work done does not depend on which pair matched
            matched |= hmac.compare_digest(expected, candidate)
    if not matched:
        raise SignatureError("signature does not match the body with any current secret")
    return timestamp


def verify_bearer(header: str | None, tokens: Sequence[str]) -> bool:
    """`Authorization: Bearer <token>`, as MinIO's webhook target sends its auth_token."""
    if not header or not tokens:
        return False
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(value.strip().encode(), token.encode())
    return matched
