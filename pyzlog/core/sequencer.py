"""Client side of the zlog-seqr sequencer (protocol: docs/seqr-protocol.md).

Wraps the C++ client from pyzlog._seqr: parses addresses, authenticates
each connection for its pool with the pool's secret (seqr_auth.py),
reconnects after a sequencer restart, and turns failures into
SequencerUnavailable (or SequencerRefused when the sequencer answered but
refused this client) so callers can fall back to slow tail finding.
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from .. import _seqr  # type: ignore[attr-defined]  # the C++ extension
from .errors import InvalidRequest, SequencerRefused, SequencerUnavailable, ZlogError
from .native import native_call
from .seqr_auth import Credentials

if TYPE_CHECKING:
    import rados

DEFAULT_ADDRESS = "127.0.0.1:5678"
DEFAULT_TIMEOUT = 2.0

OK = _seqr.OK
STALE_EPOCH = _seqr.STALE_EPOCH
RETRY = _seqr.RETRY
BAD_REQUEST = _seqr.BAD_REQUEST
RECOVERY_FAILED = _seqr.RECOVERY_FAILED
NOT_AUTHORISED = _seqr.NOT_AUTHORISED
#: over the connection's position budget: wait the answer's count in ms, then ask again
RATE_LIMITED = _seqr.RATE_LIMITED
#: most streams one stream request may name, and most backpointers kept per stream
MAX_STREAMS_PER_REQUEST = _seqr.MAX_STREAMS_PER_REQUEST
#: STREAM_HISTORY: the most positions of one stream a sequencer keeps and answers, and
#: the most one request may ask for, over all its streams (protocol.h)
MAX_STREAM_HISTORY = _seqr.MAX_STREAM_HISTORY
MAX_HISTORY_PER_REQUEST = _seqr.MAX_HISTORY_PER_REQUEST

#: what to do about a refused handshake, by status
_HINTS = {
    _seqr.NOT_SERVED: "start it with --pool {pool}, or ask the sequencer that serves the pool",
    _seqr.TLS_REQUIRED: "it requires TLS: set PYZLOG_SEQR_TLS=1 (or PYZLOG_SEQR_TLS_CA=FILE) for this client",
    _seqr.AUTH_FAILED: "this client's key for pool {pool} is not the daemon's (is its secret rotated twice "
                       "since the daemon last read it? `zlog --pool {pool} seqr-secret show`)",
}


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidRequest(f"bad sequencer address {address!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def authenticate(address: str, pool: str, credentials: Credentials, timeout: float = DEFAULT_TIMEOUT) -> str:
    """Run the handshake for `pool` at `address` and hang up: what it proved
    ("key generation 3, TLS"). SequencerRefused / SequencerUnavailable if not."""
    client = SequencerClient(address, timeout, credentials=credentials)
    with client._lock, native_call():
        conn = client._connect(pool)
    try:
        how = f"key generation {conn.generation}" if conn.authenticated else "no key asked (--insecure)"
        return how + (", TLS" if conn.tls else "")
    finally:
        conn.close()


def prefer_history(answer: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """A STREAM_HISTORY answer's streams as STREAM_TAIL's (stream, horizon,
    recent, ordinal, levels), each stream's recent positions replaced by
    its history where that is longer. A history holds the stream's latest
    positions with none left out, so it holds the recent ones too, and what
    the recent list vouches for (every position of the stream down to its
    oldest; down to the horizon while it is shorter than K) the longer list
    vouches for as well."""
    return [(s, h, hist if len(hist) > len(back) else back, o, lv) for s, h, back, o, lv, hist in answer]


class SequencerClient:
    """Connections to one sequencer, shared by threads (calls are serialised).

    A connection is authenticated for one pool (docs/seqr-protocol.md), so
    there is one per pool asked about. `cluster` is where the pools' secrets
    are read (with this client's cephx caps); `credentials` overrides it
    (and carries TLS settings). Without either the client reaches only a
    daemon run with --insecure, and only if PYZLOG_SEQR_INSECURE=1."""

    def __init__(self, address: str = DEFAULT_ADDRESS, timeout: float = DEFAULT_TIMEOUT,
                 cluster: rados.Rados | None = None, credentials: Credentials | None = None) -> None:
        self.address = address
        self.host, self.port = parse_address(address)
        self.timeout = timeout
        self.credentials = credentials if credentials is not None else Credentials(cluster)
        self._conns: dict[str, _seqr.Client] = {}
        self._lock = threading.Lock()
        self._closed = False  # close() was called: connect() (ahead of any request) opens nothing
        #: per pool, when a connection last failed to open and why: a request that waited for the
        #: lock meanwhile (behind a connect() made ahead) fails at once, not after a second timeout
        self._connect_failed: dict[str, tuple[float, str]] = {}

    def auth_settings(self, pool: str) -> dict[str, object]:
        """What the C++ append path authenticates with (pyzlog._appender)."""
        return self.credentials.native(pool)

    def _connect(self, pool: str) -> _seqr.Client:
        for attempt in range(2):
            try:
                auth = self.credentials.native(pool, fresh=attempt > 0)
            except ZlogError as e:
                raise SequencerRefused(f"sequencer {self.address}: cannot prove this client may use pool "
                                       f"{pool!r}: {e}") from None
            try:
                return _seqr.Client(self.host, self.port, self.timeout, auth)
            except _seqr.AuthError as e:
                if attempt == 0 and e.status == _seqr.AUTH_FAILED and self.credentials.cluster is not None:
                    continue  # the secret may have been rotated since it was read: read it again, once
                hint = _HINTS.get(e.status, "")
                if e.status == _seqr.AUTH_FAILED and not auth["keys"]:
                    hint = ("this SequencerClient has no cluster to read the pool's secret with: give it "
                            "cluster= (or credentials=)")
                raise SequencerRefused(f"{e}" + (f"; {hint.format(pool=pool)}" if hint else "")) from None
            except (OSError, TimeoutError) as e:
                hint = ("; does the sequencer run with TLS (zlog-seqr --tls-cert)? this client asks for it "
                        "(PYZLOG_SEQR_TLS)" if self.credentials.tls.enabled and "TLS handshake failed" in str(e)
                        else "")
                self._connect_failed[pool] = (time.monotonic(), f"sequencer {self.address}: {e}{hint}")
                raise SequencerUnavailable(self._connect_failed[pool][1]) from None
        raise AssertionError("unreachable")

    def connect(self, pool: str) -> None:
        """Open the connection for `pool` now, if there is none and the
        client was not closed: the handshake (which reads the pool's secret)
        then costs the first request nothing. Errors as a request's."""
        with self._lock, native_call():
            conn = self._conns.get(pool)
            if (conn is None or conn.closed) and not self._closed:
                self._conns[pool] = self._connect(pool)

    def _request(self, op: str, pool: str, log: str, epoch: int, count: int,
                 streams: list[int] | None = None, history: int = 0) -> tuple[Any, ...]:
        asked = time.monotonic()
        with self._lock, native_call():
            for attempt in range(2):
                conn = self._conns.get(pool)
                fresh = conn is None or conn.closed
                if conn is None or conn.closed:
                    failed = self._connect_failed.get(pool)
                    if failed is not None and failed[0] >= asked:  # while this waited for the lock
                        raise SequencerUnavailable(failed[1])
                    conn = self._conns[pool] = self._connect(pool)
                try:
                    if op == "next":
                        return tuple(conn.next(pool, log, epoch, count))
                    if op == "streams":
                        return tuple(conn.streams(pool, log, epoch, count, streams, history))
                    return tuple(conn.tail(pool, log, epoch))
                except (OSError, TimeoutError) as e:
                    self._drop_locked(pool)
                    # a connection the daemon closed while idle (a revoked key, a restart): the
                    # request was never read, so ask once more on a new connection (if the
                    # daemon died reading it, its positions were lost either way)
                    if attempt == 0 and not fresh and isinstance(e, ConnectionError):
                        continue
                    raise SequencerUnavailable(f"sequencer {self.address}: {e}") from None
        raise AssertionError("unreachable")

    def next(self, pool: str, log: str, epoch: int, count: int = 1) -> tuple[int, int, int, int]:
        """(status, server epoch, first position, count). SequencerRefused if
        the sequencer will not let this client in for `pool`."""
        return self._request("next", pool, log, epoch, count)

    def tail(self, pool: str, log: str, epoch: int) -> tuple[int, int, int, int]:
        return self._request("tail", pool, log, epoch, 0)

    def streams(self, pool: str, log: str, epoch: int, count: int, streams: list[int],
                history: int = 0) -> tuple[int, int, int, int, int, list[tuple[Any, ...]]]:
        """STREAM_NEXT (count >= 1: positions that belong to every stream
        named) or STREAM_TAIL (count 0): (status, server epoch, first
        position, count, K, [(stream, horizon, backpointers newest first,
        ordinal, skip pointers)]); with count 0 and `history` >= 1,
        STREAM_HISTORY: each stream's tuple ends with its last positions
        (up to `history`, newest first). See docs/seqr-protocol.md, "Streams"."""
        if not 1 <= len(streams) <= MAX_STREAMS_PER_REQUEST:
            raise InvalidRequest(f"a stream request names 1..{MAX_STREAMS_PER_REQUEST} streams, not {len(streams)}")
        if history and (count or not 1 <= history <= MAX_STREAM_HISTORY
                        or history * len(streams) > MAX_HISTORY_PER_REQUEST):
            raise InvalidRequest(f"a history request takes no positions and asks for 1..{MAX_STREAM_HISTORY} "
                                 f"positions per stream, {MAX_HISTORY_PER_REQUEST} in all")
        return self._request("streams", pool, log, epoch, count, streams, history)

    def _drop_locked(self, pool: str) -> None:
        conn = self._conns.pop(pool, None)
        if conn is not None:
            try:
                conn.close()
            except OSError:
                pass

    def close_locked(self) -> None:
        for pool in list(self._conns):
            self._drop_locked(pool)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self.close_locked()
