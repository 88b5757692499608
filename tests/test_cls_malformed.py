"""cls_zlog given bad input, method by method, in both protocols.

Every method parses its request before touching the object and refuses
anything that does not parse with EINVAL. Protocol 1 (round 2's clients)
must parse exactly; its requests are built here by hand, with struct, as an
independent statement of what those clients send. Protocol 2 wraps the same
fields in an envelope (u8 struct_v, u8 compat_v, u32 length): bytes after
the envelope are refused, a body that ends early is refused, a body longer
than the fields this class knows is a newer client's and is accepted, and
an envelope that needs a newer decoder is refused with EPROTONOSUPPORT.

Here: the empty buffer, every truncation of a valid request, trailing
garbage, length fields that claim more bytes than are present
(deterministic), then random and mutated byte strings (hypothesis). After
every refused call the object is byte-for-byte what it was. Last, the OSD
still serves ordinary calls.
"""
from __future__ import annotations

import errno
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pyzlog.core import native, wire
from pyzlog.core.native import Op

from clsobj import Obj, Raw

OK = 0
EINVAL = -errno.EINVAL
NOENT = -errno.ENOENT
TOO_NEW = -errno.EPROTONOSUPPORT

SEALED = 3  # the populated data object's sealed epoch
U64_MAX = (1 << 64) - 1

DATA_OPS = ["write", "write_many", "read", "read_range", "fill", "trim", "trim_to", "seal", "close",
            "max_position", "stat"]
META_OPS = ["meta_create", "meta_get", "meta_new_epoch", "meta_propose_view"]
OPS = DATA_OPS + META_OPS
# Registered CLS_METHOD_RD only: on a missing object the OSD answers ENOENT
# without running the class; they never change the object.
READ_ONLY = {"read", "read_range", "max_position", "stat", "meta_get"}


# ------------------------------------------------------- protocol 1, by hand
def v1_write(epoch: int, pos: int, data: bytes) -> bytes:
    return struct.pack("<QQI", epoch, pos, len(data)) + data


def v1_write_many(epoch: int, entries: list[tuple[int, bytes]]) -> bytes:
    return struct.pack("<QI", epoch, len(entries)) + b"".join(struct.pack("<QI", p, len(d)) + d for p, d in entries)


def v1_ep(epoch: int, pos: int) -> bytes:
    return struct.pack("<QQ", epoch, pos)


def v1_range(epoch: int, first: int, last: int, n: int, nbytes: int) -> bytes:
    return struct.pack("<QQQII", epoch, first, last, n, nbytes)


def v1_meta_create(width: int, config: bytes) -> bytes:
    return struct.pack("<II", width, len(config)) + config


def v1_seqr(s: str | None) -> bytes:
    return b"" if s is None else struct.pack("<I", len(s)) + s.encode()


def v1_new_epoch(expected: int, new: int, seqr: str | None = None) -> bytes:
    return struct.pack("<QQ", expected, new) + v1_seqr(seqr)


def v1_propose(expected: int, new: int, start: int, width: int, seqr: str | None = None) -> bytes:
    return struct.pack("<QQQI", expected, new, start, width) + v1_seqr(seqr)


# A valid request per method, each accepted (0) by a fresh populated object
# (test_valid_requests_are_accepted), so their truncations are truncations of
# real requests.
VALID1: dict[str, bytes] = {
    "write": v1_write(7, 20, b"hello"),
    "write_many": v1_write_many(7, [(21, b"ab"), (22, b"")]),
    "read": v1_ep(7, 5),
    "read_range": v1_range(7, 0, 100, 16, 4096),
    "fill": struct.pack("<QQB", 7, 23, 0),
    "trim": v1_ep(7, 6),
    "trim_to": v1_ep(7, 3),
    "seal": struct.pack("<Q", 9),
    "close": v1_ep(SEALED, 1000),
    "max_position": struct.pack("<Q", 7),
    "stat": b"",
    "meta_create": v1_meta_create(4, b'{"x":1}'),
    "meta_get": b"",
    "meta_new_epoch": v1_new_epoch(1, 2),
    "meta_propose_view": v1_propose(1, 2, 10, 4),
}


def envelope(body: bytes, v: int = 2, compat: int = 1) -> bytes:
    return struct.pack("<BBI", v, compat, len(body)) + body


