"""Cluster connections of Spark tasks: opened on the executor, never pickled.

A Python worker process is reused across tasks, so it keeps one connected
rados handle per (conf, keyring, client) and opens a Log per task on it.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..core.cluster import connect
from ..core.errors import LogNotFound, PoolNotFound
from ..client.log import Log
from .options import ZlogOptions

_LOCK = threading.Lock()
_CLUSTERS: dict[tuple[str, str | None, str], Any] = {}


def cluster_for(opts: ZlogOptions) -> Any:
    key = (opts.conf, opts.keyring, opts.client)
    with _LOCK:
        cluster = _CLUSTERS.get(key)
        if cluster is None:
            cluster = _CLUSTERS[key] = connect(opts.conf, keyring=opts.keyring, client=opts.client)
        return cluster


def open_log(opts: ZlogOptions, create: bool = False) -> Log:
    """Log.open with errors that name the option at fault."""
    cluster = cluster_for(opts)
    try:
        return Log.open(cluster, opts.pool, opts.log, sequencer=opts.sequencer)
    except LogNotFound:
        if create:
            from ..core.errors import LogExists
            try:
                return Log.create(cluster, opts.pool, opts.log, width=opts.width, sequencer=opts.sequencer)
            except LogExists:
                return Log.open(cluster, opts.pool, opts.log, sequencer=opts.sequencer)
        raise ValueError(f"zlog option log: no log named {opts.log!r} in pool {opts.pool!r}") from None
    except PoolNotFound:
        raise ValueError(f"zlog option pool: pool {opts.pool!r} does not exist") from None


@contextmanager
def opened_log(opts: ZlogOptions, create: bool = False) -> Iterator[Log]:
    log = open_log(opts, create)
    try:
        yield log
    finally:
        log.close()
