"""Finding the entries of some streams without reading the whole log.

The sequencer records, per stream, the positions it hands out for it, and
answers each stream's last K of them (backpointers) with every new position
and on request (STREAM_TAIL); every entry of a stream stores the
backpointers it was given (entry.py). walk() starts from the sequencer's
answer, reads the positions it names (one read op per data object), and
follows the backpointers in the entries it reads, backwards, until it has
every position of the streams down to `lo`, then hands the entries back in
position order. Skip pointers (to the entries whose ordinal in the stream
is a multiple of 16, 32, 64, ...) make that a few rounds of reads (about
log2 of the stream's length), each one read op per data object.

What may not be believed is checked, never trusted:
- an entry a backpointer leads to must name the stream in its own
  backpointer section, or it is not the stream's (a position whose first
  writer failed and that was handed out again after a sequencer recovery,
  a filled hole);
- the sequencer knows a stream only from its horizon on (the position it
  started serving the log at: after a restart or a failover it knows
  nothing below it), and an entry's section says so too. An entry's K
  recent backpointers vouch for every position of its stream down to the
  oldest of them (or to the horizon, with fewer than K); skip pointers only
  name entries further back, to read them sooner. Where no entry read
  vouches for a range -- below a horizon, or behind K entries in a row that
  cannot be read -- the walk scans the log (every entry of the range is
  handed back, as a full replay would see it).
"""
from __future__ import annotations

import errno
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyzlog import HoleClock

from ._replay import check_stream
from .entry import FLAG_BACKPOINTERS, PLAIN_VERSION, VERSION, check, is_layer_entry, parse_backpointers

if TYPE_CHECKING:
    from pyzlog import Log

#: holes of a walk read one by one, at most; more are read as the one range they span
FEW_HOLES = 16


class BehindTrim(Exception):
    """A position to play is trimmed: the reader is behind a trim, and its
    state can only come from a checkpoint (the Runtime reloads one, or
    fails with CheckpointError without a store). Never skipped: a stream
    entry trimmed away is a command the reader would never apply."""

    def __init__(self, position: int) -> None:
        super().__init__(position)
        self.position = position


@dataclass
class WalkStats:
    rounds: int = 0            # rounds of reads following backpointers
    read: int = 0              # positions read by following backpointers
    parsed: int = 0            # of them, parsed whole (the others only checked to be the stream's)
    scanned: int = 0           # positions read by scanning (where backpointers could not tell)
    scans: int = 0             # ranges scanned
    not_ours: int = 0          # backpointers that led to another stream's entry, a gap or nothing
    ranges: list[tuple[int, int]] = field(default_factory=list)  # the ranges scanned


