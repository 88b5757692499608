"""Sequencer failover: a zlog-seqr daemon's watch over the pools it serves.

Each daemon, on one thread:
- beats: rewrites its registry record (registry.py) every lease / 4;
- watches its peers' beats. A peer whose beat has not changed for a lease
  (on this daemon's monotonic clock), or whose port refuses connections, is
  dead: the logs its record names as their sequencer are taken over. Of the
  live daemons, the one each log prefers (registry.preference) takes it at
  once, the next after one lease, and so on, so a log is taken over even if
  its first choice dies too, and two daemons rarely contend for it;
- steps down: after a pause longer than a lease (SIGSTOP, a stalled host)
  it checks every log it serves and forgets those the metadata now gives to
  another daemon. Its clients' writes were refused meanwhile anyway: the
  taking over sealed the objects at a newer epoch.

Taking a log over is the usual recovery (seal a new epoch, find the tail,
install by compare-and-swap) with this daemon recorded as the log's
sequencer; the daemon does it only if the recorded sequencer is itself,
none, or dead (SequencerDaemon._recover). So a live owner is never
displaced, and two daemons cannot take a log from each other in turn.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import rados

from ..core import offsets, wire
from ..core.cluster import open_ioctx
from ..core.errors import ZlogError
from ..core.layout import META_NAMESPACE
from ..core.metadata import MetaStore
from ..core.native import Connection, Op
from ..core.registry import (DEFAULT_GROUP, DaemonRecord, answers, preference, read_records,
                       refuses_connections, registry_ioctx)
from ..core.seqr_auth import Credentials

log = logging.getLogger("zlog-seqr")

#: list the registry for new daemons this often (reading known ones is every tick)
LIST_EVERY_SECONDS = 2.0
#: check the owner of every served log this often, pause or not (a safety net)
VERIFY_EVERY_SECONDS = 30.0
#: a dead daemon's record is removed after this many leases (every peer has seen it dead by then)
FORGET_DEAD_AFTER_LEASES = 10


class Peer:
    """What this daemon has seen of another daemon's beats."""

    def __init__(self, beat: int, now: float) -> None:
        self.beat = beat
        self.changed_at = now
        self.refused = False  # its port is closed
        self.gone = False  # its record was removed: it stopped cleanly (or was forgotten)
        self.handled = False  # its logs were scanned for taking over since it died
        self.rescans: list[float] = []  # scan its logs again then (take-overs it had under way)

    def see(self, beat: int, now: float) -> None:
        """Its record read: a new beat is a sign of life."""
        if beat != self.beat:
            self.beat = beat
            self.changed_at = now
            self.handled = False
            self.rescans = []

    def dead(self, now: float, lease: float) -> bool:
        return self.refused or now - self.changed_at >= lease


