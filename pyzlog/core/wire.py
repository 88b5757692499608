"""Request and reply layouts of cls_zlog's methods (docs/cls_zlog.md).

Little-endian fixed-width fields; the object class refuses anything that does
not parse exactly with EINVAL.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

CLASS = "zlog"
#: The object class's default entry size limit (CMake ZLOG_MAX_ENTRY_BYTES).
MAX_ENTRY_BYTES = 1 << 20
MAX_BATCH_ENTRIES = 1024
MAX_RANGE_ENTRIES = 4096
MAX_RANGE_BYTES = 16 << 20
MAX_WIDTH = 1024
MAX_POSITION = (1 << 64) - 2  # read_range needs last + 1 to fit in 64 bits


class EntryState(IntEnum):
    WRITTEN = 1
    FILLED = 2
    TRIMMED = 3


_QQ = struct.Struct("<QQ")
_QQB = struct.Struct("<QQB")
_QQI = struct.Struct("<QQI")
_QI = struct.Struct("<QI")
_Q = struct.Struct("<Q")
_RANGE_REQ = struct.Struct("<QQQII")
_RANGE_HEAD = struct.Struct("<QBQQI")
_RANGE_ENTRY = struct.Struct("<QBQI")
_STAT = struct.Struct("<QBQQBQ")
_MAXPOS = struct.Struct("<BQ")


def write(epoch: int, position: int, data: bytes) -> bytes:
    return _QQI.pack(epoch, position, len(data)) + data


def write_many(epoch: int, entries: list[tuple[int, bytes]]) -> bytes:
    parts = [_QI.pack(epoch, len(entries))]
    for pos, data in entries:
        parts.append(_QI.pack(pos, len(data)))
        parts.append(data)
    return b"".join(parts)


def epoch_position(epoch: int, position: int) -> bytes:
    """read, trim and trim_to take (epoch, position); close takes (epoch, end)."""
    return _QQ.pack(epoch, position)


#: fill reasons: a client filled the position, or a reader filled a hole
#: whose writer never wrote (the entry, if there was one, is lost)
FILL_JUNK = 0
FILL_LOST = 1
#: the data of a filled entry that a reader filled as lost
LOST_MARK = bytes([FILL_LOST])


def fill(epoch: int, position: int, reason: int = FILL_JUNK) -> bytes:
    return _QQB.pack(epoch, position, reason)


def epoch_only(epoch: int) -> bytes:
    """seal and max_position take the epoch alone."""
    return _Q.pack(epoch)


def read_range(epoch: int, first: int, last: int, max_entries: int, max_bytes: int) -> bytes:
    return _RANGE_REQ.pack(epoch, first, last, max_entries, max_bytes)


def range_reply_size(max_entries: int, max_bytes: int) -> int:
    """Output buffer a read_range reply can need."""
    return _RANGE_HEAD.size + max_entries * (_RANGE_ENTRY.size) + max_bytes + 64


@dataclass(frozen=True, slots=True)
class RangeEntry:
    position: int
    state: EntryState
    epoch: int
    data: bytes


@dataclass(frozen=True, slots=True)
class RangeReply:
    trim_below: int
    max_position: int | None
    next: int  # resume here; every position of the object in [first, next) is accounted for
    entries: list[RangeEntry]


def parse_range_reply(buf: bytes) -> RangeReply:
    trim_below, has_max, max_pos, nxt, n = _RANGE_HEAD.unpack_from(buf, 0)
    off = _RANGE_HEAD.size
    entries = []
    view = memoryview(buf)
    for _ in range(n):
        pos, state, epoch, ln = _RANGE_ENTRY.unpack_from(buf, off)
        off += _RANGE_ENTRY.size
        entries.append(RangeEntry(pos, EntryState(state), epoch, bytes(view[off:off + ln])))
        off += ln
    if off != len(buf):
        raise ValueError("malformed read_range reply")
    return RangeReply(trim_below, max_pos if has_max else None, nxt, entries)


def parse_max_position(buf: bytes) -> int | None:
    has_max, pos = _MAXPOS.unpack(buf)
    return pos if has_max else None


@dataclass(frozen=True, slots=True)
class ObjectStat:
    sealed_epoch: int
    max_position: int | None
    trim_below: int
    #: where the object's view ends, once a reconfiguration closed it
    view_end: int | None = None


def parse_stat(buf: bytes) -> ObjectStat:
    sealed, has_max, max_pos, trim_below, has_end, end = _STAT.unpack(buf)
    return ObjectStat(sealed, max_pos if has_max else None, trim_below, end if has_end else None)


# ------------------------------------------------------------------ metadata

def meta_create(width: int, config: bytes) -> bytes:
    return struct.pack("<II", width, len(config)) + config


#: longest sequencer address the metadata records
MAX_SEQUENCER_BYTES = 255


def _sequencer_tail(sequencer: str | None) -> bytes:
    """The optional tail of a metadata CAS: the sequencer taking the log over."""
    if sequencer is None:
        return b""
    raw = sequencer.encode()
    return struct.pack("<I", len(raw)) + raw


def meta_new_epoch(expected: int, new_epoch: int, sequencer: str | None = None) -> bytes:
    return _QQ.pack(expected, new_epoch) + _sequencer_tail(sequencer)


def meta_propose_view(expected: int, new_epoch: int, start: int, width: int,
                      sequencer: str | None = None) -> bytes:
    return struct.pack("<QQQI", expected, new_epoch, start, width) + _sequencer_tail(sequencer)


@dataclass(frozen=True, slots=True)
class View:
    """From `start` on, positions are striped over `width` objects (until a later view)."""

    epoch: int
    start: int
    width: int


@dataclass(frozen=True, slots=True)
class Meta:
    epoch: int
    config: bytes
    views: tuple[View, ...]
    #: the sequencer that took the log over (its address; "" if none did),
    #: and the epoch at which it did
    sequencer: str = ""
    sequencer_epoch: int = 0


def parse_meta(buf: bytes) -> Meta:
    ver, epoch, clen = struct.unpack_from("<BQI", buf, 0)
    off = 13
    config = bytes(buf[off:off + clen])
    off += clen
    (nviews,) = struct.unpack_from("<I", buf, off)
    off += 4
    views = []
    for _ in range(nviews):
        e, s, w = struct.unpack_from("<QQI", buf, off)
        views.append(View(e, s, w))
        off += 20
    sequencer, sequencer_epoch = "", 0
    if ver == 2:
        sequencer_epoch, slen = struct.unpack_from("<QI", buf, off)
        off += 12
        sequencer = bytes(buf[off:off + slen]).decode(errors="replace")
        off += slen
    if ver not in (1, 2) or off != len(buf) or not views:
        raise ValueError("malformed log metadata")
    return Meta(epoch, config, tuple(views), sequencer, sequencer_epoch)
