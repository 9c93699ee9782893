"""What operators watch: the gateway's Prometheus metrics, served on `GET /metrics`.

Each gateway has a registry of its own (not prometheus_client's global one: tests start
several apps in one process, and nothing else in this process should show up as the
gateway's). Every name starts `flywheel_gateway_`; labels take a bounded set of values
(an API, a status, a model version, which changes only on promotion, an error class),
never a completion id, a key or a path.

A call is counted once, at its end (`CallMeter.end`): answered and logged, refused by the
gateway (401, 413, 400, 422, 429) or by the upstream (its status, passed on), failed by
the upstream (502), its client gone (499). `status` is the status the response went out
with, except a stream (sent with 200 before its end was known): 200 only when logged,
502 when the upstream failed it midway, 499 when its client left first. A call sent on
to the other upstream (calls.py: `send_call`) is counted once, under the version that
answered; the one that could not be reached is in `fallbacks` and `upstream_errors`.

  flywheel_gateway_calls_total{api, stream, status, version}    version "" = refused before an upstream
  flywheel_gateway_call_seconds{api, stream, version}           route entered to response complete, calls
                                                                 that reached an upstream
  flywheel_gateway_first_byte_seconds{api, version}             streams: to the first event sent
  flywheel_gateway_tokens_total{kind, version}                  kind prompt | completion, logged calls
  flywheel_gateway_feedback_total{label, negative}              feedback recorded (label good | bad | none)
  flywheel_gateway_feedback_requests_total{status}              POST /v1/feedback answers, any outcome
  flywheel_gateway_rate_limited_total{api}                      429s (chat, responses, feedback)
  flywheel_gateway_upstream_errors_total{version, error}        error: the exception's class (httpx's;
                                                                 JSONDecodeError, ValueError: a reply that
                                                                 is no JSON object), or error_event
  flywheel_gateway_fallbacks_total{version}                     calls sent on from this unreached version
  flywheel_gateway_in_flight{role, version}                     leases: primary | canary | retiring
  flywheel_gateway_swaps_total{kind}                            reload | switch | canary (upstreams.py)
  flywheel_gateway_spool_unshipped_records, flywheel_gateway_spool_unshipped_bytes,
  flywheel_gateway_spool_oldest_unshipped_age_seconds      batched or not, till written to the landing
  flywheel_gateway_batches_shipped_total, flywheel_gateway_shipping_failures_total

Recording costs 9-26 us a call on the 2-core dev machine, the most with tests running
beside it (`bench/gateway.py --metrics-only`): at most 0.4% of the ~6 ms the gateway adds
to a call. The spool, the shipper and the pool keep their own counts; they are read at
scrape time, so their hot paths do not know this module exists.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tasks.ingest.gateway_records import is_negative

PREFIX = "flywheel_gateway_"
# From a refusal's microseconds to a long generation's minutes (upstream_timeout_s is 600).
SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclass(frozen=True)
class State:
    """What the gateway's parts count themselves, read at one scrape."""
    unshipped: tuple[int, int, float | None]
    """Spool.unshipped(): records, bytes, time.time() of the oldest append."""
    in_flight: dict[tuple[str, str], int]
    """(role, version) -> leases."""
    swaps: dict[str, int]
    batches_shipped: int
    shipping_failures: int


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.calls = Counter(PREFIX + "calls", "Calls ended, by API, streaming, status and the model version "
                             "that served them ('' = refused before an upstream)",
                             ("api", "stream", "status", "version"), registry=r)
        self.seconds = Histogram(PREFIX + "call_seconds", "Time from a call's arrival to its response complete, "
                                 "calls that reached an upstream", ("api", "stream", "version"), buckets=SECONDS,
                                 registry=r)
        self.first_byte = Histogram(PREFIX + "first_byte_seconds", "Time from a streamed call's arrival to its "
                                    "first event sent", ("api", "version"), buckets=SECONDS, registry=r)
        self.tokens = Counter(PREFIX + "tokens", "Tokens of logged calls (their usage)", ("kind", "version"),
                              registry=r)
        self.feedback = Counter(PREFIX + "feedback", "Feedback recorded in this gateway's spool",
                                ("label", "negative"), registry=r)
        self.feedback_requests = Counter(PREFIX + "feedback_requests", "POST /v1/feedback answered, by status",
                                         ("status",), registry=r)
        self.rate_limited = Counter(PREFIX + "rate_limited", "Requests refused for their key's rate (429)",
                                    ("api",), registry=r)
        self.upstream_errors = Counter(PREFIX + "upstream_errors", "Upstream failures: unreached, broken, a reply "
                                       "that is no JSON object, an error event mid-stream", ("version", "error"),
                                       registry=r)
        self.fallbacks = Counter(PREFIX + "fallbacks", "Calls sent on to the other upstream because this version "
                                 "could not be reached", ("version",), registry=r)
        self._state = _StateCollector()
        r.register(self._state)

    def call(self, api: str) -> CallMeter:
        """Start measuring a call of `api` (chat, responses) that has just arrived."""
        return CallMeter(self, api)

    def feedback_recorded(self, record: dict) -> None:
        self.feedback.labels(record.get("label") or "none", "true" if is_negative(record) else "false").inc()

    def exposition(self, state: State) -> bytes:
        """The text format, with `state` as the parts' counts. Runs on the event loop with
        no await inside, so two scrapes cannot mix their states."""
        self._state.state = state
        return generate_latest(self.registry)


