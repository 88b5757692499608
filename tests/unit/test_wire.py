"""cls_zlog's requests and replies, as the data plane encodes and decodes
them (cls_zlog/ops.h), against bytes built here by hand: protocol 1 is
round 2's fixed layout, protocol 2 the same fields in an envelope."""
from __future__ import annotations

import struct

import pytest

import pyzlog
from pyzlog.core import native, wire
from pyzlog.core.native import Op
from pyzlog.core.scan import RangeWindow


def env(body: bytes, v: int = 1, compat: int = 1) -> bytes:
    return struct.pack("<BBI", v, compat, len(body)) + body


SEQR_NONE = struct.pack("<I", 0)
#: what struct_v 2 appended: the object format (omap here), a view's geometry, the stripe count a CAS expects
V2 = {op: struct.pack("<B", 1) for op in Op} | {
    Op.META_CREATE: struct.pack("<BIQ", 1, 0, 0), Op.META_GET: b"", Op.META_NEW_EPOCH: struct.pack("<I", 0xFFFFFFFF),
    Op.META_PROPOSE_VIEW: struct.pack("<BIQI", 1, 0, 0, 0xFFFFFFFF)}
#: what struct_v 3 appended: a data-format geometry's unit (1 here)
V3 = {op: b"" for op in Op} | {op: struct.pack("<I", 1) for op in (Op.META_CREATE, Op.META_PROPOSE_VIEW, Op.INIT,
                                                                   Op.REPAIR)}
CASES = [
    (Op.WRITE, {"epoch": 3, "position": 9, "data": b"hello"}, struct.pack("<QQI", 3, 9, 5) + b"hello"),
    (Op.WRITE_MANY, {"epoch": 3, "entries": [(9, b"a"), (10, b"")]},
     struct.pack("<QIQI", 3, 2, 9, 1) + b"a" + struct.pack("<QI", 10, 0)),
    (Op.READ, {"epoch": 3, "position": 9}, struct.pack("<QQ", 3, 9)),
    (Op.READ_RANGE, {"epoch": 3, "position": 0, "last": 99, "max_entries": 16, "max_bytes": 4096},
     struct.pack("<QQQII", 3, 0, 99, 16, 4096)),
    (Op.FILL, {"epoch": 3, "position": 9, "reason": 1}, struct.pack("<QQB", 3, 9, 1)),
    (Op.TRIM, {"epoch": 3, "position": 9}, struct.pack("<QQ", 3, 9)),
    (Op.TRIM_TO, {"epoch": 3, "position": 9}, struct.pack("<QQ", 3, 9)),
    (Op.SEAL, {"epoch": 4}, struct.pack("<Q", 4)),
    (Op.CLOSE, {"epoch": 4, "position": 100}, struct.pack("<QQ", 4, 100)),
    (Op.MAX_POSITION, {"epoch": 4}, struct.pack("<Q", 4)),
    (Op.STAT, {}, b""),
    (Op.META_CREATE, {"width": 4, "data": b"{}"}, struct.pack("<II", 4, 2) + b"{}"),
    (Op.META_GET, {}, b""),
    (Op.META_NEW_EPOCH, {"expected": 1, "next_epoch": 2}, struct.pack("<QQ", 1, 2)),
    (Op.META_PROPOSE_VIEW, {"expected": 1, "next_epoch": 2, "start": 50, "width": 8},
     struct.pack("<QQQI", 1, 2, 50, 8)),
]


@pytest.mark.parametrize("op,fields,legacy", CASES, ids=[c[0].name for c in CASES])
def test_requests_in_both_protocols(op: Op, fields: dict, legacy: bytes) -> None:  # type: ignore[type-arg]
    assert native.encode(op, 1, **fields) == legacy
    body = legacy + (SEQR_NONE if op in (Op.META_NEW_EPOCH, Op.META_PROPOSE_VIEW) else b"")
    assert native.encode(op, 2, **fields) == env(body + V2[op] + V3[op], v=3)
    # a class of struct_v 1 reads the same fields without the ones versions 2 and 3 appended
    assert native.decode(op, env(body), 2)["epoch"] == fields.get("epoch", 0)
    assert native.decode(op, env(body + V2[op], v=2), 2)["unit"] == 1
    for proto in (1, 2):
        back = native.decode(op, native.encode(op, proto, **fields), proto)
        for key, value in fields.items():
            if key != "entries":
                assert back[key] == value, (op, proto, key)
    assert native.method(op, 1) == op.name.lower() and native.method(op, 2) == op.name.lower() + "2"


