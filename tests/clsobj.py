"""Raw access to one cls_zlog object for tests: every call returns the exact
return code (0 or -errno) so tests can assert each error precisely."""
from __future__ import annotations

import errno

from pyzlog.core import wire
from pyzlog.core.objects import ClassIO

# The class's return codes (docs/cls_zlog.md), as the tests assert them.
OK = 0
STALE = -errno.ESTALE
WRITTEN = -errno.EROFS
FILLED = -errno.ENOMSG
TRIMMED = -errno.EIDRM
UNWRITTEN = -errno.ENODATA
EINVAL = -errno.EINVAL
TOO_BIG = -errno.EFBIG
NOENT = -errno.ENOENT  # the OSD's answer to a read-only method on a missing object


class Obj:
    def __init__(self, io: ClassIO, oid: str) -> None:
        self.io = io
        self.oid = oid

    def call(self, method: str, payload: bytes = b"", out_len: int = 1 << 21) -> tuple[int, bytes]:
        return self.io.call_raw(self.oid, method, payload, out_len)

    def write(self, epoch: int, pos: int, data: bytes) -> int:
        return self.call("write", wire.write(epoch, pos, data))[0]

    def write_many(self, epoch: int, entries: list[tuple[int, bytes]]) -> int:
        return self.call("write_many", wire.write_many(epoch, entries))[0]

    def read(self, epoch: int, pos: int) -> tuple[int, bytes]:
        return self.call("read", wire.epoch_position(epoch, pos))

    def fill(self, epoch: int, pos: int, reason: int = wire.FILL_JUNK) -> int:
        return self.call("fill", wire.fill(epoch, pos, reason))[0]

    def trim(self, epoch: int, pos: int) -> int:
        return self.call("trim", wire.epoch_position(epoch, pos))[0]

    def trim_to(self, epoch: int, pos: int) -> int:
        return self.call("trim_to", wire.epoch_position(epoch, pos))[0]

    def seal(self, epoch: int) -> int:
        return self.call("seal", wire.epoch_only(epoch))[0]

    def close(self, epoch: int, end: int) -> int:
        return self.call("close", wire.epoch_position(epoch, end))[0]

    def max_position(self, epoch: int) -> tuple[int, int | None]:
        ret, out = self.call("max_position", wire.epoch_only(epoch))
        return ret, (wire.parse_max_position(out) if ret == 0 else None)

    def read_range(self, epoch: int, first: int, last: int, max_entries: int = 4096,
                   max_bytes: int = 1 << 20) -> tuple[int, wire.RangeReply | None]:
        ret, out = self.call("read_range", wire.read_range(epoch, first, last, max_entries, max_bytes),
                             wire.range_reply_size(max_entries, max_bytes))
        return ret, (wire.parse_range_reply(out) if ret == 0 else None)

    def stat(self) -> tuple[int, wire.ObjectStat | None]:
        ret, out = self.call("stat")
        return ret, (wire.parse_stat(out) if ret == 0 else None)
