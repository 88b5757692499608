"""cls_zlog, method by method: every state move and every error code."""
from __future__ import annotations

import errno
import threading

import pytest

from pyzlog.core import wire
from pyzlog.core.wire import EntryState

from clsobj import EINVAL, FILLED, OK, STALE, TRIMMED, UNWRITTEN, WRITTEN, Obj




@pytest.fixture
def obj(data_io, oid) -> Obj:  # type: ignore[no-untyped-def]
    return Obj(data_io, oid)


def put_in_state(o: Obj, state: str, pos: int) -> None:
    o.write(0, pos + 1000, b"anchor")  # the object exists whatever the state
    if state == "written":
        assert o.write(0, pos, b"payload") == OK
    elif state == "filled":
        assert o.fill(0, pos) == OK
    elif state == "trimmed":
        assert o.write(0, pos, b"payload") == OK
        assert o.trim(0, pos) == OK
    elif state == "trimmed_to":
        assert o.write(0, pos, b"payload") == OK
        assert o.trim_to(0, pos) == OK


# state -> (write, read, fill, trim) outcome
TRANSITIONS = {
    "unwritten": (OK, UNWRITTEN, OK, OK),
    "written": (WRITTEN, OK, WRITTEN, OK),
    "filled": (FILLED, FILLED, OK, OK),
    "trimmed": (TRIMMED, TRIMMED, TRIMMED, OK),
    "trimmed_to": (TRIMMED, TRIMMED, TRIMMED, OK),
}


@pytest.mark.parametrize("state", list(TRANSITIONS))
@pytest.mark.parametrize("op", ["write", "read", "fill", "trim"])
def test_state_moves(obj: Obj, state: str, op: str) -> None:
    pos = 7
    put_in_state(obj, state, pos)
    expected = TRANSITIONS[state][["write", "read", "fill", "trim"].index(op)]
    if op == "write":
        assert obj.write(0, pos, b"second") == expected
    elif op == "read":
        ret, data = obj.read(0, pos)
        assert ret == expected
        if state == "written":
            assert data == b"payload"
    elif op == "fill":
        assert obj.fill(0, pos) == expected
    else:
        assert obj.trim(0, pos) == expected

    # the state after the move is what the table implies
    after = {"unwritten": {"write": "written", "fill": "filled", "trim": "trimmed"},
             "written": {"trim": "trimmed"}, "filled": {"trim": "trimmed"}}.get(state, {}).get(op, state)
    want_read = {"unwritten": UNWRITTEN, "written": OK, "filled": FILLED,
                 "trimmed": TRIMMED, "trimmed_to": TRIMMED}[after]
    ret, data = obj.read(0, pos)
    assert ret == want_read
    if after == "written":
        assert data == (b"second" if state == "unwritten" else b"payload")


def test_fill_reasons(obj: Obj) -> None:
    assert obj.fill(0, 1) == OK
    assert obj.fill(0, 2, wire.FILL_LOST) == OK
    assert obj.fill(0, 2, wire.FILL_LOST) == OK  # filled again for the same reason: fine
    # the other reason loses: one kind per position, whichever came first
    assert obj.fill(0, 2, wire.FILL_JUNK) == FILLED
    assert obj.fill(0, 1, wire.FILL_LOST) == FILLED
    assert obj.fill(0, 3, 2) == EINVAL
    assert obj.read(0, 2)[0] == FILLED
    ret, rr = obj.read_range(0, 0, 10)
    assert rr is not None
    assert [(e.position, e.state, e.data) for e in rr.entries] == \
        [(1, EntryState.FILLED, b""), (2, EntryState.FILLED, wire.LOST_MARK)]


def test_read_of_missing_object_is_enoent(data_io, oid) -> None:  # type: ignore[no-untyped-def]
    # The OSD answers ENOENT before the class runs; the client maps it to NotWritten.
    assert Obj(data_io, oid, made=False).read(0, 3)[0] == -errno.ENOENT


def test_write_keeps_first_data_and_epoch(obj: Obj) -> None:
    assert obj.write(3, 10, b"first") == OK
    assert obj.write(3, 10, b"other") == WRITTEN
    ret, rr = obj.read_range(3, 0, 100)
    assert ret == OK and rr is not None
    assert [(e.position, e.state, e.epoch, e.data) for e in rr.entries] == \
        [(10, EntryState.WRITTEN, 3, b"first")]


