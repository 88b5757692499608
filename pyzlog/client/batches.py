"""Streams: Log.stream(), Log.stream_batches() and the Spark source.

A stream walks the log one view at a time, each view read by
scan.ViewScan on a queue of the stream's own: read_range replies are
indexed in C and walked into Arrow columns, with no Python object per entry.
The gap rules are reader.HoleClock's and ops.fill_hole's. Batches have
scan.batch_schema(signed): position, data (null unless the kind is data),
kind (data, filled, trimmed, lost), epoch. Records turns them into
reader.Record objects for stream().
"""
from __future__ import annotations

import enum
import errno
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator
from operator import length_hint
from typing import Any, NamedTuple

from .._records import records, rows_records
from ..core import wire
from ..core.errors import CorruptEntry, StaleEpoch, ZlogError
from ..core.layout import first_in_stride, stripe_end, stripe_of, stripe_places, stripe_start, view_end, view_of
from ..core.native import Op, Queue
from ..core.scan import KIND_NAMES, STOP_CORRUPT, STOP_END, STOP_MISSING, RowSet, ViewScan, batch_of
from ..core.state import LogState
from ..core.tailfind import highest_position
from . import metrics
from .ops import fill_hole
from .reader import MAX_POLL_SECONDS, HoleClock, Record, RecordKind
from .stale import StaleWait

#: entries asked of one object per read_range call
PER_CALL = 512


class Refused(enum.Enum):
    """_since's answer when the view refused the stream's epoch (the wait
    for a newer one is done): the scan is to be made again."""
    REFUSED = 0


# What BatchStream._steps yields where it would block; its driver does it.
class Rows(NamedTuple):
    """Hand `batch` to the reader; resume when the next one is wanted."""
    batch: Any


class Sleep(NamedTuple):
    seconds: float


class Step(NamedTuple):
    """A scan step on the stream's queue: it waits for replies (the asyncio
    driver retries it each time one lands, never blocking the loop)."""
    fn: Callable[[], Any]
    args: tuple[Any, ...] = ()


class Call(NamedTuple):
    """A call that blocks on its own (metadata, a fill, a stale epoch's
    wait): the asyncio driver runs it on the loop's executor."""
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()

    @classmethod
    def of(cls, fn: Callable[..., Any], *args: Any) -> Call:
        return cls(fn, args)


Effect = Rows | Sleep | Step | Call


class Walk:
    """A BatchStream._steps() generator as an iterator of its effects; a
    driver hands each Step's or Call's outcome back with reply() or fail()
    before it asks for the next effect."""

    def __init__(self, steps: Generator[Effect, Any, None]) -> None:
        self._steps = steps
        self._reply: Any = None
        self._error: Exception | None = None

    def __iter__(self) -> Walk:
        return self

    def __next__(self) -> Effect:
        reply, error, self._reply, self._error = self._reply, self._error, None, None
        return self._steps.throw(error) if error is not None else self._steps.send(reply)

    def reply(self, value: Any) -> None:
        self._reply = value

    def fail(self, error: Exception) -> None:
        self._error = error

    def close(self) -> None:
        self._steps.close()

logger = logging.getLogger("pyzlog")


