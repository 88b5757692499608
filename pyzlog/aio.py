"""Asynchronous appends and reads with a bounded number in flight.

append_async returns a concurrent.futures.Future of the position. Queued
entries are sent in batches: one sequencer request takes positions for every
entry waiting, then each entry is written with an aio class call. An entry
whose write is refused (stale epoch, position taken) goes back to the queue
and gets a new position; its future resolves only once the entry is stored.
"""
from __future__ import annotations

import errno
import functools
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import TYPE_CHECKING

from . import wire
from .errors import NotWritten, ZlogError, from_errno

if TYPE_CHECKING:
    from .log import Log

DEFAULT_MAX_IN_FLIGHT = 128
_RETRYABLE = (-errno.ESTALE, -errno.EROFS, -errno.ENOMSG, -errno.EIDRM)


class AsyncOps:
    """Per-op cost matters here (it bounds appends/s per client), so the hot
    path uses one plain lock for the in-flight count and Events that are set
    or cleared only when the client goes idle or busy."""

    def __init__(self, log: Log, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.log = log
        self.max_in_flight = max_in_flight
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._lock = threading.Lock()  # guards _in_flight, _closed, _thread
        self._idle = threading.Event()  # set while nothing is in flight
        self._idle.set()
        self._work = threading.Event()  # the dispatcher has queued entries to send
        self._queue: deque[tuple[bytes, Future[int], float]] = deque()
        self._in_flight = 0
        self._refresh = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def _begin(self) -> None:
        self._slots.acquire()
        with self._lock:
            if self._closed:
                self._slots.release()
                raise ZlogError("log is closed")
            if not self._in_flight:
                self._idle.clear()
            self._in_flight += 1

    # --------------------------------------------------------------- appends
    def append(self, stored: bytes) -> Future[int]:
        """`stored` is already encoded and size-checked."""
        self._begin()
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._dispatch, name="pyzlog-append", daemon=True)
                    self._thread.start()
        fut: Future[int] = Future()
        self._queue.append((stored, fut, time.monotonic()))
        if not self._work.is_set():
            self._work.set()
        return fut

    def _dispatch(self) -> None:
        from .log import APPEND_DEADLINE_SECONDS

        while True:
            self._work.wait()
            self._work.clear()
            batch = []
            while self._queue:
                batch.append(self._queue.popleft())
            if not batch:
                if self._closed:
                    return
                continue
            refresh, self._refresh = self._refresh, False
            try:
                if refresh:
                    self.log.refresh()
                first = self.log.take_positions(len(batch))
            except ZlogError as e:
                for _, fut, _ in batch:
                    self._finish(fut, error=e)
                continue
            epoch = self.log.epoch
            now = time.monotonic()
            for k, (stored, fut, t0) in enumerate(batch):
                if now - t0 > APPEND_DEADLINE_SECONDS:
                    self._finish(fut, error=ZlogError("append did not complete in time"))
                    continue
                pos = first + k
                self.log.data.submit(self.log.oid_of(pos), "write", wire.write(epoch, pos, stored), 0,
                                     functools.partial(self._written, stored, fut, pos, t0))

    def _written(self, stored: bytes, fut: Future[int], pos: int, t0: float, ret: int, _out: bytes) -> None:
        if ret == 0:
            self._finish(fut, result=pos)
        elif ret in _RETRYABLE:
            if ret == -errno.ESTALE:
                self._refresh = True
            self._queue.append((stored, fut, t0))  # a new position next round
            self._work.set()
        else:
            self._finish(fut, error=from_errno(ret, f"append to {self.log.name!r}", pos))

    def _finish(self, fut: Future, result: object = None, error: BaseException | None = None) -> None:  # type: ignore[type-arg]
        # free the slot first: a done-callback that submits again must not block
        self._slots.release()
        with self._lock:
            self._in_flight -= 1
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
        self._read(position, fut, time.monotonic())
        return fut

    def _read(self, position: int, fut: Future[bytes], t0: float) -> None:
        epoch = self.log.epoch

        def done(ret: int, out: bytes) -> None:
            if ret == 0:
                try:
                    self._finish(fut, result=self.log.decode(out))
                except Exception as e:  # noqa: BLE001 - a corrupt payload fails this read only
                    self._finish(fut, error=ZlogError(f"position {position}: cannot decode entry: {e}"))
            elif ret == -errno.ENOENT:
                self._finish(fut, error=NotWritten(position))
            elif ret == -errno.ESTALE and time.monotonic() - t0 < 30:
                # refresh off the librados callback thread, then try again
                threading.Thread(target=self._reread, args=(position, fut, t0, epoch), daemon=True).start()
            else:
                self._finish(fut, error=from_errno(ret, f"read at {position}", position))

        self.log.data.submit(self.log.oid_of(position), "read", wire.epoch_position(epoch, position),
                             wire.MAX_ENTRY_BYTES + 64, done)

    def _reread(self, position: int, fut: Future[bytes], t0: float, epoch: int) -> None:
        try:
            if self.log.refresh().epoch == epoch:
                time.sleep(0.005)
            self._read(position, fut, t0)
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
        self._work.set()
        if self._thread:
            self._thread.join(5)