ANY_STRIPES = 0xFFFFFFFF
OMAP = struct.pack("<B", 1)
#: the fields struct_v 2 appended to each op (ops.h, zlog_req_fields_v2), at their defaults
V2_FIELDS = {
    "meta_create": OMAP + struct.pack("<IQ", 0, 0),
    "meta_get": b"",
    "meta_new_epoch": struct.pack("<I", ANY_STRIPES),
    "meta_propose_view": OMAP + struct.pack("<IQI", 0, 0, ANY_STRIPES),
}


def body1(op: str) -> bytes:
    """Protocol 2's body of VALID1[op] at struct_v 1: the same fields, and the
    sequencer field always present (length 0: none)."""
    if op in ("meta_new_epoch", "meta_propose_view"):
        return VALID1[op] + struct.pack("<I", 0)
    return VALID1[op]


def body2(op: str) -> bytes:
    """... and at struct_v 2: with the fields it appended (the data ops' format)."""
    return body1(op) + V2_FIELDS.get(op, OMAP)


VALID2 = {op: envelope(body2(op)) for op in OPS}
#: what struct_v 3 appended: a data-format geometry's unit (ops.h, zlog_req_fields_v3), at its default
V3_FIELDS = {"meta_create": struct.pack("<I", 1), "meta_propose_view": struct.pack("<I", 1)}
#: what this build's encoder sends (struct_v 3); the class is asked VALID2, an older client's
VALID3 = {op: envelope(body2(op) + V3_FIELDS.get(op, b""), 3) for op in OPS}


def test_protocol_2_is_protocol_1_in_an_envelope() -> None:
    """The data plane's encoder (ops.h) agrees with the bytes built by hand."""
    fields = {
        "write": (Op.WRITE, {"epoch": 7, "position": 20, "data": b"hello"}),
        "write_many": (Op.WRITE_MANY, {"epoch": 7, "entries": [(21, b"ab"), (22, b"")]}),
        "read_range": (Op.READ_RANGE, {"epoch": 7, "position": 0, "last": 100, "max_entries": 16,
                                       "max_bytes": 4096}),
        "meta_new_epoch": (Op.META_NEW_EPOCH, {"expected": 1, "next_epoch": 2}),
        "meta_propose_view": (Op.META_PROPOSE_VIEW, {"expected": 1, "next_epoch": 2, "start": 10, "width": 4}),
        "stat": (Op.STAT, {}),
    }
    for name, (op, f) in fields.items():
        assert native.encode(op, 1, **f) == VALID1[name], name
        assert native.encode(op, 2, **f) == VALID3[name], name
        assert native.method(op, 1) == name and native.method(op, 2) == name + "2"


# Every code a method may return for a request that parses (besides EINVAL).
DEFINED: dict[str, set[int]] = {
    "write": {OK, -errno.EFBIG, -errno.ESTALE, -errno.EROFS, -errno.ENOMSG, -errno.EIDRM},
    "write_many": {OK, -errno.EFBIG, -errno.ESTALE, -errno.EROFS, -errno.ENOMSG, -errno.EIDRM},
    "read": {OK, -errno.ESTALE, -errno.ENODATA, -errno.ENOMSG, -errno.EIDRM},
    "read_range": {OK, -errno.ESTALE},
    "fill": {OK, -errno.ESTALE, -errno.EROFS, -errno.ENOMSG, -errno.EIDRM},
    "trim": {OK, -errno.ESTALE},
    "trim_to": {OK, -errno.ESTALE},
    "seal": {OK, -errno.ESTALE},
    "close": {OK, -errno.ESTALE},
    "max_position": {OK, -errno.ESTALE},
    "stat": {OK},
    "meta_create": {-errno.EEXIST},  # the metadata object exists
    "meta_get": {OK},
    "meta_new_epoch": {OK, -errno.ECANCELED},
    "meta_propose_view": {OK, -errno.ECANCELED, -errno.ENOSPC},
}

OUT_LEN = 1 << 17


@dataclass(frozen=True)
class Proto:
    """One protocol's view: method names and the valid request of each."""

    number: int

    def method(self, op: str) -> str:
        return op if self.number == 1 else op + "2"

    def valid(self, op: str) -> bytes:
        return VALID1[op] if self.number == 1 else VALID2[op]

    def frame(self, body: bytes) -> bytes:
        """A protocol 1 body as this protocol sends it (at struct_v 1, whose layout it is)."""
        return body if self.number == 1 else envelope(body, 1, 1)


