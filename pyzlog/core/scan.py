"""Range reads walked into Arrow batches: windows, batches and view scans.

A read_range reply arrives as a `RangeWindow`, an index over the reply's
bytes built in C (native/dataplane.c). `RangeWindow.record_batch()` and
`build_batch()` write its entries into Arrow column buffers in C, with no
Python object per entry, and wrap them as a `pyarrow.RecordBatch`
(`batch_schema`). `ViewScan` reads the positions of one view from its
objects, ahead of the reader, on a queue of the reader's own (the reader's
thread waits on it: no thread per reader).

ViewScan talks to its queue only through submit/wait/tags/close and the
queue's connection (op_timeout, error), so the unit tier drives it with a
fake queue and windows made by RangeWindow.parse.
"""
from __future__ import annotations

import bisect
import ctypes
import errno
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import wire
from .errors import InvalidRequest, Timeout, ZlogError
from .layout import held_after, held_count, next_held, object_base

if TYPE_CHECKING:
    import pyarrow as pa

from .._dataplane import ffi, lib  # the cffi extension (untyped)
from .._records import batch_into

#: why build_batch stopped
STOP_END, STOP_FULL, STOP_NEED, STOP_MISSING = lib.DP_STOP_END, lib.DP_STOP_FULL, lib.DP_STOP_NEED, lib.DP_STOP_MISSING
#: next_batch stopped at a position whose entry (or object) is damaged: the
#: object's read_range answered EIO, narrowed down to that one position
STOP_CORRUPT = -1
#: row kinds of a batch's "kind" column, in code order (pyzlog.client.reader.RecordKind values);
#: the data plane makes the first four, a reader skipping a damaged position the last
KIND_NAMES = ("data", "filled", "trimmed", "lost", "corrupt")

#: entries per object of a scan's first call (then 2x, 4x, ... up to per_call)
FIRST_CALL = 64

_READ_RANGE = int(lib.ZLOG_OP_READ_RANGE)


def _oid(oid: str | bytes) -> bytes:
    return oid.encode() if type(oid) is str else oid  # type: ignore[return-value]


# ------------------------------------------------------------------- windows
class RangeWindow:
    """One read_range reply of one object, indexed in C (no Python object per
    entry). Every position of the object in [first, next) that is not listed
    and not below trim_below is unwritten."""

    __slots__ = ("_w",)

    def __init__(self, handle: Any) -> None:
        self._w = ffi.gc(handle, lib.dp_window_free)

    @classmethod
    def parse(cls, reply: bytes, first: int = 0, protocol: int = wire.PROTOCOL) -> RangeWindow:
        """A window over a reply that came another way (copied); ValueError if malformed."""
        w = lib.dp_window_parse(reply, len(reply), first, protocol)
        if w == ffi.NULL:
            raise ValueError("malformed read_range reply")
        return cls(w)

    @property
    def first(self) -> int:
        return int(self._w.first)

    @property
    def next(self) -> int:
        return int(self._w.next)

    @property
    def trim_below(self) -> int:
        return int(self._w.trim_below)

    @property
    def max_position(self) -> int | None:
        return int(self._w.max_position) if self._w.has_max else None

    @property
    def count(self) -> int:
        return int(self._w.count)

    @property
    def remaining(self) -> int:
        """Entries build_batch has not consumed yet."""
        return int(self._w.count - self._w.head)

    @property
    def data_bytes(self) -> int:
        return int(self._w.data_bytes)

    def entries(self) -> Iterator[wire.RangeEntry]:
        """The entries as wire.RangeEntry objects (the slow, per-entry view)."""
        pos, state, epoch = ffi.new("uint64_t *"), ffi.new("uint8_t *"), ffi.new("uint64_t *")
        data, length = ffi.new("char **"), ffi.new("uint32_t *")
        for i in range(self._w.count):
            lib.dp_window_entry(self._w, i, pos, state, epoch, data, length)
            yield wire.RangeEntry(int(pos[0]), wire.EntryState(state[0]), int(epoch[0]),
                                  ffi.unpack(data[0], length[0]))

    def rows_into(self, out: dict[int, bytes | int], codes: tuple[int | None, ...], default: int) -> int:
        """Every entry not consumed yet into `out`: position -> its data
        (bytes as stored), or codes[kind] for a gap (`default` past them).
        Returns how many. One native call for the lot (a read_set reply)."""
        b = lib.dp_window_batch(self._w)
        if b == ffi.NULL:
            raise MemoryError("dp_window_batch")
        try:
            return int(batch_into(int(ffi.cast("uintptr_t", b)), out, codes, default))
        finally:
            lib.dp_batch_free(b)

    def record_batch(self, *, signed: bool = False) -> pa.RecordBatch:
        """Every entry not consumed yet, in order, as one Arrow record batch."""
        b = lib.dp_window_batch(self._w)
        if b == ffi.NULL:
            raise MemoryError("dp_window_batch")
        return _record_batch(b, signed)

    def __repr__(self) -> str:
        return f"<RangeWindow [{self.first}, {self.next}) {self.count} entries, trim_below {self.trim_below}>"


