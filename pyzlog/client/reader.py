"""Streaming reads: positions in order, gaps as typed records, holes filled.

A stream walks the log one view at a time. For each data object of the view
an ObjectCursor keeps a window of that object's entries, fetched with the
class's read_range (one call returns up to `per_call` entries) and refilled
ahead of the reader with aio, so a stream costs one OSD round trip per
`per_call` entries per object, not one per entry.

A position below the tail that is still unwritten is a hole: the writer that
took the number is slow or dead. The reader waits up to `hole_wait` seconds
for it, then fills it, and reports it as LOST so the log moves on.
"""
from __future__ import annotations

import bisect
import errno
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum

from . import metrics, ops
from ..core import wire
from ..core.errors import Filled, InvalidRequest, ReadOnly, Trimmed, from_errno
from ..core.layout import check_position, data_oid, view_end, view_of
from .stale import StaleWait
from ..core.state import LogState

#: default seconds a reader waits on an unwritten position below the tail
HOLE_WAIT_SECONDS = 2.0
#: entries asked of one object per read_range call
PER_CALL = 512
#: byte budget of one read_range reply
CALL_BYTES = 4 << 20
#: partitions of a log: a stride is a view's width or a count of readers
MAX_STRIDE = 1 << 32
#: follow mode: longest pause between polls of an idle tail
MAX_POLL_SECONDS = 0.25


class RecordKind(str, Enum):
    DATA = "data"        # an entry
    FILLED = "filled"    # junk, filled by some client: never data
    TRIMMED = "trimmed"  # reclaimed: the data is gone
    LOST = "lost"        # a hole filled by a reader after waiting: its writer never wrote


@dataclass(frozen=True, slots=True)
class Record:
    position: int
    kind: RecordKind
    data: bytes | None
    epoch: int  # epoch of the request that stored it (0 if unknown, e.g. trimmed)


class ObjectCursor:
    """One data object's entries in [first, last], fetched ahead with aio."""

    def __init__(self, log: LogState, oid: str, first: int, last: int, stride: int,
                 per_call: int = PER_CALL, call_bytes: int = CALL_BYTES) -> None:
        self.log = log
        self.oid = oid
        self.last = last
        self.per_call = per_call
        self.call_bytes = call_bytes
        self.known_upto = first  # every position of this object < known_upto is accounted for
        self.entries: deque[wire.RangeEntry] = deque()
        self.trim_below = 0
        self.max_position: int | None = None
        self._pending: Future[tuple[int, bytes]] | None = None
        self._pending_from = first
        self._pending_epoch = 0
        self._stride = stride  # the object holds every stride-th position
        self.max_fresh = False  # has a fetch completed since the last forget_from?
        self._stale = StaleWait(log, f"read_range on {oid}")

    def _issue(self) -> None:
        if self._pending is None and self.known_upto <= self.last:
            first = self.known_upto
            last = min(self.last, first + self._stride * self.per_call - 1)
            self._pending_from = first
            self._pending_epoch = epoch = self.log.epoch
            self._pending = self.log.data.call_async(
                self.oid, "read_range",
                wire.read_range(epoch, first, last, self.per_call, self.call_bytes),
                wire.range_reply_size(self.per_call, self.call_bytes))

    def _wait(self) -> None:
        self._issue()
        assert self._pending is not None
        fut, self._pending = self._pending, None
        ret, out = fut.result()
        if ret == -errno.ESTALE:
            self._stale(self._pending_epoch)  # StaleEpoch if the epoch stays refused
            return  # the caller loops and re-issues at the new epoch
        self._stale.reset()
        if ret == -errno.ENOENT:  # object never created: nothing stored in the range
            self.known_upto = min(self.last, self._pending_from + self._stride * self.per_call - 1) + 1
            self.max_fresh = True
            return
        if ret < 0:
            raise from_errno(ret, f"read_range on {self.oid}")
        reply = wire.parse_range_reply(out)
        self.trim_below = max(self.trim_below, reply.trim_below)
        if reply.max_position is not None:
            self.max_position = max(self.max_position or 0, reply.max_position)
        self.entries.extend(e for e in reply.entries if e.position >= self.known_upto)
        self.known_upto = max(self.known_upto, reply.next)
        self.max_fresh = True

    def start(self) -> None:
        """Begin fetching (so many objects are read concurrently)."""
        self._issue()

    def refresh_max(self) -> None:
        """Make max_position current: at least one fetch since the last forget."""
        while not self.max_fresh and self.known_upto <= self.last:
            self._wait()

    def lookup(self, position: int) -> wire.RangeEntry | None:
        """The entry stored at `position`, a TRIMMED stand-in under the trim
        watermark, or None when it is unwritten (as of the last fetch).
        Positions must be asked in increasing order."""
        while self.known_upto <= position:
            self._wait()
        while self.entries and self.entries[0].position < position:
            self.entries.popleft()
        if len(self.entries) < self.per_call // 4:
            self._issue()  # read ahead while the caller works through this window
        if self.entries and self.entries[0].position == position:
            return self.entries.popleft()
        if position < self.trim_below:
            return wire.RangeEntry(position, wire.EntryState.TRIMMED, 0, b"")
        return None

    def forget_from(self, position: int) -> None:
        """Drop what is known from `position` on, so it is read again."""
        self._pending = None  # a late reply would be about the old state
        self.max_fresh = False
        self.known_upto = min(self.known_upto, position)
        while self.entries and self.entries[-1].position >= position:
            self.entries.pop()


