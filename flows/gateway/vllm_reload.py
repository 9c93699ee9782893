"""A route in the gateway's own `vllm serve` processes: load a new policy's weights in place.

vLLM loads this as an endpoint plugin (entry point `vllm.endpoint_plugins` named
`flywheel_reload`, pyproject.toml), and only where `VLLM_PLUGINS` names it: the gateway
names it for the servers it starts (flows/gateway/vllm_serve.py), with a fresh random
token in FLYWHEEL_RELOAD_TOKEN that a caller must send as its bearer. Nothing else about
the server changes: vLLM's development endpoints (`/collective_rpc` and the rest) stay
off.

POST /flywheel/reload {"model_dir": FOLDER} loads FOLDER's weights into the running engine
through the worker extension `trainer.vllm_worker.InPlaceReload` (the warm engine's steps),
then drops the cached prefixes the old weights computed, and answers with the seconds it
took. The engine keeps its architecture, tokenizer and KV cache, so the caller must only
send a folder of the same architecture (`trainer.vllm_worker.architecture`) and must hold
its calls meanwhile (flows/gateway/upstreams.py: `UpstreamPool.reload_primary`).
"""
from __future__ import annotations

import hmac
import os
import time
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

PLUGIN_NAME = "flywheel_reload"
TOKEN_ENV = "FLYWHEEL_RELOAD_TOKEN"
ROUTE = "/flywheel/reload"
WORKER_EXTENSION = "trainer.vllm_worker.InPlaceReload"


class ReloadPlugin:
    """The `vllm.endpoint_plugins` factory (vllm/plugins/endpoint_plugins/interface.py)."""

    name = PLUGIN_NAME
    required_tasks = ("generate",)

    def attach_router(self, app) -> None:
        router = APIRouter()

        @router.post(ROUTE)
        async def reload(raw_request: Request):
            token = os.environ.get(TOKEN_ENV, "")
            given = raw_request.headers.get("authorization", "")
            if not token or not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return JSONResponse({"error": f"{ROUTE} needs the bearer token this server was started with"},
                                    status_code=401)
            try:
                body = await raw_request.json()
            except ValueError:
                body = None
            model_dir = body.get("model_dir") if isinstance(body, dict) else None
            if not isinstance(model_dir, str) or not (Path(model_dir) / "config.json").is_file():
                return JSONResponse({"error": f"{ROUTE} takes {{\"model_dir\": a model folder}}, got {body!r:.200}"},
                                    status_code=400)
            engine = raw_request.app.state.engine_client
            started = time.perf_counter()
            await engine.collective_rpc("flywheel_reload", kwargs={"weights_path": model_dir})
            await engine.reset_prefix_cache()  # cached keys and values of the old weights
            return {"model_dir": model_dir, "seconds": round(time.perf_counter() - started, 3)}

        app.include_router(router)

    async def init_state(self, engine_client, state, args) -> None:
        """Nothing to keep: the route reads the engine from the app's state."""
