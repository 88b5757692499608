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

import time
from collections.abc import Iterator
from typing import Any

import errno
import logging

from ..core.scan import KIND_NAMES, STOP_CORRUPT, STOP_END, STOP_MISSING, ViewScan, batch_of
from . import metrics
from ..core import wire
from ..core.errors import CorruptEntry, StaleEpoch, ZlogError
from ..core.native import Op, Queue
from ..core.layout import first_in_stride, stripe_end, stripe_of, stripe_places, view_end, view_of
from ..core.tailfind import highest_position
from .ops import fill_hole
from .reader import MAX_POLL_SECONDS, HoleClock, Record, RecordKind
from .stale import StaleWait
from ..core.state import LogState

#: entries asked of one object per read_range call
PER_CALL = 1024

logger = logging.getLogger("pyzlog")


class BatchStream:
    """Batches for positions [start, end) (or only those p with p % stride ==
    stride_index), in position order; see Log.stream_batches."""

    def __init__(self, log: LogState, start: int, end: int | None, *, follow: bool, hole_wait: float,
                 stride_index: int | None = None, stride: int | None = None, known_tail: int | None = None,
                 signed: bool = False, max_rows: int = 65536, decode: bool = True,
                 on_corrupt: Any = "fail") -> None:
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
        self.holes = HoleClock(hole_wait, known_tail)
        self._pool = log.data
        self._queue: Queue | None = None
        #: how the log's entries are decoded (None: stored as written)
        self.codec = None if log.config.get("compression", "none") == "none" else log.decode
        self._decode = self.codec if decode else None  # decode=False: data as stored
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
        self._filter = self.stride is not None
        if self.stride is not None and view.width == self.stride:
            step = view.width  # one object of the view holds exactly the positions asked for
            self._filter = False
            self.position = first_in_stride(self.position, self.stride_index, self.stride)  # type: ignore[arg-type]
        scan = ViewScan(self._queue, self._pool, [p.oid for p in stripe_places(self.log.name, view, stripe)],
                        meta.epoch, self.position, last, per_call=PER_CALL, step=step, max_rows=self.max_rows,
                        signed=self.signed, format=view.format, trim_below=meta.trim_below)
        return scan, view, vend, meta.views

    def _max_position(self, scan: ViewScan, view: wire.View, position: int) -> int | None:
        """The highest position written in `view` as far as the gap rules
        need it: the scan's objects', and for a data-format view whose
        scanned stripe shows nothing at or past `position`, the later open
        stripes' (a hole at the end of a stripe lies below the tail once the
        next stripe holds something)."""
        scan.refresh_max()
        top = scan.max_position()
        if not view.bounded or (top is not None and top >= position):
            return top
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

    def _walk(self) -> Iterator[Any]:
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
                built = scan.next_batch()
            except StaleEpoch:
                stale(scan.epoch)
                self.position = scan.position
                scan = None
                continue
            stale.reset()
            if built.batch.num_rows:
                try:
                    rows = self._rows(built.batch)
                except Exception as e:  # noqa: BLE001 - an entry this codec cannot decode
                    scan.forget_from(self.position)  # not handed out: every retry meets it again
                    raise ZlogError(f"positions {self.position}..{scan.position - 1}: cannot decode an "
                                    f"entry: {e}") from e
                self.position = scan.position
                idle_since = None
                yield rows
            self.position = scan.position
            if built.stop == STOP_END:
                scan = None  # the view (or the range) is done: the next view, or the end
                continue
            if built.stop == STOP_CORRUPT:
                err = self._corrupt_entry(scan, view, built.stop_object)
                if err is None:
                    continue  # another partition's position
                if err.whole and self.on_corrupt != "fail" and self.holes.since(
                        scan.position, vend, lambda: self._max_position(scan, view, err.position)) is None:
                    if not self.follow:  # no later position known: it may never have held an entry
                        self._fail(scan, err)
                    time.sleep(MAX_POLL_SECONDS)  # as at the tail: later entries (or a repair) tell
                    scan.forget_from(err.position)
                    self.log.refresh()
                    continue
                yield self._skip_corrupt(scan, err)
                continue
            if built.stop != STOP_MISSING:
                continue
            pos = scan.position
            if self._filter and pos % self.stride != self.stride_index:  # type: ignore[operator]
                scan.skip()  # another partition's position: its reader's gap rules decide
                self.position = scan.position
                continue
            since = self.holes.since(pos, vend, lambda: self._max_position(scan, view, pos))
            if since is None:  # the tail
                if not self.follow:
                    return
                now = time.monotonic()
                idle_since = idle_since or now
                time.sleep(min(0.002 * 2 ** min((now - idle_since) * 10, 7), MAX_POLL_SECONDS))
                scan.forget_from(pos)
                self.log.refresh()
                continue
            pause = self.holes.wait_for(since)
            if pause:
                time.sleep(pause)
                scan.forget_from(pos)
            elif fill_hole(self.log, pos):
                yield self._rows(batch_of([pos], ["lost"], [self.log.epoch], [None], signed=self.signed))
                scan.skip()
                self.position = scan.position
            else:
                scan.forget_from(pos)  # someone else got there first: read what it is now

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



class Records:
    """Log.stream() on the native path: BatchStream's batches (data as
    stored) as Records, each decoded and counted as it is handed out, as
    reader.Stream does. Like reader.Stream it outlives an error: the call
    after one goes on from the first position not yet handed out (an entry
    that cannot be decoded raises again on every call)."""

    def __init__(self, batches: BatchStream) -> None:
        """`batches` made with decode=False: Records decodes each entry itself."""
        self._batches = batches
        self._decode = batches.codec
        self._walk: Iterator[Any] | None = None
        self._kinds = [RecordKind(k) for k in KIND_NAMES]
        self._records: list[Record] = []
        self._i = 0

    def __iter__(self) -> Iterator[Record]:
        return self

    def __next__(self) -> Record:
        while self._i >= len(self._records):
            if self._walk is None:
                self._walk = iter(self._batches)  # resumes at the batch stream's position
            try:
                b = next(self._walk)
            except BaseException:
                self._walk = None  # the walk is over (its reads are closed): a new one next time
                raise
            self._records = self._make(b)
            self._i = 0
        i = self._i
        rec = self._records[i]
        if rec.data is not None:
            metrics.read(len(rec.data))  # counted as handed out, as stored
            if self._decode is not None:
                try:
                    rec = rec._replace(data=self._decode(rec.data))
                except Exception as e:  # noqa: BLE001 - raised again if asked again: never skipped
                    raise ZlogError(f"position {rec.position}: cannot decode entry: {e}") from e
        self._i = i + 1
        return rec

    def _make(self, b: Any) -> list[Record]:
        """A batch's records, made in bulk: the per-entry cost of stream()."""
        kinds = self._kinds
        return list(map(Record, b.column(0).to_pylist(), [kinds[k] for k in b.column(2).indices.to_pylist()],
                        b.column(1).to_pylist(), b.column(3).to_pylist()))

    def close(self) -> None:
        """Stop reading now (an abandoned stream's reads are also closed when
        it is garbage collected)."""
        if self._walk is not None:
            close = getattr(self._walk, "close", None)
            self._walk = None
            if close is not None:
                close()