def test_empty_entry_is_allowed(obj: Obj) -> None:
    assert obj.write(0, 1, b"") == OK
    assert obj.read(0, 1) == (OK, b"")


def test_entry_size_limit(obj: Obj) -> None:
    assert obj.write(0, 1, b"x" * wire.MAX_ENTRY_BYTES) == OK
    assert obj.write(0, 2, b"x" * (wire.MAX_ENTRY_BYTES + 1)) == -errno.EFBIG
    assert obj.read(0, 2)[0] == UNWRITTEN
    assert obj.read(0, 1) == (OK, b"x" * wire.MAX_ENTRY_BYTES)


# ------------------------------------------------------------------ seal


def test_seal_rules(obj: Obj) -> None:
    assert obj.seal(0) == STALE  # not above the initial epoch 0
    assert obj.seal(5) == OK
    assert obj.seal(5) == STALE
    assert obj.seal(4) == STALE
    assert obj.stat()[1] == wire.ObjectStat(5, None, 0)
    # every method refuses an epoch below the sealed one
    assert obj.write(4, 1, b"a") == STALE
    assert obj.read(4, 1)[0] == STALE
    assert obj.fill(4, 1) == STALE
    assert obj.trim(4, 1) == STALE
    assert obj.trim_to(4, 1) == STALE
    assert obj.max_position(4)[0] == STALE
    assert obj.read_range(4, 0, 10)[0] == STALE
    assert obj.write_many(4, [(1, b"a")]) == STALE
    # the sealed epoch and later ones are accepted
    assert obj.write(5, 1, b"a") == OK
    assert obj.write(9, 2, b"b") == OK
    assert obj.seal(6) == OK
    assert obj.read(5, 1)[0] == STALE
    assert obj.read(6, 1) == (OK, b"a")


def test_seal_creates_object(data_io, oid) -> None:  # type: ignore[no-untyped-def]
    obj = Obj(data_io, oid, made=False)
    assert obj.stat()[0] == -errno.ENOENT
    if data_io.data_format:  # only init makes a data-format object (with its geometry)
        assert obj.seal(1) == -errno.ENOENT and obj.stat()[0] == -errno.ENOENT
        assert obj.init(0) == OK
    assert obj.seal(1) == OK
    assert obj.stat() == (OK, wire.ObjectStat(1, None, 0))


# ----------------------------------------------------------- max_position


def test_max_position(obj: Obj) -> None:
    assert obj.seal(1) == OK
    assert obj.max_position(1) == (OK, None)
    assert obj.write(1, 10, b"a") == OK
    assert obj.max_position(1) == (OK, 10)
    assert obj.write(1, 5, b"a") == OK
    assert obj.max_position(1) == (OK, 10)
    assert obj.fill(1, 20) == OK
    assert obj.max_position(1) == (OK, 20)
    assert obj.trim(1, 30) == OK  # a trimmed position counts too: writes above max skip the lookup
    assert obj.max_position(1) == (OK, 30)
    assert obj.write(1, 30, b"a") == -errno.EIDRM
    assert obj.trim(1, 25) == OK  # below max: max stays
    assert obj.max_position(1) == (OK, 30)
    assert obj.write(1, 25, b"a") == -errno.EIDRM
    assert obj.max_position(2) == (OK, 30)  # a later epoch may ask too


# ---------------------------------------------------------------- trim_to


def test_trim_to(obj: Obj) -> None:
    for p in range(0, 20, 2):
        assert obj.write(0, p, b"d%d" % p) == OK
    assert obj.trim_to(0, 9) == OK
    for p in range(0, 10):
        assert obj.read(0, p)[0] == TRIMMED
        assert obj.write(0, p, b"x") == TRIMMED
        assert obj.fill(0, p) == TRIMMED
    assert obj.read(0, 10) == (OK, b"d10")
    assert obj.read(0, 11)[0] == UNWRITTEN
    assert obj.stat()[1] == wire.ObjectStat(0, 18, 10)
    assert obj.trim_to(0, 4) == OK  # lower watermark: no-op
    assert obj.stat()[1] == wire.ObjectStat(0, 18, 10)
    ret, rr = obj.read_range(0, 0, 30)
    assert rr is not None and rr.trim_below == 10
    assert [e.position for e in rr.entries] == [10, 12, 14, 16, 18]
    assert obj.trim_to(0, wire.MAX_POSITION + 1) == EINVAL


