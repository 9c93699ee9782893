"""A gateway stand-in for test_shipping's kill test.

`python -m tests.flows.gateway.spool_writer SPOOL HOME` appends call records from many
concurrent tasks with a Shipper running, and prints "seq id" for each only after
append_call returned: what a client would have seen answered. It runs until killed.
With --drain it appends nothing: it ships everything pending and exits (a graceful stop).
"""
from __future__ import annotations

import argparse
import asyncio
import uuid
from pathlib import Path

from flows.gateway.shipping import Shipper, ShippingConfig
from flows.gateway.spool import Spool
from storage.settings import LakeSettings

# Small files, shipped often, so kills land in every step of shipping.
CONFIG = ShippingConfig(max_bytes=30_000, max_age_s=0.2, poll_s=0.05)
WORKERS = 24


async def answer_forever(spool: Spool) -> None:
    async def client() -> None:
        while True:
            record = {"type": "call", "id": f"chatcmpl-{uuid.uuid4().hex}", "ts": "2025-01-01T00:00:00Z",
                      "status": 200, "request": {"messages": [{"role": "user", "content": "x" * 200}]}}
            seq = await spool.append_call(record)
            print(seq, record["id"], flush=True)
    await asyncio.gather(*(client() for _ in range(WORKERS)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spool", type=Path)
    parser.add_argument("home", type=Path)
    parser.add_argument("--drain", action="store_true")
    args = parser.parse_args()
    spool = Spool(args.spool)
    shipper = Shipper(spool, LakeSettings(home=args.home), CONFIG)
    if args.drain:
        shipper.stop()
        spool.close()
        return
    shipper.start()
    asyncio.run(answer_forever(spool))


if __name__ == "__main__":
    main()
