"""Request-rate limits per client key: a token bucket each, in the gateway's memory.

A key may send `rate` requests a second on average and `burst` at once; past that it gets
429 with `retry-after` (whole seconds, HTTP's form) and `retry-after-ms` (what the `openai`
SDK reads first), so a client that retries waits exactly as long as it must. The buckets
are keyed by a digest of the key, not the key, so nothing in memory or in a traceback
prints one. A replica counts only its own traffic: no counter is shared across machines.
By default N replicas behind a balancer allow N times the rate; with `[gateway]
rate_limit_scope = "cluster"` each enforces 1/N of it (config.py: `replica_rate_rps`).
"""
from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable


class RateLimiter:
    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a rate limit needs rate > 0 and burst >= 1, got {rate} and {burst}")
        self.rate, self.burst, self.clock = rate, burst, clock
        self._buckets: dict[bytes, tuple[float, float]] = {}  # digest -> (tokens, when counted)
        self._lock = threading.Lock()

    def wait_s(self, key: str) -> float:
        """Take one request from `key`'s bucket: 0 when it may go now, else the seconds
        until it may (and nothing is taken)."""
        digest, now = hashlib.sha256(key.encode()).digest(), self.clock()
        with self._lock:
            tokens, then = self._buckets.get(digest, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - then) * self.rate)
            if tokens >= 1.0:
                self._buckets[digest] = (tokens - 1.0, now)
                return 0.0
            self._buckets[digest] = (tokens, now)
            return (1.0 - tokens) / self.rate

    def headers(self, wait_s: float) -> dict[str, str]:
        return {"retry-after": str(max(1, math.ceil(wait_s))), "retry-after-ms": str(max(1, math.ceil(wait_s * 1000)))}
