"""A log: the public face over its metadata (core.state), its positions
(positions.py), the append pipelines (appending.py for sync appends,
pipeline.py for async ones), single-position calls (ops.py), streams
(batches.py) and epoch changes (core.tailfind). Every call to the storage
goes through the connection's native data plane (core.native)."""
from __future__ import annotations

import builtins
import inspect
import logging
import threading
import time
import types
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Final, Self

from typing import TYPE_CHECKING

from .. import _seqr  # type: ignore[attr-defined]
from ..core import offsets, wire
from ..core.cluster import open_ioctx
from ..core.codec import check_codec, codec_for
from ..core.errors import InvalidRequest, ZlogError
from ..core.layout import META_NAMESPACE, check_position
from ..core.metadata import (DEFAULT_BYTE_BOUND, DEFAULT_SLOTS, DEFAULT_UNIT, MAX_BYTE_BOUND, MAX_SLOTS, Geometry,
                             MetaStore)
from ..core.sequencer import SequencerClient
from ..core.state import LogState
from ..core.tailfind import find_tail, seal_new_epoch
from . import metrics, ops
from .appending import store, stored_form, stored_forms
from .batches import BatchStream, Records
from .consumer import Consumer, Start
from .pipeline import DEFAULT_MAX_IN_FLIGHT, LogAsync
from .positions import Positions, max_position, next_position_hint
from .reader import HOLE_WAIT_SECONDS, HoleClock, Record, check_stream_args

if TYPE_CHECKING:
    import rados

logger = logging.getLogger("pyzlog")

DEFAULT_WIDTH = 4
#: sync appends' latency, per call (client.metrics)
_SYNC_SECONDS = metrics.APPEND_SECONDS["sync"]
#: stream()'s batches on the native path: small enough that a record is
#: handed out soon after its object's reply, large enough to amortize a batch
STREAM_BATCH_ROWS = 4096
#: take_positions calls whose metadata a Log keeps, for write() (the newest)
TAKEN_KEPT = 256


#: classes whose every instance can be told, as known from the class alone (_can_tell); at most
#: TELLABLE_KEPT of them, so that a program making classes does not keep them all alive
_TELLABLE: set[type] = set()
TELLABLE_KEPT = 64


def _can_tell(future: Any) -> bool:
    """`future` has set_result and set_exception to call: an instance (a
    class's are unbound), whose attributes can be looked up. Asked once
    per append: a class whose instances cannot hide its two methods (no
    __dict__, no attribute hooks) is answered for once (a class changed
    after that, its methods deleted, is not looked at again)."""
    cls = type(future)
    if cls in _TELLABLE:
        return True
    if isinstance(future, type):
        return False
    try:
        ok = callable(getattr(future, "set_result", None)) and callable(getattr(future, "set_exception", None))
    except Exception:  # noqa: BLE001 - a property or __getattr__ that raises: it cannot be told either
        return False
    if ok and len(_TELLABLE) < TELLABLE_KEPT and _by_class_alone(cls):
        _TELLABLE.add(cls)
    return ok


def _by_class_alone(cls: type) -> bool:
    """An instance of `cls` finds set_result and set_exception where the
    class has them, as functions (or C methods): no instance __dict__ to
    shadow them, no __getattribute__ or __getattr__ to answer instead."""
    if cls.__dictoffset__ != 0 or inspect.getattr_static(cls, "__getattribute__") is not object.__getattribute__ \
            or inspect.getattr_static(cls, "__getattr__", None) is not None:
        return False
    return all(isinstance(inspect.getattr_static(cls, name, None), _METHODS)
               for name in ("set_result", "set_exception"))


_METHODS = (types.FunctionType, types.BuiltinFunctionType, types.MethodDescriptorType)


