"""The servers behind the gateway: one primary, at most one canary, and swaps without a failed call.

A call leases an upstream for its whole life (a stream included), so an upstream's
`in_flight` count is exact. A swap checks the new upstream's health, makes it the
primary (calls that start afterwards go there), then waits for the old one's calls to
finish before stopping it: nothing in flight is cut, nothing new reaches a stopped
server. An in-place swap (`reload_primary`) loads the new model into the primary's own
server instead: new calls wait at the door (`opened`) until the primary's calls have
finished and the weights are loaded, so every call is answered by one model, start to
end, and logged as that model. All of this runs on the gateway's one event loop, so the
counters need no lock.
"""
from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from flows.gateway.vllm_serve import ServedModel

log = logging.getLogger("flywheel.gateway")


class UpstreamError(RuntimeError):
    """An upstream cannot be used; the message says which and why."""


@dataclass(eq=False)
class Upstream:
    version: str
    """The model version it serves: logged with every call it answers."""
    url: str
    """Base URL of an OpenAI-compatible server (http://host:port, no /v1)."""
    served_name: str
    """The model name that server expects in a request."""
    process: ServedModel | None = field(default=None, repr=False)
    """Set when the gateway started this server itself, so it also stops it."""
    in_flight: int = 0
    drop_fields: tuple[str, ...] = ()
    """Request fields removed before forwarding, because this server crashes on them (the
    client's request is logged as it was sent)."""

    def forward_body(self, request: dict, **overrides) -> dict:
        """The request as this upstream gets it: its own model name, less drop_fields."""
        return {**{k: v for k, v in request.items() if k not in self.drop_fields}, "model": self.served_name,
                **overrides}

    def exited(self) -> bool:
        """Whether a server the gateway started has died."""
        return self.process is not None and self.process.process.poll() is not None

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def base_url(url: str) -> str:
    """An OpenAI-compatible server's base URL as the gateway keeps it: no trailing `/` or `/v1`
    (users write either)."""
    return url.rstrip("/").removesuffix("/v1")


async def probe(client: httpx.AsyncClient, url: str, timeout_s: float = 10.0) -> list[str]:
    """The model ids an upstream lists on /v1/models; UpstreamError when it is not healthy."""
    try:
        response = await client.get(f"{url.rstrip('/')}/v1/models", timeout=timeout_s)
        response.raise_for_status()
        ids = [m["id"] for m in response.json()["data"]]
    except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
        raise UpstreamError(f"upstream {url} is not healthy: GET /v1/models failed ({exc})") from exc
    if not ids:
        raise UpstreamError(f"upstream {url} lists no model on /v1/models")
    return ids


