"""What a streaming reader reports, and the rule for the gaps it meets.

A stream (batches.BatchStream: Log.stream, stream_batches, the Spark source)
delivers positions in order and reports every gap as a typed record. A
position below the tail that is still unwritten is a hole: the writer that
took the number is slow or dead. The reader waits up to `hole_wait` seconds
for it (HoleClock), then fills it (ops.fill_hole), and reports it as LOST so
the log moves on. Nothing here talks to a cluster.
"""
from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from enum import Enum
from typing import Any, NamedTuple

from ..core.errors import InvalidRequest
from ..core.layout import check_position


#: default seconds a reader waits on an unwritten position below the tail
HOLE_WAIT_SECONDS = 2.0
#: partitions of a log: a stride is a view's width or a count of readers
MAX_STRIDE = 1 << 32
#: follow mode: longest pause between polls of an idle tail
MAX_POLL_SECONDS = 0.25


class RecordKind(str, Enum):
    DATA = "data"        # an entry
    FILLED = "filled"    # junk, filled by some client: never data
    TRIMMED = "trimmed"  # reclaimed: the data is gone
    LOST = "lost"        # a hole filled by a reader after waiting: its writer never wrote
    CORRUPT = "corrupt"  # damaged at rest, skipped by a stream with on_corrupt="skip" (no data)


class Record(NamedTuple):
    """One position of a stream. A named tuple, not a dataclass: a stream
    makes one per entry, and a tuple is made in C at a fraction of the cost."""

    position: int
    kind: RecordKind
    data: bytes | None
    epoch: int  # epoch of the request that stored it (0 if unknown, e.g. trimmed)


class HoleClock:
    """The gap rule every stream follows (Stream here, batches.BatchStream
    on the native path): an unwritten position is a hole once some later
    position is known to have been handed out, and it is filled as LOST
    after `hole_wait` seconds from the first time that was known. Holes
    found together (one lost batch of positions) are waited for together.

    A reader that reads a range in pieces (one stream per piece: the gaps
    between a replicated-object runtime's own entries) keeps one clock for
    all of them and gives it to each piece as `durable`, so a hole it has
    known about for a while is not waited for anew. Only what stays true is
    kept there: the end of a closed view, or a position stored above that is
    also below the piece's `known_tail` (a position below both was handed
    out, and a sequencer that starts later counts on from what is stored, so
    never hands it out again; something stored past the counter, a fill of a
    future position, says nothing of the positions below it). A piece
    without a `known_tail` reads without a sequencer: positions are then
    taken above what is stored, and a stored position alone is kept. A
    piece's `known_tail` itself stays the piece's own: after a failover or a
    reconfiguration the positions handed out but not written are handed out
    again, and their new writers get a full hole_wait."""

    def __init__(self, hole_wait: float, known_tail: int | None = None, durable: HoleClock | None = None) -> None:
        self.hole_wait = hole_wait
        self.known_tail = known_tail  # the caller knows every position below this was handed out
        self.durable = durable
        self._asked = -1  # the last position since() asked highest() for
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

    def _saw_stored(self, bound: int, passed: int, view_end: bool = False) -> None:
        """saw_tail for a stored position above `passed`, or a view's end. It
        stays true for the durable clock up to `known_tail` only: something
        stored past the sequencer's counter (a fill or write at a future
        position) does not make the positions below it handed out, and the
        sequencer hands them out later."""
        d = self.durable
        if d is None:
            self.saw_tail(bound, passed)
        elif view_end or self.known_tail is None or bound <= self.known_tail:
            d.saw_tail(bound, passed)
        else:
            d.saw_tail(self.known_tail, passed)
            self.saw_tail(bound, passed)

    def _first_known(self, position: int) -> float | None:
        i = bisect.bisect_right(self._bounds, position)
        return self._times[i] if i < len(self._bounds) else None

    def needs_highest(self, position: int, view_end: int | None) -> bool:
        """Whether since() calls its `highest` for these arguments (a stream
        that must ask the cluster for it asks only then): not past a view's
        end; with a durable clock, until one of its bounds covers `position`
        (so the reader's later pieces learn of the hole), but once only for
        a position `known_tail` covers; else unless `known_tail` covers it."""
        if view_end is not None:
            return False
        known = self.known_tail is not None and position < self.known_tail
        d = self.durable
        if d is not None:  # asked once per hole when known_tail already tells (then only to share it)
            return not (d._bounds and position < d._bounds[-1]) and not (known and self._asked == position)
        return not known

    def since(self, position: int, view_end: int | None, highest: Callable[[], int | None]) -> float | None:
        """When `position` was first known to lie below the tail, or None if
        it is at the tail. `view_end`: where its view ends, if a later view
        exists; `highest()`: the highest position stored in its view now."""
        if view_end is not None:
            self._saw_stored(view_end, position, view_end=True)  # a later view exists: all of this one is below the tail
        else:
            if self.needs_highest(position, view_end):
                top = highest()
                self._asked = position
                if top is not None:
                    self._saw_stored(top, position)
            if self.known_tail is not None and position < self.known_tail:
                self.saw_tail(self.known_tail, position)
        mine = self._first_known(position)
        kept = self.durable._first_known(position) if self.durable is not None else None
        if mine is None or kept is None:
            return mine if kept is None else kept
        return min(mine, kept)

    def wait_for(self, since: float) -> float:
        """Seconds to sleep before looking at a hole first known at `since`
        again; 0 means its wait is over: fill it."""
        waited = time.monotonic() - since
        if waited >= self.hole_wait:
            return 0.0
        return min(0.01 + waited / 4, 0.2, self.hole_wait - waited)


#: what a stream does at a damaged position (CorruptEntry): raise it, or skip it
ON_CORRUPT = ("fail", "skip")


def check_stream_args(start: int, end: int | None, stride_index: int | None = None,
                      stride: int | None = None, on_corrupt: Any = "fail") -> None:
    if on_corrupt not in ON_CORRUPT and not callable(on_corrupt):
        raise InvalidRequest(f"on_corrupt must be 'fail', 'skip' or a callable, not {on_corrupt!r}")
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
