"""Async appends and reads (Log.append_async, Log.read_async) on the native
data plane.

One `AsyncPipeline` per data-plane connection, shared by every log of it:
the C++ append pipeline (pyzlog._appender: positions from the sequencer,
write_many per object), the handler of the outcomes it posts to the
connection's completion thread, and one retry thread for what must wait
(a refreshed view, slow tail finding). One `LogAsync` per log: its bound on
operations in flight and its futures. So a process holds one cluster
connection for data and a fixed number of threads, however many logs it
opens.

Every outcome is judged as every append's is (appending.judge): stored, the
future resolves with the position; taken (written, filled, trimmed first),
the entry takes a new position; a stale epoch, the retry thread refreshes
(StaleWait) and takes new positions; handed back by the C++ pipeline (no
view yet, the sequencer down or not serving), the retry thread takes
positions itself (the sequencer, or slow tail finding) and writes them. An
entry not stored within APPEND_DEADLINE_SECONDS fails.
"""
from __future__ import annotations

import errno
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any

from .. import _appender  # the C++ extension (untyped)
from ..core import wire
from ..core.errors import InvalidRequest, LogClosed, NotWritten, Timeout, Trimmed, ZlogError
from ..core.futures import LazyFuture
from ..core.layout import data_oid_prefix, place, place_of, stripe_span, stripe_start
from ..core.stripes import make
from ..core.wire import MAX_POSITION
from ..core.native import Connection, Op, mark_own_thread, native_call, on_own_thread
from ..core.state import LogState
from . import metrics
from .appending import APPEND_DEADLINE_SECONDS, Outcome, judge, write_error
from .positions import Positions
from .stale import StaleWait

logger = logging.getLogger("pyzlog")

DEFAULT_MAX_IN_FLIGHT = 128
#: how long the C hot path (native/appender_hot.cc) takes entries after
#: Python last checked that the C++ pipeline holds the log's newest view and
#: a usable sequencer. It checks per entry that no newer metadata was read
#: and that the client is not blocklisted, and an entry refused or handed
#: back disarms it at once: this bounds only how late a sequencer change
#: learnt elsewhere (a sync append, another log) reaches the C++ pipeline
HOT_PATH_SECONDS = 0.05
#: close() waits this long past the append deadline for what is in flight
CLOSE_GRACE_SECONDS = 10.0
#: how often the retry thread looks for retry-path entries no job will take
RETRY_SWEEP_SECONDS = 1.0
#: HotPath.queue's answers besides "queued": the log's window is closed
#: (nothing taken); the C++ pipeline refused the entry (closed)
QUEUE_CLOSED, QUEUE_REFUSED = 0, 2
#: how HotPath.queue takes a new entry's slot: waiting for room; at once,
#: past the bound if need be (on pyzlog's own threads: a done-callback that
#: appends must not wait for room that only its thread can make)
TAKE_WAIT, TAKE_OVER = 1, 2

# the C++ pipeline times async appends into this histogram's buckets
_appender.configure_latency(metrics.LATENCY_BUCKETS)
metrics.APPEND_SECONDS["async"].add_source(_appender.latency)
#: the C++ pipeline's code for an entry it gave back unsent (native/appender.h)
HANDED_BACK = 1

#: (owner, future, stored bytes, monotonic time of the append)
Item = tuple["LogAsync", "Future[int]", bytes, float]


def _no_hot_path(_data: bytes, _future: Any = None) -> None:
    """LogAsync.hot_append until the C++ pipeline is made: append() takes every entry."""
    return None