class BatchStream:
    """Batches for positions [start, end) (or only those p with p % stride ==
    stride_index), in position order; see Log.stream_batches."""

    def __init__(self, log: LogState, start: int, end: int | None, *, follow: bool, hole_wait: float,
                 stride_index: int | None = None, stride: int | None = None, known_tail: int | None = None,
                 signed: bool = False, max_rows: int = 65536, decode: bool = True,
                 on_corrupt: Any = "fail", holes: HoleClock | None = None, rows: bool = False) -> None:
        self.log = log
        #: at a damaged position: "fail" raises CorruptEntry; "skip" (or a
        #: callable, called with the CorruptEntry) hands out a CORRUPT row
        #: and goes on (a position of an object whose header is lost only
        #: once it is known to lie below the tail)
        self.on_corrupt = on_corrupt
        self.position = start
        self.end = end
        self.follow = follow
        self.stride_index, self.stride = stride_index, stride
        self.signed, self.max_rows = signed, max_rows
        #: the gap clock: this stream's, keeping what stays true in the reader's (`holes`,
        #: kept across its streams; reader.HoleClock says what stays true)
        self.holes = HoleClock(hole_wait if holes is None else holes.hole_wait, known_tail, durable=holes)
        self._pool = log.data
        self._queue: Queue | None = None
        #: how the log's entries are decoded (None: stored as written)
        self.codec = None if log.config.get("compression", "none") == "none" else log.decode
        self._decode = self.codec if decode else None  # decode=False: data as stored
        #: hand out RowSets where it can (stream()'s records: no Arrow column in
        #: between), record batches where rows are filtered or decoded
        self._row_sets = rows and self._decode is None
        self._filter = False  # rows of positions not asked for come with the view being read

    def __iter__(self) -> Iterator[Any]:
        """A walk from `position`: iterating again after an error (or the
        tail) goes on where the last walk stopped."""
        queue = self._queue = self.log.conn.queue()
        try:
            yield from self._walk()
        finally:
            queue.close()

    # ---------------------------------------------------------------- views
    def _scan(self) -> tuple[ViewScan, wire.View, int | None, tuple[wire.View, ...]]:
        """A scan of the view holding `position` (of its stripe, in the data
        format), up to the end of either (or `end`)."""
        meta = self.log.meta
        view = view_of(meta.views, self.position)
        vend = view_end(meta.views, view)
        stripe = stripe_of(view, self.position)
        last = min(x for x in (vend, stripe_end(view, stripe), self.end, wire.MAX_POSITION + 1) if x is not None)
        step = 1
        self._filter = self.stride is not None and self.stride != 1
        if self.stride is not None and view.width == self.stride and view.unit == 1:
            step = view.width  # one object of the view holds exactly the positions asked for
            self._filter = False
            self.position = first_in_stride(self.position, self.stride_index, self.stride)  # type: ignore[arg-type]
        scan = ViewScan(self._queue, self._pool, [p.oid for p in stripe_places(self.log.name, view, stripe)],
                        meta.epoch, self.position, last, per_call=PER_CALL, step=step, max_rows=self.max_rows,
                        signed=self.signed, format=view.format, trim_below=meta.trim_below, unit=view.unit,
                        stripe_start=stripe_start(view, stripe), rows=self._row_sets and not self._filter)
        return scan, view, vend, meta.views

    def _walk(self) -> Iterator[Any]:
        """The walk of _steps() with its effects done here, blocking."""
        walk = Walk(self._steps())
        try:
            for effect in walk:
                if isinstance(effect, Rows):
                    yield effect.batch
                elif isinstance(effect, Sleep):
                    time.sleep(effect.seconds)
                elif isinstance(effect, (Step, Call)):  # alike here: call it
                    try:
                        walk.reply(effect.fn(*effect.args))
                    except Exception as e:  # noqa: BLE001 - thrown into the walk, which decides
                        walk.fail(e)
        finally:
            walk.close()

    def _steps(self) -> Generator[Effect, Any, None]:
        """The walk itself, with no I/O of its own (sans-I/O): it yields an
        Effect wherever it would block and is sent the result (or thrown the
        error). _walk drives it blocking, aio_stream on an event loop: one
        walk, two drivers."""
        stale = StaleWait(self.log, "stream_batches")
        idle_since: float | None = None
        scan: ViewScan | None = None
        while self.end is None or self.position < self.end:
            if scan is None:
                scan, view, vend, views = self._scan()
            elif self.log.views is not views:  # a reconfiguration: the view may end now
                views = self.log.views
                vend = view_end(views, view)
                if vend is not None and vend < scan.end:
                    scan = None
                    continue
            try:
                built = yield Step(scan.next_batch)
            except StaleEpoch:
                yield Call.of(stale, scan.epoch)
                self.position = scan.position
                scan = None
                continue
            if built.batch.num_rows:
                stale.reset()  # progress (a batch with no rows is none: the same refusal may follow)
                try:
                    rows = self._rows(built.batch)
                except Exception as e:  # noqa: BLE001 - an entry this codec cannot decode
                    scan.forget_from(self.position)  # not handed out: every retry meets it again
                    raise ZlogError(f"positions {self.position}..{scan.position - 1}: cannot decode an "
                                    f"entry: {e}") from e
                self.position = scan.position
                idle_since = None
                yield Rows(rows)
            self.position = scan.position
            if built.stop == STOP_END:
                scan = None  # the view (or the range) is done: the next view, or the end
                continue
            if built.stop == STOP_CORRUPT:
                err = yield Call.of(self._corrupt_entry, scan, view, built.stop_object)
                if err is None:
                    continue  # another partition's position
                if err.whole and self.on_corrupt != "fail":
                    since = yield from self._since(scan, view, vend, err.position, stale)
                    if since is Refused.REFUSED:
                        scan = None
                        continue
                    if since is None:
                        if not self.follow:  # no later position known: it may never have held an entry
                            self._fail(scan, err)
                        yield Sleep(MAX_POLL_SECONDS)  # as at the tail: later entries (or a repair) tell
                        scan.forget_from(err.position)
                        yield Call.of(self.log.refresh)
                        continue
                yield Rows(self._skip_corrupt(scan, err))
                continue
            if built.stop != STOP_MISSING:
                continue
            pos = scan.position
            if self._filter and pos % self.stride != self.stride_index:  # type: ignore[operator]
                scan.skip()  # another partition's position: its reader's gap rules decide
                self.position = scan.position
                continue
            since = yield from self._since(scan, view, vend, pos, stale)
            if since is Refused.REFUSED:
                scan = None
                continue
            if since is None:  # the tail
                if not self.follow:
                    return
                now = time.monotonic()
                idle_since = idle_since or now
                yield Sleep(min(0.002 * 2 ** min((now - idle_since) * 10, 7), MAX_POLL_SECONDS))
                scan.forget_from(pos)
                yield Call.of(self.log.refresh)
                continue
            pause = self.holes.wait_for(since)
            if pause:
                yield Sleep(pause)
                scan.forget_from(pos)
            elif (yield Call.of(fill_hole, self.log, pos)):
                lost = self._rows(batch_of([pos], ["lost"], [self.log.epoch], [None], signed=self.signed))
                scan.skip()  # past it before it is handed out: a walk closed at the yield must not repeat it
                self.position = scan.position
                yield Rows(lost)
            else:
                scan.forget_from(pos)  # someone else got there first: read what it is now

    def _since(self, scan: ViewScan, view: wire.View, vend: int | None, position: int,
               stale: StaleWait) -> Generator[Effect, Any, float | None | Refused]:
        """HoleClock.since for `position`, with the highest position stored
        asked only if the gap rule needs it: the scan's objects' (a Step),
        and for a data-format view whose scanned stripe shows nothing at or
        past `position`, the later open stripes' (a Call: a hole at the end
        of a stripe lies below the tail once the next stripe holds something).
        A newer seal met asking (a half-done epoch change) is waited out with
        `stale`, as next_batch's refusals are, and answers REFUSED; an answer
        at this epoch restarts `stale` (a follow's next epoch change waits afresh)."""
        top: int | None = None
        if self.holes.needs_highest(position, vend):
            try:
                top = yield Step(scan.top)
            except StaleEpoch:
                yield Call.of(stale, scan.epoch)
                return Refused.REFUSED
            if view.bounded and (top is None or top < position):
                top = yield Call.of(self._later_top, view, position, top)
        stale.reset()
        return self.holes.since(position, vend, lambda: top)

    def _later_top(self, view: wire.View, position: int, top: int | None) -> int | None:
        meta = self.log.refresh()
        if meta.views[-1].epoch != view.epoch:
            return top  # closed since: its end (vend) decides on the next walk
        stripe = stripe_of(view, position)
        for later in range(self.log.open_stripes(meta.views[-1]) - 1, stripe, -1):
            try:
                found = highest_position(self.log, stripe_places(self.log.name, view, later), meta.epoch)
            except StaleEpoch:
                return top
            if found is not None:
                return found if top is None else max(top, found)
        return top

    def _corrupt_entry(self, scan: ViewScan, view: wire.View, obj: int) -> CorruptEntry | None:
        """The error for the damaged position the scan stopped at (None for
        another partition's, skipped), raised now with on_corrupt="fail".
        `.whole`: its object has lost its header (then lose()s it)."""
        pos = scan.position
        if self._filter and pos % self.stride != self.stride_index:  # type: ignore[operator]
            scan.skip()  # its own reader reports it
            self.position = scan.position
            return None
        oid = scan.oids[obj].decode()
        code, _ = self.log.conn.call_raw(self._pool, oid, Op.STAT, format=view.format)
        whole = code == -errno.EIO
        if whole:
            scan.lose(obj)
        why = "its object has lost its header" if whole else "its entry is damaged"
        err = CorruptEntry(f"position {pos} of {self.log.name!r} ({oid}): {why} (zlog check --log "
                           f"{self.log.name} --deep lists the damage; docs/faults.md)", errno=errno.EIO, oid=oid,
                           position=pos)
        err.whole = whole
        if self.on_corrupt == "fail":
            self._fail(scan, err)
        return err

    def _fail(self, scan: ViewScan, err: CorruptEntry) -> None:
        scan.forget_from(err.position)  # not handed out: met again next time
        raise err

    def _skip_corrupt(self, scan: ViewScan, err: CorruptEntry) -> Any:
        """Report a damaged position (on_corrupt="skip" or a callable) and go past it."""
        metrics.CORRUPT_SKIPPED.inc()
        logger.warning("stream of %r: skipping %s", self.log.name, err)
        if callable(self.on_corrupt):
            self.on_corrupt(err)
        scan.skip()
        self.position = scan.position
        return self._rows(batch_of([err.position], ["corrupt"], [0], [None], signed=self.signed))

    def _rows(self, batch: Any) -> Any:
        """Only the positions asked for (a view of another width than the
        stride holds them among others), with data decoded."""
        import pyarrow.compute as pc

        if self._filter and batch.num_rows:
            pos = batch.column(0)
            rem = pc.subtract(pos, pc.multiply(pc.divide(pos, self.stride), self.stride))
            batch = batch.filter(pc.equal(rem, self.stride_index))
        if self._decode is not None and batch.num_rows:
            import pyarrow as pa

            decode = self._decode
            data = pa.array([None if v is None else decode(v) for v in batch.column(1).to_pylist()], pa.binary())
            batch = pa.RecordBatch.from_arrays([batch.column(0), data, batch.column(2), batch.column(3)],
                                               schema=batch.schema)
        return batch