# ------------------------------------------------------------------ objects
def call(o: Obj, proto: Proto, op: str, payload: bytes) -> tuple[int, bytes]:
    return o.call(proto.method(op), payload, OUT_LEN)


def populate(io: Raw) -> Obj:
    """A data object in a known state: sealed at SEALED; 0..1 below the trim
    watermark; written, filled and individually trimmed positions above it."""
    o = Obj(io, f"bad.d.{uuid.uuid4().hex}")
    assert o.seal(SEALED) == OK
    assert o.write_many(SEALED, [(p, b"entry-%d" % p) for p in range(10)]) == OK
    assert o.write(SEALED, 15, b"") == OK
    assert o.fill(SEALED, 12) == OK
    assert o.trim(SEALED, 4) == OK
    assert o.trim_to(SEALED, 1) == OK
    return o


def make_meta(io: Raw) -> Obj:
    """A metadata object at epoch 1 with one view (what VALID's meta requests expect)."""
    m = Obj(io, f"bad.m.{uuid.uuid4().hex}")
    assert m.meta_create(2, b'{"log":"x"}') == OK
    return m


def snapshot(o: Obj, meta: bool) -> tuple[bytes, ...]:
    """Everything a client can see of the object, as raw reply bytes."""
    if meta:
        ret, raw = o.call("meta_get", b"", OUT_LEN)
        assert ret == OK
        return (raw,)
    ret, st_raw = o.call("stat", b"", OUT_LEN)
    assert ret == OK
    ret, rr_raw = o.call("read_range", v1_range(U64_MAX, 0, wire.MAX_POSITION, wire.MAX_RANGE_ENTRIES, 1 << 16),
                         OUT_LEN)
    assert ret == OK
    assert native.decode_reply(Op.READ_RANGE, rr_raw, 1).next == wire.MAX_POSITION + 1  # one page holds it all
    return st_raw, rr_raw


def exists(o: Obj) -> bool:
    ret = o.call("stat", b"", OUT_LEN)[0]
    assert ret in (OK, NOENT)
    return ret == OK


@pytest.fixture(scope="module", params=[1, 2], ids=["protocol1", "protocol2"])
def proto(request: pytest.FixtureRequest) -> Proto:
    return Proto(request.param)


@pytest.fixture(scope="module")
def io(rados_cluster, ceph, proto: Proto) -> Raw:  # type: ignore[no-untyped-def]
    from pyzlog.core.native import Connection

    conn = Connection.of(rados_cluster)
    return Raw(conn, conn.pool(ceph.pool), proto.number)


@pytest.fixture(scope="module")
def data_obj(io: Raw) -> Obj:
    return populate(io)


@pytest.fixture(scope="module")
def meta_obj(io: Raw) -> Obj:
    return make_meta(io)


