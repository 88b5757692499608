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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .. import _seqr  # type: ignore[attr-defined]
from ..core import wire
from ..core.errors import EntryTooLarge, InvalidRequest, ZlogError
from ..core.layout import by_object, check_positions
from .appending import store_rounds, stored_form, stored_forms
from .stale import StaleWait

if TYPE_CHECKING:
    from ..core.state import LogState
    from .positions import Positions

FIRST_LEVEL = _seqr.STREAM_FIRST_LEVEL

#: the most bytes a stream's backpointer section may take in an entry (and its head)
_SECTION_MAX = 2 + 19 + 8 * (16 + 64)
#: (stream, horizon, recent backpointers newest first, skip pointers newest
#: first), one per stream of an entry
Backpointers = list[tuple[int, int, list[int], list[int]]]
#: build(data, position, K, backpointers) -> the bytes to store at position
Build = Callable[[bytes, int, int, Backpointers], bytes]
#: build_all(first, K, answer, entries) -> the bytes to store at first, first + 1, ...: a
#: round's entries at once, from the sequencer's answer (see entry_backpointers)
BuildAll = Callable[[int, int, list, list[bytes]], list[bytes]]  # type: ignore[type-arg]


def entry_backpointers(first: int, index: int, k: int, answer: list,  # type: ignore[type-arg]
                       memo: dict[tuple[int, int], list[int]] | None = None) -> Backpointers:
    """The backpointers of the entry at first + index of a batch of
    positions [first, ...) that all belong to the streams of `answer` (the
    sequencer's answer for the batch: (stream, horizon, recent, ordinal,
    [(level, position)])): its stream's K most recent positions, and skip
    pointers to the stream's newest entry below it whose ordinal is a
    multiple of 2^level, for the levels not in the recent list. K = 0
    (positions from slow tail finding): nothing is known below the entry.

    `memo` (one per batch, i.e. per answer): with exactly 2^FIRST_LEVEL
    recent pointers (K = 16, the sequencer's), the skip pointers are the
    same for every entry whose ordinal - 1 lies in one block of
    2^FIRST_LEVEL (which levels the recent list covers does not change
    inside a block then), so they are worked out once per block."""
    pos = first + index
    out: Backpointers = []
    for s, h, back, ordinal, levels in answer:
        if not k:
            out.append((s, pos, [], []))
            continue
        inside = [pos - 1 - j for j in range(min(index, k))]
        recent = inside if len(inside) >= k else inside + list(back[:k - len(inside)])
        me = ordinal + index  # this entry's ordinal in the stream
        if me <= len(recent):
            out.append((s, h, recent, []))
            continue
        if memo is not None and len(recent) == 1 << FIRST_LEVEL:
            key = (s, (me - 1) >> FIRST_LEVEL)
            far = memo.get(key)
            if far is None:
                far = memo[key] = _skips(first, me, len(recent), ordinal, levels)
        else:
            far = _skips(first, me, len(recent), ordinal, levels)
        out.append((s, h, recent, far))
    return out


def _skips(first: int, me: int, nrecent: int, ordinal: int, levels: list[tuple[int, int]]) -> list[int]:
    """The skip pointers of the entry of ordinal `me` with `nrecent` recent
    backpointers, newest first (see entry_backpointers)."""
    known = dict(levels)
    far: list[int] = []
    level = FIRST_LEVEL
    while level < 64:
        m = ((me - 1) >> level) << level  # the newest multiple of 2^level below me
        if m >= me - nrecent:
            level += 1
            continue  # in the recent list
        if m >= ordinal:
            p: int | None = first + (m - ordinal)
        elif m == 0 and known:  # the stream's first entry: the sequencer's highest level names it
            p = known[max(known)]
        else:
            p = known.get(level)
        if p is not None and (not far or p < far[-1]):
            far.append(p)
        if m == 0:
            break  # every higher level names ordinal 0 too
        level += 1
    return far


def append_streams(state: LogState, positions: Positions, streams: list[int], entries: Sequence[bytes],
                   build: Build | None = None, build_all: BuildAll | None = None) -> list[int]:
    """Append `entries`, each of which belongs to every stream in `streams`,
    storing build(entry, position, K, backpointers) at each position, or what
    build_all(first, K, answer, the round's entries) makes for each (one call
    per sequencer request: a layer that builds its entries in C). Returns
    the positions (increasing in entry order unless a write was refused, when
    that entry is stored again at a new position with new backpointers).
    StreamsUnsupported if the sequencer does not answer stream requests."""
    if (build is None) == (build_all is None):
        raise InvalidRequest("append_streams takes one of build and build_all")
    for e in entries:  # refused before any position is taken (a taken one would be left a hole)
        if len(e) + _SECTION_MAX * len(streams) > wire.MAX_ENTRY_BYTES:
            raise EntryTooLarge(f"entry of {len(e)} bytes with the backpointers of {len(streams)} stream(s) is over "
                                f"the limit of {wire.MAX_ENTRY_BYTES}")

    def take(todo: list[int]) -> tuple[int, list[tuple[int, bytes]], wire.Meta]:
        first, k, answer, meta = positions.take_streams(len(todo), streams)
        if build_all is not None:
            made = build_all(first, k, answer, [entries[idx] for idx in todo])
            if len(made) != len(todo):
                raise InvalidRequest(f"build_all made {len(made)} entries for {len(todo)}")
            return first, list(zip(todo, stored_forms(state, made))), meta
        assert build is not None
        memo: dict[tuple[int, int], list[int]] = {}
        return first, [(idx, stored_form(state, build(entries[idx], first + i, k,
                                                      entry_backpointers(first, i, k, answer, memo))))
                       for i, idx in enumerate(todo)], meta

    return store_rounds(state, "append_streams", len(entries), take)


