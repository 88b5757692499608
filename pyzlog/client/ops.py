"""Class calls on one position (read, write, fill, trim) and on a range of
them (trim_to), each at the epoch of one metadata snapshot, with the one
rule for a refused epoch (stale.StaleWait)."""
from __future__ import annotations

import errno
from collections.abc import Callable

from . import metrics
from ..core import wire
from ..core.errors import NotWritten, from_errno
from ..core.layout import check_position, view_objects
from ..core.objects import check
from .positions import max_position
from .stale import StaleWait
from ..core.state import LogState
from ..core.tailfind import find_tail, stat_objects


def call_at(log: LogState, method: str, position: int, payload: Callable[[int], bytes],
            out_len: int = 64) -> bytes:
    """`method` on the object holding `position`, with the payload for the
    current epoch; a refused epoch refreshes the view and retries. Raises the
    typed error for any other failure."""
    check_position(position)
    stale = StaleWait(log, f"{method} at {position}")
    while True:
        epoch, oid = log.locate(position)
        ret, out = log.data.call_raw(oid, method, payload(epoch), out_len)
        if ret != -errno.ESTALE:
            break
        stale(epoch)
    if ret == -errno.ENOENT and method == "read":
        raise NotWritten(position)  # the object was never created
    if ret < 0:
        raise from_errno(ret, f"{method} at position {position} of {log.name!r}", position)
    return out


def read(log: LogState, position: int) -> bytes:
    """The entry stored at `position`, decoded."""
    raw = call_at(log, "read", position, lambda e: wire.epoch_position(e, position), wire.MAX_ENTRY_BYTES + 64)
    metrics.read(len(raw))
    return log.decode(raw)


def write(log: LogState, position: int, stored: bytes) -> None:
    call_at(log, "write", position, lambda e: wire.write(e, position, stored))


def fill(log: LogState, position: int, reason: int = wire.FILL_JUNK) -> None:
    call_at(log, "fill", position, lambda e: wire.fill(e, position, reason))


def trim(log: LogState, position: int) -> None:
    call_at(log, "trim", position, lambda e: wire.epoch_position(e, position))


def trim_to(log: LogState, position: int) -> None:
    """Trim every position <= `position`, on every object that may hold one.

    The objects' max rises to `position` with the watermark, so tail finding
    never hands out a trimmed position again; a trim beyond what is stored
    also moves the log to a new epoch, so a sequencer counting below it
    recovers its counter above it instead of handing out trimmed positions."""
    check_position(position)
    stored_top = max_position(log)
    stale = StaleWait(log, f"trim_to {position}")
    while True:
        meta = log.meta
        oids = [oid for v in meta.views if v.start <= position for oid in view_objects(log.name, v)]
        futs = [(oid, log.data.call_async(oid, "trim_to", wire.epoch_position(meta.epoch, position)))
                for oid in oids]
        results = [(oid, f.result()[0]) for oid, f in futs]
        if not any(r == -errno.ESTALE for _, r in results):
            break
        stale(meta.epoch)
    for oid, ret in results:
        check(ret, "trim_to", oid)
    if stored_top is None or position > stored_top:
        find_tail(log)


def first_position(log: LogState) -> int:
    """The first position not trimmed by trim_to (0 if none was)."""
    oids = [oid for v in log.views for oid in view_objects(log.name, v)]
    return max((st.trim_below for st in stat_objects(log.data, oids)), default=0)