# ------------------------------------------------------ deterministic cases
def _overclaims() -> Iterator[tuple[str, str, bytes, bool]]:
    """Bodies whose length and count fields claim more than the buffer holds,
    or whose values are out of range. The last element: still malformed in
    protocol 2 (False for a fault that is only trailing bytes inside the body,
    which protocol 2 takes for a newer client's fields)."""
    yield "write", "len=0xffffffff", struct.pack("<QQI", 7, 20, 0xFFFFFFFF) + b"hello", True
    yield "write", "len=0x80000000", struct.pack("<QQI", 7, 20, 0x80000000) + b"hello", True
    yield "write", "len+1", struct.pack("<QQI", 7, 20, 6) + b"hello", True
    yield "write", "len-1", struct.pack("<QQI", 7, 20, 4) + b"hello", False  # = one trailing byte
    entry = struct.pack("<QI", 21, 2) + b"ab"
    yield "write_many", "n=0xffffffff", struct.pack("<QI", 7, 0xFFFFFFFF) + entry, True
    yield "write_many", "n=1024+1", struct.pack("<QI", 7, wire.MAX_BATCH_ENTRIES + 1) + entry, True
    yield "write_many", "n=2,one entry", struct.pack("<QI", 7, 2) + entry, True
    yield ("write_many", "n=1,two entries", struct.pack("<QI", 7, 1) + entry + entry.replace(b"\x15", b"\x16", 1),
           False)
    yield "write_many", "n=0", struct.pack("<QI", 7, 0), True
    yield "write_many", "n=0,entry", struct.pack("<QI", 7, 0) + entry, True
    yield "write_many", "entry len=0xffffffff", struct.pack("<QIQI", 7, 1, 21, 0xFFFFFFFF) + b"ab", True
    yield "write_many", "entry len+1", struct.pack("<QIQI", 7, 1, 21, 3) + b"ab", True
    yield ("write_many", "2nd entry len=0xffffffff",
           struct.pack("<QI", 7, 2) + entry + struct.pack("<QI", 22, 0xFFFFFFFF), True)
    yield "write_many", "same position twice", struct.pack("<QI", 7, 2) + entry + entry, True
    yield "read_range", "last<first", v1_range(7, 10, 9, 16, 4096), True
    yield "read_range", "last=u64max", v1_range(7, 0, U64_MAX, 16, 4096), True
    yield "read_range", "max_entries=0", v1_range(7, 0, 100, 0, 4096), True
    yield "read_range", "max_entries=4097", v1_range(7, 0, 100, wire.MAX_RANGE_ENTRIES + 1, 4096), True
    yield "read_range", "max_bytes=0", v1_range(7, 0, 100, 16, 0), True
    yield "read_range", "max_bytes=16M+1", v1_range(7, 0, 100, 16, wire.MAX_RANGE_BYTES + 1), True
    yield "trim_to", "pos=u64max", v1_ep(7, U64_MAX), True
    yield "meta_create", "clen=0xffffffff", struct.pack("<II", 4, 0xFFFFFFFF) + b'{"x":1}', True
    yield "meta_create", "clen+1", struct.pack("<II", 4, 8) + b'{"x":1}', True
    yield "meta_create", "width=0", v1_meta_create(0, b""), True
    yield "meta_create", "width=1025", v1_meta_create(wire.MAX_WIDTH + 1, b""), True
    yield "meta_create", "config 64K+1", v1_meta_create(4, b"c" * ((64 << 10) + 1)), True
    yield "meta_new_epoch", "next=expected", v1_new_epoch(1, 1, ""), True
    yield "meta_new_epoch", "next<expected", v1_new_epoch(1, 0, ""), True
    yield "meta_propose_view", "next=expected", v1_propose(1, 1, 10, 4, ""), True
    yield "meta_propose_view", "width=0", v1_propose(1, 2, 10, 0, ""), True
    yield "meta_propose_view", "width=1025", v1_propose(1, 2, 10, wire.MAX_WIDTH + 1, ""), True
    yield "meta_new_epoch", "seqr_len+1", v1_new_epoch(1, 2) + struct.pack("<I", 5) + b"a:1", True
    yield "meta_new_epoch", "seqr 256", v1_new_epoch(1, 2, "s" * 256), True
    yield "meta_propose_view", "seqr_len short", v1_propose(1, 2, 10, 4) + b"\1\0", True


def _protocol1_only() -> Iterator[tuple[str, str, bytes]]:
    """Faults of protocol 1's layout that protocol 2 spells differently."""
    yield "meta_new_epoch", "seqr_len=0", v1_new_epoch(1, 2) + struct.pack("<I", 0)
    yield "meta_new_epoch", "seqr then junk", v1_new_epoch(1, 2, "a:1") + b"\0"
    for op in ("meta_new_epoch", "meta_propose_view"):  # the sequencer field with an empty address
        yield op, "next=expected,no seqr", (v1_new_epoch(1, 1) if op == "meta_new_epoch"
                                            else v1_propose(1, 1, 10, 4))


def _envelopes() -> Iterator[tuple[str, str, bytes]]:
    """Protocol 2's envelope itself, broken."""
    for op in OPS:
        body = body2(op)
        yield op, "struct_v=0", envelope(body, 0, 0)
        yield op, "compat=0", envelope(body, 2, 0)
        yield op, "compat>struct_v", envelope(body, 2, 3)
        yield op, "needs a newer class", envelope(body, 4, 4)
        yield op, "length+1", struct.pack("<BBI", 2, 1, len(body) + 1) + body
        if body:
            yield op, "length-1 (then 1 byte after)", struct.pack("<BBI", 2, 1, len(body) - 1) + body
            yield op, "body cut short", envelope(body[:-1])
        if V2_FIELDS.get(op, OMAP):
            yield op, "struct_v 2 without its fields", envelope(body1(op))
    for op in ("meta_new_epoch", "meta_propose_view"):
        yield op, "no sequencer field", envelope(VALID1[op])  # protocol 2 always has it


