"""Raw access to one cls_zlog object for tests: every call returns the exact
return code (0 or -errno) so tests can assert each error precisely.

Requests are encoded and replies decoded by the native data plane's codecs
(cls_zlog/ops.h, the definition the class uses), in the protocol the test
asks for: 1, the fixed layouts older clients send, or 2, the versioned one.
Calls go out as raw execs (no protocol fallback), so a test of protocol 1
really speaks protocol 1.
"""
from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Any

from pyzlog.core import native, scan, wire
from pyzlog.core.layout import data_oid_prefix
from pyzlog.core.native import Connection, Op, Pool

# The class's return codes (docs/cls_zlog.md), as the tests assert them.
OK = 0
STALE = -errno.ESTALE
WRITTEN = -errno.EROFS
FILLED = -errno.ENOMSG
TRIMMED = -errno.EIDRM
UNWRITTEN = -errno.ENODATA
EINVAL = -errno.EINVAL
TOO_BIG = -errno.EFBIG
CORRUPT = -errno.EIO
NOENT = -errno.ENOENT  # the OSD's answer to a read-only method on a missing object
#: method names of both protocols whose calls write (no reply data)
WRITE_METHODS = {name for op in Op if native.writes(op) for proto in (1, 2)
                 if (name := native.method_or_none(op, proto))}


@dataclass(frozen=True)
class RangeReply:
    """A read_range reply, its entries as Python objects (tests only)."""

    trim_below: int
    max_position: int | None
    next: int
    entries: list[wire.RangeEntry]

    @classmethod
    def of(cls, w: scan.RangeWindow) -> RangeReply:
        return cls(w.trim_below, w.max_position, w.next, list(w.entries()))


#: the data format's geometry in the class tests: one object holding positions 0..4095
DATA_GEOMETRY = (0, 1, 4096, 32 << 20)  # base, width, slots, byte_bound[, unit]
#: one object of a stripe of 3 dealt in runs of 4: it holds 0..3, 12..15, 24..27, ...
RUNS_GEOMETRY = (0, 3, 4096, 32 << 20, 4)


class Raw:
    """Raw class calls on one pool (and namespace), in one protocol and, for
    data objects, one format: the data format's objects are made (init,
    with `geometry`) as an Obj is, since no write can make them."""

    def __init__(self, conn: Connection, pool: Pool, protocol: int, fmt: int = wire.FORMAT_OMAP,
                 geometry: tuple[int, ...] = DATA_GEOMETRY) -> None:
        self.conn, self.pool, self.protocol, self.fmt, self.geometry = conn, pool, protocol, fmt, geometry

    @property
    def unit(self) -> int:
        return self.geometry[4] if len(self.geometry) > 4 else 1

    def held(self, i: int) -> int:
        """The object's i-th position (its slot i)."""
        from pyzlog.core.layout import held_after

        base, width = self.geometry[0], self.geometry[1]
        return held_after(base, width, self.unit, base, i)

    def call_raw(self, oid: str, method: str, payload: bytes = b"", out_len: int = 0) -> tuple[int, bytes]:
        """(0 or -errno, reply) of `method` with `payload` as given."""
        return self.conn.exec(self.pool, oid, method, payload, write=method in WRITE_METHODS)

    def encode(self, op: Op, **fields: Any) -> tuple[str, bytes]:
        if self.protocol == wire.PROTOCOL and op < Op.META_CREATE:
            fields.setdefault("format", self.fmt)  # data ops name the object's format
        return native.method(op, self.protocol), native.encode(op, self.protocol, **fields)

    @property
    def data_format(self) -> bool:
        return self.fmt == wire.FORMAT_DATA


