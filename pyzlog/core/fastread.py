"""The native read path: cls_zlog's read calls on librados' C API.

python-rados costs the read path the most: a Python Completion and a callback
that takes the GIL on a librados thread for every call, no read op with a
class call in it, and a Python object for every entry of a range. This module
wraps `pyzlog._fastread`, a cffi module (API mode) over librados' C API
(`fastread/fastread.c`), which does none of that:

- `Native.of(cluster)` opens one more RADOS connection with the settings of a
  python-rados connection (`cluster.connection_settings`), shared by
  everything that reads through this cluster.
- A `ReadQueue` sends `read`, `read_range`, `stat`, `max_position` (or any
  read-only method) as librados read ops with `rados_read_op_exec`; reads of
  several positions of one object can share one op (`read_many`). librados'
  callbacks queue the finished ops in C; `ReadQueue.wait()` returns every
  result ready, many at once, as `(tag, code, value)`.
- A `read_range` reply arrives as a `RangeWindow`, an index over the reply's
  bytes built in C. `RangeWindow.record_batch()` and `build_batch()` write
  its entries into Arrow column buffers in C, with no Python object per entry,
  and wrap them as a `pyarrow.RecordBatch` (`BATCH_SCHEMA`).
- `Reads` resolves a `concurrent.futures.Future` per single read from one
  thread that drains a queue: the shape `Log.read_async` needs.

Errors come back as codes (0 or -errno) so a caller can refresh its view on
`-ESTALE` and retry; `error()` turns a code into the typed exception that
`pyzlog.errors.from_errno` would give (ETIMEDOUT -> ClusterUnavailable).

Lifetimes are safe by construction: an op holds its queue and connection (in
C) until librados has called back, and no callback ever calls into Python. A
queue dropped with reads in flight frees itself when the last one completes;
at interpreter exit every native connection waits briefly for its reads and
then shuts librados down.
"""
from __future__ import annotations

import errno
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import wire
from .cluster import DEFAULT_CONNECT_TIMEOUT, DEFAULT_OP_TIMEOUT, connection_settings
from .errors import (
    ClusterUnavailable,
    NotWritten,
    PermissionDenied,
    PoolNotFound,
    ZlogError,
    from_errno,
)
from .objects import native_call, on_exit

if TYPE_CHECKING:
    import pyarrow as pa
    import rados

from .._fastread import ffi, lib  # the cffi extension (untyped)

#: result kinds (which call a result answers)
READ, RANGE, STAT, MAX_POSITION, EXEC = lib.FR_READ, lib.FR_RANGE, lib.FR_STAT, lib.FR_MAX_POSITION, lib.FR_EXEC
#: why build_batch stopped
STOP_END, STOP_FULL, STOP_NEED, STOP_MISSING = lib.FR_STOP_END, lib.FR_STOP_FULL, lib.FR_STOP_NEED, lib.FR_STOP_MISSING
#: row kinds of a batch's "kind" column, in code order (pyzlog.reader.RecordKind values)
KIND_NAMES = ("data", "filled", "trimmed", "lost")
MAX_CALLS_PER_OP = lib.FR_MAX_CALLS_PER_OP
#: seconds a native connection waits for its reads at interpreter exit before
#: it shuts librados down anyway
EXIT_DRAIN_SECONDS = 2.0

#: (tag, code, value): code 0 or -errno; value by kind: bytes (READ, EXEC),
#: RangeWindow (RANGE), wire.ObjectStat (STAT), int | None (MAX_POSITION); None if code < 0
Result = tuple[int, int, Any]


def error(code: int, what: str, position: int | None = None) -> ZlogError:
    """The typed error for a failed result's code, as the python-rados path
    raises it: -ENOENT on a read is NotWritten (the object was never created),
    -ETIMEDOUT is ClusterUnavailable, -ESTALE is StaleEpoch."""
    if code == -errno.ENOENT and position is not None:
        return NotWritten(position)
    if code == -errno.EBADMSG:
        return ZlogError(f"{what}: malformed reply from the object class")
    if code == -errno.ETIMEDOUT:
        return ClusterUnavailable(f"{what}: the cluster did not answer in time")
    if code == -errno.ESHUTDOWN:
        return ClusterUnavailable(f"{what}: the native RADOS connection is closed")
    return from_errno(code, what, position)


