"""`[gateway]` in flywheel.toml (or FLYWHEEL_GATEWAY_* variables): how the gateway serves and logs."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8100
    keys: str = field(default="", repr=False)
    """FLYWHEEL_GATEWAY_KEYS: client bearer keys, comma-separated. Required: the gateway
    refuses to start without one rather than serve the model to anyone."""
    admin_keys: str = field(default="", repr=False)
    """FLYWHEEL_GATEWAY_ADMIN_KEYS: keys for /admin/* (switching upstreams, the canary);
    empty = the admin routes are off."""
    metrics_public: bool = True
    """FLYWHEEL_GATEWAY_METRICS_PUBLIC: whether `GET /metrics` answers without a key. True by
    default: Prometheus scrapers rarely carry one, and the metrics hold counts, timings and
    model versions (which /health already shows), never a key, an id or a word of a call.
    What they do tell, traffic volume and error rates, is for the operator: a gateway whose
    port the public reaches (not only a balancer's /v1 routes) sets false, and its scraper
    then sends an admin key (`authorization: credentials_file:` in Prometheus's job)."""
    upstream: str = ""
    """FLYWHEEL_GATEWAY_UPSTREAM: an OpenAI-compatible server (http://host:port) to forward
    to. Empty = the gateway starts `vllm serve` of the production model itself and follows
    every promotion."""
    upstream_version: str = ""
    """The model version an external upstream serves (logged with every call); empty = the
    first model id its /v1/models lists."""
    model_name: str = "flywheel"
    """The model id clients send and /v1/models lists; whichever version answers is logged."""
    max_request_bytes: int = 1 << 20
    max_messages: int = 256
    upstream_timeout_s: float = 600.0
    spool: str = ""
    """The spool folder; empty = FLYWHEEL_HOME/gateway/spool."""
    ship_max_bytes: int = 4 << 20
    """Ship the spool when this many bytes of records are waiting ..."""
    ship_max_age_s: float = 60.0
    """... or when the oldest waiting record is this old."""
    feedback_days: float = 30.0
    """Feedback is taken for a call at least this long after it was shipped; the spool's
    index of older calls (one row each) is pruned."""
    canary_share: float = 0.0
    """Share of traffic sent to the newest candidate model while one exists (managed mode)."""
    watch_s: float = 10.0
    """How often managed mode checks the lake for a new production model or candidate."""
    drain_s: float = 120.0
    """How long a replaced upstream may finish its in-flight calls before it is stopped."""
    swap: str = "reload"
    """How a new production model takes over from the one served (managed mode). `reload`:
    a model of the same architecture and tokenizer is loaded into the running server; new
    calls wait while the server's calls finish and the weights load (0.05 s for the tiny
    model, 0.4-0.5 s for SmolLM2-135M on CPU), and no second server's memory is needed.
    `restart`: a second server starts and takes the calls once it answers (no wait; ~45 s
    here, and two servers' memory meanwhile). Another architecture, a promoted canary
    (already warm) or a failed reload always take the restart path."""
    swap_pause_s: float = 30.0
    """`reload`: how long new calls may wait for the server's calls to finish; past it the
    restart path is taken and the waiting calls go on to the old model."""
    rate_limit_rps: float = 0.0
    """Requests a second each client key may send on average (chat completions and feedback);
    0 = no limit. Past it a call gets 429 with `retry-after` (flows/gateway/limits.py)."""
    rate_limit_burst: int = 0
    """Requests a key may send at once before the rate applies; 0 = one second's worth."""
    rate_limit_scope: str = "replica"
    """`replica`: each gateway allows a key the rate and burst (N replicas: N times them in
    all). `cluster`: they are the whole cluster's, and each replica allows 1/N of them, N =
    this gateway and its `peers`: exact when the balancer spreads a key's calls evenly (round
    robin), conservative when it pins a key to one replica (1/N of the rate)."""
    replica: str = ""
    """This gateway's name among replicas behind one balancer (lowercase letters and digits).
    Set, it goes into every completion id it mints (`chatcmpl-<replica>-<hex>`), so feedback
    sent to another replica is passed to the one that logged the call (`peers`)."""
    peers: str = ""
    """The other replicas, `name=http://host:port` comma-separated: where feedback for their
    calls is passed on. Replicas share client keys: the client's own key goes with it."""
    serve_max_model_len: int = 4096
    serve_kv_cache_gib: int = 1
    """On CPU: the KV cache of each server it starts (VLLM_CPU_KVCACHE_SPACE)."""
    serve_gpu_memory_fraction: float = 0.35
    """On a GPU: the share of its memory each server it starts may take
    (`--gpu-memory-utilization`). A swap by restart runs the old and the new server side by
    side until the old one drains, so two of them, plus a canary if one is set, must fit
    beside whatever else uses that GPU (a training worker on the same device); an in-place
    swap (`swap = "reload"`) needs one, but falls back to a restart when it cannot reload."""
    serve_tool_parser: str = "pythonic"
    """vLLM's tool-call parser for the servers the gateway starts (`--tool-call-parser`): without
    one vLLM refuses any request with tools. `pythonic` needs no special tokens, so it works with
    every tokenizer; a model family trained on its own format wants its own (hermes, llama3_json,
    ...). Empty = tools off."""

    def __post_init__(self) -> None:
        if not 0 < self.serve_gpu_memory_fraction < 1:
            raise ValueError(f"serve_gpu_memory_fraction must be in (0, 1), got {self.serve_gpu_memory_fraction}")
        if not 0 <= self.canary_share < 1:
            raise ValueError(f"canary_share must be in [0, 1), got {self.canary_share}")
        for name in ("max_request_bytes", "max_messages", "ship_max_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in ("upstream_timeout_s", "ship_max_age_s", "watch_s", "drain_s", "swap_pause_s",
                     "feedback_days"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.rate_limit_rps < 0 or self.rate_limit_burst < 0:
            raise ValueError("rate_limit_rps and rate_limit_burst must be >= 0 (0: no limit, one second's worth)")
        if not self.metrics_public and not self.admin_key_set:
            raise ValueError("metrics_public = false needs admin_keys (FLYWHEEL_GATEWAY_ADMIN_KEYS): /metrics then "
                             "answers only an admin key, and with none it would answer nobody")
        if self.swap not in ("reload", "restart"):
            raise ValueError(f"swap must be 'reload' or 'restart', got {self.swap!r}")
        if self.rate_limit_scope not in ("replica", "cluster"):
            raise ValueError(f"rate_limit_scope must be 'replica' or 'cluster', got {self.rate_limit_scope!r}")
        for name in ([self.replica] if self.replica else []) + list(self.peer_urls):
            if not REPLICA_NAME.fullmatch(name):
                raise ValueError(f"replica names are 1-32 lowercase letters and digits, got {name!r}")
        if self.replica in self.peer_urls:
            raise ValueError(f"peers name this gateway's own replica {self.replica!r}")
        if self.peer_urls and not self.replica:
            raise ValueError("peers need this gateway's own `replica` name: its ids must say where they were logged")

    @property
    def client_keys(self) -> frozenset[str]:
        return _split(self.keys)

    @property
    def admin_key_set(self) -> frozenset[str]:
        return _split(self.admin_keys)

    @property
    def peer_urls(self) -> dict[str, str]:
        peers = {}
        for entry in _split(self.peers):
            name, sep, url = entry.partition("=")
            if not sep or not url.strip().startswith(("http://", "https://")):
                raise ValueError(f"peers entries are name=http://host:port, got {entry!r}")
            peers[name.strip()] = url.strip().rstrip("/")
        return peers

    @property
    def replicas_sharing(self) -> int:
        """How many gateways share the rate limit: this one and its peers, or itself alone."""
        return 1 + len(self.peer_urls) if self.rate_limit_scope == "cluster" else 1

    @property
    def replica_rate_rps(self) -> float:
        """The rate this gateway enforces for a key: its share of `rate_limit_rps`."""
        return self.rate_limit_rps / self.replicas_sharing

    @property
    def burst(self) -> int:
        """The burst this gateway allows a key: its share, at least one request."""
        whole = self.rate_limit_burst or math.ceil(self.rate_limit_rps)
        return max(1, math.ceil(whole / self.replicas_sharing))


REPLICA_NAME = re.compile(r"[a-z0-9]{1,32}")


def _split(keys: str) -> frozenset[str]:
    return frozenset(k.strip() for k in keys.split(",") if k.strip())