class Obj:
    def __init__(self, io: Raw, oid: str, made: bool = True) -> None:
        """`made`: a data-format object is made now, at epoch 0."""
        self.io = io
        self.oid = oid
        if io.data_format and made:
            assert self.init(0) == 0

    def init(self, epoch: int, geometry: tuple[int, ...] | None = None) -> int:
        base, width, slots, byte_bound, *unit = geometry or self.io.geometry
        return self.op(Op.INIT, epoch=epoch, position=base, width=width, slots=slots, byte_bound=byte_bound,
                       unit=unit[0] if unit else 1)[0]

    @property
    def protocol(self) -> int:
        return self.io.protocol

    def call(self, method: str, payload: bytes = b"", out_len: int = 1 << 21) -> tuple[int, bytes]:
        return self.io.call_raw(self.oid, method, payload, out_len)

    def op(self, op: Op, **fields: Any) -> tuple[int, bytes]:
        """`op` with its fields, encoded in this object's protocol."""
        return self.call(*self.io.encode(op, **fields))

    def value(self, op: Op, raw: bytes, first: int = 0) -> Any:
        return native.decode_reply(op, raw, self.protocol, first)

    def write(self, epoch: int, pos: int, data: bytes) -> int:
        return self.op(Op.WRITE, epoch=epoch, position=pos, data=data)[0]

    def write_many(self, epoch: int, entries: list[tuple[int, bytes]]) -> int:
        return self.op(Op.WRITE_MANY, epoch=epoch, entries=entries)[0]

    def read(self, epoch: int, pos: int) -> tuple[int, bytes]:
        ret, out = self.op(Op.READ, epoch=epoch, position=pos)
        return ret, (self.value(Op.READ, out) if ret == 0 else b"")

    def fill(self, epoch: int, pos: int, reason: int = wire.FILL_JUNK) -> int:
        return self.op(Op.FILL, epoch=epoch, position=pos, reason=reason)[0]

    def trim(self, epoch: int, pos: int) -> int:
        return self.op(Op.TRIM, epoch=epoch, position=pos)[0]

    def trim_to(self, epoch: int, pos: int) -> int:
        return self.op(Op.TRIM_TO, epoch=epoch, position=pos)[0]

    def seal(self, epoch: int) -> int:
        return self.op(Op.SEAL, epoch=epoch)[0]

    def close(self, epoch: int, end: int) -> int:
        return self.op(Op.CLOSE, epoch=epoch, position=end)[0]

    def max_position(self, epoch: int) -> tuple[int, int | None]:
        ret, out = self.op(Op.MAX_POSITION, epoch=epoch)
        return ret, (self.value(Op.MAX_POSITION, out) if ret == 0 else None)

    def read_range(self, epoch: int, first: int, last: int, max_entries: int = 4096,
                   max_bytes: int = 1 << 20) -> tuple[int, RangeReply | None]:
        ret, out = self.op(Op.READ_RANGE, epoch=epoch, position=first, last=last, max_entries=max_entries,
                           max_bytes=max_bytes)
        return ret, (RangeReply.of(self.value(Op.READ_RANGE, out, first)) if ret == 0 else None)

    def stat(self) -> tuple[int, wire.ObjectStat | None]:
        """The header as every format has it (what the object holds: counts())."""
        ret, st = self.full_stat()
        return ret, (None if st is None else wire.ObjectStat(st.sealed_epoch, st.max_position, st.trim_below,
                                                             st.view_end))

    def full_stat(self) -> tuple[int, wire.ObjectStat | None]:
        ret, out = self.op(Op.STAT)
        return ret, (self.value(Op.STAT, out) if ret == 0 else None)

    def counts(self) -> tuple[int, int]:
        """(entries, bytes) the object holds (the data format counts them)."""
        ret, st = self.full_stat()
        assert ret == 0 and st is not None
        return st.entries, st.bytes

    # ---------------------------------------------------------------- metadata
    def meta_create(self, width: int, config: bytes) -> int:
        return self.op(Op.META_CREATE, width=width, data=config)[0]

    def meta_get(self) -> tuple[int, wire.Meta | None]:
        ret, out = self.op(Op.META_GET)
        return ret, (wire.parse_meta(self.value(Op.META_GET, out)) if ret == 0 else None)

    def meta_new_epoch(self, expected: int, new_epoch: int, sequencer: str | None = None) -> int:
        return self.op(Op.META_NEW_EPOCH, expected=expected, next_epoch=new_epoch, seqr=sequencer)[0]

    def meta_propose_view(self, expected: int, new_epoch: int, start: int, width: int,
                          sequencer: str | None = None) -> int:
        return self.op(Op.META_PROPOSE_VIEW, expected=expected, next_epoch=new_epoch, start=start, width=width,
                       seqr=sequencer)[0]


def log_obj(log: Any, oid: str, protocol: int | None = None) -> Obj:
    """Raw access to one object of a pyzlog.Log, through its data plane, in
    `protocol` (default: the one the log's pool speaks now, 1 on a cluster
    whose class predates protocol 2) and in the format of the view it
    belongs to (never made here: a data-format object is made by the log)."""
    fmt = next((v.format for v in log.views if oid.startswith(data_oid_prefix(log.name, v))), wire.FORMAT_OMAP)
    return Obj(Raw(log.state.conn, log.state.data, protocol or log.state.data.protocol, fmt), oid, made=False)


def shape(views: Any) -> list[tuple[int, int, int]]:
    """(epoch, start, width) of each view: what a test of the log's history
    asserts, whatever format the cluster's class makes its views in."""
    return [(v.epoch, v.start, v.width) for v in views]