class Log:
    """One log in one pool. Obtain with Log.create or Log.open."""

    #: the lowest level of a stream's skip pointers in append_streams' answer (the levels
    #: below it are covered by the K recent positions; client/streams.py)
    STREAM_FIRST_LEVEL: Final[int] = _seqr.STREAM_FIRST_LEVEL

    def __init__(self, cluster: rados.Rados, pool: str, name: str,
                 sequencer: SequencerClient | str | None = None,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, coalesce: bool = True) -> None:
        self.state = LogState(cluster, pool, name)
        self.positions = Positions(self.state, SequencerClient(sequencer, cluster=cluster)
                                   if isinstance(sequencer, str) else sequencer)
        self._async = LogAsync(self.state, self.positions, max_in_flight, coalesce)
        self._taken: OrderedDict[int, tuple[int, wire.Meta]] = OrderedDict()  # take_positions: first -> (count, meta)
        self._taken_lock = threading.Lock()

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def create(cls, cluster: rados.Rados, pool: str, name: str, width: int = DEFAULT_WIDTH,
               config: dict[str, Any] | None = None,
               sequencer: SequencerClient | str | None = None, *, compression: str = "none",
               max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, coalesce: bool = True, format: str = "data",
               slots: int = DEFAULT_SLOTS, byte_bound: int = DEFAULT_BYTE_BOUND, unit: int | None = None) -> Log:
        """A new log striped over `width` objects; LogExists if the name is taken.
        `compression` ("none" or "zstd") is recorded in the log's metadata.
        `format`: "data" (the default: entries in bounded objects' data,
        `slots` positions and `byte_bound` bytes of entries per object,
        counted by Ceph's usage and quotas, each stripe dealt to its objects
        in runs of `unit` consecutive positions (a divisor of `slots`; by
        default the largest up to 128), so that a batch of appends is one
        write to one object; docs/storage.md) or "omap" (round 2's
        unbounded objects; also what an OSD whose class predates the data
        format makes). `max_in_flight` and `coalesce` are as for open()."""
        _check_width(width)
        geometry = _geometry(format, slots, byte_bound, unit)
        config = dict(config or {})
        config.setdefault("compression", check_codec(compression))
        codec_for(config)  # refuse an unknown codec before creating anything
        log = cls(cluster, pool, name, sequencer, max_in_flight, coalesce)
        log.state.meta_store.create(width, config, geometry)
        log.refresh()
        return log

    @classmethod
    def open(cls, cluster: rados.Rados, pool: str, name: str,
             sequencer: SequencerClient | str | None = None,
             max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, coalesce: bool = True) -> Log:
        """The log `name` (LogNotFound if missing). At most `max_in_flight` async
        operations are outstanding at once. With `coalesce`, async appends queued
        together for one data object are sent as one write_many call."""
        log = cls(cluster, pool, name, sequencer, max_in_flight, coalesce)
        log.refresh()  # LogNotFound if missing
        return log

    @staticmethod
    def list(cluster: rados.Rados, pool: str) -> builtins.list[str]:
        # the namespace also holds named consumers' positions (core.offsets)
        return [n for n in MetaStore.list_names(open_ioctx(cluster, pool, META_NAMESPACE))
                if offsets.is_log_object(n)]

    # ------------------------------------------------------------- metadata
    @property
    def cluster(self) -> rados.Rados:
        return self.state.cluster

    @property
    def pool(self) -> str:
        return self.state.pool

    @property
    def name(self) -> str:
        return self.state.name

    @property
    def sequencer(self) -> SequencerClient | None:
        return self.positions.sequencer

    def refresh(self) -> wire.Meta:
        """Read the metadata again (never going back to an older epoch)."""
        return self.state.refresh()

    @property
    def meta(self) -> wire.Meta:
        return self.state.meta

    @property
    def epoch(self) -> int:
        return self.state.epoch

    @property
    def views(self) -> tuple[wire.View, ...]:
        return self.state.views

    @property
    def config(self) -> dict[str, Any]:
        return self.state.config

    def oid_of(self, position: int) -> str:
        return self.state.oid_of(position)

    # ---------------------------------------------------- position operations
    def write(self, position: int, data: bytes) -> None:
        """Store `data` at `position` (write-once). Most users want append().
        A position this Log handed out (take_positions) is written at the
        epoch it was handed out under: StaleEpoch if the log moved on since
        (take a new one)."""
        ops.write(self.state, position, stored_form(self.state, data), self._handed_out_under(position))

    def read(self, position: int) -> bytes:
        """The entry at `position`; NotWritten, Filled or Trimmed otherwise."""
        return ops.read(self.state, position)

    def fill(self, position: int) -> None:
        """Mark an unwritten position as junk so the log can move past it."""
        ops.fill(self.state, position)

    def fill_lost(self, position: int) -> None:
        """Fill a hole whose writer never wrote, recording that it was lost:
        every reader from then on reports it as LOST, not as plain FILLED."""
        ops.fill(self.state, position, wire.FILL_LOST)

    def trim(self, position: int) -> None:
        """Reclaim one position's space; reads then raise Trimmed."""
        ops.trim(self.state, position)

    def trim_to(self, position: int) -> None:
        """Trim every position <= `position` (see ops.trim_to)."""
        check_position(position)
        counter = self.positions.counter()
        # a sequencer whose counter is not known to lie past the trim point counts on from past it (ops.trim_to)
        past = position >= counter if counter is not None else self.positions.sequencer is not None
        ops.trim_to(self.state, position, past_counter=past)

    # ------------------------------------------------------------------ tail
    def max_position(self) -> int | None:
        """Highest position written, filled or trimmed in the newest view, without sealing."""
        return max_position(self.state)

    def next_position_hint(self) -> int:
        """The next position an append would try, from max_position (no seal)."""
        return next_position_hint(self.state)

    def first_position(self) -> int:
        """The first position not trimmed by trim_to (0 if none was)."""
        return ops.first_position(self.state)

    def warm_sequencer(self) -> None:
        """Connect to the log's sequencer now (its handshake reads the pool's
        secret: about a millisecond), so that the first append or tail
        request made later does not wait for it. A thread that knows it will
        ask soon calls it while doing something else; errors are left for
        that request to meet."""
        self.positions.warm()

    def tail(self) -> int:
        """The next position an append would get (the sequencer's counter, or
        without a sequencer the position after the highest one stored)."""
        return self.positions.tail()

    def seal_and_find_tail(self) -> tuple[int, int]:
        """Slow tail finding: new epoch, seal, max. Returns (epoch, next position)."""
        return find_tail(self.state)

    def take_positions(self, count: int) -> int:
        """First of `count` fresh positions (from the sequencer, or slow tail
        finding), for a writer that will write them itself (write())."""
        first, meta = self.positions.take(count)
        with self._taken_lock:
            self._taken[first] = (count, meta)
            while len(self._taken) > TAKEN_KEPT:
                self._taken.popitem(last=False)
        return first

    def _handed_out_under(self, position: int) -> wire.Meta | None:
        """The metadata take_positions handed `position` out under (None if
        it did not, or too many calls ago)."""
        with self._taken_lock:
            for first, (count, meta) in reversed(self._taken.items()):
                if first <= position < first + count:
                    return meta
        return None

    # ---------------------------------------------------------------- append
    def append(self, data: bytes) -> int:
        """Append one entry and return its position.

        The position comes from the sequencer; without one (or while it is
        unreachable) from slow tail finding. A stale epoch refreshes the view
        and takes a new position; so does a position someone else wrote or
        filled first. Success is reported only for data that is stored."""
        t0 = time.monotonic()
        pos = store(self.state, self.positions, [stored_form(self.state, data)], "append")[0]
        _SYNC_SECONDS.observe(time.monotonic() - t0)
        return pos

    def append_many(self, entries: builtins.list[bytes]) -> builtins.list[int]:
        """Append entries with one sequencer request and one write_many call
        per object. Positions are increasing in entry order unless a write is
        refused (a position filled or taken meanwhile): that entry is appended
        again at a later position. Returns the position of each entry."""
        t0 = time.monotonic()
        out = store(self.state, self.positions, stored_forms(self.state, entries), "append_many")
        _SYNC_SECONDS.observe(time.monotonic() - t0)
        return out

    def append_slow(self, data: bytes) -> int:
        """Append by slow tail finding, without asking any sequencer."""
        t0 = time.monotonic()
        pos = store(self.state, self.positions, [stored_form(self.state, data)], "append_slow", slow=True)[0]
        _SYNC_SECONDS.observe(time.monotonic() - t0)
        return pos

    # --------------------------------------------------------------- streams
    def append_streams(self, streams: builtins.list[int], entries: builtins.list[bytes],
                       build: Callable[[bytes, int, int, Any], bytes] | None = None, *,
                       build_all: Callable[[int, int, Any, builtins.list[bytes]], builtins.list[bytes]] | None = None,
                       ) -> builtins.list[int]:
        """Append entries that belong to every stream of `streams` (64-bit
        ids, at most 64), with one sequencer request for the lot: the
        sequencer records their positions per stream and answers each
        stream's previous positions, and build(entry, position, K,
        [(stream, horizon, backpointers newest first)]) makes the bytes
        stored at each position (client/streams.py). Or build_all(first, K,
        answer, entries): the bytes of a round's entries at first, first + 1,
        ... at once, from the sequencer's answer as it came ([(stream,
        horizon, recent, ordinal, [(level, position)])]; entry_backpointers
        reads it). StreamsUnsupported if the sequencer does not answer
        stream requests."""
        from .streams import append_streams

        return append_streams(self.state, self.positions, streams, entries, build, build_all)

    def stream_tail(self, streams: builtins.list[int], history: int = 0) -> tuple[int, int, Any, int] | None:
        """(tail, K, [(stream, horizon, backpointers newest first)], epoch) as
        the sequencer knows them now (a sequencer answers only at its own
        epoch, which the last item is), or None when no sequencer answers. With
        `history`, each stream's backpointers are its last `history`
        positions (at most 8,192, and 65,536 over the streams asked) if the
        sequencer keeps more than K of them."""
        return self.positions.tail_streams(streams, history)

    def read_positions(self, positions: builtins.list[int]) -> dict[int, bytes | int]:
        """Entries at any set of positions, one read op per data object:
        {position: bytes, or the negative code of a position not readable}.
        InvalidRequest if one is not a position (an int in [0, MAX_POSITION])."""
        from .streams import read_positions

        return read_positions(self.state, positions)

    # ----------------------------------------------------------------- async
    def append_async(self, data: bytes, future: Any = None) -> Future[int]:
        """Append without waiting: a Future of the position. Blocks only while
        max_in_flight operations are outstanding. Entries queued together
        share a sequencer request and, with coalesce (the default), one
        write_many call per data object (see pipeline.py). `future`: settled
        instead of a new one, and returned: any object with set_result(position)
        and set_exception(error), one of them called once, on the client's
        completion or retry thread, or before this returns for an append
        refused at once (a revoked client, a closed connection); never if
        this raises (bad input, LogClosed). A layer that keeps a record of
        each append makes no Future for it (client.aio's settle on their
        event loop). InvalidRequest if `future` cannot be told."""
        if future is not None and not _can_tell(future):
            raise InvalidRequest(f"future= takes an object with set_result and set_exception, not {future!r}")
        fut = self._async.hot_append(data, future)  # the common case, in C
        return fut if fut is not None else self._async.append(stored_form(self.state, data), future)

    def read_async(self, position: int) -> Future[bytes]:
        check_position(position)
        return self._async.read(position)

    def flush(self, timeout: float | None = None) -> None:
        """Wait for every async operation to finish."""
        self._async.flush(timeout)

    def close(self) -> None:
        self._async.close()
        self.positions.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- stream
    def stream(self, start: int = 0, end: int | None = None, *, follow: bool = False,
               hole_wait: float = HOLE_WAIT_SECONDS, stride_index: int | None = None,
               stride: int | None = None, known_tail: int | None = None,
               on_corrupt: Any = "fail") -> Iterator[Record]:
        """Records for positions start, start+1, ... in order: DATA, or a gap
        (FILLED, TRIMMED, or LOST for a hole a reader filled after waiting
        `hole_wait` seconds for its writer; this reader fills such holes too). Stops before `end`, or at the tail
        unless `follow` is set, in which case it waits for new entries.

        A partitioned reader passes `stride` and `stride_index` to get only the
        positions p with p % stride == stride_index, and `known_tail` when it
        knows every position below it was handed out.

        A position damaged at rest (its entry, or its object's header) stops
        the stream with CorruptEntry naming it and its object (`on_corrupt`
        "fail", the default). With "skip", or a callable (called with each
        CorruptEntry), it is handed out as a CORRUPT record (no data),
        counted (zlog_client_corrupt_skipped_total) and logged, and the
        stream goes on: Spark's onDataLoss for damage. A position of an
        object whose header is lost is skipped only once a later position is
        known to be stored (before that it cannot be told from the tail).

        Records come from stream_batches' walk (the native read path), each
        decoded and counted as it is handed out."""
        check_stream_args(start, end, stride_index, stride, on_corrupt)
        return Records(BatchStream(self.state, start, end, follow=follow, hole_wait=hole_wait,
                                   stride_index=stride_index, stride=stride, known_tail=known_tail,
                                   max_rows=STREAM_BATCH_ROWS, decode=False, on_corrupt=on_corrupt, rows=True))

    def stream_batches(self, start: int = 0, end: int | None = None, *, follow: bool = False,
                       hole_wait: float = HOLE_WAIT_SECONDS, stride_index: int | None = None,
                       stride: int | None = None, known_tail: int | None = None,
                       signed: bool = False, on_corrupt: Any = "fail",
                       hole_clock: HoleClock | None = None, rows: bool = False) -> Iterator[Any]:
        """stream() as pyarrow.RecordBatch es, on the native read path:
        columns position, data (null unless the kind is data), kind (data,
        filled, trimmed, lost; corrupt with on_corrupt="skip"), epoch, with
        the same positions, gaps, hole filling and damage rule as stream().
        `signed`: position and epoch as int64. `hole_clock`: a reader that
        reads a range in pieces (a stream per piece) passes one HoleClock to
        all of them, so a hole it has known to lie below the tail for
        `hole_wait` is filled at once, not waited for anew by each piece.
        `rows`: for native consumers, a batch read as stored (no decoding or
        filtering to do) comes as a core.scan.RowSet instead, its rows left
        in the replies they were read into (RowSet.columns), with no Arrow
        column made; other batches (lost or corrupt rows, a compressed log's,
        a stride's) still come as record batches."""
        check_stream_args(start, end, stride_index, stride, on_corrupt)
        return iter(BatchStream(self.state, start, end, follow=follow, hole_wait=hole_wait,
                                stride_index=stride_index, stride=stride, known_tail=known_tail, signed=signed,
                                on_corrupt=on_corrupt, holes=hole_clock, rows=rows))

    def read_batches(self, start: int, end: int, *, hole_wait: float = HOLE_WAIT_SECONDS,
                     signed: bool = False) -> Iterator[Any]:
        """The positions [start, end) as record batches (stream_batches up to
        `end`, or to the tail if it comes first)."""
        return self.stream_batches(start, end, hole_wait=hole_wait, signed=signed)

    # ------------------------------------------------------------- consumers
    def consumer(self, name: str, *, start: Start = "earliest") -> Consumer:
        """The named consumer `name` of this log: it hands out records from
        its committed position (kept in RADOS), or from `start` ("earliest":
        the first position not trimmed, "latest": the tail, or a position) if
        it never committed. See client.consumer and docs/consumers.md."""
        return Consumer(self, name, start=start)

    def consumers(self) -> dict[str, offsets.Committed]:
        """Every named consumer of this log and its stored position."""
        return offsets.list_consumers(self.consumer_ioctx(), self.name).get(self.name, {})

    def consumer_ioctx(self) -> rados.Ioctx:
        """Where this log's consumers keep their positions (core.offsets)."""
        return open_ioctx(self.cluster, self.pool, META_NAMESPACE)

    # -------------------------------------------------------- reconfiguration
    def reconfigure(self, width: int) -> wire.View:
        """Stripe new positions over `width` objects: seal the newest view at a
        new epoch, find its tail, and install a view starting after it. Old
        positions stay where they were written; other clients refresh when
        their old epoch is refused."""
        _check_width(width)
        for _ in range(5):
            epoch, start = seal_new_epoch(self.state, width,
                                          f"reconfigure {self.name!r}: the epoch kept changing under us")
            if self.views[-1].width == width:
                break
            # we finished a reconfiguration someone else had cut in half (with
            # its width): now make ours
        else:
            raise ZlogError(f"reconfigure {self.name!r}: other reconfigurations kept racing ours")
        logger.info("log %r: view %d from position %d over %d objects", self.name, epoch, start, width)
        return self.views[-1]


