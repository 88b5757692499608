"""An in-memory log and sequencer with streams, for testing streams.walk()
with no cluster: the sequencer part follows seqr_server.cc's stream answer
(the last K positions of each stream, skip pointers to the newest entry
whose ordinal is a multiple of 2^level, a horizon below which it knows
nothing), and entries are the real bytes entry.with_backpointers makes.
Writers may die (a hole), be in flight, write with no sequencer (K = 0);
a sequencer may restart (a new epoch and horizon) or forget its streams."""
from __future__ import annotations

import errno
from collections import deque
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from pyzlog.client.streams import entry_backpointers
from pyzlog.core.sequencer import prefer_history
from pyzlog.objects import entry
from pyzlog.objects.entry import MAGIC

K = 16
FIRST_LEVEL = 4
LEVELS = 28
FILLED = "filled"


class _Ring:
    def __init__(self) -> None:
        self.pos: deque[int] = deque(maxlen=K)
        self.ordinal = 0
        self.level: list[int | None] = [None] * LEVELS
        self.hist: list[int] = []  # oldest first


class Sequencer:
    """`history`, `budget`: STREAM_HISTORY's per-stream cap and the positions
    kept in all (seqr_server.cc's remember(): a history grows while the
    budget allows, else its oldest give way; a stream with none gets none)."""

    def __init__(self, counter: int, history: int = 0, budget: int = 0) -> None:
        self.counter = counter
        self.horizon = counter
        self.streams: dict[int, _Ring] = {}
        self.history, self.budget = history, budget

    def kept(self) -> int:
        return sum(len(r.hist) for r in self.streams.values())

    def remember(self, ring: _Ring, pos: int, count: int) -> None:
        for p in range(max(pos, pos + count - self.history), pos + count):
            if len(ring.hist) < self.history and self.kept() < self.budget:
                ring.hist.append(p)
            elif ring.hist:
                ring.hist.pop(0)
                ring.hist.append(p)

    def history_of(self, ids: list[int], want: int) -> list[list[int]]:
        """STREAM_HISTORY's lists: each stream's last `want` positions kept, newest first."""
        return [list(reversed(self.streams[s].hist))[:want] if s in self.streams else [] for s in ids]

    def answer(self, ids: list[int], count: int) -> tuple[int, list[Any]]:
        """(first position, per stream (id, horizon, recent, ordinal, levels)); count 0 only asks."""
        pos = self.counter
        out = []
        for sid in ids:
            ring = self.streams.setdefault(sid, _Ring()) if count else self.streams.get(sid)
            ordinal = ring.ordinal if ring else 0
            m = 0
            if ordinal:
                while m < LEVELS and (1 << (m + FIRST_LEVEL)) <= ordinal - 1:
                    m += 1
                if m < LEVELS:
                    m += 1
            back = list(reversed(ring.pos)) if ring else []
            levels = [(lv + FIRST_LEVEL, ring.level[lv]) for lv in range(m)] if ring else []
            out.append((sid, self.horizon, back, ordinal, levels))
            if not count or ring is None:
                continue
            for lv in range(LEVELS):
                mult = ((ordinal + count - 1) >> (lv + FIRST_LEVEL)) << (lv + FIRST_LEVEL)
                if mult >= ordinal:
                    ring.level[lv] = pos + (mult - ordinal)
            ring.ordinal += count
            for p in range(max(pos, pos + count - K), pos + count):
                ring.pos.append(p)
            self.remember(ring, pos, count)
        self.counter += count
        return pos, out


class _State:
    def __init__(self, log: ModelLog) -> None:
        self.log = log

    def refresh_epoch(self) -> int:
        return self.log.epoch