class HoleClock:
    """The gap rule every stream follows (Stream here, batches.BatchStream
    on the native path): an unwritten position is a hole once some later
    position is known to have been handed out, and it is filled as LOST
    after `hole_wait` seconds from the first time that was known. Holes
    found together (one lost batch of positions) are waited for together."""

    def __init__(self, hole_wait: float, known_tail: int | None = None) -> None:
        self.hole_wait = hole_wait
        self.known_tail = known_tail  # the caller knows every position below this was handed out
        # (bound, first seen): since then every position below bound was known
        # to have been handed out. Bounds increase.
        self._bounds: list[float] = []
        self._times: list[float] = []

    def saw_tail(self, bound: int, passed: int) -> None:
        """Every position below `bound` was handed out, as seen now; the
        stream has passed every position below `passed`."""
        if not self._bounds or bound > self._bounds[-1]:
            self._bounds.append(bound)
            self._times.append(time.monotonic())
            if len(self._bounds) > 64:  # a long follow: forget bounds the stream has passed
                keep = max(bisect.bisect_right(self._bounds, passed) - 1, 0)
                del self._bounds[:keep], self._times[:keep]

    def since(self, position: int, view_end: int | None, highest: Callable[[], int | None]) -> float | None:
        """When `position` was first known to lie below the tail, or None if
        it is at the tail. `view_end`: where its view ends, if a later view
        exists; `highest()`: the highest position stored in its view now."""
        if view_end is not None:
            self.saw_tail(view_end, position)  # a later view exists: all of this one is below the tail
        elif self.known_tail is not None and position < self.known_tail:
            self.saw_tail(self.known_tail, position)
        else:
            top = highest()
            if top is not None:
                self.saw_tail(top, position)
        i = bisect.bisect_right(self._bounds, position)
        return self._times[i] if i < len(self._bounds) else None

    def wait_for(self, since: float) -> float:
        """Seconds to sleep before looking at a hole first known at `since`
        again; 0 means its wait is over: fill it."""
        waited = time.monotonic() - since
        if waited >= self.hole_wait:
            return 0.0
        return min(0.01 + waited / 4, 0.2, self.hole_wait - waited)


def fill_hole(log: LogState, position: int) -> bool:
    """Fill a hole whose wait is over, recording it as lost; False if someone
    else wrote, filled or trimmed it first (read it again)."""
    try:
        ops.fill(log, position, wire.FILL_LOST)
    except (Filled, Trimmed, ReadOnly):
        return False
    metrics.HOLES_FILLED.inc()
    return True


