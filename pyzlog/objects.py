"""Calls to cls_zlog methods on one RADOS I/O context, sync and async."""
from __future__ import annotations

import errno
from concurrent.futures import Future

import rados

from . import wire
from .errors import ClusterUnavailable, from_errno


class ClassIO:
    """Thin layer over rados.Ioctx.execute for cls_zlog methods.

    `call` raises the typed error for a failed method; `call_async` returns a
    Future of (return code, output) so many objects can be contacted at once.
    """

    def __init__(self, ioctx: rados.Ioctx) -> None:
        self.ioctx = ioctx

    def call(self, oid: str, method: str, payload: bytes = b"", out_len: int = 256,
             position: int | None = None) -> bytes:
        ret, out = self.call_raw(oid, method, payload, out_len)
        if ret < 0:
            raise from_errno(ret, f"{method} on {oid}", position)
        return out

    def call_raw(self, oid: str, method: str, payload: bytes = b"", out_len: int = 256) -> tuple[int, bytes]:
        """(0 or -errno, output) without raising for class errors."""
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
            return -abs(code), b""

    def call_async(self, oid: str, method: str, payload: bytes = b"",
                   out_len: int = 256) -> Future[tuple[int, bytes]]:
        fut: Future[tuple[int, bytes]] = Future()

        def done(completion: rados.Completion, data: bytes) -> None:
            ret = completion.get_return_value()
            fut.set_result((min(0, ret), bytes(data) if ret >= 0 and data else b""))

        try:
            self.ioctx.aio_execute(oid, wire.CLASS, method, payload, out_len, oncomplete=done)
        except rados.Error as e:
            fut.set_result((-abs(getattr(e, "errno", None) or errno.EIO), b""))
        return fut


def check(ret: int, method: str, oid: str, position: int | None = None) -> None:
    """Raise the typed error for a failed async call's return code."""
    if ret < 0:
        if abs(ret) == errno.ETIMEDOUT:
            raise ClusterUnavailable(f"{method} on {oid}: the cluster did not answer in time")
        raise from_errno(ret, f"{method} on {oid}", position)
