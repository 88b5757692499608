"""The asyncio API (public as pyzlog.aio; docs/asyncio.md).

`AsyncLog` wraps a `Log` and rides on the same native data plane, so an
event loop gets no thread per call and none per reader:

- appends and reads go through the log's async pipeline (client.pipeline:
  the C++ append pipeline, the connection's one completion thread). Their
  outcomes are settled into the loop by a `_Bridge`: the completion thread
  queues them and wakes the loop once per batch (call_soon_threadsafe),
  not once per entry;
- streams wait on a notify fd of their own native queue (aio_stream);
- open, create, and the rare calls that block in the sync client (tail,
  trim, a consumer's first read) run on the loop's default executor.

Back-pressure: at most the log's `max_in_flight` appends and reads are
outstanding; `await append()` beyond that waits (in order) for room.

Cancellation loses nothing, and what a cancelled `await append(x)` means is
exact: if the task was cancelled while it waited for room in the window, `x`
was never sent and is never stored. Once sent, an entry cannot be recalled:
the CancelledError is raised at once, the entry is stored (or fails) as if
nobody had cancelled, and its outcome -- the position it was stored at, or
the error -- goes to the AsyncLog's `on_cancelled(data, outcome)` callback
and the metric zlog_client_aio_cancelled_appends_total{outcome}; `flush()`
waits for it. So every entry either is in the log at a position reported to
the caller (as the result or through on_cancelled), or was never sent.
"""
from __future__ import annotations

import asyncio
import builtins
import functools
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Self, TypeVar

from ..core import offsets
from ..core.cluster import connect as _connect
from ..core.errors import ZlogError
from ..core.futures import LazyFuture
from ..core.layout import check_position
from . import metrics
from .aio_stream import AsyncBatches, AsyncBatchStream, AsyncRecords
from .appending import stored_form, stored_forms
from .consumer import Consumer, Start
from .log import STREAM_BATCH_ROWS, Log
from .reader import HOLE_WAIT_SECONDS, Record, check_stream_args

if TYPE_CHECKING:
    import rados

logger = logging.getLogger("pyzlog")
T = TypeVar("T")

#: what on_cancelled gets: the entry's data, and its position or the error it failed with
CancelledHandler = Callable[[bytes, "int | BaseException"], None]


class _Sent(LazyFuture):
    """One append or read handed to the pipeline. The pipeline settles it as
    a concurrent Future, from any thread; it forwards the outcome to its
    loop's bridge and to `waiter`, the asyncio future its task awaits."""

    def __init__(self, bridge: _Bridge, waiter: asyncio.Future[Any], data: bytes | None) -> None:
        super().__init__()
        self.bridge, self.waiter, self.data = bridge, waiter, data
        self.orphan = False  # its task was cancelled after it was sent
        self.posted = False  # its outcome is on its way to the loop (which gives its slot back)
        #: its slot was given back as the send raised (an interrupt, say): its outcome, if one
        #: comes all the same, must not give it back again
        self.released = False

    def set_result(self, result: Any) -> None:
        self.posted = True
        self.bridge.post(self, result, None)

    def set_exception(self, exception: BaseException | None) -> None:
        self.posted = True
        self.bridge.post(self, None, exception)


class _Bridge:
    """Outcomes from the pipeline's threads into one event loop: queued, and
    the loop woken once for however many arrive before it runs."""

    def __init__(self, loop: asyncio.AbstractEventLoop, owner: AsyncLog) -> None:
        self.loop, self.owner = loop, owner
        self.ready: deque[tuple[_Sent, Any, BaseException | None]] = deque()
        self.scheduled = False

    def post(self, sent: _Sent, result: Any, error: BaseException | None) -> None:
        self.ready.append((sent, result, error))  # deque.append is atomic
        if not self.scheduled:
            # two threads may both get here: a second drain finds nothing, harmlessly
            self.scheduled = True
            try:
                self.loop.call_soon_threadsafe(self.drain)
            except RuntimeError:  # the loop is closed: nobody can await these any more
                self.scheduled = False

    def drain(self) -> None:
        self.scheduled = False  # before popping: a post from now on schedules again
        ready, owner = self.ready, self.owner
        n = 0
        while ready:
            sent, result, error = ready.popleft()
            n += not sent.released
            waiter = sent.waiter
            if sent.orphan or waiter.cancelled():
                owner._orphaned(sent, result, error)
            elif error is not None:
                waiter.set_exception(error)
            else:
                waiter.set_result(result)
        if n:
            owner._release(n)


