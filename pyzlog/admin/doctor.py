"""`zlog check`: what a new operator runs first. Each check is one line;
a failed one says what to do (docs/deploy.md has the details).

The class check calls cls_zlog once on each up OSD: it asks the monitors
(`osd map`) where trial object names in the namespace CHECK_NAMESPACE land,
until it has one object whose primary is each OSD (class calls run on the
primary), then calls the read-only method "stat" there. EOPNOTSUPP means
that OSD has not loaded the class. The caps check writes one scratch object
in CHECK_NAMESPACE with a class write method and removes it.
"""
from __future__ import annotations

import errno
import json
import os
import socket
from dataclasses import dataclass
from typing import Any

import rados

from ..core.cluster import mon_json, open_ioctx
from ..core.errors import ClassNotLoaded, PermissionDenied, PoolNotFound, ZlogError
from ..core.native import Connection, Op, Pool
from ..core.registry import read_records, recent, registry_ioctx
from .status import PROBE_TIMEOUT, Probes

CHECK_NAMESPACE = "zlog.check"
#: trial object names per up OSD before giving up finding one it is primary for
TRIES_PER_OSD = 64


@dataclass
class Check:
    name: str
    status: str  # ok, warn, fail, skip
    detail: str


def run_checks(env: Any) -> list[Check]:
    """env: cli.Env (conf, pool, seqr, cluster)."""
    out: list[Check] = []
    names = ["cluster", "pool", "class", "caps", "sequencer"]

    def skip_rest() -> list[Check]:
        return out + [Check(n, "skip", "not checked (an earlier check failed)") for n in names[len(out):]]

    try:
        cluster = env.cluster
        osds = mon_json(cluster, "osd dump")["osds"]
        up = [o["osd"] for o in osds if o.get("up")]
        out.append(Check("cluster", "ok", f"fsid {cluster.get_fsid()}, {len(up)} of {len(osds)} OSD(s) up"))
    except (ZlogError, rados.Error) as e:
        out.append(Check("cluster", "fail", str(e)))
        return skip_rest()
    try:
        ioctx = open_ioctx(cluster, env.pool, CHECK_NAMESPACE)
        out.append(Check("pool", "ok", f"pool {env.pool!r} exists"))
    except PoolNotFound:
        out.append(Check("pool", "fail", f"pool {env.pool!r} does not exist: ceph osd pool create {env.pool} "
                                         f"&& ceph osd pool application enable {env.pool} zlog"))
        return skip_rest()
    except ZlogError as e:
        out.append(Check("pool", "fail", str(e)))
        return skip_rest()
    try:
        conn = Connection.of(cluster)
        pool = conn.pool(env.pool, CHECK_NAMESPACE)
        out.append(check_class(cluster, conn, pool, osds))
        out.append(check_caps(conn, pool, ioctx))
    except ZlogError as e:
        out.append(Check("class", "fail", str(e)))
    finally:
        ioctx.close()
    out.append(check_sequencer(cluster, env.pool, env.seqr))
    return out


def primaries(cluster: rados.Rados, pool: str, up: list[int]) -> dict[int, str]:
    """{osd: an object name in CHECK_NAMESPACE whose acting primary it is}."""
    found: dict[int, str] = {}
    for i in range(TRIES_PER_OSD * max(1, len(up))):
        if len(found) == len(up):
            break
        name = f"probe.{i}"
        m = mon_json(cluster, "osd map", pool=pool, object=name, nspace=CHECK_NAMESPACE)
        found.setdefault(int(m["acting_primary"]), name)
    return found


