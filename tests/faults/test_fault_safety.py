"""Issue 16's data anomalies as fault rows, each under a running workload and
checked by the history checker (tests/test_safety.py has the focused
reproductions), and one randomized nemesis round."""
from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path

from pyzlog import Log, RecordKind

from faultlib import Workload, final_scan, wait_until
from history import FILL, OK, TRIM, History, payload
from nemesis import run_once


def _trim(h: History, lg: Log, q: int) -> None:
    op = h.invoke(TRIM, "trimmer", position=q, upto=True)
    lg.trim_to(q)
    h.complete(op, OK)


def test_trims_at_and_above_the_tail_with_appends_in_flight(rados_cluster, ceph, log_name, seqr,
                                                           fault_report) -> None:  # type: ignore[no-untyped-def]
    """trim_to(tail - 1) and trim_to(tail + 50) while sync and async appends
    run, each followed by a reconfiguration: no trimmed position takes data."""
    admin = Log.create(rados_cluster, ceph.pool, log_name, width=3, sequencer=seqr.address)
    h = History()
    w = Workload(h, rados_cluster, ceph.pool, log_name, sequencer=seqr.address, appenders=2,
                 hole_wait=1.0, async_window=32).start()
    try:
        for k in range(3):
            wait_until(lambda: w.counts()["acked"] >= 100 * (k + 1), 60, "appends")
            _trim(h, admin, admin.tail() - 1)
            admin.reconfigure(width=2 + k % 2)
            _trim(h, admin, admin.tail() + 50)
            admin.reconfigure(width=3)
        t = time.monotonic()
        wait_until(lambda: w.acked_since(t) >= 50, 60, "appends after the trims")
    finally:
        w.stop()
    rep = fault_report("trim at/above the tail, appends in flight, reconfigure", h,
                       final_scan(rados_cluster, ceph.pool, log_name))
    assert rep.ok, rep.summary()


def test_a_stale_view_history_beside_a_new_epoch(rados_cluster, ceph, log_name, fault_report) -> None:  # type: ignore[no-untyped-def]
    """A Log holding a new epoch with an old view history (what a slower
    refresh stored before refresh became monotonic) appends while a reader
    follows: every acknowledged entry is where readers look."""
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    h = History()
    w = Workload(h, rados_cluster, ceph.pool, log_name, appenders=1, hole_wait=1.0).start()
    try:
        for k in range(5):
            wait_until(lambda: w.counts()["acked"] >= 20 * (k + 1), 60, "appends")
            Log.open(rados_cluster, ceph.pool, log_name).reconfigure(width=2 + k % 2)
            new = lg.state.meta_store.get()
            lg.state._meta = dataclasses.replace(new, views=new.views[:1])  # the stale history
            for i in range(5):
                data = payload("stale", k * 5 + i)
                op = h.invoke("append", "stale", data=data)
                h.complete(op, OK, position=lg.append(data))
    finally:
        w.stop()
    rep = fault_report("a stale view history beside a new epoch", h,
                       final_scan(rados_cluster, ceph.pool, log_name))
    assert rep.acknowledged > 100 and rep.ok, rep.summary()


def test_reader_fills_race_client_fills(rados_cluster, ceph, log_name, fault_report) -> None:  # type: ignore[no-untyped-def]
    """Holes that readers fill as lost while a client fills the same positions
    as junk: every reader reports one kind per position."""
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    h = History()
    lg.write(60, payload("w", 0))
    h.append_ok("w", payload("w", 0), 60)
    readers = [Log.open(rados_cluster, ceph.pool, log_name) for _ in range(3)]
    for i, r in enumerate(readers):
        h.begin_stream(f"r{i}", 0)
    filler = Log.open(rados_cluster, ceph.pool, log_name)
    streams = [r.stream(0, hole_wait=0.2 + 0.05 * i) for i, r in enumerate(readers)]
    for pos in range(61):
        if pos % 2 == 0 and pos < 60:
            op = h.invoke(FILL, "client", position=pos)
            try:
                filler.fill(pos)
            except Exception as e:  # noqa: BLE001 - a reader filled it first: recorded as failed
                h.complete(op, "fail", error=e)
            else:
                h.complete(op, OK)
        for i, s in enumerate(streams):
            rec = next(s)
            h.stream_record(f"r{i}", f"r{i}", rec)
    final = final_scan(rados_cluster, ceph.pool, log_name)
    kinds = {p: {o.seen for o in h.ops if o.kind == "stream_read" and o.position == p} for p in range(60)}
    assert all(len(k) == 1 for k in kinds.values()), {p: k for p, k in kinds.items() if len(k) > 1}
    assert final[60].kind == RecordKind.DATA
    rep = fault_report("reader fills race client fills", h, final)
    assert rep.ok, rep.summary()


def test_randomized_nemesis_round(ceph, seqr, fault_report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """One 20 s round of tests/faults/nemesis.py (the 5 x 60 s runs write results/nemesis.json)."""
    out = run_once(ceph.conf, ceph.pool, [seqr], 20.0, seed=int(time.time()) % 1000, workdir=tmp_path,
                   checker=lambda h, final: fault_report("randomized nemesis, 20 s", h, final))
    seqr.kill(signal.SIGCONT)
    print(out["summary"])
    assert out["acknowledged"] > 200
    assert out["ok"], out["summary"]
