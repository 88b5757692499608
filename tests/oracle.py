"""The oracle: round 2's stream() on python-rados, kept as the reference the
native path (pyzlog.client.batches) is checked against.

A plain, independent walk: every read_range goes out through python-rados'
Ioctx.execute, in protocol 1 to an omap-format view's objects and in
protocol 2 (with the format field) to a data-format view's, its request
built and its reply parsed here with struct, not with the data plane's
codecs; a data-format view's stripes and object names are worked out here
too (docs/storage.md). What it finds at each position (data, a gap kind, a
hole to wait on and fill, the tail) follows the same rules
(reader.HoleClock, ops.fill_hole), so for any log the two must give the
same records.
"""
from __future__ import annotations

import errno
import struct
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from pyzlog.client import metrics
from pyzlog.client.ops import fill_hole
from pyzlog.client.reader import check_stream_args
from pyzlog.client.reader import HOLE_WAIT_SECONDS, MAX_POLL_SECONDS, HoleClock, Record, RecordKind
from pyzlog.client.stale import StaleWait
from pyzlog.core import wire
from pyzlog.core.errors import InvalidRequest, error_for
from pyzlog.core.layout import first_in_stride, view_end, view_of
from pyzlog.core.state import LogState

#: entries asked of one object per read_range call
PER_CALL = 512
#: byte budget of one read_range reply
CALL_BYTES = 4 << 20

_RANGE_REQ = struct.Struct("<QQQII")
_RANGE_HEAD = struct.Struct("<QBQQI")
_RANGE_ENTRY = struct.Struct("<QBQI")
#: protocol 2: u8 struct_v, u8 compat_v, u32 length; a record is pos, epoch, len, state
_ENVELOPE = struct.Struct("<BBI")
_RANGE_REC2 = struct.Struct("<QQIB")
_DATA_FORMAT = 3


def parse_range_reply(buf: bytes) -> tuple[int, int | None, int, list[wire.RangeEntry]]:
    """A protocol 1 read_range reply: (trim_below, max, next, entries)."""
    trim_below, has_max, max_pos, nxt, n = _RANGE_HEAD.unpack_from(buf, 0)
    off = _RANGE_HEAD.size
    entries = []
    for _ in range(n):
        pos, state, epoch, ln = _RANGE_ENTRY.unpack_from(buf, off)
        off += _RANGE_ENTRY.size
        entries.append(wire.RangeEntry(pos, wire.EntryState(state), epoch, bytes(buf[off:off + ln])))
        off += ln
    if off != len(buf):
        raise ValueError("malformed read_range reply")
    return trim_below, (max_pos if has_max else None), nxt, entries


def parse_range_reply2(buf: bytes) -> tuple[int, int | None, int, list[wire.RangeEntry]]:
    """A protocol 2 read_range reply: the records, then their data back to back."""
    _v, _compat, length = _ENVELOPE.unpack_from(buf, 0)
    if _ENVELOPE.size + length != len(buf):
        raise ValueError("malformed read_range reply")
    trim_below, has_max, max_pos, nxt, n = _RANGE_HEAD.unpack_from(buf, _ENVELOPE.size)
    off = _ENVELOPE.size + _RANGE_HEAD.size
    recs = [_RANGE_REC2.unpack_from(buf, off + k * _RANGE_REC2.size) for k in range(n)]
    off += n * _RANGE_REC2.size
    entries = []
    for pos, epoch, ln, state in recs:
        entries.append(wire.RangeEntry(pos, wire.EntryState(state), epoch, bytes(buf[off:off + ln])))
        off += ln
    if off != len(buf):
        raise ValueError("malformed read_range reply")
    return trim_below, (max_pos if has_max else None), nxt, entries


def object_index(view: wire.View, position: int) -> int:
    """Which of its stripe's objects holds `position` (docs/storage.md,
    "Stripes"): position % width, or in a view dealt in runs of `unit`, the
    run's turn."""
    if view.format != _DATA_FORMAT or view.unit == 1:
        return position % view.width
    span = view.width * view.slots
    stripe_start = view.start + (position - view.start) // span * span
    return (position - stripe_start) // view.unit % view.width


def segment(log: LogState, view: wire.View, position: int) -> tuple[list[str], int | None]:
    """The objects holding `position`'s part of `view` (by position % width),
    and where that part ends (None: with the view): a data-format view's
    stripe of `slots` positions per object, named ...s{stripe}.{index}."""
    prefix = f"zlog.{log.name}.{view.epoch}."
    if view.format != _DATA_FORMAT:
        return [f"{prefix}{i}" for i in range(view.width)], None
    span = view.width * view.slots
    stripe = (position - view.start) // span
    return [f"{prefix}s{stripe}.{i}" for i in range(view.width)], view.start + (stripe + 1) * span