def test_trim_to_above_max_raises_max(obj: Obj) -> None:
    """Tail finding reads max: a watermark above the data must show there, or
    trimmed positions would be handed out again."""
    assert obj.write(0, 3, b"x") == OK
    assert obj.trim_to(0, 20) == OK
    assert obj.max_position(0) == (OK, 20)
    assert obj.stat()[1] == wire.ObjectStat(0, 20, 21)
    assert obj.write(0, 21, b"y") == OK


# ------------------------------------------------------------------ close


def test_close_ends_the_view_on_this_object(obj: Obj) -> None:
    assert obj.write(0, 4, b"x") == OK
    assert obj.close(0, 8) == STALE  # only at the epoch the caller sealed
    assert obj.seal(2) == OK
    assert obj.close(1, 8) == STALE and obj.close(3, 8) == STALE
    assert obj.close(2, 4) == EINVAL  # 4 is stored: the end must be above it
    assert obj.close(2, 8) == OK
    assert obj.close(2, 8) == OK  # again, same end: another proposer finishing the job
    assert obj.close(2, 9) == EINVAL  # set once
    assert obj.stat()[1] == wire.ObjectStat(2, 4, 0, 8)
    assert obj.seal(3) == OK and obj.close(3, 8) == OK
    # at or past the end: whatever the epoch, the position belongs to a later view
    for pos in (8, 12, 100):
        assert obj.write(3, pos, b"y") == STALE
        assert obj.write_many(3, [(0, b"a"), (pos, b"b")]) == STALE
        assert obj.fill(3, pos) == STALE
        assert obj.trim(3, pos) == STALE
    assert obj.write(3, 0, b"z") == OK  # below it the object works as before
    assert obj.trim_to(3, 50) == OK
    assert obj.stat()[1] == wire.ObjectStat(3, 7, 51, 8)  # max stays inside the view


def test_close_needs_the_object(obj: Obj) -> None:
    assert obj.close(0, 5) == STALE  # never sealed: not created


# -------------------------------------------------------------- write_many


def test_write_many(obj: Obj) -> None:
    entries = [(p, b"v%d" % p) for p in range(0, 40, 4)]
    assert obj.write_many(0, entries) == OK
    for p, d in entries:
        assert obj.read(0, p) == (OK, d)
    assert obj.max_position(0) == (OK, 36)


def test_write_many_is_all_or_nothing(obj: Obj) -> None:
    assert obj.write(0, 8, b"taken") == OK
    assert obj.fill(0, 9) == OK
    assert obj.write_many(0, [(4, b"a"), (8, b"b"), (12, b"c")]) == WRITTEN
    assert obj.write_many(0, [(4, b"a"), (9, b"b")]) == FILLED
    assert obj.read(0, 4)[0] == UNWRITTEN
    assert obj.read(0, 12)[0] == UNWRITTEN
    assert obj.read(0, 8) == (OK, b"taken")


def test_write_many_bad_batches(data_io, oid) -> None:  # type: ignore[no-untyped-def]
    obj = Obj(data_io, oid, made=False)
    assert obj.write_many(0, []) == EINVAL
    assert obj.write_many(0, [(1, b"a"), (1, b"b")]) == EINVAL
    assert obj.write_many(0, [(p, b"") for p in range(wire.MAX_BATCH_ENTRIES + 1)]) == EINVAL
    assert obj.write_many(0, [(1, b"a"), (2, b"x" * (wire.MAX_ENTRY_BYTES + 1))]) == -errno.EFBIG
    assert obj.read(0, 1)[0] == -errno.ENOENT  # nothing was written, not even the object


# -------------------------------------------------------------- read_range


