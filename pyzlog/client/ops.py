"""Class calls on one position (read, write, fill, trim) and on a range of
them (trim_to), each at the epoch of one metadata snapshot, with the one
rule for a refused epoch (stale.StaleWait)."""
from __future__ import annotations

import errno
import logging
from typing import TYPE_CHECKING, Any

from . import metrics
from ..core import wire
from ..core.cluster import open_ioctx
from ..core.errors import Filled, ReadOnly, StaleEpoch, Trimmed
from ..core.layout import META_NAMESPACE, Place, check_position, place_of, stripe_of, view_end, view_places
from ..core.native import Op
from ..core.state import LogState
from ..core.stripes import made_places, make
from ..core.tailfind import find_tail, stat_objects
from .positions import max_position
from .stale import StaleWait

if TYPE_CHECKING:
    import rados

logger = logging.getLogger("pyzlog")


def call_at(log: LogState, op: Op, position: int, data: bytes = b"", reason: int = 0,
            meta: wire.Meta | None = None) -> Any:
    """`op` on the object holding `position`, at the current epoch; a refused
    epoch refreshes the view and retries, a data-format object not made yet
    is made (stripes.make) for any op but a read. Raises the typed error for
    any other failure. With `meta` (the metadata a position was handed out
    under): at its epoch only, and a refused epoch raises StaleEpoch (a
    sequencer that took the log over since may not count the position:
    client/positions.py)."""
    check_position(position)
    stale: StaleWait | None = None
    made = rechecked = False
    while True:
        if meta is None:
            epoch, where = log.locate(position)
        else:
            epoch, where = meta.epoch, place_of(log.name, meta.views, position)
        code, value = log.conn.call_pos(log.data, where.oid, op, epoch, position, data, reason, where.format)
        if code == -errno.ENOENT and op == Op.READ and position < log.meta.trim_below:
            code = -errno.EIDRM  # below the log's trim point: its object is gone or was never made
        elif code == -errno.ENOENT and op == Op.READ and meta is None and not rechecked:
            # an older view than the log's may map the position to a stripe it never opened
            # (the log was reconfigured since): read again under fresh metadata if it moved on
            rechecked = True
            if log.moved_past(epoch):
                continue
        elif code == -errno.ENOENT and where.view.bounded and op != Op.READ and not made:
            code = make(log, epoch, where)
            made = code == 0
            if made:
                continue
        if code != -errno.ESTALE:
            break
        if meta is not None:
            raise StaleEpoch(f"{op.name.lower()} at position {position} of {log.name!r}: the position was handed "
                             f"out at epoch {epoch} and the log has moved on since; take a new one",
                             errno=errno.ESTALE)
        stale = stale or StaleWait(log, f"{op.name.lower()} at {position}")
        stale(epoch)
        made = False
    if code < 0:
        raise log.conn.error(code, f"{op.name.lower()} at position {position} of {log.name!r}", pool=log.data,
                             oid=where.oid, position=position, op=op)
    return value


def read(log: LogState, position: int) -> bytes:
    """The entry stored at `position`, decoded."""
    raw = call_at(log, Op.READ, position)
    metrics.read(len(raw))
    return log.decode(raw)


def write(log: LogState, position: int, stored: bytes, meta: wire.Meta | None = None) -> None:
    call_at(log, Op.WRITE, position, stored, meta=meta)


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


def trim_to(log: LogState, position: int, past_counter: bool = False) -> None:
    """Trim every position <= `position`, on every object that may hold one.

    The log's trim point is raised first (the metadata keeps it for
    data-format logs: first_position, and readers, start there). The
    objects' max rises to `position` with the watermark, so tail finding
    never hands out a trimmed position again; a data-format object wholly
    trimmed keeps only its header. Only stripes from where the last finished
    trim_to stopped are asked (a trim_to cut short is finished by the next).
    A trim beyond what is stored, or `past_counter` (at or past the
    sequencer's counter, or that counter unknown: a fill far past the tail
    stores positions it has not reached), also moves the log to a new
    epoch right after the trim point rises, so a sequencer counting below
    it recovers its counter above it instead of handing out trimmed
    positions."""
    check_position(position)
    stored_top = max_position(log)
    done_below = _objects_trimmed_below(log)
    log.meta_store.trim(position)
    if stored_top is None or position > stored_top or past_counter:
        # at once, not after the objects: a trimmer killed in between would
        # leave the sequencer handing out trimmed positions to every append
        find_tail(log)
    # read after the trim point rose: an object made later gets it from its
    # maker (stripes.give_trim_point); one made before is found here
    log.refresh()
    stale = StaleWait(log, f"trim_to {position}")
    while True:
        meta = log.meta
        code = _trim_places(log, meta, _trimmed_places(log, meta, position, done_below), position)
        if code != -errno.ESTALE:
            break
        stale(meta.epoch)
    _note_objects_trimmed_below(log, done_below, position + 1)


