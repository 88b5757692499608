"""The native data plane, for Python: every cls_zlog call a process makes.

`Connection.of(cluster)` is one librados connection (native/dataplane.c,
through the cffi module pyzlog._dataplane), opened with the settings of a
python-rados connection and shared by every log of it. It carries:

- sync calls (`call`, `calls`): submitted on a queue of the calling thread's
  own and waited for there, several at once when they go to several objects;
- async calls (`submit`): their callbacks run on the connection's one
  completion thread, which drains its completion queue in batches;
- the C++ append pipeline (`pipeline`, pyzlog._appender through pybind11),
  which posts every appended entry's outcome into that same queue;
- queues of their own for scans (`queue`), waited on by the reader's thread.

python-rados stays for connecting, pool lookups, listing and the
registry; it carries no cls_zlog call. Requests are encoded and replies
decoded in C, with cls_zlog/ops.h, the definition the object class uses:
Python builds no request bytes. Errors come back as codes (0 or -errno) and
become exceptions in one place, errors.error_for.

Lifetimes are safe by construction: a call holds its queue and connection
(in C) until librados has called back, and no librados thread ever calls
into Python. At interpreter exit, the pipelines are drained, then every
connection waits briefly for its calls and shuts librados down.
"""
from __future__ import annotations

import array
import atexit
import errno
import itertools
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from . import wire
from .batching import AppendBatching
from .cluster import DEFAULT_CONNECT_TIMEOUT, DEFAULT_OP_TIMEOUT, connection_settings, on_shutdown
from .errors import (EBLOCKLISTED, Blocklisted, ClusterUnavailable, InvalidRequest, PermissionDenied, PoolNotFound, Timeout, ZlogError,
                     error_for)

if TYPE_CHECKING:
    import rados

from .._dataplane import ffi, lib  # the cffi extension (untyped)

logger = logging.getLogger("pyzlog")

#: set on the threads pyzlog runs callbacks on (a connection's completion
#: thread, the async retry thread): what runs there must never wait for
#: what only that thread can bring (room in a window, say)
_own_thread = threading.local()


def on_own_thread() -> bool:
    """Whether the calling thread is one of pyzlog's callback threads."""
    return getattr(_own_thread, "active", False)


def mark_own_thread() -> None:
    """The calling thread runs pyzlog's callbacks (on_own_thread)."""
    _own_thread.active = True


class Op(IntEnum):
    """cls_zlog's operations (cls_zlog/ops.h)."""

    WRITE = lib.ZLOG_OP_WRITE
    WRITE_MANY = lib.ZLOG_OP_WRITE_MANY
    READ = lib.ZLOG_OP_READ
    READ_RANGE = lib.ZLOG_OP_READ_RANGE
    FILL = lib.ZLOG_OP_FILL
    TRIM = lib.ZLOG_OP_TRIM
    TRIM_TO = lib.ZLOG_OP_TRIM_TO
    SEAL = lib.ZLOG_OP_SEAL
    CLOSE = lib.ZLOG_OP_CLOSE
    MAX_POSITION = lib.ZLOG_OP_MAX_POSITION
    STAT = lib.ZLOG_OP_STAT
    META_CREATE = lib.ZLOG_OP_META_CREATE
    META_GET = lib.ZLOG_OP_META_GET
    META_NEW_EPOCH = lib.ZLOG_OP_META_NEW_EPOCH
    META_PROPOSE_VIEW = lib.ZLOG_OP_META_PROPOSE_VIEW
    VERSION = lib.ZLOG_OP_VERSION
    INIT = lib.ZLOG_OP_INIT
    META_OPEN_STRIPE = lib.ZLOG_OP_META_OPEN_STRIPE
    META_TRIM = lib.ZLOG_OP_META_TRIM
    REPAIR = lib.ZLOG_OP_REPAIR
    READ_SET = lib.ZLOG_OP_READ_SET


#: the fields call_pos takes (a READ_RANGE has more, so no window comes back there)
_POSITION_FIELDS = frozenset(("epoch", "position", "data", "reason", "format"))
#: a result that no class call produced: an appended entry's outcome
POSTED = lib.DP_OP_POSTED
#: a raw exec (tests, probes): the reply as it came
RAW = -1
#: seconds a connection waits for its calls at interpreter exit before it
#: shuts librados down anyway
EXIT_DRAIN_SECONDS = 2.0
#: results one wait hands out at most
WAIT_BATCH = 1024

