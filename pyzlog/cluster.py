"""Connecting to Ceph with timeouts and plain errors instead of hangs."""
from __future__ import annotations

import errno
import math
import os
from pathlib import Path

import rados

from .errors import ClusterUnavailable, PermissionDenied, PoolNotFound, ZlogError

DEFAULT_CONF = "/etc/ceph/ceph.conf"
#: seconds to reach the monitors (connect, pool lookups)
DEFAULT_CONNECT_TIMEOUT = 10.0
#: seconds an OSD operation may take before it fails with ClusterUnavailable
DEFAULT_OP_TIMEOUT = 30.0


def resolve_conf(conf: str | os.PathLike[str] | None) -> str:
    """--conf, else $CEPH_CONF, else /etc/ceph/ceph.conf; it must exist."""
    path = str(conf) if conf else os.environ.get("CEPH_CONF", DEFAULT_CONF)
    if not Path(path).is_file():
        raise ClusterUnavailable(f"ceph.conf not found: {path} (pass --conf or set CEPH_CONF)")
    return path


def connect(conf: str | os.PathLike[str] | None = None, *, keyring: str | None = None,
            client: str = "client.admin", connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
            op_timeout: float = DEFAULT_OP_TIMEOUT) -> rados.Rados:
    """A connected rados.Rados. Raises ClusterUnavailable or PermissionDenied."""
    path = resolve_conf(conf)
    # Ceph takes whole seconds, and 0 would mean "wait forever".
    connect_s = max(1, math.ceil(connect_timeout))
    op_s = max(1, math.ceil(op_timeout))
    opts = {
        "rados_mon_op_timeout": str(connect_s),
        "client_mount_timeout": str(connect_s),
        "rados_osd_op_timeout": str(op_s),
    }
    if keyring:
        opts["keyring"] = str(keyring)
    try:
        cluster = rados.Rados(conffile=path, name=client, conf=opts)
    except rados.Error as e:
        raise ClusterUnavailable(f"bad client configuration ({path}): {e}") from None
    try:
        cluster.connect(timeout=connect_s)
    except rados.PermissionDeniedError:
        cluster.shutdown()
        raise PermissionDenied(f"cephx refused {client} (check the keyring)") from None
    except (rados.TimedOut, rados.Error) as e:
        cluster.shutdown()
        code = getattr(e, "errno", None)
        if code == errno.EACCES:
            raise PermissionDenied(f"cephx refused {client} (check the keyring)") from None
        if code == errno.ENOENT:
            raise PermissionDenied(f"no key for {client}: keyring {keyring or '(from ceph.conf)'} "
                                   "not found or without that client") from None
        raise ClusterUnavailable(
            f"cannot reach the Ceph cluster of {path} within {connect_timeout:.0f}s: {e}") from None
    return cluster


def open_ioctx(cluster: rados.Rados, pool: str, namespace: str | None = None) -> rados.Ioctx:
    """An I/O context on `pool` (PoolNotFound if it does not exist)."""
    try:
        ioctx = cluster.open_ioctx(pool)
    except rados.ObjectNotFound:
        raise PoolNotFound(f"pool {pool!r} does not exist") from None
    except rados.TimedOut:
        raise ClusterUnavailable(f"cluster did not answer opening pool {pool!r}") from None
    except rados.Error as e:
        raise ZlogError(f"cannot open pool {pool!r}: {e}") from None
    if namespace:
        ioctx.set_namespace(namespace)
    return ioctx
