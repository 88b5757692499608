"""cls_zlog against a pure-Python model of one data object.

A hypothesis state machine drives random sequences of every data method
(write, write_many, read, fill, trim, trim_to, seal, close, max_position, read_range)
at one real object, a fresh one per example, and at the model below, and
asserts the same return code and the same bytes for every step. The object's
header is lost now and then (from outside, as damage would): an object that
holds anything is then corrupt (every method EIO) until `repair` rebuilds
the header; one that holds nothing is new again. Positions are
the object's first 16 and epochs small so that collisions, trims over data
and stale epochs are common; request epochs are drawn, not always the sealed
one. The data format runs twice: an object holding every position, and one
of a stripe dealt in runs (RUNS_GEOMETRY: its positions are 0..3, 12..15, ...,
so range reads cross the other objects' runs).
"""
from __future__ import annotations

import errno
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Union

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from pyzlog.core import wire
from pyzlog.core.wire import EntryState, ObjectStat, RangeEntry

from clsobj import RUNS_GEOMETRY
from clsobj import Raw as ClassIO
from clsobj import RangeReply
from clsobj import CORRUPT, EINVAL, FILLED, NOENT, OK, STALE, TOO_BIG, TRIMMED, UNWRITTEN, WRITTEN, Obj
import damage
from pyzlog.core.native import Op

EXISTS = -errno.EEXIST



STATE_ERROR = {EntryState.WRITTEN: WRITTEN, EntryState.FILLED: FILLED, EntryState.TRIMMED: TRIMMED}
BIG = b"x" * (wire.MAX_ENTRY_BYTES + 1)


def errname(ret: int) -> str:
    """'OK' or the errno name, for hypothesis' statistics (--hypothesis-show-statistics)."""
    return "OK" if ret == 0 else errno.errorcode.get(-ret, str(ret))


# --------------------------------------------------------------------- model


