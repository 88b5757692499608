"""cls_zlog on damaged objects (issue 28, issue 24's corrupt entries), both
formats and both protocols: an object that holds entries but has lost its
header (missing, empty or unparsable) is corrupt, never new: every method
answers EIO and changes nothing (every byte of the object, its omap and its
mtime are the same after the call). The same for a metadata object whose
bytes do not parse. A damaged entry (an omap value cut short, a slot
overwritten, a data object truncated) is EIO too, never garbage. `repair`
rebuilds a lost header, and only that."""
from __future__ import annotations

import errno
from collections.abc import Callable

import pytest

import damage
from clsobj import CORRUPT, OK, STALE, WRITTEN, Obj, Raw
from pyzlog.core import wire
from pyzlog.core.native import Connection, Op

EXISTS = -errno.EEXIST
NOENT = -errno.ENOENT


def data_methods(o: Obj) -> dict[str, Callable[[], int]]:
    """Every data-object method, with arguments it would succeed with on a
    sound object (epoch 9 is above the seal)."""
    calls: dict[str, Callable[[], int]] = {
        "write": lambda: o.write(9, 7, b"new"),
        "write over an entry": lambda: o.write(9, 1, b"new"),
        "write at an old epoch": lambda: o.write(0, 1, b"new"),
        "write_many": lambda: o.write_many(9, [(7, b"a"), (8, b"b")]),
        "read": lambda: o.read(9, 1)[0],
        "read_range": lambda: o.read_range(9, 0, 10)[0],
        "fill": lambda: o.fill(9, 7),
        "trim": lambda: o.trim(9, 1),
        "trim_to": lambda: o.trim_to(9, 1),
        "seal": lambda: o.seal(9),
        "close": lambda: o.close(3, 100),
        "max_position": lambda: o.max_position(9)[0],
        "stat": lambda: o.stat()[0],
    }
    if o.io.data_format:  # (init on an omap-format object is EINVAL: another format's)
        calls["init"] = lambda: o.init(9)
    return calls


def with_entries(raw: Raw, oid: str) -> Obj:
    o = Obj(raw, oid)
    for pos in range(3):
        assert o.write(1, pos, b"orig%d" % pos) == OK
    assert o.seal(3) == OK
    return o


@pytest.fixture
def io(rados_cluster, ceph):  # type: ignore[no-untyped-def]
    io = damage.ioctx(rados_cluster, ceph.pool)
    yield io
    io.close()


def repair(o: Obj, epoch: int, trim_below: int = 0, end: int | None = None) -> int:
    """The repair class method (protocol 2 only) with the test geometry."""
    base, width, slots, byte_bound = o.io.geometry
    p2 = Obj(Raw(o.io.conn, o.io.pool, wire.PROTOCOL, o.io.fmt, o.io.geometry), o.oid, made=False)
    return p2.op(Op.REPAIR, epoch=epoch, position=end or 0, reason=0 if end is None else 1, start=trim_below,
                 last=base, width=width, slots=slots, byte_bound=byte_bound, format=o.io.fmt)[0]


@pytest.mark.parametrize("garble", [False, True], ids=["header-lost", "header-unparsable"])
def test_every_method_refuses_an_object_whose_header_is_lost(data_io: Raw, oid: str, io, ceph,  # type: ignore[no-untyped-def]
                                                             garble: bool) -> None:
    o = with_entries(data_io, oid)
    damage.lose_header(ceph.conf, io, oid, data_io.data_format, garble)
    before = damage.snapshot(io, oid)
    for name, call in data_methods(o).items():
        assert call() == CORRUPT, name
        assert damage.snapshot(io, oid) == before, f"{name} changed the damaged object"


def test_an_object_that_holds_nothing_is_new_without_its_header(rados_cluster, ceph, oid: str, io) -> None:  # type: ignore[no-untyped-def]
    conn = Connection.of(rados_cluster)
    o = Obj(Raw(conn, conn.pool(ceph.pool), wire.PROTOCOL), oid)
    assert o.seal(4) == OK  # a header and nothing else
    damage.lose_header(ceph.conf, io, oid, False)
    assert o.stat()[1] == wire.ObjectStat(0, None, 0, None)  # the initial state
    assert o.write(0, 0, b"x") == OK
    assert repair(o, 4) == EXISTS


