"""Fault 2: an OSD of three dies (kill -9) or hangs (SIGSTOP) under load.

A 3-OSD bluestore cluster of its own (pool size 3, min_size 2): writes go on
with two OSDs, and the killed OSD comes back with its data. Appenders use a
short op timeout, so some appends end unknown (a timeout) during the fault."""
from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import pytest

import pyzlog
from pyzlog import Log

from faultlib import Workload, final_scan, wait_until
from history import History
from seqr_proc import SeqrProcess

OP_TIMEOUT = 10


@pytest.fixture
def cluster(osd_cluster, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A client connection with a short op timeout and a sequencer, both on
    the 3-OSD cluster; every OSD running again afterwards."""
    r = pyzlog.connect(osd_cluster.conf, op_timeout=OP_TIMEOUT)
    seqr = SeqrProcess(osd_cluster.conf, log_path=tmp_path / "seqr.log").start()
    try:
        yield r, seqr
    finally:
        seqr.kill()
        osd_cluster.ensure_running()
        wait_until(lambda: osd_cluster.up_osds() == osd_cluster.osds, 90, "every OSD up")
        r.shutdown()


def _run(osd_cluster, r, seqr, fault) -> tuple[History, dict, str]:  # type: ignore[no-untyped-def]
    name = f"fault-{uuid.uuid4().hex[:12]}"
    Log.create(r, osd_cluster.pool, name, width=4).close()
    h = History()
    w = Workload(h, r, osd_cluster.pool, name, sequencer=seqr.address, appenders=3,
                 hole_wait=1.0, async_window=32).start()
    try:
        wait_until(lambda: w.counts()["acked"] >= 50, 60, "the first appends")
        fault()
        t_back = time.monotonic()
        wait_until(lambda: w.acked_since(t_back) >= 50, 90, "appends after the fault")
    finally:
        osd_cluster.ensure_running()
        w.stop()
    assert w.async_acked() > 50, "the async appender should have gone on through the fault"
    return h, final_scan(r, osd_cluster.pool, name), name


def test_osd_kill9_and_restart(osd_cluster, cluster, fault_report) -> None:  # type: ignore[no-untyped-def]
    r, seqr = cluster
    c = osd_cluster.cluster
    victim = 1

    def fault() -> None:
        c.stop_osd(victim, signal.SIGKILL)
        # the mon marks it down after the heartbeat grace (8 s); PGs go on with 2 of 3
        wait_until(lambda: osd_cluster.up_osds() == 2, 45, f"osd.{victim} marked down")
        time.sleep(4)  # appends go on with 2 of 3 copies
        c.start_osd(victim)
        wait_until(lambda: osd_cluster.up_osds() == 3, 60, f"osd.{victim} up again")

    h, final, _ = _run(osd_cluster, r, seqr, fault)
    rep = fault_report("OSD kill -9 + restart (1 of 3)", h, final)
    assert f"osd.{victim}" in c.daemons()
    assert rep.ok, rep.summary()


def test_osd_sigstop_sigcont(osd_cluster, cluster, fault_report) -> None:  # type: ignore[no-untyped-def]
    r, seqr = cluster
    c = osd_cluster.cluster
    victim = 2

    def fault() -> None:
        c.stop_osd(victim, signal.SIGSTOP)
        try:
            time.sleep(4)  # below the heartbeat grace: ops to it just stall
        finally:
            c.stop_osd(victim, signal.SIGCONT)

    h, final, _ = _run(osd_cluster, r, seqr, fault)
    rep = fault_report("OSD SIGSTOP 4 s + SIGCONT (1 of 3)", h, final)
    assert rep.ok, rep.summary()