@dataclass
class Model:
    """What cls_zlog should hold for one data object."""

    exists: bool = False
    sealed: int = 0
    trim_below: int = 0  # every position below it is trimmed
    max_pos: int | None = None  # highest position written, filled or trimmed
    view_end: int | None = None  # set by close: positions from here belong to a later view
    entries: dict[int, tuple[EntryState, int, bytes]] = field(default_factory=dict)  # (state, epoch, data)
    corrupt: bool = False  # its header was lost next to its contents: every method EIO
    headerless: bool = False  # (omap) it exists, holding nothing, its header lost: the initial state

    def lose_header(self, data_format: bool, garble: bool) -> None:
        """The header is lost (or overwritten with bytes that do not parse)."""
        if data_format or garble or self.entries:
            self.corrupt = True
        else:  # nothing else in it (an omap object's entries are its omap): new again, empty
            self.__init__()  # type: ignore[misc]
            self.exists = self.headerless = True

    def repair(self, epoch: int) -> int:
        """The repair method with what the log's metadata knows: `epoch` (at
        or above the seal), the trim point and the view's end."""
        if not self.corrupt:
            return NOENT if not self.exists or self.headerless else EXISTS
        self.corrupt = self.headerless = False
        self.sealed = epoch
        return OK

    def _stored(self) -> None:
        self.exists = True
        self.headerless = False

    def _taken(self, pos: int) -> int | None:
        """The error for storing at `pos`, or None if it is unwritten."""
        if pos < self.trim_below:
            return TRIMMED
        e = self.entries.get(pos)
        return None if e is None else STATE_ERROR[e[0]]

    def _past_end(self, pos: int) -> bool:
        return self.view_end is not None and pos >= self.view_end

    def _note(self, pos: int) -> None:
        if self.max_pos is None or pos > self.max_pos:
            self.max_pos = pos

    def write(self, epoch: int, pos: int, data: bytes) -> int:
        if len(data) > wire.MAX_ENTRY_BYTES:
            return TOO_BIG
        if self.corrupt:
            return CORRUPT
        if epoch < self.sealed or self._past_end(pos):
            return STALE
        err = self._taken(pos)
        if err is not None:
            return err
        self.entries[pos] = (EntryState.WRITTEN, epoch, data)
        self._stored()
        self._note(pos)
        return OK

    def write_many(self, epoch: int, batch: list[tuple[int, bytes]]) -> int:
        positions = [p for p, _ in batch]
        if not batch or len(set(positions)) != len(positions):
            return EINVAL
        if any(len(d) > wire.MAX_ENTRY_BYTES for _, d in batch):
            return TOO_BIG
        if self.corrupt:
            return CORRUPT
        if epoch < self.sealed or self._past_end(max(positions)):
            return STALE
        for p in sorted(positions):  # the first taken position, in position order
            err = self._taken(p)
            if err is not None:
                return err
        for p, d in batch:
            self.entries[p] = (EntryState.WRITTEN, epoch, d)
            self._note(p)
        self._stored()
        return OK

    def read(self, epoch: int, pos: int) -> tuple[int, bytes]:
        if not self.exists:
            return NOENT, b""
        if self.corrupt:
            return CORRUPT, b""
        if epoch < self.sealed:
            return STALE, b""
        if pos < self.trim_below:
            return TRIMMED, b""
        e = self.entries.get(pos)
        if e is None:
            return UNWRITTEN, b""
        if e[0] != EntryState.WRITTEN:
            return STATE_ERROR[e[0]], b""
        return OK, e[2]

    def fill(self, epoch: int, pos: int, reason: int) -> int:
        if self.corrupt:
            return CORRUPT
        if epoch < self.sealed or self._past_end(pos):
            return STALE
        err = self._taken(pos)
        mark = wire.LOST_MARK if reason == wire.FILL_LOST else b""
        if err == FILLED:
            # the same reason again is idempotent (the stored epoch stays the
            # first fill's); the other reason is refused: one kind per position
            return OK if self.entries[pos][2] == mark else FILLED
        if err is not None:
            return err
        self.entries[pos] = (EntryState.FILLED, epoch, mark)
        self._stored()
        self._note(pos)
        return OK

    def trim(self, epoch: int, pos: int) -> int:
        if self.corrupt:
            return CORRUPT
        if epoch < self.sealed or self._past_end(pos):
            return STALE
        self._stored()
        if pos >= self.trim_below:
            self.entries[pos] = (EntryState.TRIMMED, epoch, b"")  # a re-trim stores the new epoch
            self._note(pos)
        return OK

    def trim_to(self, epoch: int, pos: int) -> int:
        if self.corrupt:
            return CORRUPT
        if epoch < self.sealed:
            return STALE
        self._stored()
        if pos + 1 > self.trim_below:
            self.trim_below = pos + 1
            self.entries = {p: e for p, e in self.entries.items() if p > pos}
            # max covers the watermark (within a closed view), so tail finding
            # never hands out a trimmed position
            if self.view_end is None:
                self._note(pos)
            elif self.view_end > 0:
                self._note(min(pos, self.view_end - 1))
        return OK

    def close(self, epoch: int, end: int) -> int:
        if self.corrupt:
            return CORRUPT
        if not self.exists or epoch == 0 or epoch != self.sealed:
            return STALE
        if self.view_end is not None:
            return OK if end == self.view_end else EINVAL
        if self.max_pos is not None and self.max_pos >= end:
            if self.max_pos >= self.trim_below:
                return EINVAL  # an entry is stored at or past the end
            # only a trim watermark reached past it: max comes down to the end
            self.max_pos = end - 1 if end > 0 else None
        self.view_end = end
        self.headerless = False
        return OK

    def seal(self, epoch: int) -> int:
        if self.corrupt:
            return CORRUPT
        if epoch <= self.sealed:
            return STALE
        self.sealed = epoch
        self._stored()
        return OK

    def max_position(self, epoch: int) -> tuple[int, int | None]:
        if not self.exists:
            return NOENT, None
        if self.corrupt:
            return CORRUPT, None
        if epoch < self.sealed:
            return STALE, None
        return OK, self.max_pos

    def read_range(self, epoch: int, first: int, last: int, max_entries: int,
                   max_bytes: int) -> tuple[int, RangeReply | None]:
        if not self.exists:
            return NOENT, None
        if last < first or max_entries == 0 or max_bytes == 0:
            return EINVAL, None
        if self.corrupt:
            return CORRUPT, None
        if epoch < self.sealed:
            return STALE, None
        out: list[RangeEntry] = []
        nbytes = 0
        nxt = last + 1
        for p in sorted(self.entries):
            if p < max(first, self.trim_below) or p > last:
                continue
            state, e_epoch, data = self.entries[p]
            if out and nbytes + len(data) > max_bytes:
                nxt = p
                break
            out.append(RangeEntry(p, state, e_epoch, data))
            nbytes += len(data)
            if len(out) == max_entries:
                nxt = p + 1
                break
        return OK, RangeReply(self.trim_below, self.max_pos, nxt, out)

    def stat(self) -> tuple[int, ObjectStat | None]:
        if not self.exists:
            return NOENT, None
        if self.corrupt:
            return CORRUPT, None
        return OK, ObjectStat(self.sealed, self.max_pos, self.trim_below, self.view_end)


