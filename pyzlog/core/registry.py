"""The sequencer daemons of a pool, as they record themselves in RADOS.

Every zlog-seqr daemon keeps one object per pool it serves, in the pool's
namespace REGISTRY_NAMESPACE and named by the address clients reach it at,
and rewrites it every lease / 4 with a growing beat counter. Who serves a
log is recorded in the log's metadata (wire.Meta.sequencer); the registry
says which daemons exist and whether they are alive:

- daemons judge each other by their beats, on their own monotonic clocks: a
  beat that has not changed for a lease means the daemon is dead or stuck
  (no clocks are compared across hosts); a refused TCP connection means it
  is gone now;
- a client choosing a daemon for a log that has none (never served, or its
  daemon gone) takes a daemon whose record was rewritten within a few leases
  by the wall clock, the same one for the same log on every client
  (rendezvous hashing), so one daemon takes the log over.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import hashlib
import json
import socket
import time
from dataclasses import asdict, dataclass


from .. import _seqr  # type: ignore[attr-defined]  # the C++ extension
from .cluster import open_ioctx
from .errors import InvalidRequest, ZlogError
from .native import native_call
from .sequencer import parse_address
from .seqr_auth import Credentials

if TYPE_CHECKING:
    import rados

REGISTRY_NAMESPACE = "zlog.seqr"
#: daemons of one group stand by for each other; clients look in the default one
DEFAULT_GROUP = "default"
#: a daemon whose beat has not changed for this long is taken for dead
DEFAULT_LEASE_SECONDS = 2.0
#: clients: a record older than this many leases (wall clock) is not offered
CLIENT_STALE_LEASES = 3


@dataclass(frozen=True)
class DaemonRecord:
    address: str
    beat: int
    time: float  # wall clock of the beat (for clients and operators only)
    lease: float
    pid: int
    host: str
    started: float

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes, key: str) -> DaemonRecord | None:
        """The record stored under `key`; None for anything that is not a
        daemon's record (torn, foreign, or naming an address no client could
        use), which everyone then ignores."""
        try:
            d = json.loads(raw)
            rec = cls(str(d["address"]), int(d["beat"]), float(d["time"]), float(d["lease"]),
                      int(d["pid"]), str(d["host"]), float(d["started"]))
            parse_address(rec.address)
        except (ValueError, KeyError, TypeError, InvalidRequest):
            return None
        return rec if rec.address == key else None


def registry_ioctx(cluster: rados.Rados, pool: str, group: str = DEFAULT_GROUP) -> rados.Ioctx:
    """The registry of `group`'s daemons in `pool` (a separate group, e.g. a
    benchmark's daemons, neither sees nor is seen by the default one)."""
    namespace = REGISTRY_NAMESPACE if group == DEFAULT_GROUP else f"{REGISTRY_NAMESPACE}.{group}"
    return open_ioctx(cluster, pool, namespace)


def read_records(ioctx: rados.Ioctx, addresses: list[str] | None = None) -> list[DaemonRecord]:
    """The records of `addresses` (all in the registry if None) that exist."""
    import rados

    if addresses is None:
        addresses = sorted(obj.key for obj in ioctx.list_objects())
    out = []
    for address in addresses:
        try:
            rec = DaemonRecord.decode(ioctx.read(address, 4096), address)
        except rados.ObjectNotFound:
            continue
        except rados.Error as e:
            raise ZlogError(f"cannot read the sequencer registry: {e}") from None
        if rec is not None:
            out.append(rec)
    return out


def recent(records: list[DaemonRecord], now: float | None = None) -> list[DaemonRecord]:
    """Records rewritten within CLIENT_STALE_LEASES leases, by the wall clock."""
    now = time.time() if now is None else now
    return [r for r in records if now - r.time <= CLIENT_STALE_LEASES * r.lease]


def preference(key: str, addresses: list[str]) -> list[str]:
    """`addresses` in the order `key` prefers them (rendezvous hashing): every
    client and daemon agrees, and removing one address moves only its keys."""
    def score(address: str) -> bytes:
        return hashlib.blake2b(f"{key}\0{address}".encode(), digest_size=8).digest()
    return sorted(addresses, key=score, reverse=True)


def refuses_connections(address: str, timeout: float = 0.3) -> bool:
    """True if nothing listens at `address` (connection refused): the
    daemon is gone. A timeout proves nothing (a paused process, a slow
    network), so it counts as not refused."""
    try:
        host, port = parse_address(address)
    except InvalidRequest:
        return True  # no daemon can listen there
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


def answers(address: str, timeout: float, credentials: Credentials | None = None) -> bool:
    """Does a sequencer answer at `address` within `timeout`? (A port that
    accepts connections may belong to a stopped process.) A HELLO that names
    no pool is enough, and needs no key: any answer is one.
    `credentials` supplies TLS settings."""
    try:
        host, port = parse_address(address)
    except InvalidRequest:
        return False
    probe = (credentials or Credentials(None)).probe()
    try:
        with native_call():
            _seqr.Client(host, port, timeout, probe).close()
        return True
    except _seqr.AuthError:  # refused (say, TLS required): an answer all the same
        return True
    except (OSError, TimeoutError, ZlogError):
        return False