class Stream:
    """Iterator over positions [start, end) of a log; see Log.stream."""

    def __init__(self, log: LogState, start: int = 0, end: int | None = None, *, follow: bool = False,
                 hole_wait: float = HOLE_WAIT_SECONDS, per_call: int = PER_CALL,
                 decode: Callable[[bytes], bytes] | None = None, stride_index: int | None = None,
                 stride: int | None = None, known_tail: int | None = None) -> None:
        if (stride_index is None) != (stride is None) or (stride is not None and stride < 1):
            raise InvalidRequest("stride_index and stride (>= 1) come together")
        self.log = log
        self.position = start
        self.end = end
        self.follow = follow
        self.hole_wait = hole_wait
        self.per_call = per_call
        self.decode = decode or (lambda b: b)
        # only positions p with p % stride == stride_index, wherever the views
        # put them (a Spark partition: one object of the view it was planned in)
        self.stride_index = stride_index
        self.stride = stride
        self.holes = HoleClock(hole_wait, known_tail)
        self._view: wire.View | None = None
        self._view_end: int | None = None
        self._cursors: list[ObjectCursor] = []
        self._views: tuple[wire.View, ...] | None = None
        self._idle_since: float | None = None

    def __iter__(self) -> Iterator[Record]:
        return self

    # ----------------------------------------------------------- view segments
    def _enter_view(self) -> None:
        views = self._views = self.log.views
        view = view_of(views, self.position)
        self._view = view
        self._view_end = view_end(views, view)
        last = (self._view_end - 1) if self._view_end is not None else wire.MAX_POSITION
        if self.end is not None:
            last = min(last, self.end - 1)
        self._cursors = []
        for i in range(view.width):
            self._cursors.append(ObjectCursor(self.log, data_oid(self.log.name, view, i), self.position,
                                              last, view.width, self.per_call))
        if self.stride_index is not None and self.stride is not None:
            self.position += (self.stride_index - self.position) % self.stride
        else:
            for c in self._cursors:
                c.start()

    def _highest(self) -> int | None:
        for c in self._cursors:
            c.refresh_max()  # every object, not only those read so far
        return max((c.max_position for c in self._cursors if c.max_position is not None), default=None)

    def _advance(self) -> None:
        self.position += self.stride or 1

    def __next__(self) -> Record:
        while True:
            if self.end is not None and self.position >= self.end:
                raise StopIteration
            if self._views is not self.log.views and self._view is not None:
                # the view history changed (reconfiguration): the current view may end now
                self._views = self.log.views
                self._view_end = view_end(self._views, self._view)
            if self._view is None or (self._view_end is not None and self.position >= self._view_end):
                self._enter_view()
                continue
            cursor = self._cursors[self.position % self._view.width]
            entry = cursor.lookup(self.position)
            rec = self._record(entry) if entry is not None else self._unwritten(cursor)
            if rec is not None:
                self._idle_since = None
                self._advance()
                return rec

    def _record(self, e: wire.RangeEntry) -> Record:
        if e.state == wire.EntryState.WRITTEN:
            metrics.read(len(e.data))
            return Record(e.position, RecordKind.DATA, self.decode(e.data), e.epoch)
        if e.state == wire.EntryState.FILLED:
            kind = RecordKind.LOST if e.data == wire.LOST_MARK else RecordKind.FILLED
        else:
            kind = RecordKind.TRIMMED
        return Record(e.position, kind, None, e.epoch)

    def _unwritten(self, cursor: ObjectCursor) -> Record | None:
        """An unwritten position: a hole to wait on and then fill, or the tail.
        None means "look again"."""
        pos = self.position
        since = self.holes.since(pos, self._view_end, self._highest)
        if since is None:
            if not self.follow:
                raise StopIteration  # reached the tail
            self._wait_at_tail(pos)
            return None
        pause = self.holes.wait_for(since)
        if pause:
            time.sleep(pause)
            cursor.forget_from(pos)
            return None
        if fill_hole(self.log, pos):
            return Record(pos, RecordKind.LOST, None, self.log.epoch)
        cursor.forget_from(pos)  # someone else got there first: read what it is now
        return None

    def _wait_at_tail(self, pos: int) -> None:
        """Follow mode: sleep with backoff, then re-read every object from `pos`
        (a write anywhere ahead reveals `pos` as a hole) and the view history."""
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        time.sleep(min(0.002 * 2 ** min((now - self._idle_since) * 10, 7), MAX_POLL_SECONDS))
        for c in self._cursors:
            c.forget_from(pos)
            c.start()
        self.log.refresh()


def check_stream_args(start: int, end: int | None, stride_index: int | None = None,
                      stride: int | None = None) -> None:
    for name, v in (("stride", stride), ("stride_index", stride_index)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            raise InvalidRequest(f"{name} must be an integer, not {v!r}")
    if (stride_index is None) != (stride is None) or (stride is not None and not 1 <= stride <= MAX_STRIDE):
        raise InvalidRequest(f"stride_index and stride (1..{MAX_STRIDE}) come together")
    if stride is not None and stride_index is not None and not 0 <= stride_index < stride:
        raise InvalidRequest(f"stride_index {stride_index} is not in [0, {stride})")
    check_position(start)
    if end is not None:
        check_position(end)
        if end < start:
            raise InvalidRequest(f"bad range: end {end} is before start {start}")