def malformed_cases(proto: int) -> Iterator[tuple[str, str, bytes]]:
    p = Proto(proto)
    for op in OPS:
        valid = p.valid(op)
        if valid:  # the method needs input: the empty buffer and every proper prefix
            for k in range(len(valid)):
                yield op, ("empty" if k == 0 else f"prefix{k}"), valid[:k]
        for garbage in (b"\x00", b"\xff" * 3, b"trailing-garbage" * 4):
            yield op, f"trailing{len(garbage)}", valid + garbage
    for op, label, body, in_both in _overclaims():
        if proto == 1:
            yield op, label, body
        elif in_both:  # at struct_v 1, whose layout the body is
            yield op, label, envelope(body, 1, 1)
    if proto == 1:
        yield from _protocol1_only()
    else:
        yield from _envelopes()


CASES = [(p, op, label, payload) for p in (1, 2) for op, label, payload in malformed_cases(p)]
IDS = [f"p{p}-{op}-{label}" for p, op, label, _ in CASES]


@dataclass
class Target:
    obj: Obj
    meta: bool


def test_valid_requests_are_accepted(io: Raw, proto: Proto) -> None:
    """Each VALID request succeeds as is, on a fresh object of its kind."""
    for op in OPS:
        if op == "meta_create":
            o = Obj(io, f"bad.m.{uuid.uuid4().hex}")
        else:
            o = make_meta(io) if op in META_OPS else populate(io)
        ret, _ = call(o, proto, op, proto.valid(op))
        assert ret == OK, op


def test_a_newer_clients_fields_are_skipped(io: Raw) -> None:
    """Protocol 2: a body longer than this class knows (a newer client that
    appended a field, with struct_v raised and compat_v left alone) is
    served, the extra field ignored."""
    o = populate(io)
    newer = struct.pack("<BBI", 4, 1, len(body2("write")) + 4) + body2("write") + b"new!"
    assert o.call("write2", newer, OUT_LEN)[0] == OK
    assert o.read(7, 20) == (OK, b"hello")
    assert o.call("write2", struct.pack("<BBI", 4, 4, 4) + b"????", OUT_LEN)[0] == TOO_NEW


def test_struct_v_1_requests_take_the_defaults(io: Raw) -> None:
    """Protocol 2 at struct_v 1 (before the format and geometry fields): served,
    the object taken to be in the omap format."""
    o = populate(io)
    assert o.call("write2", envelope(body1("write"), 1, 1), OUT_LEN)[0] == OK
    assert o.read(7, 20) == (OK, b"hello")
    m = Obj(io, f"bad.m.{uuid.uuid4().hex}")
    assert m.call("meta_create2", envelope(body1("meta_create"), 1, 1), OUT_LEN)[0] == OK
    assert m.meta_get()[1].views[0].format == wire.FORMAT_OMAP  # type: ignore[union-attr]


@pytest.mark.parametrize("number,op,label,payload", CASES, ids=IDS)
def test_malformed_is_einval(rados_cluster, ceph, number: int, op: str, label: str,  # type: ignore[no-untyped-def]
                             payload: bytes) -> None:
    """On an object in a known state: EINVAL (EPROTONOSUPPORT for an envelope
    that needs a newer class), and the object is unchanged."""
    o = _objects(rados_cluster, ceph, number)[op in META_OPS]
    meta = op in META_OPS
    before = snapshot(o, meta)
    ret, out = call(o, Proto(number), op, payload)
    want = TOO_NEW if label == "needs a newer class" else EINVAL
    assert ret == want, f"{op} {label}: {payload.hex()}"
    assert out == b""
    assert snapshot(o, meta) == before


