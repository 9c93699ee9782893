"""Managed mode: the gateway serves the lake's production model and follows every promotion.

Every `watch_s` seconds it reads the `models` table. A new production version (promoted
by the gate, or by `flywheel model promote` for a rollback) of the served model's
architecture is loaded into the running server in place (`swap = "reload"`, the default:
flows/gateway/vllm_reload.py); otherwise it gets its own `vllm serve`, and once that
answers it becomes the primary and the old server is drained and stopped
(flows/gateway/upstreams.py). With `canary_share > 0`, the newest candidate is served
beside it and takes that share of calls until the gate decides; a promoted canary is
already warm and simply takes all traffic. A server that dies (vLLM's engine crashed)
is started again at the next tick.
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from flows.gateway.upstreams import Upstream
from flows.gateway.vllm_serve import ServedModel, ServeError
from storage.lake import open_lake
from tasks.release.models import ModelNotFound, local_model_dir, newest_candidate, production_version

if TYPE_CHECKING:
    from flows.gateway.app import Gateway

log = logging.getLogger("flywheel.gateway")


class ProductionWatch:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.cfg = gateway.cfg
        self.starting: set[ServedModel] = set()
        """Servers still coming up in a worker thread: a stopping gateway stops them too,
        or they would outlive it (a thread cannot be cancelled)."""
        self.closed = False

    def _versions(self) -> tuple[str, str | None]:
        """(production version, newest candidate or None), read from the lake."""
        con = open_lake(self.gateway.settings, read_only=True)
        try:
            production = production_version(con)
            try:
                candidate = newest_candidate(con) if self.cfg.canary_share > 0 else None
            except ModelNotFound:
                candidate = None
            return production, candidate
        finally:
            con.close()

    def _model_dir(self, version: str) -> Path:
        con = open_lake(self.gateway.settings, read_only=True)
        try:
            return local_model_dir(self.gateway.settings, con, version)
        finally:
            con.close()

    def _serve(self, version: str) -> Upstream:
        model_dir = self._model_dir(version)
        if self.closed:
            raise ServeError("the gateway is stopping")
        served = ServedModel.start(model_dir, version, self.gateway.settings.home / "gateway" / "logs",
                                   max_model_len=self.cfg.serve_max_model_len,
                                   kv_cache_gib=self.cfg.serve_kv_cache_gib,
                                   gpu_memory_fraction=self.cfg.serve_gpu_memory_fraction,
                                   tool_parser=self.cfg.serve_tool_parser,
                                   reloadable=self.cfg.swap == "reload")
        self.starting.add(served)
        try:
            served.wait_ready()
        finally:
            self.starting.discard(served)
        if self.closed:  # stopped while it came up
            served.stop()
            raise ServeError("the gateway is stopping")
        return Upstream(version, served.url, version, served, drop_fields=served.unsafe_fields)

    def close(self) -> None:
        """Stop every server still starting; nothing starts after this."""
        self.closed = True
        for served in list(self.starting):
            served.stop()

    async def first_upstream(self) -> Upstream:
        production, _candidate = await asyncio.to_thread(self._versions)
        log.info("gateway: starting vllm serve of production model %s", production)
        return await asyncio.to_thread(self._serve, production)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.watch_s)
            for step, what in ((self.revive, "restarting a dead server"),
                               (self.check, "checking for a new production model")):
                try:
                    await step()
                except asyncio.CancelledError:
                    raise
                except Exception:  # a lake or start-up hiccup must not stop the watch; next tick retries
                    log.exception("gateway: %s failed; retrying", what)

    async def revive(self) -> None:
        """Start a new server for a primary or canary whose `vllm serve` has died (an engine
        crash takes the whole server down). Until the new one answers, its calls go to the other
        upstream (flows/gateway/calls.py), or get 502 when there is none."""
        pool, client, drain_s = self.gateway.pool, self.gateway.client, self.cfg.drain_s
        for upstream in (pool.primary, pool.canary):
            if upstream is None or not upstream.exited():
                continue
            log.error("gateway: vllm serve of %s exited with %s; starting a new one. Its log tail (%s):\n%s",
                      upstream.version, upstream.process.process.returncode, upstream.process.log_path,
                      upstream.process.log_tail(1500))
            new = await asyncio.to_thread(self._serve, upstream.version)
            if upstream is pool.primary:
                await pool.switch(new, client, drain_s)
            elif upstream is pool.canary:
                await pool.set_canary(new, pool.canary_share, client, drain_s)
            else:  # replaced while the new server came up: it is not needed
                await asyncio.to_thread(new.stop)

    async def reload(self, version: str) -> bool:
        """Load `version` into the primary's own server, when the config and the model's
        architecture allow it; whether the primary now serves it."""
        pool, served = self.gateway.pool, self.gateway.pool.primary.process
        if self.cfg.swap != "reload" or served is None:
            return False
        model_dir = await asyncio.to_thread(self._model_dir, version)
        if not await asyncio.to_thread(served.can_reload, model_dir):
            return False
        took: list[float] = []

        async def load() -> None:
            took.append(await asyncio.to_thread(served.reload, model_dir))

        try:
            if not await pool.reload_primary(version, load, self.cfg.swap_pause_s):
                return False
        except ServeError:  # its weights are unknown now: calls keep waiting for a new server
            log.exception("gateway: loading %s in place failed; starting a new server for it", version)
            try:
                await pool.switch(await asyncio.to_thread(self._serve, version), self.gateway.client,
                                  self.cfg.drain_s)
            except Exception:
                await asyncio.to_thread(served.stop)  # never serve unknown weights: `revive` restarts it
                raise
            finally:
                pool.resume()
            return True
        log.info("gateway: production is now %s, loaded into the running server in %.2f s", version, took[0])
        return True

    async def check(self) -> None:
        pool, client, drain_s = self.gateway.pool, self.gateway.client, self.cfg.drain_s
        production, candidate = await asyncio.to_thread(self._versions)
        if production != pool.primary.version:
            if pool.canary is not None and pool.canary.version == production:
                await pool.switch(pool.canary, client, drain_s)
            elif not await self.reload(production):
                log.info("gateway: production is now %s; starting its server", production)
                await pool.switch(await asyncio.to_thread(self._serve, production), client, drain_s)
        if self.cfg.canary_share <= 0:
            return
        current = pool.canary.version if pool.canary is not None else None
        if candidate != current and candidate != pool.primary.version:
            new = await asyncio.to_thread(self._serve, candidate) if candidate else None
            await pool.set_canary(new, self.cfg.canary_share, client, drain_s)
