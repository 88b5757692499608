"""Where a log keeps things: object names and the position -> object mapping."""
from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ._layout import first_odd as _first_odd
from ._layout import group as _group
from .errors import InvalidRequest
from .wire import MAX_POSITION, View

#: RADOS namespace of the per-log metadata objects (one object per log, named
#: after it), so listing logs never walks the data objects.
META_NAMESPACE = "zlog.meta"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InvalidRequest(
            f"bad log name {name!r}: 1-200 characters of letters, digits, '_', '.', '-', "
            "starting with a letter or digit")
    return name


def check_position(position: int) -> int:
    if not isinstance(position, int) or isinstance(position, bool) or not 0 <= position <= MAX_POSITION:
        raise InvalidRequest(f"bad position {position!r}: must be an integer in [0, {MAX_POSITION}]")
    return position


def check_positions(positions: Sequence[int]) -> list[int]:
    """`positions` sorted, each once; InvalidRequest unless every one is
    what check_position takes (an int, not a bool, in [0, MAX_POSITION]).
    The common list (plain ints) is passed in one pass in C: a stream walk
    reads thousands at a time; check_position judges the rest."""
    try:
        todo = sorted(set(positions))
    except TypeError as e:  # unhashable or unorderable items: not positions
        raise InvalidRequest(f"bad positions: {e}") from None
    odd = _first_odd(todo)
    if odd >= 0:
        for p in todo[odd:]:
            check_position(p)
    return todo


def data_oid_prefix(log: str, view: View) -> str:
    """Data objects are per view, so a new width never reuses an old object.
    A data-format view's objects add their stripe: prefix + "s{stripe}.{index}"
    (the "s" keeps its names apart from an omap view's, whatever the log's name)."""
    return f"zlog.{log}.{view.epoch}."


def data_oid(log: str, view: View, index: int, stripe: int = 0) -> str:
    if view.bounded:
        return f"{data_oid_prefix(log, view)}s{stripe}.{index}"
    return f"{data_oid_prefix(log, view)}{index}"


# ------------------------------------------------------------------ stripes
# A data-format view is a sequence of stripes: stripe s holds the positions
# [start + s * width * slots, start + (s + 1) * width * slots), dealt to its
# `width` objects in runs of `unit` consecutive positions, `slots` positions
# per object (cls_zlog/ops.h, "layout", is the definition; the functions
# below are its Python twins, checked against it in tests/unit). Unit 1 puts
# position p in object p % width. An omap view is one stripe without end.
def stripe_span(view: View) -> int:
    """Positions per stripe (0: the view is one unbounded stripe)."""
    return view.width * view.slots if view.bounded else 0


def stripe_of(view: View, position: int) -> int:
    span = stripe_span(view)
    return (position - view.start) // span if span else 0


def stripe_start(view: View, stripe: int) -> int:
    return view.start + stripe * stripe_span(view)


def stripe_end(view: View, stripe: int) -> int | None:
    """The first position past the stripe (None: unbounded)."""
    span = stripe_span(view)
    return view.start + (stripe + 1) * span if span else None


def index_of(view: View, position: int, stripe: int | None = None) -> int:
    """The object (index in its stripe) holding `position` (zlog_index_of);
    `stripe`: its stripe, when the caller has worked it out."""
    if view.unit == 1:
        return position % view.width
    if stripe is None:
        stripe = stripe_of(view, position)
    return (position - stripe_start(view, stripe)) // view.unit % view.width


def object_base(ss: int, index: int, width: int, unit: int) -> int:
    """The first position of object `index` of a stripe starting at `ss` (zlog_base_of)."""
    return first_in_stride(ss, index, width) if unit == 1 else ss + index * unit


def base_of(view: View, stripe: int, index: int) -> int:
    """The first position of object `index` of `stripe`."""
    return object_base(stripe_start(view, stripe), index, view.width, view.unit)