def _oid(oid: str | bytes) -> bytes:
    return oid.encode() if type(oid) is str else oid  # type: ignore[return-value]


# ------------------------------------------------------------------ connection
class Pool:
    """An I/O context on a pool (and namespace); it lives as long as its Native."""

    __slots__ = ("handle", "name", "namespace", "native")

    def __init__(self, native: Native, name: str, namespace: str, handle: Any) -> None:
        self.native, self.name, self.namespace, self.handle = native, name, namespace, handle

    def __repr__(self) -> str:
        ns = f", namespace {self.namespace!r}" if self.namespace else ""
        return f"<fastread.Pool {self.name!r}{ns}>"


class Native:
    """One librados connection (rados_t) for the native read path, opened as
    a python-rados connection was (same client, ceph.conf, keys, timeouts).
    Obtain it with Native.of(cluster): one per cluster, shared by all logs."""

    def __init__(self, cluster: rados.Rados) -> None:
        client, conf_file, options = connection_settings(cluster)
        opts = dict(options)
        # Never wait forever: a connection without an op timeout gets pyzlog's
        # defaults, so a read of a cluster that went away ends with ETIMEDOUT.
        for key, default in (("rados_osd_op_timeout", DEFAULT_OP_TIMEOUT),
                             ("rados_mon_op_timeout", DEFAULT_CONNECT_TIMEOUT),
                             ("client_mount_timeout", DEFAULT_CONNECT_TIMEOUT)):
            try:
                ok = float(opts.get(key, "0")) > 0
            except ValueError:
                ok = False
            if not ok:
                opts[key] = str(math.ceil(default))
        self.op_timeout = float(opts["rados_osd_op_timeout"])
        self.client = client
        keep = [ffi.new("char[]", s.encode()) for kv in opts.items() for s in kv]
        keys = ffi.new("char *[]", keep[0::2])
        values = ffi.new("char *[]", keep[1::2])
        out = ffi.new("fr_cluster **")
        err = ffi.new("char[]", 512)
        ret = lib.fr_cluster_open(client.encode(), conf_file.encode(), keys, values, len(opts), out, err, 512)
        if ret < 0:
            msg = ffi.string(err).decode(errors="replace")
            if -ret in (errno.EACCES, errno.EPERM):
                raise PermissionDenied(f"native read path: cephx refused {client}: {msg}")
            raise ClusterUnavailable(f"native read path: {msg}")
        self._handle = out[0]
        self._pools: dict[tuple[str, str], Pool] = {}
        self._lock = threading.Lock()
        self.closed = False

    @classmethod
    def of(cls, cluster: rados.Rados) -> Native:
        """The native connection for `cluster`, opened on first use."""
        with _natives_lock:
            entry = _natives.get(id(cluster))
            if entry is not None and entry[0] is cluster and not entry[1].closed:
                return entry[1]
            with native_call():  # an exit meanwhile waits for this, then closes it
                native = cls(cluster)
                # holds `cluster` too, so its id() is not reused while the entry lives
                _natives[id(cluster)] = (cluster, native)
            return native

    def pool(self, name: str, namespace: str = "") -> Pool:
        """The I/O context on `name` (PoolNotFound if it does not exist)."""
        key = (name, namespace)
        pool = self._pools.get(key)
        if pool is not None:
            return pool
        with self._lock:
            if key not in self._pools:
                if self.closed:
                    raise ClusterUnavailable("the native RADOS connection is closed")
                out = ffi.new("fr_pool **")
                ret = lib.fr_pool_open(self._handle, name.encode(), namespace.encode(), out)
                if ret == -errno.ENOENT:
                    raise PoolNotFound(f"pool {name!r} does not exist")
                if ret < 0:
                    raise error(ret, f"opening pool {name!r}")
                self._pools[key] = Pool(self, name, namespace, out[0])
            return self._pools[key]

    def queue(self, max_results: int = 1024) -> ReadQueue:
        return ReadQueue(self, max_results)

    def close(self, timeout: float = 30.0) -> int:
        """Refuse new reads, wait up to `timeout` for those in flight, shut
        librados down. Returns how many were still in flight."""
        with self._lock:
            if self.closed:
                return 0
            self.closed = True
        with _natives_lock:
            for key, (_, native) in list(_natives.items()):
                if native is self:
                    del _natives[key]
        return int(lib.fr_cluster_close(self._handle, timeout))


