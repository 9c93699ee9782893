"""How long the project's HTTP servers keep an idle connection: the gateway and the webhook
under uvicorn, and the `vllm serve` processes the gateway starts."""
from __future__ import annotations

# uvicorn's default (5 s) equals the idle expiry of pooled clients (httpx, the openai SDK)
# and is far below proxies' (nginx and load balancers: 60 s). A server that closes an idle
# connection just as a client sends on it resets a request that never reached the app
# ("connection reset by peer"): seen in the webhook's 1,000-replay test on a loaded machine.
KEEP_ALIVE_S = 75

# The gateway's own pool drops an idle connection to an upstream (or a peer replica) after
# this, well before any server it may reach closes it (uvicorn's 5 s default included).
CLIENT_IDLE_S = 2.0
