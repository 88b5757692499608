"""Appends: the one place that decides what a refused write means and what
happens next. Every append path follows judge():

- 0: stored, the append is done;
- ESTALE: the log's epoch moved on (or an epoch change is under way):
  StaleWait refreshes, backs off, repairs a change left half done, and gives
  up with StaleEpoch after its limit; then the entry takes a new position;
- EROFS, ENOMSG, EIDRM: the position was written, filled or trimmed first,
  or lies past the end of a closed view: the entry takes a new position;
- anything else raises its typed error.

An entry not stored within APPEND_DEADLINE_SECONDS fails. store() is the
pipeline of sync appends, batches and slow appends; aio.py runs async appends
through judge() with the same deadline and the same StaleWait. The C++ path
decides nothing: what it cannot store plainly it hands back to aio.py.
"""
from __future__ import annotations

import errno
import time
from collections.abc import Callable
from enum import Enum

from . import metrics
from ..core import wire
from ..core.errors import EntryTooLarge, InvalidRequest, ZlogError, error_for
from ..core.layout import Place, by_object, oid_of
from ..core.native import Op
from ..core.stripes import make
from .positions import Positions
from .stale import StaleWait
from ..core.state import LogState

#: an append gives up (and raises) after this long without storing its entry
APPEND_DEADLINE_SECONDS = 120.0
#: write_many's byte budget per call (the class also caps its entry count)
BATCH_BYTES = 8 << 20


class Outcome(Enum):
    STORED = "stored"
    STALE = "stale"  # refresh (StaleWait), then a new position
    TAKEN = "taken"  # a new position


_TAKEN_CODES = frozenset((-errno.EROFS, -errno.ENOMSG, -errno.EIDRM))
#: the code of a position _send was not given: an error, never "stored"
_NOT_SENT = -errno.EFAULT


def judge(ret: int, log_name: str, position: int,
          error: Callable[[int, str, int], ZlogError] | None = None) -> Outcome:
    """What a write's return code means for an append; raises for a failure
    no new position can cure (made by `error(code, what, position)`, default
    errors.error_for; the data plane's names the cephx caps a refusal lacks)."""
    if ret == 0:
        metrics.APPENDS.inc()
        return Outcome.STORED
    if ret == -errno.ESTALE:
        metrics.RETRIES_STALE.inc()
        return Outcome.STALE
    if ret in _TAKEN_CODES:
        metrics.RETRIES_TAKEN.inc()
        return Outcome.TAKEN
    what = f"append to {log_name!r}"
    raise error(ret, what, position) if error is not None else error_for(ret, what, position=position)


def stored_form(log: LogState, data: bytes) -> bytes:
    """The bytes stored for `data`: checked, encoded, within the size limit."""
    if type(data) is not bytes:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidRequest(f"entries are bytes, not {type(data).__name__}")
        data = bytes(data)
    if len(data) > wire.MAX_ENTRY_BYTES:
        raise EntryTooLarge(f"entry of {len(data)} bytes is over the limit of {wire.MAX_ENTRY_BYTES}")
    stored = data if log.plain else log.encode(data)
    if stored is not data and len(stored) > wire.MAX_ENTRY_BYTES:
        raise EntryTooLarge(f"encoded entry of {len(stored)} bytes is over the limit of {wire.MAX_ENTRY_BYTES}")
    metrics.BYTES_OUT.inc(len(stored))
    return stored


def stored_forms(log: LogState, entries: list[bytes]) -> list[bytes]:
    """stored_form of each entry, with the byte count kept once for the lot."""
    if log.plain and entries and set(map(type, entries)) == {bytes}:  # the usual batch: checked in C loops
        sizes = list(map(len, entries))
        if max(sizes) <= wire.MAX_ENTRY_BYTES:
            metrics.BYTES_OUT.inc(sum(sizes))
            return list(entries)
    return [stored_form(log, d) for d in entries]


def store(log: LogState, positions: Positions, entries: list[bytes], what: str,
          slow: bool = False) -> list[int]:
    """Store already encoded `entries`, taking positions for all of those
    still to be stored with one request per round (from `positions`, or
    with `slow` by slow tail finding only). Returns each entry's position:
    increasing in entry order, except that an entry refused at its first
    position is stored later, at a new one."""
    def take(todo: list[int]) -> tuple[int, list[tuple[int, bytes]], wire.Meta]:
        first, meta = positions.take_slow(len(todo)) if slow else positions.take(len(todo))
        return first, [(i, entries[i]) for i in todo], meta

    return store_rounds(log, what, len(entries), take)


def store_rounds(log: LogState, what: str, count: int,
                 take: Callable[[list[int]], tuple[int, list[tuple[int, bytes]], wire.Meta]]) -> list[int]:
    """The rounds of every sync append of `count` entries: take(todo) takes
    positions for the entries still to store (their indices) and returns
    (first, [(index, stored bytes), ...], the metadata the positions were
    handed out under) to write at first, first + 1, ... at its epoch;
    the refused ones go round again at new positions (after StaleWait if
    the epoch was refused), until APPEND_DEADLINE_SECONDS. Returns each
    entry's position."""
    todo = list(range(count))
    placed = [-1] * count
    deadline = time.monotonic() + APPEND_DEADLINE_SECONDS
    stale = StaleWait(log, what)
    while todo:
        if time.monotonic() > deadline:
            raise ZlogError(f"{what} to {log.name!r}: {len(todo)} of {count} entries not stored in "
                            f"{APPEND_DEADLINE_SECONDS:.0f}s")
        first, items, meta = take(todo)
        refused: list[int] = []
        was_stale = False
        codes = _write(log, meta, first, items)
        if not any(codes):  # all stored: judge()'s first case, counted once
            metrics.APPENDS.inc(len(codes))
            if len(items) == count:  # the first round: entry i at first + i
                return list(range(first, first + count))
            for k, item in enumerate(items):
                placed[item[0]] = first + k
            break
        error = write_error(log, meta)
        for k, (item, ret) in enumerate(zip(items, codes)):
            outcome = judge(ret, log.name, first + k, error)
            if outcome is Outcome.STORED:
                placed[item[0]] = first + k
            else:
                was_stale = was_stale or outcome is Outcome.STALE
                refused.append(item[0])
        if was_stale:
            stale(meta.epoch)
        todo = refused
    return placed