def walk(log: Log, streams: list[int], lo: int, hi: int, known: dict[int, bytes] | None = None,
         hole_wait: float = 2.0, stats: WalkStats | None = None, hole_clock: HoleClock | None = None,
         past_tail: bool = False) -> tuple[list[int], list[bytes | None], list[str] | None, int]:
    """Entries of `streams` at positions in [lo, hi) as (positions, datas,
    kinds, end), in position order. Entries from scanned ranges include
    every entry there (and gaps as data None with their kind); `end` is how
    far the result is complete (hi, or the sequencer's tail if lower).
    `known`: bytes of positions already at hand (own appends).
    `hole_clock`: the reader's gap clock, kept across its walks (a hole it
    has known to lie below the tail for hole_wait is filled at once, not
    waited for again by each walk that meets it); by default this walk's.
    `past_tail`: hi may lie past the positions handed out (a waiter's
    position). The walk then stops at the sequencer's tail, or with no
    sequencer answering where a scan with no known tail stops, and never
    waits on (or fills) a position nobody holds yet: the answer's tail
    counts as handed out only once the epoch check below has passed (a
    sequencer paused, or one whose log was sealed without it, answers at
    its old epoch with a counter the log has moved back from). Without it,
    the caller vouches that every position below hi was handed out.

    Only the entries that lead further are parsed whole (for one stream;
    for several, every entry): those a skip pointer named, the oldest of the
    sequencer's recent positions, and the oldest of each parsed entry's
    recent backpointers (the next one down the chain), also when that entry
    was read already. The others are only checked to be the stream's. Should
    that leave a range above the lowest horizon seen that no entry vouches
    for, every entry found is parsed before anything is scanned (below that
    horizon no entry can vouch for anything: it is scanned at once)."""
    st = stats if stats is not None else WalkStats()
    clock = hole_clock if hole_clock is not None else HoleClock(hole_wait)
    # each stream's history (as much as the sequencer keeps and one request may carry: a stream
    # with no more since its horizon is found in one round), no more than the range can hold (a
    # reader near the tail asks for a few); a history that falls short of lo is followed down
    answer = log.stream_tail(streams, history=max(1, hi - lo))
    if answer is None:  # no sequencer: scan it all (up to the position after the highest stored)
        return _scan(log, lo, hi, clock, st, {}, hi)
    # `epoch`: the sequencer's, which it answered at; one that starts serving the log later takes a newer one
    tail, k, per_stream, epoch = answer
    hi = min(hi, tail)
    # below which an unwritten position is a hole, before the epoch is checked: with
    # past_tail, only what is stored says so (an unwritten position above it ends a read)
    unchecked_tail = None if past_tail else tail
    if hi <= lo:
        return [], [], None, max(lo, hi)
    w = _Walk(streams, lo, hi, st)
    w.begin(per_stream, k, tail)
    w.read(log, known or {})
    # wait for their writers (or fill them) like any reader; then judge what they hold. Many (a
    # batch of appends still in flight, listed by a history): one read of the range they span
    holes = set(w.holes)
    spans = [(p, p + 1) for p in w.holes] if len(holes) <= FEW_HOLES else [(min(holes), max(holes) + 1)]
    for a, b in spans:
        for batch in log.stream_batches(a, b, hole_wait=clock.hole_wait, known_tail=unchecked_tail,
                                        hole_clock=clock):
            kinds = kinds_of(batch)
            for i, (p, data) in enumerate(zip(batch.column(0).to_pylist(), batch.column(1).to_pylist())):
                if p not in holes:
                    continue
                if data is not None:
                    if _backpointers(data, p, w.wanted)[1]:
                        w.found[p] = data
                elif kinds is not None and kinds[i] == "trimmed":
                    raise BehindTrim(p)  # written and trimmed since the first read
    found, gaps = w.found, w.gaps
    # The answer vouches for [lo, hi) as of when it was given. A position
    # handed out then but not stored yet (a writer in flight, or dead) could
    # be handed out again, to these streams, by a sequencer that starts
    # serving the log later (it recovers its counter from what is stored):
    # so only positions up to what is stored now are taken on the answer's
    # word; those above are scanned with the hole rules (stored, or filled
    # and so never handed out again). Had a new sequencer started since the
    # answer (the epoch moved), nothing is taken on its word. An entry the
    # first round found stored at hi - 1 says enough: a sequencer that takes
    # an epoch after the read below counts from past it, and one that took
    # it before is seen by that read.
    if w.stored_at_end:
        stored_to = hi
    else:
        top = log.max_position()
        stored_to = lo if top is None else max(lo, top + 1)
    if log.state.refresh_epoch() != epoch:
        return _scan(log, lo, hi, clock, st, found, hi, known_tail=unchecked_tail)
    if stored_to < hi:
        gaps.append((stored_to, hi))
    if gaps:  # where some stream is not known: scan from the lowest such position to the highest
        return _scan(log, min(a for a, _ in gaps), max(b for _, b in gaps), clock, st, found, hi, known_tail=tail)
    ps = sorted(found)
    return ps, [found[p] for p in ps], None, hi


