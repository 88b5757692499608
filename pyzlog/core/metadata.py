"""A log's metadata object: its epoch and view history, changed only by
compare-and-swap on the epoch inside the object class."""
from __future__ import annotations

import errno
import json
import logging
from typing import Any

import rados

from . import wire
from .errors import InvalidRequest, LogExists, LogNotFound, from_errno
from .objects import ClassIO

logger = logging.getLogger("pyzlog")


class MetaStore:
    def __init__(self, meta_io: ClassIO, name: str) -> None:
        self.io = meta_io
        self.name = name

    def create(self, width: int, config: dict[str, Any]) -> None:
        blob = json.dumps(config, sort_keys=True).encode()
        ret, _ = self.io.call_raw(self.name, "meta_create", wire.meta_create(width, blob))
        if ret == -errno.EEXIST:
            raise LogExists(f"log {self.name!r} already exists")
        if ret < 0:
            raise from_errno(ret, f"create log {self.name!r}")

    def get(self) -> wire.Meta:
        ret, out = self.io.call_raw(self.name, "meta_get", b"", 1 << 20)
        if ret == -errno.ENOENT:
            raise LogNotFound(f"log {self.name!r} does not exist")
        if ret < 0:
            raise from_errno(ret, f"read metadata of log {self.name!r}")
        return wire.parse_meta(out)

    def new_epoch(self, expected: int, new_epoch: int, sequencer: str | None = None) -> None:
        """EpochChanged if the stored epoch is no longer `expected`. With
        `sequencer`, record it as the log's sequencer from `new_epoch` on;
        without, the recorded sequencer stays."""
        self._cas("meta_new_epoch", lambda s: wire.meta_new_epoch(expected, new_epoch, s), sequencer)

    def propose_view(self, expected: int, new_epoch: int, start: int, width: int,
                     sequencer: str | None = None) -> None:
        self._cas("meta_propose_view", lambda s: wire.meta_propose_view(expected, new_epoch, start, width, s),
                  sequencer)

    def _cas(self, method: str, payload: Any, sequencer: str | None) -> None:
        try:
            self.io.call(self.name, method, payload(sequencer))
        except InvalidRequest:
            if sequencer is None:
                raise
            # an OSD still runs a cls_zlog from before sequencer records:
            # install the epoch anyway (the log stays served; clients cannot
            # find the sequencer in the metadata until the class is upgraded)
            logger.warning("log %r: the OSD's cls_zlog does not record sequencers (older than this "
                           "client): installing the epoch without %s; upgrade the class on every OSD",
                           self.name, sequencer)
            self.io.call(self.name, method, payload(None))

    @staticmethod
    def list_names(meta_ioctx: rados.Ioctx) -> list[str]:
        return sorted(obj.key for obj in meta_ioctx.list_objects())