class RecordBatch:
    """The records of the batch being handed out, made one at a time as
    they are handed out (pyzlog._records: each record's bytes reuse the
    memory of the one its reader just dropped), so each is young garbage
    by the time its reader drops it; the iterator keeps its place: what
    stream() and aio's stream() share. Records are counted
    (entries and stored bytes, metrics.count_later) exactly as handed out,
    but in bulk: when the next batch comes, and before the counts are read.
    Entries are decoded as they are handed out, so one that cannot be
    decoded raises again on every call and is never skipped."""

    def __init__(self, codec: Callable[[bytes], bytes] | None) -> None:
        self.decode = codec
        self._kinds = tuple(RecordKind(k) for k in KIND_NAMES)
        self._size = 0
        self._data: Any = None  # the batch's data column as stored, or its RowSet (what count() adds up)
        self._offsets: Any = ()  # its offsets, as ints
        #: the batch's records not handed out yet
        self.pending: Iterator[Record] = iter(())
        self.retry: Record | None = None  # one that could not be decoded: handed out first next time
        self._holding = False  # next() has a record off the iterator, not yet handed out nor in retry
        self._counted = 0
        self._lock = threading.Lock()  # a scrape may count while the reader's thread does
        metrics.count_later(self)

    def load(self, b: Any) -> None:
        """Make `b` the batch handed out: an Arrow batch (scan.batch_schema,
        data as stored) or a scan.RowSet."""
        self.count()
        n = b.num_rows
        if type(b) is RowSet:
            pending = rows_records(b.address, b, Record, self._kinds)
            with self._lock:
                self._size, self._data, self.pending, self._counted = n, b, pending, 0
            return
        cols = [b.column(i) for i in range(4)]
        if len({c.offset for c in cols}) > 1:  # (never from a scan) one offset for all four columns
            import pyarrow as pa

            cols = [pa.concat_arrays([c]) for c in cols]
        positions, data, kinds, epochs = cols
        validity, offsets, values = data.buffers()
        pending = records(positions.buffers()[1], offsets, values, validity if data.null_count else None,
                          kinds.indices.buffers()[1], epochs.buffers()[1], data.offset, n, Record, self._kinds)
        with self._lock:
            self._size, self._data, self.pending = n, data, pending
            self._offsets = memoryview(offsets).cast("i")[data.offset:data.offset + n + 1]
            self._counted = 0

    def count(self) -> None:
        """Count the records handed out since the last count."""
        with self._lock:
            # read in this order (the reader takes no lock): a record off the
            # iterator is held until it is handed out or kept in retry
            done = self._size - length_hint(self.pending) - (self._holding or self.retry is not None)
            if done > self._counted:
                first, self._counted = self._counted, done
                data = self._data
                if type(data) is RowSet:
                    entries, nbytes = data.counts(first, done)
                else:  # a null row has no bytes: its offsets do not move
                    entries = done - first - (data.slice(first, done - first).null_count if data.null_count else 0)
                    nbytes = self._offsets[done] - self._offsets[first]
                if entries:
                    metrics.read_many(entries, nbytes)

    def __del__(self) -> None:
        try:
            self.count()  # what an abandoned stream handed out
        except Exception:  # noqa: BLE001 - at interpreter exit metrics may be gone
            pass

    def decoded(self, rec: Record) -> Record:
        """`rec` with its data decoded by the log's codec; on failure it is
        kept to be handed out first next time, and ZlogError is raised."""
        if rec.data is None or self.decode is None:
            return rec
        try:
            return rec._replace(data=self.decode(rec.data))
        except Exception as e:  # noqa: BLE001 - raised again if asked again: never skipped
            self.retry = rec
            raise ZlogError(f"position {rec.position}: cannot decode entry: {e}") from e

    def next(self) -> Record | None:
        """The next record handed out (decoded), or None when the batch is done."""
        self._holding = True  # a count meanwhile leaves out the record being decoded
        try:
            rec = self.retry if self.retry is not None else next(self.pending, None)
            if rec is None:
                return None
            out = self.decoded(rec)  # on failure rec stays in retry
            self.retry = None
            return out
        finally:
            self._holding = False