def test_read_range_states_and_budgets(obj: Obj) -> None:
    for p in range(0, 30, 3):
        assert obj.write(0, p, b"x" * 100) == OK
    assert obj.fill(0, 31) == OK
    assert obj.trim(0, 3) == OK
    ret, rr = obj.read_range(0, 0, 40)
    assert ret == OK and rr is not None
    assert rr.next == 41 and rr.max_position == 31 and rr.trim_below == 0
    states = {e.position: e.state for e in rr.entries}
    assert states[0] == EntryState.WRITTEN and states[3] == EntryState.TRIMMED
    assert states[31] == EntryState.FILLED and len(states) == 11
    # count budget: resumes right after the last entry returned
    ret, rr = obj.read_range(0, 0, 40, max_entries=4)
    assert rr is not None and [e.position for e in rr.entries] == [0, 3, 6, 9] and rr.next == 10
    # byte budget: at least one entry, then stop before going over
    ret, rr = obj.read_range(0, 0, 40, max_bytes=250)
    # (3 is trimmed: no bytes) 0 + 3 + 6 = 200 bytes; 9 would make 300
    assert rr is not None and [e.position for e in rr.entries] == [0, 3, 6] and rr.next == 9
    ret, rr = obj.read_range(0, 1, 1, max_bytes=1)
    assert rr is not None and rr.entries == [] and rr.next == 2
    # a sub-range
    ret, rr = obj.read_range(0, 10, 20)
    assert rr is not None and [e.position for e in rr.entries] == [12, 15, 18] and rr.next == 21


def test_read_range_walks_whole_object(obj: Obj) -> None:
    want = {p: b"%d" % p for p in range(0, 3000, 3)}
    batch = list(want.items())
    for i in range(0, len(batch), 500):
        assert obj.write_many(0, batch[i:i + 500]) == OK
    got: dict[int, bytes] = {}
    first = 0
    while first <= 3000:
        ret, rr = obj.read_range(0, first, 3000, max_entries=128)
        assert ret == OK and rr is not None
        got.update({e.position: e.data for e in rr.entries})
        first = rr.next
    assert got == want


def test_read_range_bad_arguments(obj: Obj) -> None:
    obj.write(0, 1, b"a")
    assert obj.read_range(0, 10, 5)[0] == EINVAL
    assert obj.read_range(0, 0, 5, max_entries=0)[0] == EINVAL
    assert obj.read_range(0, 0, 5, max_entries=wire.MAX_RANGE_ENTRIES + 1)[0] == EINVAL
    assert obj.read_range(0, 0, 5, max_bytes=0)[0] == EINVAL


def test_position_and_epoch_bounds(data_io, oid) -> None:  # type: ignore[no-untyped-def]
    """2^64 - 1 is refused, so max + 1 and last + 1 never overflow."""
    top = 2**64 - 1
    obj = Obj(data_io, oid, made=False)
    if data_io.data_format:  # an object whose last slot is the last position there is
        data_io = type(data_io)(data_io.conn, data_io.pool, data_io.protocol, data_io.fmt, (top - 4, 1, 4, 1 << 20))
        obj = Obj(data_io, oid, made=False)
    assert wire.MAX_POSITION == top - 1
    assert obj.write(0, top, b"x") == EINVAL
    assert obj.write_many(0, [(top, b"x")]) == EINVAL
    assert obj.fill(0, top) == EINVAL
    assert obj.trim(0, top) == EINVAL
    assert obj.trim_to(0, top) == EINVAL
    assert obj.seal(top) == EINVAL
    assert obj.stat()[0] == -errno.ENOENT  # none of that created the object
    if data_io.data_format:
        assert obj.init(0) == OK
    assert obj.write(0, top - 1, b"last") == OK
    assert obj.read(0, top - 1) == (OK, b"last")
    assert obj.read(0, top)[0] == EINVAL
    assert obj.max_position(0) == (OK, top - 1)
    ret, rr = obj.read_range(0, top - 1, top - 1)
    assert rr is not None and [e.position for e in rr.entries] == [top - 1] and rr.next == top
    assert obj.seal(top - 1) == OK


def test_unknown_method(obj: Obj) -> None:
    assert obj.call("no_such_method")[0] == -errno.EOPNOTSUPP


# ---------------------------------------------------------------- metadata


def meta(data_io, oid: str):  # type: ignore[no-untyped-def]
    return Obj(data_io, oid)


def test_meta_create_get(data_io, oid) -> None:  # type: ignore[no-untyped-def]
    m = Obj(data_io, oid, made=False)
    assert m.meta_get()[0] == -errno.ENOENT
    assert m.meta_create(4, b'{"a":1}') == OK
    assert m.meta_create(2, b"") == -errno.EEXIST
    assert m.meta_get() == (OK, wire.Meta(1, b'{"a":1}', (wire.View(1, 0, 4),)))
    assert m.meta_create(0, b"") == EINVAL
    assert Obj(data_io, oid + "x", made=False).meta_create(wire.MAX_WIDTH + 1, b"") == EINVAL


