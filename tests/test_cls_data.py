"""cls_zlog's data format (ZLOG_FORMAT_DATA) where it differs from the omap
one: objects made by init with their geometry, positions held by slot, the
byte bound (a full object's unwritten positions are filled), space given
back by trim_to, the counts in stat; and the metadata of data-format logs
(open stripes, the trim point, the stripe count in a compare-and-swap).
The rules both formats share are in test_cls_zlog.py and test_cls_model.py."""
from __future__ import annotations

import errno

import pytest

from clsobj import EINVAL, FILLED, NOENT, OK, STALE, TRIMMED, WRITTEN, Obj, Raw
from pyzlog.core import wire
from pyzlog.core.native import Connection, Op

CAS_LOST = -errno.ECANCELED


@pytest.fixture
def raw(rados_cluster, ceph) -> Raw:  # type: ignore[no-untyped-def]
    conn = Connection.of(rados_cluster)
    return Raw(conn, conn.pool(ceph.pool), wire.PROTOCOL, wire.FORMAT_DATA)


def made(raw: Raw, oid: str, base: int = 0, width: int = 1, slots: int = 4096, byte_bound: int = 32 << 20,
         epoch: int = 0) -> Obj:
    o = Obj(raw, oid, made=False)
    assert o.init(epoch, (base, width, slots, byte_bound)) == OK
    return o


def size_of(rados_cluster, ceph, oid: str) -> int:  # type: ignore[no-untyped-def]
    io = rados_cluster.open_ioctx(ceph.pool)
    try:
        return int(io.stat(oid)[0])
    finally:
        io.close()


def test_only_init_makes_an_object(raw: Raw, oid: str) -> None:
    o = Obj(raw, oid, made=False)
    # no write, fill, trim or seal makes a data-format object: it would have no geometry
    assert o.write(0, 0, b"x") == NOENT
    assert o.fill(0, 0) == NOENT
    assert o.trim(0, 0) == NOENT
    assert o.seal(1) == NOENT
    assert o.stat()[0] == NOENT
    assert o.init(3, (0, 1, 16, 1 << 24)) == OK
    assert o.stat()[1] == wire.ObjectStat(3, None, 0, None)  # made sealed at the init's epoch
    assert o.write(2, 0, b"x") == STALE
    assert o.write(3, 0, b"x") == OK
    # init again: the same geometry leaves it as it is, another one is refused
    assert o.init(1, (0, 1, 16, 1 << 24)) == OK
    assert o.read(3, 0) == (OK, b"x")
    assert o.init(3, (0, 1, 32, 1 << 24)) == EINVAL
    assert o.init(3, (1, 1, 16, 1 << 24)) == EINVAL


@pytest.mark.parametrize("geometry", [(0, 0, 16, 1 << 20), (0, 1, 0, 1 << 20), (0, 1, 16, 0),
                                      (0, 1, (1 << 22) + 1, 1 << 20), (0, 1, 16, (1 << 31) + 1),
                                      (wire.MAX_POSITION + 1, 1, 16, 1 << 20),
                                      (0, 2, 16, 1 << 20, 3), (0, 2, 1 << 17, 1 << 20, (1 << 16) + 1)])
def test_init_refuses_a_bad_geometry(raw: Raw, oid: str, geometry: tuple[int, ...]) -> None:
    """Out of range, and (with a unit) slots that are not whole runs or a unit over 65536."""
    assert Obj(raw, oid, made=False).init(1, geometry) == EINVAL


def test_an_object_holds_its_slots_only(raw: Raw, oid: str) -> None:
    # positions 10, 13, 16, 19 (base 10, width 3, 4 slots)
    o = made(raw, oid, base=10, width=3, slots=4)
    for pos in (10, 13, 16, 19):
        assert o.write(0, pos, b"%d" % pos) == OK
    for pos in (7, 11, 12, 22, 25):  # below base, another object's, past the last slot
        assert o.write(0, pos, b"x") == EINVAL
        assert o.fill(0, pos) == EINVAL
        assert o.read(0, pos)[0] == EINVAL
    assert o.write_many(0, [(22, b"a")]) == EINVAL
    ret, rng = o.read_range(0, 0, 100)
    assert ret == OK and rng is not None
    assert [(e.position, e.data) for e in rng.entries] == [(p, b"%d" % p) for p in (10, 13, 16, 19)]
    assert o.max_position(0) == (OK, 19)


