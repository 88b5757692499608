"""vstart: start (twice), status, bluestore durability across kill -9, stop."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


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