class _Rados:
    """read_range through python-rados, in protocol 1, answered as a Future."""

    _ioctx: dict[int, Any] = {}

    def __init__(self, log: LogState) -> None:
        key = id(log)
        if key not in self._ioctx:
            self._ioctx[key] = log.cluster.open_ioctx(log.pool)
        self.ioctx = self._ioctx[key]

    def read_range(self, oid: str, epoch: int, first: int, last: int, n: int, nbytes: int,
                   data_format: bool = False) -> Future[tuple[int, bytes]]:
        import rados

        fut: Future[tuple[int, bytes]] = Future()
        body = _RANGE_REQ.pack(epoch, first, last, n, nbytes)
        method = "read_range"
        if data_format:
            body += struct.pack("<B", _DATA_FORMAT)
            body, method = _ENVELOPE.pack(2, 1, len(body)) + body, "read_range2"
        try:
            _, out = self.ioctx.execute(oid, "zlog", method, body,
                                        _ENVELOPE.size + _RANGE_HEAD.size + n * _RANGE_ENTRY.size + nbytes + 64)
            fut.set_result((0, bytes(out)))
        except rados.Error as e:
            fut.set_result((-abs(getattr(e, "errno", None) or errno.EIO), b""))
        return fut


def stream(log: Any, start: int = 0, end: int | None = None, **kw: Any) -> Stream:
    """The oracle's stream() of a pyzlog.Log, with Log.stream's arguments
    (checked as Log.stream checks them)."""
    check_stream_args(start, end, kw.get("stride_index"), kw.get("stride"))
    kw.setdefault("decode", log.state.decode)
    return Stream(log.state, start, end, **kw)


class ObjectCursor:
    """One data object's entries in [first, last], fetched ahead with aio."""

    def __init__(self, log: LogState, oid: str, first: int, last: int, stride: int,
                 per_call: int = PER_CALL, call_bytes: int = CALL_BYTES, data_format: bool = False) -> None:
        self.log = log
        self.data_format = data_format
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
        self._stride = stride  # a span of stride x per_call positions holds about per_call of its own
        self.max_fresh = False  # has a fetch completed since the last forget_from?
        self._stale = StaleWait(log, f"read_range on {oid}")

    def _issue(self) -> None:
        if self._pending is None and self.known_upto <= self.last:
            first = self.known_upto
            last = min(self.last, first + self._stride * self.per_call - 1)
            self._pending_from = first
            self._pending_epoch = epoch = self.log.epoch
            self._pending = _Rados(self.log).read_range(self.oid, epoch, first, last, self.per_call,
                                                        self.call_bytes, self.data_format)

    def _wait(self) -> None:
        self._issue()
        assert self._pending is not None
        fut, self._pending = self._pending, None
        ret, out = fut.result()
        if ret == -errno.ESTALE:
            self._stale(self._pending_epoch)  # StaleEpoch if the epoch stays refused
            return  # the caller loops and re-issues at the new epoch
        self._stale.reset()
        if ret == -errno.ENOENT:  # object never created: nothing stored in the range (trimmed below the log's trim point)
            self.trim_below = max(self.trim_below, self.log.meta.trim_below)
            self.known_upto = min(self.last, self._pending_from + self._stride * self.per_call - 1) + 1
            self.max_fresh = True
            return
        if ret < 0:
            raise error_for(ret, f"read_range on {self.oid}")
        trim_below, top, nxt, entries = (parse_range_reply2 if self.data_format else parse_range_reply)(out)
        self.trim_below = max(self.trim_below, trim_below)
        if top is not None:
            self.max_position = max(self.max_position or 0, top)
        self.entries.extend(e for e in entries if e.position >= self.known_upto)
        self.known_upto = max(self.known_upto, nxt)
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
        self._segment_end: int | None = None  # a data-format view's stripe ends there
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
        oids, self._segment_end = segment(self.log, view, self.position)
        last = min(x for x in (self._view_end, self._segment_end, self.end, wire.MAX_POSITION + 1)
                   if x is not None) - 1
        self._cursors = [ObjectCursor(self.log, oid, self.position, last, view.width, self.per_call,
                                      data_format=view.format == _DATA_FORMAT) for oid in oids]
        if self.stride_index is not None and self.stride is not None:
            self.position = first_in_stride(self.position, self.stride_index, self.stride)
        else:
            for c in self._cursors:
                c.start()

    def _highest(self) -> int | None:
        for c in self._cursors:
            c.refresh_max()  # every object, not only those read so far
        top = max((c.max_position for c in self._cursors if c.max_position is not None), default=None)
        view = self._view
        if view is None or view.format != _DATA_FORMAT or (top is not None and top >= self.position):
            return top
        # a data-format view: a later open stripe that holds something puts the tail past this one
        newest = self.log.refresh().views[-1]
        if newest.epoch != view.epoch or self._segment_end is None:
            return top
        for start in range(view.start + newest.stripes * view.width * view.slots - 1, self._segment_end - 1,
                           -view.width * view.slots):
            oids, end = segment(self.log, view, start)
            later = [ObjectCursor(self.log, oid, start, start, view.width, 1, data_format=True) for oid in oids]
            for c in later:
                c.refresh_max()
            found = [c.max_position for c in later if c.max_position is not None]
            if found:
                return max(found + ([top] if top is not None else []))
        return top

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
            if self._view is None or any(e is not None and self.position >= e
                                         for e in (self._view_end, self._segment_end)):
                self._enter_view()
                continue
            cursor = self._cursors[object_index(self._view, self.position)]
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


