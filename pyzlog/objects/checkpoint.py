"""Checkpoints of a runtime's objects, kept in RADOS beside the log.

A checkpoint is the state of every object a runtime hosts after playing
every position below `position`, with the exactly-once sessions and the
streams seen (Runtime.state_snapshot), codec-encoded and zstd-compressed. It
is stored in plain RADOS objects of the log's pool, namespace
`zlog.objects` (so least-privilege clients with `allow rw pool=P` can use
it, like the log):

- `<log>.ckpt.<position:016x>.<id>`: the bytes, written in 4 MiB pieces;
- `<log>.checkpoints`: an index in omap, one key per checkpoint
  (`<position:016x>.<id>`), whose JSON value names the object, position,
  size, SHA-256, the objects held and whether it is complete (holds every
  object the log has entries for up to `position`, so any replica can
  start from it).

The index entry is written last: a checkpoint is usable only once it is
whole, and a torn or damaged one fails its checksum (CheckpointError).
"""
from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pyzlog import Log, PermissionDenied, Timeout

from .errors import CheckpointError

if TYPE_CHECKING:
    import rados

NAMESPACE = "zlog.objects"
PIECE = 4 << 20
#: index keys read per omap call
INDEX_PAGE = 1000


@dataclass(frozen=True)
class CheckpointInfo:
    id: str
    position: int
    objects: tuple[str, ...]
    complete: bool
    size: int
    sha256: str
    oid: str
    created: float


class CheckpointStore(Protocol):
    def write(self, blob: bytes, position: int, objects: list[str], complete: bool) -> CheckpointInfo: ...
    def list(self) -> list[CheckpointInfo]: ...
    def read(self, info: CheckpointInfo) -> bytes: ...
    def remove(self, info: CheckpointInfo) -> None: ...


def _rados() -> Any:
    import rados  # here, not at the top: the rest of the layer imports without python-rados

    return rados


def _rados_error(what: str, e: Exception) -> Exception:
    rados = _rados()
    if isinstance(e, rados.PermissionError):
        return PermissionDenied(f"{what}: cephx refused it ({e}); checkpoints need `allow rw pool=<pool>`")
    if isinstance(e, rados.TimedOut):
        return Timeout(f"{what}: {e}")
    return CheckpointError(f"{what}: {e}")


class RadosCheckpoints:
    """Checkpoints of log `name` in pool `pool` (see the module's doc)."""

    def __init__(self, cluster: rados.Rados, pool: str, name: str, *, compress: bool = True) -> None:
        rados = _rados()
        self.name = name
        self.compress = compress
        try:
            self.io = cluster.open_ioctx(pool)
        except rados.Error as e:
            raise _rados_error(f"opening pool {pool!r} for checkpoints", e) from e
        self.io.set_namespace(NAMESPACE)
        self.index = f"{name}.checkpoints"

    @classmethod
    def for_log(cls, log: Log, **kw: Any) -> RadosCheckpoints:
        return cls(log.cluster, log.pool, log.name, **kw)

    def write(self, blob: bytes, position: int, objects: list[str], complete: bool) -> CheckpointInfo:
        import zstandard
        rados = _rados()

        body = (b"Z" + zstandard.ZstdCompressor(level=3).compress(blob)) if self.compress else b"R" + blob
        cid = uuid.uuid4().hex[:12]
        key = f"{position:016x}.{cid}"
        oid = f"{self.name}.ckpt.{key}"
        try:
            for off in range(0, max(len(body), 1), PIECE):
                piece = body[off:off + PIECE]
                if off == 0:
                    self.io.write_full(oid, piece)
                else:
                    self.io.write(oid, piece, off)
            info = CheckpointInfo(cid, position, tuple(objects), complete, len(body),
                                  hashlib.sha256(body).hexdigest(), oid, time.time())
            value = json.dumps({"oid": oid, "position": position, "objects": list(objects), "complete": complete,
                                "size": len(body), "sha256": info.sha256, "created": info.created}).encode()
            with rados.WriteOpCtx() as op:
                self.io.set_omap(op, (key,), (value,))
                self.io.operate_write_op(op, self.index)
        except rados.Error as e:
            raise _rados_error(f"writing checkpoint {oid}", e) from e
        return info

    def list(self) -> list[CheckpointInfo]:
        """Every checkpoint, oldest first."""
        rados = _rados()
        out: list[CheckpointInfo] = []
        after = ""
        try:
            while True:
                with rados.ReadOpCtx() as op:
                    it, _ = self.io.get_omap_vals(op, after, "", INDEX_PAGE)
                    self.io.operate_read_op(op, self.index)
                    page = list(it)
                for key, value in page:
                    out.append(_info(key, value))
                if len(page) < INDEX_PAGE:
                    break
                after = page[-1][0]
        except rados.ObjectNotFound:
            return []
        except rados.Error as e:
            raise _rados_error(f"listing the checkpoints of {self.name!r}", e) from e
        out.sort(key=lambda i: (i.position, i.created))
        return out

    def read(self, info: CheckpointInfo) -> bytes:
        rados = _rados()
        try:
            parts = []
            for off in range(0, max(info.size, 1), PIECE):
                parts.append(self.io.read(info.oid, min(PIECE, info.size - off), off))
            body = b"".join(parts)
        except rados.ObjectNotFound:
            raise CheckpointError(f"checkpoint {info.id} at {info.position}: its object {info.oid} is gone "
                                  "(removed by a trim?)") from None
        except rados.Error as e:
            raise _rados_error(f"reading checkpoint {info.oid}", e) from e
        if len(body) != info.size or hashlib.sha256(body).hexdigest() != info.sha256:
            raise CheckpointError(f"checkpoint {info.id} at {info.position} fails its checksum: damaged")
        if body[:1] == b"Z":
            import zstandard

            return zstandard.ZstdDecompressor().decompress(body[1:], max_output_size=1 << 34)
        if body[:1] == b"R":
            return body[1:]
        raise CheckpointError(f"checkpoint {info.id}: unknown form {body[:1]!r}")

    def remove(self, info: CheckpointInfo) -> None:
        rados = _rados()
        key = f"{info.position:016x}.{info.id}"
        try:
            with rados.WriteOpCtx() as op:
                self.io.remove_omap_keys(op, (key,))
                self.io.operate_write_op(op, self.index)
            self.io.remove_object(info.oid)
        except rados.ObjectNotFound:
            pass
        except rados.Error as e:
            raise _rados_error(f"removing checkpoint {info.oid}", e) from e

    def close(self) -> None:
        self.io.close()


def _info(key: str, value: bytes) -> CheckpointInfo:
    try:
        d = json.loads(value)
        return CheckpointInfo(key.split(".", 1)[1], int(d["position"]), tuple(d["objects"]), bool(d["complete"]),
                              int(d["size"]), str(d["sha256"]), str(d["oid"]), float(d["created"]))
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise CheckpointError(f"checkpoint index entry {key!r} does not parse: {e}") from None


__all__ = ["CheckpointInfo", "CheckpointStore", "RadosCheckpoints", "NAMESPACE"]
