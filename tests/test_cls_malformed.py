"""cls_zlog given bad input, method by method.

Every method parses its request before touching the object and refuses
anything that does not parse exactly with EINVAL. Here: the empty buffer, every
truncation of a valid request, trailing garbage, length fields that claim more
bytes than are present (deterministic), then random and mutated byte strings
(hypothesis). After every refused call the object is byte-for-byte what it was.
Last, the OSD still serves ordinary calls.
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

from pyzlog.core import wire
from pyzlog.core.objects import ClassIO

from clsobj import Obj

OK = 0
EINVAL = -errno.EINVAL
NOENT = -errno.ENOENT

SEALED = 3  # the populated data object's sealed epoch
U64_MAX = (1 << 64) - 1

DATA_METHODS = ["write", "write_many", "read", "read_range", "fill", "trim", "trim_to", "seal",
                "close", "max_position", "stat"]
META_METHODS = ["meta_create", "meta_get", "meta_new_epoch", "meta_propose_view"]
METHODS = DATA_METHODS + META_METHODS
# Registered CLS_METHOD_RD only: on a missing object the OSD answers ENOENT
# without running the class; they never change the object.
READ_ONLY = {"read", "read_range", "max_position", "stat", "meta_get"}

# A valid request per method, each accepted (0) by a fresh populated object
# (test_valid_requests_are_accepted), so their truncations are truncations of
# real requests.
VALID: dict[str, bytes] = {
    "write": wire.write(7, 20, b"hello"),
    "write_many": wire.write_many(7, [(21, b"ab"), (22, b"")]),
    "read": wire.epoch_position(7, 5),
    "read_range": wire.read_range(7, 0, 100, 16, 4096),
    "fill": wire.fill(7, 23),
    "trim": wire.epoch_position(7, 6),
    "trim_to": wire.epoch_position(7, 3),
    "seal": wire.epoch_only(9),
    "close": wire.epoch_position(SEALED, 1000),
    "max_position": wire.epoch_only(7),
    "stat": b"",
    "meta_create": wire.meta_create(4, b'{"x":1}'),
    "meta_get": b"",
    "meta_new_epoch": wire.meta_new_epoch(1, 2),
    "meta_propose_view": wire.meta_propose_view(1, 2, 10, 4),
}

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

OUT_LEN = 1 << 17  # enough for any reply from the small objects used here


# ------------------------------------------------------------------ objects


def populate(io: ClassIO) -> Obj:
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


def make_meta(io: ClassIO) -> Obj:
    """A metadata object at epoch 1 with one view (what VALID's meta requests expect)."""
    m = Obj(io, f"bad.m.{uuid.uuid4().hex}")
    assert m.call("meta_create", wire.meta_create(2, b'{"log":"x"}'))[0] == OK
    return m


def snapshot(o: Obj, meta: bool) -> tuple[bytes, ...]:
    """Everything a client can see of the object, as raw reply bytes."""
    if meta:
        ret, raw = o.call("meta_get", b"", OUT_LEN)
        assert ret == OK
        return (raw,)
    ret, st_raw = o.call("stat", b"", OUT_LEN)
    assert ret == OK
    ret, rr_raw = o.call("read_range", wire.read_range(U64_MAX, 0, wire.MAX_POSITION, wire.MAX_RANGE_ENTRIES,
                                                        1 << 16), OUT_LEN)
    assert ret == OK
    assert wire.parse_range_reply(rr_raw).next == wire.MAX_POSITION + 1  # one page holds it all
    return st_raw, rr_raw


def exists(o: Obj) -> bool:
    ret = o.call("stat", b"", OUT_LEN)[0]
    assert ret in (OK, NOENT)
    return ret == OK


@pytest.fixture(scope="module")
def io(rados_cluster, ceph) -> Iterator[ClassIO]:  # type: ignore[no-untyped-def]
    from pyzlog.core.cluster import open_ioctx

    ioctx = open_ioctx(rados_cluster, ceph.pool)
    yield ClassIO(ioctx)
    ioctx.close()


@pytest.fixture(scope="module")
def data_obj(io: ClassIO) -> Obj:
    return populate(io)


@pytest.fixture(scope="module")
def meta_obj(io: ClassIO) -> Obj:
    return make_meta(io)


# ------------------------------------------------------ deterministic cases


def _overclaims() -> Iterator[tuple[str, str, bytes]]:
    """Length and count fields claiming more than the buffer holds."""
    yield "write", "len=0xffffffff", struct.pack("<QQI", 7, 20, 0xFFFFFFFF) + b"hello"
    yield "write", "len=0x80000000", struct.pack("<QQI", 7, 20, 0x80000000) + b"hello"
    yield "write", "len+1", struct.pack("<QQI", 7, 20, 6) + b"hello"
    yield "write", "len-1", struct.pack("<QQI", 7, 20, 4) + b"hello"  # = one trailing byte
    entry = struct.pack("<QI", 21, 2) + b"ab"
    yield "write_many", "n=0xffffffff", struct.pack("<QI", 7, 0xFFFFFFFF) + entry
    yield "write_many", "n=1024+1", struct.pack("<QI", 7, wire.MAX_BATCH_ENTRIES + 1) + entry
    yield "write_many", "n=2,one entry", struct.pack("<QI", 7, 2) + entry
    yield "write_many", "n=1,two entries", struct.pack("<QI", 7, 1) + entry + entry.replace(b"\x15", b"\x16", 1)
    yield "write_many", "n=0", struct.pack("<QI", 7, 0)
    yield "write_many", "n=0,entry", struct.pack("<QI", 7, 0) + entry
    yield "write_many", "entry len=0xffffffff", struct.pack("<QIQI", 7, 1, 21, 0xFFFFFFFF) + b"ab"
    yield "write_many", "entry len+1", struct.pack("<QIQI", 7, 1, 21, 3) + b"ab"
    yield "write_many", "2nd entry len=0xffffffff", (struct.pack("<QI", 7, 2) + entry
                                                     + struct.pack("<QI", 22, 0xFFFFFFFF))
    yield "write_many", "same position twice", struct.pack("<QI", 7, 2) + entry + entry
    yield "read_range", "last<first", wire.read_range(7, 10, 9, 16, 4096)
    yield "read_range", "last=u64max", wire.read_range(7, 0, U64_MAX, 16, 4096)
    yield "read_range", "max_entries=0", wire.read_range(7, 0, 100, 0, 4096)
    yield "read_range", "max_entries=4097", wire.read_range(7, 0, 100, wire.MAX_RANGE_ENTRIES + 1, 4096)
    yield "read_range", "max_bytes=0", wire.read_range(7, 0, 100, 16, 0)
    yield "read_range", "max_bytes=16M+1", wire.read_range(7, 0, 100, 16, wire.MAX_RANGE_BYTES + 1)
    yield "trim_to", "pos=u64max", wire.epoch_position(7, U64_MAX)
    yield "meta_create", "clen=0xffffffff", struct.pack("<II", 4, 0xFFFFFFFF) + b'{"x":1}'
    yield "meta_create", "clen+1", struct.pack("<II", 4, 8) + b'{"x":1}'
    yield "meta_create", "width=0", wire.meta_create(0, b"")
    yield "meta_create", "width=1025", wire.meta_create(wire.MAX_WIDTH + 1, b"")
    yield "meta_create", "config 64K+1", wire.meta_create(4, b"c" * ((64 << 10) + 1))
    yield "meta_new_epoch", "next=expected", wire.meta_new_epoch(1, 1)
    yield "meta_new_epoch", "next<expected", wire.meta_new_epoch(1, 0)
    yield "meta_propose_view", "next=expected", wire.meta_propose_view(1, 1, 10, 4)
    yield "meta_propose_view", "width=0", wire.meta_propose_view(1, 2, 10, 0)
    yield "meta_propose_view", "width=1025", wire.meta_propose_view(1, 2, 10, wire.MAX_WIDTH + 1)
    yield "meta_new_epoch", "seqr_len+1", wire.meta_new_epoch(1, 2) + struct.pack("<I", 5) + b"a:1"
    yield "meta_new_epoch", "seqr_len=0", wire.meta_new_epoch(1, 2) + struct.pack("<I", 0)
    yield "meta_new_epoch", "seqr 256", wire.meta_new_epoch(1, 2, "s" * 256)
    yield "meta_new_epoch", "seqr then junk", wire.meta_new_epoch(1, 2, "a:1") + b"\0"
    yield "meta_propose_view", "seqr_len short", wire.meta_propose_view(1, 2, 10, 4) + b"\1\0"


def malformed_cases() -> Iterator[tuple[str, str, bytes]]:
    for m in METHODS:
        valid = VALID[m]
        if valid:  # the method needs input: the empty buffer and every proper prefix
            for k in range(len(valid)):
                yield m, ("empty" if k == 0 else f"prefix{k}"), valid[:k]
        for garbage in (b"\x00", b"\xff" * 3, b"trailing-garbage" * 4):
            yield m, f"trailing{len(garbage)}", valid + garbage
    yield from _overclaims()


CASES = list(malformed_cases())


@dataclass
class Target:
    obj: Obj
    meta: bool


def test_valid_requests_are_accepted(io: ClassIO) -> None:
    """Each VALID request succeeds as is, on a fresh object of its kind."""
    for m in METHODS:
        if m == "meta_create":
            o = Obj(io, f"bad.m.{uuid.uuid4().hex}")
        else:
            o = make_meta(io) if m in META_METHODS else populate(io)
        ret, _ = o.call(m, VALID[m], OUT_LEN)
        assert ret == OK, m


@pytest.mark.parametrize("method,label,payload", CASES, ids=[f"{m}-{lbl}" for m, lbl, _ in CASES])
def test_malformed_is_einval(data_obj: Obj, meta_obj: Obj, method: str, label: str, payload: bytes) -> None:
    """On an object in a known state: EINVAL, and the object is unchanged."""
    meta = method in META_METHODS
    o = meta_obj if meta else data_obj
    before = snapshot(o, meta)
    ret, out = o.call(method, payload, OUT_LEN)
    assert ret == EINVAL, f"{method} {label}: {payload.hex()}"
    assert out == b""
    assert snapshot(o, meta) == before


@pytest.mark.parametrize("method,label,payload", CASES, ids=[f"{m}-{lbl}" for m, lbl, _ in CASES])
def test_malformed_does_not_create(io: ClassIO, method: str, label: str, payload: bytes) -> None:
    """On a missing object: a write method refuses before creating anything; a
    read-only method never reaches the class (the OSD answers ENOENT)."""
    o = Obj(io, f"bad.none.{uuid.uuid4().hex}")
    ret, _ = o.call(method, payload, OUT_LEN)
    assert ret == (NOENT if method in READ_ONLY else EINVAL), f"{method} {label}: {payload.hex()}"
    assert not exists(o)
    assert o.call("meta_get", b"", OUT_LEN)[0] == NOENT


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


@pytest.mark.parametrize("method", METHODS)
def test_random_bytes(io: ClassIO, method: str) -> None:
    """Random (0..200 bytes) and mutated-valid requests: EINVAL or a code the
    method defines, and a refused call (or a read-only one) changes nothing. A
    random string can be a valid request: if it changed the object, carry on
    with a fresh object in the known state."""
    meta = method in META_METHODS
    fresh = (lambda: make_meta(io)) if meta else (lambda: populate(io))
    target = Target(fresh(), meta)
    seen: dict[int, int] = {}

    @RANDOM_SETTINGS
    @given(payload=st.one_of(st.binary(max_size=200), mutated(VALID[method])))
    def run(payload: bytes) -> None:
        before = snapshot(target.obj, meta)
        ret, _ = target.obj.call(method, payload, OUT_LEN)
        seen[ret] = seen.get(ret, 0) + 1
        event(f"{method} -> {'OK' if ret == OK else errno.errorcode.get(-ret, ret)}")
        assert ret == EINVAL or ret in DEFINED[method], f"{method}: {ret} for {payload.hex()}"
        if ret != OK or method in READ_ONLY:
            assert snapshot(target.obj, meta) == before, f"{method} returned {ret} but changed the object"
        else:
            target.obj = fresh()

    run()
    assert EINVAL in seen, seen  # most random strings do not parse


# ---------------------------------------------------------- still serving


def test_osd_still_serves(io: ClassIO) -> None:
    """After all of the above, ordinary calls on fresh objects work."""
    o = Obj(io, f"bad.after.{uuid.uuid4().hex}")
    assert o.write(0, 3, b"still here") == OK
    assert o.read(0, 3) == (OK, b"still here")
    assert o.write_many(0, [(4, b"a"), (5, b"b")]) == OK
    ret, rr = o.read_range(0, 0, 10)
    assert ret == OK and rr is not None and [e.position for e in rr.entries] == [3, 4, 5]
    assert o.seal(1) == OK and o.stat() == (OK, wire.ObjectStat(1, 5, 0))
    m = Obj(io, f"bad.after.m.{uuid.uuid4().hex}")
    assert m.call("meta_create", wire.meta_create(3, b"{}"))[0] == OK
    assert wire.parse_meta(m.call("meta_get")[1]) == wire.Meta(1, b"{}", (wire.View(1, 0, 3),))