def test_an_object_of_a_stripe_in_runs_holds_its_runs_only(rados_cluster, ceph, raw: Raw,  # type: ignore[no-untyped-def]
                                                           oid: str) -> None:
    """Object 1 of a stripe from 100 over width 3 in runs of 4, 12 slots: it
    holds 104..107, 116..119 and 128..131 (cls_zlog/ops.h, "layout"); a
    range read lists exactly those, cut anywhere, even with bounds in the
    other objects' runs; its header says unit 4 in a version that a class
    without runs refuses (it would put positions in the wrong slots)."""
    own = [104, 105, 106, 107, 116, 117, 118, 119, 128, 129, 130, 131]
    o = Obj(raw, oid, made=False)
    assert o.init(0, (104, 3, 12, 1 << 20, 4)) == OK
    assert o.init(0, (104, 3, 12, 1 << 20, 4)) == OK and o.init(0, (104, 3, 12, 1 << 20, 2)) == EINVAL
    assert o.init(0, (104, 3, 12, 1 << 20)) == EINVAL  # unit 1 is another geometry
    assert o.write_many(0, [(p, b"%d" % p) for p in own[:5]]) == OK  # one run and the next's first
    for p in own[5:]:
        assert o.write(0, p, b"%d" % p) == OK
    for pos in (100, 103, 108, 115, 120, 127, 132, 140):  # other objects' runs, and past its last slot
        assert o.write(0, pos, b"x") == EINVAL
        assert o.read(0, pos)[0] == EINVAL
    assert o.write_many(0, [(108, b"a")]) == EINVAL
    assert [e.position for e in o.read_range(0, 0, 1000)[1].entries] == own  # type: ignore[union-attr]
    for first in range(100, 133):
        for last in (first, first + 3, first + 9, 140):
            ret, rng = o.read_range(0, first, last)
            assert ret == OK and rng is not None
            assert [(e.position, e.data) for e in rng.entries] == [(p, b"%d" % p) for p in own if first <= p <= last]
    ret, rng = o.read_range(0, 100, 140, max_entries=5)
    assert ret == OK and rng is not None and [e.position for e in rng.entries] == own[:5] and rng.next == 117
    assert o.max_position(0) == (OK, 131)
    assert o.trim_to(0, 117) == OK
    assert [e.position for e in o.read_range(0, 0, 1000)[1].entries] == own[6:]  # type: ignore[union-attr]
    io = rados_cluster.open_ioctx(ceph.pool)
    try:
        header = io.read(oid, 128, 0)
    finally:
        io.close()
    assert header[:5] == b"ZLG3\x04" and int.from_bytes(header[88:92], "little") == 4


def test_a_full_object_takes_nothing_more_and_its_unwritten_positions_are_filled(raw: Raw, oid: str) -> None:
    o = made(raw, oid, slots=64, byte_bound=3000)
    assert o.write(0, 0, b"a" * 1000) == OK
    assert o.write(0, 5, b"b" * 1000) == OK
    assert o.fill(0, 6) == OK
    # the write that crosses the bound is stored whole
    assert o.write_many(0, [(7, b"c" * 800), (8, b"d" * 800)]) == OK
    assert o.counts() == (4, 3600)
    # full now: every unwritten position reads as filled, is refused as filled
    for pos in (1, 4, 9, 63):
        assert o.read(0, pos)[0] == FILLED
        assert o.write(0, pos, b"x") == FILLED
    assert o.write_many(0, [(9, b"x"), (10, b"y")]) == FILLED
    assert o.write(0, 0, b"again") == WRITTEN  # the written ones say so, as before
    assert o.read(0, 8) == (OK, b"d" * 800)
    # a reader filling a hole there: a junk fill succeeds (it is filled), a lost one is told it is filled
    assert o.fill(0, 2) == OK
    assert o.fill(0, 3, wire.FILL_LOST) == FILLED
    assert o.max_position(0) == (OK, 8)  # filled by the bound is not stored: the max stays
    ret, rng = o.read_range(0, 0, 12)
    assert ret == OK and rng is not None
    states = {e.position: e.state for e in rng.entries}
    assert [states[p] for p in range(13)] == [
        wire.EntryState.WRITTEN, *[wire.EntryState.FILLED] * 4, wire.EntryState.WRITTEN,
        wire.EntryState.FILLED, wire.EntryState.WRITTEN, wire.EntryState.WRITTEN, *[wire.EntryState.FILLED] * 4]
    # the synthetic fills count towards max_entries like any entry
    ret, rng = o.read_range(0, 9, 63, max_entries=10)
    assert ret == OK and rng is not None
    assert [e.position for e in rng.entries] == list(range(9, 19)) and rng.next == 19
    assert o.trim(0, 20) == OK
    assert o.read(0, 20)[0] == TRIMMED


