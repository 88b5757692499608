"""Where a log keeps things: object names and the position -> object mapping."""
from __future__ import annotations

import bisect
import re

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
    """Data objects are per view, so a new width never reuses an old object."""
    return f"zlog.{log}.{view.epoch}."


def data_oid(log: str, view: View, index: int) -> str:
    return f"{data_oid_prefix(log, view)}{index}"


def view_objects(log: str, view: View) -> list[str]:
    return [data_oid(log, view, i) for i in range(view.width)]


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


def oid_of(log: str, views: tuple[View, ...], position: int) -> str:
    view = view_of(views, position)
    return data_oid(log, view, position % view.width)


def view_end(views: tuple[View, ...], view: View) -> int | None:
    """The first position past `view` (None for the newest view)."""
    later = [v.start for v in views if v.start > view.start or (v.start == view.start and v.epoch > view.epoch)]
    return min(later) if later else None