# ------------------------------------------------------------------- batches
_schemas: dict[bool, Any] = {}


def batch_schema(signed: bool = False) -> pa.Schema:
    """position, data (null unless DATA), kind (dictionary of KIND_NAMES), epoch.
    signed: position and epoch as int64 (Spark's long) instead of uint64."""
    schema = _schemas.get(signed)
    if schema is None:
        import pyarrow as pa

        num = pa.int64() if signed else pa.uint64()
        schema = _schemas[signed] = pa.schema([
            pa.field("position", num, nullable=False),
            pa.field("data", pa.binary()),
            pa.field("kind", pa.dictionary(pa.int8(), pa.string()), nullable=False),
            pa.field("epoch", num, nullable=False),
        ])
    return schema


_kind_dictionary: Any = None
# A dp_batch is owned by a PyCapsule whose C destructor frees it (native/
# build_dataplane.py): Arrow lets go of the owner in noexcept C++ destructors,
# on any thread, and nothing there may give up the GIL or run Python code (a
# daemon thread could exit through those frames as the interpreter finalizes:
# std::terminate). ctypes' pythonapi calls keep the GIL.
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_CAPSULE_FREE = int(ffi.cast("uintptr_t", lib.dp_batch_capsule_destructor()))


def _hold(b: Any) -> Any:
    """The owner of dp_batch `b`: freed when the owner goes."""
    return _capsule_new(int(ffi.cast("uintptr_t", b)), None, _CAPSULE_FREE)


