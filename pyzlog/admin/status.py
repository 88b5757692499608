"""What `zlog info` and `zlog status` show: a log's epoch, views, tail and
sequencer, and a pool's logs and sequencer daemons. Read-only: nothing here
seals an epoch or asks a sequencer for a position (asking one about a log it
does not serve would make it take the log over), so the tail shown is the
one in storage (highest position + 1), and a sequencer "answers" when its
port accepts a connection.
"""
from __future__ import annotations

import socket
import time
from typing import Any

import rados

from ..core import offsets, wire
from ..core.cluster import mon_json, open_ioctx
from ..core.errors import ZlogError
from ..core.layout import META_NAMESPACE
from ..core.metadata import MetaStore
from ..client.positions import next_position_hint
from ..core.registry import preference, read_records, recent, registry_ioctx
from ..core.sequencer import parse_address
from ..core.state import LogState
from ..core.stripes import made_places
from ..core.tailfind import stat_places

PROBE_TIMEOUT = 0.5


class Probes:
    """Whether each sequencer address answers, asked once per address."""

    def __init__(self, timeout: float = PROBE_TIMEOUT) -> None:
        self.timeout = timeout
        self._seen: dict[str, bool] = {}

    def __call__(self, address: str) -> bool:
        if address not in self._seen:
            try:
                host, port = parse_address(address)
                socket.create_connection((host, port), timeout=self.timeout).close()
                self._seen[address] = True
            except (OSError, ZlogError):
                self._seen[address] = False
        return self._seen[address]


def registry_daemons(cluster: rados.Rados, pool: str, probes: Probes) -> list[dict[str, Any]]:
    """The pool's registered sequencer daemons (zlog-seqr --pool)."""
    try:
        records = read_records(registry_ioctx(cluster, pool))
    except (ZlogError, rados.Error):  # no registry, or caps that do not reach it
        return []
    fresh = {r.address for r in recent(records)}
    now = time.time()
    return [{"address": r.address, "host": r.host, "pid": r.pid, "lease": r.lease,
             "beat_age_s": round(now - r.time, 1), "recent": r.address in fresh, "answers": probes(r.address)}
            for r in records]


