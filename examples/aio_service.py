"""An asyncio service on pyzlog.aio: an order intake and a billing consumer.

The intake appends orders concurrently (asyncio.gather of `await
log.append`); the "billing" named consumer, in the same event loop, bills
each order once and commits every 100 records and at the end. Run it again
and billing resumes where it committed: earlier orders are not billed again.

    python examples/aio_service.py --conf run/cluster/ceph.conf --log orders --orders 2000

It prints one JSON line: orders appended and billed by this run, the
position billing resumed at and committed, the log's tail and billing's lag.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import uuid

from pyzlog import LogNotFound, aio

COMMIT_EVERY = 100


async def intake(log: aio.AsyncLog, run: str, orders: int) -> list[int]:
    """Take `orders` orders at once; each is acknowledged with its position."""
    async def order(i: int) -> int:
        body = {"run": run, "order": i, "amount_cents": 100 + i % 900}
        return await log.append(json.dumps(body).encode())

    return await asyncio.gather(*[order(i) for i in range(orders)])


async def billing(consumer: aio.AsyncConsumer, run: str, orders: int) -> tuple[int, int]:
    """Bill this run's orders as they arrive (at-least-once: commit after
    billing); stop once all of them are billed. (billed, duplicates)."""
    billed: set[int] = set()
    duplicates = 0
    since_commit = 0
    async for rec in consumer.stream(follow=True):
        if rec.data is not None:
            body = json.loads(rec.data)
            if body["run"] == run:
                duplicates += body["order"] in billed
                billed.add(body["order"])  # charge(body) would go here
        since_commit += 1
        if since_commit >= COMMIT_EVERY or len(billed) == orders:
            await consumer.commit()
            since_commit = 0
        if len(billed) == orders:
            break
    return len(billed), duplicates


async def main(args: argparse.Namespace) -> dict[str, int]:
    cluster = await aio.connect(args.conf)
    try:
        log = await aio.Log.open(cluster, args.pool, args.log, sequencer=args.seqr)
    except LogNotFound:
        log = await aio.Log.create(cluster, args.pool, args.log, sequencer=args.seqr, width=4)
    async with log:
        consumer = await log.consumer("billing")
        resumed_at = consumer.position
        run = uuid.uuid4().hex
        positions, (billed, duplicates) = await asyncio.gather(intake(log, run, args.orders),
                                                               billing(consumer, run, args.orders))
        return {"appended": len(set(positions)), "billed": billed, "duplicates": duplicates,
                "resumed_at": resumed_at, "committed": consumer.committed,
                "tail": await log.next_position_hint(), "lag": await consumer.lag()}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conf", default=None, help="ceph.conf (default: $CEPH_CONF)")
    p.add_argument("--pool", default="zlog")
    p.add_argument("--log", default="orders")
    p.add_argument("--orders", type=int, default=1000)
    p.add_argument("--seqr", default=None, help="sequencer HOST:PORT (default: the log's, or the registry's)")
    print(json.dumps(asyncio.run(main(p.parse_args()))))
