"""Where new positions come from: the sequencer while it answers, slow tail
finding (the position after the highest one stored) while it does not.

The one home for the sequencer's health as a client sees it: a sequencer
that cannot be reached is asked again no sooner than
SEQUENCER_RECHECK_SECONDS later, and in between every position comes from
the objects themselves. Positions from slow tail finding may already be
taken by the time they are written; the class refuses such a write and the
append takes another (appending.py).
"""
from __future__ import annotations

import logging
import random
import threading
import time

from .errors import InvalidRequest, SequencerUnavailable, StaleEpoch
from .layout import view_objects
from .sequencer import OK, RECOVERY_FAILED, RETRY, STALE_EPOCH, SequencerClient
from .stale import StaleWait
from .state import LogState
from .tailfind import find_tail, highest_position

logger = logging.getLogger("pyzlog")

#: how long a request waits for a sequencer that answers "log initialising"
#: before it takes positions by slow tail finding instead
SEQUENCER_RETRY_SECONDS = 10.0
#: after the sequencer failed, go back to it no sooner than this
SEQUENCER_RECHECK_SECONDS = 1.0


def max_position(log: LogState) -> int | None:
    """Highest position written, filled or trimmed in the newest view, without sealing."""
    stale = StaleWait(log, "max_position")
    while True:
        meta = log.meta
        try:
            return highest_position(log.data, view_objects(log.name, meta.views[-1]), meta.epoch)
        except StaleEpoch:
            stale(meta.epoch)


def next_position_hint(log: LogState) -> int:
    """The next position an append would try, from max_position (no seal)."""
    top = max_position(log)
    start = log.views[-1].start
    return start if top is None else max(start, top + 1)


class Positions:
    """New positions for one log, from `sequencer` (None: slow tail finding only)."""

    def __init__(self, log: LogState, sequencer: SequencerClient | None) -> None:
        self.log = log
        self.sequencer = sequencer
        self._down = False  # the last request found the sequencer unreachable
        self._recheck_at = 0.0  # no request to the sequencer before this (monotonic)
        self._slow_lock = threading.Lock()
        self._slow_next = 0  # next position slow tail finding hands out

    def sequencer_usable(self, now: float | None = None) -> bool:
        """Is the sequencer worth asking now (configured, and not found down
        or unable to serve within the last SEQUENCER_RECHECK_SECONDS)?"""
        return (self.sequencer is not None and not self._down
                and (time.monotonic() if now is None else now) >= self._recheck_at)

    def take(self, count: int) -> int:
        """First of `count` fresh positions: from the sequencer, or without one
        from slow tail finding."""
        pos = self._from_sequencer(count)
        return pos if pos is not None else self.take_slow(count)

    def take_slow(self, count: int) -> int:
        """First of `count` positions after the highest one stored (and after
        any this client handed out that way), asking no sequencer."""
        hint = next_position_hint(self.log)
        with self._slow_lock:
            first = max(self._slow_next, hint)
            self._slow_next = first + count
        return first

    def tail(self) -> int:
        """The next position an append would get (the sequencer's counter, or
        without a sequencer the position after the highest one stored)."""
        if self.sequencer is not None and time.monotonic() >= self._recheck_at:
            try:
                for _ in range(1000):
                    status, _seqr_epoch, pos, _ = self.sequencer.tail(self.log.pool, self.log.name,
                                                                      self.log.epoch)
                    if status == OK:
                        return int(pos)
                    if status == STALE_EPOCH:
                        self.log.refresh()
                    elif status == RETRY:
                        time.sleep(0.01)
                    else:
                        break
            except SequencerUnavailable:
                pass
        return next_position_hint(self.log)

    def _from_sequencer(self, count: int) -> int | None:
        """First of `count` new positions, or None to use slow tail finding."""
        seqr = self.sequencer
        if seqr is None or time.monotonic() < self._recheck_at:
            return None
        log = self.log
        retry_until = time.monotonic() + SEQUENCER_RETRY_SECONDS
        delay = 0.001
        behind = 0  # answers in a row showing the sequencer at an epoch the metadata never had
        while True:
            try:
                status, seqr_epoch, pos, _ = seqr.next(log.pool, log.name, log.epoch, count)
            except SequencerUnavailable as e:
                if not self._down:
                    logger.warning("%s; appending to %r by slow tail finding until it is back", e, log.name)
                self._down = True
                self._recheck_at = time.monotonic() + SEQUENCER_RECHECK_SECONDS
                return None
            if self._down:
                logger.warning("sequencer %s is back; appends to %r use it again", seqr.address, log.name)
                self._down = False
            if status == OK:
                return int(pos)
            if status == STALE_EPOCH and time.monotonic() < retry_until:
                if log.refresh().epoch >= seqr_epoch:
                    behind = 0
                    continue
                behind += 1
                if behind >= 3:
                    # the sequencer serves this name at an epoch above the
                    # metadata's: the log was removed and created again (or the
                    # cluster was). Move the log past it; the sequencer then
                    # recovers this log afresh when it sees the newer epoch.
                    logger.warning("sequencer %s serves %r at epoch %d, above the log's %d: "
                                   "moving the log past it", seqr.address, log.name, seqr_epoch, log.epoch)
                    find_tail(log, above=int(seqr_epoch))
                    behind = 0
                else:
                    time.sleep(0.005 * behind)
                continue
            if status == RETRY and time.monotonic() < retry_until:
                time.sleep(delay * random.uniform(0.5, 1.5))
                delay = min(delay * 2, 0.05)
                continue
            if status in (RETRY, RECOVERY_FAILED, STALE_EPOCH):
                logger.warning("sequencer %s cannot serve %r (%s); using slow tail finding",
                               seqr.address, log.name,
                               {RETRY: "still initialising", RECOVERY_FAILED: "its recovery failed",
                                STALE_EPOCH: "its epoch stayed ahead of the log's"}[status])
                self._recheck_at = time.monotonic() + SEQUENCER_RECHECK_SECONDS
                return None
            raise InvalidRequest(f"sequencer {seqr.address} refused the request (status {status})")
