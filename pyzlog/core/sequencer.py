"""Client side of the zlog-seqr sequencer (protocol: docs/seqr-protocol.md).

Wraps the C++ client from pyzlog._seqr: parses addresses, reconnects after a
sequencer restart, and turns transport failures into SequencerUnavailable so
callers can fall back to slow tail finding.
"""
from __future__ import annotations

import threading

from .. import _seqr  # type: ignore[attr-defined]  # the C++ extension
from .errors import InvalidRequest, SequencerUnavailable
from .native import native_call

DEFAULT_ADDRESS = "127.0.0.1:5678"
DEFAULT_TIMEOUT = 2.0

OK = _seqr.OK
STALE_EPOCH = _seqr.STALE_EPOCH
RETRY = _seqr.RETRY
BAD_REQUEST = _seqr.BAD_REQUEST
RECOVERY_FAILED = _seqr.RECOVERY_FAILED


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidRequest(f"bad sequencer address {address!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


class SequencerClient:
    """One connection to a sequencer, shared by threads (calls are serialised)."""

    def __init__(self, address: str = DEFAULT_ADDRESS, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.address = address
        self.host, self.port = parse_address(address)
        self.timeout = timeout
        self._conn: _seqr.Client | None = None
        self._lock = threading.Lock()

    def _client(self) -> _seqr.Client:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = _seqr.Client(self.host, self.port, self.timeout)
            except (OSError, TimeoutError) as e:
                raise SequencerUnavailable(f"sequencer {self.address}: {e}") from None
        return self._conn

    def _request(self, op: str, pool: str, log: str, epoch: int, count: int) -> tuple[int, int, int, int]:
        with self._lock, native_call():
            try:
                conn = self._client()
                if op == "next":
                    return tuple(conn.next(pool, log, epoch, count))
                return tuple(conn.tail(pool, log, epoch))
            except (OSError, TimeoutError) as e:
                self.close_locked()
                raise SequencerUnavailable(f"sequencer {self.address}: {e}") from None

    def next(self, pool: str, log: str, epoch: int, count: int = 1) -> tuple[int, int, int, int]:
        """(status, server epoch, first position, count)."""
        return self._request("next", pool, log, epoch, count)

    def tail(self, pool: str, log: str, epoch: int) -> tuple[int, int, int, int]:
        return self._request("tail", pool, log, epoch, 0)

    def close_locked(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
            self._conn = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()
