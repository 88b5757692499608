"""vstart: start (twice), status, bluestore durability across kill -9, stop; memstore's usage count."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import pyzlog
from pyzlog import Log

from vstartmod import ROOT, vstart


def test_bluestore_cluster_lifecycle(tmp_path: Path) -> None:
    d = tmp_path / "bs"
    c = vstart.Cluster(d)
    try:
        st = c.start(osds=1, bluestore=True, owner_pid=os.getpid())  # its own waits end a hang
        daemons = c.daemons()
        assert set(daemons) == {"mon.a", "mgr.x", "osd.0"}, daemons  # a mgr, so ceph df and quotas work
        # starting again is a no-op on a running cluster
        assert c.start(osds=1, bluestore=True) == st and c.daemons() == daemons

        cluster = pyzlog.connect(st["conf"])
        log = Log.create(cluster, st["pool"], "durable", width=2)
        for p in range(20):
            log.write(p, b"kept-%d" % p)
        cluster.shutdown()

        # kill -9 the OSD: file-backed bluestore keeps what was acknowledged
        c.stop_osd(0, signal.SIGKILL)
        assert "osd.0" not in c.daemons()
        c.start_osd(0)
        c.wait_ready(st["pool"])
        cluster = pyzlog.connect(st["conf"])
        log = Log.open(cluster, st["pool"], "durable")
        assert [log.read(p) for p in range(20)] == [b"kept-%d" % p for p in range(20)]
        cluster.shutdown()

        # the CLI reports status, and stop ends exactly these daemons
        out = subprocess.run([sys.executable, str(ROOT / "vstart" / "vstart.py"), "--dir", str(d), "status"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and "osd.0" in out.stdout
        pids = list(c.daemons().values())
        assert sorted(c.stop()) == ["mgr.x", "mon.a", "osd.0"]
        assert not [pid for pid in pids if vstart._pid_alive(pid)]  # zombies awaiting init count as gone
        out = subprocess.run([sys.executable, str(ROOT / "vstart" / "vstart.py"), "--dir", str(d), "status"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 3
    finally:
        c.stop()


def test_cluster_stops_when_its_owner_is_killed(tmp_path: Path) -> None:
    """A test run killed by a timeout must not leave its cluster running."""
    d = tmp_path / "owned"
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    c = vstart.Cluster(d)
    try:
        c.start(osds=1, owner_pid=owner.pid)
        pids = list(c.daemons().values())
        assert len(pids) == 3  # mon, mgr, osd
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 60
        while any(vstart._pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(vstart._pid_alive(p) for p in pids)
    finally:
        owner.kill()
        c.stop()


def test_missing_class_library_is_a_clear_error(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "vstart" / "vstart.py"), "--dir", str(tmp_path / "x"),
                          "start", "--cls-lib", str(tmp_path / "nope.so")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "object class library not found" in out.stderr
    assert "Traceback" not in out.stderr


def _osd_available(conf: str) -> int:
    """The OSD's free bytes as it last reported them (memstore: device bytes
    minus its used-bytes count)."""
    out = subprocess.run(["ceph", "-c", conf, "pg", "dump", "osds", "-f", "json"], capture_output=True,
                         text=True, timeout=30, check=True)
    statfs = json.loads(out.stdout)["osd_stats"][0]["statfs"]
    if statfs["available"] > statfs["total"]:  # the count wrapped below zero: the OSD is full, writes wait
        pytest.fail(f"the OSD counts {statfs['total'] - statfs['available']} bytes used: below zero")
    return int(statfs["available"])


def _settled_available(conf: str, want: int | None = None, within: float = 60.0) -> int:
    """The OSD's free bytes once its reports agree three times in a row, 1 s
    apart (a report follows a change within seconds), or as soon as they equal `want`."""
    deadline = time.monotonic() + within
    seen: list[int] = []
    while True:
        seen.append(_osd_available(conf))
        if seen[-1] == want or (len(seen) >= 3 and len(set(seen[-3:])) == 1) or time.monotonic() > deadline:
            return seen[-1]
        time.sleep(1.0)


def _all_answered(count: int, submit: Callable[[int, Callable[..., None]], None], depth: int = 64,
                  allowed: tuple[int, ...] = ()) -> None:
    """submit(i, oncomplete) for i in range(count), `depth` in flight; each
    must succeed (or fail with an `allowed` code), and an answer must come
    within 60 s (a full OSD holds writes back for good: a failure here, not a hang)."""
    window = threading.Semaphore(depth)
    failed: list[int] = []

    def done(completion) -> None:  # type: ignore[no-untyped-def]
        if completion.get_return_value() < 0 and completion.get_return_value() not in allowed:
            failed.append(completion.get_return_value())
        window.release()

    for i in [*range(count), *[None] * depth]:  # then take back every slot: all answered
        if not window.acquire(timeout=60):
            pytest.fail("the OSD stopped answering writes (full?)")
        if i is not None:
            submit(i, done)
    assert not failed, failed


def test_a_removed_workload_gives_the_osd_its_bytes_back_exactly(ceph, rados_cluster) -> None:  # type: ignore[no-untyped-def]
    """Writes spread over placement groups, all removed again: the OSD's free
    bytes are where they started. With two op shards, Ceph 16.2's MemStore
    lost updates of its used-bytes count (vstart.MEMSTORE_OP_SHARDS), about
    one per 5,000 such writes, until the count fell below zero."""
    io = rados_cluster.open_ioctx(ceph.pool)
    io.set_namespace(f"t.{uuid.uuid4().hex}")
    oids = [f"spread.{i}" for i in range(32)]  # 16 PGs: every PG takes some
    piece = b"x" * 4096  # a lost update loses a whole piece: seen in the bytes count
    before = _settled_available(ceph.conf)
    try:
        _all_answered(50_000, lambda i, done: io.aio_append(oids[i % len(oids)], piece, oncomplete=done))
        assert _settled_available(ceph.conf) < before  # the writes are counted at all
    finally:
        _all_answered(len(oids), lambda i, done: io.aio_remove(oids[i], oncomplete=done), allowed=(-errno.ENOENT,))
        io.close()
    after = _settled_available(ceph.conf, want=before)
    assert after == before, f"{before - after} bytes still counted as used after every object was removed"
