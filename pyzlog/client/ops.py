"""Class calls on one position (read, write, fill, trim) and on a range of
them (trim_to), each at the epoch of one metadata snapshot, with the one
rule for a refused epoch (stale.StaleWait)."""
from __future__ import annotations

import errno
from typing import Any

from . import metrics
from ..core import wire
from ..core.errors import Filled, ReadOnly, Trimmed
from ..core.layout import check_position, view_objects
from ..core.native import Op
from ..core.state import LogState
from ..core.tailfind import find_tail, stat_objects
from .positions import max_position
from .stale import StaleWait


def call_at(log: LogState, op: Op, position: int, data: bytes = b"", reason: int = 0) -> Any:
    """`op` on the object holding `position`, at the current epoch; a refused
    epoch refreshes the view and retries. Raises the typed error for any
    other failure."""
    check_position(position)
    stale: StaleWait | None = None
    while True:
        epoch, oid = log.locate(position)
        code, value = log.conn.call_pos(log.data, oid, op, epoch, position, data, reason)
        if code != -errno.ESTALE:
            break
        stale = stale or StaleWait(log, f"{op.name.lower()} at {position}")
        stale(epoch)
    if code < 0:
        raise log.conn.error(code, f"{op.name.lower()} at position {position} of {log.name!r}", pool=log.data,
                             oid=oid, position=position, op=op)
    return value


def read(log: LogState, position: int) -> bytes:
    """The entry stored at `position`, decoded."""
    raw = call_at(log, Op.READ, position)
    metrics.read(len(raw))
    return log.decode(raw)


def write(log: LogState, position: int, stored: bytes) -> None:
    call_at(log, Op.WRITE, position, stored)


def fill(log: LogState, position: int, reason: int = wire.FILL_JUNK) -> None:
    call_at(log, Op.FILL, position, reason=reason)


def fill_hole(log: LogState, position: int) -> bool:
    """Fill a hole whose wait is over, recording it as lost; False if someone
    else wrote, filled or trimmed it first (read it again)."""
    try:
        fill(log, position, wire.FILL_LOST)
    except (Filled, Trimmed, ReadOnly):
        return False
    metrics.HOLES_FILLED.inc()
    return True


def trim(log: LogState, position: int) -> None:
    call_at(log, Op.TRIM, position)


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
        results = log.conn.calls([(log.data, oid, Op.TRIM_TO, {"epoch": meta.epoch, "position": position})
                                  for oid in oids])
        if not any(code == -errno.ESTALE for code, _ in results):
            break
        stale(meta.epoch)
    for oid, (code, _) in zip(oids, results):
        if code < 0:
            raise log.conn.error(code, f"trim_to {position} on {oid}", pool=log.data, oid=oid, op=Op.TRIM_TO)
    if stored_top is None or position > stored_top:
        find_tail(log)


def first_position(log: LogState) -> int:
    """The first position not trimmed by trim_to (0 if none was)."""
    oids = [oid for v in log.views for oid in view_objects(log.name, v)]
    return max((st.trim_below for st in stat_objects(log, oids)), default=0)
