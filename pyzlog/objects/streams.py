"""Finding the entries of some streams without reading the whole log.

The sequencer records, per stream, the positions it hands out for it, and
answers each stream's last K of them (backpointers) with every new position
and on request (STREAM_TAIL); every entry of a stream stores the
backpointers it was given (entry.py). walk() starts from the sequencer's
answer, reads the positions it names (one read op per data object), and
follows the backpointers in the entries it reads, backwards, until it has
every position of the streams down to `lo`, then hands the entries back in
position order.

What may not be believed is checked, never trusted:
- an entry a backpointer leads to must name the stream in its own
  backpointer section, or it is not the stream's (a position whose first
  writer failed and that was handed out again after a sequencer recovery,
  a filled hole);
- the sequencer knows a stream only from its horizon on (the position it
  started serving the log at: after a restart or a failover it knows
  nothing below it), and an entry's section says so too. Below the lowest
  point the chain covers -- a horizon, or K entries in a row that cannot be
  read -- the walk scans the log (every entry of the range is handed back,
  as a full replay would see it).
"""
from __future__ import annotations

import errno
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .entry import FLAG_BACKPOINTERS, HEADER_SIZE, MAGIC, parse_backpointers

if TYPE_CHECKING:
    from ..client.log import Log


@dataclass
class WalkStats:
    rounds: int = 0            # rounds of reads following backpointers
    read: int = 0              # positions read by following backpointers
    scanned: int = 0           # positions read by scanning (where backpointers could not tell)
    scans: int = 0             # ranges scanned
    not_ours: int = 0          # backpointers that led to another stream's entry, a gap or nothing
    ranges: list[tuple[int, int]] = field(default_factory=list)  # the ranges scanned


def walk(log: Log, streams: list[int], lo: int, hi: int, known: dict[int, bytes] | None = None,
         hole_wait: float = 2.0, stats: WalkStats | None = None) -> tuple[list[int], list[bytes | None], list[str] | None, int]:
    """Entries of `streams` at positions in [lo, hi) as (positions, datas,
    kinds, end), in position order. Entries from scanned ranges include
    every entry there (and gaps as data None with their kind); `end` is how
    far the result is complete (hi, or the sequencer's tail if lower).
    `known`: bytes of positions already at hand (own appends)."""
    st = stats if stats is not None else WalkStats()
    answer = log.stream_tail(streams)
    if answer is None:  # no sequencer: scan it all
        return _scan(log, lo, hi, hole_wait, st, {}, hi)
    tail, k, per_stream = answer
    hi = min(hi, tail)
    if hi <= lo:
        return [], [], None, max(lo, hi)
    cover: dict[int, int] = {}
    todo: set[int] = set()
    for s, horizon, back in per_stream:
        cover[s] = back[-1] if k and len(back) >= k else horizon
        todo.update(b for b in back if b >= lo)
    found: dict[int, bytes] = {}
    seen: set[int] = set()
    known = known or {}
    wanted = set(streams)
    holes: list[int] = []
    while todo:
        st.rounds += 1
        batch = sorted(todo)
        todo = set()
        seen.update(batch)
        fetch = [p for p in batch if p not in known]
        got: dict[int, bytes | int] = log.read_positions(fetch) if fetch else {}
        st.read += len(fetch)
        for p in batch:
            data = known.get(p)
            if data is None:
                data = got.get(p, -errno.ENODATA)
            if isinstance(data, int):
                if data in (-errno.ENODATA, -errno.ENOENT) and p < hi:
                    holes.append(p)  # handed out, not written yet: read below with the hole rules
                else:
                    st.not_ours += 1
                continue
            mine = _backpointers(data, p, wanted)
            if not mine:
                st.not_ours += 1
                continue
            if p < hi:
                found[p] = data
            for s, (horizon, back) in mine.items():
                low = back[-1] if len(back) >= k and k else horizon
                if low < cover[s]:
                    cover[s] = low
                for b in back:
                    if b >= lo and b not in seen:
                        todo.add(b)
    for p in holes:  # wait for its writer (or fill it) like any reader; then judge what it holds
        for batch in log.read_batches(p, p + 1, hole_wait=hole_wait):
            datas = batch.column(1).to_pylist()
            if datas and datas[0] is not None and _backpointers(datas[0], p, wanted):
                found[p] = datas[0]
    low = max((c for c in cover.values()), default=lo)
    if low > lo:  # below `low` some stream is not known: scan [lo, low)
        return _scan(log, lo, min(low, hi), hole_wait, st, found, hi)
    ps = sorted(found)
    return ps, [found[p] for p in ps], None, hi


def _backpointers(data: bytes, position: int, wanted: set[int]) -> dict[int, tuple[int, list[int]]]:
    """The backpointer sections of `data` for the streams in `wanted` ({} if
    the entry is not of this layer, has no section, or names none of them)."""
    if len(data) < HEADER_SIZE or data[:2] != MAGIC or not data[4] & FLAG_BACKPOINTERS:
        return {}
    _k, sections, _off = parse_backpointers(data, position)
    return {s: v for s, v in sections.items() if s in wanted}


def _scan(log: Log, lo: int, upto: int, hole_wait: float, st: WalkStats, found: dict[int, bytes],
          hi: int) -> tuple[list[int], list[bytes | None], list[str] | None, int]:
    """Every entry of [lo, upto) read in order, merged with `found` above it."""
    st.scans += 1
    st.ranges.append((lo, upto))
    positions: list[int] = []
    datas: list[bytes | None] = []
    kinds: list[str] = []
    for batch in log.read_batches(lo, upto, hole_wait=hole_wait):
        ps = batch.column(0).to_pylist()
        positions.extend(ps)
        datas.extend(batch.column(1).to_pylist())
        if batch.column(1).null_count:
            col = batch.column(2)
            names = col.dictionary.to_pylist()
            kinds.extend(names[i] for i in col.indices.to_pylist())
        else:
            kinds.extend(["data"] * len(ps))
    st.scanned += len(positions)
    end = positions[-1] + 1 if positions else lo
    if end < upto:  # the scan stopped at the tail
        return positions, datas, kinds, end
    for p in sorted(found):
        if p >= upto:
            positions.append(p)
            datas.append(found[p])
            kinds.append("data")
    return positions, datas, kinds, hi