class AsyncLog:
    """A Log for asyncio. Obtain with `await AsyncLog.open(...)` or
    `create(...)`, or wrap an open Log with AsyncLog(log) inside a running
    loop; use it from that loop only. `sync` is the Log underneath (its
    blocking calls block the loop: prefer the awaitable ones here)."""

    def __init__(self, log: Log, *, on_cancelled: CancelledHandler | None = None) -> None:
        self.sync = log
        self.loop = asyncio.get_running_loop()
        self.on_cancelled = on_cancelled
        self._pipe = log._async  # noqa: SLF001 - this package's own async pipeline
        self.window = self._pipe.max_in_flight
        self._in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._idle = asyncio.Event()
        self._idle.set()
        self._bridge = _Bridge(self.loop, self)

    # ------------------------------------------------------------ lifecycle
    @classmethod
    async def open(cls, cluster: rados.Rados, pool: str, name: str, *,
                   on_cancelled: CancelledHandler | None = None, **options: Any) -> AsyncLog:
        """Log.open (same options) on the loop's executor, and the async
        pipeline readied there so no first append blocks the loop."""
        log = await _blocking(functools.partial(Log.open, cluster, pool, name, **options))
        return await cls._ready(log, on_cancelled)

    @classmethod
    async def create(cls, cluster: rados.Rados, pool: str, name: str, *,
                     on_cancelled: CancelledHandler | None = None, **options: Any) -> AsyncLog:
        """Log.create (same options: width, config, sequencer, compression,
        max_in_flight, coalesce) on the loop's executor."""
        log = await _blocking(functools.partial(Log.create, cluster, pool, name, **options))
        return await cls._ready(log, on_cancelled)

    @classmethod
    async def _ready(cls, log: Log, on_cancelled: CancelledHandler | None) -> AsyncLog:
        def warm() -> None:
            # the C++ pipeline, the view and the sequencer's credentials (a RADOS read)
            pipe = log._async  # noqa: SLF001
            pipe._tell(pipe._pipeline(), log.state.meta)  # noqa: SLF001
        try:
            await _blocking(warm)
        except ZlogError as e:  # no sequencer to talk to yet: the first append finds out, as in the sync API
            logger.debug("log %r: async pipeline not readied: %s", log.name, e)
        return cls(log, on_cancelled=on_cancelled)

    async def flush(self) -> None:
        """Until every append and read sent is settled (cancelled ones too)."""
        await self._idle.wait()

    async def close(self) -> None:
        await self.flush()
        await _blocking(self.sync.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def name(self) -> str:
        return self.sync.name

    @property
    def pool(self) -> str:
        return self.sync.pool

    @property
    def in_flight(self) -> int:
        return self._in_flight

    # --------------------------------------------------------------- window
    async def _admit(self) -> None:
        """A slot in the window: at once if there is room and nobody queues
        before us, else in turn as slots free up."""
        if self._in_flight < self.window and not self._waiters:
            self._in_flight += 1
            self._idle.clear()
            return
        fut: asyncio.Future[None] = self.loop.create_future()
        self._waiters.append(fut)
        try:
            await fut  # _release counts the slot as ours before waking us
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release(1)  # handed a slot as we were cancelled: give it back
            else:
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass
            raise

    def _unsent(self, sent: _Sent) -> None:
        """Its send raised. Its slot comes back here unless its outcome is on
        its way already (the pipeline settled it: an interrupt after the
        operation went); an outcome that comes later all the same (the entry
        was queued as the interrupt came) goes to on_cancelled."""
        sent.orphan = True
        if not sent.posted:
            sent.released = True
            self._release(1)

    def _release(self, n: int) -> None:
        self._in_flight -= n
        waiters = self._waiters
        while waiters and self._in_flight < self.window:
            w = waiters.popleft()
            if not w.done():
                self._in_flight += 1
                w.set_result(None)
        if not self._in_flight:
            self._idle.set()

    def _orphaned(self, sent: _Sent, result: Any, error: BaseException | None) -> None:
        """The outcome of an operation whose task was cancelled after it was sent."""
        if sent.data is None:
            return  # a read: nothing to report
        metrics.AIO_CANCELLED["stored" if error is None else "failed"].inc()
        handler, data = self.on_cancelled, sent.data
        sent.data = None
        if handler is None:
            logger.debug("log %r: a cancelled append was %s", self.name,
                         f"stored at {result}" if error is None else f"not stored: {error}")
            return
        try:
            handler(data, result if error is None else error)
        except Exception:  # noqa: BLE001 - the loop goes on
            logger.exception("on_cancelled failed")

    def _abandon(self, sent: _Sent) -> None:
        """Its task was cancelled: its outcome goes to on_cancelled."""
        if sent.orphan:
            return
        sent.orphan = True
        w = sent.waiter
        if w.done() and not w.cancelled():  # settled before the cancellation reached the task
            self._orphaned(sent, None if w.exception() else w.result(), w.exception())
        elif not w.done():
            w.cancel()

    # --------------------------------------------------------------- appends
    def _send(self, stored: bytes, data: bytes) -> _Sent:
        sent = _Sent(self._bridge, self.loop.create_future(), data)
        try:
            self._pipe.append(stored, future=sent)
        except BaseException:
            self._unsent(sent)
            raise
        return sent

    async def append(self, data: bytes) -> int:
        """Append one entry; its position. See the module doc for what a
        cancelled append means."""
        stored = stored_form(self.sync.state, data)
        try:
            await self._admit()
        except asyncio.CancelledError:
            metrics.AIO_CANCELLED["unsent"].inc()
            raise
        sent = self._send(stored, data)
        try:
            return await sent.waiter  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            self._abandon(sent)
            raise

    async def append_many(self, entries: builtins.list[bytes]) -> builtins.list[int]:
        """Append entries through the window, in order; their positions
        (increasing in entry order unless a write was refused and retried,
        as Log.append_many). Every entry is checked before any is sent.
        Cancelled midway: the entries not yet sent never are, and every one
        sent goes to on_cancelled with its outcome (those already stored
        too: the caller gets no list). If one fails, its error is raised
        and the others' outcomes go to on_cancelled likewise."""
        stored = stored_forms(self.sync.state, entries)
        sents: builtins.list[_Sent] = []
        positions: builtins.list[int] = []
        awaiting = False
        try:
            for form, d in zip(stored, entries):
                await self._admit()
                sents.append(self._send(form, d))
            awaiting = True
            for sent in sents:
                positions.append(await sent.waiter)
            return positions
        except BaseException as e:
            cancelled = isinstance(e, asyncio.CancelledError)
            if cancelled:
                metrics.AIO_CANCELLED["unsent"].inc(len(entries) - len(sents))
            for sent, pos in zip(sents, positions):  # stored, but the caller will not see the list
                sent.orphan = True
                self._orphaned(sent, pos, None)
            k = len(positions)
            # the entry whose await raised its own error: that error is the one raised
            for sent in sents[k + (1 if awaiting and not cancelled else 0):]:
                self._abandon(sent)
            raise

    # ----------------------------------------------------------------- reads
    async def read(self, position: int) -> bytes:
        """The entry at `position`; NotWritten, Filled or Trimmed otherwise."""
        check_position(position)
        await self._admit()
        sent = _Sent(self._bridge, self.loop.create_future(), None)
        try:
            self._pipe.read(position, future=sent)
        except BaseException:
            self._unsent(sent)
            raise
        try:
            return await sent.waiter  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            self._abandon(sent)
            raise

    def stream(self, start: int = 0, end: int | None = None, *, follow: bool = False,
               hole_wait: float = HOLE_WAIT_SECONDS, stride_index: int | None = None,
               stride: int | None = None, known_tail: int | None = None, on_corrupt: Any = "fail") -> AsyncRecords:
        """Log.stream for `async for`: the same records, gaps and hole
        filling, with no thread of its own."""
        check_stream_args(start, end, stride_index, stride, on_corrupt)
        return AsyncRecords(AsyncBatchStream(self.sync.state, start, end, follow=follow, hole_wait=hole_wait,
                                             stride_index=stride_index, stride=stride, known_tail=known_tail,
                                             max_rows=STREAM_BATCH_ROWS, decode=False, on_corrupt=on_corrupt,
                                             rows=True))

    def stream_batches(self, start: int = 0, end: int | None = None, *, follow: bool = False,
                       hole_wait: float = HOLE_WAIT_SECONDS, stride_index: int | None = None,
                       stride: int | None = None, known_tail: int | None = None,
                       signed: bool = False, on_corrupt: Any = "fail") -> AsyncBatches:
        """Log.stream_batches for `async for` (pyarrow.RecordBatch es). A
        cancelled iteration loses no batch, and the next goes on."""
        check_stream_args(start, end, stride_index, stride, on_corrupt)
        return AsyncBatches(AsyncBatchStream(self.sync.state, start, end, follow=follow, hole_wait=hole_wait,
                                             stride_index=stride_index, stride=stride, known_tail=known_tail,
                                             signed=signed, on_corrupt=on_corrupt))

    # ------------------------------------------------- blocking in the sync API
    async def tail(self) -> int:
        return await _blocking(self.sync.tail)

    async def next_position_hint(self) -> int:
        return await _blocking(self.sync.next_position_hint)

    async def first_position(self) -> int:
        return await _blocking(self.sync.first_position)

    async def fill(self, position: int) -> None:
        await _blocking(self.sync.fill, position)

    async def trim(self, position: int) -> None:
        await _blocking(self.sync.trim, position)

    async def trim_to(self, position: int) -> None:
        await _blocking(self.sync.trim_to, position)

    async def refresh(self) -> Any:
        return await _blocking(self.sync.refresh)

    # ------------------------------------------------------------- consumers
    async def consumer(self, name: str, *, start: Start = "earliest") -> AsyncConsumer:
        """Log.consumer for asyncio (reading its stored position on the executor)."""
        c = await _blocking(functools.partial(Consumer, self.sync, name, start=start))
        return AsyncConsumer(self, c)


class AsyncConsumer:
    """A named consumer (client.consumer.Consumer) for asyncio: `async for`
    over its records, `await commit()`. The commit's guarded write is
    librados aio: the loop never waits on RADOS for it."""

    def __init__(self, log: AsyncLog, consumer: Consumer) -> None:
        self.log = log
        self.sync = consumer

    @property
    def name(self) -> str:
        return self.sync.name

    @property
    def position(self) -> int:
        return self.sync.position

    @property
    def committed(self) -> int:
        return self.sync.committed

    @property
    def resumed(self) -> bool:
        return self.sync.resumed

    async def stream(self, *, follow: bool = True, end: int | None = None,
                     hole_wait: float = HOLE_WAIT_SECONDS) -> AsyncIterator[Record]:
        """Consumer.stream for `async for`."""
        async for rec in self.log.stream(self.sync.position, end, follow=follow, hole_wait=hole_wait):
            self.sync.position = rec.position + 1
            yield rec

    def __aiter__(self) -> AsyncIterator[Record]:
        return self.stream()

    def seek(self, position: int) -> None:
        self.sync.seek(position)

    async def commit(self, position: int | None = None) -> int:
        """Consumer.commit, awaited: CommitRefused if another instance
        committed further. A cancelled commit may still be stored (a commit
        is idempotent: commit again)."""
        c = self.sync
        pos = c.position if position is None else check_position(position)
        loop = self.log.loop
        done: asyncio.Future[int] = loop.create_future()

        def settle(code: int) -> None:
            if not done.done():  # not cancelled meanwhile
                done.set_result(code)

        def landed(code: int) -> None:  # on a librados thread
            try:
                loop.call_soon_threadsafe(settle, code)
            except RuntimeError:  # the loop is closed
                pass

        offsets.commit_async(c.meta_ioctx, self.log.name, c.name, pos, landed)
        if await done == 0:
            metrics.COMMITS.inc()
            c.committed = max(c.committed, pos)
            return pos
        # first commit, or the stored position is not below ours: the sync
        # commit sorts it out (creates, or says who got further)
        return await _blocking(c.commit, pos)

    async def committed_now(self) -> offsets.Committed | None:
        return await _blocking(self.sync.committed_now)

    async def reset(self, position: int) -> None:
        await _blocking(self.sync.reset, position)

    async def lag(self) -> int:
        return await _blocking(self.sync.lag)

    def close(self) -> None:
        self.sync.close()


async def _blocking(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def connect(conf: str | None = None, **kwargs: Any) -> rados.Rados:
    """pyzlog.connect on the loop's executor."""
    return await _blocking(functools.partial(_connect, conf, **kwargs))


async def open(cluster: rados.Rados, pool: str, name: str, **options: Any) -> AsyncLog:  # noqa: A001
    """AsyncLog.open."""
    return await AsyncLog.open(cluster, pool, name, **options)


async def create(cluster: rados.Rados, pool: str, name: str, **options: Any) -> AsyncLog:
    """AsyncLog.create."""
    return await AsyncLog.create(cluster, pool, name, **options)


__all__ = ["AsyncConsumer", "AsyncLog", "CancelledHandler", "connect", "create", "open"]