def test_a_damaged_omap_entry_is_corrupt_and_only_it(rados_cluster, ceph, oid: str, io) -> None:  # type: ignore[no-untyped-def]
    conn = Connection.of(rados_cluster)
    o = with_entries(Raw(conn, conn.pool(ceph.pool), wire.PROTOCOL), oid)
    with damage.rados.WriteOpCtx() as op:  # position 1's value cut short: a state byte and half an epoch
        io.set_omap(op, ("%016x" % 1,), (b"\x01\x03\x00",))
        io.operate_write_op(op, oid)
    before = damage.snapshot(io, oid)
    assert o.read(3, 1)[0] == CORRUPT
    assert o.read(3, 0) == (OK, b"orig0") and o.read(3, 2) == (OK, b"orig2")
    assert o.read_range(3, 0, 10)[0] == CORRUPT
    assert o.read_range(3, 0, 0)[0] == OK and o.read_range(3, 2, 10)[0] == OK
    assert o.write(3, 1, b"new") == CORRUPT  # write-once holds: its state cannot be told
    assert o.fill(3, 1) == CORRUPT
    assert damage.snapshot(io, oid) == before
    assert o.stat()[0] == OK  # the object itself is sound


def test_a_damaged_slot_is_corrupt_and_only_it(rados_cluster, ceph, oid: str, io) -> None:  # type: ignore[no-untyped-def]
    conn = Connection.of(rados_cluster)
    o = with_entries(Raw(conn, conn.pool(ceph.pool), wire.PROTOCOL, wire.FORMAT_DATA), oid)
    # position 1's slot overwritten: its entry would lie past the object's data
    io.write(oid, b"\x01" * 8 + b"\xff\xff\x00\x00" + b"\x05\x00\x00\x10", damage.DATA_HEADER + damage.SLOT)
    # position 5's slot: garbage where nothing was written
    io.write(oid, b"\x07" * damage.SLOT, damage.DATA_HEADER + 5 * damage.SLOT)
    before = damage.snapshot(io, oid)
    assert o.read(3, 1)[0] == CORRUPT and o.read(3, 5)[0] == CORRUPT
    assert o.write(3, 1, b"new") == CORRUPT  # write-once holds: its state cannot be told
    assert o.read(3, 0) == (OK, b"orig0") and o.read(3, 2) == (OK, b"orig2")
    assert o.read_range(3, 0, 10)[0] == CORRUPT
    assert o.read_range(3, 2, 4)[0] == OK
    assert damage.snapshot(io, oid) == before
    # above the header's max nothing acknowledged can lie: a write takes the slot
    assert o.write(3, 5, b"new") == OK and o.read(3, 5) == (OK, b"new")


def test_a_truncated_data_object_is_corrupt(rados_cluster, ceph, oid: str, io) -> None:  # type: ignore[no-untyped-def]
    conn = Connection.of(rados_cluster)
    o = with_entries(Raw(conn, conn.pool(ceph.pool), wire.PROTOCOL, wire.FORMAT_DATA), oid)
    size = io.stat(oid)[0]
    io.trunc(oid, size - 3)  # the last entry's bytes cut short
    before = damage.snapshot(io, oid)
    for name, call in data_methods(o).items():
        assert call() == CORRUPT, name
    assert damage.snapshot(io, oid) == before
    assert repair(o, 3) == CORRUPT  # its header is sound: what is lost cannot be rebuilt


