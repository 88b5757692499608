"""Asynchronous appends and reads with a bounded number in flight.

append_async returns a concurrent.futures.Future of the position. Queued
entries are sent in batches: one sequencer request takes positions for every
entry waiting, then each entry is written with an aio class call: from C++
(fastappend.py) when it can be, else through python-rados. A write's outcome
is judged as every append's is (appending.judge): an entry refused for its
epoch or its position goes back to the queue and gets a new position, and its
future resolves only once the entry is stored (or fails after
APPEND_DEADLINE_SECONDS).
"""
from __future__ import annotations

import errno
import functools
import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any

from . import metrics
from ..core import wire
from .appending import APPEND_DEADLINE_SECONDS, Outcome, judge
from ..core.errors import NotWritten, ZlogError, from_errno
from .fastappend import HANDED_BACK, NativeAppends
from .positions import Positions
from .stale import StaleWait
from ..core.state import LogState

logger = logging.getLogger("pyzlog")

DEFAULT_MAX_IN_FLIGHT = 128


def native_reads_enabled() -> bool:
    return os.environ.get("PYZLOG_NATIVE_READS", "1") != "0"


class AsyncOps:
    """Per-op cost matters here (it bounds appends/s per client), so the hot
    path takes one plain lock for the in-flight count, waits on a Condition
    only when max_in_flight is reached, and sets or clears the idle Event only
    when the client goes idle or busy."""

    def __init__(self, log: LogState, positions: Positions, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 coalesce: bool = True) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.log = log
        self.positions = positions
        self.max_in_flight = max_in_flight
        self.coalesce = coalesce
        self._lock = threading.Lock()  # guards _in_flight, _waiting, _closed, _thread
        self._room = threading.Condition(self._lock)  # _in_flight went below max_in_flight
        self._waiting = 0  # threads waiting for room
        self._idle = threading.Event()  # set while nothing is in flight
        self._idle.set()
        self._work = threading.Event()  # the dispatcher has queued entries to send
        self._queue: deque[tuple[bytes, Future[int], float]] = deque()
        self._in_flight = 0
        self._refresh = False  # a write was refused for its epoch: see _stale before the next round
        self._refused_epoch = 0
        self._stale = StaleWait(log, "async append")
        self._closed = False
        self._thread: threading.Thread | None = None
        self._native: NativeAppends | None = None
        self._native_lock = threading.Lock()
        self._native_generation = -1  # positions.generation the C++ path was opened for
        self._reads: Any = None  # fastread.Reads: read_async on the cffi path
        self._read_pool: Any = None
        self._reads_tried = False
        metrics.ASYNC.track(self)

    def _begin(self) -> None:
        with self._lock:
            while self._in_flight >= self.max_in_flight and not self._closed:
                self._waiting += 1
                self._room.wait()
                self._waiting -= 1
            if self._closed:
                raise ZlogError("log is closed")
            if not self._in_flight:
                self._idle.clear()
            self._in_flight += 1

    # --------------------------------------------------------------- appends
    def append(self, stored: bytes) -> Future[int]:
        """`stored` is already encoded and size-checked."""
        self._begin()
        fut: Future[int] = Future()
        item = (stored, fut, time.monotonic())
        usable = self.positions.sequencer_usable(item[2])  # follows a change of sequencer
        native = self._native if self._native_generation == self.positions.generation else self._open_native()
        if native is not None and usable:
            try:
                native.append(self.log.meta, stored, item)
            except RuntimeError:  # closed under us by a concurrent close()
                self._finish(fut, error=ZlogError("log is closed"))
        else:
            self._requeue(item)
        return fut

    def _open_native(self) -> NativeAppends | None:
        """The C++ path for the sequencer asked now; one for an earlier
        sequencer is closed in the background (what it holds completes)."""
        with self._native_lock:
            generation = self.positions.generation
            if self._native_generation != generation:
                old = self._native
                self._native = NativeAppends.open(self.log, self.positions.sequencer, self._native_done,
                                                  self.coalesce)
                self._native_generation = generation
                if old is not None:
                    threading.Thread(target=old.close, name="pyzlog-append-close", daemon=True).start()
        return self._native

    def _requeue(self, item: tuple[bytes, Future[int], float]) -> None:
        """Append `item` through the Python dispatcher (a new position)."""
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._dispatch, name="pyzlog-append", daemon=True)
                    self._thread.start()
        self._queue.append(item)
        if not self._work.is_set():
            self._work.set()

    def _dispatch(self) -> None:
        while True:
            self._work.wait()
            self._work.clear()
            batch = []
            now = time.monotonic()
            while self._queue:
                item = self._queue.popleft()
                if now - item[2] > APPEND_DEADLINE_SECONDS:
                    self._finish(item[1], error=ZlogError("append did not complete in time"))
                else:
                    batch.append(item)
            if not batch:
                if self._closed:
                    return
                continue
            refresh, self._refresh = self._refresh, False
            try:
                if refresh:
                    self._stale(self._refused_epoch)  # refresh; back off, repair or give up if stuck
                first = self.positions.take(len(batch))
            except ZlogError as e:
                for _, fut, _ in batch:
                    self._finish(fut, error=e)
                continue
            for k, (stored, fut, t0) in enumerate(batch):
                pos = first + k
                epoch, oid = self.log.locate(pos)
                self.log.data.submit(oid, "write", wire.write(epoch, pos, stored), 0,
                                     functools.partial(self._written, stored, fut, pos, t0))

    def _native_done(self, item: tuple[bytes, Future[int], float], pos: int, code: int) -> None:
        if code == HANDED_BACK:
            self._requeue(item)
        else:
            self._written(item[0], item[1], pos, item[2], code, b"")

    def _written(self, stored: bytes, fut: Future[int], pos: int, t0: float, ret: int, _out: bytes) -> None:
        try:
            outcome = judge(ret, self.log.name, pos)
        except ZlogError as e:
            self._finish(fut, error=e)
            return
        if outcome is Outcome.STORED:
            self._stale.reset()
            self._finish(fut, result=pos)
            return
        if outcome is Outcome.STALE:
            self._refused_epoch = self.log.epoch
            self._refresh = True
        self._requeue((stored, fut, t0))  # a new position next round

    def _finish(self, fut: Future, result: object = None, error: BaseException | None = None) -> None:  # type: ignore[type-arg]
        # free the slot first: a done-callback that submits again must not block
        with self._lock:
            self._in_flight -= 1
            if self._waiting:
                self._room.notify()
            if not self._in_flight:
                self._idle.set()
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)

    # ----------------------------------------------------------------- reads
    def read(self, position: int) -> Future[bytes]:
        self._begin()
        fut: Future[bytes] = Future()
        self._read(position, fut, StaleWait(self.log, f"read_async at {position}"))
        return fut

    def _native_reads(self) -> Any:
        """fastread.Reads on this cluster's native connection (opened on the
        first read), or None to read through python-rados."""
        if not self._reads_tried:
            with self._native_lock:
                if not self._reads_tried:
                    self._reads_tried = True
                    if native_reads_enabled():
                        try:
                            from ..core import fastread

                            native = fastread.Native.of(self.log.cluster)
                            self._read_pool = native.pool(self.log.pool)
                            self._reads = fastread.Reads(native)
                        except (ImportError, ZlogError) as e:
                            logger.warning("read_async on %r goes through python-rados: the native read "
                                           "path is unavailable (%s)", self.log.name, e)
        return self._reads

    def _read(self, position: int, fut: Future[bytes], stale: StaleWait) -> None:
        epoch, oid = self.log.locate(position)

        def done(ret: int, out: bytes | None) -> None:
            if ret == 0:
                metrics.read(len(out or b""))
                try:
                    self._finish(fut, result=self.log.decode(out or b""))
                except Exception as e:  # noqa: BLE001 - a corrupt payload fails this read only
                    self._finish(fut, error=ZlogError(f"position {position}: cannot decode entry: {e}"))
            elif ret == -errno.ENOENT:
                self._finish(fut, error=NotWritten(position))
            elif ret == -errno.ESTALE:
                # refresh off the completion thread, then try again
                threading.Thread(target=self._reread, args=(position, fut, stale, epoch), daemon=True).start()
            else:
                self._finish(fut, error=from_errno(ret, f"read at {position}", position))

        reads = self._reads if self._reads_tried else self._native_reads()
        if reads is not None:
            try:
                reads.submit(self._read_pool, oid, epoch, position, done)
                return
            except ZlogError:  # closed under us: the python-rados path still works
                pass
        self.log.data.submit(oid, "read", wire.epoch_position(epoch, position),
                             wire.MAX_ENTRY_BYTES + 64, done)

    def _reread(self, position: int, fut: Future[bytes], stale: StaleWait, epoch: int) -> None:
        try:
            stale(epoch)
            self._read(position, fut, stale)
        except ZlogError as e:
            self._finish(fut, error=e)

    # ----------------------------------------------------------------- admin
    def flush(self, timeout: float | None = None) -> None:
        """Wait until nothing is in flight."""
        if not self._idle.wait(timeout):
            raise TimeoutError(f"{self._in_flight} operations still in flight")

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._closed = True
            self._room.notify_all()
        self._work.set()
        if self._thread:
            self._thread.join(5)
        if self._native is not None:
            self._native.close()
        if self._reads is not None:
            self._reads.close()
