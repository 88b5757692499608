"""A log's metadata object: its epoch and view history, changed only by
compare-and-swap on the epoch inside the object class. Its calls go through
the native data plane like every other cls_zlog call."""
from __future__ import annotations

import errno
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import wire
from .errors import InvalidRequest, LogExists, LogNotFound
from .native import Connection, Op, Pool

if TYPE_CHECKING:
    import rados

logger = logging.getLogger("pyzlog")

#: a data-format object's bounds by default: 16384 positions and 32 MiB of
#: entries (entries of up to 2 KiB on average use up the positions first;
#: larger ones the bytes, and the object's remaining positions are filled);
#: docs/storage.md
DEFAULT_SLOTS = 16384
DEFAULT_BYTE_BOUND = 32 << 20
#: consecutive positions per run of a stripe's object (cls_zlog/ops.h,
#: "layout"): a batch of appends is one write_many to one or two objects, not
#: one per object of the stripe; docs/storage.md has the measurements
DEFAULT_UNIT = 128
#: what the class accepts (cls_zlog/store.cc)
MAX_SLOTS = 1 << 22
MAX_BYTE_BOUND = 1 << 31


@dataclass(frozen=True, slots=True)
class Geometry:
    """A data-format view's bounds (positions per object and bytes per
    object) and the runs its stripes are dealt in (positions per run)."""

    slots: int = DEFAULT_SLOTS
    byte_bound: int = DEFAULT_BYTE_BOUND
    unit: int = DEFAULT_UNIT

    @classmethod
    def of(cls, view: wire.View) -> Geometry | None:
        return cls(view.slots, view.byte_bound, view.unit) if view.bounded else None

    def fields(self) -> dict[str, int]:
        return {"format": wire.FORMAT_DATA, "slots": self.slots, "byte_bound": self.byte_bound, "unit": self.unit}


class MetaStore:
    def __init__(self, conn: Connection, pool: Pool, name: str) -> None:
        self.conn = conn
        self.pool = pool  # the pool's META_NAMESPACE
        self.name = name

    def create(self, width: int, config: dict[str, Any], geometry: Geometry | None = None) -> None:
        """Create the log with one view of `width` objects, in the data format
        with `geometry` (an OSD whose class predates it creates an omap log),
        else in the omap format."""
        blob = json.dumps(config, sort_keys=True).encode()
        code, _ = self.conn.call_raw(self.pool, self.name, Op.META_CREATE, width=width, data=blob,
                                     **(geometry.fields() if geometry else {}))
        if code == -errno.EPROTONOSUPPORT and geometry is not None and geometry.unit > 1:
            # an OSD whose class predates runs (it refuses the request rather
            # than take it for unit 1): runs of one position, as that class keeps them
            logger.warning("log %r: the OSDs' cls_zlog predates striping units; creating it with unit 1 "
                           "(docs/storage.md)", self.name)
            geometry = Geometry(geometry.slots, geometry.byte_bound, 1)
            code, _ = self.conn.call_raw(self.pool, self.name, Op.META_CREATE, width=width, data=blob,
                                         **geometry.fields())
        if code == -errno.EEXIST:
            raise LogExists(f"log {self.name!r} already exists", errno=errno.EEXIST)
        if code < 0:
            raise self.conn.error(code, f"create log {self.name!r}", pool=self.pool, oid=self.name,
                                  op=Op.META_CREATE)

    def get(self) -> wire.Meta:
        return self.parse(*self.conn.call_raw(self.pool, self.name, Op.META_GET))

    def request(self) -> tuple[Pool, str, Op, dict[str, Any]]:
        """get()'s call, to send among others (Connection.calls); parse() its answer."""
        return self.pool, self.name, Op.META_GET, {}

    def parse(self, code: int, raw: Any) -> wire.Meta:
        """The metadata from a META_GET's answer, or its error."""
        if code == -errno.ENOENT:
            raise LogNotFound(f"log {self.name!r} does not exist", errno=errno.ENOENT)
        if code < 0:
            raise self.conn.error(code, f"read metadata of log {self.name!r}", pool=self.pool, oid=self.name,
                                  op=Op.META_GET)
        return wire.parse_meta(raw)

    def new_epoch(self, expected: int, new_epoch: int, sequencer: str | None = None,
                  stripes: int = wire.ANY_STRIPES) -> None:
        """EpochChanged if the stored epoch is no longer `expected` (or the
        newest view has other than `stripes` stripes open). With `sequencer`,
        record it as the log's sequencer from `new_epoch` on; without, the
        recorded sequencer stays."""
        self._cas(Op.META_NEW_EPOCH, sequencer, expected=expected, next_epoch=new_epoch, expected_stripes=stripes)

    def propose_view(self, expected: int, new_epoch: int, start: int, width: int,
                     sequencer: str | None = None, geometry: Geometry | None = None,
                     stripes: int = wire.ANY_STRIPES) -> None:
        """Install a view of `width` objects from `start` (in the data format
        with `geometry`) at `new_epoch`, if the epoch is still `expected`."""
        self._cas(Op.META_PROPOSE_VIEW, sequencer, expected=expected, next_epoch=new_epoch, start=start,
                  width=width, expected_stripes=stripes, **(geometry.fields() if geometry else {}))

    def open_stripe(self, expected: int, stripe: int) -> int:
        """Open the newest view's stripes up to `stripe` if the epoch is still
        `expected`: 0, or -ESTALE if it moved on (the caller refreshes)."""
        code, _ = self.conn.call_raw(self.pool, self.name, Op.META_OPEN_STRIPE, expected=expected, stripe=stripe)
        if code == -errno.ECANCELED:
            return -errno.ESTALE
        if code < 0:
            raise self.conn.error(code, f"open stripe {stripe} of log {self.name!r}", pool=self.pool,
                                  oid=self.name, op=Op.META_OPEN_STRIPE)
        return 0

    def trim(self, position: int) -> bool:
        """Raise the log's trim point to position + 1; False where the class
        predates it (an omap log's objects keep their own watermarks)."""
        code, _ = self.conn.call_raw(self.pool, self.name, Op.META_TRIM, position=position)
        if code in (-errno.EOPNOTSUPP, -errno.EPROTONOSUPPORT):
            return False
        if code < 0:
            raise self.conn.error(code, f"trim log {self.name!r}", pool=self.pool, oid=self.name, op=Op.META_TRIM)
        return True

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