@pytest.mark.parametrize("how", ["empty", "garbage", "truncated"])
def test_every_metadata_method_refuses_a_damaged_metadata_object(rados_cluster, ceph, oid: str, io,  # type: ignore[no-untyped-def]
                                                                 how: str) -> None:
    conn = Connection.of(rados_cluster)
    o = Obj(Raw(conn, conn.pool(ceph.pool), wire.PROTOCOL), oid)
    assert o.meta_create(2, b"{}") == OK
    raw = io.read(oid)
    if how == "empty":
        io.write_full(oid, b"")
    elif how == "garbage":
        io.write_full(oid, b"\x09" + raw[1:])
    else:
        io.trunc(oid, len(raw) - 4)
    before = damage.snapshot(io, oid)
    calls = {
        "meta_create": lambda: o.meta_create(2, b"{}"),
        "meta_get": lambda: o.meta_get()[0],
        "meta_new_epoch": lambda: o.meta_new_epoch(1, 2),
        "meta_propose_view": lambda: o.meta_propose_view(1, 2, 10, 4),
        "meta_open_stripe": lambda: o.op(Op.META_OPEN_STRIPE, expected=1, stripe=1)[0],
        "meta_trim": lambda: o.op(Op.META_TRIM, position=5)[0],
    }
    for name, call in calls.items():
        assert call() == CORRUPT, name
        assert damage.snapshot(io, oid) == before, f"{name} changed the damaged metadata"


def test_repair_rebuilds_a_lost_header_and_only_then(data_io: Raw, oid: str, io, ceph) -> None:  # type: ignore[no-untyped-def]
    o = with_entries(data_io, oid)
    assert o.trim(3, 0) == OK
    sound = o.stat()[1]
    assert repair(o, 3) == EXISTS  # a usable header: nothing to do
    damage.lose_header(ceph.conf, io, oid, data_io.data_format)
    assert repair(o, 5, end=100) == OK  # the log's metadata: epoch 5 now, the view ends at 100
    assert o.stat()[1] == wire.ObjectStat(5, sound.max_position, 0, 100)
    assert o.read(5, 1) == (OK, b"orig1") and o.read(5, 2) == (OK, b"orig2")
    assert o.read(5, 0)[0] == -errno.EIDRM
    assert o.write(5, 1, b"new") == WRITTEN  # write-once holds again
    assert o.write(3, 3, b"old epoch") == STALE  # and the seal
    assert o.write(5, 100, b"next view") == STALE  # and the view's end
    assert o.write(5, 3, b"orig3") == OK
    assert repair(o, 5) == EXISTS
    if data_io.data_format:
        assert o.counts() == (3, 15)  # orig1..3 (orig0 was trimmed)


def test_repair_refuses_when_entries_are_damaged_too(rados_cluster, ceph, oid: str, io) -> None:  # type: ignore[no-untyped-def]
    conn = Connection.of(rados_cluster)
    for fmt in (wire.FORMAT_OMAP, wire.FORMAT_DATA):
        name = f"{oid}.{fmt}"
        o = with_entries(Raw(conn, conn.pool(ceph.pool), wire.PROTOCOL, fmt), name)
        if fmt == wire.FORMAT_DATA:
            io.write(name, b"\x07" * damage.SLOT, damage.DATA_HEADER + 5 * damage.SLOT)
        else:
            with damage.rados.WriteOpCtx() as op:
                io.set_omap(op, ("%016x" % 5,), (b"\x09",))
                io.operate_write_op(op, name)
        damage.lose_header(ceph.conf, io, name, fmt == wire.FORMAT_DATA)
        before = damage.snapshot(io, name)
        assert repair(o, 3) == CORRUPT
        assert repair(o, 3, end=2) in (CORRUPT, -errno.EINVAL)
        assert damage.snapshot(io, name) == before
    assert repair(Obj(Raw(conn, conn.pool(ceph.pool), wire.PROTOCOL), f"{oid}.none", made=False), 1) == NOENT


def test_repair_refuses_entries_past_the_views_end(data_io: Raw, oid: str, io, ceph) -> None:  # type: ignore[no-untyped-def]
    o = with_entries(data_io, oid)
    damage.lose_header(ceph.conf, io, oid, data_io.data_format)
    before = damage.snapshot(io, oid)
    assert repair(o, 3, end=2) == -errno.EINVAL  # position 2 is stored: the view cannot end before it
    assert damage.snapshot(io, oid) == before