_natives: dict[int, tuple[Any, Native]] = {}
_natives_lock = threading.Lock()


def _close_all() -> None:
    """Before the interpreter finalizes, stop every native connection's
    librados threads (after a bounded wait for reads in flight)."""
    with _natives_lock:
        natives = [n for _, n in _natives.values()]
    for native in natives:
        native.close(EXIT_DRAIN_SECONDS)


on_exit(_close_all)


# ------------------------------------------------------------------- windows
class RangeWindow:
    """One read_range reply of one object, indexed in C (no Python object per
    entry). Every position of the object in [first, next) that is not listed
    and not below trim_below is unwritten."""

    __slots__ = ("_w",)

    def __init__(self, handle: Any) -> None:
        self._w = ffi.gc(handle, lib.fr_window_free)

    @classmethod
    def parse(cls, reply: bytes, first: int = 0) -> RangeWindow:
        """A window over a reply that came another way (copied); ValueError if malformed."""
        w = lib.fr_window_parse(reply, len(reply), first)
        if w == ffi.NULL:
            raise ValueError("malformed read_range reply")
        return cls(w)

    @property
    def first(self) -> int:
        return int(self._w.first)

    @property
    def next(self) -> int:
        return int(self._w.next)

    @property
    def trim_below(self) -> int:
        return int(self._w.trim_below)

    @property
    def max_position(self) -> int | None:
        return int(self._w.max_position) if self._w.has_max else None

    @property
    def count(self) -> int:
        return int(self._w.count)

    @property
    def remaining(self) -> int:
        """Entries build_batch has not consumed yet."""
        return int(self._w.count - self._w.head)

    @property
    def data_bytes(self) -> int:
        return int(self._w.data_bytes)

    def entries(self) -> Iterator[wire.RangeEntry]:
        """The entries as wire.RangeEntry objects (the slow, per-entry view)."""
        pos, state, epoch = ffi.new("uint64_t *"), ffi.new("uint8_t *"), ffi.new("uint64_t *")
        data, length = ffi.new("char **"), ffi.new("uint32_t *")
        for i in range(self._w.count):
            lib.fr_window_entry(self._w, i, pos, state, epoch, data, length)
            yield wire.RangeEntry(int(pos[0]), wire.EntryState(state[0]), int(epoch[0]),
                                  ffi.unpack(data[0], length[0]))

    def record_batch(self, *, signed: bool = False) -> pa.RecordBatch:
        """Every entry not consumed yet, in order, as one Arrow record batch."""
        b = lib.fr_window_batch(self._w)
        if b == ffi.NULL:
            raise MemoryError("fr_window_batch")
        return _record_batch(ffi.gc(b, lib.fr_batch_free), signed)

    def __repr__(self) -> str:
        return f"<RangeWindow [{self.first}, {self.next}) {self.count} entries, trim_below {self.trim_below}>"


# ------------------------------------------------------------------- batches
_schemas: dict[bool, Any] = {}


def batch_schema(signed: bool = False) -> pa.Schema:
    """position, data (null unless DATA), kind (dictionary of KIND_NAMES), epoch.
    signed: position and epoch as int64 (Spark's long) instead of uint64."""
    schema = _schemas.get(signed)
    if schema is None:
        import pyarrow as pa

        num = pa.int64() if signed else pa.uint64()
        schema = _schemas[signed] = pa.schema([
            pa.field("position", num, nullable=False),
            pa.field("data", pa.binary()),
            pa.field("kind", pa.dictionary(pa.int8(), pa.string()), nullable=False),
            pa.field("epoch", num, nullable=False),
        ])
    return schema


_kind_dictionary: Any = None


