"""How the project's HTTP servers (gateway, webhook) run under uvicorn."""
from __future__ import annotations

# Idle keep-alive connections stay open this long. uvicorn's default (5 s) equals the idle
# expiry of pooled clients (httpx, the openai SDK) and is far below proxies' (nginx and load
# balancers: 60 s): a client that reuses a connection as the server closes it gets
# "connection reset by peer" for a request that never reached the app. Seen in the webhook's
# 1,000-replay test on a loaded machine.
KEEP_ALIVE_S = 75
