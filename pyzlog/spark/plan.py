"""Partition planning: one partition per (view segment, stripe object).

A partition reads only the positions p of [start, end) with p % width ==
index, all in one view, so a task makes one read_range call per 512 of its
object's entries. A view whose stripes are dealt in runs of more than one
position (wire.View.unit) keeps consecutive positions together instead: its
segment is cut into `width` ranges of consecutive positions (stride 1), each
read from every object. minPartitions splits a partition into sub-ranges.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pyspark.sql.datasource import InputPartition

from ..core.layout import first_in_stride, stride_positions, view_end
from ..core.wire import View
from .options import EARLIEST, LATEST, Position

if TYPE_CHECKING:
    from ..client.log import Log


class ZlogPartition(InputPartition):
    """Positions p in [start, end) with p % width == index: object `index` of
    the view of `epoch` as the plan saw it. The set is frozen at plan time; a
    reconfiguration before or during the read changes where they are read
    from, not which positions the partition delivers. Every position below
    known_tail had been handed out when the read was planned."""

    def __init__(self, epoch: int, width: int, index: int, start: int, end: int, known_tail: int) -> None:
        super().__init__(None)
        self.epoch = epoch
        self.width = width
        self.index = index
        self.start = start
        self.end = end
        self.known_tail = known_tail

    def count(self) -> int:
        return len(self.positions())

    def positions(self) -> range:
        """The positions this partition delivers, in order."""
        return stride_positions(self.index, self.width, self.start, self.end)

    def __repr__(self) -> str:
        return (f"ZlogPartition(epoch={self.epoch}, object={self.index}/{self.width}, "
                f"[{self.start}, {self.end}))")


def resolve_range(log: "Log", starting: Position, ending: Position) -> tuple[int, int, int]:
    """(start, end, tail) for a read planned now: 'latest' is the tail now; an
    end past the tail is cut to the tail (those positions were not handed out)."""
    tail = log.tail()
    end = tail if ending == LATEST else min(int(ending), tail)
    if starting == EARLIEST:
        start = log.first_position()
    elif starting == LATEST:
        start = tail
    else:
        start = int(starting)
    return min(start, end), end, tail


def _split(epoch: int, width: int, index: int, start: int, end: int, tail: int,
           pieces: int) -> list[ZlogPartition]:
    whole = ZlogPartition(epoch, width, index, start, end, tail)
    n = whole.count()
    pieces = max(1, min(pieces, n))
    if pieces == 1:
        return [whole]
    first = first_in_stride(start, index, width)
    out = []
    for j in range(pieces):
        a, b = j * n // pieces, (j + 1) * n // pieces  # this piece's entries of the object
        out.append(ZlogPartition(epoch, width, index, first + a * width,
                                 first + (b - 1) * width + 1, tail))
    return out


def plan_partitions(views: tuple[View, ...], start: int, end: int, known_tail: int,
                    min_partitions: int = 0) -> list[ZlogPartition]:
    """Partitions covering exactly [start, end), in position order of their first entry per segment."""
    segments: list[tuple[View, int, int]] = []
    for v in views:
        ve = view_end(views, v)
        s, e = max(start, v.start), end if ve is None else min(end, ve)
        if s < e:
            segments.append((v, s, e))
    base: list[tuple[int, int, int, int, int]] = []  # (epoch, stride, index, start, end)
    for v, s, e in segments:
        if v.unit == 1:
            base += [(v.epoch, v.width, i, s, e) for i in range(v.width) if first_in_stride(s, i, v.width) < e]
        else:
            cuts = sorted({s + (e - s) * k // v.width for k in range(v.width)} | {e})
            base += [(v.epoch, 1, 0, a, b) for a, b in zip(cuts, cuts[1:])]
    pieces = math.ceil(min_partitions / len(base)) if base and min_partitions > len(base) else 1
    tail = min(known_tail, end)
    return [p for epoch, stride, i, s, e in base for p in _split(epoch, stride, i, s, e, tail, pieces)]
