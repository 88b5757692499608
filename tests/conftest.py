"""Test harness: one real Ceph dev cluster for the whole session.

The cluster comes from vstart/ (memstore OSDs, cephx on, cls_zlog loaded) in a
temporary directory and is stopped at the end, by the pids it started. Set
ZLOG_TEST_CONF to run against a cluster you already have instead.
"""
from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from seqr_proc import seqr  # noqa: F401 - the fixture, for every test file
from vstartmod import ROOT, vstart


def pytest_configure(config: pytest.Config) -> None:
    # The checkout's pyzlog/ finds its compiled parts in the copy ./dev setup
    # installed (pyzlog/__init__.py); without that copy nothing here can run.
    try:
        import pyzlog._appender, pyzlog._dataplane, pyzlog._seqr, pyzlog.objects._replay  # noqa: F401
    except ImportError as e:
        raise pytest.UsageError(f"pyzlog's compiled parts are missing ({e}): run ./dev setup "
                                "and the tests with .venv/bin/python -m pytest") from e


@dataclass(frozen=True)
class ClusterInfo:
    conf: str
    pool: str
    dir: Path | None


@pytest.fixture(scope="session")
def ceph(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterInfo]:
    conf = os.environ.get("ZLOG_TEST_CONF")
    if conf:
        yield ClusterInfo(conf, os.environ.get("ZLOG_TEST_POOL", "zlog"), None)
        return
    d = tmp_path_factory.mktemp("cluster")
    c = vstart.Cluster(d)
    try:
        st = c.start(osds=1, owner_pid=os.getpid())  # stopped even if this run is killed
        yield ClusterInfo(st["conf"], st["pool"], d)
    finally:
        c.stop()


@pytest.fixture(scope="session")
def rados_cluster(ceph: ClusterInfo):  # type: ignore[no-untyped-def]
    import pyzlog

    r = pyzlog.connect(ceph.conf)
    yield r
    r.shutdown()


@pytest.fixture(params=[(1, 1), (2, 1), (2, 3)], ids=["protocol1", "protocol2", "data-format"])
def data_io(rados_cluster, ceph: ClusterInfo, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """Raw cls_zlog calls on the log pool (no Log on top), in each protocol the
    class serves (1: round 2's clients, 2: versioned) and each object format
    (omap, and data, which only protocol 2 has)."""
    from clsobj import Raw
    from pyzlog.core.native import Connection

    conn = Connection.of(rados_cluster)
    protocol, fmt = request.param
    return Raw(conn, conn.pool(ceph.pool), protocol, fmt)


@pytest.fixture
def oid() -> str:
    """A fresh object name per test."""
    return f"t.{uuid.uuid4().hex}"


@pytest.fixture
def log_name() -> str:
    return f"log-{uuid.uuid4().hex[:12]}"


class OsdPause:
    """Calling it SIGSTOPs the session cluster's OSDs; resume() (or the end
    of the test) lets them go on."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.stopped: list[int] = []

    def __call__(self) -> None:
        for pid in self.pids:
            self.stopped.append(pid)
            vstart.pause(pid)  # returns once none of its threads can answer

    def resume(self) -> None:
        while self.stopped:
            os.kill(self.stopped.pop(), signal.SIGCONT)


@pytest.fixture
def paused_osd(ceph: ClusterInfo) -> Iterator[OsdPause]:
    """An OsdPause for the session cluster's OSDs; resumed afterwards."""
    if ceph.dir is None:
        pytest.skip("needs the test's own cluster (ZLOG_TEST_CONF is set)")
    pids = [pid for name, pid in vstart.Cluster(ceph.dir).daemons().items() if name.startswith("osd.")]
    assert pids
    pause = OsdPause(pids)
    try:
        yield pause
    finally:
        pause.resume()