def log_status(cluster: rados.Rados, pool: str, name: str, given: str | None, probes: Probes,
               daemons: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One log: epoch, views, tail (from storage) and its sequencer."""
    state = LogState(cluster, pool, name)
    meta = state.refresh()  # LogNotFound if missing
    views = [view_dict(v) for v in meta.views]
    if daemons is None:
        daemons = registry_daemons(cluster, pool, probes)
    return {"name": name, "pool": pool, "epoch": meta.epoch, "width": views[-1]["width"],
            "tail": next_position_hint(state), "views": views, "config": state.config,
            "stored": stored(state, meta),
            "sequencer": sequencer_of(pool, name, meta.sequencer, meta.sequencer_epoch, given, probes, daemons)}


def view_dict(v: wire.View) -> dict[str, Any]:
    out: dict[str, Any] = {"epoch": v.epoch, "start": v.start, "width": v.width,
                           "format": "data" if v.bounded else "omap"}
    if v.bounded:
        out.update(slots=v.slots, byte_bound=v.byte_bound, stripes=v.stripes, unit=v.unit)
    return out


def stored(state: LogState, meta: wire.Meta) -> dict[str, Any]:
    """What the log's data-format objects hold (entries written and their
    bytes, from every object's header), how many objects it has, and its
    first untrimmed position. Omap-format views are not counted (their
    objects do not count what they hold): `counted` says whether all were."""
    places = [p for v in meta.views if v.bounded for p in made_places(state, v)]
    stats = stat_places(state, places) if places else []
    return {"entries": sum(st.entries for st in stats), "bytes": sum(st.bytes for st in stats),
            "objects": len(stats), "first_position": meta.trim_below,
            "counted": all(v.bounded for v in meta.views)}


def pool_usage(cluster: rados.Rados, pool: str) -> dict[str, Any]:
    """The pool as Ceph counts it (`ceph df`: stored bytes and objects, from
    the mgr) and its quotas; a figure Ceph cannot give here is None."""
    out: dict[str, Any] = {"stored_bytes": None, "objects": None, "quota_max_bytes": None,
                           "quota_max_objects": None}
    try:
        quota = mon_json(cluster, "osd pool get-quota", pool=pool)
        out["quota_max_bytes"] = quota.get("quota_max_bytes") or None
        out["quota_max_objects"] = quota.get("quota_max_objects") or None
    except ZlogError:
        pass
    try:
        for entry in mon_json(cluster, "df").get("pools", []):
            if entry.get("name") == pool:
                out["stored_bytes"] = entry["stats"].get("stored", entry["stats"].get("bytes_used"))
                out["objects"] = entry["stats"].get("objects")
    except (ZlogError, KeyError, TypeError):
        pass
    return out


def sequencer_of(pool: str, name: str, recorded: str, recorded_epoch: int, given: str | None, probes: Probes,
                 daemons: list[dict[str, Any]]) -> dict[str, Any]:
    """Which sequencer a client asks for this log, in the client's order
    (positions.Positions.follow): the one the metadata records, else the one
    given (--seqr / ZLOG_SEQR), else the registry's pick; none: slow tail finding."""
    out: dict[str, Any] = {"recorded": recorded or None, "recorded_epoch": recorded_epoch or None,
                           "recorded_answers": probes(recorded) if recorded else None,
                           "given": given, "given_answers": probes(given) if given else None}
    picks = preference(f"{pool}/{name}", [d["address"] for d in daemons if d["recent"]])
    if recorded:
        out["asked"], out["source"] = recorded, "metadata"
    elif given:
        out["asked"], out["source"] = given, "given"
    elif picks:
        out["asked"], out["source"] = picks[0], "registry"
    else:
        out["asked"], out["source"] = None, "none (slow tail finding)"
    out["asked_answers"] = probes(out["asked"]) if out["asked"] else None
    return out


def _consumers(meta_io: rados.Ioctx) -> dict[str, dict[str, offsets.Committed]]:
    try:
        return offsets.list_consumers(meta_io)
    except ZlogError:  # caps that reach the logs but not every consumer: show the logs
        return {}


def consumer_status(consumers: dict[str, offsets.Committed], tail: int) -> list[dict[str, Any]]:
    """A log's named consumers: committed position, lag (the tail in storage
    minus it), and when and by whom it was last committed."""
    now = time.time()
    return [{"name": name, "position": c.position, "lag": max(0, tail - c.position),
             "committed_age_s": round(now - c.committed_at, 1), "committed_by": c.committed_by}
            for name, c in sorted(consumers.items())]


def pool_status(cluster: rados.Rados, pool: str, given: str | None, probes: Probes | None = None) -> dict[str, Any]:
    """Every log of the pool, and the sequencers seen: registered daemons,
    addresses recorded in logs' metadata, and the one given."""
    probes = probes or Probes()
    daemons = registry_daemons(cluster, pool, probes)
    meta_io = open_ioctx(cluster, pool, META_NAMESPACE)
    names = [n for n in MetaStore.list_names(meta_io) if offsets.is_log_object(n)]
    consumers = _consumers(meta_io)
    logs = []
    for name in names:
        try:
            entry = log_status(cluster, pool, name, given, probes, daemons)
            entry["consumers"] = consumer_status(consumers.get(name, {}), entry["tail"])
            logs.append(entry)
        except ZlogError as e:  # one broken log must not hide the others
            logs.append({"name": name, "pool": pool, "error": str(e)})
    seen: dict[str, dict[str, Any]] = {d["address"]: {"address": d["address"], "registered": True,
                                                      "answers": d["answers"], "logs": 0} for d in daemons}
    for entry in logs:
        recorded = entry.get("sequencer", {}).get("recorded")
        if recorded:
            s = seen.setdefault(recorded, {"address": recorded, "registered": False,
                                           "answers": probes(recorded), "logs": 0})
            s["logs"] += 1
    if given and given not in seen:
        seen[given] = {"address": given, "registered": False, "answers": probes(given), "logs": 0}
    return {"pool": pool, "logs": logs, "log_count": len(names), "daemons": daemons,
            "usage": pool_usage(cluster, pool), "sequencers": sorted(seen.values(), key=lambda s: s["address"])}