def test_trim_to_gives_the_space_back(rados_cluster, ceph, raw: Raw, oid: str) -> None:  # type: ignore[no-untyped-def]
    o = made(raw, oid, slots=1024)
    assert o.write_many(0, [(p, b"x" * 4000) for p in range(512)]) == OK
    full_size = size_of(rados_cluster, ceph, oid)
    assert full_size > 512 * 4000 and o.counts() == (512, 512 * 4000)
    assert o.trim_to(0, 99) == OK  # part of it: the bytes stay until the object is wholly trimmed
    assert o.read(0, 99)[0] == TRIMMED and o.read(0, 100) == (OK, b"x" * 4000)
    assert o.trim_to(0, 1023) == OK  # every slot
    assert size_of(rados_cluster, ceph, oid) < 128 * 1024  # the header and index at most
    assert o.counts() == (0, 0)
    for pos in (0, 511, 1023):
        assert o.read(0, pos)[0] == TRIMMED
        assert o.write(0, pos, b"y") == TRIMMED
    assert o.stat()[1] == wire.ObjectStat(0, 1023, 1024, None)


def test_stat_counts_what_the_object_holds(raw: Raw, oid: str) -> None:
    o = made(raw, oid)
    assert o.counts() == (0, 0)
    assert o.write(0, 0, b"12345") == OK
    assert o.write_many(0, [(1, b"ab"), (2, b"")]) == OK
    assert o.fill(0, 3) == OK
    assert o.counts() == (3, 7)  # written entries and their bytes (a fill stores none)
    assert o.trim(0, 0) == OK
    assert o.counts() == (2, 2)
    ret, st = o.full_stat()
    assert ret == OK and st is not None and st.format == wire.FORMAT_DATA


# ------------------------------------------------------------------ metadata
def meta_obj(raw: Raw, oid: str, slots: int = 16, byte_bound: int = 1 << 24) -> Obj:
    o = Obj(raw, oid, made=False)
    ret, _ = o.op(Op.META_CREATE, width=2, data=b"{}", format=wire.FORMAT_DATA, slots=slots,
                  byte_bound=byte_bound)
    assert ret == OK
    return o


def open_stripe(o: Obj, expected: int, stripe: int) -> int:
    return o.op(Op.META_OPEN_STRIPE, expected=expected, stripe=stripe)[0]


def test_a_data_format_log_records_its_geometry(raw: Raw, oid: str) -> None:
    o = meta_obj(raw, oid)
    ret, meta = o.meta_get()
    assert ret == OK and meta is not None
    assert meta.views == (wire.View(1, 0, 2, wire.FORMAT_DATA, 16, 1 << 24, 0),)
    assert meta.trim_below == 0
    # a bad geometry is refused
    bad = Obj(raw, oid + ".bad", made=False)
    assert bad.op(Op.META_CREATE, width=2, data=b"", format=wire.FORMAT_DATA, slots=0, byte_bound=1)[0] == EINVAL


def test_open_stripe_is_a_compare_and_swap_on_the_epoch(raw: Raw, oid: str) -> None:
    o = meta_obj(raw, oid)
    assert open_stripe(o, 1, 0) == OK
    assert open_stripe(o, 1, 3) == OK  # stripes 0..3 are open (objects come with init)
    assert open_stripe(o, 1, 1) == OK  # open already
    assert open_stripe(o, 2, 4) == CAS_LOST  # a client at another epoch opens nothing
    assert open_stripe(o, 1, 2**32 - 1) == EINVAL
    assert o.meta_get()[1].views[-1].stripes == 4  # type: ignore[union-attr]
    # an epoch change that expects another stripe count loses
    assert o.op(Op.META_NEW_EPOCH, expected=1, next_epoch=2, expected_stripes=3)[0] == CAS_LOST
    assert o.op(Op.META_NEW_EPOCH, expected=1, next_epoch=2, expected_stripes=4)[0] == OK
    assert open_stripe(o, 1, 4) == CAS_LOST
    # a new view of the log starts with no stripe open, in the geometry it is given
    assert o.op(Op.META_PROPOSE_VIEW, expected=2, next_epoch=3, start=100, width=3, format=wire.FORMAT_DATA,
                slots=8, byte_bound=1 << 20, expected_stripes=4)[0] == OK
    views = o.meta_get()[1].views  # type: ignore[union-attr]
    assert views[-1] == wire.View(3, 100, 3, wire.FORMAT_DATA, 8, 1 << 20, 0)
    assert views[0].stripes == 4


def test_open_stripe_needs_a_data_format_view(raw: Raw, oid: str) -> None:
    o = Obj(raw, oid, made=False)
    assert o.meta_create(1, b"") == OK  # omap
    assert open_stripe(o, 1, 0) == EINVAL


def test_the_log_trim_point_only_rises(raw: Raw, oid: str) -> None:
    o = meta_obj(raw, oid)
    assert o.op(Op.META_TRIM, position=99)[0] == OK
    assert o.meta_get()[1].trim_below == 100  # type: ignore[union-attr]
    assert o.op(Op.META_TRIM, position=10)[0] == OK
    assert o.meta_get()[1].trim_below == 100  # type: ignore[union-attr]
    assert o.op(Op.META_TRIM, position=wire.MAX_POSITION + 1)[0] == EINVAL
    assert Obj(raw, oid + ".none", made=False).op(Op.META_TRIM, position=1)[0] == NOENT