def _record_batch(b: Any, signed: bool) -> pa.RecordBatch:
    """Arrow arrays over an fr_batch's columns, without copying; the buffers
    keep `b` (and so its memory) alive."""
    import pyarrow as pa

    global _kind_dictionary
    if _kind_dictionary is None:
        _kind_dictionary = pa.array(KIND_NAMES, pa.string())
    n = int(b.rows)
    foreign: Any = pa.foreign_buffer  # untyped in pyarrow's stubs

    def addr(p: Any) -> int:
        return int(ffi.cast("uintptr_t", p))

    schema = batch_schema(signed)
    num = schema.field("position").type
    positions = pa.Array.from_buffers(num, n, [None, foreign(addr(b.positions), 8 * n, base=b)])
    epochs = pa.Array.from_buffers(num, n, [None, foreign(addr(b.epochs), 8 * n, base=b)])
    codes = pa.Array.from_buffers(pa.int8(), n, [None, foreign(addr(b.kinds), n, base=b)])
    kinds = pa.DictionaryArray.from_arrays(codes, _kind_dictionary)
    data = pa.Array.from_buffers(pa.binary(), n, [
        foreign(addr(b.validity), (n + 7) // 8, base=b),
        foreign(addr(b.offsets), 4 * (n + 1), base=b),
        foreign(addr(b.data), int(b.data_len), base=b),
    ], null_count=int(b.null_count))
    return pa.RecordBatch.from_arrays([positions, data, kinds, epochs], schema=schema)


def batch_of(positions: Sequence[int], kinds: Sequence[str], epochs: Sequence[int],
             data: Sequence[bytes | None], *, signed: bool = False) -> pa.RecordBatch:
    """A batch of BATCH_SCHEMA from Python values: for the few rows a reader
    makes itself (a hole it filled as lost), so every batch has one schema."""
    import pyarrow as pa

    schema = batch_schema(signed)
    num = schema.field("position").type
    codes = pa.array([KIND_NAMES.index(k) for k in kinds], pa.int8())
    kind_dict: Any = pa.DictionaryArray.from_arrays(codes, pa.array(KIND_NAMES, pa.string()))
    return pa.RecordBatch.from_arrays([pa.array(positions, num), pa.array(data, pa.binary()), kind_dict,
                                       pa.array(epochs, num)], schema=schema)


@dataclass(frozen=True, slots=True)
class Built:
    """What build_batch produced and where it stopped."""

    batch: pa.RecordBatch
    stop: int            # STOP_END, STOP_FULL, STOP_NEED or STOP_MISSING
    stop_position: int   # the first position not in the batch
    stop_object: int     # STOP_NEED: the object (index in the view) whose window ran out


def build_batch(windows: Sequence[RangeWindow | None], start: int, end: int, *, step: int = 1,
                max_rows: int = 65536, max_bytes: int = 64 << 20, signed: bool = False) -> Built:
    """Rows for positions start, start + step, ... (< end) of a view striped
    over len(windows) objects, position p coming from windows[p % width]:
    a listed entry as a row of its kind, a position below its window's
    trim_below as TRIMMED (epoch 0). Stops at the first unwritten position
    (STOP_MISSING: the caller's gap rules decide: hole, tail, or wait), at a
    position its object's window does not cover (STOP_NEED: fetch the next
    window of stop_object), at `end`, or when full. Consumes the entries it
    passes, so the next call goes on from stop_position."""
    width = len(windows)
    arr = ffi.new("fr_window *[]", [ffi.NULL if w is None else w._w for w in windows])
    b = lib.fr_build(arr, width, start, end, step, max_rows, max_bytes)
    if b == ffi.NULL:
        raise MemoryError("fr_build") if width and step else ValueError("width and step must be positive")
    b = ffi.gc(b, lib.fr_batch_free)
    return Built(_record_batch(b, signed), int(b.stop), int(b.stop_position), int(b.stop_object))


# --------------------------------------------------------------------- queue
class ReadQueue:
    """Class calls on the native connection and their results, in batches.

    Any thread may submit; one thread at a time calls wait(). Each submit
    takes a `tag` (an int the caller picks) that comes back with its result.
    A submit that cannot be sent raises (nothing comes back for it then);
    everything sent comes back from wait(), failed or not, by the OSD op
    timeout at the latest."""

    def __init__(self, native: Native, max_results: int = 1024) -> None:
        handle = lib.fr_queue_new(native._handle)
        if handle == ffi.NULL:
            raise MemoryError("fr_queue_new")
        self.native = native
        #: result tags, unique on this queue: every scan that shares it draws
        #: from here, so a late reply to an earlier scan is never taken for a
        #: reply to a later one
        self.tags = iter(range(1 << 62))  # next() is atomic under the GIL
        self._q: Any = ffi.gc(handle, lib.fr_queue_release)  # None once closed
        self._out = ffi.new("fr_result[]", max_results)
        self._max = max_results

    def _closed(self) -> Any:
        raise ZlogError("the read queue is closed")

    def _sent(self, ret: int, what: str) -> None:
        if ret < 0:
            raise error(ret, what)

    def read(self, pool: Pool, oid: str | bytes, epoch: int, position: int, tag: int) -> None:
        """cls_zlog "read" of one position: READ result, the stored bytes."""
        ret = lib.fr_read(self._q or self._closed(), pool.handle, _oid(oid), epoch, position, tag)
        if ret < 0:
            self._sent(ret, f"read at {position}")

    def read_many(self, pool: Pool, oid: str | bytes, epoch: int, positions: Sequence[int],
                  tags: Sequence[int]) -> None:
        """"read" of several positions of one object in one op (one round
        trip); each position fails or succeeds alone, with its own result."""
        n = len(positions)
        if n != len(tags):
            raise ValueError("one tag per position")
        for i in range(0, n, MAX_CALLS_PER_OP):
            chunk = slice(i, i + MAX_CALLS_PER_OP)
            ret = lib.fr_read_many(self._q or self._closed(), pool.handle, _oid(oid), epoch, list(positions[chunk]),
                                   list(tags[chunk]), min(MAX_CALLS_PER_OP, n - i))
            if ret < 0:
                self._sent(ret, f"read of {n} positions on {oid!r}")

    def read_range(self, pool: Pool, oid: str | bytes, epoch: int, first: int, last: int,
                   max_entries: int, max_bytes: int, tag: int) -> None:
        """cls_zlog "read_range": RANGE result, a RangeWindow."""
        ret = lib.fr_read_range(self._q or self._closed(), pool.handle, _oid(oid), epoch, first, last, max_entries, max_bytes, tag)
        if ret < 0:
            self._sent(ret, f"read_range on {oid!r}")

    def stat(self, pool: Pool, oid: str | bytes, tag: int) -> None:
        """cls_zlog "stat": STAT result, a wire.ObjectStat."""
        self._sent(lib.fr_stat(self._q or self._closed(), pool.handle, _oid(oid), tag), f"stat on {oid!r}")

    def max_position(self, pool: Pool, oid: str | bytes, epoch: int, tag: int) -> None:
        """cls_zlog "max_position": MAX_POSITION result, int or None (empty)."""
        self._sent(lib.fr_max_position(self._q or self._closed(), pool.handle, _oid(oid), epoch, tag), f"max_position on {oid!r}")

    def exec(self, pool: Pool, oid: str | bytes, method: str, payload: bytes, tag: int,
             cls: str = wire.CLASS) -> None:
        """Any read-only class method: EXEC result, its reply bytes."""
        self._sent(lib.fr_exec(self._q or self._closed(), pool.handle, _oid(oid), cls.encode(), method.encode(),
                               payload, len(payload), tag), f"{method} on {oid!r}")

    def wait(self, timeout: float | None = None, max_results: int | None = None) -> list[Result]:
        """Every result ready (up to max_results), waiting up to `timeout`
        seconds (None: no limit) for the first. [] on timeout, or at once
        when nothing is in flight. Bytes returned are copies."""
        out = self._out
        n = lib.fr_wait(self._q or self._closed(), out, min(max_results or self._max, self._max),
                        -1.0 if timeout is None else timeout)
        results: list[Result] = []
        append = results.append
        for i in range(n):
            r = out[i]
            code = r.code
            if code:
                append((r.tag, code, None))
                continue
            kind = r.kind
            if kind == READ or kind == EXEC:
                append((r.tag, 0, ffi.unpack(r.data, r.len)))
            elif kind == RANGE:
                append((r.tag, 0, RangeWindow(r.window)))
            else:
                raw = ffi.unpack(r.data, r.len)
                try:
                    value = wire.parse_stat(raw) if kind == STAT else wire.parse_max_position(raw)
                except Exception:  # noqa: BLE001 - a short or long reply: report it as malformed
                    append((r.tag, -errno.EBADMSG, None))
                    continue
                append((r.tag, 0, value))
        return results

    @property
    def pending(self) -> int:
        """Calls sent whose result wait() has not returned yet."""
        return int(lib.fr_queue_pending(self._q)) if self._q is not None else 0

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until nothing is in flight (results stay for wait()); True if so."""
        return bool(lib.fr_queue_drain(self._q or self._closed(), -1.0 if timeout is None else timeout))

    def close(self) -> None:
        """Drop the queue now: undelivered results are discarded, and reads
        still in flight free themselves when they complete."""
        if self._q is not None:
            ffi.release(self._q)
            self._q = None


# ------------------------------------------------------------ futures (reads)
class Reads:
    """Single-position reads as Futures of (code, bytes | None), resolved in
    batches by one thread that drains a ReadQueue: no Python code runs on
    librados' threads. The shape of Log.read_async (which decodes, maps errors
    and retries stale epochs on top)."""

    def __init__(self, native: Native, name: str = "pyzlog-fastread") -> None:
        self.queue = native.queue()
        self._pending: dict[int, Future[tuple[int, bytes | None]] | Callable[[int, Any], None]] = {}
        self._tags = iter(range(1 << 62))  # next() is atomic under the GIL
        self._closed = False
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def read(self, pool: Pool, oid: str | bytes, epoch: int, position: int) -> Future[tuple[int, bytes | None]]:
        fut: Future[tuple[int, bytes | None]] = Future()
        self.submit(pool, oid, epoch, position, fut)
        return fut

    def submit(self, pool: Pool, oid: str | bytes, epoch: int, position: int,
               done: Future[tuple[int, bytes | None]] | Callable[[int, Any], None]) -> None:
        """Like read(), with a Future to resolve or a callable done(code,
        value) that runs on the draining thread."""
        if self._closed:
            raise ZlogError("reads are closed")
        tag = next(self._tags)
        self._pending[tag] = done
        try:
            self.queue.read(pool, oid, epoch, position, tag)
        except BaseException:
            del self._pending[tag]
            raise
        if not self._wake.is_set():
            self._wake.set()

    def _run(self) -> None:
        queue, pending = self.queue, self._pending
        while True:
            results = queue.wait(0.2)
            if not results:
                if self._closed and not queue.pending:
                    return
                if not queue.pending:
                    self._wake.wait(0.2)  # idle: sleep until a submit
                    self._wake.clear()
                continue
            for tag, code, value in results:
                done = pending.pop(tag)
                if isinstance(done, Future):
                    done.set_result((code, value))
                else:
                    try:
                        done(code, value)
                    except Exception:
                        import logging

                        logging.getLogger("pyzlog").exception("read completion failed")

    def close(self, timeout: float = 30.0) -> None:
        """Wait up to `timeout` for reads in flight; later submits raise."""
        self._closed = True
        self._wake.set()
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.queue.close()


# ---------------------------------------------------------------- view scans
def empty_window(first: int, next_position: int) -> RangeWindow:
    """A window with no entries covering [first, next_position): what a
    read_range of an object that does not exist yet stands for."""
    head = wire._RANGE_HEAD.pack(0, 0, 0, next_position, 0)
    return RangeWindow.parse(head, first)


class _Segment:
    """One read_range of one object: the positions [first, last] asked for."""

    __slots__ = ("first", "last", "tag", "window")

    def __init__(self, first: int, last: int, tag: int) -> None:
        self.first, self.last, self.tag = first, last, tag
        self.window: RangeWindow | None = None


class ViewScan:
    """The positions [start, end) of one view, read with read_range from the
    view's objects (`oids`, index = position % width) and fetched `ahead`
    calls ahead per object, walked in position order into Arrow batches.

    This is the mechanical half of a streaming reader: next_batch() returns a
    Built that stops at STOP_END, STOP_FULL, or STOP_MISSING at an unwritten
    position; what that position is (a hole to wait on and fill, or the tail)
    is the caller's to decide, after which it calls forget_from() to read it
    again or skip() past it. `step` = width reads one object only (positions
    start, start + width, ...). An object that does not exist reads as empty.
    A failed call raises its typed error (StaleEpoch on -ESTALE: set `epoch`
    and call again; the scan re-reads from where it stopped)."""

    def __init__(self, queue: ReadQueue, pool: Pool, oids: Sequence[str | bytes], epoch: int, start: int,
                 end: int, *, per_call: int = 1024, call_bytes: int = 4 << 20, ahead: int = 2, step: int = 1,
                 max_rows: int = 65536, signed: bool = False) -> None:
        if not 1 <= per_call <= wire.MAX_RANGE_ENTRIES or not 1 <= call_bytes <= wire.MAX_RANGE_BYTES:
            raise ValueError("per_call or call_bytes outside the class's limits")
        self.queue, self.pool, self.epoch = queue, pool, epoch
        self.oids = [_oid(o) for o in oids]
        self.width = len(self.oids)
        if step not in (1, self.width):
            raise ValueError("step must be 1 or the view's width")
        self.position, self.end, self.step = start, end, step
        self.per_call, self.call_bytes, self.ahead = per_call, call_bytes, max(1, ahead)
        self.max_rows, self.signed = max_rows, signed
        self._segments: list[list[_Segment]] = [[] for _ in range(self.width)]
        self._by_tag: dict[int, tuple[int, _Segment]] = {}
        self._tags = queue.tags
        self._max_position: int | None = None
        self._fetched = [False] * self.width  # a reply of each object since the last forget_from
        self._probing: set[int] = set()  # objects asked only for their max (refresh_max)
        self._deadline_s = queue.native.op_timeout + 5.0

    # ------------------------------------------------------------- fetching
    def _objects(self) -> range:
        if self.step == 1:
            return range(self.width)
        i = self.position % self.width
        return range(i, i + 1)

    def _first_of(self, obj: int, position: int) -> int:
        """The first position of object `obj` at or after `position`."""
        return position + (obj - position) % self.width

    def _send(self, obj: int, first: int, last: int, max_entries: int) -> _Segment:
        """One read_range call on object `obj`, its reply known by the segment's tag."""
        seg = _Segment(first, last, next(self._tags))
        self._by_tag[seg.tag] = (obj, seg)
        self.queue.read_range(self.pool, self.oids[obj], self.epoch, first, last, max_entries, self.call_bytes,
                              seg.tag)
        return seg

    def _issue(self, obj: int, first: int, index: int | None = None) -> None:
        """Ask for the positions of object `obj` from `first` (about per_call of them)."""
        first = self._first_of(obj, first)
        if first >= self.end:
            return
        last = min(self.end - 1, first + self.width * (self.per_call - 1))
        segs = self._segments[obj]
        segs.insert(len(segs) if index is None else index, self._send(obj, first, last, self.per_call))

    def _top_up(self, obj: int) -> None:
        segs = self._segments[obj]
        while len(segs) < self.ahead:
            nxt = segs[-1].last + 1 if segs else self.position
            if nxt >= self.end:
                return
            self._issue(obj, nxt)

    def start(self) -> None:
        """Send the first calls (done by next_batch if not called)."""
        for obj in self._objects():
            self._top_up(obj)

    def _collect(self, timeout: float) -> None:
        """Take every reply that is ready (waiting up to `timeout` for one)."""
        for tag, code, value in self.queue.wait(timeout):
            entry = self._by_tag.pop(tag, None)
            if entry is None:
                continue  # a call forget_from() gave up on
            obj, seg = entry
            self._probing.discard(obj)
            if code == -errno.ENOENT:
                value = empty_window(seg.first, seg.last + 1)
            elif code < 0:
                self.forget_from(self.position)
                raise error(code, f"read_range on {self.oids[obj].decode()}")
            if value.next <= seg.first:
                self.forget_from(self.position)
                raise ZlogError(f"read_range on {self.oids[obj].decode()}: the reply made no progress")
            seg.window = value
            self._fetched[obj] = True
            top = value.max_position
            if top is not None and (self._max_position is None or top > self._max_position):
                self._max_position = top
            if value.next <= seg.last:  # cut short by call_bytes: ask for the rest next
                segs = self._segments[obj]
                self._issue(obj, value.next, segs.index(seg) + 1)

    def _ready(self, obj: int, position: int) -> bool:
        """Make the head window of `obj` the one covering `position`; False
        while it is still on its way."""
        position = self._first_of(obj, position)
        segs = self._segments[obj]
        while segs and (segs[0].window is not None and segs[0].window.next <= position
                        or segs[0].last < position):
            dropped = segs.pop(0)
            self._by_tag.pop(dropped.tag, None)
        if position >= self.end:
            return True  # nothing of this object is left to read
        if not segs or segs[0].first > position:
            self._issue(obj, position, 0)  # nothing asked covers it (a forget, or a cut-short reply)
        self._top_up(obj)
        return segs[0].window is not None

    def _wait_ready(self, objs: list[int], position: int) -> None:
        deadline = None
        while True:
            waiting = [o for o in objs if not self._ready(o, position)]
            if not waiting:
                return
            now = time.monotonic()
            if deadline is None:
                deadline = now + self._deadline_s
            elif now > deadline:
                raise ClusterUnavailable(f"read_range on {self.oids[waiting[0]].decode()}: no reply in time")
            self._collect(min(1.0, deadline - now))

    # -------------------------------------------------------------- walking
    def next_batch(self) -> Built:
        """The next batch from `position` on (may be empty at STOP_MISSING/END)."""
        while True:
            if self.position >= self.end:
                return build_batch([None] * self.width, self.position, self.end, step=self.step,
                                   signed=self.signed)
            # the windows the next positions need (every object's at once, so
            # a batch does not end at each object's window boundary in turn)
            self._wait_ready(list(self._objects()), self.position)
            start = self.position
            built = build_batch([s[0].window if s else None for s in self._segments], start, self.end,
                                step=self.step, max_rows=self.max_rows, signed=self.signed)
            self.position = built.stop_position
            if built.stop == STOP_NEED and built.batch.num_rows == 0:
                continue  # a window ended exactly here: the loop fetches on
            try:
                for obj in self._objects():
                    self._ready(obj, self.position)  # swap in what has arrived, read ahead
                self._collect(0)
            except BaseException:
                # a reply that came with the read-ahead failed (a stale epoch, say):
                # this batch is not handed out, so its positions must be read again
                self.forget_from(start)
                raise
            return built

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Every batch up to `end` or the first unwritten position."""
        while True:
            built = self.next_batch()
            if built.batch.num_rows:
                yield built.batch
            if built.stop in (STOP_END, STOP_MISSING):
                return

    # ------------------------------------------------------------ gap rules
    def max_position(self) -> int | None:
        """The highest position written or filled on any object, as of the
        replies so far (refresh_max() makes it current)."""
        return self._max_position

    def refresh_max(self) -> None:
        """At least one reply from every object of the view since the last
        forget_from: "is a later position written" is a question about the
        whole view, also when this scan reads one object (step = width) or
        `end` leaves an object nothing to read (it is then asked about the
        position after `end`, only for its max)."""
        need = [o for o in range(self.width) if not self._fetched[o]]
        if not need:
            return
        scanned = [o for o in self._objects() if o in need and self._first_of(o, self.position) < self.end]
        if scanned:
            self._wait_ready(scanned, self.position)
        for o in need:
            if o not in scanned and o not in self._probing:
                first = self._first_of(o, self.position)
                if first > wire.MAX_POSITION:
                    self._fetched[o] = True  # no position there at all
                    continue
                self._send(o, first, first, 1)
                self._probing.add(o)
        deadline = time.monotonic() + self._deadline_s
        while not all(self._fetched[o] for o in need):
            if time.monotonic() > deadline:
                raise ClusterUnavailable(f"read_range on {self.oids[need[0]].decode()}: no reply in time")
            self._collect(1.0)

    def skip(self) -> None:
        """Go past the position next_batch stopped at (the caller reported it)."""
        self.position += self.step

    def forget_from(self, position: int) -> None:
        """Drop what is known from `position` on (and calls in flight), so it
        is read again: after waiting on a hole, or to follow a growing tail."""
        self.position = min(self.position, position)
        for obj in range(self.width):
            self._segments[obj] = []
        self._by_tag.clear()
        self._fetched = [False] * self.width
        self._probing.clear()
        self._max_position = None

    def close(self) -> None:
        self.queue.close()