def test_the_sequencer_field() -> None:
    legacy = native.encode(Op.META_NEW_EPOCH, 1, expected=1, next_epoch=2, seqr="10.0.0.1:5678")
    assert legacy == struct.pack("<QQI", 1, 2, 13) + b"10.0.0.1:5678"
    assert native.decode(Op.META_NEW_EPOCH, legacy, 1)["seqr"] == "10.0.0.1:5678"
    assert native.decode(Op.META_NEW_EPOCH, native.encode(Op.META_NEW_EPOCH, 2, expected=1, next_epoch=2), 2)["seqr"] \
        is None


def test_envelopes_read_what_they_know_and_refuse_what_they_cannot() -> None:
    body = struct.pack("<QQ", 3, 9)
    assert native.decode(Op.READ, env(body + b"\x03" + b"a newer field", v=4), 2)["position"] == 9  # skipped
    with pytest.raises(pyzlog.ProtocolMismatch):
        native.decode(Op.READ, env(body, v=4, compat=4), 2)  # needs a newer decoder
    for bad in (env(body)[:-1], env(body) + b"x", env(body, v=1, compat=2), env(body[:-1]), b""):
        with pytest.raises(pyzlog.InvalidRequest):
            native.decode(Op.READ, bad, 2)
    with pytest.raises(pyzlog.InvalidRequest):
        native.decode(Op.READ, body + b"x", 1)  # protocol 1 is exact


def test_a_unit_above_one_needs_a_decoder_that_knows_units() -> None:
    """A geometry with runs of more than one position goes out with compat_v
    3, so that a class of struct_v 2 refuses it (EPROTONOSUPPORT) instead of
    taking it for unit 1 and putting positions in the wrong objects; unit 1
    stays readable by it (compat_v 1), and a unit of 0 is malformed."""
    fields = {"epoch": 2, "position": 256, "width": 4, "slots": 1024, "byte_bound": 1 << 20, "format": 3}
    for unit, compat in ((1, 1), (128, 3)):
        raw = native.encode(Op.INIT, 2, unit=unit, **fields)
        assert raw[:2] == bytes([3, compat]), unit
        assert raw[-4:] == struct.pack("<I", unit)
        assert native.decode(Op.INIT, raw, 2)["unit"] == unit
    create = native.encode(Op.META_CREATE, 2, width=4, data=b"{}", unit=64, format=3, slots=1024, byte_bound=1 << 20)
    assert create[:2] == bytes([3, 3])
    # the data ops carry no unit: they stay at compat_v 1 whatever the view's unit
    assert native.encode(Op.WRITE, 2, epoch=1, position=5, data=b"x", unit=64)[:2] == bytes([3, 1])
    with pytest.raises(pyzlog.InvalidRequest):
        native.decode(Op.INIT, raw[:-4] + struct.pack("<I", 0), 2)
    # protocol 1 has no geometry (its meta_create makes an omap log): the unit is left out with it
    assert native.encode(Op.META_CREATE, 1, width=4, data=b"{}", unit=64) == struct.pack("<II", 4, 2) + b"{}"


def test_replies() -> None:
    stat = struct.pack("<QBQQBQ", 7, 1, 41, 3, 1, 100)
    assert native.decode_reply(Op.STAT, stat, 1) == wire.ObjectStat(7, 41, 3, 100)
    assert native.decode_reply(Op.STAT, env(stat), 2) == wire.ObjectStat(7, 41, 3, 100)  # struct_v 1
    counted = env(stat + struct.pack("<BQQ", 3, 12, 4096), v=2)
    assert native.decode_reply(Op.STAT, counted, 2) == wire.ObjectStat(7, 41, 3, 100, wire.FORMAT_DATA, 12, 4096)
    assert native.decode_reply(Op.MAX_POSITION, struct.pack("<BQ", 0, 0), 1) is None
    assert native.decode_reply(Op.MAX_POSITION, env(struct.pack("<BQ", 1, 5)), 2) == 5
    assert native.decode_reply(Op.READ, b"raw entry", 1) == b"raw entry"
    assert native.decode_reply(Op.READ, env(struct.pack("<I", 5) + b"entry"), 2) == b"entry"
    assert native.decode_reply(Op.VERSION, env(struct.pack("<IIB", 2, 0, 2))) == (2, 0, 2)
    with pytest.raises(pyzlog.ProtocolMismatch):
        native.decode_reply(Op.STAT, stat[:-1], 1)


