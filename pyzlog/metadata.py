"""A log's metadata object: its epoch and view history, changed only by
compare-and-swap on the epoch inside the object class."""
from __future__ import annotations

import errno
import json
from typing import Any

import rados

from . import wire
from .errors import LogExists, LogNotFound, from_errno
from .objects import ClassIO


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
        self.io.call(self.name, "meta_new_epoch", wire.meta_new_epoch(expected, new_epoch, sequencer))

    def propose_view(self, expected: int, new_epoch: int, start: int, width: int,
                     sequencer: str | None = None) -> None:
        self.io.call(self.name, "meta_propose_view",
                     wire.meta_propose_view(expected, new_epoch, start, width, sequencer))

    @staticmethod
    def list_names(meta_ioctx: rados.Ioctx) -> list[str]:
        return sorted(obj.key for obj in meta_ioctx.list_objects())