def _trim_places(log: LogState, meta: wire.Meta, places: list[Place], position: int) -> int:
    """trim_to `position` on each of `places` at meta's epoch, making the
    objects of an open stripe nobody made yet: 0, or -ESTALE if the log
    moved on; raises any other failure. Made here, an object has the trim
    point before anyone can write to it: a writer that made it could die
    between making it and giving it the trim point. (A listed range holds
    only objects that exist: what a listing did not find is left to its
    maker, stripes.give_trim_point.)"""
    while places:
        results = log.conn.calls([(log.data, p.oid, Op.TRIM_TO, {"epoch": meta.epoch, "position": position,
                                                                 "format": p.format}) for p in places])
        if any(code == -errno.ESTALE for code, _ in results):
            return -errno.ESTALE
        missing = {(p.view.epoch, p.stripe): p for p, (code, _) in zip(places, results)
                   if code == -errno.ENOENT and p.view.bounded}
        for p, (code, _) in zip(places, results):
            if code < 0 and (p.view.epoch, p.stripe) not in missing:
                raise log.conn.error(code, f"trim_to {position} on {p.oid}", pool=log.data, oid=p.oid,
                                     op=Op.TRIM_TO)
        for p in missing.values():
            code = make(log, meta.epoch, p)
            if code == -errno.ESTALE:
                return code
            if code < 0:  # not asked again: it would find the object missing for ever
                raise log.conn.error(code, f"trim_to {position}: making {p.oid}", pool=log.data, oid=p.oid,
                                     op=Op.INIT)
        places = [p for p in places if (p.view.epoch, p.stripe) in missing]
    return 0


#: an xattr of a log's metadata object: every object has been trimmed below
#: this position (by trim_to calls that finished). The metadata's trim point
#: rises first and runs ahead of it while a trim_to is under way, or forever
#: if one was cut short: the next one then asks the stripes from here.
TRIMMED_XATTR = "zlog.objects_trimmed_below"


def _objects_trimmed_below(log: LogState, ioctx: rados.Ioctx | None = None) -> int:
    import rados

    try:
        meta_ioctx = ioctx or open_ioctx(log.cluster, log.pool, META_NAMESPACE)
        return int(meta_ioctx.get_xattr(log.name, TRIMMED_XATTR))
    except (rados.Error, ValueError):
        return 0  # never recorded (or unreadable): ask every stripe


def _note_objects_trimmed_below(log: LogState, before: int, below: int) -> None:
    """Record `below` if it is higher (a racing trim_to may record a lower one
    after it: later trims then ask more stripes than needed, never fewer)."""
    import rados

    if below <= before:
        return
    try:
        ioctx = open_ioctx(log.cluster, log.pool, META_NAMESPACE)
        if _objects_trimmed_below(log, ioctx) < below:
            ioctx.set_xattr(log.name, TRIMMED_XATTR, str(below).encode())
    except rados.Error as e:
        logger.warning("log %r: could not record that it is trimmed below %d (%s): the next trim_to asks "
                       "every stripe", log.name, below, e)


def _trimmed_places(log: LogState, meta: wire.Meta, position: int, done_below: int) -> list[Place]:
    """The objects that may hold a position <= `position` and are not wholly
    trimmed already: an omap view's every object; a data-format view's
    stripes from the one holding `done_below` (every object is trimmed below
    it) to the one holding `position` (or its last open one)."""
    out: list[Place] = []
    for v in meta.views:
        if v.start > position:
            continue
        if not v.bounded:
            out += view_places(log.name, v)
            continue
        first = stripe_of(v, max(v.start, done_below))
        last = min(stripe_of(v, position), log.open_stripes(v) - 1)
        end = view_end(meta.views, v)
        if end is not None:
            last = min(last, stripe_of(v, max(v.start, end - 1)))
        out += made_places(log, v, range(first, last + 1))
    return out


def first_position(log: LogState) -> int:
    """The first position not trimmed by trim_to (0 if none was)."""
    meta = log.refresh()
    omap = [p.oid for v in meta.views if not v.bounded for p in view_places(log.name, v)]
    return max([meta.trim_below] + [st.trim_below for st in stat_objects(log, omap)])
