"""Faults of clients: one dies between taking a position and writing it
(fault 3); one keeps writing with the epoch it had before a sequencer restart
or a reconfiguration (fault 4)."""
from __future__ import annotations

import errno
import json
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

from pyzlog import Log, RecordKind

from pyzlog.core import wire

from clsobj import log_obj
from faultlib import Workload, append_recorded, final_scan, hold_position, wait_until
from history import APPEND, FAIL, OK, STREAM_READ, UNKNOWN, History, payload


def test_client_killed_holding_a_position(rados_cluster, ceph, log_name, seqr, fault_report,  # type: ignore[no-untyped-def]
                                          tmp_path: Path) -> None:
    """A child process takes a position (take_positions(1)) and is killed -9
    before writing it; the others go on, the reader fills the hole (LOST)."""
    Log.create(rados_cluster, ceph.pool, log_name, width=3).close()
    h = History()
    w = Workload(h, rados_cluster, ceph.pool, log_name, sequencer=seqr.address, appenders=2,
                 hole_wait=1.0).start()
    held_file = tmp_path / "held.json"
    child = mp.get_context("spawn").Process(
        target=hold_position, args=(ceph.conf, ceph.pool, log_name, seqr.address, str(held_file)),
        daemon=True)
    try:
        wait_until(lambda: w.counts()["acked"] >= 30, 60, "the first appends")
        child.start()
        # the child's append: it would have written this, and was killed first
        op = h.invoke(APPEND, "doomed", data=payload("doomed", 0))
        wait_until(lambda: held_file.exists() and held_file.read_text().strip() != "", 90,
                   "the child to take a position")
        held = json.loads(held_file.read_text())["position"]
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join(15)
        h.complete(op, UNKNOWN, error="killed -9 between take_positions and write")
        assert child.exitcode == -signal.SIGKILL
        t_kill = time.monotonic()
        wait_until(lambda: w.acked_since(t_kill) >= 30, 60, "appends after the kill")
    finally:
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
            child.join(15)
        w.stop()
    final = final_scan(rados_cluster, ceph.pool, log_name)
    rep = fault_report("client kill -9 holding a position", h, final, held_position=held)
    seen = [o.seen for o in h.ops if o.kind == STREAM_READ and o.position == held]
    assert seen == ["lost"], f"the reader should have filled {held} as LOST, saw {seen}"
    # a hole a reader filled stays a gap: LOST (fill records its reason) or FILLED
    assert final[held].kind in (RecordKind.LOST, RecordKind.FILLED), final[held]
    assert max(final) > held, "the log did not move on past the hole"
    assert rep.ok, rep.summary()


def _stale_writes(h: History, stale: Log, epoch: int, positions: range, writer: str) -> list[int]:
    """Write straight to the objects a stale client addresses, with its old
    epoch, bypassing Log's refresh-and-retry. Returns each return code."""
    rets = []
    for k, pos in enumerate(positions):
        data = payload(writer, k)
        op = h.invoke(APPEND, writer, data=data)
        ret = log_obj(stale, stale.oid_of(pos)).write(epoch, pos, data)
        if ret == 0:
            h.complete(op, OK, position=pos)  # the checker then sees what happened to it
        else:
            h.complete(op, FAIL, error=f"{errno.errorcode.get(-ret, ret)} at {pos}")
        rets.append(ret)
    return rets


def test_stale_epoch_client_is_refused(rados_cluster, ceph, log_name, seqr, fault_report) -> None:  # type: ignore[no-untyped-def]
    """A client keeps its old epoch across a sequencer restart and then a
    reconfiguration; its writes to positions in the new range are refused
    with -ESTALE and nothing of them is stored."""
    h = History()
    log = Log.create(rados_cluster, ceph.pool, log_name, width=3, sequencer=seqr.address)
    seq = iter(range(10**6))
    for _ in range(30):
        assert append_recorded(h, log, "w0", next(seq)) is not None
    stale_a = Log.open(rados_cluster, ceph.pool, log_name)
    epoch_a = stale_a.epoch

    # (a) the sequencer restarts: its recovery seals the objects at a new epoch
    seqr.kill(signal.SIGKILL)
    seqr.start()
    # appends go on by slow tail finding until the client tries the sequencer
    # again (within a second); the new sequencer's recovery takes a new epoch
    deadline = time.monotonic() + 60
    while log.refresh().epoch <= epoch_a:
        assert time.monotonic() < deadline, "the restarted sequencer never recovered the log"
        assert append_recorded(h, log, "w0", next(seq)) is not None
        time.sleep(0.05)
    tail = log.tail()
    rets_a = _stale_writes(h, stale_a, epoch_a, range(tail, tail + 24), "stale-a")

    # (b) another client reconfigures to width 5: a new view from a new start
    stale_b = Log.open(rados_cluster, ceph.pool, log_name)
    epoch_b = stale_b.epoch
    other = Log.open(rados_cluster, ceph.pool, log_name)
    view = other.reconfigure(5)
    assert view.epoch > epoch_b and view.width == 5
    rets_b = _stale_writes(h, stale_b, epoch_b, range(view.start, view.start + 24), "stale-b")
    rets_a2 = _stale_writes(h, stale_a, epoch_a, range(view.start + 24, view.start + 48), "stale-a2")

    # the up-to-date clients go on over the new range
    for _ in range(60):
        assert append_recorded(h, log, "w0", next(seq)) is not None
    # and the stale client itself, through Log, refreshes and succeeds
    for k in range(5):
        assert append_recorded(h, stale_a, "stale-log", k) is not None

    final = final_scan(rados_cluster, ceph.pool, log_name)
    rep = fault_report("stale-epoch client after seqr restart + reconfigure", h, final,
                       stale_writes=len(rets_a) + len(rets_b) + len(rets_a2))
    for name, rets in (("after the sequencer restart", rets_a), ("after the reconfiguration", rets_b),
                       ("two epochs behind", rets_a2)):
        assert rets and all(r == -errno.ESTALE for r in rets), f"{name}: {rets}"
    stale_values = {o.data for o in h.ops if o.kind == APPEND and o.process.startswith("stale-") and
                    o.process != "stale-log"}
    assert not [r.position for r in final.values() if r.data in stale_values], "a stale write was stored"
    assert rep.ok, rep.summary()