def write_error(log: LogState, meta: wire.Meta) -> Callable[[int, str, int], ZlogError]:
    """The error for a refused write at a position (the data plane's, which
    names the cephx caps an EPERM lacks)."""
    def error(code: int, what: str, position: int) -> ZlogError:
        return log.conn.error(code, what, pool=log.data, oid=oid_of(log.name, meta.views, position),
                              op=Op.WRITE)
    return error


def _write(log: LogState, meta: wire.Meta, first: int, todo: list[tuple[int, bytes]]) -> list[int]:
    """Write todo[k] at first + k at meta's epoch: one class write for a single
    entry, else one write_many per object and batch, sent concurrently.
    Data-format objects not made yet are made first (stripes.make), once
    for those the metadata shows unopened and again for any a write finds
    missing, which then goes again to the same position. Returns the return
    code of every entry (todo[k]'s at k)."""
    groups = by_object(log.name, meta.views, range(first, first + len(todo)))
    code = _make_unopened(log, meta, [where for where, _ in groups])
    if code:
        return [code] * len(todo)
    codes = _send(log, meta.epoch, first, todo, groups)
    missing: list[tuple[Place, list[int]]] = []
    if -errno.ENOENT in codes:
        lost_ps = ([p for p in ps if codes[p - first] == -errno.ENOENT] for _, ps in groups)
        missing = [(where, lost) for (where, _), lost in zip(groups, lost_ps) if lost]
    made: dict[tuple[int, int], int] = {}
    for where, _ in missing:
        if (where.view.epoch, where.stripe) not in made:
            made[where.view.epoch, where.stripe] = make(log, meta.epoch, where)
    again = [(where, lost) for where, lost in missing if made[where.view.epoch, where.stripe] == 0]
    resent = _send(log, meta.epoch, first, todo, again) if again else codes
    for where, lost in missing:
        code = made[where.view.epoch, where.stripe]
        for p in lost:
            codes[p - first] = resent[p - first] if code == 0 else code
    return codes


def _make_unopened(log: LogState, meta: wire.Meta, places: list[Place]) -> int:
    """Open (and make the objects of) the stripes of the newest view that
    `places` reach and the metadata shows unopened: 0 or -errno."""
    newest = meta.views[-1]
    if not newest.bounded:
        return 0
    todo: dict[int, Place] = {}
    for where in places:
        if where.view is newest and where.stripe >= log.open_stripes(newest):
            todo.setdefault(where.stripe, where)
    for where in todo.values():  # in stripe order: a stripe is opened with every one below it
        code = make(log, meta.epoch, where)
        if code:
            return code
    return 0


def _send(log: LogState, epoch: int, first: int, todo: list[tuple[int, bytes]],
          groups: list[tuple[Place, list[int]]]) -> list[int]:
    """Write the positions of `groups` (todo[p - first] at p): the return
    code of each position of todo (_NOT_SENT for those not in `groups`)."""
    conn, pool = log.conn, log.data
    codes = [_NOT_SENT] * len(todo)
    if len(groups) == 1 and len(groups[0][1]) == 1:
        where, (pos,) = groups[0]
        codes[pos - first], _ = conn.call_pos(pool, where.oid, Op.WRITE, epoch, pos, todo[pos - first][1], 0,
                                              where.format)
        return codes
    calls = [(where, batch) for where, ps in groups for batch in _batches([(p, todo[p - first][1]) for p in ps])]
    results = conn.calls([(pool, where.oid, Op.WRITE_MANY, {"epoch": epoch, "entries": batch, "format": where.format})
                          for where, batch in calls])
    for (where, batch), (code, _) in zip(calls, results):
        if code in _TAKEN_CODES:
            # write_many is all or nothing: store what can be stored one by one
            singles = conn.calls([(pool, where.oid, Op.WRITE, {"epoch": epoch, "position": pos, "data": data,
                                                               "format": where.format})
                                  for pos, data in batch])
            for (pos, _), (one, _) in zip(batch, singles):
                codes[pos - first] = one
        else:
            for pos, _ in batch:
                codes[pos - first] = code
    return codes


def _batches(items: list[tuple[int, bytes]]) -> list[list[tuple[int, bytes]]]:
    """Split (position, stored bytes) pairs into write_many calls within the class's limits."""
    if len(items) <= wire.MAX_BATCH_ENTRIES and sum(len(e[1]) for e in items) <= BATCH_BYTES:
        return [items]  # the usual batch: one call
    out: list[list[tuple[int, bytes]]] = [[]]
    size = 0
    for entry in items:
        data = entry[1]
        if out[-1] and (len(out[-1]) >= wire.MAX_BATCH_ENTRIES or size + len(data) > BATCH_BYTES):
            out.append([])
            size = 0
        out[-1].append(entry)
        size += len(data)
    return out
