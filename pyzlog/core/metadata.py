"""A log's metadata object: its epoch and view history, changed only by
compare-and-swap on the epoch inside the object class. Its calls go through
the native data plane like every other cls_zlog call."""
from __future__ import annotations

from typing import TYPE_CHECKING

import errno
import json
import logging
from typing import Any


from . import wire
from .errors import InvalidRequest, LogExists, LogNotFound
from .native import Connection, Op, Pool

if TYPE_CHECKING:
    import rados

logger = logging.getLogger("pyzlog")


class MetaStore:
    def __init__(self, conn: Connection, pool: Pool, name: str) -> None:
        self.conn = conn
        self.pool = pool  # the pool's META_NAMESPACE
        self.name = name

    def create(self, width: int, config: dict[str, Any]) -> None:
        blob = json.dumps(config, sort_keys=True).encode()
        code, _ = self.conn.call_raw(self.pool, self.name, Op.META_CREATE, width=width, data=blob)
        if code == -errno.EEXIST:
            raise LogExists(f"log {self.name!r} already exists", errno=errno.EEXIST)
        if code < 0:
            raise self.conn.error(code, f"create log {self.name!r}", pool=self.pool, oid=self.name,
                                  op=Op.META_CREATE)

    def get(self) -> wire.Meta:
        code, raw = self.conn.call_raw(self.pool, self.name, Op.META_GET)
        if code == -errno.ENOENT:
            raise LogNotFound(f"log {self.name!r} does not exist", errno=errno.ENOENT)
        if code < 0:
            raise self.conn.error(code, f"read metadata of log {self.name!r}", pool=self.pool, oid=self.name,
                                  op=Op.META_GET)
        return wire.parse_meta(raw)

    def new_epoch(self, expected: int, new_epoch: int, sequencer: str | None = None) -> None:
        """EpochChanged if the stored epoch is no longer `expected`. With
        `sequencer`, record it as the log's sequencer from `new_epoch` on;
        without, the recorded sequencer stays."""
        self._cas(Op.META_NEW_EPOCH, sequencer, expected=expected, next_epoch=new_epoch)

    def propose_view(self, expected: int, new_epoch: int, start: int, width: int,
                     sequencer: str | None = None) -> None:
        self._cas(Op.META_PROPOSE_VIEW, sequencer, expected=expected, next_epoch=new_epoch, start=start,
                  width=width)

    def _cas(self, op: Op, sequencer: str | None, **fields: Any) -> None:
        try:
            self.conn.call(self.pool, self.name, op, what=f"{op.name.lower()} of log {self.name!r}",
                           seqr=sequencer, **fields)
        except InvalidRequest:
            if sequencer is None:
                raise
            # an OSD still runs a cls_zlog from before sequencer records:
            # install the epoch anyway (the log stays served; clients cannot
            # find the sequencer in the metadata until the class is upgraded)
            logger.warning("log %r: the OSD's cls_zlog does not record sequencers (older than this "
                           "client): installing the epoch without %s; upgrade the class on every OSD",
                           self.name, sequencer)
            self.conn.call(self.pool, self.name, op, what=f"{op.name.lower()} of log {self.name!r}", **fields)

    @staticmethod
    def list_names(meta_ioctx: rados.Ioctx) -> list[str]:
        return sorted(obj.key for obj in meta_ioctx.list_objects())
