"""The header every entry of this layer starts with.

    offset size  field
    0      2     magic b"ZO"
    2      1     version (1; 2 when a backpointer section follows)
    3      1     kind: CMD, TXN, RETIRE, NOOP
    4      1     flags (bit 0: a backpointer section follows; set exactly in version 2)
    5      8     client id (u64): the proposing runtime
    13     8     seq (u64): the proposal's number within its client
    21     8     lwm (u64): every seq of this client below it is settled
    29     8     stream (u64): the object a CMD is for (0 for other kinds)
    37     ...   version 2: the backpointer section (streams, below), then
    ...    ...   kind-specific: CMD: the object's command;
                 TXN: u16 count + count x u64 streams, then the commit record;
                 RETIRE: u16 count + count x u64 seqs retired

The backpointer section (version 2; docs/objects.md, "Streams"): u8 K (the
sequencer's most recent backpointers per stream), u8 nstreams, then per
stream of the entry: u64 stream, u64 horizon, u8 n (<= K), u8 m, u8 width
(4 or 8), n + m width-byte deltas (this entry's position minus a
backpointer): n recent backpointers newest first, then m skip pointers
newest first (entries further back: the stream's newest entry below this
one whose ordinal is a multiple of 2^level, for levels 4, 5, ...; they let
a reader find a long stream in a few rounds of reads). The stream's
positions in [x, this position) are exactly the n recent ones, where x is
the oldest of them when n == K, else the horizon: below the horizon the
sequencer knew nothing (a reader scans).

(client, seq) is the proposal id: a retried append stores the same bytes
again, and replay applies the first copy only (sessions.Sessions). All
integers are little-endian. Entries that do not start with the magic are not
this layer's (raw appends to a shared log) and are skipped by every replica.
A newer version is refused (UnsupportedEntry): skipping it would let this
replica's state part from the ones that apply it.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Final

from pyzlog import InvalidRequest

from .errors import BadEntry

MAGIC: Final = b"ZO"
VERSION: Final = 2  #: the newest version this build reads (and writes with backpointers)
PLAIN_VERSION: Final = 1  #: entries without backpointers are written as version 1
#: the versions this layer has and may have: an entry with the magic and a version past them (or
#: 0) is not its own, only bytes that start "ZO" ("ZONE ..."), and is skipped like any foreign
#: entry; one of a version up to it that this build does not read stops the replay (UnsupportedEntry)
MAX_LAYER_VERSION: Final = 15
CMD, TXN, RETIRE, NOOP = 1, 2, 3, 4
KINDS: Final = frozenset((CMD, TXN, RETIRE, NOOP))
FLAG_BACKPOINTERS: Final = 1

HEADER = struct.Struct("<2sBBBQQQQ")
HEADER_SIZE: Final = HEADER.size  # 37
#: the same header with the magic read as a u16 (the replay loop's: no bytes object per entry)
HEADER_U16 = struct.Struct("<HBBBQQQQ")
MAGIC_U16: Final = int.from_bytes(MAGIC, "little")
_U16 = struct.Struct("<H")
_U64 = struct.Struct("<Q")

#: longest object name, in UTF-8 bytes
MAX_NAME = 200


def stream_id(name: str) -> int:
    """The object's 64-bit stream id: a hash of its name, never 0 (0 marks
    an entry that belongs to no one object)."""
    try:
        raw = name.encode() if isinstance(name, str) else b""
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 for it
        raw = b""
    if not raw or len(raw) > MAX_NAME:
        raise InvalidRequest(f"an object name is a non-empty string of valid Unicode of at most {MAX_NAME} bytes, "
                             f"not {name!r}")
    sid = int.from_bytes(hashlib.blake2b(raw, digest_size=8, person=b"zlog-obj").digest(), "little")
    return sid or 1


def header(kind: int, client: int, seq: int, lwm: int, stream: int = 0) -> bytes:
    return HEADER.pack(MAGIC, PLAIN_VERSION, kind, 0, client, seq, lwm, stream)


_BP_HEAD = struct.Struct("<BB")
#: the first five bytes of a version-2 entry, by kind: magic, version, kind, flags
_V2_HEAD = [MAGIC + bytes((VERSION, kind, FLAG_BACKPOINTERS)) for kind in range(256)]
_BP_STREAM = struct.Struct("<QQBBB")
_U32_MAX = (1 << 32) - 1

#: (stream, horizon, recent backpointers newest first, skip pointers newest first)
Backpointers = list[tuple[int, int, list[int], list[int]]]


def with_backpointers(plain: bytes, position: int, k: int, bps: Backpointers) -> bytes:
    """The version-2 form of a version-1 entry stored at `position` (every
    append with streams on: the header's fields are copied, not unpacked)."""
    if len(plain) < HEADER_SIZE or not plain.startswith(MAGIC):
        raise InvalidRequest("not an entry of this layer")
    out = [_V2_HEAD[plain[3]], plain[5:HEADER_SIZE], _BP_HEAD.pack(k, len(bps))]
    for stream, horizon, recent, far in bps:
        nr, nf = len(recent), len(far)
        if nr > 255 or nf > 255:
            raise InvalidRequest("at most 255 backpointers of each kind per stream")
        if not nr + nf:
            out.append(_BP_STREAM.pack(stream, horizon, 0, 0, 4))
            continue
        deltas = [position - b for b in recent]
        deltas += [position - b for b in far]
        if min(deltas) <= 0:
            raise InvalidRequest(f"a backpointer in {recent + far} not below position {position}")
        width = 8 if max(deltas) > _U32_MAX else 4
        out.append(_BP_STREAM.pack(stream, horizon, nr, nf, width))
        out.append(_deltas(nr + nf, width).pack(*deltas))
    out.append(plain[HEADER_SIZE:])
    return b"".join(out)


_DELTAS: dict[tuple[int, int], struct.Struct] = {}


def _deltas(count: int, width: int) -> struct.Struct:
    """The struct of `count` deltas of `width` bytes (made once per shape)."""
    st = _DELTAS.get((count, width))
    if st is None:
        st = _DELTAS[count, width] = struct.Struct(f"<{count}{'I' if width == 4 else 'Q'}")
    return st


def parse_backpointers(data: bytes, position: int) -> tuple[int, dict[int, tuple[int, list[int], list[int]]], int]:
    """(K, {stream: (horizon, recent, skip pointers)}, offset of the
    kind-specific part) of a version-2 entry stored at `position`."""
    try:
        k, n = data[HEADER_SIZE], data[HEADER_SIZE + 1]
        off = HEADER_SIZE + 2
        out: dict[int, tuple[int, list[int], list[int]]] = {}
        for _ in range(n):
            stream, horizon, nr, nf, width = _BP_STREAM.unpack_from(data, off)
            off += 19
            if width != 4 and width != 8 or nr > k:
                raise BadEntry(f"position {position}: a backpointer section with width {width}, {nr} of {k}")
            cnt = nr + nf
            if cnt:
                deltas = _deltas(cnt, width).unpack_from(data, off)
                off += width * cnt
                if min(deltas) == 0 or max(deltas) > position:
                    raise BadEntry(f"position {position}: a backpointer not below the entry")
                out[stream] = (horizon, [position - d for d in deltas[:nr]], [position - d for d in deltas[nr:]])
            else:
                out[stream] = (horizon, [], [])
        return k, out, off
    except (struct.error, IndexError) as e:
        raise BadEntry(f"position {position}: a backpointer section does not parse: {e}") from None


def body_offset(data: bytes) -> int:
    """Where the kind-specific part of an entry starts (the replay loop's
    hot path: plain indexing, no struct)."""
    if not data[4] & FLAG_BACKPOINTERS:
        return HEADER_SIZE
    try:
        n = data[HEADER_SIZE + 1]
        off = HEADER_SIZE + 2
        for _ in range(n):
            off += 19 + data[off + 18] * (data[off + 16] + data[off + 17])
    except IndexError:
        raise BadEntry("a backpointer section runs past the entry's end") from None
    if off > len(data):
        raise BadEntry("a backpointer section runs past the entry's end")
    return off


def pack_u64s(values: list[int]) -> bytes:
    if len(values) > 0xFFFF:
        raise InvalidRequest(f"at most {0xFFFF} streams or seqs in one entry")
    return _U16.pack(len(values)) + b"".join(_U64.pack(v) for v in values)


def unpack_u64s(data: bytes, off: int) -> tuple[list[int], int]:
    try:
        (n,) = _U16.unpack_from(data, off)
        end = off + 2 + 8 * n
        if end > len(data):
            raise BadEntry(f"a list of {n} ids runs past the entry's end")
        return list(struct.unpack_from(f"<{n}Q", data, off + 2)), end
    except struct.error as e:
        raise BadEntry(f"a list of ids does not parse: {e}") from None


@dataclass(frozen=True, slots=True)
class Header:
    kind: int
    flags: int
    client: int
    seq: int
    lwm: int
    stream: int


def is_layer_entry(data: bytes) -> bool:
    """`data` is this layer's: long enough, with the magic and one of the
    layer's versions (the replay loop makes the same test on the fields it
    has unpacked)."""
    return len(data) >= HEADER_SIZE and data[:2] == MAGIC and 0 < data[2] <= MAX_LAYER_VERSION


def parse(data: bytes) -> Header | None:
    """The header of `data`, or None if the entry is not this layer's.
    Slow path (tools, tests); the replay loop unpacks HEADER itself."""
    if not is_layer_entry(data):
        return None
    _m, version, kind, flags, client, seq, lwm, stream = HEADER.unpack_from(data)
    check(version, kind)
    return Header(kind, flags, client, seq, lwm, stream)


def check(version: int, kind: int) -> None:
    from .errors import UnsupportedEntry

    if version not in (PLAIN_VERSION, VERSION):
        raise UnsupportedEntry(f"an entry of version {version}: this build reads versions 1 and {VERSION}")
    if kind not in KINDS:
        raise UnsupportedEntry(f"an entry of unknown kind {kind}")
