"""What a client's cephx caps lack when an OSD refuses a cls_zlog call.

An OSD answers EPERM for any missing cap, without saying which. On that
(rare) path we ask the OSD a few harmless questions to name it: a plain
stat needs 'r', a read-only class call 'class-read', removing an object
that does not exist 'w'. Class write methods need 'r', 'w', 'class-read'
and 'class-write' ("allow rwx pool=P" grants all four; docs/deploy.md).
"""
from __future__ import annotations

import errno

import rados

from .errors import PermissionDenied

#: cls_zlog methods registered CLS_METHOD_RD | CLS_METHOD_WR (cls_zlog.cc)
WRITE_METHODS = frozenset({"write", "write_many", "fill", "trim", "trim_to", "seal", "close",
                           "meta_create", "meta_new_epoch", "meta_propose_view"})
WRITE_METHODS = WRITE_METHODS | {m + "2" for m in WRITE_METHODS}  # protocol 2's names
#: a read-only method with no side effects, for probing class-read
PROBE_METHOD = "stat"
#: the caps a full pyzlog client needs on its pool
CLIENT_CAPS = "mon 'allow r' osd 'allow rwx pool={pool}'"


def _denied(call: object) -> bool:
    try:
        call()  # type: ignore[operator]
    except rados.PermissionDeniedError:
        return True
    except rados.Error as e:
        return abs(getattr(e, "errno", 0) or 0) in (errno.EPERM, errno.EACCES)
    return False


def missing_caps(ioctx: rados.Ioctx, oid: str, method: str) -> list[str]:
    """The osd caps (of r, class-read, w, class-write) the client lacks for
    `method` on `oid`, found by harmless probes of the same pool/namespace."""
    missing = []
    if _denied(lambda: ioctx.stat(oid)):
        missing.append("r")
    elif _denied(lambda: ioctx.execute(oid, "zlog", PROBE_METHOD, b"", 64)):
        missing.append("class-read")
    if method in WRITE_METHODS:
        probe = f"{oid}.zlog-caps-probe"  # never created: the remove only asks for 'w'
        if _denied(lambda: ioctx.remove_object(probe)):
            missing.append("w")
        elif not missing:
            missing.append("class-write")
    return missing or ["r", "w", "class-read", "class-write"]  # refused, yet each probe passed


def denial(cluster: rados.Rados, pool: str, namespace: str, oid: str, method: str, client: str,
           errno: int = errno.EPERM) -> PermissionDenied:
    """The PermissionDenied for an EPERM answer to zlog.`method` on `oid`,
    naming the caps the client lacks (probed through `cluster`)."""
    where = f"pool {pool!r}" + (f" namespace {namespace!r}" if namespace else "")
    try:
        ioctx = cluster.open_ioctx(pool)
        try:
            if namespace:
                ioctx.set_namespace(namespace)
            missing = missing_caps(ioctx, oid, method)
        finally:
            ioctx.close()
    except rados.Error:
        missing = ["r", "w", "class-read", "class-write"]
    need = "' and '".join(missing)
    return PermissionDenied(
        f"cephx refused {client} the class call zlog.{method} on {oid} in {where}: its osd caps lack "
        f"'{need}' there (a pyzlog client needs {CLIENT_CAPS.format(pool=pool)}), or the OSD "
        "refuses the class itself ('osd class load list' / 'osd class default list' without zlog); "
        "see docs/deploy.md", errno=errno)
