"""Calls to cls_zlog methods on one RADOS I/O context, sync and async."""
from __future__ import annotations

import atexit
import errno
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from concurrent.futures import Future

import rados

from . import wire
from .access import denial
from .errors import ClusterUnavailable, from_errno


class ClassIO:
    """Thin layer over rados.Ioctx.execute for cls_zlog methods.

    `call` raises the typed error for a failed method; `call_async` returns a
    Future of (return code, output) so many objects can be contacted at once.
    """

    def __init__(self, ioctx: rados.Ioctx, cluster: rados.Rados | None = None) -> None:
        self.ioctx = ioctx
        self.cluster = cluster  # shut down at interpreter exit, after the drain
        self._in_flight = 0
        self._count_lock = threading.Lock()
        self._quiet = threading.Event()  # set while no aio is in flight
        self._quiet.set()
        _live.add(self)

    def call(self, oid: str, method: str, payload: bytes = b"", out_len: int = 256,
             position: int | None = None) -> bytes:
        ret, out = self.call_raw(oid, method, payload, out_len)
        if ret < 0:
            raise from_errno(ret, f"{method} on {oid}", position)
        return out

    def call_raw(self, oid: str, method: str, payload: bytes = b"", out_len: int = 256) -> tuple[int, bytes]:
        """(0 or -errno, output) without raising for class errors."""
        _gate.enter()
        try:
            _, out = self.ioctx.execute(oid, wire.CLASS, method, payload, out_len)
            return 0, bytes(out)
        except rados.TimedOut:
            raise ClusterUnavailable(f"{method} on {oid}: the cluster did not answer in time") from None
        except rados.Error as e:
            code = getattr(e, "errno", None)
            if code is None:
                raise ClusterUnavailable(f"{method} on {oid}: {e}") from None
            if abs(code) == errno.ETIMEDOUT:
                raise ClusterUnavailable(f"{method} on {oid}: the cluster did not answer in time") from None
            if abs(code) in (errno.EPERM, errno.EACCES):  # cls_zlog never says so: cephx caps
                raise denial(self.ioctx, oid, method,
                             getattr(self.cluster, "client_name", None) or "this client") from None
            return -abs(code), b""
        finally:
            _gate.leave()

    def call_async(self, oid: str, method: str, payload: bytes = b"",
                   out_len: int = 256) -> Future[tuple[int, bytes]]:
        fut: Future[tuple[int, bytes]] = Future()
        self.submit(oid, method, payload, out_len, lambda ret, out: fut.set_result((ret, out)))
        return fut

    def submit(self, oid: str, method: str, payload: bytes, out_len: int,
               on_done: Callable[[int, bytes], None]) -> None:
        """Start an aio call; `on_done(0 or -errno, output)` runs on a librados
        thread when it completes. The hot path of async appends and reads."""

        def done(completion: rados.Completion, data: bytes) -> None:
            ret = completion.get_return_value()
            try:
                on_done(min(0, ret), bytes(data) if ret >= 0 and data else b"")
            finally:
                self._done_one()  # after on_done: drain() covers running callbacks too

        try:
            _gate.enter()
        except ClusterUnavailable:
            on_done(-errno.ESHUTDOWN, b"")  # the process is exiting: no new calls
            return
        with self._count_lock:
            if not self._in_flight:
                _busy.add(self)
                self._quiet.clear()
            self._in_flight += 1
        try:
            self.ioctx.aio_execute(oid, wire.CLASS, method, payload, out_len, oncomplete=done)
        except rados.Error as e:
            self._done_one()
            on_done(-abs(getattr(e, "errno", None) or errno.EIO), b"")
        finally:
            _gate.leave()

    def _done_one(self) -> None:
        with self._count_lock:
            self._in_flight -= 1
            if not self._in_flight:
                _busy.discard(self)
                self._quiet.set()

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait for this context's aio calls (e.g. a stream's read-ahead that
        nobody will consume). At interpreter exit, a librados thread that
        calls back into Python after finalization began aborts the process."""
        return self._quiet.wait(timeout)


class _Gate:
    """Admits calls into librados until the interpreter exits; then waits for
    the calls under way to return before librados is shut down. A call made
    after shutdown, from a thread still running (a follow stream, an
    appender), would otherwise abort the process inside librados."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._calls = 0
        self._closed = False

    def enter(self) -> None:
        with self._cond:
            if self._closed:
                raise ClusterUnavailable("the process is exiting: no new RADOS calls")
            self._calls += 1

    def leave(self) -> None:
        with self._cond:
            self._calls -= 1
            if not self._calls:
                self._cond.notify_all()

    def close(self, timeout: float) -> None:
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: not self._calls, timeout)


_gate = _Gate()
_exit_hooks: list[Callable[[], None]] = []


@contextmanager
def native_call() -> Iterator[None]:
    """Around a native call made outside ClassIO that releases the GIL
    (opening a native connection, a sequencer request): refused once the
    interpreter exits, waited for otherwise. A thread still inside one when
    the interpreter finalizes is ended as it takes the GIL back, and
    unwinding C++ frames that way aborts the process."""
    _gate.enter()
    try:
        yield
    finally:
        _gate.leave()


def on_exit(hook: Callable[[], None]) -> None:
    """Run `hook` at interpreter exit once no new librados call can start and
    those under way have returned (a native connection opening in another
    thread is then open, and the hook can close it), before python-rados is
    shut down."""
    _exit_hooks.append(hook)


_live: weakref.WeakSet[ClassIO] = weakref.WeakSet()
#: Every ClassIO with aio in flight, held strongly. python-rados keeps a
#: pending op as a cycle (Ioctx -> its completion lists -> Completion -> Ioctx);
#: once the Log or stream that started it is dropped, nothing else reaches that
#: cycle, and the cyclic GC would free the Ioctx and Completion under a live
#: librados op, which then calls back into freed memory (a segfault).
_busy: set[ClassIO] = set()


@atexit.register
def _drain_all() -> None:
    """Before the interpreter finalizes: let aio finish, then stop librados so
    none of its threads calls back into a Python that is going away (that
    aborts the process, e.g. after a stream was abandoned mid-read-ahead)."""
    _gate.close(30.0)  # calls still starting from other threads now fail instead
    for hook in reversed(_exit_hooks):
        hook()
    ios = list(_live)
    for io in ios:
        io.drain(10.0)
    clusters = {id(io.cluster): io.cluster for io in ios if io.cluster is not None}
    for io in ios:
        io.ioctx.close()
    for cluster in clusters.values():
        if cluster.state == "connected":
            cluster.shutdown()


def check(ret: int, method: str, oid: str, position: int | None = None) -> None:
    """Raise the typed error for a failed async call's return code."""
    if ret < 0:
        if abs(ret) == errno.ETIMEDOUT:
            raise ClusterUnavailable(f"{method} on {oid}: the cluster did not answer in time")
        raise from_errno(ret, f"{method} on {oid}", position)