class Watch:
    def __init__(self, cluster: rados.Rados, server: Any, me: str, pools: list[str], lease: float,
                 request_recovery: Callable[[str, str, int], None], group: str = DEFAULT_GROUP,
                 credentials: Credentials | None = None) -> None:
        self.cluster = cluster
        self.credentials = credentials  # TLS settings for probing peers
        self.server = server  # pyzlog._seqr.Server
        self.me = me
        self.pools = list(pools)
        self.lease = lease
        self.tick = min(0.25, lease / 4)
        self._request_recovery = request_recovery
        self._registry = {p: registry_ioctx(cluster, p, group) for p in self.pools}
        self._conn = Connection.of(cluster)
        self._meta_pool = {p: self._conn.pool(p, META_NAMESPACE) for p in self.pools}
        self._meta_list = {p: open_ioctx(cluster, p, META_NAMESPACE) for p in self.pools}
        self._peers: dict[str, dict[str, Peer]] = {p: {} for p in self.pools}
        self._known: dict[str, list[str]] = {p: [] for p in self.pools}
        self._listed_at = 0.0
        #: (pool, log) -> (dead owner, since, last asked for its recovery)
        self._pending: dict[tuple[str, str], tuple[str, float, float]] = {}
        self._lock = threading.Lock()
        self._probes: dict[str, tuple[float, bool]] = {}  # address -> (when, answered)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beat = 0
        self._started = time.time()
        self._host = socket.gethostname()
        self._last_tick = time.monotonic()
        self._verified_at = time.monotonic()

    # ------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._beat_all()  # registered before the first client can look
        self._thread = threading.Thread(target=self._run, name="failover-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(5)
        for pool, io in self._registry.items():
            try:
                io.remove_object(self.me)  # a clean stop: peers need not wait a lease
            except rados.Error:
                pass

    # ------------------------------------------------------------- liveness
    def owner_alive(self, pool: str, owner: str) -> bool:
        """Is `owner` (a log's recorded sequencer) alive, as far as this daemon knows?"""
        if owner == self.me:
            return True
        with self._lock:
            peer = self._peers.get(pool, {}).get(owner)
            if peer is not None:
                return not peer.dead(time.monotonic(), self.lease)
        # not a daemon we watch (no --pool, or its record long gone): alive if it
        # answers (one probe per address and tick, however many logs ask)
        now = time.monotonic()
        cached = self._probes.get(owner)
        if cached is None or now - cached[0] > self.tick:
            cached = self._probes[owner] = (now, answers(owner, timeout=min(1.0, self.lease),
                                                         credentials=self.credentials))
        return cached[1]

    # ----------------------------------------------------------------- loop
    def _run(self) -> None:
        next_beat = 0.0
        while not self._stop.wait(self.tick):
            now = time.monotonic()
            gap = now - self._last_tick
            paused = gap > self.lease
            self._last_tick = now
            try:
                if now >= next_beat or paused:
                    self._beat_all()
                    next_beat = now + self.lease / 4
                if paused or now - self._verified_at > VERIFY_EVERY_SECONDS:
                    if paused:
                        log.warning("this daemon was stopped for %.1fs (longer than the lease): "
                                    "checking which logs are still its own", gap)
                    self._verify_served()
                    self._verified_at = now
                self._watch_peers(now)
                self._take_over_pending(now)
            except ZlogError as e:
                log.warning("failover watch: %s", e)
            except rados.Error as e:
                log.warning("failover watch: RADOS: %s", e)
            except Exception:
                log.exception("failover watch failed; going on")

    def _beat_all(self) -> None:
        self._beat += 1
        rec = DaemonRecord(self.me, self._beat, time.time(), self.lease, os.getpid(), self._host, self._started)
        for io in self._registry.values():
            io.write_full(self.me, rec.encode())

    def _watch_peers(self, now: float) -> None:
        if now - self._listed_at > LIST_EVERY_SECONDS:
            self._listed_at = now
            for pool, io in self._registry.items():
                self._known[pool] = sorted(o.key for o in io.list_objects() if o.key != self.me)
        for pool, io in self._registry.items():
            # the peers known too, not only those of the last listing: a record removed for a
            # moment (by hand) and rewritten by its live daemon is seen again within a tick
            with self._lock:
                watched = sorted(set(self._known[pool]) | set(self._peers[pool]))
            records = {r.address: r for r in read_records(io, watched)}
            with self._lock:
                peers = self._peers[pool]
                for address, rec in records.items():
                    peer = peers.get(address)
                    if peer is None:
                        peers[address] = peer = Peer(rec.beat, now)
                    peer.see(rec.beat, now)
                    peer.gone = False
                for address, peer in peers.items():
                    peer.gone = address not in records  # a clean stop removes the record: its logs move too
            for address, peer in list(peers.items()):
                # record gone (stopped cleanly, or removed by hand from a live daemon, which
                # rewrites it with its next beat) or not: dead when its port is closed, or a lease
                # after its last beat. An answer at its address is no beat: any zlog-seqr there
                # answers (a restart under another name, one of another pool), the dead one's too
                peer.refused = refuses_connections(address, timeout=min(0.3, self.tick))
                if peer.dead(now, self.lease) and not peer.handled:
                    peer.handled = True
                    # its own take-overs may still land: look at its logs again later
                    peer.rescans = [now + self.lease, now + 3 * self.lease]
                    log.warning("sequencer %s of pool %r is dead (%s): taking over its logs", address, pool,
                                "stopped" if peer.gone else "port closed" if peer.refused else
                                f"no beat for {now - peer.changed_at:.1f}s")
                    self._scan_logs_of(pool, address, now)
                elif peer.handled and peer.rescans and now >= peer.rescans[0]:
                    peer.rescans.pop(0)
                    self._scan_logs_of(pool, address, now)
                if peer.handled and now - peer.changed_at > FORGET_DEAD_AFTER_LEASES * self.lease:
                    # long dead: every peer has seen it; it rewrites its record if it comes back
                    if peer.gone:
                        with self._lock:
                            del peers[address]
                    else:
                        try:
                            io.remove_object(address)
                        except rados.ObjectNotFound:
                            pass

    def _scan_logs_of(self, pool: str, dead: str, now: float) -> None:
        """Queue every log of `pool` whose recorded sequencer is `dead`."""
        # the namespace also holds named consumers' positions (core.offsets)
        names = [n for n in MetaStore.list_names(self._meta_list[pool]) if offsets.is_log_object(n)]
        metas = self._conn.calls([(self._meta_pool[pool], n, Op.META_GET, {}) for n in names])
        for name, (code, raw) in zip(names, metas):
            if code == 0 and wire.parse_meta(raw).sequencer == dead:
                self._pending.setdefault((pool, name), (dead, now, 0.0))

    def _take_over_pending(self, now: float) -> None:
        """Ask for the recovery of each log of a dead daemon this daemon is
        due to take (see the module doc), again every lease until the
        metadata names a live sequencer."""
        for key, (dead, since, asked_at) in list(self._pending.items()):
            pool, name = key
            with self._lock:
                live = [a for a, p in self._peers[pool].items() if not p.dead(now, self.lease)]
            if dead in live:
                del self._pending[key]  # it came back (a pause shorter than we thought): its log stays
                continue
            order = preference(f"{pool}/{name}", live + [self.me])
            if now - since < order.index(self.me) * self.lease or now - asked_at < self.lease:
                continue  # a daemon this log prefers gets the first chance; or asked recently
            code, raw = self._conn.call_raw(self._meta_pool[pool], name, Op.META_GET)
            owner = wire.parse_meta(raw).sequencer if code == 0 else None
            if owner != dead:
                if owner and not self.owner_alive(pool, owner):
                    self._pending[key] = (owner, now, 0.0)  # taken over by one that died too
                else:
                    del self._pending[key]  # taken over (or the log is gone)
                continue
            self._pending[key] = (dead, since, now)
            log.info("log %s/%s: taking it over from %s", pool, name, dead)
            self._request_recovery(pool, name, 0)

    def _verify_served(self) -> None:
        """Forget every served log whose metadata names another sequencer."""
        for info in self.server.logs():
            if info["state"] != "ready" or info["pool"] not in self._meta_pool:
                continue
            code, raw = self._conn.call_raw(self._meta_pool[info["pool"]], info["log"], Op.META_GET)
            owner = wire.parse_meta(raw).sequencer if code == 0 else None
            if owner != self.me:
                self.server.forget(info["pool"], info["log"])
                log.warning("log %s/%s: now served by %s; stepped down", info["pool"], info["log"],
                            owner or "nobody (it is gone)")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_address_free(cluster: rados.Rados, pools: list[str], address: str, lease: float,
                       group: str = DEFAULT_GROUP) -> None:
    """Refuse to advertise an address another live daemon advertises: two
    daemons under one name would each take the log from the other without
    end. A record left by a dead predecessor (a restart) is fine: its process
    is gone from this host, or its beat stays still for a lease."""
    host = socket.gethostname()
    tick = min(0.25, lease / 4)
    for pool in pools:
        io = registry_ioctx(cluster, pool, group)
        found = read_records(io, [address])
        if not found:
            continue
        rec = found[0]
        if rec.host == host and (rec.pid == os.getpid() or not _pid_alive(rec.pid)):
            continue  # a predecessor's (a restarted container may give us its pid)
        deadline = time.monotonic() + lease + tick
        while time.monotonic() < deadline:
            time.sleep(tick)
            now = read_records(io, [address])
            if not now:
                break  # removed: that daemon stopped cleanly
            if now[0].beat != rec.beat:
                raise ZlogError(f"address {address} is already advertised in pool {pool!r} by a live daemon "
                                f"(pid {now[0].pid} on host {now[0].host}): give this one another --advertise")