#: (tag, code, value): code 0 or -errno; value by op: bytes (READ, META_GET,
#: raw), scan.RangeWindow (READ_RANGE), wire.ObjectStat (STAT), int | None
#: (MAX_POSITION), the position (POSTED), None (writes) or when code < 0
Result = tuple[int, int, Any]
Callback = Callable[[int, Any], None]


def _b(s: str | bytes) -> bytes:
    return s.encode() if type(s) is str else s  # type: ignore[return-value]


# ------------------------------------------------------------------ requests
def request(op: Op | int, **fields: Any) -> tuple[Any, list[Any]]:
    """A zlog_req for `op` from keyword fields (ops.h's names: epoch,
    position, last, max_entries, max_bytes, reason, data, expected,
    next_epoch, start, width, seqr, entries=[(position, bytes)]; a read_set's
    positions are entries with empty data, or Queue.read_set), and the
    buffers it points into (keep them until the submit returns)."""
    req = ffi.new("zlog_req *")
    req.expected_stripes = lib.ZLOG_ANY_STRIPES  # a CAS checks the stripe count only when asked to
    keep: list[Any] = []
    for key, value in fields.items():
        if key == "data":
            buf = ffi.from_buffer(value)
            keep.append(buf)
            req.data, req.len = buf, len(value)
        elif key == "seqr":
            if value is not None:
                raw = value.encode()
                buf = ffi.from_buffer(raw)
                keep += [raw, buf]
                req.seqr, req.seqr_len = buf, len(raw)
        elif key == "entries":
            ps, ds = zip(*value) if value else ((), ())  # per-entry work in C loops: batches are large
            bufs = list(map(ffi.from_buffer, ds))
            positions = ffi.new("uint64_t[]", ps)
            datas = ffi.new("char *[]", bufs)
            lens = ffi.new("uint32_t[]", list(map(len, ds)))
            keep += [bufs, positions, datas, lens]
            req.count, req.positions, req.datas, req.lens = len(value), positions, datas, lens
        else:
            try:
                setattr(req, key, value)
            except OverflowError:  # a field out of its wire range: say which, not cffi's words
                hint = (": the position lies past its view's last stripe (stripe numbers are 32 bits); "
                        "reconfigure() starts a new view at the tail" if key == "stripe" else "")
                raise InvalidRequest(f"{key} {value} is out of range in a {Op(op).name} request{hint}") from None
    return req, keep


def encode(op: Op | int, protocol: int = wire.PROTOCOL, **fields: Any) -> bytes:
    """The request bytes of `op` (what the data plane sends; for tests)."""
    req, _keep = request(op, **fields)
    out, n = ffi.new("char **"), ffi.new("size_t *")
    ret = lib.dp_encode(op, protocol, req, out, n)
    if ret < 0:
        raise error_for(ret, f"encoding {Op(op).name}")
    try:
        return bytes(ffi.unpack(out[0], n[0]))
    finally:
        lib.dp_free(out[0])


def decode(op: Op | int, payload: bytes, protocol: int = wire.PROTOCOL) -> dict[str, Any]:
    """The fields of a request (for tests); write_many's entries are not unpacked."""
    q = ffi.new("zlog_req *")
    ret = lib.dp_decode(op, protocol, payload, len(payload), q)
    if ret < 0:
        raise error_for(ret, f"decoding {Op(op).name}")
    out: dict[str, Any] = {k: int(getattr(q, k)) for k in (
        "epoch", "position", "last", "max_entries", "max_bytes", "reason", "expected", "next_epoch", "start",
        "width", "count", "format", "slots", "byte_bound", "stripe", "expected_stripes", "unit")}
    out["data"] = ffi.unpack(q.data, q.len) if q.data != ffi.NULL else b""
    out["seqr"] = ffi.unpack(q.seqr, q.seqr_len).decode() if q.seqr != ffi.NULL else None
    return out


def method(op: Op | int, protocol: int = wire.PROTOCOL) -> str:
    """The class method carrying `op` in `protocol` ("write2", "write", ...)."""
    name = lib.dp_method(op, protocol)
    if name == ffi.NULL:
        raise InvalidRequest(f"{Op(op).name} has no method in protocol {protocol}")
    return str(ffi.string(name).decode())


def method_or_none(op: Op | int, protocol: int) -> str | None:
    """method(), or None when `op` has no method in `protocol`."""
    name = lib.dp_method(op, protocol)
    return None if name == ffi.NULL else str(ffi.string(name).decode())


def writes(op: Op | int) -> bool:
    """Whether `op`'s method is a write method (no reply data)."""
    return bool(lib.dp_op_writes(op))


