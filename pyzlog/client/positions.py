"""Where new positions come from: the sequencer while it answers, slow tail
finding (the position after the highest one stored) while it does not.

The one home for which sequencer a client asks and for its health as the
client sees it. The sequencer is the one the log's metadata names (the
daemon that took the log over last); a client follows a change as soon as
its metadata shows one. For a log whose metadata names none, it is the
address the application gave, or else a live daemon from the pool's
registry (registry.py). A sequencer that cannot be reached is asked again
no sooner than SEQUENCER_RECHECK_SECONDS later, and in between every
position comes from the objects themselves. Positions from slow tail
finding may already be taken by the time they are written; the class
refuses such a write and the append takes another (appending.py).

Positions are written at the epoch they were handed out under, never a
newer one: a sequencer that took the log at a newer epoch counted only what
was stored before it sealed. For the same reason slow tail finding never
hands out positions at an epoch the metadata records a sequencer taking
the log over at: its counter would not see them, and it would answer a
tail below an acknowledged entry (sync() in pyzlog.objects then misses
it). It installs an epoch first (find_tail), at which that sequencer's
answers count for nothing (tail()) and its positions are refused. Epochs
other clients installed by slow tail finding are joined: clients without
a sequencer would otherwise take the log from each other at every append.
(A reconfiguration's first epoch cannot be joined: the objects are sealed
above it, so that no slow append lands past the end it is about to close
the view at; tailfind.py.)
"""
from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

from . import metrics
from ..core import wire
from ..core.errors import (InvalidRequest, LogClosed, SequencerRefused, SequencerUnavailable, StaleEpoch,
                           StreamsUnsupported, ZlogError)
from ..core.registry import preference, read_records, recent, registry_ioctx
from ..core.seqr_auth import Credentials
from ..core.sequencer import (BAD_REQUEST, MAX_HISTORY_PER_REQUEST, MAX_STREAM_HISTORY, OK, RATE_LIMITED,
                              RECOVERY_FAILED, RETRY, STALE_EPOCH, SequencerClient, prefer_history)
from .stale import StaleWait
from ..core.state import LogState
from ..core.tailfind import find_tail, newest_position, refresh_with_newest

logger = logging.getLogger("pyzlog")

#: how long a request waits for a sequencer that answers "log initialising"
#: before it takes positions by slow tail finding instead
SEQUENCER_RETRY_SECONDS = 10.0
#: after the sequencer failed, go back to it no sooner than this
SEQUENCER_RECHECK_SECONDS = 1.0
#: epochs slow tail finding installs for one request before giving up (each
#: one raced: someone else moved the log on right after it)
SLOW_EPOCH_ATTEMPTS = 20
#: look in the pool's registry for a sequencer no more often than this
DISCOVER_EVERY_SECONDS = 2.0
#: a recorded sequencer found unreachable is not asked again for this long
#: while another daemon from the registry is asked instead
DETOUR_SECONDS = 5.0


def max_position(log: LogState) -> int | None:
    """Highest position written, filled or trimmed in the newest view, without
    sealing. The metadata is read again first: stripes other clients opened
    since it was last read hold the newest positions (a handle opened before
    them would answer a lower top, and without a sequencer a lower tail)."""
    stale = StaleWait(log, "max_position")
    try:  # the metadata read and the last stripe's answers in one round trip, where they can be
        return refresh_with_newest(log, lambda _meta: True)[1]
    except StaleEpoch:
        stale(log.meta.epoch)
    while True:
        meta = log.meta
        try:
            return newest_position(log, meta)
        except StaleEpoch:
            stale(meta.epoch)


def next_position_hint(log: LogState) -> int:
    """The next position an append would try, from max_position (no seal)."""
    return _after(max_position(log), log.meta)


def _no_sequencer_here(meta: wire.Meta) -> bool:
    """Whether slow tail finding may store at meta's epoch: no sequencer took
    the log over at it (its counter may be past what is stored)."""
    return not (meta.sequencer and meta.sequencer_epoch >= meta.epoch)


def _after(top: int | None, meta: wire.Meta) -> int:
    """The position after `top` (the highest stored), and never below the
    start of meta's newest view or the log's trim point (a trim above the
    tail may have found no object of the newest view to raise)."""
    start = max(meta.views[-1].start, meta.trim_below)
    return start if top is None else max(start, top + 1)


