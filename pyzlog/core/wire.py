"""What cls_zlog's requests and replies hold, as Python sees them.

The layouts themselves are defined once, in cls_zlog/ops.h, which the object
class and the native data plane (native/dataplane.c) compile; Python builds
no request bytes and parses none: the data plane encodes and decodes, and
this module gives the limits, states and decoded values their Python names.
The metadata object's bytes are decoded by the same C code (parse_meta).
"""
from __future__ import annotations

import errno
from dataclasses import dataclass
from enum import IntEnum

from .._dataplane import ffi, lib  # the cffi extension (untyped)

CLASS = "zlog"
#: the protocol calls go out with, and the one of class builds before it
#: (cls_zlog/ops.h): an OSD with an older class is spoken to in that one
PROTOCOL = int(lib.ZLOG_PROTO_CURRENT)
LEGACY_PROTOCOL = int(lib.ZLOG_PROTO_LEGACY)
#: The object class's default entry size limit (CMake ZLOG_MAX_ENTRY_BYTES).
MAX_ENTRY_BYTES = 1 << 20
MAX_BATCH_ENTRIES = int(lib.ZLOG_MAX_BATCH_ENTRIES)
MAX_RANGE_ENTRIES = int(lib.ZLOG_MAX_RANGE_ENTRIES)
MAX_RANGE_BYTES = int(lib.ZLOG_MAX_RANGE_BYTES)
MAX_WIDTH = int(lib.ZLOG_MAX_WIDTH)
MAX_UNIT = int(lib.ZLOG_MAX_UNIT)
MAX_CONFIG_BYTES = int(lib.ZLOG_MAX_CONFIG_BYTES)
#: longest sequencer address the metadata records
MAX_SEQUENCER_BYTES = int(lib.ZLOG_MAX_SEQR_BYTES)
MAX_POSITION = int(lib.ZLOG_MAX_POSITION)  # read_range needs last + 1 to fit in 64 bits
MAX_EPOCH = int(lib.ZLOG_MAX_EPOCH)
#: how a view's objects keep their entries (cls_zlog/store.h, docs/storage.md)
FORMAT_OMAP = int(lib.ZLOG_FORMAT_OMAP)
FORMAT_DATA = int(lib.ZLOG_FORMAT_DATA)
#: a metadata compare-and-swap that does not check the newest view's open stripes
ANY_STRIPES = int(lib.ZLOG_ANY_STRIPES)


class EntryState(IntEnum):
    WRITTEN = lib.ZLOG_WRITTEN
    FILLED = lib.ZLOG_FILLED
    TRIMMED = lib.ZLOG_TRIMMED


#: fill reasons: a client filled the position, or a reader filled a hole
#: whose writer never wrote (the entry, if there was one, is lost)
FILL_JUNK = int(lib.ZLOG_FILL_JUNK)
FILL_LOST = int(lib.ZLOG_FILL_LOST)
#: the data of a filled entry that a reader filled as lost
LOST_MARK = bytes([FILL_LOST])


@dataclass(frozen=True, slots=True)
class RangeEntry:
    position: int
    state: EntryState
    epoch: int
    data: bytes


@dataclass(frozen=True, slots=True)
class ObjectStat:
    sealed_epoch: int
    max_position: int | None
    trim_below: int
    #: where the object's view ends, once a reconfiguration closed it
    view_end: int | None = None
    #: its format, and what it holds (entries written and their bytes; the
    #: data format counts them, the omap format reports 0)
    format: int = FORMAT_OMAP
    entries: int = 0
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class View:
    """From `start` on, positions are striped over `width` objects (until a
    later view). In the data format the objects are bounded: each holds at
    most `slots` positions and `byte_bound` bytes of entries, so the view is a
    sequence of stripes of `width` objects (`stripes` of them open so far),
    each stripe dealt to its objects in runs of `unit` consecutive positions
    (cls_zlog/ops.h, "layout"; unit 1: position p in object p % width)."""

    epoch: int
    start: int
    width: int
    format: int = FORMAT_OMAP
    slots: int = 0
    byte_bound: int = 0
    stripes: int = 0
    unit: int = 1

    @property
    def bounded(self) -> bool:
        return self.format == FORMAT_DATA


@dataclass(frozen=True, slots=True)
class Meta:
    epoch: int
    config: bytes
    views: tuple[View, ...]
    #: the sequencer that took the log over (its address; "" if none did),
    #: and the epoch at which it did
    sequencer: str = ""
    sequencer_epoch: int = 0
    #: every position below it is trimmed (kept by logs with data-format views)
    trim_below: int = 0


def parse_meta(buf: bytes) -> Meta:
    """The metadata object's bytes (as meta_get returns them), decoded by ops.h."""
    m = ffi.new("zlog_meta *")
    ret = lib.dp_decode_meta(buf, len(buf), m)
    if ret < 0:
        from .errors import error_for

        raise error_for(-errno.EBADMSG, "log metadata")
    try:
        views = tuple(View(int(v.epoch), int(v.start), int(v.width), int(v.format), int(v.slots), int(v.byte_bound),
                           int(v.stripes), int(v.unit)) for v in (m.views[i] for i in range(m.nviews)))
        config = ffi.unpack(m.config, m.config_len) if m.config != ffi.NULL else b""
        seqr = ffi.unpack(m.seqr, m.seqr_len).decode(errors="replace") if m.seqr != ffi.NULL else ""
        return Meta(int(m.epoch), bytes(config), views, seqr, int(m.seqr_epoch), int(m.trim_below))
    finally:
        lib.dp_free(m.views)


def encode_meta(meta: Meta) -> bytes:
    """The bytes the class stores for `meta` (tests build objects with it)."""
    views = ffi.new("zlog_view[]", len(meta.views))
    for i, v in enumerate(meta.views):
        views[i].epoch, views[i].start, views[i].width = v.epoch, v.start, v.width
        views[i].format, views[i].slots, views[i].byte_bound, views[i].stripes = (v.format, v.slots, v.byte_bound,
                                                                                v.stripes)
        views[i].unit = v.unit
    m = ffi.new("zlog_meta *")
    config = ffi.from_buffer(meta.config)
    seqr = meta.sequencer.encode()
    seqr_buf = ffi.from_buffer(seqr)
    m.epoch, m.config, m.config_len, m.nviews, m.views = meta.epoch, config, len(meta.config), len(meta.views), views
    m.seqr_epoch, m.seqr, m.seqr_len = meta.sequencer_epoch, seqr_buf, len(seqr)
    m.trim_below = meta.trim_below
    out, n = ffi.new("char **"), ffi.new("size_t *")
    if lib.dp_encode_meta(m, out, n) < 0:
        raise MemoryError("dp_encode_meta")
    try:
        return bytes(ffi.unpack(out[0], n[0]))
    finally:
        lib.dp_free(out[0])
