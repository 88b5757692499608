"""A log: its metadata, views, and the storage operations on its positions."""
from __future__ import annotations

import builtins
import errno
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Self

import rados

from . import wire
from .aio import DEFAULT_MAX_IN_FLIGHT, AsyncOps
from .cluster import open_ioctx
from .codec import check_codec, codec_for
from .errors import (
    EntryTooLarge,
    InvalidRequest,
    NotWritten,
    SequencerUnavailable,
    StaleEpoch,
    ZlogError,
    from_errno,
)
from .layout import (
    META_NAMESPACE,
    check_name,
    check_position,
    oid_of,
    view_objects,
)
from .metadata import MetaStore
from .objects import ClassIO, check
from .reader import HOLE_WAIT_SECONDS, Record, Stream, check_stream_args
from .sequencer import OK, RECOVERY_FAILED, RETRY, STALE_EPOCH, SequencerClient
from .stale import StaleWait
from .tailfind import find_tail, highest_position, seal_new_epoch, stat_objects

logger = logging.getLogger("pyzlog")

DEFAULT_WIDTH = 4
#: how long an append waits for a sequencer that answers "log initialising"
#: before it appends by slow tail finding instead
SEQUENCER_RETRY_SECONDS = 10.0
#: after the sequencer failed, go back to it no sooner than this
SEQUENCER_RECHECK_SECONDS = 1.0
#: an append gives up (and raises) after this long without storing its entry
APPEND_DEADLINE_SECONDS = 120.0


def _check_entry(data: bytes) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidRequest(f"entries are bytes, not {type(data).__name__}")
    if len(data) > wire.MAX_ENTRY_BYTES:
        raise EntryTooLarge(f"entry of {len(data)} bytes is over the limit of {wire.MAX_ENTRY_BYTES}")
    return bytes(data)


def _batches(items: list[tuple[int, bytes]], max_bytes: int = 8 << 20) -> list[list[tuple[int, bytes]]]:
    """Split (position, data) pairs into write_many calls within the class's limits."""
    out: list[list[tuple[int, bytes]]] = [[]]
    size = 0
    for item in items:
        if out[-1] and (len(out[-1]) >= wire.MAX_BATCH_ENTRIES or size + len(item[1]) > max_bytes):
            out.append([])
            size = 0
        out[-1].append(item)
        size += len(item[1])
    return out