# ------------------------------------------------------------- strategies


@dataclass(frozen=True)
class AtSealed:
    """A request epoch relative to the object's sealed epoch (sealed + delta)."""

    delta: int

    def __repr__(self) -> str:
        return f"sealed+{self.delta}"


@dataclass(frozen=True)
class Held:
    """A position the object holds an entry for (the i-th, cyclically), so that
    writes, fills, reads and trims land on written/filled/trimmed positions often."""

    i: int

    def __repr__(self) -> str:
        return f"held[{self.i}]"


Epoch = Union[int, AtSealed]
Pos = Union[int, Held]

POSITIONS = st.integers(0, 15)
# Any position, or one that is already written, filled or trimmed.
TARGETS = st.one_of(POSITIONS, st.builds(Held, st.integers(0, 15)))
DATA = st.binary(max_size=8)
# Absolute small epochs (often stale once something is sealed) or the sealed one / next.
EPOCHS = st.one_of(st.integers(0, 5), st.builds(AtSealed, st.integers(0, 1)))
SEAL_EPOCHS = st.one_of(st.integers(0, 6), st.builds(AtSealed, st.integers(0, 1)))
# Now and then an entry over the size limit.
OVERSIZE = st.integers(0, 11).map(lambda i: i == 0)


class ClsZlogMachine(RuleBasedStateMachine):
    io: ClassIO | None = None  # set by the fixture below
    rados_io: object = None  # python-rados on the same pool, to damage the object from outside
    conf: str = ""

    def __init__(self) -> None:
        super().__init__()
        assert self.io is not None, "use the machine_io fixture"
        self.obj = Obj(self.io, f"m.{uuid.uuid4().hex}")
        self.model = Model()
        # a data-format object is made (init) before anything else touches it:
        # it exists from the start, sealed at 0, with nothing in it
        self.model.exists = self.io.data_format

    def epoch(self, e: Epoch) -> int:
        return self.model.sealed + e.delta if isinstance(e, AtSealed) else e

    def pos(self, p: Pos) -> int:
        if isinstance(p, Held):
            held = sorted(self.model.entries)
            return held[p.i % len(held)] if held else self.at(p.i)
        return self.at(p)

    def at(self, i: int) -> int:
        """The object's i-th position (i itself unless its stripe is dealt in runs)."""
        assert self.io is not None
        return self.io.held(i)

    @rule(epoch=EPOCHS, pos=TARGETS, data=DATA, oversize=OVERSIZE)
    def write(self, epoch: Epoch, pos: Pos, data: bytes, oversize: bool) -> None:
        e, pos = self.epoch(epoch), self.pos(pos)
        data = BIG if oversize else data
        got = self.obj.write(e, pos, data)
        event(f"write {errname(got)}")
        assert got == self.model.write(e, pos, data)

    @rule(epoch=EPOCHS, batch=st.lists(st.tuples(POSITIONS, DATA), max_size=4), oversize=OVERSIZE)
    def write_many(self, epoch: Epoch, batch: list[tuple[int, bytes]], oversize: bool) -> None:
        e = self.epoch(epoch)
        batch = [(self.at(p), d) for p, d in batch]
        if oversize and batch:
            batch = [(batch[0][0], BIG)] + batch[1:]
        got = self.obj.write_many(e, batch)
        event(f"write_many {errname(got)}")
        assert got == self.model.write_many(e, batch)

    @rule(epoch=EPOCHS, pos=TARGETS)
    def read(self, epoch: Epoch, pos: Pos) -> None:
        e, pos = self.epoch(epoch), self.pos(pos)
        got = self.obj.read(e, pos)
        event(f"read {errname(got[0])}")
        assert got == self.model.read(e, pos)

    @rule(epoch=EPOCHS, pos=TARGETS, reason=st.sampled_from([wire.FILL_JUNK, wire.FILL_LOST]))
    def fill(self, epoch: Epoch, pos: Pos, reason: int) -> None:
        e, pos = self.epoch(epoch), self.pos(pos)
        got = self.obj.fill(e, pos, reason)
        event(f"fill {errname(got)}")
        assert got == self.model.fill(e, pos, reason)

    @rule(epoch=EPOCHS, pos=TARGETS)
    def trim(self, epoch: Epoch, pos: Pos) -> None:
        e, pos = self.epoch(epoch), self.pos(pos)
        got = self.obj.trim(e, pos)
        event(f"trim {errname(got)}")
        assert got == self.model.trim(e, pos)

    @rule(epoch=EPOCHS, pos=POSITIONS)
    def trim_to(self, epoch: Epoch, pos: int) -> None:
        e, pos = self.epoch(epoch), self.at(pos)
        got = self.obj.trim_to(e, pos)
        event(f"trim_to {errname(got)}")
        assert got == self.model.trim_to(e, pos)

    @rule(epoch=SEAL_EPOCHS)
    def seal(self, epoch: Epoch) -> None:
        e = self.epoch(epoch)
        got = self.obj.seal(e)
        event(f"seal {errname(got)}")
        assert got == self.model.seal(e)

    @rule(epoch=EPOCHS, end=st.integers(0, 20))
    def close(self, epoch: Epoch, end: int) -> None:
        e = self.epoch(epoch)
        got = self.obj.close(e, end)
        event(f"close {errname(got)}")
        assert got == self.model.close(e, end)

    @rule(epoch=EPOCHS)
    def max_position(self, epoch: Epoch) -> None:
        e = self.epoch(epoch)
        got = self.obj.max_position(e)
        event(f"max_position {errname(got[0])}")
        assert got == self.model.max_position(e)

    @rule(epoch=EPOCHS, first=st.integers(0, 17), span=st.integers(-1, 17) | st.just(wire.MAX_POSITION),
          max_entries=st.sampled_from([1, 2, 3, 4, 0]), max_bytes=st.sampled_from([8, 1, 4, 16, 64, 0]))
    def read_range(self, epoch: Epoch, first: int, span: int, max_entries: int, max_bytes: int) -> None:
        """Any range and budget (span -1 asks for last < first; a 0 budget is refused too)."""
        last = min(first + span, wire.MAX_POSITION)
        if last < 0:
            first, last = 1, 0
        self.walk(self.epoch(epoch), first, last, max_entries, max_bytes)

    @rule(delta=st.integers(0, 1), first=st.integers(0, 4), max_entries=st.integers(1, 3),
          max_bytes=st.integers(1, 12))
    def read_range_paged(self, delta: int, first: int, max_entries: int, max_bytes: int) -> None:
        """A valid epoch and tight budgets: exercises the paging edges (byte budget met
        exactly, the first entry over budget, count budget)."""
        self.walk(self.model.sealed + delta, first, 20, max_entries, max_bytes)

    def walk(self, e: int, first: int, last: int, max_entries: int, max_bytes: int) -> None:
        """Walk [first, last] page by page, as a reader would, comparing every page."""
        cur = first
        for _ in range(64):
            got = self.obj.read_range(e, cur, last, max_entries, max_bytes)
            want = self.model.read_range(e, cur, last, max_entries, max_bytes)
            event(f"read_range {errname(got[0])}" + (" (later page)" if cur != first else ""))
            assert got == want, f"read_range({e}, {cur}, {last}, {max_entries}, {max_bytes})"
            if got[0] != OK:
                return
            reply = got[1]
            assert reply is not None and reply.next > cur
            if reply.next > last:
                return
            cur = reply.next
        raise AssertionError("read_range walk did not finish")

    @precondition(lambda self: self.model.exists)
    @rule(garble=st.booleans())
    def lose_header(self, garble: bool) -> None:
        """Damage from outside: the header goes (or turns to bytes that do not parse)."""
        assert self.io is not None
        damage.lose_header(self.conf, self.rados_io, self.obj.oid, self.io.data_format, garble)  # type: ignore[arg-type]
        self.model.lose_header(self.io.data_format, garble)
        event(f"lose_header ({'corrupt' if self.model.corrupt else 'new again'})")

    @rule(delta=st.integers(0, 1))
    def repair(self, delta: int) -> None:
        """An operator's repair, with what the log's metadata knows: an epoch at or
        above the lost seal, the trim point and the view's end."""
        assert self.io is not None
        e, m = self.model.sealed + delta, self.model
        base, width, slots, byte_bound, *_ = self.io.geometry
        p2 = Obj(ClassIO(self.io.conn, self.io.pool, wire.PROTOCOL, self.io.fmt, self.io.geometry), self.obj.oid,
                 made=False)
        got = p2.op(Op.REPAIR, epoch=e, position=m.view_end or 0, reason=0 if m.view_end is None else 1,
                    start=m.trim_below, last=base, width=width, slots=slots, byte_bound=byte_bound, unit=self.io.unit,
                    format=self.io.fmt)[0]
        event(f"repair {errname(got)}")
        assert got == self.model.repair(e)

    @invariant()
    def object_matches(self) -> None:
        """After every step, the whole object: its header (stat has no epoch check) and
        every entry with its state, epoch and data (a read_range at the highest epoch)."""
        assert self.obj.stat() == self.model.stat()
        top = (1 << 64) - 1  # never below the sealed epoch
        got = self.obj.read_range(top, 0, wire.MAX_POSITION, wire.MAX_RANGE_ENTRIES, 1 << 16)
        assert got == self.model.read_range(top, 0, wire.MAX_POSITION, wire.MAX_RANGE_ENTRIES, 1 << 16)


