"""`zlog revoke ENTITY`: take a cephx client's key away and cut off every
connection it holds open (issue 24).

Deleting a key (`ceph auth rm`) refuses new connections only: a process
connected before keeps its tickets, and an OSD session it has open is never
torn down. So this also blocklists every librados instance of the entity:

1. `auth rm ENTITY`: no new connection can authenticate as it;
2. the monitors' `sessions` (every librados instance keeps one monitor
   session, named by the entity it authenticated as) give each instance's
   address, `IP:PORT/NONCE`; OSDs do not list their sessions (Ceph 16);
3. `osd blocklist add ADDR EXPIRE` for each: every OSD refuses the instance's
   requests with EBLOCKLISTED, which pyzlog raises as `Blocklisted`;
4. steps 2-3 again until no new address turns up (an instance that was
   moving to another monitor), then wait until every up OSD has the osdmap
   holding the entries, so the next request of a revoked client is refused.

The expiry (DEFAULT_EXPIRE_SECONDS, one week) outlasts every ticket a
revoked instance can hold (service tickets: auth_service_ticket_ttl, 1 h;
its monitor ticket: auth_mon_ticket_ttl, 72 h by default), so once the entry
lapses the instance cannot authenticate a new connection. A pyzlog client
stops using a blocklisted connection for good (Blocklisted is final); any
other process still running as the entity should be stopped within the
expiry (or revoked again).
"""
from __future__ import annotations

import errno
import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.errors import InvalidRequest, PermissionDenied, ZlogError

if TYPE_CHECKING:
    import rados

#: how long a blocklist entry lasts unless told (seconds): longer than any ticket
DEFAULT_EXPIRE_SECONDS = 7 * 24 * 3600.0
#: rounds of "list the sessions, blocklist the new ones" at most
MAX_ROUNDS = 3
_ENTITY = re.compile(r"client\.[A-Za-z0-9_.-]+")


@dataclass
class Revoked:
    entity: str
    key_removed: bool  # False: it had no key (already deleted)
    addresses: list[str] = field(default_factory=list)  # the instances blocklisted
    expire_seconds: float = DEFAULT_EXPIRE_SECONDS
    osdmap_epoch: int = 0  # the epoch holding every entry
    lagging_osds: list[int] = field(default_factory=list)  # up OSDs that had not got it in time

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _command(cluster: rados.Rados, cmd: dict[str, Any], target: str | None = None) -> bytes:
    """A monitor command's output; PermissionDenied or ZlogError if refused."""
    kw = {"target": target} if target is not None else {}
    ret, out, status = cluster.mon_command(json.dumps(cmd), b"", timeout=30, **kw)
    if ret < 0:
        if -ret in (errno.EACCES, errno.EPERM):
            raise PermissionDenied(f"the monitors refused '{cmd['prefix']}': revoking needs an admin "
                                   "client (mon 'allow *')", errno=-ret)
        raise ZlogError(f"'{cmd['prefix']}' failed: {status or errno.errorcode.get(-ret, ret)}", errno=-ret)
    return bytes(out)


def _json(cluster: rados.Rados, prefix: str, target: str | None = None) -> Any:
    return json.loads(_command(cluster, {"prefix": prefix, "format": "json"}, target))


def session_addresses(cluster: rados.Rados, entity: str) -> set[str]:
    """`IP:PORT/NONCE` of every librados instance that has a monitor session
    as `entity`, on every monitor."""
    found: set[str] = set()
    for mon in _json(cluster, "mon dump")["mons"]:
        for s in _json(cluster, "sessions", target=str(mon["name"])):
            if s.get("entity_name") != entity:
                continue
            for a in s.get("addrs", {}).get("addrvec", []):
                host, _, port = str(a.get("addr", "")).rpartition(":")
                nonce = int(a.get("nonce", 0))
                if not host or (port == "0" and nonce == 0):
                    continue  # never blocklist a whole host
                found.add(f"{a['addr']}/{nonce}")
    return found


def _osds_caught_up(cluster: rados.Rados, epoch: int, timeout: float) -> list[int]:
    """Wait until every up OSD has osdmap `epoch`; the ids of those that had not in time."""
    up = [int(o["osd"]) for o in _json(cluster, "osd dump")["osds"] if o.get("up")]
    deadline = time.monotonic() + timeout
    while up:
        lagging = []
        for osd in up:
            ret, out, _ = cluster.osd_command(osd, json.dumps({"prefix": "status", "format": "json"}), b"",
                                              timeout=10)
            if ret < 0 or int(json.loads(out).get("newest_map", 0)) < epoch:
                lagging.append(osd)
        up = lagging
        if not up or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return up


def revoke(cluster: rados.Rados, entity: str, expire: float = DEFAULT_EXPIRE_SECONDS,
           wait: float = 30.0, me: str | None = None) -> Revoked:
    """Delete `entity`'s key and blocklist every instance of it for `expire` seconds."""
    if not _ENTITY.fullmatch(entity):
        raise InvalidRequest(f"{entity!r}: revoke takes a client entity, like client.app")
    if me is not None and entity == me:
        raise InvalidRequest(f"{entity} is the client this command runs as: revoke it from another one")
    if not expire > 0:
        raise InvalidRequest("the blocklist expiry must be > 0 seconds")
    out = Revoked(entity, key_removed=True, expire_seconds=expire)
    try:
        _command(cluster, {"prefix": "auth get", "entity": entity, "format": "json"})
    except ZlogError as e:
        if e.errno != errno.ENOENT:
            raise
        out.key_removed = False
    if out.key_removed:
        _command(cluster, {"prefix": "auth rm", "entity": entity})
    for _ in range(MAX_ROUNDS):
        new = sorted(session_addresses(cluster, entity) - set(out.addresses))
        if not new:
            break
        for addr in new:
            _command(cluster, {"prefix": "osd blocklist", "blocklistop": "add", "addr": addr, "expire": expire})
        out.addresses += new
    if not out.key_removed and not out.addresses:
        raise ZlogError(f"{entity} has no key and no open connection: nothing to revoke")
    if out.addresses:
        out.osdmap_epoch = int(_json(cluster, "osd dump")["epoch"])
        out.lagging_osds = _osds_caught_up(cluster, out.osdmap_epoch, wait)
    return out
