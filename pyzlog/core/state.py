"""One log's view of the world: its metadata (epoch, views, config), and
which object holds a position. The one home for these; everything that
reads, writes or changes the epoch of a log works from a LogState.

Refresh never goes back: threads sharing a LogState may refresh at once, and
a slower read of an older epoch must not replace a newer one. The epoch and
the view history are replaced together, as one snapshot (wire.Meta), so a
request tagged with one refresh's epoch never uses another's views.
"""
from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any

from . import wire
from .codec import Codec, codec_for
from .errors import ZlogError
from .layout import META_NAMESPACE, Place, check_name, place_of
from .metadata import MetaStore
from .native import Connection

if TYPE_CHECKING:
    import rados


#: a read that finds a position's object never made reads the metadata again at most this often (moved_past)
VIEW_RECHECK_SECONDS = 1.0


class LogState:
    """The metadata of log `name` in `pool` as this client last read it."""

    def __init__(self, cluster: rados.Rados, pool: str, name: str) -> None:
        self.cluster = cluster
        self.pool = pool
        self.name = check_name(name)
        #: the data plane every call of this log goes through, and its pools
        self.conn = Connection.of(cluster)
        self.data = self.conn.pool(pool)
        self.meta_store = MetaStore(self.conn, self.conn.pool(pool, META_NAMESPACE), name)
        self._meta: wire.Meta | None = None
        #: when the metadata was last read (time.monotonic)
        self.read_at = 0.0
        self._meta_lock = threading.Lock()
        #: one epoch-change repair at a time per client (see tailfind.repair)
        self.repair_lock = threading.Lock()
        self.encode: Codec
        self.decode: Codec
        self.encode, self.decode = codec_for({})
        #: entries are stored as given (no compression): nothing to encode
        self.plain = True
        #: the OSDs' class answers read_set (client/streams.py; False once one did not)
        self.read_set = True
        #: stripes this client opened, per view epoch, that its metadata may not show yet
        self._opened: dict[int, int] = {}

    def refresh(self) -> wire.Meta:
        """Read the metadata again; LogNotFound if the log is gone."""
        return self.adopt(self.meta_store.get())

    def adopt(self, fetched: wire.Meta) -> wire.Meta:
        """`fetched`, metadata just read, as this client's newest snapshot
        (unless a newer one is known: the metadata only moves forward)."""
        self.read_at = time.monotonic()
        with self._meta_lock:
            current = self._meta
            if current is None or fetched.epoch >= current.epoch:
                if current is None or fetched.config != current.config:
                    config = json.loads(fetched.config) if fetched.config else {}
                    self.encode, self.decode = codec_for(config)
                    self.plain = config.get("compression", "none") == "none"
                self._meta = current = fetched
            return current

    def refresh_epoch(self) -> int:
        return self.refresh().epoch

    def moved_past(self, epoch: int) -> bool:
        """After a read at `epoch` found the object of a position never made:
        is the log past that epoch? A view from before a reconfiguration maps
        the new view's positions to stripes it never opened (the answer
        "not written" would be wrong). The metadata is read again at most
        once per VIEW_RECHECK_SECONDS (a reader polling the next position
        at a stripe's end meets this on every poll); a failed read answers
        False (the read's own answer stands)."""
        if self.meta.epoch > epoch:
            return True
        if time.monotonic() - self.read_at < VIEW_RECHECK_SECONDS:
            return False
        try:
            return self.refresh().epoch > epoch
        except ZlogError:
            return False

    @property
    def meta(self) -> wire.Meta:
        """The newest snapshot read (read now if none was)."""
        return self._meta if self._meta is not None else self.refresh()

    @property
    def epoch(self) -> int:
        return self.meta.epoch

    @property
    def views(self) -> tuple[wire.View, ...]:
        return self.meta.views

    @property
    def config(self) -> dict[str, Any]:
        raw = self.meta.config
        return json.loads(raw) if raw else {}

    def oid_of(self, position: int) -> str:
        return place_of(self.name, self.views, position).oid

    def locate(self, position: int) -> tuple[int, Place]:
        """(epoch, object) for `position` from one metadata snapshot."""
        meta = self.meta
        return meta.epoch, place_of(self.name, meta.views, position)

    def open_stripes(self, view: wire.View) -> int:
        """How many stripes of `view` are known to be open."""
        return max(view.stripes, self._opened.get(view.epoch, 0))

    def opened(self, view: wire.View, stripe: int) -> None:
        """This client opened `stripe` of `view` (its metadata may not show it yet)."""
        with self._meta_lock:
            self._opened[view.epoch] = max(self._opened.get(view.epoch, 0), stripe + 1)
