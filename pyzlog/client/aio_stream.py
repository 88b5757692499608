"""Streams for asyncio (pyzlog.aio: AsyncLog.stream, stream_batches): the
walk of batches.BatchStream with its waits made awaitable, so a reader costs
an event loop no thread.

The stream's native queue (core.native.Queue) gets a notify fd (an eventfd
written by the data plane when a reply lands); while a reply is awaited the
loop watches it with add_reader. The scan (core.scan.ViewScan) is driven
unchanged through `LoopQueue`, whose wait() never blocks: when a scan would
wait, wait() raises _WouldBlock before the scan has changed anything, the
walk awaits the fd and calls the scan again. Sleeps (hole waits, polls of an
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
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from ..core.errors import StaleEpoch, Timeout, ZlogError
from ..core.layout import view_end
from ..core.native import Queue
from ..core.scan import KIND_NAMES, STOP_CORRUPT, STOP_END, STOP_MISSING, ViewScan, batch_of
from . import metrics
from .batches import BatchStream
from .ops import fill_hole
from .reader import MAX_POLL_SECONDS, Record, RecordKind
from .stale import StaleWait

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

    async def _until_ready(self, fn: Callable[[], T], q: LoopQueue, loop: asyncio.AbstractEventLoop) -> T:
        """fn() (a scan step), again each time a reply lands, until it no longer waits."""
        while True:
            try:
                return fn()
            except _WouldBlock:
                pass
            await readable(loop, q.fd, q.conn.op_timeout + 5.0)

    async def _walk_async(self) -> AsyncIterator[Any]:
        """BatchStream._walk, awaiting where it blocks (kept line for line
        beside it, so a change there is easy to carry over)."""
        loop = asyncio.get_running_loop()
        q = LoopQueue(self.log.conn.queue())
        self._queue = q  # type: ignore[assignment]  # what _scan() hands the ViewScan
        step = self._until_ready

        async def blocking(fn: Callable[..., T], *args: Any) -> T:
            return await loop.run_in_executor(None, fn, *args)

        try:
            stale = StaleWait(self.log, "stream_batches")
            idle_since: float | None = None
            scan: ViewScan | None = None
            while self.end is None or self.position < self.end:
                if scan is None:
                    scan, view, vend, views = self._scan()
                elif self.log.views is not views:
                    views = self.log.views
                    vend = view_end(views, view)
                    if vend is not None and vend < scan.end:
                        scan = None
                        continue
                sc = scan
                try:
                    built = await step(sc.next_batch, q, loop)
                except StaleEpoch:
                    await blocking(stale, sc.epoch)
                    self.position = sc.position
                    scan = None
                    continue
                stale.reset()
                if built.batch.num_rows:
                    try:
                        rows = self._rows(built.batch)
                    except Exception as e:  # noqa: BLE001 - an entry this codec cannot decode
                        sc.forget_from(self.position)
                        raise ZlogError(f"positions {self.position}..{sc.position - 1}: cannot decode an "
                                        f"entry: {e}") from e
                    self.position = sc.position
                    idle_since = None
                    yield rows
                self.position = sc.position
                if built.stop == STOP_END:
                    scan = None
                    continue
                if built.stop == STOP_CORRUPT:
                    err = await blocking(self._corrupt_entry, sc, view, built.stop_object)
                    if err is None:
                        continue
                    if err.whole and self.on_corrupt != "fail":
                        def top(sc: ViewScan = sc) -> int | None:
                            sc.refresh_max()
                            return sc.max_position()

                        at, end_of_view = err.position, vend
                        if await step(lambda: self.holes.since(at, end_of_view, top), q, loop) is None:
                            if not self.follow:
                                self._fail(sc, err)
                            await asyncio.sleep(MAX_POLL_SECONDS)
                            sc.forget_from(at)
                            await blocking(self.log.refresh)
                            continue
                    yield self._skip_corrupt(sc, err)
                    continue
                if built.stop != STOP_MISSING:
                    continue
                pos = sc.position
                if self._filter and pos % self.stride != self.stride_index:  # type: ignore[operator]
                    sc.skip()
                    self.position = sc.position
                    continue
                holes, end_of_view = self.holes, vend

                def highest(sc: ViewScan = sc) -> int | None:
                    sc.refresh_max()  # may raise _WouldBlock: since() is then asked again
                    return sc.max_position()

                since = await step(lambda: holes.since(pos, end_of_view, highest), q, loop)
                if since is None:  # the tail
                    if not self.follow:
                        return
                    now = time.monotonic()
                    idle_since = idle_since or now
                    await asyncio.sleep(min(0.002 * 2 ** min((now - idle_since) * 10, 7), MAX_POLL_SECONDS))
                    sc.forget_from(pos)
                    await blocking(self.log.refresh)
                    continue
                pause = self.holes.wait_for(since)
                if pause:
                    await asyncio.sleep(pause)
                    sc.forget_from(pos)
                elif await blocking(fill_hole, self.log, pos):
                    yield self._rows(batch_of([pos], ["lost"], [self.log.epoch], [None], signed=self.signed))
                    sc.skip()
                    self.position = sc.position
                else:
                    sc.forget_from(pos)
        finally:
            q.close()


class AsyncRecords:
    """AsyncLog.stream(): AsyncBatchStream's batches (data as stored) as
    Records, each decoded and counted as it is handed out (batches.Records
    for `async for`). After an error or a cancellation the next __anext__
    walks on from the first position not handed out."""

    def __init__(self, batches: AsyncBatchStream) -> None:
        self._batches = batches
        self._decode = batches.codec
        self._walk: AsyncIterator[Any] | None = None
        self._kinds = [RecordKind(k) for k in KIND_NAMES]
        self._pos: list[int] = []
        self._data: list[bytes | None] = []
        self._kind: list[int] = []
        self._epoch: list[int] = []
        self._i = 0

    def __aiter__(self) -> AsyncRecords:
        return self

    async def __anext__(self) -> Record:
        while self._i >= len(self._pos):
            if self._walk is None:
                self._walk = aiter(self._batches)
            try:
                b = await anext(self._walk)
            except BaseException:
                self._walk = None  # over (its queue is closed): a new walk next time
                raise
            self._pos, self._data = b.column(0).to_pylist(), b.column(1).to_pylist()
            self._kind, self._epoch = b.column(2).indices.to_pylist(), b.column(3).to_pylist()
            self._i = 0
        i = self._i
        data = self._data[i]
        if data is not None:
            stored = len(data)
            if self._decode is not None:
                try:
                    data = self._decode(data)
                except Exception as e:  # noqa: BLE001 - raised again if asked again: never skipped
                    raise ZlogError(f"position {self._pos[i]}: cannot decode entry: {e}") from e
            metrics.read(stored)
        self._i = i + 1
        return Record(self._pos[i], self._kinds[self._kind[i]], data, self._epoch[i])

    async def aclose(self) -> None:
        """Stop reading now (an abandoned stream's reads are also closed when
        it is garbage collected)."""
        walk, self._walk = self._walk, None
        close = getattr(walk, "aclose", None)
        if close is not None:
            await close()