def _geometry(format: str, slots: int, byte_bound: int, unit: int | None) -> Geometry | None:
    if format == "omap":
        if unit is not None:
            raise InvalidRequest("unit is a data-format setting: an omap view holds every width-th position")
        return None
    if format != "data":
        raise InvalidRequest(f"format must be 'data' or 'omap', not {format!r}")
    for what, value, top in (("slots", slots, MAX_SLOTS), ("byte_bound", byte_bound, MAX_BYTE_BOUND)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top:
            raise InvalidRequest(f"{what} must be 1..{top}, not {value!r}")
    if unit is None:
        unit = next(u for u in range(min(DEFAULT_UNIT, slots), 0, -1) if slots % u == 0)
    if not isinstance(unit, int) or isinstance(unit, bool) or not 1 <= unit <= wire.MAX_UNIT:
        raise InvalidRequest(f"unit must be 1..{wire.MAX_UNIT}, not {unit!r}")
    if slots % unit:
        raise InvalidRequest(f"slots ({slots}) must be a multiple of unit ({unit})")
    return Geometry(slots, byte_bound, unit)


def _check_width(width: int) -> None:
    if not isinstance(width, int) or isinstance(width, bool) or not 1 <= width <= wire.MAX_WIDTH:
        raise InvalidRequest(f"stripe width must be 1..{wire.MAX_WIDTH}, not {width!r}")


__all__ = ["DEFAULT_WIDTH", "Log"]