class AsyncPipeline:
    """The async machinery of one data-plane connection. Obtain with of()."""

    _lock = threading.Lock()
    _of: dict[int, AsyncPipeline] = {}

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.native = conn.pipeline()
        if self.native is None:
            raise ZlogError("the C++ append pipeline is unavailable")
        self.items: dict[int, Item] = {}
        self.tags = itertools.count(1)
        self._work: deque[Callable[[], None]] = deque()
        self._work_ready = threading.Condition(threading.Lock())
        self._worker: threading.Thread | None = None
        #: the logs whose retry queues _retry looks at now and then
        self._logs: weakref.WeakSet[LogAsync] = weakref.WeakSet()
        conn.on_posted(self._posted)
        metrics.NATIVE.track(self)

    @classmethod
    def of(cls, conn: Connection) -> AsyncPipeline:
        with cls._lock:
            p = cls._of.get(id(conn))
            if p is None or p.conn is not conn:
                p = cls._of[id(conn)] = cls(conn)
            return p

    def _posted(self, tags: int, codes: int, positions: int, n: int) -> None:
        """The C++ pipeline's outcomes (arrays by address), on the completion
        thread: sorted in C (_appender.settle, which also times the stored
        ones), the entries not stored judged one by one, then the stored ones
        settled per log in one go."""
        stored, others = _appender.settle(self.items, tags, codes, positions, n, time.monotonic())
        for item, code, position in others:
            try:
                item[0].outcome(item, code, position)
            except Exception:  # noqa: BLE001 - the others of the batch must still be settled
                logger.exception("an async append's outcome failed")
        for owner, done, top in stored:
            try:
                owner.stored(done, top)
            except Exception:  # noqa: BLE001 - as above: the other logs' entries must still be settled
                logger.exception("settling async appends failed")

    def later(self, job: Callable[[], None]) -> None:
        """Run `job` on the retry thread (jobs that block: refreshes, slow tail finding)."""
        with self._work_ready:
            self._work.append(job)
            self._start_locked()
            self._work_ready.notify()

    def _start_locked(self) -> None:
        worker = self._worker
        if worker is None or not worker.is_alive():  # not alive: a Ctrl-C stopped its start()
            self._worker = threading.Thread(target=self._retry, name="pyzlog-retry", daemon=True)
            self._worker.start()

    def watch(self, log: LogAsync) -> None:
        """Look at `log`'s retry queue now and then (_retry), from now on."""
        self._logs.add(log)
        with self._work_ready:
            self._start_locked()

    def _retry(self) -> None:
        mark_own_thread()
        swept = time.monotonic()
        while True:
            job = None
            with self._work_ready:
                if self._work or self._work_ready.wait(RETRY_SWEEP_SECONDS):
                    job = self._work.popleft() if self._work else None
            if time.monotonic() - swept >= RETRY_SWEEP_SECONDS:
                # entries queued for the retry path that no job will take: a
                # Ctrl-C between queuing them and scheduling the job left them
                swept = time.monotonic()
                for log in list(self._logs):
                    if log.stranded_retries():
                        self._run(log._run_retries)
            if job is not None:
                self._run(job)

    @staticmethod
    def _run(job: Callable[[], None]) -> None:
        try:
            job()
        except BaseException:  # noqa: BLE001 - this thread must outlive one bad job (even a SystemExit)
            logger.exception("an async retry failed")

    def stats(self) -> dict[str, int]:
        """sequencer_requests, class_calls, entries_sent, split_batches, handed_back."""
        return dict(self.native.stats())

    @property
    def threads(self) -> list[threading.Thread]:
        return [t for t in (self._worker,) if t is not None and t.is_alive()]


