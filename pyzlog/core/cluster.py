"""Connecting to Ceph with timeouts and plain errors instead of hangs."""
from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .batching import AppendBatching
from .errors import ClusterUnavailable, InvalidRequest, PermissionDenied, PoolNotFound, ZlogError

if TYPE_CHECKING:
    import rados

DEFAULT_CONF = "/etc/ceph/ceph.conf"
#: seconds to reach the monitors (connect, pool lookups)
DEFAULT_CONNECT_TIMEOUT = 10.0
#: seconds an OSD operation may take before it fails with ClusterUnavailable
DEFAULT_OP_TIMEOUT = 30.0


_cluster_class: Any = None
#: called with a pyzlog connection as it shuts down (the data plane closes its own first)
on_shutdown: list[Any] = []


def _cluster_type() -> Any:
    """rados.Rados with the client name it connected as (python-rados does
    not say), so the data plane can connect as the same client. Made on first
    use: python-rados is imported only by what talks to a cluster."""
    global _cluster_class
    if _cluster_class is None:
        import rados

        class Cluster(rados.Rados):  # type: ignore[misc]  # python-rados has no types
            client_name = "client.admin"
            #: how its data plane batches async appends (connect(append_batching=))
            append_batching: AppendBatching | None = None

            def shutdown(self) -> None:
                for hook in on_shutdown:
                    hook(self)
                super().shutdown()

        _cluster_class = Cluster
    return _cluster_class


#: settings a second connection copies from a connected rados.Rados
_COPIED_SETTINGS = ("mon_host", "keyring", "key", "keyfile", "auth_client_required",
                    "rados_mon_op_timeout", "client_mount_timeout", "rados_osd_op_timeout",
                    "objecter_timeout", "objecter_tick_interval")

#: librados' own defaults: an op older than this, seen at a tick, is laggy
OBJECTER_TIMEOUT = 10.0
OBJECTER_TICK_INTERVAL = 5.0


def laggy_settings(op_timeout_s: int) -> dict[str, str]:
    """When librados asks the monitors for a newer OSD map: on a tick that finds
    an op in flight longer than objecter_timeout. A client learns that an OSD
    is down only that way or from another OSD's reply; with ops that time out
    before any tick finds them laggy (op timeout <= 10 s under the defaults),
    a client whose ops all go to an OSD cut off from the network never learns,
    and retries there for ever although the cluster serves without it. So
    every op is seen laggy at least once before it times out."""
    third = op_timeout_s / 3
    return {"objecter_timeout": f"{min(OBJECTER_TIMEOUT, third):g}",
            "objecter_tick_interval": f"{min(OBJECTER_TICK_INTERVAL, third):g}"}


def connection_settings(cluster: rados.Rados) -> tuple[str, str, list[tuple[str, str]]]:
    """(client name, ceph.conf path or "", options) to connect again as `cluster` did."""
    if _cluster_class is not None and isinstance(cluster, _cluster_class):
        name = cluster.client_name
    else:
        name = f"client.{cluster.rados_id}" if cluster.rados_id else "client.admin"
    conffile = cluster.conffile if isinstance(cluster.conffile, str) else ""
    options = []
    for key in _COPIED_SETTINGS:
        value = cluster.conf_get(key)
        if value:
            options.append((key, value))
    options.append(("admin_socket", ""))  # the first connection owns the socket path
    return name, conffile, options


def resolve_conf(conf: str | os.PathLike[str] | None) -> str:
    """--conf, else $CEPH_CONF, else /etc/ceph/ceph.conf; it must exist."""
    path = str(conf) if conf else os.environ.get("CEPH_CONF", DEFAULT_CONF)
    if not Path(path).is_file():
        raise ClusterUnavailable(f"ceph.conf not found: {path} (pass --conf or set CEPH_CONF)")
    return path


def connect(conf: str | os.PathLike[str] | None = None, *, keyring: str | None = None,
            client: str = "client.admin", connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
            op_timeout: float = DEFAULT_OP_TIMEOUT, append_batching: AppendBatching | None = None) -> rados.Rados:
    """A connected rados.Rados. Raises ClusterUnavailable or PermissionDenied.
    append_batching: how async appends of every log on it are batched
    (defaults: AppendBatching())."""
    if append_batching is not None and not isinstance(append_batching, AppendBatching):
        raise InvalidRequest(f"append_batching must be a pyzlog.AppendBatching, not {append_batching!r}")
    path = resolve_conf(conf)
    # Ceph takes whole seconds, and 0 would mean "wait forever".
    connect_s = max(1, math.ceil(connect_timeout))
    op_s = max(1, math.ceil(op_timeout))
    opts = {
        "rados_mon_op_timeout": str(connect_s),
        "client_mount_timeout": str(connect_s),
        "rados_osd_op_timeout": str(op_s),
        **laggy_settings(op_s),
    }
    if keyring:
        opts["keyring"] = str(keyring)
    import rados

    try:
        cluster = _cluster_type()(conffile=path, name=client, conf=opts)
    except rados.Error as e:
        raise ClusterUnavailable(f"bad client configuration ({path}): {e}") from None
    cluster.client_name = client
    cluster.append_batching = append_batching
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
    import rados

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


def mon_json(cluster: rados.Rados, prefix: str, **args: Any) -> Any:
    """A monitor (or mgr-backed) command's JSON answer; typed errors."""
    ret, out, err = cluster.mon_command(json.dumps({"prefix": prefix, "format": "json", **args}), b"", timeout=10)
    if ret < 0:
        if -ret in (errno.EACCES, errno.EPERM):
            raise PermissionDenied(f"the monitors refused '{prefix}': this client needs mon 'allow r'")
        raise ZlogError(f"'{prefix}' failed: {err or errno.errorcode.get(-ret, ret)}")
    return json.loads(out)
