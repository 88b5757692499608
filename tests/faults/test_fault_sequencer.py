"""Fault 1: the sequencer is killed with SIGKILL again and again under load."""
from __future__ import annotations

import signal
import time

from pyzlog import Log

from faultlib import Workload, final_scan, wait_until
from history import History

KILLS = 4


def test_sequencer_kill9_repeatedly(rados_cluster, ceph, log_name, seqr, fault_report) -> None:  # type: ignore[no-untyped-def]
    """3 appenders (each its own Log and sequencer connection), one async
    appender (32 in flight) and a reader following the log while zlog-seqr
    is killed -9 and restarted 4 times."""
    Log.create(rados_cluster, ceph.pool, log_name, width=4).close()
    h = History()
    w = Workload(h, rados_cluster, ceph.pool, log_name, sequencer=seqr.address, appenders=3,
                 hole_wait=1.0, async_window=32).start()
    try:
        wait_until(lambda: w.counts()["acked"] >= 50, 60, "the first appends")
        for _ in range(KILLS):
            time.sleep(2.0)
            seqr.kill(signal.SIGKILL)
            time.sleep(0.5)  # appends go on by slow tail finding meanwhile
            seqr.start()
        t_last = time.monotonic()
        wait_until(lambda: w.acked_since(t_last) >= 50, 60, "appends after the last restart")
    finally:
        w.stop()
    final = final_scan(rados_cluster, ceph.pool, log_name)
    rep = fault_report("sequencer kill -9 x4", h, final, kills=KILLS)
    epoch = Log.open(rados_cluster, ceph.pool, log_name).epoch
    assert epoch >= 1 + KILLS, f"every restart should recover with a new epoch (epoch {epoch})"
    assert rep.acknowledged > 200
    assert w.async_acked() > 100
    assert rep.ok, rep.summary()
