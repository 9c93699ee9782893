"""`[gateway]` in flywheel.toml (or FLYWHEEL_GATEWAY_* variables): how the gateway serves and logs."""
from __future__ import annotations

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
    serve_max_model_len: int = 4096
    serve_kv_cache_gib: int = 1
    serve_tool_parser: str = "pythonic"
    """vLLM's tool-call parser for the servers the gateway starts (`--tool-call-parser`): without
    one vLLM refuses any request with tools. `pythonic` needs no special tokens, so it works with
    every tokenizer; a model family trained on its own format wants its own (hermes, llama3_json,
    ...). Empty = tools off."""

    def __post_init__(self) -> None:
        if not 0 <= self.canary_share < 1:
            raise ValueError(f"canary_share must be in [0, 1), got {self.canary_share}")
        for name in ("max_request_bytes", "max_messages", "ship_max_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in ("upstream_timeout_s", "ship_max_age_s", "watch_s", "drain_s", "feedback_days"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")

    @property
    def client_keys(self) -> frozenset[str]:
        return _split(self.keys)

    @property
    def admin_key_set(self) -> frozenset[str]:
        return _split(self.admin_keys)


def _split(keys: str) -> frozenset[str]:
    return frozenset(k.strip() for k in keys.split(",") if k.strip())