class Records:
    """Log.stream(): BatchStream's batches as Records (RecordBatch). The
    records of a batch are handed out by C iterators, so iterating
    costs no Python call per entry; the iterator keeps its place, so
    breaking out of a loop, an error, or close() loses nothing. Like the
    batch stream it outlives an error: the call after one goes on from the
    first position not yet handed out."""

    def __init__(self, batches: BatchStream) -> None:
        """`batches` made with decode=False: Records decodes each entry itself."""
        self._batches = batches
        self._current = RecordBatch(batches.codec)
        self._walk: Iterator[Any] | None = None
        self._gen = self._records()

    def __iter__(self) -> Iterator[Record]:
        return self._gen  # a for loop runs the generator directly: no __next__ call per entry

    def __next__(self) -> Record:
        return next(self._gen)

    def _records(self) -> Generator[Record, None, None]:
        cur = self._current
        while True:
            if cur.decode is None:
                yield from cur.pending  # in C, one record after another
            else:
                while True:
                    try:
                        rec = cur.next()
                    except ZlogError:  # undecodable: the next call meets it again
                        self._gen = self._records()
                        raise
                    if rec is None:
                        break
                    yield rec
            if self._walk is None:
                self._walk = iter(self._batches)  # resumes at the batch stream's position
            try:
                b = next(self._walk)
            except StopIteration:
                self._walk = None
                self._gen = self._records()  # iterating again looks past the end again (follow, or new entries)
                return
            except BaseException:
                self._walk = None  # the walk is over (its reads are closed): a new one next time
                self._gen = self._records()
                raise
            cur.load(b)

    def close(self) -> None:
        """Stop reading now (an abandoned stream's reads are also closed when
        it is garbage collected); iterating again goes on from the first
        record not handed out."""
        self._gen.close()
        self._gen = self._records()
        self._current.count()
        if self._walk is not None:
            close = getattr(self._walk, "close", None)
            self._walk = None
            if close is not None:
                close()