def test_meta_epoch_cas(data_io, oid) -> None:  # type: ignore[no-untyped-def]
    m = Obj(data_io, oid, made=False)
    assert m.meta_new_epoch(1, 2) == -errno.ENOENT
    m.meta_create(1, b"")
    assert m.meta_new_epoch(1, 2) == OK
    assert m.meta_new_epoch(1, 3) == -errno.ECANCELED
    assert m.meta_new_epoch(2, 2) == EINVAL
    assert m.meta_new_epoch(2, 7) == OK
    assert m.meta_get()[1].epoch == 7


def test_meta_propose_view(data_io, oid) -> None:  # type: ignore[no-untyped-def]
    m = Obj(data_io, oid, made=False)
    m.meta_create(2, b"")
    assert m.meta_propose_view(1, 2, 100, 8) == OK
    assert m.meta_propose_view(1, 3, 200, 8) == -errno.ECANCELED
    assert m.meta_propose_view(2, 3, 50, 8) == EINVAL  # start moves back
    assert m.meta_propose_view(2, 3, 200, 0) == EINVAL
    got = m.meta_get()[1]
    assert got.epoch == 2 and got.views == (wire.View(1, 0, 2), wire.View(2, 100, 8))


def test_meta_records_the_sequencer_taking_over(data_io, oid) -> None:  # type: ignore[no-untyped-def]
    m = Obj(data_io, oid, made=False)
    m.meta_create(2, b"{}")
    assert m.meta_get()[1].sequencer == ""
    assert m.meta_new_epoch(1, 2, "10.0.0.1:5678") == OK
    got = m.meta_get()[1]
    assert (got.epoch, got.sequencer, got.sequencer_epoch) == (2, "10.0.0.1:5678", 2)
    # an epoch change without a sequencer (slow tail finding, a repair) keeps it
    assert m.meta_new_epoch(2, 3) == OK
    assert m.meta_propose_view(3, 4, 10, 3) == OK
    got = m.meta_get()[1]
    assert (got.epoch, got.sequencer, got.sequencer_epoch) == (4, "10.0.0.1:5678", 2)
    assert got.views == (wire.View(1, 0, 2), wire.View(4, 10, 3))
    # a take-over through a view change; a lost CAS changes nothing
    assert m.meta_propose_view(4, 5, 20, 3, "b:1") == OK
    assert m.meta_new_epoch(4, 6, "c:1") == -errno.ECANCELED
    got = m.meta_get()[1]
    assert (got.epoch, got.sequencer, got.sequencer_epoch) == (5, "b:1", 5)
    assert m.meta_new_epoch(5, 6, "x" * 256) == EINVAL
    assert m.meta_get()[1].epoch == 5
    if m.protocol == 1:
        assert m.meta_new_epoch(5, 6, "") == EINVAL  # an empty address
    else:  # protocol 2 always has the field: length 0 says "no sequencer", which keeps the recorded one
        assert m.meta_new_epoch(5, 6, "") == OK
        got = m.meta_get()[1]
        assert (got.epoch, got.sequencer, got.sequencer_epoch) == (6, "b:1", 5)


def test_meta_two_proposers_one_wins(data_io, oid) -> None:  # type: ignore[no-untyped-def]
    m = Obj(data_io, oid, made=False)
    m.meta_create(2, b"")
    for round_ in range(10):
        expected = m.meta_get()[1].epoch
        results: dict[int, int] = {}
        barrier = threading.Barrier(2)

        def propose(width: int) -> None:
            barrier.wait()
            results[width] = m.meta_propose_view(expected, expected + 1, 1000 * (round_ + 1), width)

        ts = [threading.Thread(target=propose, args=(w,)) for w in (3, 5)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert sorted(results.values()) == [-errno.ECANCELED, OK]
        winner = next(w for w, r in results.items() if r == OK)
        got = m.meta_get()[1]
        assert got.epoch == expected + 1 and got.views[-1] == wire.View(expected + 1, 1000 * (round_ + 1), winner)
        assert len(got.views) == round_ + 2
