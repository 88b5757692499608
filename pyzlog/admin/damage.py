"""Damage at rest: `zlog check --log NAME --deep` finds it, `zlog repair`
rebuilds a lost object header (docs/faults.md, "Corrupt entries").

The deep scan reads every object a log's views may hold entries in: `stat`
tells an object whose header is lost (every call on it answers EIO), then
`read_range` walks its positions; a range that answers EIO is halved down
to each damaged position. Nothing is written.

A repair is an operator's act, never automatic: it calls the class method
`repair` on one object, which rebuilds the header only when it is missing,
empty or unparsable, from the entries the object holds (its highest
position, counts and where its entries end) and what the log's metadata
says (the sealed epoch: the log's current one; the trim point; the end of
the object's view, from the view history; a data-format object's
geometry). It refuses an object whose header is usable, one that holds
nothing, and one whose entries are damaged too.
"""
from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from ..core import wire
from ..core.errors import Corrupt, InvalidRequest, ZlogError
from ..core.layout import Place, first_in_stride, held_after, held_count, next_held, place_named, view_end
from ..core.native import Op
from ..core.state import LogState
from ..core.stripes import made_places

#: positions asked of one object per read_range call while scanning
PER_CALL = 1024
#: a repair's reason flag: the object's view has ended (ops.h ZLOG_REPAIR_HAS_END)
REPAIR_HAS_END = 1


@dataclass(frozen=True)
class Damage:
    oid: str
    kind: str  # "metadata", "header" (the whole object refuses every call) or "entry"
    position: int | None
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


Progress = Callable[[int, int, int], None]  # (objects scanned, objects in all, damage found)


def log_places(state: LogState, meta: wire.Meta) -> list[Place]:
    """Every object of the log's views that may hold entries."""
    return [p for v in meta.views for p in made_places(state, v)]


def deep_scan(state: LogState, progress: Progress | None = None) -> tuple[list[Damage], int]:
    """(every damaged object and position of the log, objects scanned)."""
    try:
        meta = state.meta_store.get()
    except Corrupt as e:
        return [Damage(state.meta_store.name, "metadata", None, f"the log's metadata object does not parse "
                                                                 f"({e}): the log cannot be opened")], 0
    places = log_places(state, meta)
    found: list[Damage] = []
    for i, p in enumerate(places):
        found += _scan_object(state, meta, p)
        if progress is not None:
            progress(i + 1, len(places), len(found))
    return found, len(places)


def _scan_object(state: LogState, meta: wire.Meta, p: Place) -> list[Damage]:
    conn, pool, v = state.conn, state.data, p.view
    code, st = conn.call_raw(pool, p.oid, Op.STAT, format=v.format)
    if code == -errno.ENOENT:
        return []  # never made: holds nothing
    if code == -errno.EIO:
        return [Damage(p.oid, "header", None, "the object's header is lost or damaged next to its contents: "
                                              f"every call on it fails; zlog repair {state.name} --object {p.oid}")]
    if code < 0:
        raise conn.error(code, f"stat on {p.oid}", pool=pool, oid=p.oid, op=Op.STAT)
    if st.max_position is None:
        return []
    base = _first_of(p)
    first = next_held(base, v.width, v.unit, max(st.trim_below, meta.trim_below))
    last = st.max_position
    end = view_end(meta.views, v)
    if end is not None:
        last = min(last, end - 1)
    if v.bounded:
        last = min(last, held_after(base, v.width, v.unit, base, v.slots - 1))
    return [Damage(p.oid, "entry", pos, "the entry does not parse or lies outside the object's data")
            for pos in damaged_positions(state, p, meta.epoch, first, last)]


def _first_of(p: Place) -> int:
    """The first position of object `p` (an omap view's objects start at the view's start)."""
    v = p.view
    return p.base if v.bounded else first_in_stride(v.start, p.index, v.width)


def damaged_positions(state: LogState, p: Place, epoch: int, first: int, last: int) -> Iterator[int]:
    """The positions of object `p` in [first, last] (its own, `first` one of
    them: layout.next_held) whose read answers EIO."""
    conn, pool = state.conn, state.data
    base, width, unit = _first_of(p), p.view.width, p.view.unit

    def after(pos: int, k: int) -> int:  # the object's k-th position after pos
        return held_after(base, width, unit, pos, k)

    def count(lo: int, hi: int) -> int:  # the object's positions in [lo, hi]
        return held_count(base, width, unit, lo, hi)

    def read_range(lo: int, hi: int) -> tuple[int, Any]:
        code, w = conn.call_raw(pool, p.oid, Op.READ_RANGE, epoch=epoch, position=lo, last=hi,
                                max_entries=min(PER_CALL, count(lo, hi)), max_bytes=wire.MAX_RANGE_BYTES,
                                format=p.view.format)
        if code < 0 and code != -errno.EIO:
            raise conn.error(code, f"read_range on {p.oid}", pool=pool, oid=p.oid, op=Op.READ_RANGE)
        return code, w

    pos = first
    while pos <= last:
        n = min(PER_CALL, count(pos, last))
        code, w = read_range(pos, after(pos, n - 1))
        if code == 0:
            pos = next_held(base, width, unit, max(w.next, pos + 1))
            continue
        lo, hi = 0, n - 1  # a damaged position is in [lo, hi] (indexes from pos)
        while lo < hi:
            mid = (lo + hi) // 2
            code, w = read_range(after(pos, lo), after(pos, mid))
            if code == -errno.EIO:
                hi = mid
            else:
                lo = max(count(pos, w.next - 1), lo + 1) if w.next <= after(pos, mid) else mid + 1
        yield after(pos, lo)
        pos = after(pos, lo + 1)


def find_place(meta: wire.Meta, name: str, oid: str) -> Place:
    """The object `oid` of log `name` (of a stripe its view opened)."""
    for v in meta.views:
        p = place_named(name, v, oid)
        if p is not None and (not v.bounded or p.stripe < v.stripes):
            return p
    raise InvalidRequest(f"{oid!r} is not a data object of log {name!r} (zlog check --log {name} --deep "
                         "names the damaged ones)")


def repair(state: LogState, oid: str) -> wire.ObjectStat:
    """Rebuild the lost header of `oid`, one of the log's data objects, and
    return its stat. ZlogError saying why if the class refuses."""
    meta = state.meta_store.get()
    p = find_place(meta, state.name, oid)
    v = p.view
    end = view_end(meta.views, v)
    fields = {"epoch": meta.epoch, "position": end or 0, "reason": REPAIR_HAS_END if end is not None else 0,
              "start": meta.trim_below, "last": p.base if v.bounded else 0, "width": v.width,
              "slots": v.slots if v.bounded else 0, "byte_bound": v.byte_bound if v.bounded else 0, "unit": v.unit,
              "format": v.format}
    code, _ = state.conn.call_raw(state.data, oid, Op.REPAIR, **fields)
    why = {-errno.EEXIST: "its header is usable: nothing to repair",
           -errno.ENOENT: "it holds nothing (or does not exist): nothing to repair",
           -errno.EIO: "some of its entries are damaged too (the OSD log names them): it cannot be rebuilt "
                       "from them",
           -errno.EINVAL: "it holds an entry at or past its view's end, or its geometry does not match the "
                          "log's metadata"}
    if code in why:
        raise ZlogError(f"repair of {oid}: {why[code]}", errno=-code)
    if code < 0:
        raise state.conn.error(code, f"repair of {oid}", pool=state.data, oid=oid, op=Op.REPAIR)
    st = state.conn.call(state.data, oid, Op.STAT, format=v.format)
    return st  # type: ignore[no-any-return]