@pytest.mark.parametrize("number,op,label,payload", CASES, ids=IDS)
def test_malformed_does_not_create(rados_cluster, ceph, number: int, op: str, label: str,  # type: ignore[no-untyped-def]
                                   payload: bytes) -> None:
    """On a missing object: a write method refuses before creating anything; a
    read-only method never reaches the class (the OSD answers ENOENT)."""
    io = _objects(rados_cluster, ceph, number)[0].io
    o = Obj(io, f"bad.none.{uuid.uuid4().hex}")
    ret, _ = call(o, Proto(number), op, payload)
    want = NOENT if op in READ_ONLY else (TOO_NEW if label == "needs a newer class" else EINVAL)
    assert ret == want, f"{op} {label}: {payload.hex()}"
    assert not exists(o)
    assert o.call("meta_get", b"", OUT_LEN)[0] == NOENT


_made: dict[int, tuple[Obj, Obj]] = {}


def _objects(rados_cluster, ceph, number: int) -> tuple[Obj, Obj]:  # type: ignore[no-untyped-def]
    """(data object, metadata object) in the known states, one pair per protocol."""
    if number not in _made:
        from pyzlog.core.native import Connection

        conn = Connection.of(rados_cluster)
        io = Raw(conn, conn.pool(ceph.pool), number)
        _made[number] = (populate(io), make_meta(io))
    return _made[number]


# ------------------------------------------------------- random byte strings
@st.composite
def mutated(draw: st.DrawFn, valid: bytes) -> bytes:
    """A valid request with a few random edits: byte flips, cuts, insertions,
    deletions, and u32 fields overwritten with boundary values."""
    b = bytearray(valid)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "delete", "u32"]))
        i = draw(st.integers(0, len(b)))
        if op == "flip" and i < len(b):
            b[i] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del b[i:]
        elif op == "insert":
            b[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del b[i:i + draw(st.integers(1, 8))]
        elif op == "u32" and i + 4 <= len(b):
            b[i:i + 4] = struct.pack("<I", draw(st.sampled_from([0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF])))
    return bytes(b)


RANDOM_SETTINGS = settings(max_examples=60, deadline=None, database=None,
                           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.mark.parametrize("op", OPS)
def test_random_bytes(io: Raw, proto: Proto, op: str) -> None:
    """Random (0..200 bytes) and mutated-valid requests: EINVAL or a code the
    method defines, and a refused call (or a read-only one) changes nothing. A
    random string can be a valid request: if it changed the object, carry on
    with a fresh object in the known state."""
    meta = op in META_OPS
    fresh = (lambda: make_meta(io)) if meta else (lambda: populate(io))
    target = Target(fresh(), meta)
    seen: dict[int, int] = {}
    allowed = DEFINED[op] | ({TOO_NEW} if proto.number == 2 else set())

    @RANDOM_SETTINGS
    @given(payload=st.one_of(st.binary(max_size=200), mutated(proto.valid(op))))
    def run(payload: bytes) -> None:
        before = snapshot(target.obj, meta)
        ret, _ = call(target.obj, proto, op, payload)
        seen[ret] = seen.get(ret, 0) + 1
        event(f"{op} -> {'OK' if ret == OK else errno.errorcode.get(-ret, ret)}")
        assert ret == EINVAL or ret in allowed, f"{op}: {ret} for {payload.hex()}"
        if ret != OK or op in READ_ONLY:
            assert snapshot(target.obj, meta) == before, f"{op} returned {ret} but changed the object"
        else:
            target.obj = fresh()

    run()
    assert EINVAL in seen, seen  # most random strings do not parse


# ---------------------------------------------------------- still serving
def test_osd_still_serves(io: Raw) -> None:
    """After all of the above, ordinary calls on fresh objects work."""
    o = Obj(io, f"bad.after.{uuid.uuid4().hex}")
    assert o.write(0, 3, b"still here") == OK
    assert o.read(0, 3) == (OK, b"still here")
    assert o.write_many(0, [(4, b"a"), (5, b"b")]) == OK
    ret, rr = o.read_range(0, 0, 10)
    assert ret == OK and rr is not None and [e.position for e in rr.entries] == [3, 4, 5]
    assert o.seal(1) == OK and o.stat() == (OK, wire.ObjectStat(1, 5, 0))
    m = Obj(io, f"bad.after.m.{uuid.uuid4().hex}")
    assert m.meta_create(3, b"{}") == OK
    assert m.meta_get() == (OK, wire.Meta(1, b"{}", (wire.View(1, 0, 3),)))