def next_held(base: int, width: int, unit: int, position: int) -> int:
    """The first position at or past `position` of the object whose first is
    `base` (zlog_next_held): where an object's positions go on."""
    off = max(position - base, 0)
    if unit == 1:
        return base + off + (-off) % width
    run = off // unit
    return base + (off if run % width == 0 else (run // width + 1) * width * unit)


def held_count(base: int, width: int, unit: int, first: int, last: int) -> int:
    """How many of the object's positions lie in [first, last] (`first` one of them)."""
    slot = slot_of(first - base, width, unit)
    off = last - base  # the last of its own at or before `last` (zlog_prev_held)
    run = off // unit
    prev = off - off % width if unit == 1 else (off if run % width == 0 else run // width * width * unit + unit - 1)
    return max(slot_of(prev, width, unit) - slot + 1, 0)


def slot_of(off: int, width: int, unit: int) -> int:
    """The slot of the object's position `off` past its first (zlog_slot_of)."""
    return off // width if unit == 1 else off // (unit * width) * unit + off % unit


def held_after(base: int, width: int, unit: int, position: int, n: int) -> int:
    """The object's n-th position after `position` (one of its own)."""
    if unit == 1:
        return position + n * width
    slot = slot_of(position - base, width, unit) + n  # then zlog_offset_of
    return base + slot // unit * unit * width + slot % unit


@dataclass(frozen=True, slots=True)
class Place:
    """One data object of a view, and what a call on it needs: its name, its
    format, and (data format) the geometry init makes it with."""

    oid: str
    view: View
    stripe: int
    index: int

    @property
    def format(self) -> int:
        return self.view.format

    @property
    def base(self) -> int:
        """Its first position."""
        return base_of(self.view, self.stripe, self.index)

    def init_fields(self, epoch: int) -> dict[str, int]:
        """An init request's fields for this object, made sealed at `epoch`."""
        v = self.view
        return {"epoch": epoch, "position": self.base, "width": v.width, "slots": v.slots,
                "byte_bound": v.byte_bound, "unit": v.unit}

    def next_held(self, position: int) -> int:
        """Its first position at or past `position`."""
        return next_held(self.base, self.view.width, self.view.unit, position)

    def slot(self, position: int) -> int:
        """The slot of `position`, one of its own (data format)."""
        return slot_of(position - self.base, self.view.width, self.view.unit)


def place(log: str, view: View, position: int) -> Place:
    stripe = stripe_of(view, position)
    index = index_of(view, position, stripe)
    return Place(data_oid(log, view, index, stripe), view, stripe, index)


def stripe_places(log: str, view: View, stripe: int) -> list[Place]:
    """The objects of one stripe, by index."""
    return [Place(data_oid(log, view, i, stripe), view, stripe, i) for i in range(view.width)]


def view_places(log: str, view: View, stripes: range | None = None) -> list[Place]:
    """The objects of `stripes` of a view (default: every open one)."""
    if not view.bounded:
        return stripe_places(log, view, 0)
    return [p for s in (stripes if stripes is not None else range(view.stripes))
            for p in stripe_places(log, view, s)]


_STRIPE_OID_RE = re.compile(r"s([0-9]+)\.([0-9]+)")
_OMAP_OID_RE = re.compile(r"[0-9]+")


def place_named(log: str, view: View, oid: str) -> Place | None:
    """The object `oid` of `view` (any stripe of it, open or not), or None if
    no object of the view has that name: data_oid's inverse."""
    prefix = data_oid_prefix(log, view)
    if not oid.startswith(prefix):
        return None
    if view.bounded:
        m = _STRIPE_OID_RE.fullmatch(oid, len(prefix))
        stripe, index = (int(m[1]), int(m[2])) if m else (0, -1)
    else:
        stripe, index = 0, int(oid[len(prefix):]) if _OMAP_OID_RE.fullmatch(oid, len(prefix)) else -1
    if not 0 <= index < view.width or data_oid(log, view, index, stripe) != oid:  # (no leading zeros)
        return None
    return Place(oid, view, stripe, index)


def view_objects(log: str, view: View) -> list[str]:
    """The names of a view's objects (a data-format view's open stripes')."""
    return [p.oid for p in view_places(log, view)]


def first_in_stride(position: int, index: int, stride: int) -> int:
    """The first position p >= `position` with p % stride == index: where an
    object of a view of width `stride` (or a reader's partition) goes on."""
    return position + (index - position) % stride


def stride_positions(index: int, stride: int, start: int, end: int) -> range:
    """The positions p in [start, end) with p % stride == index."""
    return range(first_in_stride(start, index, stride), end, stride)


def per_object_counts(view: View, start: int, end: int) -> list[int]:
    """How many of the positions [start, end) of `view` each of its objects
    (by index in a stripe, summed over stripes) holds."""
    if view.unit == 1:
        return [len(stride_positions(i, view.width, start, end)) for i in range(view.width)]
    counts = [0] * view.width
    if start >= end:
        return counts
    for stripe in range(stripe_of(view, start), stripe_of(view, end - 1) + 1):
        top = min(end, stripe_start(view, stripe + 1)) - 1
        for i in range(view.width):
            base = base_of(view, stripe, i)
            first = next_held(base, view.width, view.unit, max(start, base))
            if first <= top:
                counts[i] += held_count(base, view.width, view.unit, first, top)
    return counts


def view_of(views: tuple[View, ...], position: int) -> View:
    """The view covering `position`: the last one whose start is <= position."""
    if position >= views[-1].start:
        return views[-1]  # appends and tail reads: the common case, kept cheap
    starts = [v.start for v in views]
    i = bisect.bisect_right(starts, position) - 1
    return views[max(i, 0)]


def place_of(log: str, views: tuple[View, ...], position: int) -> Place:
    return place(log, view_of(views, position), position)


def by_object(log: str, views: tuple[View, ...], positions: Sequence[int]) -> list[tuple[Place, list[int]]]:
    """Sorted `positions` as (place, its positions in order) per data object:
    one Place per object, not per position (what a batch costs in Python).
    InvalidRequest if they are not sorted (the grouping relies on it)."""
    if not positions:
        return []
    consecutive = type(positions) is range and positions.step == 1
    newest = views[-1]
    if not consecutive:
        positions = list(positions)
    first, last = positions[0], positions[-1]
    if first >= newest.start:  # (sorted: every one in the newest view)
        if consecutive and stripe_of(newest, first) == stripe_of(newest, last):
            # a run in one stripe (appends): every width-th one, or whole runs
            width, unit = newest.width, newest.unit
            if unit == 1:
                return [(place(log, newest, first + k), list(positions[k::width]))
                        for k in range(min(width, len(positions)))]
            ss = stripe_start(newest, stripe_of(newest, first))
            runs: dict[int, list[int]] = {}
            p = first
            while p <= last:
                run_end = min(last + 1, p + unit - (p - ss) % unit)
                runs.setdefault((p - ss) // unit % width, []).extend(range(p, run_end))
                p = run_end
            return [(place(log, newest, ps[0]), ps) for ps in runs.values()]
        try:  # in C (a walk's rounds: thousands of scattered positions)
            groups = _group(positions if isinstance(positions, list) else list(positions), newest.start,
                            stripe_span(newest), newest.width, newest.unit)
        except (ValueError, OverflowError, TypeError) as e:  # unsorted, or not positions
            raise InvalidRequest(str(e)) from None
        return [(place(log, newest, ps[0]), ps) for ps in groups]
    if not consecutive and positions != sorted(positions):
        raise InvalidRequest("positions to group by object must be sorted")
    by_key: dict[tuple[int, int, int], list[int]] = {}
    for p in positions:
        v = view_of(views, p)
        key = (id(v), stripe_of(v, p), index_of(v, p))
        got = by_key.get(key)
        if got is None:
            by_key[key] = [p]
        else:
            got.append(p)
    return [(place_of(log, views, ps[0]), ps) for ps in by_key.values()]


def oid_of(log: str, views: tuple[View, ...], position: int) -> str:
    return place_of(log, views, position).oid


def view_end(views: tuple[View, ...], view: View) -> int | None:
    """The first position past `view` (None for the newest view)."""
    later = [v.start for v in views if v.start > view.start or (v.start == view.start and v.epoch > view.epoch)]
    return min(later) if later else None
