"""Streams for asyncio (pyzlog.aio: AsyncLog.stream, stream_batches): the
walk of batches.BatchStream (its sans-I/O _steps) driven on an event loop,
so a reader costs an event loop no thread.

The stream's native queue (core.native.Queue) gets a notify fd (an eventfd
written by the data plane when a reply lands); while a reply is awaited the
loop watches it with add_reader. A scan step (core.scan.ViewScan) runs
unchanged through `LoopQueue`, whose wait() never blocks: when a scan would
wait, wait() raises _WouldBlock before the scan has changed anything, the
driver awaits the fd and calls the step again. Sleeps (hole waits, polls of an
idle tail) are asyncio.sleep. The rare calls that block on their own -- a
metadata refresh while following the tail, a stale epoch's wait, filling a
hole -- run on the loop's default executor: a shared pool, not a thread per
reader.

Cancelling a stream loses nothing: a batch is handed out whole or not at
all, and the next iteration walks on from the first position not handed
out (as after an error in the sync stream).
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from ..core.errors import Timeout
from ..core.native import Queue
from .batches import BatchStream, Call, RecordBatch, Rows, Sleep, Step, Walk
from .reader import Record

T = TypeVar("T")


class _WouldBlock(Exception):
    """LoopQueue.wait found nothing ready and would have to wait."""


class LoopQueue:
    """A native.Queue for a scan walked on an event loop: what ViewScan uses
    of it (submit, wait, tags, conn, close), with a wait() that never blocks."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.tags = queue.tags
        self.conn = queue.conn
        self.fd = queue.notify_fd()

    def submit(self, *args: Any, **fields: Any) -> None:
        self.queue.submit(*args, **fields)

    def wait(self, timeout: float | None = None, max_results: int | None = None) -> list[Any]:
        got = self.queue.wait(0, max_results)
        if got or timeout == 0 or not self.queue.pending:
            return got
        raise _WouldBlock

    def close(self) -> None:
        self.queue.close()


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def readable(loop: asyncio.AbstractEventLoop, fd: int, timeout: float) -> None:
    """Until `fd` is readable (Timeout after `timeout` s). The fd is watched
    only meanwhile: a reader that is not iterated costs the loop nothing."""
    fut: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, _wake, fut)
    try:
        async with asyncio.timeout(timeout):
            await fut
    except TimeoutError:
        raise Timeout(f"stream: no reply from the cluster within {timeout:.0f}s") from None
    finally:
        loop.remove_reader(fd)


class AsyncBatchStream(BatchStream):
    """BatchStream's batches for `async for` (see the module doc)."""

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._walk_async()

    async def _until_ready(self, fn: Callable[..., T], args: tuple[Any, ...], q: LoopQueue,
                           loop: asyncio.AbstractEventLoop) -> T:
        """fn(*args) (a scan step), again each time a reply lands, until it no longer waits."""
        while True:
            try:
                return fn(*args)
            except _WouldBlock:
                pass
            await readable(loop, q.fd, q.conn.op_timeout + 5.0)

    async def _walk_async(self) -> AsyncIterator[Any]:
        """The walk of BatchStream._steps() with its effects awaited: the
        same walk as the blocking stream's, driven on the event loop."""
        loop = asyncio.get_running_loop()
        q = LoopQueue(self.log.conn.queue())
        self._queue = q  # type: ignore[assignment]  # what _scan() hands the ViewScan
        walk = Walk(self._steps())
        try:
            for effect in walk:
                if isinstance(effect, Rows):
                    yield effect.batch
                    continue
                try:
                    if isinstance(effect, Sleep):
                        await asyncio.sleep(effect.seconds)
                    elif isinstance(effect, Step):
                        walk.reply(await self._until_ready(effect.fn, effect.args, q, loop))
                    elif isinstance(effect, Call):
                        walk.reply(await loop.run_in_executor(None, effect.fn, *effect.args))
                except Exception as e:  # noqa: BLE001 - thrown into the walk, which decides
                    walk.fail(e)
        finally:
            walk.close()
            q.close()


class AsyncBatches:
    """AsyncLog.stream_batches(): AsyncBatchStream's batches, outliving a
    cancelled (or failed) iteration: the next __anext__ walks on from the
    first position not handed out, where a bare async generator would be
    closed for good and end a `follow` loop without a word."""

    def __init__(self, batches: AsyncBatchStream) -> None:
        self._batches = batches
        self._walk: AsyncIterator[Any] | None = None

    def __aiter__(self) -> AsyncBatches:
        return self

    async def __anext__(self) -> Any:
        if self._walk is None:
            self._walk = aiter(self._batches)
        try:
            return await anext(self._walk)
        except BaseException:
            self._walk = None  # over (its queue is closed): a new walk next time
            raise

    async def aclose(self) -> None:
        """Stop reading now."""
        walk, self._walk = self._walk, None
        close = getattr(walk, "aclose", None)
        if close is not None:
            await close()


class AsyncRecords:
    """AsyncLog.stream(): AsyncBatchStream's batches (data as stored) as
    Records (batches.RecordBatch, as the blocking stream makes them).
    After an error or a cancellation the next __anext__ walks on from the
    first position not handed out."""

    def __init__(self, batches: AsyncBatchStream) -> None:
        self._batches = batches
        self._current = RecordBatch(batches.codec)
        self._walk: AsyncIterator[Any] | None = None

    def __aiter__(self) -> AsyncRecords:
        return self

    async def __anext__(self) -> Record:
        while (rec := self._current.next()) is None:  # ZlogError if undecodable: met again next time
            if self._walk is None:
                self._walk = aiter(self._batches)
            try:
                b = await anext(self._walk)
            except BaseException:
                self._walk = None  # over (its queue is closed): a new walk next time
                raise
            self._current.load(b)
        return rec

    async def aclose(self) -> None:
        """Stop reading now (an abandoned stream's reads are also closed when
        it is garbage collected)."""
        walk, self._walk = self._walk, None
        close = getattr(walk, "aclose", None)
        if close is not None:
            await close()