class LogAsync:
    """Async appends and reads of one log, at most max_in_flight at once.

    Per-op cost matters here (it bounds appends/s per client), so the
    common append runs in C (HotPath), the window is counted in C (Window:
    a wait for room lets the GIL go, and Ctrl-C never leaves a slot taken
    by it), and the C++ pipeline's view and sequencer are touched only when
    they changed."""

    def __init__(self, log: LogState, positions: Positions, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 coalesce: bool = True) -> None:
        if not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise InvalidRequest(f"max_in_flight must be an integer of at least 1, not {max_in_flight!r}")
        self.log = log
        self.positions = positions
        self.max_in_flight = max_in_flight
        self.coalesce = coalesce
        self._lock = threading.Lock()  # making the pipeline
        #: operations in flight, at most max_in_flight (shared with the hot path)
        self._window = _appender.Window(max_in_flight)
        self._stale = StaleWait(log, "async append")
        self._refused_epoch = 0
        #: entries for the retry path (a deque: _take appends to it in C)
        self._retries: deque[Item] = deque()
        #: (item, position) whose write found its data-format object missing
        self._remake: list[tuple[Item, int, wire.Meta]] = []
        #: the position past which appends open the next stripe (None: no stripes, or asked already)
        self._open_ahead: int | None = None
        #: entries that went the retry path (refused, handed back, or no sequencer)
        self.retried = 0
        self._retry_stale = False
        self._retry_scheduled = False
        #: close() has begun letting go of the C++ pipeline's record of this log
        self._closed = False
        self._retry_lock = threading.Lock()
        self._swept: Item | None = None  # the first entry queued at the retry thread's last look
        self._pipe: AsyncPipeline | None = None
        self._id = 0  # the log's id in the C++ pipeline
        self._meta: Any = None  # the metadata snapshot the C++ pipeline has
        #: the last one told to it, and when: an entry queued after that was written at its epoch
        self._told: tuple[wire.Meta, float] | None = None
        self._tell_lock = threading.Lock()  # the C++ view and _told change together
        self._generation = -1  # the positions.generation it has
        #: the common case of append_async in C, made with the C++ pipeline:
        #: (data, future=None) -> the Future, or None when append() must take the entry
        self._hot: Any = None
        self.hot_append: Callable[..., Future[int] | None] = _no_hot_path
        metrics.ASYNC.track(self)

    def _pipeline(self) -> AsyncPipeline:
        pipe = self._pipe
        if pipe is None:
            with self._lock:
                if self._pipe is None:
                    with native_call():
                        pipe = AsyncPipeline.of(self.log.conn)
                        self._id = pipe.native.add_log(self.log.data.address, self.log.pool, self.log.name,
                                                       self.coalesce, self.max_in_flight)
                        self._hot = _appender.HotPath(pipe.native, self._id, self, self._window, self.log,
                                                      self.log.conn, pipe.items, pipe.tags, LazyFuture,
                                                      wire.MAX_ENTRY_BYTES)
                        self.hot_append = self._hot.append
                        pipe.watch(self)
                        metrics.count_later(self)  # the bytes it takes reach metrics.BYTES_OUT
                    self._pipe = pipe
                pipe = self._pipe
        return pipe

    @property
    def in_flight(self) -> int:
        """Async operations of this log not settled yet."""
        return int(self._window.in_flight)

    def _take(self, into: Any, item: object = True) -> None:
        """A slot of the window and, with it, into.append(item), in C: a
        Ctrl-C finds both done or neither. Waiting for room (Ctrl-C
        interrupts the wait); on pyzlog's own threads at once, past the bound
        if need be (a done-callback that appends or reads must not wait for
        its own thread)."""
        take = self._window.take_over if on_own_thread() else self._window.take
        if not take(into, item):
            raise LogClosed("log is closed")

    def _finish(self, fut: Future[Any], result: object = None, error: BaseException | None = None,
                slot: list[bool] | None = None) -> None:
        """Settle `fut` and give its slot back. A read's `slot` is settled by
        whoever pops it first: its outcome, or read() when interrupted."""
        # free the slot first: a done-callback that submits again must not block
        if slot is None:
            self._window.give()
        elif not self._window.give_token(slot):
            return  # settled already
        try:
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)
        except InvalidStateError:  # its owner cancelled it
            pass
        except Exception:  # noqa: BLE001 - a given future's own error (append_async(future=)): the
            logger.exception("settling %r failed", fut)  # loops settling its neighbours go on

    # --------------------------------------------------------------- appends
    def append(self, stored: bytes, future: Future[int] | None = None) -> Future[int]:
        """`stored` is already encoded and size-checked. `future`: settle this
        one instead of a new one (client.aio's, which settle on its loop).
        The common case runs in C (HotPath.append); this takes the rest."""
        fut: Future[int] = LazyFuture() if future is None else future
        refused = self.log.conn.blocklisted
        if refused is not None:  # final (zlog revoke): the C++ path must not take a position for it
            fut.set_exception(refused)
            return fut
        now = time.monotonic()
        self._send((self, fut, stored, now), now, new=True)
        return fut

    def _send(self, item: Item, now: float | None = None, new: bool = False) -> None:
        """Through the C++ pipeline while the sequencer serves; else the retry
        path. A `new` entry takes its slot of the window here, waiting for
        room: into the C++ pipeline with no Python code between the two (an
        interrupt never leaves a slot taken by an entry that does not go)."""
        pipe = self._pipe or self._pipeline()
        positions = self.positions
        meta = self.log.meta
        if meta is not self._meta or positions.generation != self._generation:
            try:
                self._tell(pipe, meta)
            except ValueError:  # "no such log": close() let the C++ pipeline forget it (and said so first)
                if not self._closed:
                    raise
                if new:
                    raise LogClosed("log is closed") from None
                self._finish(item[1], error=LogClosed("log is closed: the append was not stored"))
                return
        if positions.usable_now(now):
            sent = self._hot.queue(item, 0 if not new else TAKE_OVER if on_own_thread() else TAKE_WAIT)
            if sent == QUEUE_CLOSED:
                raise LogClosed("log is closed")
            if sent == QUEUE_REFUSED:  # the pipeline is closed (exiting)
                self._finish(item[1], error=ZlogError("the connection is closed: append not stored"))
                return
            if meta is self._meta and self.log.plain:
                # the C++ pipeline holds this view and a usable sequencer: the
                # hot path may take the next entries, for a moment
                self._hot.arm(meta, (time.monotonic() if now is None else now) + HOT_PATH_SECONDS)
            return
        if new:
            queued = 0
            try:  # the slot and the entry's place in the retry queue together (_take)
                self._take(self._retries, item)
                queued = 1
            finally:  # an interrupt just after: the entry queued must still go
                self._schedule_retries(stale=False, entries=queued)
            return
        self._retry(item, stale=False)

    def _tell(self, pipe: AsyncPipeline, meta: Any) -> None:
        """Give the C++ pipeline the newest view and the sequencer to ask."""
        self.positions.follow()
        view = meta.views[-1]
        with self._tell_lock:
            told = self._told
            if told is not None and told[0].epoch > meta.epoch:
                meta, view = told[0], told[0].views[-1]  # a slower thread's older snapshot: keep the newer view
            pipe.native.set_view(self._id, meta.epoch, data_oid_prefix(self.log.name, view), view.width, view.start,
                                 view.format, view.slots, view.unit)
            self._told = (meta, time.monotonic())
        # appends reaching the last quarter of the last open stripe open the next one ahead of them
        span, opened = stripe_span(view), self.log.open_stripes(view)
        self._open_ahead = stripe_start(view, opened) - span // 4 if span and opened else None
        seqr = self.positions.sequencer
        auth = None
        if seqr is not None:
            try:
                auth = seqr.auth_settings(self.log.pool)
            except ZlogError:
                seqr = None  # the pool's secret cannot be read: the Python path says why
        if seqr is None:
            pipe.native.set_sequencer(self._id, "", 0, 1.0)
        else:
            pipe.native.set_sequencer(self._id, seqr.host, seqr.port, seqr.timeout, auth)
        self._meta, self._generation = meta, self.positions.generation

    def count(self) -> None:
        """Bring the bytes the hot path took into metrics.BYTES_OUT (metrics.count_later)."""
        hot = self._hot
        if hot is not None:
            n = hot.take_bytes()
            if n:
                metrics.BYTES_OUT.inc(n)

    def stored(self, done: list[tuple[Future[int], int]], top: int | None = None) -> None:
        """Entries stored at their positions (`top` the highest): settle their futures."""
        metrics.APPENDS.inc(len(done))
        self._stale.reset()
        self._window.give(len(done))
        LazyFuture.settle_all(done)
        if top is None:
            top = max(position for _, position in done)
        ahead = self._open_ahead
        if ahead is not None and top >= ahead:
            self._open_ahead = None  # once: _tell sets it again for the next stripe
            (self._pipe or self._pipeline()).later(lambda: self._open_next(top))

    def outcome(self, item: Item, code: int, position: int, meta: wire.Meta | None = None) -> None:
        """An entry's outcome (the completion thread, or a retry's write made
        under `meta`)."""
        if code == 0:
            metrics.APPENDS.inc()
            metrics.APPEND_SECONDS["async"].observe(time.monotonic() - item[3])
            self._stale.reset()
            self._finish(item[1], result=position)
            return
        hot = self._hot
        if hot is not None:
            hot.disarm()  # until Python has looked again (a refresh, a retry, the sequencer)
        if time.monotonic() - item[3] > APPEND_DEADLINE_SECONDS:
            self._finish(item[1], error=ZlogError(
                f"append to {self.log.name!r} not stored in {APPEND_DEADLINE_SECONDS:.0f}s (last: errno {-code})"))
            return
        if code == HANDED_BACK:
            self._retry(item, stale=False)
            return
        if code == -errno.ENOENT and self.log.meta.views[-1].bounded:
            # its object is not made yet: make it and write there again, off
            # this thread, at the epoch the position was handed out under
            # (positions.py); at an epoch not known here, the entry takes a
            # new position instead (the old one is left a hole)
            meta = self._written_under(item, meta)
            if meta is None:
                self._retry(item, stale=False)
                return
            with self._retry_lock:
                self._remake.append((item, position, meta))
            (self._pipe or self._pipeline()).later(self._run_remakes)
            return
        try:
            outcome = judge(code, self.log.name, position, write_error(self.log, self.log.meta))
        except ZlogError as e:
            self._finish(item[1], error=e)
            return
        if outcome is Outcome.TAKEN:
            self._send(item)  # a new position, next batch
        else:
            # the epoch refused, not the newest one known: told that one is
            # refused, StaleWait would wait for a newer one and then repair
            # the log (take an epoch from a sequencer that serves it)
            meta = self._written_under(item, meta)
            self._refused_epoch = meta.epoch if meta is not None else 0
            self._retry(item, stale=True)

    def _written_under(self, item: Item, meta: wire.Meta | None) -> wire.Meta | None:
        """The metadata a write of `item` was made under: `meta`, given for
        the retry path's writes; for the C++ pipeline's, the view told to it
        last if the entry was queued after that, else not known (None)."""
        if meta is None:
            with self._tell_lock:
                told = self._told
            if told is not None and item[3] >= told[1]:
                return told[0]
        return meta

    def stats(self) -> dict[str, int]:
        """The connection's append pipeline counters (shared by its logs)."""
        return (self._pipe or self._pipeline()).stats()

    def _retry(self, item: Item, stale: bool) -> None:
        self._retries.append(item)
        self._schedule_retries(stale, entries=1)

    def _schedule_retries(self, stale: bool, entries: int) -> None:
        """Run the retry path soon; `entries` just queued for it (counted in `retried`)."""
        with self._retry_lock:
            self.retried += entries
            self._retry_stale = self._retry_stale or stale
            if self._retry_scheduled:
                return
            self._retry_scheduled = True
        (self._pipe or self._pipeline()).later(self._run_retries)

    def stranded_retries(self) -> bool:
        """Entries queued for the retry path that no scheduled job will take:
        still queued a sweep after they were (a Ctrl-C between queuing and
        scheduling)."""
        first = self._retries[0] if self._retries else None
        stranded = first is not None and first is self._swept
        self._swept = first
        return stranded

    def _run_retries(self) -> None:
        """On the retry thread: everything waiting, with one set of positions."""
        with self._retry_lock:
            stale, self._retry_stale = self._retry_stale, False
            self._retry_scheduled = False  # before taking the entries: one queued after is scheduled again
        batch = []
        retries = self._retries
        while retries:
            batch.append(retries.popleft())
        now = time.monotonic()
        todo = []
        for item in batch:
            if now - item[3] > APPEND_DEADLINE_SECONDS:
                self._finish(item[1], error=ZlogError(
                    f"append to {self.log.name!r} not stored in {APPEND_DEADLINE_SECONDS:.0f}s"))
            else:
                todo.append(item)
        if not todo:
            return
        try:
            if stale:
                self._stale(self._refused_epoch)  # refresh; back off, repair or give up if stuck
            first, meta = self.positions.take(len(todo))
        except ZlogError as e:
            for item in todo:
                self._finish(item[1], error=e)
            return
        self._write_at([(item, first + k) for k, item in enumerate(todo)], meta)

    def _write_at(self, placed: list[tuple[Item, int]], meta: wire.Meta) -> None:
        """Write each item at its position, at the epoch of `meta` (the one
        the positions were handed out under): outcomes come back to outcome()."""
        conn, pool = self.log.conn, self.log.data
        epoch = meta.epoch
        for item, pos in placed:
            where = place_of(self.log.name, meta.views, pos)
            def done(code: int, _v: Any, item: Item = item, pos: int = pos) -> None:
                self.outcome(item, code, pos, meta)
            try:
                conn.submit(pool, where.oid, Op.WRITE, done,
                            epoch=epoch, position=pos, data=item[2], format=where.format)
            except ZlogError as e:
                self._finish(item[1], error=e)

    def _run_remakes(self) -> None:
        """On the retry thread: make the objects writes found missing, then
        write those entries again at the same positions (a stale epoch sends
        them the stale way: new positions after a refresh)."""
        with self._retry_lock:
            batch, self._remake = self._remake, []
        if not batch:
            return
        made: dict[tuple[int, int, int], int] = {}
        again: list[tuple[Item, int, wire.Meta]] = []
        for item, pos, meta in batch:
            epoch, where = meta.epoch, place_of(self.log.name, meta.views, pos)
            key = (epoch, where.view.epoch, where.stripe)
            if key not in made:
                try:
                    made[key] = make(self.log, epoch, where) if where.view.bounded else -errno.ENOENT
                except ZlogError as e:  # told to the entry, never left waiting
                    self._finish(item[1], error=e)
                    continue
            code = made[key]
            if code == 0:
                again.append((item, pos, meta))
            elif code == -errno.ESTALE:
                self._refused_epoch = epoch
                self._retry(item, stale=True)
            else:
                self._finish(item[1], error=self.log.conn.error(code, f"append to {self.log.name!r}",
                                                                pool=self.log.data, oid=where.oid))
        self._meta = None  # _tell again: stripes were opened
        for item, pos, meta in again:
            self._write_at([(item, pos)], meta)

    def _open_next(self, top: int) -> None:
        """On the retry thread: open the stripe after the one holding `top`,
        before appends reach it (so they find its objects made)."""
        epoch, where = self.log.locate(top)
        view = where.view
        nxt = stripe_start(view, where.stripe + 1)
        if not view.bounded or nxt > MAX_POSITION or view is not self.log.meta.views[-1]:
            return
        if where.stripe + 1 < self.log.open_stripes(view):
            return
        try:
            make(self.log, epoch, place(self.log.name, view, nxt))
        except ZlogError as e:  # appends that reach it make it themselves
            logger.debug("log %r: opening stripe %d ahead failed: %s", self.log.name, where.stripe + 1, e)
        self._meta = None  # _tell again: the next stripe's threshold

    # ----------------------------------------------------------------- reads
    def read(self, position: int, future: Future[bytes] | None = None) -> Future[bytes]:
        fut: Future[bytes] = LazyFuture() if future is None else future  # before the slot, as append()
        slot: list[bool] = []  # the read's slot, taken with it (_take): see _finish
        try:
            self._take(slot)
            self._read(position, fut, None, slot)
        except BaseException as e:
            if not slot:  # nothing taken (closed, or interrupted while waiting), or settled already
                raise
            self._finish(fut, error=e, slot=slot)
            if not isinstance(e, Exception):
                raise  # an interrupt (Ctrl-C) goes on; a read sent all the same finds its slot given back
        return fut

    def _read(self, position: int, fut: Future[bytes], stale: StaleWait | None, slot: list[bool]) -> None:
        epoch, where = self.log.locate(position)
        oid = where.oid
        log = self.log

        def done(code: int, value: Any) -> None:
            if code == 0:
                metrics.read(len(value))
                try:
                    self._finish(fut, result=log.decode(value), slot=slot)
                except Exception as e:  # noqa: BLE001 - a corrupt payload fails this read only
                    self._finish(fut, error=ZlogError(f"position {position}: cannot decode entry: {e}"), slot=slot)
            elif code == -errno.ENOENT and position < log.meta.trim_below:
                self._finish(fut, error=Trimmed(position, errno=errno.ENOENT), slot=slot)
            elif code == -errno.ENOENT and stale is None:
                # its object never made: under a view from before a reconfiguration, maybe
                # not the object that holds it now (a metadata read, off the completion thread)
                (self._pipe or self._pipeline()).later(lambda: self._recheck(position, fut, epoch, slot))
            elif code == -errno.ENOENT:
                self._finish(fut, error=NotWritten(position, errno=errno.ENOENT), slot=slot)
            elif code == -errno.ESTALE:
                # refresh off the completion thread, then try again
                (self._pipe or self._pipeline()).later(lambda: self._reread(position, fut, stale, epoch, slot))
            else:
                self._finish(fut, error=log.conn.error(code, f"read at {position} of {log.name!r}", pool=log.data,
                                                      oid=oid, position=position, op=Op.READ), slot=slot)

        log.conn.submit(log.data, oid, Op.READ, done, epoch=epoch, position=position, format=where.format)

    def _recheck(self, position: int, fut: Future[bytes], epoch: int, slot: list[bool]) -> None:
        """A read found the position's object never made: read it again if the
        log is past the epoch it was read at (read as sync reads do), else
        it is not written."""
        try:
            if self.log.moved_past(epoch):
                self._read(position, fut, StaleWait(self.log, f"read_async at {position}"), slot)
            else:
                self._finish(fut, error=NotWritten(position, errno=errno.ENOENT), slot=slot)
        except BaseException as e:  # noqa: BLE001 - as read(): the future is told, whatever went wrong
            self._finish(fut, error=e, slot=slot)

    def _reread(self, position: int, fut: Future[bytes], stale: StaleWait | None, epoch: int,
                slot: list[bool]) -> None:
        stale = stale or StaleWait(self.log, f"read_async at {position}")
        try:
            stale(epoch)
            self._read(position, fut, stale, slot)
        except ZlogError as e:
            self._finish(fut, error=e, slot=slot)

    # ----------------------------------------------------------------- admin
    def flush(self, timeout: float | None = None) -> None:
        """Wait until nothing is in flight (Timeout after `timeout` seconds).
        Not from a done-callback: it runs on the thread that settles what
        flush() would wait for (InvalidRequest, rather than a wait for ever)."""
        if self.in_flight and on_own_thread():
            raise InvalidRequest("flush() in a done-callback would wait for the thread it runs on: "
                                 "flush from the application's own thread")
        if not self._window.wait_idle(timeout):
            raise Timeout(f"{self.in_flight} operations of {self.log.name!r} still in flight after {timeout}s",
                          errno=errno.ETIMEDOUT)

    def close(self) -> None:
        # every append is settled within its deadline, so this waits for all
        # of them; past that, a slot an interrupt (Ctrl-C) left counted at the
        # wrong moment, which must not make close() wait for ever
        if not on_own_thread():  # a done-callback closing its log cannot wait for its own thread
            try:
                self.flush(APPEND_DEADLINE_SECONDS + CLOSE_GRACE_SECONDS)
            except Timeout as e:
                logger.warning("closing %r: %s (an interrupt mid-append can leave one counted)", self.log.name, e)
        self._closed = True  # (before remove_log: a "no such log" from the pipeline means closed)
        self._window.close()
        self.count()
        if self._pipe is not None:
            try:
                self._pipe.native.remove_log(self._id)
            except (RuntimeError, ValueError):
                pass