class Log:
    """One log in one pool. Obtain with Log.create or Log.open."""

    def __init__(self, cluster: rados.Rados, pool: str, name: str,
                 sequencer: SequencerClient | str | None = None,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, coalesce: bool = True) -> None:
        self.cluster = cluster
        self.pool = pool
        self.name = check_name(name)
        self.data = ClassIO(open_ioctx(cluster, pool), cluster)
        self.meta_store = MetaStore(ClassIO(open_ioctx(cluster, pool, META_NAMESPACE), cluster), name)
        self._meta: wire.Meta | None = None
        self._meta_lock = threading.Lock()  # refresh never installs an older epoch
        self._repair_lock = threading.Lock()  # one repair at a time per Log
        self.sequencer = SequencerClient(sequencer) if isinstance(sequencer, str) else sequencer
        self._seqr_down = False
        self._seqr_recheck_at = 0.0
        self._slow_next = 0  # next position slow tail finding will try
        self._async = AsyncOps(self, max_in_flight, coalesce)
        self.encode, self.decode = codec_for({})

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def create(cls, cluster: rados.Rados, pool: str, name: str, width: int = DEFAULT_WIDTH,
               config: dict[str, Any] | None = None,
               sequencer: SequencerClient | str | None = None, *, compression: str = "none",
               max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, coalesce: bool = True) -> Log:
        """A new log striped over `width` objects; LogExists if the name is taken.
        `compression` ("none" or "zstd") is recorded in the log's metadata.
        `max_in_flight` and `coalesce` are as for open()."""
        _check_width(width)
        config = dict(config or {})
        config.setdefault("compression", check_codec(compression))
        codec_for(config)  # refuse an unknown codec before creating anything
        log = cls(cluster, pool, name, sequencer, max_in_flight, coalesce)
        log.meta_store.create(width, config)
        log.refresh()
        return log

    @classmethod
    def open(cls, cluster: rados.Rados, pool: str, name: str,
             sequencer: SequencerClient | str | None = None,
             max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, coalesce: bool = True) -> Log:
        """The log `name` (LogNotFound if missing). At most `max_in_flight` async
        operations are outstanding at once. With `coalesce`, async appends queued
        together for one data object are sent as one write_many call."""
        log = cls(cluster, pool, name, sequencer, max_in_flight, coalesce)
        log.refresh()  # LogNotFound if missing
        return log

    @staticmethod
    def list(cluster: rados.Rados, pool: str) -> builtins.list[str]:
        return MetaStore.list_names(open_ioctx(cluster, pool, META_NAMESPACE))

    # ------------------------------------------------------------- metadata
    def refresh(self) -> wire.Meta:
        """Read the metadata again. Never goes back: threads sharing this Log
        may refresh concurrently, and a slower read of an older epoch must not
        replace a newer one (the epoch and the view history are replaced
        together, as one snapshot)."""
        fetched = self.meta_store.get()
        with self._meta_lock:
            current = self._meta
            if current is None or fetched.epoch >= current.epoch:
                if current is None or fetched.config != current.config:
                    self.encode, self.decode = codec_for(json.loads(fetched.config) if fetched.config else {})
                self._meta = current = fetched
            return current

    def refresh_epoch(self) -> int:
        return self.refresh().epoch

    def repair(self, stale_epoch: int) -> None:
        """The log's objects refuse `stale_epoch` and no newer epoch has been
        installed for a while: whoever started an epoch change (a sequencer's
        recovery, a reconfiguration) died or stalls between sealing and
        installing. Finish it by installing a newer epoch ourselves."""
        with self._repair_lock:
            if self.refresh().epoch > stale_epoch:
                return  # another thread (or process) got there first
            logger.warning("log %r: objects sealed above epoch %d and no newer epoch installed; "
                           "finishing the epoch change", self.name, stale_epoch)
            try:
                find_tail(self)
            except ZlogError as e:
                logger.warning("log %r: could not finish the epoch change: %s", self.name, e)

    @property
    def meta(self) -> wire.Meta:
        return self._meta if self._meta is not None else self.refresh()

    @property
    def epoch(self) -> int:
        return self.meta.epoch

    @property
    def views(self) -> tuple[wire.View, ...]:
        return self.meta.views

    @property
    def config(self) -> dict[str, Any]:
        raw = self.meta.config
        return json.loads(raw) if raw else {}

    def oid_of(self, position: int) -> str:
        return oid_of(self.name, self.views, position)

    def locate(self, position: int) -> tuple[int, str]:
        """(epoch, object) for `position` from one metadata snapshot: a request
        must never pair one refresh's epoch with another's view history."""
        meta = self.meta
        return meta.epoch, oid_of(self.name, meta.views, position)

    # ---------------------------------------------------- position operations
    def _call(self, method: str, position: int, payload: Callable[[int], bytes],
              out_len: int = 64) -> bytes:
        """One class call on the object holding `position`, tagged with the
        current epoch; a stale epoch refreshes the view and retries."""
        check_position(position)
        stale = StaleWait(self, f"{method} at {position}")
        while True:
            epoch, oid = self.locate(position)
            ret, out = self.data.call_raw(oid, method, payload(epoch), out_len)
            if ret != -errno.ESTALE:
                break
            stale(epoch)
        if ret == -errno.ENOENT and method == "read":
            raise NotWritten(position)  # the object was never created
        if ret < 0:
            raise from_errno(ret, f"{method} at position {position} of {self.name!r}", position)
        return out

    def write(self, position: int, data: bytes) -> None:
        """Store `data` at `position` (write-once). Most users want append()."""
        stored = self._stored(data)
        self._call("write", position, lambda e: wire.write(e, position, stored))

    def read(self, position: int) -> bytes:
        """The entry at `position`; NotWritten, Filled or Trimmed otherwise."""
        return self.decode(self._call("read", position, lambda e: wire.epoch_position(e, position),
                                      wire.MAX_ENTRY_BYTES + 64))

    def fill(self, position: int) -> None:
        """Mark an unwritten position as junk so the log can move past it."""
        self._call("fill", position, lambda e: wire.fill(e, position))

    def fill_lost(self, position: int) -> None:
        """Fill a hole whose writer never wrote, recording that it was lost:
        every reader from then on reports it as LOST, not as plain FILLED."""
        self._call("fill", position, lambda e: wire.fill(e, position, wire.FILL_LOST))

    def trim(self, position: int) -> None:
        """Reclaim one position's space; reads then raise Trimmed."""
        self._call("trim", position, lambda e: wire.epoch_position(e, position))

    def trim_to(self, position: int) -> None:
        """Trim every position <= `position`, on every object that may hold one.

        The objects' max rises to `position` with the watermark, so tail finding
        never hands out a trimmed position again; a trim beyond what is stored
        also moves the log to a new epoch, so a sequencer counting below it
        recovers its counter above it instead of handing out trimmed positions."""
        check_position(position)
        stored_top = self.max_position()
        stale = StaleWait(self, f"trim_to {position}")
        while True:
            meta = self.meta
            oids = [oid for v in meta.views if v.start <= position for oid in view_objects(self.name, v)]
            futs = [(oid, self.data.call_async(oid, "trim_to", wire.epoch_position(meta.epoch, position)))
                    for oid in oids]
            results = [(oid, f.result()[0]) for oid, f in futs]
            if not any(r == -errno.ESTALE for _, r in results):
                break
            stale(meta.epoch)
        for oid, ret in results:
            check(ret, "trim_to", oid)
        if stored_top is None or position > stored_top:
            find_tail(self)

    # ------------------------------------------------------------------ tail
    def max_position(self) -> int | None:
        """Highest position written, filled or trimmed in the newest view, without sealing."""
        stale = StaleWait(self, "max_position")
        while True:
            meta = self.meta
            try:
                return highest_position(self.data, view_objects(self.name, meta.views[-1]), meta.epoch)
            except StaleEpoch:
                stale(meta.epoch)

    def next_position_hint(self) -> int:
        """The next position an append would try, from max_position (no seal)."""
        top = self.max_position()
        start = self.views[-1].start
        return start if top is None else max(start, top + 1)

    def first_position(self) -> int:
        """The first position not trimmed by trim_to (0 if none was)."""
        oids = [oid for v in self.views for oid in view_objects(self.name, v)]
        return max((st.trim_below for st in stat_objects(self.data, oids)), default=0)

    def tail(self) -> int:
        """The next position an append would get (the sequencer's counter, or
        without a sequencer the position after the highest one stored)."""
        if self.sequencer is not None and time.monotonic() >= self._seqr_recheck_at:
            try:
                for _ in range(1000):
                    status, _seqr_epoch, pos, _ = self.sequencer.tail(self.pool, self.name, self.epoch)
                    if status == OK:
                        return int(pos)
                    if status == STALE_EPOCH:
                        self.refresh()
                    elif status == RETRY:
                        time.sleep(0.01)
                    else:
                        break
            except SequencerUnavailable:
                pass
        return self.next_position_hint()

    def seal_and_find_tail(self) -> tuple[int, int]:
        """Slow tail finding: new epoch, seal, max. Returns (epoch, next position)."""
        return find_tail(self)

    # ---------------------------------------------------------------- append
    def append(self, data: bytes) -> int:
        """Append one entry and return its position.

        The position comes from the sequencer; without one (or while it is
        unreachable) from slow tail finding. A stale epoch refreshes the view
        and takes a new position; so does a position someone else wrote or
        filled first. Success is reported only for data that is stored."""
        stored = self._stored(data)
        deadline = time.monotonic() + APPEND_DEADLINE_SECONDS
        stale = StaleWait(self, "append")
        while time.monotonic() < deadline:
            pos = self.take_positions(1)
            epoch, oid = self.locate(pos)
            ret, _ = self.data.call_raw(oid, "write", wire.write(epoch, pos, stored))
            if ret == 0:
                return pos
            if ret == -errno.ESTALE:
                stale(epoch)
            elif ret not in (-errno.EROFS, -errno.ENOMSG, -errno.EIDRM):
                raise from_errno(ret, f"append to {self.name!r}", pos)
        raise ZlogError(f"append to {self.name!r}: no position could be written in "
                        f"{APPEND_DEADLINE_SECONDS:.0f}s")

    def _position_from_sequencer(self, count: int = 1) -> int | None:
        """First of `count` new positions, or None to use slow tail finding."""
        if self.sequencer is None or time.monotonic() < self._seqr_recheck_at:
            return None
        retry_until = time.monotonic() + SEQUENCER_RETRY_SECONDS
        delay = 0.001
        behind = 0  # answers in a row showing the sequencer at an epoch the metadata never had
        while True:
            try:
                status, seqr_epoch, pos, _ = self.sequencer.next(self.pool, self.name, self.epoch, count)
            except SequencerUnavailable as e:
                if not self._seqr_down:
                    logger.warning("%s; appending to %r by slow tail finding until it is back", e, self.name)
                self._seqr_down = True
                self._seqr_recheck_at = time.monotonic() + SEQUENCER_RECHECK_SECONDS
                return None
            if self._seqr_down:
                logger.warning("sequencer %s is back; appends to %r use it again",
                               self.sequencer.address, self.name)
                self._seqr_down = False
            if status == OK:
                return int(pos)
            if status == STALE_EPOCH and time.monotonic() < retry_until:
                if self.refresh().epoch >= seqr_epoch:
                    behind = 0
                    continue
                behind += 1
                if behind >= 3:
                    # the sequencer serves this name at an epoch above the
                    # metadata's: the log was removed and created again (or the
                    # cluster was). Move the log past it; the sequencer then
                    # recovers this log afresh when it sees the newer epoch.
                    logger.warning("sequencer %s serves %r at epoch %d, above the log's %d: "
                                   "moving the log past it", self.sequencer.address, self.name,
                                   seqr_epoch, self.epoch)
                    find_tail(self, above=int(seqr_epoch))
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
                               self.sequencer.address, self.name,
                               {RETRY: "still initialising", RECOVERY_FAILED: "its recovery failed",
                                STALE_EPOCH: "its epoch stayed ahead of the log's"}[status])
                self._seqr_recheck_at = time.monotonic() + SEQUENCER_RECHECK_SECONDS
                return None
            raise InvalidRequest(f"sequencer {self.sequencer.address} refused the request (status {status})")

    def take_positions(self, count: int) -> int:
        """First of `count` fresh positions: from the sequencer, or without one
        from slow tail finding (the position after the highest one stored; a
        write that finds it taken just asks again)."""
        pos = self._position_from_sequencer(count)
        if pos is not None:
            return pos
        first = max(self._slow_next, self.next_position_hint())
        self._slow_next = first + count
        return first

    def _stored(self, data: bytes) -> bytes:
        """The bytes stored for `data`: checked, encoded, within the size limit."""
        stored = self.encode(_check_entry(data))
        if len(stored) > wire.MAX_ENTRY_BYTES:
            raise EntryTooLarge(f"encoded entry of {len(stored)} bytes is over the limit of {wire.MAX_ENTRY_BYTES}")
        return stored

    def append_many(self, entries: builtins.list[bytes]) -> builtins.list[int]:
        """Append entries with one sequencer request and one write_many call
        per object. Positions are increasing in entry order unless a write is
        refused (a position filled or taken meanwhile): that entry is appended
        again at a later position. Returns the position of each entry."""
        todo = [(i, self._stored(d)) for i, d in enumerate(entries)]
        positions: builtins.list[int] = [-1] * len(todo)
        deadline = time.monotonic() + APPEND_DEADLINE_SECONDS
        stale_wait = StaleWait(self, "append_many")
        while todo:
            if time.monotonic() > deadline:
                raise ZlogError(f"append_many to {self.name!r}: {len(todo)} entries not stored in time")
            first = self.take_positions(len(todo))
            meta = self.meta
            epoch = meta.epoch
            by_oid: dict[str, builtins.list[tuple[int, bytes]]] = {}
            owner: dict[int, int] = {}
            for k, (i, stored) in enumerate(todo):
                pos = first + k
                owner[pos] = i
                by_oid.setdefault(oid_of(self.name, meta.views, pos), []).append((pos, stored))
            calls = [(oid, batch, self.data.call_async(oid, "write_many", wire.write_many(epoch, batch)))
                     for oid, items in by_oid.items() for batch in _batches(items)]
            retry: builtins.list[tuple[int, bytes]] = []
            stale = False
            for oid, batch, fut in calls:
                ret = fut.result()[0]
                if ret == 0:
                    for pos, _ in batch:
                        positions[owner[pos]] = pos
                elif ret == -errno.ESTALE:
                    stale = True
                    retry.extend((owner[pos], d) for pos, d in batch)
                elif ret in (-errno.EROFS, -errno.ENOMSG, -errno.EIDRM):
                    # all or nothing refused: store what can be stored one by one
                    for pos, d in batch:
                        r, _ = self.data.call_raw(oid, "write", wire.write(epoch, pos, d))
                        if r == 0:
                            positions[owner[pos]] = pos
                        elif r in (-errno.ESTALE, -errno.EROFS, -errno.ENOMSG, -errno.EIDRM):
                            stale = stale or r == -errno.ESTALE
                            retry.append((owner[pos], d))
                        else:
                            raise from_errno(r, f"append_many to {self.name!r}", pos)
                else:
                    check(ret, "write_many", oid)
            if stale:
                stale_wait(epoch)
            todo = sorted(retry)
        return positions

    def append_slow(self, data: bytes) -> int:
        """Append by slow tail finding, without asking any sequencer."""
        stored = self._stored(data)
        pos = self.next_position_hint()
        stale = StaleWait(self, "append_slow")
        while True:
            epoch, oid = self.locate(pos)
            ret, _ = self.data.call_raw(oid, "write", wire.write(epoch, pos, stored))
            if ret == 0:
                return pos
            if ret == -errno.ESTALE:
                stale(epoch)
            elif ret not in (-errno.EROFS, -errno.ENOMSG, -errno.EIDRM):
                raise from_errno(ret, f"append to {self.name!r}", pos)
            pos = max(pos + 1, self.next_position_hint())

    # ----------------------------------------------------------------- async
    def append_async(self, data: bytes) -> Future[int]:
        """Append without waiting: a Future of the position. Blocks only while
        max_in_flight operations are outstanding. Entries queued together
        share a sequencer request and, with coalesce (the default), one
        write_many call per data object (see fastappend.py)."""
        return self._async.append(self._stored(data))

    def read_async(self, position: int) -> Future[bytes]:
        check_position(position)
        return self._async.read(position)

    def flush(self, timeout: float | None = None) -> None:
        """Wait for every async operation to finish."""
        self._async.flush(timeout)

    def close(self) -> None:
        self._async.close()
        if self.sequencer is not None:
            self.sequencer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- stream
    def stream(self, start: int = 0, end: int | None = None, *, follow: bool = False,
               hole_wait: float = HOLE_WAIT_SECONDS) -> Iterator[Record]:
        """Records for positions start, start+1, ... in order: DATA, or a gap
        (FILLED, TRIMMED, or LOST for a hole a reader filled after waiting
        `hole_wait` seconds for its writer; this reader fills such holes too). Stops before `end`, or at the tail
        unless `follow` is set, in which case it waits for new entries."""
        check_stream_args(start, end)
        return Stream(self, start, end, follow=follow, hole_wait=hole_wait, decode=self.decode)

    # -------------------------------------------------------- reconfiguration
    def reconfigure(self, width: int) -> wire.View:
        """Stripe new positions over `width` objects: seal the newest view at a
        new epoch, find its tail, and install a view starting after it. Old
        positions stay where they were written; other clients refresh when
        their old epoch is refused."""
        _check_width(width)
        for _ in range(5):
            epoch, start = seal_new_epoch(self, width, f"reconfigure {self.name!r}: the epoch kept changing under us")
            if self.views[-1].width == width:
                break
            # we finished a reconfiguration someone else had cut in half (with
            # its width): now make ours
        else:
            raise ZlogError(f"reconfigure {self.name!r}: other reconfigurations kept racing ours")
        logger.info("log %r: view %d from position %d over %d objects", self.name, epoch, start, width)
        return self.views[-1]


def _check_width(width: int) -> None:
    if not isinstance(width, int) or isinstance(width, bool) or not 1 <= width <= wire.MAX_WIDTH:
        raise InvalidRequest(f"stripe width must be 1..{wire.MAX_WIDTH}, not {width!r}")


__all__ = ["DEFAULT_WIDTH", "Log"]