class Positions:
    """New positions for one log. `sequencer` is asked while the metadata
    names no sequencer; with `discover`, a daemon from the pool's registry
    is asked when neither names one. Without either: slow tail finding."""

    def __init__(self, log: LogState, sequencer: SequencerClient | None, discover: bool = True) -> None:
        self.log = log
        self.sequencer = sequencer
        self.timeout = sequencer.timeout if sequencer is not None else None
        # every sequencer this log asks gets the same credentials (and their secret cache)
        self.credentials = sequencer.credentials if sequencer is not None else Credentials(log.cluster)
        if self.credentials.cluster is None:  # a client given without one reads secrets with the log's
            self.credentials.cluster = log.cluster
        self._discover = discover
        self._discover_at = 0.0  # no registry read before this (monotonic)
        self._avoid = ""  # a recorded sequencer found unreachable ...
        self._avoid_until = 0.0  # ... not asked again before this (monotonic)
        self._switch_lock = threading.Lock()
        self._switches = 0
        self._down = False  # the last request found a sequencer unreachable ...
        self._failed = ""  # ... this one
        self._recheck_at = 0.0  # no request to the sequencer before this (monotonic) ...
        self._down_epoch = 0  # ... unless one took the log over above this epoch since
        self._tail_recheck_at = 0.0  # no tail request before this (its own: appends ask on)
        self._no_history: set[str] = set()  # sequencers that refused STREAM_HISTORY (older ones)
        self._slow_lock = threading.Lock()
        self._slow_next = 0  # next position slow tail finding hands out
        self.closed = False  # close() was called (the Log's)

    @property
    def generation(self) -> int:
        """Grows whenever the sequencer asked changes, or the pool's secret
        read for it does (the C++ append path then reconnects with them)."""
        return self._switches + self.credentials.version

    def sequencer_usable(self, now: float | None = None) -> bool:
        """Is the sequencer worth asking now (known, and not found down or
        unable to serve within the last SEQUENCER_RECHECK_SECONDS)?"""
        self.follow()
        return (self.sequencer is not None and not self._down
                and (time.monotonic() if now is None else now) >= self._recheck_at)

    def usable_now(self, now: float | None = None) -> bool:
        """sequencer_usable without looking at the metadata again: for the
        async append path, which calls follow() whenever the metadata it
        holds changes."""
        return (self.sequencer is not None and not self._down
                and (time.monotonic() if now is None else now) >= self._recheck_at)

    def warm(self) -> None:
        """Connect to the sequencer asked now, if it is usable (no registry
        or metadata read; nothing once the log is closed: SequencerClient.
        connect); what fails is left for the first request to meet."""
        seqr = self.sequencer
        if seqr is not None and not self.closed and self.usable_now() and self._may_ask_tail():
            try:
                seqr.connect(self.log.pool)
            except ZlogError as e:
                logger.debug("log %r: connecting to sequencer %s ahead: %s", self.log.name, seqr.address, e)
                if isinstance(e, SequencerUnavailable):  # as a tail request that found it so (counter())
                    self._tail_recheck_at = time.monotonic() + SEQUENCER_RECHECK_SECONDS

    def follow(self) -> bool:
        """Ask the sequencer the metadata names (or, if none, one from the
        registry). True if that changed which sequencer is asked."""
        named = self.log.meta.sequencer
        current = self.sequencer.address if self.sequencer is not None else None
        if named:
            if named == current or (named == self._avoid and time.monotonic() < self._avoid_until):
                return False
            return self._switch(named)
        if current is None and self._discover and time.monotonic() >= self._discover_at:
            self._discover_at = time.monotonic() + DISCOVER_EVERY_SECONDS
            picked = self._from_registry()
            return picked is not None and self._switch(picked)
        return False

    def _from_registry(self, exclude: str = "") -> str | None:
        try:
            records = recent(read_records(registry_ioctx(self.log.cluster, self.log.pool)))
        except ZlogError as e:
            logger.debug("no sequencer registry for pool %r: %s", self.log.pool, e)
            return None
        order = preference(f"{self.log.pool}/{self.log.name}", [r.address for r in records if r.address != exclude])
        return order[0] if order else None

    def _detour(self, unreachable: str) -> bool:
        """The recorded sequencer cannot be reached and the metadata names no
        other: ask a live daemon from the registry, which takes the log over
        if the recorded one is dead (say, it died before any standby saw it).
        True if that changed which sequencer is asked."""
        if not self._discover or time.monotonic() < self._discover_at:
            return False
        self._discover_at = time.monotonic() + DISCOVER_EVERY_SECONDS
        picked = self._from_registry(exclude=unreachable)
        if picked is None:
            return False
        self._avoid, self._avoid_until = unreachable, time.monotonic() + DETOUR_SECONDS
        return self._switch(picked)

    def _switch(self, address: str) -> bool:
        with self._switch_lock:
            old = self.sequencer
            if old is not None and old.address == address:
                return False
            kwargs = {} if self.timeout is None else {"timeout": self.timeout}
            self.sequencer = SequencerClient(address, credentials=self.credentials, **kwargs)
            self._recheck_at = 0.0  # ask it at once (_down stays: the next answer says it is over)
            self._tail_recheck_at = 0.0  # a tail request to the one before failed, not to it
            self._switches += 1
        logger.info("log %r: asking sequencer %s%s", self.log.name, address,
                    f" (was {old.address})" if old is not None else "")
        if old is not None:
            old.close()
        return True

    def close(self) -> None:
        # every later request for positions or the tail is refused (LogClosed), so none opens a
        # connection again (a SequencerClient reconnects on a request: it may serve other logs)
        self.closed = True
        if self.sequencer is not None:
            self.sequencer.close()

    def _refuse_if_closed(self) -> None:
        if self.closed:
            raise LogClosed("log is closed")

    def take(self, count: int) -> tuple[int, wire.Meta]:
        """First of `count` fresh positions, from the sequencer or without one
        from slow tail finding, and the metadata they were handed out under:
        they are written at its epoch (module docstring)."""
        self._refuse_if_closed()
        got = self._from_sequencer(count)
        return got if got is not None else self.take_slow(count)

    def take_slow(self, count: int) -> tuple[int, wire.Meta]:
        """First of `count` positions after the highest one stored (and after
        any this client handed out that way), asking no sequencer, and the
        metadata to write them under (never a sequencer's epoch: module docstring)."""
        self._refuse_if_closed()
        hint, meta = self._slow_tail()
        with self._slow_lock:
            first = max(self._slow_next, hint)
            self._slow_next = first + count
        metrics.SLOW_POSITIONS.inc(count)
        return first, meta

    def _slow_tail(self) -> tuple[int, wire.Meta]:
        """(the position after the highest one stored, the metadata to write
        it under), at the log's epoch unless the metadata records a sequencer
        taking the log over there; then at a new one (find_tail)."""
        delay = 0.005
        stale = StaleWait(self.log, "slow tail finding")
        races = 0
        while True:
            try:
                meta, top = refresh_with_newest(self.log, _no_sequencer_here)
            except StaleEpoch:
                # sealed above it: an epoch change under way (wait for it,
                # not take the log from it), or left half done (StaleWait
                # repairs that after REPAIR_AFTER_SECONDS)
                stale(self.log.meta.epoch)
                continue
            if _no_sequencer_here(meta):
                return _after(top, meta), meta
            epoch, nxt = find_tail(self.log)
            meta = self.log.meta
            if meta.epoch == epoch:
                return nxt, meta
            races += 1
            if races >= SLOW_EPOCH_ATTEMPTS:
                break
            time.sleep(delay * random.uniform(0.5, 1.5))  # moved on at once: let the other settle
            delay = min(delay * 2, 0.5)
        raise ZlogError(f"log {self.log.name!r}: slow tail finding installed {SLOW_EPOCH_ATTEMPTS} epochs and "
                        "someone moved the log on right after each (other clients without a sequencer, "
                        "or reconfigurations, racing)")

    def tail(self) -> int:
        """The next position an append would get (the sequencer's counter, or
        without a sequencer the position after the highest one stored)."""
        counter = self.counter()
        return counter if counter is not None else next_position_hint(self.log)

    def counter(self) -> int | None:
        """The sequencer's counter, or None if no sequencer answers (or none
        is known: self.sequencer is None)."""
        self._refuse_if_closed()
        self._refuse_if_blocklisted()
        self.follow()
        seqr = self.sequencer
        if seqr is not None and self._may_ask_tail():
            try:
                for _ in range(1000):
                    status, seqr_epoch, pos, _ = seqr.tail(self.log.pool, self.log.name, self.log.epoch)
                    if status == OK:
                        # A sequencer paused past its lease may still answer at the
                        # epoch this client knows, with a counter below what its
                        # successor has handed out since (and readers have seen):
                        # the answer counts only if no newer epoch is in the
                        # metadata after it (a successor takes one before serving).
                        if self.log.refresh_epoch() > seqr_epoch:
                            continue
                        return int(pos)
                    if status == STALE_EPOCH:
                        self.log.refresh()
                    elif status == RETRY:
                        time.sleep(0.01)
                    else:
                        break
            except SequencerUnavailable:  # no timeout per sync(); appends find out for themselves
                self._tail_recheck_at = time.monotonic() + SEQUENCER_RECHECK_SECONDS
        return None

    def take_streams(self, count: int, streams: list[int]) -> tuple[int, int, list[Any], wire.Meta]:
        """First of `count` fresh positions that belong to `streams`, with
        each stream's backpointers: (first, K, [(stream, horizon, positions
        newest first, ordinal, [(level, position)])]) as the sequencer
        answered (docs/seqr-protocol.md,
        "Streams"). Without a sequencer the positions come from slow tail
        finding (at an epoch no sequencer took over at: the next sequencer
        to serve the log starts its streams above them), and no stream
        knows anything below them: (first, 0, [(stream, first, [], 0, []) ...]). The last
        item is the metadata to write them under (take). A sequencer that
        does not know stream requests raises StreamsUnsupported."""
        self._refuse_if_closed()
        got = self._from_sequencer(count, streams)
        if got is not None:
            pos, k, bps, meta = got
            return int(pos), int(k), bps, meta
        first, meta = self.take_slow(count)
        return first, 0, [(s, first, [], 0, []) for s in streams], meta

    def tail_streams(self, streams: list[int], history: int = 0) -> tuple[int, int, list[Any], int] | None:
        """(tail, K, [(stream, horizon, backpointers, ordinal, levels)], the
        epoch it was answered at) from the sequencer, or None when none
        answers (a reader then scans). With `history`, each
        stream's backpointers are its last `history` positions (at most what
        one request may ask for) when the sequencer keeps more of them than
        its K recent ones (STREAM_HISTORY; a sequencer without it answers
        STREAM_TAIL)."""
        self._refuse_if_closed()
        self._refuse_if_blocklisted()
        for retried in (False, True):
            self.follow()
            seqr = self.sequencer
            if seqr is None or not self._may_ask_tail():
                return None
            try:
                return self._ask_streams(seqr, streams, history)
            except SequencerUnavailable:
                # a reader's metadata may name a sequencer another has taken over from (dead):
                # fresh metadata naming another is asked at once, not after a scan of it all
                if retried or not self._moved_on_quietly():
                    self._tail_recheck_at = time.monotonic() + SEQUENCER_RECHECK_SECONDS
                    return None
        return None

    def _ask_streams(self, seqr: SequencerClient, streams: list[int],
                     history: int) -> tuple[int, int, list[Any], int] | None:
        """tail_streams' requests to `seqr` (SequencerUnavailable if it does not answer)."""
        # what the protocol allows: MAX_STREAM_HISTORY per stream, MAX_HISTORY_PER_REQUEST in all
        want = 0 if seqr.address in self._no_history else \
            min(history, MAX_STREAM_HISTORY, MAX_HISTORY_PER_REQUEST // len(streams))
        for _ in range(1000):
            epoch = self.log.epoch
            status, _e, pos, _n, k, bps = seqr.streams(self.log.pool, self.log.name, epoch, 0, streams, want)
            if status == OK:  # answered at `epoch`, the sequencer's own (else STALE_EPOCH or RETRY)
                if want:
                    bps = prefer_history(bps)
                return int(pos), int(k), bps, epoch
            if status == STALE_EPOCH:
                self.log.refresh()
            elif status == RETRY:
                time.sleep(0.01)
            elif status == BAD_REQUEST and want:
                self._no_history.add(seqr.address)  # a zlog-seqr from before STREAM_HISTORY
                want = 0
            elif status == BAD_REQUEST:
                raise StreamsUnsupported(f"sequencer {seqr.address} does not answer stream requests "
                                         f"(an older zlog-seqr)")
            else:
                return None
        return None

    def _refuse_if_blocklisted(self) -> None:
        """Blocklisted is final (zlog revoke): a revoked client takes no
        position and learns no tail from a sequencer either, though the
        sequencer itself would answer it."""
        if self.log.conn.blocklisted is not None:
            raise self.log.conn.blocklisted

    def _from_sequencer(self, count: int, streams: list[int] | None = None) -> Any:
        """First of `count` new positions, or None to use slow tail finding.
        With `streams`: (first, K, backpointers) from a stream request."""
        self._refuse_if_blocklisted()
        self.follow()
        if self.sequencer is None or not self._may_ask():
            return None
        log = self.log
        retry_until = time.monotonic() + SEQUENCER_RETRY_SECONDS
        delay = 0.001
        behind = 0  # answers in a row showing the sequencer at an epoch the metadata never had
        while True:
            seqr = self.sequencer
            assert seqr is not None
            meta = log.meta  # OK answers come at its epoch: the positions are written under it
            try:
                if streams is None:
                    status, seqr_epoch, pos, n = seqr.next(log.pool, log.name, meta.epoch, count)
                else:
                    status, seqr_epoch, pos, n, k, bps = seqr.streams(log.pool, log.name, meta.epoch, count, streams)
            except SequencerUnavailable as e:
                if not self._down:
                    logger.warning("%s; appending to %r by slow tail finding until it is back", e, log.name)
                    self._down, self._failed = True, seqr.address
                    metrics.SLOW_FALLBACKS.inc()
                if self._moved_on() or self._detour(seqr.address):
                    continue  # another daemon took the log over, or may: ask it
                # refused (no key for the pool, TLS): asking again at once
                # after it takes the log back would be refused again
                self._not_before(time.monotonic() + SEQUENCER_RECHECK_SECONDS,
                                 again_on_takeover=not isinstance(e, SequencerRefused))
                return None
            if status == OK:
                if self._down:
                    if seqr.address == self._failed:
                        logger.warning("sequencer %s is back; appends to %r use it again", seqr.address, log.name)
                    else:
                        logger.warning("appends to %r use sequencer %s (it serves the log now)", log.name,
                                       seqr.address)
                    self._down = False
                return (int(pos), meta) if streams is None else (pos, k, bps, meta)
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
            if status == RATE_LIMITED and time.monotonic() < retry_until:
                # over this connection's position budget: wait as long as the daemon says
                metrics.RATE_LIMITED.inc()
                time.sleep(min(max(int(n), 1), 1000) / 1000 * random.uniform(1.0, 1.25))
                continue
            if status == BAD_REQUEST and streams is not None:
                raise StreamsUnsupported(f"sequencer {seqr.address} refused a stream request for {log.name!r} "
                                         f"(an older zlog-seqr, or more positions at once than it allows)")
            if status == BAD_REQUEST and count > 1:
                # more positions at once than this connection may take (docs/seqr-protocol.md, limits)
                logger.info("sequencer %s refused %d positions at once for %r; taking them by slow tail finding",
                            seqr.address, count, log.name)
                return None
            if status == RECOVERY_FAILED and self._moved_on():
                continue  # this daemon does not serve the log (any more): ask the one that does
            if status == RATE_LIMITED:
                # not slow tail finding: it would take the log from a sequencer
                # that serves everyone else (module docstring)
                raise SequencerRefused(f"sequencer {seqr.address} kept this client over its position budget for "
                                       f"{SEQUENCER_RETRY_SECONDS:.0f}s (zlog-seqr --max-rate); appending to "
                                       f"{log.name!r} slower, or from fewer clients, keeps it under")
            if status in (RETRY, RECOVERY_FAILED, STALE_EPOCH):
                logger.warning("sequencer %s cannot serve %r (%s); using slow tail finding",
                               seqr.address, log.name,
                               {RETRY: "still initialising", RECOVERY_FAILED: "its recovery failed",
                                STALE_EPOCH: "its epoch stayed ahead of the log's"}[status])
                metrics.SLOW_FALLBACKS.inc()
                self._not_before(time.monotonic() + SEQUENCER_RECHECK_SECONDS)
                return None
            raise InvalidRequest(f"sequencer {seqr.address} refused the request (status {status})")

    def _not_before(self, when: float, again_on_takeover: bool = True) -> None:
        """Ask the sequencer again no sooner than `when` (monotonic), unless
        (`again_on_takeover`) one takes the log over at a newer epoch
        meanwhile (_may_ask)."""
        meta = self.log.meta
        self._recheck_at = when
        self._down_epoch = max(meta.epoch, meta.sequencer_epoch) if again_on_takeover else 1 << 63

    def _may_ask(self) -> bool:
        """Is the sequencer worth asking now? Not within SEQUENCER_RECHECK_SECONDS
        of finding it unable to serve, unless the metadata (as last read)
        shows a sequencer taking the log over since: slow tail finding would
        take the log back from it (take_slow)."""
        return time.monotonic() >= self._recheck_at or self.log.meta.sequencer_epoch > self._down_epoch

    def _may_ask_tail(self) -> bool:
        """_may_ask, and no tail request failed within SEQUENCER_RECHECK_SECONDS."""
        return self._may_ask() and time.monotonic() >= self._tail_recheck_at

    def _moved_on(self) -> bool:
        """After a failed request: does fresh metadata name another sequencer?"""
        self.log.refresh()
        return self.follow()

    def _moved_on_quietly(self) -> bool:
        """_moved_on, False if the metadata cannot be read (the caller's answer
        without a sequencer stands: a reader scans)."""
        try:
            return self._moved_on()
        except ZlogError:
            return False