#: positions per read_set call (the class takes up to ZLOG_MAX_BATCH_ENTRIES)
SET_CHUNK = 512


def read_positions(state: LogState, positions: Sequence[int]) -> dict[int, bytes | int]:
    """Each position's entry (decoded bytes) or the class's negative code
    (-ENODATA: not written, -ENOMSG: filled, -EIDRM: trimmed, ...): one
    read_set call per data object for all of its positions (one read op of a
    call per position on a class too old for read_set)."""
    out: dict[int, bytes | int] = {}
    todo = check_positions(positions)  # sorted, each once: a read_set takes them so
    rechecked = False
    for attempt in range(5):
        if attempt:
            for p in todo:  # asked again: answered afresh (_from_window takes a position absent from out as unlisted)
                del out[p]
        meta = state.meta
        views = meta.views
        groups = by_object(state.name, views, todo)
        fallback: list[tuple[Any, list[int]]] = []
        stale = False
        absent: list[int] = []  # positions of objects never made
        with state.conn._waiter() as q:
            if state.read_set:
                asked: dict[int, tuple[Any, list[int]]] = {}
                for where, ps in groups:
                    for i in range(0, len(ps), SET_CHUNK):
                        chunk = ps[i:i + SET_CHUNK]
                        asked[len(asked)] = (where, chunk)
                        q.read_set(state.data, where.oid, meta.epoch, where.format, chunk, len(asked) - 1)
                left = len(asked)
                while left:
                    results = q.wait(30.0)
                    if not results:
                        raise ZlogError(f"reads of {state.name!r} got no answer")
                    for tag, code, value in results:
                        left -= 1
                        where, chunk = asked[tag]
                        if code == 0:
                            _from_window(state, value, chunk, out)
                        elif code == -errno.ENOENT:  # the object was never made
                            absent.extend(chunk)
                            for p in chunk:
                                out[p] = -errno.EIDRM if p < meta.trim_below else -errno.ENODATA
                        elif code == -errno.ESTALE:
                            stale = True
                            for p in chunk:
                                out[p] = code
                        else:  # a class without read_set (EOPNOTSUPP), or a reply too large: one by one
                            if code in (-errno.EOPNOTSUPP, -errno.EPROTONOSUPPORT):
                                state.read_set = False
                            fallback.append((where, chunk))
            else:
                fallback = groups
            if fallback:
                for where, ps in fallback:
                    q.read_many(state.data, where.oid, meta.epoch, ps, ps, where.format)
                got = 0
                total = sum(len(ps) for _, ps in fallback)
                while got < total:
                    results = q.wait(30.0)
                    if not results:
                        raise ZlogError(f"reads of {total - got} positions of {state.name!r} got no answer")
                    for tag, code, value in results:
                        got += 1
                        if code == -errno.ENOENT:
                            absent.append(tag)
                            code = -errno.EIDRM if tag < meta.trim_below else -errno.ENODATA
                        elif code == -errno.ESTALE:
                            stale = True
                        out[tag] = code if code else state.decode(value)
        again = [p for p in todo if out.get(p) == -errno.ESTALE] if stale else []
        if absent and not rechecked:
            # under an older view than the log's a position may map to an object of a stripe
            # that view never opened (the log was reconfigured since): asked again under the new one
            rechecked = True
            if state.moved_past(meta.epoch):
                again = sorted(set(again).union(absent))
        if not again:
            return out
        if stale:
            StaleWait(state, "read")(meta.epoch)
        todo = again
    return out


_CODE_OF_KIND = (None, -errno.ENOMSG, -errno.EIDRM, -errno.ENOMSG)  # by DP_KIND_*: filled, trimmed, lost


def _from_window(state: Any, window: Any, chunk: list[int], out: dict[int, bytes | int]) -> None:
    """What a read_set reply says of each position of `chunk` (none of them
    in `out` yet: the chunks are disjoint, and a round asked again is taken
    out first)."""
    if state.plain:  # the reply's rows straight into out, natively: one call, not a loop over them
        listed = window.rows_into(out, _CODE_OF_KIND, -errno.ENOMSG)
    else:
        got: dict[int, bytes | int] = {}
        listed = window.rows_into(got, _CODE_OF_KIND, -errno.ENOMSG)
        for p, d in got.items():
            if type(d) is bytes:
                got[p] = state.decode(d)
        out.update(got)
    if listed != len(chunk):  # (a reply lists positions of `chunk` only) not listed: unwritten, or trimmed
        trim = window.trim_below
        for p in chunk:
            if p not in out:
                out[p] = -errno.EIDRM if p < trim else -errno.ENODATA