def _record_batch(b: Any, signed: bool) -> pa.RecordBatch:
    """Arrow arrays over a dp_batch's columns, without copying; the buffers
    keep its memory alive (_hold)."""
    import pyarrow as pa

    held = _hold(b)
    global _kind_dictionary
    if _kind_dictionary is None:
        _kind_dictionary = pa.array(KIND_NAMES, pa.string())
    n = int(b.rows)
    foreign: Any = pa.foreign_buffer  # untyped in pyarrow's stubs

    def addr(p: Any) -> int:
        return int(ffi.cast("uintptr_t", p))

    schema = batch_schema(signed)
    num = schema.field("position").type
    positions = pa.Array.from_buffers(num, n, [None, foreign(addr(b.positions), 8 * n, base=held)])
    epochs = pa.Array.from_buffers(num, n, [None, foreign(addr(b.epochs), 8 * n, base=held)])
    codes = pa.Array.from_buffers(pa.int8(), n, [None, foreign(addr(b.kinds), n, base=held)])
    kinds = pa.DictionaryArray.from_arrays(codes, _kind_dictionary)
    data = pa.Array.from_buffers(pa.binary(), n, [
        foreign(addr(b.validity), (n + 7) // 8, base=held),
        foreign(addr(b.offsets), 4 * (n + 1), base=held),
        foreign(addr(b.data), int(b.data_len), base=held),
    ], null_count=int(b.null_count))
    return pa.RecordBatch.from_arrays([positions, data, kinds, epochs], schema=schema)


def batch_of(positions: Sequence[int], kinds: Sequence[str], epochs: Sequence[int],
             data: Sequence[bytes | None], *, signed: bool = False) -> pa.RecordBatch:
    """A batch of BATCH_SCHEMA from Python values: for the few rows a reader
    makes itself (a hole it filled as lost), so every batch has one schema."""
    import pyarrow as pa

    schema = batch_schema(signed)
    num = schema.field("position").type
    codes = pa.array([KIND_NAMES.index(k) for k in kinds], pa.int8())
    kind_dict: Any = pa.DictionaryArray.from_arrays(codes, pa.array(KIND_NAMES, pa.string()))
    return pa.RecordBatch.from_arrays([pa.array(positions, num), pa.array(data, pa.binary()), kind_dict,
                                       pa.array(epochs, num)], schema=schema)


class RowSet:
    """A batch's rows as pointers into its windows' replies (dp_rows), which
    it holds: stream()'s records are made from them (pyzlog._records) with no
    Arrow column in between. `num_rows` as a RecordBatch has it."""

    __slots__ = ("_r", "num_rows")
    KIND_NAMES = KIND_NAMES  # the name of each kind code of columns()

    def __init__(self, handle: Any) -> None:
        self._r = ffi.gc(handle, lib.dp_rows_free)
        self.num_rows = int(handle.rows)

    @property
    def address(self) -> int:
        return int(ffi.cast("uintptr_t", self._r))

    def columns(self) -> tuple[int, int, int, int]:
        """The addresses of its columns, for native consumers: positions
        (u64), data pointers (NULL for a row that is not an entry, as
        stored), data lengths (u32) and kinds (u8, dataplane.h's DP_KIND_*),
        one per row; valid while this RowSet lives."""
        r = self._r
        return (int(ffi.cast("uintptr_t", r.positions)), int(ffi.cast("uintptr_t", r.data)),
                int(ffi.cast("uintptr_t", r.lens)), int(ffi.cast("uintptr_t", r.kinds)))

    def counts(self, first: int, done: int) -> tuple[int, int]:
        """(DATA rows, their bytes) among rows [first, done)."""
        r = self._r
        return int(r.data_before[done] - r.data_before[first]), int(r.bytes_before[done] - r.bytes_before[first])


@dataclass(frozen=True, slots=True)
class Built:
    """What build_batch produced and where it stopped."""

    batch: pa.RecordBatch | RowSet
    stop: int            # STOP_END, STOP_FULL, STOP_NEED, STOP_MISSING or (ViewScan) STOP_CORRUPT
    stop_position: int   # the first position not in the batch
    stop_object: int     # STOP_NEED: the object (index in the view) whose window ran out


def build_batch(windows: Sequence[RangeWindow | None], start: int, end: int, *, step: int = 1,
                max_rows: int = 65536, max_bytes: int = 64 << 20, signed: bool = False, unit: int = 1,
                stripe_start: int = 0, rows: bool = False) -> Built:
    """Rows for positions start, start + step, ... (< end) of a stripe
    striped over len(windows) objects in runs of `unit` from `stripe_start`
    (layout.index_of), position p coming from the window of its object:
    a listed entry as a row of its kind, a position below its window's
    trim_below as TRIMMED (epoch 0). Stops at the first unwritten position
    (STOP_MISSING: the caller's gap rules decide: hole, tail, or wait), at a
    position its object's window does not cover (STOP_NEED: fetch the next
    window of stop_object), at `end`, or when full. Consumes the entries it
    passes, so the next call goes on from stop_position. With `rows`, a
    RowSet instead of a record batch (no data copied)."""
    width = len(windows)
    arr = ffi.new("dp_window *[]", [ffi.NULL if w is None else w._w for w in windows])
    b = (lib.dp_build_rows if rows else lib.dp_build)(arr, width, unit, stripe_start, start, end, step, max_rows,
                                                      max_bytes)
    if b == ffi.NULL:
        raise (MemoryError("dp_build") if width and step and unit and (unit == 1 or start >= stripe_start) else
               ValueError("width, step and unit must be positive, and start at or past the stripe's"))
    built = RowSet(b) if rows else _record_batch(b, signed)
    return Built(built, int(b.stop), int(b.stop_position), int(b.stop_object))


# ---------------------------------------------------------------- view scans
def empty_window(first: int, next_position: int, trim_below: int = 0) -> RangeWindow:
    """A window with no entries covering [first, next_position), positions
    below `trim_below` trimmed: what a read_range of an object that does not
    exist (yet, or since its stripe was trimmed) stands for."""
    w = lib.dp_window_empty(first, next_position, trim_below)
    if w == ffi.NULL:
        raise MemoryError("dp_window_empty")
    return RangeWindow(w)


class _Segment:
    """One read_range of one object: the positions [first, last] asked for."""

    __slots__ = ("first", "last", "tag", "window", "corrupt")

    def __init__(self, first: int, last: int, tag: int) -> None:
        self.first, self.last, self.tag = first, last, tag
        self.window: RangeWindow | None = None
        self.corrupt = False  # its one position's entry (or object) is damaged: EIO

    @property
    def done(self) -> bool:
        return self.window is not None or self.corrupt


class ViewScan:
    """The positions [start, end) of one stripe of a view, read with
    read_range from its objects (`oids`, by index: layout.index_of, with the
    stripe's `unit` and `stripe_start`) and fetched `ahead` calls ahead per
    object, walked in position order into Arrow batches.

    This is the mechanical half of a streaming reader: next_batch() returns a
    Built that stops at STOP_END, STOP_FULL, or STOP_MISSING at an unwritten
    position; what that position is (a hole to wait on and fill, or the tail)
    is the caller's to decide, after which it calls forget_from() to read it
    again or skip() past it. `step` = width reads one object only (positions
    start, start + width, ...; unit 1 only). An object that does not exist reads as empty.
    A failed call raises its typed error (StaleEpoch on -ESTALE: set `epoch`
    and call again; the scan re-reads from where it stopped). A call that
    meets damage (EIO) is narrowed, halving its range, down to the one
    position at fault: next_batch() then stops there with STOP_CORRUPT, and
    the caller raises or skip()s it; lose() marks an object whose header is
    lost, every position of which is then damaged without asking.

    `queue` is a native.Queue (or anything with its submit, wait, tags,
    close and conn), `pool` a native.Pool: scan sits below native, which
    hands its windows out."""

    def __init__(self, queue: Any, pool: Any, oids: Sequence[str | bytes], epoch: int, start: int,
                 end: int, *, per_call: int = 1024, call_bytes: int = 4 << 20, ahead: int = 2, step: int = 1,
                 max_rows: int = 65536, signed: bool = False, format: int = wire.FORMAT_OMAP,
                 trim_below: int = 0, unit: int = 1, stripe_start: int = 0, rows: bool = False) -> None:
        if not 1 <= per_call <= wire.MAX_RANGE_ENTRIES or not 1 <= call_bytes <= wire.MAX_RANGE_BYTES:
            raise InvalidRequest("per_call or call_bytes outside the class's limits")
        self.queue, self.pool, self.epoch = queue, pool, epoch
        #: the objects' format; the log's trim point (an object that does not exist reads as trimmed below it)
        self.format, self.trim_below = format, trim_below
        self.oids = [_oid(o) for o in oids]
        self.width = len(self.oids)
        if step not in (1, self.width) or (unit != 1 and step != 1):
            raise InvalidRequest("step must be 1 or the view's width (of unit 1)")
        self.unit, self.stripe_start = unit, stripe_start
        self.rows = rows  # batches as RowSets (stream()'s records), not record batches
        self._bases = [object_base(stripe_start, i, self.width, unit) for i in range(self.width)]
        self.position, self.end, self.step = start, end, step
        self.per_call, self.call_bytes, self.ahead = per_call, call_bytes, max(1, ahead)
        # where calls end: rows of the stripe (width x unit positions) from the
        # start's row, first FIRST_CALL entries per object and twice as many at
        # each call up to per_call (rounded up to whole rows: a unit that does
        # not divide per_call would take two calls where one did), so that the
        # first batch comes after a short read and the reader's work on it
        # overlaps the larger ones; every object's calls end at the same rows,
        # so a batch ends once per round of calls, not at each object's
        # boundary in turn. A run longer than per_call is read per_call at a
        # time, with no rows to keep to.
        self._row = self.width * unit
        self._row0 = (start - stripe_start) // self._row
        self._by_rows = unit <= per_call
        cap = -(-per_call // unit)
        self._call_entries = min(wire.MAX_RANGE_ENTRIES, cap * unit) if self._by_rows else per_call
        step_rows = max(1, FIRST_CALL // unit)
        self._ramp = [0]  # the ramp's call ends, in rows past row0; then every `cap` rows
        while step_rows < cap:
            self._ramp.append(self._ramp[-1] + step_rows)
            step_rows *= 2
        self._cap_rows = cap
        self.max_rows, self.signed = max_rows, signed
        self._segments: list[list[_Segment]] = [[] for _ in range(self.width)]
        self._by_tag: dict[int, tuple[int, _Segment]] = {}
        self._tags = queue.tags
        self._max_position: int | None = None
        self._fetched = [False] * self.width  # a reply of each object since the last forget_from
        self._probing: set[int] = set()  # objects asked only for their max (refresh_max)
        self._lost: set[int] = set()  # objects whose header is lost (lose())
        self._deadline_s = queue.conn.op_timeout + 5.0

    # ------------------------------------------------------------- fetching
    def _objects(self) -> range:
        if self.step == 1:
            return range(self.width)
        i = self.position % self.width
        return range(i, i + 1)

    def _first_of(self, obj: int, position: int) -> int:
        """The first position of object `obj` at or after `position`."""
        return next_held(self._bases[obj], self.width, self.unit, position)

    def _send(self, obj: int, first: int, last: int, max_entries: int) -> _Segment:
        """One read_range call on object `obj`, its reply known by the segment's tag."""
        seg = _Segment(first, last, next(self._tags))
        self._by_tag[seg.tag] = (obj, seg)
        self.queue.submit(self.pool, self.oids[obj], _READ_RANGE, seg.tag, epoch=self.epoch, position=first,
                          last=last, max_entries=max_entries, max_bytes=self.call_bytes, format=self.format)
        return seg

    def _call_end(self, first: int) -> int:
        """The last position of the call (of any object) that reads `first`."""
        r = (first - self.stripe_start) // self._row - self._row0  # rows past the start's
        ramp = self._ramp
        if r < ramp[-1]:
            end = ramp[bisect.bisect_right(ramp, r)]
        else:
            end = ramp[-1] + ((r - ramp[-1]) // self._cap_rows + 1) * self._cap_rows
        return self.stripe_start + (self._row0 + end) * self._row - 1

    def _issue(self, obj: int, first: int, index: int | None = None) -> None:
        """Ask for the positions of object `obj` from `first` (per_call of them, to a row's end; fewer at first)."""
        first = self._first_of(obj, first)
        if first >= self.end:
            return
        base, width, unit = self._bases[obj], self.width, self.unit
        # the call ends where every object's call that reads `first` ends
        # (_call_end), at most _call_entries of its own
        last = min(self.end - 1, self._call_end(first) if self._by_rows else self.end,
                   held_after(base, width, unit, first, self._call_entries - 1))
        n = held_count(base, width, unit, first, last)
        # its own last position there: a reply that ends before the call's last reads as cut short
        last = held_after(base, width, unit, first, n - 1)
        segs = self._segments[obj]
        if obj in self._lost:  # every position damaged: one at a time, no call
            seg = _Segment(first, min(last, first + self.width - 1), -1)
            seg.corrupt = True
            segs.insert(len(segs) if index is None else index, seg)
            return
        segs.insert(len(segs) if index is None else index, self._send(obj, first, last, n))

    def _top_up(self, obj: int) -> None:
        segs = self._segments[obj]
        while len(segs) < self.ahead:
            nxt = segs[-1].last + 1 if segs else self.position
            # the object's next position, not nxt: below the end while that one is not,
            # _issue asks for nothing and this loop spun for ever (found by zlog bench soak)
            if self._first_of(obj, nxt) >= self.end:
                return
            self._issue(obj, nxt)

    def start(self) -> None:
        """Send the first calls (done by next_batch if not called)."""
        for obj in self._objects():
            self._top_up(obj)

    def _collect(self, timeout: float) -> None:
        """Take every reply that is ready (waiting up to `timeout` for one)."""
        for tag, code, value in self.queue.wait(timeout):
            entry = self._by_tag.pop(tag, None)
            if entry is None:
                continue  # a call forget_from() gave up on
            obj, seg = entry
            self._probing.discard(obj)
            if code == -errno.ENOENT:
                value = empty_window(seg.first, seg.last + 1, self.trim_below)
            elif code == -errno.EIO:
                self._fetched[obj] = True  # (it has no max to give)
                self._narrow(obj, seg)
                continue
            elif code < 0:
                self.forget_from(self.position)
                raise self.queue.conn.error(code, f"read_range on {self.oids[obj].decode()}", pool=self.pool,
                                            oid=self.oids[obj])
            if value.next <= seg.first:
                self.forget_from(self.position)
                raise ZlogError(f"read_range on {self.oids[obj].decode()}: the reply made no progress")
            seg.window = value
            self._fetched[obj] = True
            top = value.max_position
            if top is not None and (self._max_position is None or top > self._max_position):
                self._max_position = top
            if value.next <= seg.last:  # cut short by call_bytes: ask for the rest next
                segs = self._segments[obj]
                self._issue(obj, value.next, segs.index(seg) + 1)

    def _narrow(self, obj: int, seg: _Segment) -> None:
        """A damaged range: ask again for its first half (the rest is asked
        for once the walk gets there), down to the one damaged position."""
        segs = self._segments[obj]
        if seg not in segs:
            return  # refresh_max's probe: it only wanted the max
        base = self._bases[obj]
        n = held_count(base, self.width, self.unit, seg.first, seg.last)  # this object's positions in it
        if n == 1:
            seg.corrupt = True
            return
        half = held_after(base, self.width, self.unit, seg.first, (n + 1) // 2 - 1)
        segs[segs.index(seg)] = self._send(obj, seg.first, half, self.per_call)

    def lose(self, obj: int) -> None:
        """The object `obj` has lost its header (every call on it is EIO):
        each of its positions from here on is reported damaged, without
        asking, until forget_from()."""
        self._lost.add(obj)
        for seg in self._segments[obj]:
            self._by_tag.pop(seg.tag, None)
        self._segments[obj] = []
        self._fetched[obj] = True

    def _ready(self, obj: int, position: int) -> bool:
        """Make the head window of `obj` the one covering `position`; False
        while it is still on its way."""
        position = self._first_of(obj, position)
        segs = self._segments[obj]
        while segs and (segs[0].window is not None and segs[0].window.next <= position
                        or segs[0].last < position):
            dropped = segs.pop(0)
            self._by_tag.pop(dropped.tag, None)
        if position >= self.end:
            return True  # nothing of this object is left to read
        if not segs or segs[0].first > position:
            self._issue(obj, position, 0)  # nothing asked covers it (a forget, or a cut-short reply)
        self._top_up(obj)
        return segs[0].done

    def _wait_ready(self, objs: list[int], position: int) -> None:
        deadline = None
        while True:
            waiting = [o for o in objs if not self._ready(o, position)]
            if not waiting:
                return
            now = time.monotonic()
            if deadline is None:
                deadline = now + self._deadline_s
            elif now > deadline:
                raise Timeout(f"read_range on {self.oids[waiting[0]].decode()}: no reply in time")
            self._collect(min(1.0, deadline - now))

    # -------------------------------------------------------------- walking
    def next_batch(self) -> Built:
        """The next batch from `position` on (may be empty at STOP_MISSING/END)."""
        while True:
            if self.position >= self.end:
                return build_batch([None] * self.width, self.position, self.end, step=self.step,
                                   signed=self.signed, unit=self.unit, stripe_start=self.stripe_start,
                                   rows=self.rows)
            # the windows the next positions need (every object's at once, so
            # a batch does not end at each object's window boundary in turn)
            self._wait_ready(list(self._objects()), self.position)
            start = self.position
            built = build_batch([s[0].window if s else None for s in self._segments], start, self.end,
                                step=self.step, max_rows=self.max_rows, signed=self.signed, unit=self.unit,
                                stripe_start=self.stripe_start, rows=self.rows)
            self.position = built.stop_position
            if built.stop == STOP_NEED:
                segs = self._segments[built.stop_object]
                if segs and segs[0].corrupt and segs[0].first <= self.position <= segs[0].last:
                    built = Built(built.batch, STOP_CORRUPT, built.stop_position, built.stop_object)
                elif built.batch.num_rows == 0:
                    continue  # a window ended exactly here: the loop fetches on
            try:
                for obj in self._objects():
                    self._ready(obj, self.position)  # swap in what has arrived, read ahead
                self._collect(0)
            except BaseException:
                # a reply that came with the read-ahead failed (a stale epoch, say):
                # this batch is not handed out, so its positions must be read again
                self.forget_from(start)
                raise
            return built

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Every batch up to `end` or the first unwritten position."""
        while True:
            built = self.next_batch()
            if built.batch.num_rows:
                yield built.batch
            if built.stop in (STOP_END, STOP_MISSING):
                return

    # ------------------------------------------------------------ gap rules
    def max_position(self) -> int | None:
        """The highest position written or filled on any object, as of the
        replies so far (refresh_max() makes it current)."""
        return self._max_position

    def top(self) -> int | None:
        """max_position() made current: refresh_max(), then max_position()."""
        self.refresh_max()
        return self._max_position

    def refresh_max(self) -> None:
        """At least one reply from every object of the view since the last
        forget_from: "is a later position written" is a question about the
        whole view, also when this scan reads one object (step = width) or
        `end` leaves an object nothing to read (it is then asked about the
        position after `end`, only for its max)."""
        need = [o for o in range(self.width) if not self._fetched[o] and o not in self._lost]
        if not need:
            return
        scanned = [o for o in self._objects() if o in need and self._first_of(o, self.position) < self.end]
        if scanned:
            self._wait_ready(scanned, self.position)
        for o in need:
            if o not in scanned and o not in self._probing:
                first = self._first_of(o, self.position)
                if first > wire.MAX_POSITION:
                    self._fetched[o] = True  # no position there at all
                    continue
                self._send(o, first, first, 1)
                self._probing.add(o)
        deadline = time.monotonic() + self._deadline_s
        while not all(self._fetched[o] for o in need):
            if time.monotonic() > deadline:
                raise Timeout(f"read_range on {self.oids[need[0]].decode()}: no reply in time")
            self._collect(1.0)

    def skip(self) -> None:
        """Go past the position next_batch stopped at (the caller reported it)."""
        self.position += self.step

    def forget_from(self, position: int) -> None:
        """Drop what is known from `position` on (and calls in flight), so it
        is read again: after waiting on a hole, or to follow a growing tail."""
        self.position = min(self.position, position)
        for obj in range(self.width):
            self._segments[obj] = []
        self._by_tag.clear()
        self._fetched = [False] * self.width
        self._probing.clear()
        self._lost.clear()  # asked again: a repair shows
        self._max_position = None

    def close(self) -> None:
        self.queue.close()