class _Walk:
    """What one walk knows: per stream, the intervals in which every
    position of it is known (`covered`) and the lowest horizon seen
    (`floors`: nothing below it is vouched for by any entry, so parsing more
    cannot cover it); the entries found; and what to read next."""

    def __init__(self, streams: list[int], lo: int, hi: int, st: WalkStats) -> None:
        self.streams, self.lo, self.hi, self.st = streams, lo, hi, st
        self.wanted = set(streams)
        self.covered: dict[int, list[tuple[int, int]]] = {s: [] for s in streams}
        self.floors: dict[int, int] = {}
        self.todo: set[int] = set()   # positions to read in the next round
        self.lead: set[int] = set()   # positions to parse whole when read (links of chains)
        # a link of a chain -> the newer recent positions of the same list, the
        # next link should it be a hole or not the stream's
        self.spare: dict[int, list[int]] = {}
        self.found: dict[int, bytes] = {}
        self.light: dict[int, bytes] = {}  # read and checked to be the stream's, not parsed
        self.holes: list[int] = []   # handed out, not written when read
        self.gaps: list[tuple[int, int]] = []  # what no entry vouches for, once read() is over
        # per stream, the answer lists every position of it from here up (all read in the first
        # round): a chain or skip pointer that leads to one of them adds nothing
        self.listed_from: dict[int, int] = {}
        # hi - 1 (read in the first round, whoever's it is) was found written or filled
        self.stored_at_end = False
        # the sequencer's history when it is the whole first round (one stream, all in range,
        # no skip pointer past it): newest first, so sorted in one pass (a set of it is not)
        self.history: list[int] | None = None

    def begin(self, per_stream: list[tuple[int, int, list[int], int, list[tuple[int, int]]]], k: int,
              tail: int) -> None:
        """Start from the sequencer's answer: it vouches for each stream down
        to its oldest recent position (to the horizon, with fewer than K)."""
        lo = self.lo
        for s, horizon, back, _ordinal, levels in per_stream:
            self.floors[s] = horizon
            self.covered[s].append((back[-1] if k and len(back) >= k else horizon, tail))
            self.listed_from[s] = back[-1] if back else tail
            # newest first: all in range when the oldest is (a history that reaches lo)
            self.todo.update(back if not back or back[-1] >= lo else (b for b in back if b >= lo))
            self.link(back)  # the chain goes on from the oldest
            below = [p for _l, p in levels if lo <= p < self.listed_from[s]]  # skip pointers past the list
            self.lead.update(below)
            self.todo.update(below)
            if len(per_stream) == 1 and not below and (not back or back[-1] >= lo):
                self.history = back  # todo is set(back)

    def read(self, log: Log, known: dict[int, bytes]) -> None:
        """Rounds of reads until no entry read leads anywhere new; then, if
        some range above a floor is still not vouched for, parse what was
        only checked and go on (once)."""
        st, lead, light, found, hi = self.st, self.lead, self.light, self.found, self.hi
        streams = self.streams
        # one stream: an entry of it that need not be parsed is told by one
        # compare of its section's head (one stream, this one) at offset 38
        single = b"\x01" + streams[0].to_bytes(8, "little") if len(streams) == 1 else b""
        seen: set[int] = set()
        thorough = False
        end = hi - 1  # read beside the first round: is it stored (the walk's end vouched for)?
        probe = end not in known and end not in self.todo  # else it is read (or known) anyway
        first = True
        while True:
            while self.todo:
                if seen:
                    batch = sorted(self.todo - seen)
                    seen.update(batch)
                else:  # the first round reads all of todo, which is then what was seen
                    history = self.history
                    # (the history's positions are todo's when there are as many: none repeated)
                    batch = sorted(history if history is not None and len(history) == len(self.todo)
                                   else self.todo)
                    seen = self.todo
                self.todo = set()
                if not batch:
                    break
                st.rounds += 1
                fetch = [p for p in batch if p not in known] if known else batch
                probing = first and probe
                got: dict[int, bytes | int] = log.read_positions(fetch + [end] if probing else fetch) \
                    if fetch or probing else {}
                if known:
                    got.update((p, known[p]) for p in batch if p in known)
                st.read += len(fetch)
                if first:
                    first = False
                    v = known[end] if end in known else got.get(end)
                    self.stored_at_end = type(v) is bytes or v == -errno.ENOMSG
                    if v == -errno.EIDRM:
                        raise BehindTrim(end)  # and so is every position below it
                quick = bool(single) and not thorough
                rest = batch
                if quick:
                    # the usual entry: the stream's, not a link of a chain, only checked (into
                    # light, and found below hi), in C: in Python this was a third of the walk
                    rest = check_stream(batch, got, single, lead, hi, light, found)
                for p in rest:
                    data = got.get(p)
                    if type(data) is not bytes:
                        if data == -errno.EIDRM:
                            raise BehindTrim(p)  # a position of the range trimmed: never passed over
                        if (data is None or data in (-errno.ENODATA, -errno.ENOENT)) and p < hi:
                            self.holes.append(p)  # read below with the hole rules
                        else:
                            st.not_ours += 1
                        self.relink(p)
                        continue
                    st.parsed += 1
                    # parsed only for want of the quick check (an entry of several streams):
                    # not a link of a chain, so it starts none
                    chain = not quick or p in lead
                    if not self.follow(data, p, chain):
                        st.not_ours += 1
                        self.relink(p)
                    elif not chain:
                        light[p] = data  # followed again should a parse name it as a link
                # an entry read light that a parse since named as the next one down
                # its chain is parsed now: it was read already, so no round would
                promote = [p for p in lead if p in light]  # lead is the smaller: a link or so per 16 read
                while promote:
                    st.parsed += len(promote)
                    for p in promote:
                        self.follow(light.pop(p), p, True)
                    promote = [p for p in lead if p in light]
            gaps_of = {s: _gaps(self.covered[s], self.lo, hi) for s in streams}
            self.gaps = [g for s in streams for g in gaps_of[s]]
            if thorough or not light or not any(b > self.floors.get(s, self.lo) for s in streams
                                                for _a, b in gaps_of[s]):
                return
            thorough = True  # parse what was only checked, then look again
            st.parsed += len(light)
            for p, data in light.items():
                self.follow(data, p, True)
            light.clear()

    def follow(self, data: bytes, p: int, chain: bool) -> bool:
        """Parse the entry at p whole: record it if it is of a wanted stream,
        the range its recent backpointers vouch for, and where to read next
        (into `todo`; the next round drops what was read already). `chain`:
        the entries it leads to are parsed whole in turn (lead)."""
        kk, mine = _backpointers(data, p, self.wanted)
        if not mine:
            return False
        lo, todo, floors = self.lo, self.todo, self.floors
        if p < self.hi:
            self.found[p] = data
        for s, (horizon, back, far) in mine.items():
            if horizon < floors.get(s, horizon + 1):
                floors[s] = horizon
            self.covered[s].append((back[-1] if kk and len(back) >= kk else horizon, p + 1))
            listed = self.listed_from.get(s, self.hi)
            if back:
                if back[-1] >= lo:  # newest first: all of them are in range
                    if chain and back[-1] < listed:
                        self.link(back)  # the next one down the chain
                    todo.update(back)
                else:
                    todo.update(b for b in back if b >= lo)
            if far:
                if far[-1] < lo:
                    far = [b for b in far if b >= lo]
                todo.update(far)
                if chain:
                    self.lead.update(b for b in far if b < listed)
        return True

    def link(self, back: list[int]) -> None:
        """The oldest of `back` (recent positions, newest first) is the next
        link of a chain; the others stand in for it, oldest first, should it fail."""
        if back and back[-1] >= self.lo:
            self.lead.add(back[-1])
            if len(back) > 1:
                self.spare[back[-1]] = back[:-1]

    def relink(self, p: int) -> None:
        """The link at p is a hole or not the stream's: the next oldest of its
        list leads on instead (read already, or due this round or the next)."""
        rest = self.spare.pop(p, None)
        if rest:
            self.lead.add(rest[-1])
            if len(rest) > 1:
                self.spare[rest[-1]] = rest[:-1]


