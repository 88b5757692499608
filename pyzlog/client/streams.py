"""Streams: appends whose positions the sequencer records per stream, with
backpointers, and reads of a chosen set of positions (docs/seqr-protocol.md,
"Streams"; docs/objects.md, "Streams").

append_streams() takes positions for entries that belong to some streams
with one STREAM_NEXT request, hands each entry's backpointers (the stream's
previous positions) to `build` so that they are stored in the entry, and
writes the entries like append_many (appending.store's rules: a refused
position takes a new one, and new backpointers). read_positions() reads any
set of positions with one read op per data object.
"""
from __future__ import annotations

import errno
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..core.errors import ZlogError
from ..core.layout import place_of
from .appending import APPEND_DEADLINE_SECONDS, Outcome, _write, judge, stored_form, write_error
from .stale import StaleWait

if TYPE_CHECKING:
    from .log import Log

#: (stream, horizon, backpointers newest first), one per stream of an entry
Backpointers = list[tuple[int, int, list[int]]]
#: build(data, position, K, backpointers) -> the bytes to store at position
Build = Callable[[bytes, int, int, Backpointers], bytes]


def entry_backpointers(first: int, index: int, k: int, answer: Backpointers) -> Backpointers:
    """The backpointers of the entry at first + index of a batch of
    positions [first, ...) that all belong to the streams of `answer` (the
    sequencer's answer for the batch). K = 0 (positions from slow tail
    finding): nothing is known below the entry itself."""
    pos = first + index
    if not k:
        return [(s, pos, []) for s, _h, _b in answer]
    inside = [pos - 1 - j for j in range(min(index, k))]
    if len(inside) >= k:
        return [(s, h, inside) for s, h, _b in answer]
    return [(s, h, inside + back[:k - len(inside)]) for s, h, back in answer]


def append_streams(log: Log, streams: list[int], entries: Sequence[bytes], build: Build) -> list[int]:
    """Append `entries`, each of which belongs to every stream in `streams`,
    storing build(entry, position, K, backpointers) at each position. Returns
    the positions (increasing in entry order unless a write was refused, when
    that entry is stored again at a new position with new backpointers).
    StreamsUnsupported if the sequencer does not answer stream requests."""
    state, positions = log.state, log.positions
    todo = list(range(len(entries)))
    placed = [-1] * len(entries)
    deadline = time.monotonic() + APPEND_DEADLINE_SECONDS
    stale = StaleWait(state, "append_streams")
    while todo:
        if time.monotonic() > deadline:
            raise ZlogError(f"append_streams to {state.name!r}: {len(todo)} of {len(entries)} entries not stored "
                            f"in {APPEND_DEADLINE_SECONDS:.0f}s")
        first, k, answer = positions.take_streams(len(todo), streams)
        items = [(idx, stored_form(state, build(entries[idx], first + i, k, entry_backpointers(first, i, k, answer))))
                 for i, idx in enumerate(todo)]
        meta = state.meta
        refused: list[int] = []
        was_stale = False
        for pos, item, ret in _write(state, meta, first, items):
            outcome = judge(ret, state.name, pos, write_error(state, meta))
            if outcome is Outcome.STORED:
                placed[item[0]] = pos
            else:
                was_stale = was_stale or outcome is Outcome.STALE
                refused.append(item[0])
        if was_stale:
            stale(meta.epoch)
        todo = refused
    return placed


def read_positions(log: Log, positions: Sequence[int]) -> dict[int, bytes | int]:
    """Each position's entry (decoded bytes) or the class's negative code
    (-ENODATA: not written, -ENOMSG: filled, -EIDRM: trimmed, ...): one read
    op per data object for all of its positions."""
    state = log.state
    out: dict[int, bytes | int] = {}
    todo = list(positions)
    for _attempt in range(5):
        meta = state.meta
        groups: dict[tuple[str, int], list[int]] = {}
        for p in todo:
            where = place_of(state.name, meta.views, p)
            groups.setdefault((where.oid, where.format), []).append(p)
        with state.conn._waiter() as q:
            for (oid, fmt), ps in groups.items():
                q.read_many(state.data, oid, meta.epoch, ps, ps, fmt)
            got = 0
            while got < len(todo):
                results = q.wait(30.0)
                if not results:
                    raise ZlogError(f"reads of {len(todo) - got} positions of {state.name!r} got no answer")
                for tag, code, value in results:
                    got += 1
                    if code == -errno.ENOENT:
                        code = -errno.EIDRM if tag < meta.trim_below else -errno.ENODATA
                    out[tag] = code if code else state.decode(value)
        todo = [p for p in todo if out.get(p) == -errno.ESTALE]
        if not todo:
            return out
        StaleWait(state, "read")(meta.epoch)
    return out