class UpstreamPool:
    def __init__(self, primary: Upstream, seed: int | None = None) -> None:
        self.primary = primary
        self.canary: Upstream | None = None
        self.canary_share = 0.0
        self._rng = random.Random(seed)
        self._idle = asyncio.Condition()
        self.retiring: dict[Upstream, asyncio.Task] = {}
        """Replaced upstreams still finishing their calls; a swap does not wait for them."""
        self._open = asyncio.Event()
        self._open.set()
        self.swaps = {"reload": 0, "switch": 0, "canary": 0}
        """Swaps done: in place, to a new primary server, of the canary (set or removed)."""

    async def opened(self) -> None:
        """Return once calls may start: at once, except during an in-place swap."""
        while not self._open.is_set():  # woken, the door may have closed again for the next swap
            await self._open.wait()

    def resume(self) -> None:
        """Let calls start again (after a swap that `reload_primary` left closed)."""
        self._open.set()

    async def reload_primary(self, version: str, load: Callable[[], Awaitable[None]], pause_s: float) -> bool:
        """Make the primary's server answer as `version`: hold new calls, wait up to `pause_s`
        for the primary's calls to finish, run `load` (which puts the new weights into that
        server), then let calls start again, on the new version. False, with nothing changed
        and calls let through, when the calls did not finish in time. When `load` raises, the
        door stays closed: the server's weights are in an unknown state, so the caller replaces
        the server before it calls `resume`."""
        old = self.primary
        self._open.clear()
        async with self._idle:
            try:
                await asyncio.wait_for(self._idle.wait_for(lambda: old.in_flight == 0), pause_s)
            except TimeoutError:
                log.warning("gateway: %s still had %d calls after %.0f s; starting a server for %s instead",
                            old.version, old.in_flight, pause_s, version)
                self._open.set()
                return False
        await load()
        self.primary = Upstream(version, old.url, old.served_name, old.process, drop_fields=old.drop_fields)
        self.swaps["reload"] += 1
        self._open.set()
        return True

    def choose(self) -> Upstream:
        if self.canary is not None and self._rng.random() < self.canary_share:
            return self.canary
        return self.primary

    def fallback(self, failed: Upstream) -> Upstream | None:
        """Where a call goes when `failed` could not be reached: the primary, else the canary
        (read now, not when the call began: a swap or a revived server may have replaced it)."""
        return next((u for u in (self.primary, self.canary) if u is not None and u is not failed), None)

    @asynccontextmanager
    async def lease(self, upstream: Upstream) -> AsyncIterator[Upstream]:
        """Hold `upstream` (from `choose` or `fallback`) for the life of a call."""
        upstream.in_flight += 1
        try:
            yield upstream
        finally:
            upstream.in_flight -= 1
            async with self._idle:
                self._idle.notify_all()

    def versions(self) -> dict:
        return {"primary": self.primary.version, "canary": self.canary.version if self.canary else None,
                "canary_share": self.canary_share if self.canary else 0.0,
                "in_flight": sum(u.in_flight for u in {self.primary, self.canary, *self.retiring} if u)}

    async def switch(self, new: Upstream, client: httpx.AsyncClient, drain_s: float) -> None:
        """Make `new` the primary once it is healthy; drain and stop the old primary."""
        await probe(client, new.url)
        if self.canary is not None and self.canary.url == new.url:
            new = self.canary  # a promoted canary is already warm: it just takes all traffic
            self.canary, self.canary_share = None, 0.0
        old, self.primary = self.primary, new
        self.swaps["switch"] += 1
        log.info("gateway: primary is now %s (%s); draining %s", new.version, new.url, old.version)
        if old is not new and old is not self.canary:
            self._retire_later(old, drain_s)

    async def set_canary(self, new: Upstream | None, share: float, client: httpx.AsyncClient,
                         drain_s: float) -> None:
        """Send `share` of calls to `new` (None: no canary); the previous canary is drained."""
        if new is not None:
            if not 0 < share < 1:
                raise UpstreamError(f"a canary share must be in (0, 1), got {share}")
            await probe(client, new.url)
        old, self.canary, self.canary_share = self.canary, new, (share if new else 0.0)
        self.swaps["canary"] += 1
        if old is not None and old is not new and old is not self.primary:
            self._retire_later(old, drain_s)

    def _retire_later(self, old: Upstream, drain_s: float) -> None:
        task = asyncio.get_running_loop().create_task(self.retire(old, drain_s))
        self.retiring[old] = task
        task.add_done_callback(lambda _t: self.retiring.pop(old, None))

    async def retire(self, old: Upstream, drain_s: float) -> None:
        """Wait up to `drain_s` for `old`'s calls to finish, then stop it if the gateway owns it."""
        async with self._idle:
            try:
                await asyncio.wait_for(self._idle.wait_for(lambda: old.in_flight == 0), drain_s)
            except TimeoutError:
                log.warning("gateway: %s still had %d calls after %.0f s; stopping it", old.version,
                            old.in_flight, drain_s)
        await asyncio.to_thread(old.stop)

    def owned(self) -> list[Upstream]:
        """Every upstream the gateway started and has not stopped yet."""
        return [u for u in (self.primary, self.canary, *self.retiring) if u is not None and u.process is not None]