def decode_reply(op: Op | int, raw: bytes, protocol: int = wire.PROTOCOL, first: int = 0) -> Any:
    """A reply's value, decoded as the data plane decodes it (for tests and
    tools that make raw calls): read and meta_get the bytes, stat an
    ObjectStat, max_position int | None, read_range a scan.RangeWindow, version
    (major, minor, protocol). ProtocolMismatch if it does not parse."""
    if op == Op.READ or (op == Op.META_GET and protocol == wire.PROTOCOL):
        data, n = ffi.new("char **"), ffi.new("uint32_t *")
        ret = lib.dp_decode_read(raw, len(raw), protocol, data, n)
        value: Any = None if ret < 0 else ffi.unpack(data[0], n[0])
    elif op == Op.META_GET:
        ret, value = 0, raw
    elif op == Op.STAT:
        st = ffi.new("zlog_stat *")
        ret = lib.dp_decode_stat(raw, len(raw), protocol, st)
        value = None if ret < 0 else _stat(st)
    elif op == Op.MAX_POSITION:
        has, top = ffi.new("uint8_t *"), ffi.new("uint64_t *")
        ret = lib.dp_decode_max(raw, len(raw), protocol, has, top)
        value = None if ret < 0 else (int(top[0]) if has[0] else None)
    elif op == Op.READ_RANGE or op == Op.READ_SET:
        from .scan import RangeWindow

        try:
            return RangeWindow.parse(raw, first, protocol)
        except ValueError:
            raise error_for(-errno.EBADMSG, "read_range reply") from None
    elif op == Op.VERSION:
        v = ffi.new("zlog_version *")
        ret = lib.dp_decode_version(raw, len(raw), v)
        value = None if ret < 0 else (int(v.major), int(v.minor), int(v.protocol))
    else:
        raise InvalidRequest(f"{Op(op).name} has no reply")
    if ret < 0:
        raise error_for(ret if ret == -errno.EPROTONOSUPPORT else -errno.EBADMSG, f"{Op(op).name.lower()} reply")
    return value


def _stat(s: Any) -> wire.ObjectStat:
    return wire.ObjectStat(int(s.sealed_epoch), int(s.max_position) if s.has_max else None, int(s.trim_below),
                           int(s.view_end) if s.has_end else None, int(s.format), int(s.entries), int(s.bytes))


def _value(r: Any) -> Any:
    """The Python value of a successful result (see Result)."""
    op = r.op
    if op == Op.READ or op == Op.META_GET or op == RAW or op == Op.VERSION:
        return ffi.unpack(r.data, r.len) if r.data != ffi.NULL else b""
    if op == Op.READ_RANGE or op == Op.READ_SET:
        from .scan import RangeWindow

        return RangeWindow(r.window)
    if op == Op.STAT:
        return _stat(r.stat)
    if op == Op.MAX_POSITION:
        return int(r.max_position) if r.has_max else None
    if op == POSTED:
        return int(r.position)
    return None


