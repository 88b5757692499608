"""pyzlog for asyncio: `from pyzlog import aio`.

    cluster = await aio.connect("ceph.conf")
    log = await aio.Log.open(cluster, "zlog", "events")   # or aio.Log.create(...)
    pos = await log.append(b"hello")
    positions = await log.append_many([b"a", b"b"])
    data = await log.read(pos)
    async for rec in log.stream(0, follow=True): ...
    billing = await log.consumer("billing")
    async for rec in billing.stream(): ...; await billing.commit()

Everything rides on the sync client's native data plane (no thread per call
or per reader); see pyzlog/client/aio.py and docs/asyncio.md.
"""
from .client.aio import AsyncConsumer, AsyncLog, CancelledHandler, connect, create, open

#: pyzlog.aio.Log is the asyncio Log (as redis.asyncio.Redis is to redis.Redis)
Log = AsyncLog
Consumer = AsyncConsumer

__all__ = ["AsyncConsumer", "AsyncLog", "CancelledHandler", "Consumer", "Log", "connect", "create", "open"]
