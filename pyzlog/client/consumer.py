"""Named consumers: Log.consumer("billing") resumes where "billing" last
committed, in any process, after any restart.

Delivery is at-least-once: records are handed out from the committed
position, and commit() records how far processing got. A consumer that dies
between processing and commit() gets the uncommitted records again; it
never gets a record below what it committed. The position is kept in RADOS
(core.offsets: one object per consumer beside the log's metadata), written
with a compare-and-set in the OSD, so two instances of one consumer cannot
move it back. For exactly-once, store the position with the output
instead (docs/consumers.md).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal, Protocol

from ..core import offsets
from ..core.cluster import open_ioctx
from ..core.errors import CommitRefused, InvalidRequest
from ..core.layout import META_NAMESPACE, check_position
from . import metrics
from .reader import HOLE_WAIT_SECONDS, Record

if TYPE_CHECKING:
    import rados

#: where a consumer that never committed starts: the first position not
#: trimmed, the tail, or a position
Start = Literal["earliest", "latest"] | int


class ConsumedLog(Protocol):
    """What a consumer needs of a log (client.log.Log has it)."""

    @property
    def cluster(self) -> rados.Rados: ...
    @property
    def pool(self) -> str: ...
    @property
    def name(self) -> str: ...
    def first_position(self) -> int: ...
    def next_position_hint(self) -> int: ...
    def stream(self, start: int = 0, end: int | None = None, *, follow: bool = False,
               hole_wait: float = HOLE_WAIT_SECONDS) -> Iterator[Record]: ...


class Consumer:
    """A named consumer of one log. Obtain with Log.consumer(name).

    `position` is the next position this instance hands out; `committed` the
    position stored in RADOS as this instance last read or wrote it (the
    start position if the consumer never committed). Use one instance from
    one thread at a time."""

    def __init__(self, log: ConsumedLog, name: str, *, start: Start = "earliest") -> None:
        self.log = log
        self.name = offsets.check_consumer_name(name)
        self.meta_ioctx = open_ioctx(log.cluster, log.pool, META_NAMESPACE)
        self._tail: tuple[float, int] | None = None  # (monotonic time, tail) for lag()
        self._lock = threading.Lock()  # lag() may be called by a scrape meanwhile
        stored = offsets.read(self.meta_ioctx, log.name, self.name)
        #: whether the consumer had committed before this instance started
        self.resumed = stored is not None
        self.committed: int = stored.position if stored is not None else self._start(start)
        self.position = self.committed
        metrics.CONSUMERS.add(self)

    def _start(self, start: Start) -> int:
        if start == "earliest":
            return self.log.first_position()
        if start == "latest":
            return self.log.next_position_hint()
        if isinstance(start, int) and not isinstance(start, bool):
            return check_position(start)
        raise InvalidRequest(f"start must be 'earliest', 'latest' or a position, not {start!r}")

    @property
    def pool(self) -> str:
        return self.log.pool

    @property
    def log_name(self) -> str:
        return self.log.name

    # --------------------------------------------------------------- reading
    def stream(self, *, follow: bool = True, end: int | None = None,
               hole_wait: float = HOLE_WAIT_SECONDS) -> Iterator[Record]:
        """Records from `position` on, as Log.stream gives them (gaps
        included); `position` moves past each record as it is handed out, so
        commit() after processing one commits past it. With `follow` (the
        default) it waits for new entries at the tail; else it stops there."""
        for rec in self.log.stream(self.position, end, follow=follow, hole_wait=hole_wait):
            self.position = rec.position + 1
            yield rec

    def __iter__(self) -> Iterator[Record]:
        return self.stream()

    def seek(self, position: int) -> None:
        """Hand out from `position` next (this instance only; nothing stored).
        A stream already started goes on where it was."""
        self.position = check_position(position)

    # ------------------------------------------------------------ committing
    def commit(self, position: int | None = None) -> int:
        """Store `position` (default: past the last record handed out) as
        processed, and return it. Committing the stored position again does
        nothing; one below it raises CommitRefused (another instance of this
        consumer committed further) and writes nothing."""
        pos = self.position if position is None else check_position(position)
        try:
            offsets.commit(self.meta_ioctx, self.log.name, self.name, pos)
        except CommitRefused as e:
            metrics.COMMITS_REFUSED.inc()
            stored = e.committed
            if isinstance(stored, offsets.Committed):
                self.committed = max(self.committed, stored.position)
            raise
        metrics.COMMITS.inc()
        self.committed = pos
        return pos

    def committed_now(self) -> offsets.Committed | None:
        """What RADOS holds for this consumer now (read again), None if never committed."""
        stored = offsets.read(self.meta_ioctx, self.log.name, self.name)
        if stored is not None:
            self.committed = stored.position
        return stored

    def reset(self, position: int) -> None:
        """Store `position` whatever is stored (a rewind or a skip; the only
        way to move a committed position back), and hand out from there."""
        offsets.reset(self.meta_ioctx, self.log.name, self.name, position)
        self.committed = self.position = position

    # ------------------------------------------------------------------- lag
    def lag(self, max_age: float = 0.0) -> int:
        """The log's tail minus the committed position: how many positions
        this consumer has yet to commit. The tail is the one in storage
        (Log.next_position_hint), read again when older than `max_age` s."""
        now = time.monotonic()
        with self._lock:
            cached = self._tail
        if cached is None or now - cached[0] > max_age or max_age <= 0:
            cached = (now, self.log.next_position_hint())
            with self._lock:
                self._tail = cached
        return max(0, cached[1] - self.committed)

    def close(self) -> None:
        """Stop reporting this consumer's lag (its position stays stored)."""
        metrics.CONSUMERS.discard(self)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<Consumer {self.name!r} of log {self.log.name!r}: position {self.position}, "
                f"committed {self.committed}>")


__all__ = ["ConsumedLog", "Consumer", "Start"]