def check_class(cluster: rados.Rados, conn: Connection, pool: Pool, osds: list[dict[str, Any]]) -> Check:
    up = sorted(o["osd"] for o in osds if o.get("up"))
    down = sorted(o["osd"] for o in osds if not o.get("up"))
    try:
        where = primaries(cluster, pool.name, up)
    except ZlogError as e:
        return Check("class", "fail", str(e))
    missing, loaded, errors, denied = [], [], [], []
    for osd, name in sorted(where.items()):
        try:
            ret, _ = conn.call_raw(pool, name, Op.STAT)
            if ret in (-errno.EPERM, -errno.EACCES):
                raise conn.error(ret, f"stat on {name}", pool=pool, oid=name, op=Op.STAT)
        except PermissionDenied as e:
            denied.append((osd, str(e)))
            continue
        except ZlogError as e:
            errors.append(f"osd.{osd}: {e}")
            continue
        if ret == -errno.EOPNOTSUPP:
            missing.append(osd)
        elif ret < 0 and ret != -errno.ENOENT:
            errors.append(f"osd.{osd}: {errno.errorcode.get(-ret, ret)}")
        else:
            loaded.append(osd)
    if missing:
        names = ", ".join(f"osd.{o}" for o in missing)
        return Check("class", "fail", f"cls_zlog is not loaded on {names} (of {len(where)} checked): install "
                                      "libcls_zlog.so in its 'osd class dir', allow it in 'osd class load list', "
                                      "restart it (docs/deploy.md)")
    if denied and loaded:  # the caps are the same everywhere: those OSDs refuse the class itself
        names = ", ".join(f"osd.{o}" for o, _ in denied)
        return Check("class", "fail", f"{names} refused cls_zlog (EPERM) while {len(loaded)} other OSD(s) ran it: "
                                      "their 'osd class load list' or 'osd class default list' leaves zlog out "
                                      "(docs/deploy.md)")
    if denied:
        return Check("class", "fail", f"every OSD refused the class call (EPERM): this client's caps lack class "
                                      "access, or the OSDs' 'osd class load list' or 'osd class default list' leaves zlog "
                                      "out (docs/deploy.md); "
                                      f"{denied[0][1]}")
    if errors:
        return Check("class", "fail", "; ".join(errors))
    notes = []
    unreached = [o for o in up if o not in where]
    if unreached:
        notes.append(f"primary of no object tried: {', '.join(f'osd.{o}' for o in unreached)} (not checked)")
    if down:
        notes.append(f"down, not checked: {', '.join(f'osd.{o}' for o in down)}")
    detail = f"loaded on every up OSD checked ({', '.join(f'osd.{o}' for o in loaded)})"
    return Check("class", "warn" if notes else "ok", detail + ("; " + "; ".join(notes) if notes else ""))


def check_caps(conn: Connection, pool: Pool, ioctx: rados.Ioctx) -> Check:
    """r, class-read, class-write and w, by a scratch object's life."""
    scratch = f"caps.{socket.gethostname()}.{os.getpid()}"
    try:
        ret, _ = conn.call_raw(pool, scratch, Op.STAT)  # class-read (a PermissionDenied names what lacks)
        if ret < 0 and ret != -errno.ENOENT:
            raise conn.error(ret, f"stat on {scratch}", pool=pool, oid=scratch, op=Op.STAT)
        conn.call(pool, scratch, Op.SEAL, epoch=1)  # class-write, creates the object
        ioctx.stat(scratch)  # r
        ioctx.remove_object(scratch)  # w
    except PermissionDenied as e:
        return Check("caps", "fail", str(e))
    except ClassNotLoaded:
        return Check("caps", "skip", "not checked: the OSD of the scratch object has no cls_zlog (see class)")
    except (ZlogError, rados.Error) as e:
        return Check("caps", "fail", f"scratch object {CHECK_NAMESPACE}/{scratch}: {e}")
    return Check("caps", "ok", f"r, w, class-read and class-write on pool {pool.name!r}")


def check_sequencer(cluster: rados.Rados, pool: str, given: str | None) -> Check:
    """Which sequencers answer, and whether this client gets in: the handshake
    for the pool with the secret read with this client's caps."""
    from ..core.errors import SequencerRefused, SequencerUnavailable
    from ..core.seqr_auth import Credentials
    from ..core.sequencer import authenticate

    probes = Probes()
    credentials = Credentials(cluster)
    try:
        live = [r.address for r in recent(read_records(registry_ioctx(cluster, pool)))]
    except (ZlogError, rados.Error):
        live = []
    answering = [a for a in live if probes(a)]
    parts, refused = [], []
    for address in ([given] if given else []) + [a for a in answering if a != given]:
        try:
            parts.append(f"{address}{' (given)' if address == given else ''} lets this client in "
                         f"({authenticate(address, pool, credentials, PROBE_TIMEOUT * 4)})")
        except SequencerRefused as e:
            refused.append(str(e))
        except SequencerUnavailable as e:
            if address == given:
                return Check("sequencer", "fail", f"--seqr/ZLOG_SEQR {given} does not answer (is zlog-seqr running "
                                                  f"and reachable from here?): {e}")
    if refused:
        return Check("sequencer", "fail", "; ".join(refused))
    if live:
        parts.append(f"{len(answering)} of {len(live)} registered daemon(s) answer")
    if not given and not answering:
        return Check("sequencer", "fail", "no sequencer: none given (--seqr/ZLOG_SEQR) and no registered daemon "
                                          f"answers (zlog-seqr --pool {pool}); appends would use slow tail "
                                          "finding")
    return Check("sequencer", "ok", "; ".join(parts))