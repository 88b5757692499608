"""The header every entry of this layer starts with.

    offset size  field
    0      2     magic b"ZO"
    2      1     version (1)
    3      1     kind: CMD, TXN, RETIRE, NOOP
    4      1     flags (bit 0: a backpointer section follows; none is written yet)
    5      8     client id (u64): the proposing runtime
    13     8     seq (u64): the proposal's number within its client
    21     8     lwm (u64): every seq of this client below it is settled
    29     8     stream (u64): the object a CMD is for (0 for other kinds)
    37     ...   kind-specific: CMD: the object's command;
                 TXN: u16 count + count x u64 streams, then the commit record;
                 RETIRE: u16 count + count x u64 seqs retired

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
VERSION: Final = 1
CMD, TXN, RETIRE, NOOP = 1, 2, 3, 4
KINDS: Final = frozenset((CMD, TXN, RETIRE, NOOP))
FLAG_BACKPOINTERS: Final = 1

HEADER = struct.Struct("<2sBBBQQQQ")
HEADER_SIZE: Final = HEADER.size  # 37
_U16 = struct.Struct("<H")
_U64 = struct.Struct("<Q")

#: longest object name, in UTF-8 bytes
MAX_NAME = 200


def stream_id(name: str) -> int:
    """The object's 64-bit stream id: a hash of its name, never 0 (0 marks
    an entry that belongs to no one object)."""
    if not isinstance(name, str) or not name or len(name.encode()) > MAX_NAME:
        raise InvalidRequest(f"an object name is a non-empty string of at most {MAX_NAME} bytes, not {name!r}")
    sid = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8, person=b"zlog-obj").digest(), "little")
    return sid or 1


def header(kind: int, client: int, seq: int, lwm: int, stream: int = 0) -> bytes:
    return HEADER.pack(MAGIC, VERSION, kind, 0, client, seq, lwm, stream)


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


def parse(data: bytes) -> Header | None:
    """The header of `data`, or None if the entry is not this layer's.
    Slow path (tools, tests); the replay loop unpacks HEADER itself."""
    if len(data) < HEADER_SIZE or data[:2] != MAGIC:
        return None
    _m, version, kind, flags, client, seq, lwm, stream = HEADER.unpack_from(data)
    check(version, kind)
    return Header(kind, flags, client, seq, lwm, stream)


def check(version: int, kind: int) -> None:
    from .errors import UnsupportedEntry

    if version != VERSION:
        raise UnsupportedEntry(f"an entry of version {version}: this build reads version {VERSION}")
    if kind not in KINDS:
        raise UnsupportedEntry(f"an entry of unknown kind {kind}")