# ------------------------------------------------------------------ exit gate
class _Gate:
    """Admits native calls until the interpreter exits; then waits for the
    calls under way to return before librados is shut down. A call made
    after shutdown, from a thread still running (a follow stream, a retry),
    would otherwise abort the process inside librados. Every sync call
    passes here: a plain lock, and an event only for the exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._calls = 0
        self._closed = False

    def enter(self) -> None:
        with self._lock:
            if self._closed:
                raise ClusterUnavailable("the process is exiting: no new RADOS calls", errno=errno.ENOTCONN)
            self._calls += 1

    def leave(self) -> None:
        with self._lock:
            self._calls -= 1
            if self._closed and not self._calls:
                self._idle.set()

    __enter__ = enter

    def __exit__(self, *_exc: object) -> None:
        self.leave()

    def close(self, timeout: float) -> None:
        with self._lock:
            self._closed = True
            if not self._calls:
                self._idle.set()
        self._idle.wait(timeout)


_gate = _Gate()
_exit_hooks: list[Callable[[], None]] = []


def native_call() -> _Gate:
    """`with native_call():` around a native call that releases the GIL (a
    connection opening, a sequencer request, any data plane call): refused
    once the interpreter exits, waited for otherwise. A thread still inside
    one when the interpreter finalizes is ended as it takes the GIL back, and
    unwinding C++ frames that way aborts the process. The gate itself, not a
    generator: the sync calls pass here on their hot path."""
    return _gate


def on_exit(hook: Callable[[], None]) -> None:
    """Run `hook` at interpreter exit once no new native call can start and
    those under way have returned, before the connections close (last hook
    registered, first run)."""
    _exit_hooks.append(hook)


# ------------------------------------------------------------------- objects
class Pool:
    """An I/O context on a pool (and namespace); it lives as long as its Connection."""

    __slots__ = ("conn", "handle", "name", "namespace")

    def __init__(self, conn: Connection, name: str, namespace: str, handle: Any) -> None:
        self.conn, self.name, self.namespace, self.handle = conn, name, namespace, handle

    @property
    def protocol(self) -> int:
        """The protocol calls on this pool go out with now (wire.PROTOCOL, or
        wire.LEGACY_PROTOCOL after an OSD refused the current one)."""
        return int(lib.dp_pool_protocol(self.handle))

    def pin_protocol(self, protocol: int | None) -> None:
        """Speak only `protocol` on this pool (None: choose again; for tests)."""
        lib.dp_pool_set_protocol(self.handle, protocol or 0)

    @property
    def address(self) -> int:
        return int(ffi.cast("uintptr_t", self.handle))

    def __repr__(self) -> str:
        ns = f", namespace {self.namespace!r}" if self.namespace else ""
        return f"<native.Pool {self.name!r}{ns}>"


#: the longest one wait in C lasts: a signal (Ctrl-C) is handled by Python
#: only between calls, so a longer wait is made of these
WAIT_SLICE_S = 0.25


class Queue:
    """Calls on a connection and their results, in batches.

    Any thread may submit; one thread at a time calls wait(). Each submit
    takes a `tag` that comes back with its result. A submit that cannot be
    sent raises (nothing comes back for it then); everything sent comes back
    from wait(), failed or not, by the OSD op timeout at the latest."""

    def __init__(self, conn: Connection, max_results: int = WAIT_BATCH) -> None:
        handle = lib.dp_queue_new(conn.handle)
        if handle == ffi.NULL:
            raise MemoryError("dp_queue_new")
        self.conn = conn
        #: result tags, unique on this queue: every scan that shares it draws
        #: from here, so a late reply to an earlier scan is never taken for a
        #: reply to a later one
        self.tags = itertools.count()  # next() is atomic under the GIL
        self._q: Any = ffi.gc(handle, lib.dp_queue_release)  # None once closed
        self._out = ffi.new("dp_result[]", max_results)
        self._max = max_results

    @property
    def handle(self) -> Any:
        if self._q is None:
            raise ZlogError("the queue is closed")
        return self._q

    def submit(self, pool: Pool, oid: str | bytes, op: Op | int, tag: int, **fields: Any) -> None:
        """One cls_zlog call; its result comes back from wait() under `tag`."""
        req, _keep = request(op, **fields)
        with native_call():  # an async submit on a thread still running at exit must not meet its queue freed
            ret = lib.dp_submit(self.handle, pool.handle, _b(oid), op, req, tag)
        if ret < 0:
            raise self.conn.error(ret, f"{Op(op).name.lower()} on {oid!r}", pool=pool, oid=oid)

    def read_set(self, pool: Pool, oid: str | bytes, epoch: int, format: int, positions: list[int], tag: int) -> None:
        """One read_set call of `positions` (1 to MAX_BATCH_ENTRIES) of one
        object of `format`: submit()'s, with no request built in Python."""
        packed = ffi.from_buffer("uint64_t[]", array.array("Q", positions))  # 10x cffi's own list conversion
        with native_call():
            ret = lib.dp_read_set(self.handle, pool.handle, _b(oid), epoch, format, packed, len(positions), tag)
        if ret < 0:
            raise self.conn.error(ret, f"read_set of {len(positions)} positions on {oid!r}", pool=pool, oid=oid)

    def read_many(self, pool: Pool, oid: str | bytes, epoch: int, positions: Sequence[int],
                  tags: Sequence[int], format: int = wire.FORMAT_OMAP) -> None:
        """"read" of several positions of one object (of `format`) in one op
        (one round trip); each position fails or succeeds alone, with its
        own result."""
        n = len(positions)
        if n != len(tags):
            raise InvalidRequest("one tag per position")
        step = lib.DP_MAX_CALLS_PER_OP
        for i in range(0, n, step):
            chunk = slice(i, i + step)
            with native_call():
                ret = lib.dp_read_many(self.handle, pool.handle, _b(oid), epoch, format, list(positions[chunk]),
                                       list(tags[chunk]), min(step, n - i))
            if ret < 0:
                raise self.conn.error(ret, f"read of {n} positions on {oid!r}", pool=pool, oid=oid)

    def exec(self, pool: Pool, oid: str | bytes, method: str, payload: bytes, tag: int, *, write: bool = False,
             cls: str = wire.CLASS) -> None:
        """Any method of any class with raw bytes (tests, probes): the reply as it came."""
        ret = lib.dp_exec(self.handle, pool.handle, _b(oid), cls.encode(), method.encode(), payload,
                          len(payload), 1 if write else 0, tag)
        if ret < 0:
            raise self.conn.error(ret, f"{method} on {oid!r}", pool=pool, oid=oid)

    def wait(self, timeout: float | None = None, max_results: int | None = None) -> list[Result]:
        """Every result ready (up to max_results), waiting up to `timeout`
        seconds (None: no limit) for the first. [] on timeout, or at once
        when nothing is in flight. Bytes returned are copies."""
        out = self._out
        limit = min(max_results or self._max, self._max)
        if timeout is not None and timeout <= WAIT_SLICE_S:
            n = lib.dp_wait(self.handle, out, limit, timeout)
        else:
            # in slices, so Python runs its signal handlers (Ctrl-C) in between:
            # a wait in C holds them off for as long as it lasts
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                left = WAIT_SLICE_S if deadline is None else min(WAIT_SLICE_S, deadline - time.monotonic())
                n = lib.dp_wait(self.handle, out, limit, max(left, 0.0))
                if n or not self.pending or (deadline is not None and time.monotonic() >= deadline):
                    break
        results: list[Result] = []
        append = results.append
        for i in range(n):
            r = out[i]
            code = r.code
            append((r.tag, code, None) if code else (r.tag, 0, _value(r)))
        return results

    def notify_fd(self) -> int:
        """A file descriptor readable while results wait here, for an event
        loop to watch (loop.add_reader) instead of a thread blocked in
        wait(); wait() clears it once nothing is ready. It lives as long as
        the queue: stop watching it before close()."""
        fd = int(lib.dp_queue_notify_fd(self.handle))
        if fd < 0:
            raise error_for(fd, "making the queue's notify fd")
        return fd

    @property
    def pending(self) -> int:
        """Calls sent whose result wait() has not returned yet."""
        return int(lib.dp_queue_pending(self._q)) if self._q is not None else 0

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until nothing is in flight (results stay for wait()); True if so."""
        return bool(lib.dp_queue_drain(self.handle, -1.0 if timeout is None else timeout))

    def close(self) -> None:
        """Drop the queue now: undelivered results are discarded, and calls
        still in flight free themselves when they complete."""
        if self._q is not None:
            ffi.release(self._q)
            self._q = None


class Connection:
    """One librados connection (rados_t) for the data plane, opened as a
    python-rados connection was (same client, ceph.conf, keys, timeouts).
    Obtain it with Connection.of(cluster): one per cluster, shared by all
    logs of it."""

    def __init__(self, cluster: rados.Rados) -> None:
        client, conf_file, options = connection_settings(cluster)
        opts = dict(options)
        # Never wait forever: a connection without an op timeout gets pyzlog's
        # defaults, so a call to a cluster that went away ends with ETIMEDOUT.
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
        self.cluster = cluster
        keep = [ffi.new("char[]", s.encode()) for kv in opts.items() for s in kv]
        keys = ffi.new("char *[]", keep[0::2])
        values = ffi.new("char *[]", keep[1::2])
        out = ffi.new("dp_cluster **")
        err = ffi.new("char[]", 512)
        ret = lib.dp_cluster_open(client.encode(), conf_file.encode(), keys, values, len(opts), out, err, 512)
        if ret < 0:
            msg = ffi.string(err).decode(errors="replace")
            if -ret in (errno.EACCES, errno.EPERM):
                raise PermissionDenied(f"data plane: cephx refused {client}: {msg}", errno=-ret)
            raise ClusterUnavailable(f"data plane: {msg}", errno=-ret)
        self.handle = out[0]
        self._pools: dict[tuple[str, str], Pool] = {}
        self._lock = threading.Lock()
        self.closed = False
        #: set once an OSD refused this connection as blocklisted (zlog revoke): final
        self.blocklisted: Blocklisted | None = None
        # sync calls: queues lent to one caller at a time
        self._idle_queues: list[Queue] = []
        # async calls: one completion queue and the thread that drains it
        self._async: Queue | None = None
        self._callbacks: dict[int, Callback] = {}
        self._tags = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._on_posted: Callable[[int, int, int, int], None] | None = None
        self._pipeline: Any = None
        #: the pipeline's knobs: connect(append_batching=), else the defaults
        self.append_batching: AppendBatching = getattr(cluster, "append_batching", None) or AppendBatching()

    @classmethod
    def of(cls, cluster: rados.Rados) -> Connection:
        """The data plane of `cluster`, opened on first use."""
        with _conns_lock:
            entry = _conns.get(id(cluster))
            if entry is not None and entry[0] is cluster and not entry[1].closed:
                return entry[1]
            with native_call():  # an exit meanwhile waits for this, then closes it
                conn = cls(cluster)
                # holds `cluster` too, so its id() is not reused while the entry lives
                _conns[id(cluster)] = (cluster, conn)
            return conn

    # ----------------------------------------------------------------- pools
    def pool(self, name: str, namespace: str = "") -> Pool:
        """The I/O context on `name` (PoolNotFound if it does not exist)."""
        key = (name, namespace)
        pool = self._pools.get(key)
        if pool is not None:
            return pool
        with self._lock:
            if key not in self._pools:
                if self.closed:
                    raise ClusterUnavailable("the data plane connection is closed", errno=errno.ENOTCONN)
                out = ffi.new("dp_pool **")
                ret = lib.dp_pool_open(self.handle, name.encode(), namespace.encode(), out)
                if ret == -errno.ENOENT:
                    raise PoolNotFound(f"pool {name!r} does not exist", errno=errno.ENOENT)
                if ret < 0:
                    raise error_for(ret, f"opening pool {name!r}")
                self._pools[key] = Pool(self, name, namespace, out[0])
            return self._pools[key]

    def queue(self, max_results: int = WAIT_BATCH) -> Queue:
        with self._lock:
            return self._new_queue_locked(max_results)

    def _new_queue_locked(self, max_results: int = WAIT_BATCH) -> Queue:
        """Under _lock: a new queue; ClusterUnavailable once the connection is
        closed (a queue made after close would use, then free again, the freed
        connection: a stream started by a thread still running at exit)."""
        if self.closed:
            raise ClusterUnavailable("the data plane connection is closed", errno=errno.ENOTCONN)
        return Queue(self, max_results)

    # ---------------------------------------------------------------- errors
    def error(self, code: int, what: str, *, pool: Pool | None = None, oid: str | bytes | None = None,
              position: int | None = None, op: Op | int | None = None) -> ZlogError:
        """The typed error for a failed call's code (errors.error_for), with
        the cephx caps a refused call lacks named by harmless probes."""
        name = oid.decode() if isinstance(oid, bytes) else oid
        if abs(code) == EBLOCKLISTED:
            err = error_for(code, what)
            self.blocklisted = err if isinstance(err, Blocklisted) else None
            return err
        if abs(code) in (errno.EPERM, errno.EACCES) and pool is not None and name is not None:
            from .access import denial

            method = lib.dp_method(op, wire.PROTOCOL) if op is not None and op >= 0 else ffi.NULL
            return denial(self.cluster, pool.name, pool.namespace, name,
                          ffi.string(method).decode() if method != ffi.NULL else "call", self.client, errno=-code)
        return error_for(code, what, position=position, oid=name, pool=pool.name if pool else None)

    # ------------------------------------------------------------ sync calls
    @contextmanager
    def _waiter(self) -> Iterator[Queue]:
        with self._lock:
            q = self._idle_queues.pop() if self._idle_queues else None
            if q is None:
                q = self._new_queue_locked(64)
        clean = False
        try:
            yield q
            clean = q.pending == 0
        finally:
            kept = False
            if clean:
                with self._lock:  # closed is read under the lock: close() swaps the idle list under it
                    if not self.closed:
                        self._idle_queues.append(q)
                        kept = True
            if not kept:
                q.close()  # calls left in flight free themselves with it

    def calls(self, items: Sequence[tuple[Pool, str | bytes, Op | int, dict[str, Any]]]) -> list[tuple[int, Any]]:
        """Every call at once (pool, oid, op, fields), waited for in this
        thread: [(code, value)] in the order given. Timeout if the cluster
        does not answer within its op timeout (and some)."""
        if not items:
            return []
        with native_call():
            with self._waiter() as q:
                results: list[tuple[int, Any] | None] = [None] * len(items)
                tags = [next(q.tags) for _ in items]
                base = tags[0]  # consecutive: the queue is this caller's alone while lent
                for tag, (pool, oid, op, fields) in zip(tags, items):
                    q.submit(pool, oid, op, tag, **fields)
                left = len(items)
                deadline = self.op_timeout + 5.0
                end = time.monotonic() + deadline
                while left:
                    got = q.wait(min(1.0, max(0.0, end - time.monotonic())))
                    for tag, code, value in got:
                        i = tag - base
                        if 0 <= i < len(results) and results[i] is None:
                            results[i] = (code, value)
                            left -= 1
                    if left and time.monotonic() > end:
                        raise Timeout(f"{len(items)} calls: no answer from the cluster within {deadline:.0f}s",
                                      errno=errno.ETIMEDOUT)
                return results  # type: ignore[return-value]

    def call_raw(self, pool: Pool, oid: str | bytes, op: Op | int, **fields: Any) -> tuple[int, Any]:
        """One call, waited for in this thread with librados' blocking op:
        (0 or -errno, value)."""
        if fields.keys() <= _POSITION_FIELDS:
            return self.call_pos(pool, oid, op, **fields)
        with native_call():
            req, _keep = request(op, **fields)
            r = ffi.new("dp_result *")
            code = lib.dp_call(self.handle, pool.handle, _b(oid), op, req, r)
            try:
                if code:
                    return code, None
                value = _value(r)
                if op == Op.READ_RANGE or op == Op.READ_SET:
                    r.window = ffi.NULL  # the RangeWindow owns it now
                return 0, value
            finally:
                lib.dp_result_release(r)

    def call_pos(self, pool: Pool, oid: str | bytes, op: Op | int, epoch: int = 0, position: int = 0,
                 data: bytes = b"", reason: int = 0, format: int = wire.FORMAT_OMAP) -> tuple[int, Any]:
        """call_raw of an op whose fields are at most an epoch, a position,
        data, a fill reason and the object's format: the sync calls a log
        makes most, with the least Python between the caller and librados."""
        with native_call():
            r = ffi.new("dp_result *")
            code = lib.dp_call_pos(self.handle, pool.handle, _b(oid), op, epoch, position, data, len(data), reason,
                                   format, r)
            try:
                return (code, None) if code else (0, _value(r))
            finally:
                lib.dp_result_release(r)

    def call(self, pool: Pool, oid: str | bytes, op: Op | int, *, what: str | None = None,
             position: int | None = None, **fields: Any) -> Any:
        """One call; raises its typed error."""
        code, value = self.call_raw(pool, oid, op, **fields)
        if code < 0:
            raise self.error(code, what or f"{Op(op).name.lower()} on {oid!r}", pool=pool, oid=oid,
                             position=position, op=op)
        return value

    def exec(self, pool: Pool, oid: str | bytes, method: str, payload: bytes = b"", *, write: bool = False,
             cls: str = wire.CLASS) -> tuple[int, bytes]:
        """Any class method with raw bytes, waited for (tests, probes): (code, reply)."""
        with native_call():
            with self._waiter() as q:
                tag = next(q.tags)
                q.exec(pool, oid, method, payload, tag, write=write, cls=cls)
                end = time.monotonic() + self.op_timeout + 5.0
                while time.monotonic() < end:
                    for t, code, value in q.wait(1.0):
                        if t == tag:
                            return code, value or b""
                raise Timeout(f"{method} on {oid!r}: no answer from the cluster", errno=errno.ETIMEDOUT)

    # ----------------------------------------------------------- async calls
    def _completions(self) -> Queue:
        q = self._async
        if q is None:
            with self._lock:
                if self._async is None:
                    q = self._new_queue_locked()
                    lib.dp_queue_hold(q.handle, 1)
                    # the thread runs before the queue is known: a Ctrl-C in
                    # start() must not leave a queue that nothing reads
                    thread = threading.Thread(target=self._complete, args=(q,), name="pyzlog-complete", daemon=True)
                    thread.start()
                    self._thread, self._async = thread, q
                q = self._async
        return q

    def submit(self, pool: Pool, oid: str | bytes, op: Op | int, callback: Callback, **fields: Any) -> None:
        """One call without waiting: callback(code, value) runs on the
        connection's completion thread (it must not block). Raises if the
        call could not be sent (the callback then never runs); an interrupt
        (Ctrl-C) keeps the callback, as the call may have gone."""
        q = self._completions()
        tag = next(self._tags)
        self._callbacks[tag] = callback
        try:
            q.submit(pool, oid, op, tag, **fields)
        except Exception:  # not sent (pop: a signal handler's error after it went may find it run already)
            self._callbacks.pop(tag, None)
            raise

    def on_posted(self, handler: Callable[[int, int, int, int], None]) -> None:
        """Where posted outcomes (the append pipeline's) go: handler(tags,
        codes, positions, n) on the completion thread, the three arrays
        (uint64, int32, uint64) by address, valid during the call."""
        self._on_posted = handler

    def pipeline(self) -> Any:
        """The C++ append pipeline of this connection (pyzlog._appender.Pipeline),
        made on first use; its outcomes are posted to the completion queue."""
        if self._pipeline is None:
            q = self._completions()
            with self._lock:
                if self._pipeline is None:
                    from .. import _appender  # the C++ extension (untyped)

                    with native_call():
                        self._pipeline = _appender.Pipeline(int(ffi.cast("uintptr_t", self.handle)),
                                                            int(ffi.cast("uintptr_t", q.handle)),
                                                            **self.append_batching.pipeline_options())
        return self._pipeline

    def _complete(self, q: Queue) -> None:
        """The completion thread: every async result of this connection (from `q`)."""
        mark_own_thread()
        callbacks = self._callbacks
        out = ffi.new("dp_result[]", WAIT_BATCH)
        tags, codes = ffi.new("uint64_t[]", WAIT_BATCH), ffi.new("int32_t[]", WAIT_BATCH)
        positions = ffi.new("uint64_t[]", WAIT_BATCH)
        ncalls, nposted = ffi.new("size_t *"), ffi.new("size_t *")
        handle = q.handle
        # the posted outcomes by address: pyzlog._appender.settle reads them in place
        tags_at, codes_at, positions_at = (int(ffi.cast("uintptr_t", a)) for a in (tags, codes, positions))
        while True:
            if not lib.dp_wait_split(handle, out, WAIT_BATCH, 0.5, tags, codes, positions, ncalls, nposted):
                if self.closed:
                    return
                continue
            for i in range(ncalls[0]):
                r = out[i]
                cb = callbacks.pop(r.tag, None)
                if cb is None:
                    continue
                code = r.code
                try:
                    cb(code, None if code else _value(r))
                except BaseException:  # noqa: BLE001 - this thread must outlive one bad callback (even a SystemExit)
                    logger.exception("a data plane completion failed")
            n = nposted[0]
            if n:
                handler = self._on_posted
                if handler is None:
                    logger.error("%d append outcomes posted with nobody to take them", n)
                    continue
                try:
                    handler(tags_at, codes_at, positions_at, n)
                except BaseException:  # noqa: BLE001 - as above
                    logger.exception("append completions failed")

    @property
    def threads(self) -> list[threading.Thread]:
        """The Python threads this connection runs (for tests)."""
        return [t for t in (self._thread,) if t is not None and t.is_alive()]

    # ----------------------------------------------------------------- close
    def close(self, timeout: float = 30.0) -> int:
        """Drain the append pipeline, refuse new calls, wait up to `timeout`
        for those in flight, shut librados down. Returns how many were still
        in flight."""
        with self._lock:
            if self.closed:
                return 0
            pipeline = self._pipeline
        if pipeline is not None and not pipeline.close(timeout):
            logger.warning("the append pipeline closed with %d entries in flight", pipeline.in_flight)
        with self._lock:
            self.closed = True
            queues, self._idle_queues = self._idle_queues, []
        with _conns_lock:
            for key, (_, conn) in list(_conns.items()):
                if conn is self:
                    del _conns[key]
        left = int(lib.dp_cluster_close(self.handle, timeout))
        if self._async is not None:
            lib.dp_queue_wake(self._async.handle)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if not self._thread.is_alive() and self._async is not None:
                self._async.close()
        for q in queues:
            q.close()
        return left


_conns: dict[int, tuple[Any, Connection]] = {}
_conns_lock = threading.Lock()


def _cluster_shutdown(cluster: Any) -> None:
    """A pyzlog connection shuts down: its data plane goes first."""
    with _conns_lock:
        entry = _conns.get(id(cluster))
    if entry is not None and entry[0] is cluster:
        entry[1].close()


on_shutdown.append(_cluster_shutdown)
_clusters: weakref.WeakSet[Any] = weakref.WeakSet()


def track_cluster(cluster: Any) -> None:
    """A python-rados connection to shut down at exit, after the data plane."""
    _clusters.add(cluster)


@atexit.register
def _close_all() -> None:
    """Before the interpreter finalizes: refuse new native calls, run the
    exit hooks, then stop every connection's librados threads (after a
    bounded wait for calls in flight), so none of them outlives Python."""
    _gate.close(30.0)
    for hook in reversed(_exit_hooks):
        try:
            hook()
        except Exception:  # noqa: BLE001 - exit goes on
            logger.exception("exit hook failed")
    with _conns_lock:
        conns = [c for _, c in _conns.values()]
    for conn in conns:
        conn.close(EXIT_DRAIN_SECONDS)
    for cluster in list(_clusters):
        try:
            if cluster.state == "connected":
                cluster.shutdown()
        except Exception:  # noqa: BLE001
            pass