def test_range_replies_of_both_protocols_make_the_same_window() -> None:
    entries = [(5, wire.EntryState.WRITTEN, 2, b"five"), (9, wire.EntryState.FILLED, 2, wire.LOST_MARK),
               (13, wire.EntryState.TRIMMED, 3, b"")]
    head = struct.pack("<QBQQI", 1, 1, 13, 20, len(entries))
    v1 = head + b"".join(struct.pack("<QBQI", p, s, e, len(d)) + d for p, s, e, d in entries)
    v2 = env(head + b"".join(struct.pack("<QQIB", p, e, len(d), s) for p, s, e, d in entries)
             + b"".join(d for *_, d in entries))
    for raw, proto in ((v1, 1), (v2, 2)):
        w = RangeWindow.parse(raw, 4, proto)
        assert (w.first, w.next, w.trim_below, w.max_position, w.count) == (4, 20, 1, 13, 3)
        assert [(e.position, e.state, e.epoch, e.data) for e in w.entries()] == entries
        assert w.record_batch().column("kind").to_pylist() == ["data", "lost", "trimmed"]
    for bad in (v1[:-1], v1 + b"x", v2[:-1], head):
        with pytest.raises(ValueError):
            RangeWindow.parse(bad, 0, 1 if bad is not v2[:-1] else 2)


def test_metadata_round_trip() -> None:
    meta = wire.Meta(7, b'{"compression": "zstd"}', (wire.View(1, 0, 4), wire.View(5, 100, 2)), "h:1", 5)
    raw = wire.encode_meta(meta)
    assert raw[0] == 2 and wire.parse_meta(raw) == meta  # version 2: a sequencer is recorded
    plain = wire.Meta(1, b"", (wire.View(1, 0, 1),))
    assert wire.encode_meta(plain)[0] == 1 and wire.parse_meta(wire.encode_meta(plain)) == plain
    bounded = wire.Meta(3, b"{}", (wire.View(1, 0, 4), wire.View(3, 50, 2, wire.FORMAT_DATA, 1024, 1 << 20, 7)),
                        trim_below=40)
    raw = wire.encode_meta(bounded)
    assert raw[0] == 3 and wire.parse_meta(raw) == bounded  # version 3: formats, stripes, the trim point
    with pytest.raises(pyzlog.ProtocolMismatch):
        wire.parse_meta(raw[:-1])
    runs = wire.Meta(4, b"{}", bounded.views + (wire.View(4, 90, 3, wire.FORMAT_DATA, 1024, 1 << 20, 1, 128),),
                     trim_below=40)
    raw = wire.encode_meta(runs)
    assert raw[0] == 4 and wire.parse_meta(raw) == runs  # version 4: each view's unit
    assert len(raw) == len(wire.encode_meta(bounded)) + 37 + 3 * 4  # one more view, and a unit per view
    assert [v.unit for v in wire.parse_meta(raw).views] == [1, 1, 128]


@pytest.mark.parametrize("fmt,slots,unit", [(wire.FORMAT_DATA, 8, 0), (wire.FORMAT_DATA, 8, 3),
                                            (wire.FORMAT_DATA, 8, 16), (wire.FORMAT_OMAP, 0, 4)])
def test_metadata_with_a_geometry_no_request_could_make_is_refused(fmt: int, slots: int, unit: int) -> None:
    """A view whose unit is 0, does not divide its slots, or is given to an
    omap view is damage (ProtocolMismatch; the class says EIO), never a
    layout to follow (it divided by zero, or put positions where no object
    holds them)."""
    good = wire.Meta(2, b"{}", (wire.View(1, 0, 3, wire.FORMAT_DATA, 8, 1 << 20, 1, 4),))
    raw = bytearray(wire.encode_meta(good))
    at = 1 + 8 + 4 + 2 + 4 + 37  # version, epoch, config, nviews, the view up to its unit
    assert raw[0] == 4 and raw[at:at + 4] == struct.pack("<I", 4)
    raw[at:at + 4] = struct.pack("<I", unit)
    raw[1 + 8 + 4 + 2 + 4 + 20] = fmt  # the view's format
    raw[1 + 8 + 4 + 2 + 4 + 21:1 + 8 + 4 + 2 + 4 + 25] = struct.pack("<I", slots)
    with pytest.raises(pyzlog.ProtocolMismatch):
        wire.parse_meta(bytes(raw))
