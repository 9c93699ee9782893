"""The in-place swap's order of events (`UpstreamPool.reload_primary`): the weights load
only once the primary's calls are done, no call starts while they load, calls that take
too long leave everything as it was, and a failed load keeps calls out until the caller
replaces the server. (The swap on a real `vllm serve` under load: test_managed.py.)"""
from __future__ import annotations

import asyncio

import pytest

from flows.gateway.upstreams import Upstream, UpstreamPool


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


async def started(pool: UpstreamPool, events: list[str], name: str) -> None:
    """A call: waits at the door, then leases the primary for a moment."""
    await pool.opened()
    async with pool.lease(pool.choose()) as upstream:
        events.append(f"{name} on {upstream.version}")
        await asyncio.sleep(0.05)


def test_the_load_waits_for_calls_in_flight_and_calls_wait_for_the_load():
    async def scenario() -> list[str]:
        pool, events = UpstreamPool(Upstream("v1", "http://127.0.0.1:1", "v1")), []
        release = asyncio.Event()

        async def long_call() -> None:
            async with pool.lease(pool.primary):
                events.append("long call on v1")
                await release.wait()
                events.append("long call done")

        async def load() -> None:
            events.append("load starts")
            await asyncio.sleep(0.1)
            events.append("load done")

        first = asyncio.create_task(long_call())
        await asyncio.sleep(0.01)
        swap = asyncio.create_task(pool.reload_primary("v2", load, pause_s=10))
        await asyncio.sleep(0.01)
        waiting = asyncio.create_task(started(pool, events, "next call"))
        await asyncio.sleep(0.1)
        events.append("long call released")
        release.set()
        assert await swap is True
        await asyncio.gather(first, waiting)
        assert pool.primary.version == "v2" and pool.primary.url == "http://127.0.0.1:1"
        return events

    assert run(scenario()) == ["long call on v1", "long call released", "long call done", "load starts",
                               "load done", "next call on v2"]


def test_calls_that_outlast_the_pause_leave_the_old_model_serving():
    async def scenario() -> tuple[bool, list[str], str]:
        old = Upstream("v1", "http://127.0.0.1:1", "v1")
        pool, events = UpstreamPool(old), []

        async def load() -> None:
            events.append("loaded")

        async with pool.lease(old):
            swapped = await pool.reload_primary("v2", load, pause_s=0.1)
            await started(pool, events, "next call")  # the door is open again
        return swapped, events, pool.primary.version

    assert run(scenario()) == (False, ["next call on v1"], "v1")


def test_a_failed_load_keeps_calls_out_until_the_caller_resumes():
    async def scenario() -> list[str]:
        pool, events = UpstreamPool(Upstream("v1", "http://127.0.0.1:1", "v1")), []

        async def load() -> None:
            raise RuntimeError("the server refused")

        with pytest.raises(RuntimeError, match="refused"):
            await pool.reload_primary("v2", load, pause_s=1)
        waiting = asyncio.create_task(started(pool, events, "call"))
        await asyncio.sleep(0.2)
        assert events == [] and not waiting.done()  # nothing reaches the server of unknown weights
        pool.primary = Upstream("v2", "http://127.0.0.1:2", "v2")  # what the caller does: a new server
        pool.resume()
        await waiting
        return events

    assert run(scenario()) == ["call on v2"]
