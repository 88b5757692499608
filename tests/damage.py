"""Damage at rest, done from outside the client (python-rados and the `rados`
tool, as an operator's mistake, a bug or a failing disk would), and a
snapshot of an object's every byte to show that a refused call changed
nothing."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass

import rados

#: the data format's header bytes (cls_zlog/store.h DataStore::kHeaderBytes) and slot size
DATA_HEADER = 128
SLOT = 16


def ioctx(cluster: rados.Rados, pool: str, namespace: str = "") -> rados.Ioctx:
    io = cluster.open_ioctx(pool)
    io.set_namespace(namespace)
    return io


def rados_tool(conf: str, pool: str, *args: str, namespace: str = "") -> None:
    cmd = ["rados", "-c", conf, "-p", pool] + (["-N", namespace] if namespace else []) + list(args)
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)


def set_omap_header(conf: str, pool: str, oid: str, value: str, namespace: str = "") -> None:
    """`rados setomapheader` (an empty value loses the header, issue 28's reproduction)."""
    rados_tool(conf, pool, "setomapheader", oid, value, namespace=namespace)


def lose_header(conf: str, io: rados.Ioctx, oid: str, data_format: bool, garble: bool = False) -> None:
    """Lose (or, with `garble`, overwrite with bytes that do not parse) the
    object's header, keeping its entries."""
    if data_format:
        io.write(oid, (b"\xa5" if garble else b"\0") * DATA_HEADER, 0)
    else:
        set_omap_header(conf, io.get_pool_name(), oid, "not a header" if garble else "", io.get_namespace())


@dataclass(frozen=True)
class Snapshot:
    size: int
    mtime: object
    data: bytes
    omap: dict[str, bytes]


def snapshot(io: rados.Ioctx, oid: str) -> Snapshot:
    size, mtime = io.stat(oid)
    data = io.read(oid, size) if size else b""
    with rados.ReadOpCtx() as op:
        it, _ = io.get_omap_vals(op, "", "", 1 << 20)
        io.operate_read_op(op, oid)
        omap = dict(it)
    return Snapshot(size, mtime, data, omap)