class CallMeter:
    """One call, from its route's first line to its end; `end` counts it, once."""

    __slots__ = ("metrics", "api", "started", "stream", "version", "first_byte_s", "usage", "status", "ended")

    def __init__(self, metrics: GatewayMetrics, api: str) -> None:
        self.metrics, self.api, self.started = metrics, api, time.perf_counter()
        self.stream = False
        self.version = ""
        """The version of the upstream the call is (or was last) leased to."""
        self.first_byte_s: float | None = None
        self.usage: dict | None = None
        """Set when the call is logged."""
        self.status = 499
        """A stream's status at its end: its relay sets 200 once logged, 502 on the upstream's failure."""
        self.ended = False

    def sending(self) -> None:
        """A stream's event is about to go out."""
        if self.first_byte_s is None:
            self.first_byte_s = time.perf_counter() - self.started

    def failed(self, version: str, error: str) -> None:
        self.metrics.upstream_errors.labels(version, error).inc()

    def fell_back(self, version: str, error: str) -> None:
        """`version` could not be reached; the call goes to the other upstream."""
        self.failed(version, error)
        self.metrics.fallbacks.labels(version).inc()

    def broke(self, version: str, exc: Exception) -> None:
        """A stream's relay raised `exc`: the upstream's failure (502) or the gateway's own (500)."""
        if isinstance(exc, httpx.HTTPError):
            self.status = 502
            self.failed(version, type(exc).__name__)
        else:
            self.status = 500

    def end(self, status: int) -> None:
        if self.ended:
            return
        self.ended = True
        m, stream = self.metrics, "true" if self.stream else "false"
        m.calls.labels(self.api, stream, str(status), self.version).inc()
        if not self.version:
            return
        m.seconds.labels(self.api, stream, self.version).observe(time.perf_counter() - self.started)
        if self.first_byte_s is not None:
            m.first_byte.labels(self.api, self.version).observe(self.first_byte_s)
        if status == 200 and isinstance(self.usage, dict):
            # chat names them prompt/completion, the Responses API input/output
            prompt = self.usage.get("prompt_tokens", self.usage.get("input_tokens"))
            completion = self.usage.get("completion_tokens", self.usage.get("output_tokens"))
            for kind, count in (("prompt", prompt), ("completion", completion)):
                if isinstance(count, int) and count > 0:
                    m.tokens.labels(kind, self.version).inc(count)


class _StateCollector:
    """The counts the spool, shipper and pool keep, as metric families at a scrape."""

    def __init__(self) -> None:
        self.state: State | None = None

    def collect(self) -> Iterator[Metric]:
        state = self.state
        if state is None:
            return
        records, size, oldest = state.unshipped
        for name, text, value in (
                ("spool_unshipped_records", "Records in the spool not shipped yet", records),
                ("spool_unshipped_bytes", "JSON bytes of the records not shipped yet", size),
                ("spool_oldest_unshipped_age_seconds", "Age of the oldest record not shipped yet (0: none)",
                 max(0.0, time.time() - oldest) if oldest is not None else 0.0)):
            yield GaugeMetricFamily(PREFIX + name, text, value=value)
        yield CounterMetricFamily(PREFIX + "batches_shipped", "Batches of the spool written to the landing",
                                  value=state.batches_shipped)
        yield CounterMetricFamily(PREFIX + "shipping_failures", "Shipping attempts that failed (retried)",
                                  value=state.shipping_failures)
        in_flight = GaugeMetricFamily(PREFIX + "in_flight", "Calls holding a lease on an upstream",
                                      labels=("role", "version"))
        for (role, version), count in sorted(state.in_flight.items()):
            in_flight.add_metric((role, version), count)
        yield in_flight
        swaps = CounterMetricFamily(PREFIX + "swaps", "Changes of the upstreams serving: reload (in place), "
                                    "switch (a new primary server), canary (set or removed)", labels=("kind",))
        for kind, count in sorted(state.swaps.items()):
            swaps.add_metric((kind,), count)
        yield swaps