SETTINGS = settings(
    max_examples=50,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _machine_on(io: ClassIO, rados_cluster, ceph) -> Iterator[ClassIO]:  # type: ignore[no-untyped-def]
    """The machine drives `io`'s object (and damages it through python-rados)."""
    ClsZlogMachine.io = io
    ClsZlogMachine.rados_io = rio = damage.ioctx(rados_cluster, ceph.pool)
    ClsZlogMachine.conf = ceph.conf
    yield io
    ClsZlogMachine.io = ClsZlogMachine.rados_io = None
    rio.close()


@pytest.fixture
def machine_io(data_io: ClassIO, rados_cluster, ceph):  # type: ignore[no-untyped-def]
    yield from _machine_on(data_io, rados_cluster, ceph)


def test_cls_zlog_matches_model(machine_io: ClassIO) -> None:
    run_state_machine_as_test(ClsZlogMachine, settings=SETTINGS)


@pytest.fixture
def runs_io(rados_cluster, ceph):  # type: ignore[no-untyped-def]
    from pyzlog.core.native import Connection

    conn = Connection.of(rados_cluster)
    yield from _machine_on(ClassIO(conn, conn.pool(ceph.pool), wire.PROTOCOL, wire.FORMAT_DATA, RUNS_GEOMETRY),
                           rados_cluster, ceph)


def test_cls_zlog_matches_model_in_runs(runs_io: ClassIO) -> None:
    """The data format, one object of a stripe dealt in runs of 4 over 3
    objects: the same model, on its own positions."""
    assert [runs_io.held(i) for i in (0, 3, 4, 8)] == [0, 3, 12, 24]
    run_state_machine_as_test(ClsZlogMachine, settings=SETTINGS)



def replay_repair_after_a_close_below_the_trim_point() -> None:
    """A sequence the machine found (CI, 618cb90): a view closed at 0 after a
    trim_to past it (allowed: only trimmed entries lie past the end), then the
    header lost. repair refused it (EINVAL: the trimmed entry counted as stored
    past the end); it must rebuild the header close left, with no max. The
    omap format is replayed too: there the header's loss leaves it new."""

    @settings(max_examples=1, database=None, deadline=None)
    @given(st.none())
    def replay(_: None) -> None:  # inside a hypothesis test: the rules record events
        m = ClsZlogMachine()
        steps = [lambda: m.write(AtSealed(0), 0, b"", False), lambda: m.seal(AtSealed(1)),
                 lambda: m.trim_to(AtSealed(0), 0), lambda: m.close(AtSealed(0), 0),
                 lambda: m.lose_header(False), lambda: m.repair(0)]
        for step in steps:
            step()
            m.object_matches()
        assert not m.model.corrupt  # (an omap object, its entries trimmed away, was new again)

    replay()


def test_repair_rebuilds_a_view_closed_below_its_trim_point(machine_io: ClassIO) -> None:
    replay_repair_after_a_close_below_the_trim_point()


def test_repair_rebuilds_a_view_closed_below_its_trim_point_in_runs(runs_io: ClassIO) -> None:
    replay_repair_after_a_close_below_the_trim_point()