def _gaps(intervals: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The parts of [lo, hi) no interval covers."""
    out: list[tuple[int, int]] = []
    at = lo
    for a, b in sorted(intervals):
        if a > at:
            out.append((at, min(a, hi)))
        at = max(at, b)
        if at >= hi:
            break
    if at < hi:
        out.append((at, hi))
    return [(a, b) for a, b in out if a < b]


def _backpointers(data: bytes, position: int, wanted: set[int]) -> tuple[int, dict[int, tuple[int, list[int], list[int]]]]:
    """K and the backpointer sections of `data` for the streams in `wanted`
    ({} if the entry is not of this layer, has no section, or names none of them;
    UnsupportedEntry for one of a version this build does not read)."""
    if not is_layer_entry(data):
        return 0, {}  # not this layer's (entry.py): bytes that start "ZO" too
    if data[2] != VERSION:
        if data[2] != PLAIN_VERSION:
            check(data[2], data[3])  # a newer layer's: its backpointers cannot be read here
        return 0, {}
    if not data[4] & FLAG_BACKPOINTERS:
        return 0, {}
    k, sections, _off = parse_backpointers(data, position)
    return k, {s: v for s, v in sections.items() if s in wanted}


def _scan(log: Log, lo: int, upto: int, clock: HoleClock, st: WalkStats, found: dict[int, bytes],
          hi: int, known_tail: int | None = None) -> tuple[list[int], list[bytes | None], list[str] | None, int]:
    """Every entry of [lo, upto) read in order, merged with `found` outside it.
    `known_tail`: every position below it was handed out (the sequencer's
    answer said so), so an unwritten one there is a hole to wait for or fill."""
    st.scans += 1
    st.ranges.append((lo, upto))
    positions: list[int] = [p for p in sorted(found) if p < lo]
    datas: list[bytes | None] = [found[p] for p in positions]
    kinds: list[str] = ["data"] * len(positions)
    n = len(positions)
    for batch in log.stream_batches(lo, upto, hole_wait=clock.hole_wait, known_tail=known_tail, hole_clock=clock):
        ps = batch.column(0).to_pylist()
        positions.extend(ps)
        datas.extend(batch.column(1).to_pylist())
        kinds.extend(kinds_of(batch) or ["data"] * len(ps))
    st.scanned += len(positions) - n
    end = positions[-1] + 1 if len(positions) > n else lo
    if end < upto:  # the scan stopped at the tail
        return positions, datas, kinds, end
    for p in sorted(found):
        if p >= upto:
            positions.append(p)
            datas.append(found[p])
            kinds.append("data")
    return positions, datas, kinds, hi


def kinds_of(batch: Any) -> list[str] | None:
    """Each row's kind ("data", "filled", "trimmed", ...) of a stream_batches
    batch; None if every row is data."""
    if not batch.column(1).null_count:
        return None
    col = batch.column(2)
    names = col.dictionary.to_pylist()
    return [names[i] for i in col.indices.to_pylist()]
