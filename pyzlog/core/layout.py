"""Where a log keeps things: object names and the position -> object mapping."""
from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass

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
# [start + s * width * slots, start + (s + 1) * width * slots), position p in
# its object p % width, `slots` positions per object. An omap view is one
# stripe without end.
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
        return first_in_stride(stripe_start(self.view, self.stripe), self.index, self.view.width)

    def init_fields(self, epoch: int) -> dict[str, int]:
        """An init request's fields for this object, made sealed at `epoch`."""
        v = self.view
        return {"epoch": epoch, "position": self.base, "width": v.width, "slots": v.slots,
                "byte_bound": v.byte_bound}


def place(log: str, view: View, position: int) -> Place:
    stripe, index = stripe_of(view, position), position % view.width
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
    if not consecutive:
        positions = list(positions)
        if positions != sorted(positions):  # in C: read_positions' sets are large
            raise InvalidRequest("positions to group by object must be sorted")
    newest = views[-1]
    first, last = positions[0], positions[-1]
    if first >= newest.start and stripe_of(newest, first) == stripe_of(newest, last):
        # one stripe of the newest view (appends, a walk's usual round): by index alone
        width = newest.width
        if consecutive:  # every width-th one
            return [(place(log, newest, first + k), list(positions[k::width]))
                    for k in range(min(width, len(positions)))]
        buckets: list[list[int]] = [[] for _ in range(width)]
        for p in positions:
            buckets[p % width].append(p)
        return [(place(log, newest, ps[0]), ps) for ps in buckets if ps]
    by_key: dict[tuple[int, int, int], list[int]] = {}
    for p in positions:
        v = view_of(views, p)
        key = (id(v), stripe_of(v, p), p % v.width)
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