class ModelLog:
    """What walk() uses of a Log, over a dict of positions."""

    def __init__(self, history: int = 0, budget: int = 0) -> None:
        self.data: dict[int, bytes | str] = {}
        self.history, self.budget = history, budget
        self.seq = Sequencer(0, history, budget)
        self.epoch = 1
        self.state = _State(self)
        self.client_seq = 0
        self.reads: list[list[int]] = []
        self.scans: list[tuple[int, int]] = []  # stream_batches' ranges
        self.max_position_calls = 0
        self.seqr_down = False  # stream_tail answers None (no sequencer answers)

    # ---------------------------------------------------------- writers
    def _plain(self, streams: list[int]) -> bytes:
        self.client_seq += 1
        if len(streams) == 1:
            return entry.header(entry.CMD, 7, self.client_seq, 0, streams[0]) + b"body"
        return entry.header(entry.TXN, 7, self.client_seq, 0, 0) + entry.pack_u64s(streams) + b"txn"

    def append(self, streams: list[int], fates: str) -> list[int]:
        """One position per fate: 'w' written, 'd' its writer died (a hole)."""
        first, answer = self.seq.answer(streams, len(fates))
        memo: dict[Any, Any] = {}
        for i, fate in enumerate(fates):
            p = first + i
            if fate == "w" and p not in self.data:
                bps = entry_backpointers(first, i, K, answer, memo)
                self.data[p] = entry.with_backpointers(self._plain(streams), p, K, bps)
        return list(range(first, first + len(fates)))

    def slow_append(self, streams: list[int], n: int) -> None:
        """Positions from slow tail finding (no backpointers), then a new sequencer."""
        first = max(self.seq.counter, self.max_stored() + 1)
        for i in range(n):
            p = first + i
            bps = entry_backpointers(first, i, 0, [(s, first, [], 0, []) for s in streams])
            self.data[p] = entry.with_backpointers(self._plain(streams), p, 0, bps)
        self.seq.counter = first + n
        self.restart()

    def foreign(self, n: int) -> None:
        """Entries of no stream layer (another application's bytes)."""
        for _ in range(n):
            self.data[self.seq.counter] = b"raw-bytes"
            self.seq.counter += 1

    def restart(self) -> None:
        self.seq = Sequencer(self.max_stored() + 1, self.history, self.budget)
        self.epoch += 1

    def forget(self) -> None:
        self.seq.streams.clear()
        self.seq.horizon = self.seq.counter

    def fill(self, p: int) -> None:
        self.data.setdefault(p, FILLED)

    def max_stored(self) -> int:
        return max(self.data) if self.data else -1

    # ------------------------------------------------- what walk() uses
    def stream_tail(self, streams: list[int], history: int = 0) -> tuple[int, int, list[Any], int] | None:
        """As Log.stream_tail: with `history` (and a sequencer that keeps some), each
        stream's recent list replaced by its history where longer (prefer_history)."""
        if self.seqr_down:
            return None
        _pos, answer = self.seq.answer(streams, 0)
        if history and self.history:
            hists = self.seq.history_of(streams, history)
            answer = prefer_history([(*a, h) for a, h in zip(answer, hists)])
        return self.seq.counter, K, answer, self.epoch

    def read_positions(self, positions: list[int]) -> dict[int, bytes | int]:
        self.reads.append(list(positions))
        out: dict[int, bytes | int] = {}
        for p in positions:
            d = self.data.get(p)
            out[p] = -errno.ENODATA if d is None else -errno.ENOMSG if d == FILLED else d  # type: ignore[assignment]
        return out

    def max_position(self) -> int | None:
        self.max_position_calls += 1
        return max(self.data) if self.data else None

    def stream_batches(self, lo: int, hi: int, hole_wait: float | None = None, known_tail: int | None = None,
                       hole_clock: Any = None) -> Iterator[pa.RecordBatch]:
        """In order from lo; a hole below the known tail or below a stored entry is filled (as a
        reader that waited would), one above both ends the stream."""
        self.scans.append((lo, hi))
        ps: list[int] = []
        ds: list[bytes | None] = []
        ks: list[str] = []
        top = self.max_stored()
        for p in range(lo, hi):
            d = self.data.get(p)
            if d is None:
                if (known_tail is not None and p < known_tail) or p < top:
                    self.data[p] = FILLED
                    ps.append(p), ds.append(None), ks.append("lost")
                    continue
                break
            ps.append(p)
            ds.append(None if d == FILLED else d)  # type: ignore[arg-type]
            ks.append("filled" if d == FILLED else "data")
        if ps:
            yield pa.RecordBatch.from_arrays(
                [pa.array(ps, pa.uint64()), pa.array(ds, pa.binary()), pa.array(ks).dictionary_encode()],
                names=["position", "data", "kind"])


def names(data: bytes | None, pos: int, wanted: set[int]) -> bool:
    """Does the entry's backpointer section name one of `wanted`?"""
    if data is None or len(data) < entry.HEADER_SIZE or data[:2] != MAGIC or not data[4] & entry.FLAG_BACKPOINTERS:
        return False
    _k, sections, _off = entry.parse_backpointers(data, pos)
    return bool(wanted & set(sections))


def oracle(log: ModelLog, wanted: set[int], lo: int, end: int) -> list[int]:
    """Every position of [lo, end) whose stored entry is of `wanted`: what a full scan finds."""
    return [p for p in range(lo, end) if isinstance(log.data.get(p), bytes) and names(log.data[p], p, wanted)]  # type: ignore[arg-type]
