"""A runtime waiting past the log's tail (wait_applied) and the player's
shared hole clock, under a paused sequencer and a position stored past the
sequencer's counter (found by an adversarial review of both)."""
from __future__ import annotations

import errno
import threading
import time
from typing import Any

import pytest

import pyzlog
from pyzlog import Log, Timeout
from pyzlog.client import reader
from pyzlog.objects import Runtime, RuntimeClosed


def test_wait_applied_timeout_with_a_paused_sequencer(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore
    """wait_applied(p, timeout) past the tail must give up near `timeout`,
    also when the sequencer does not answer (paused)."""
    log = Log.create(rados_cluster, ceph.pool, log_name, width=3, sequencer=seqr.address)
    lg = Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
    rt = Runtime(lg, hole_wait=0.3)
    try:
        m = rt.map("m")
        m["a"] = 1
        tail = lg.tail()
        seqr.pause()
        t0 = time.monotonic()
        with pytest.raises(Timeout):
            rt.wait_applied(tail + 5, timeout=0.3)
        took = time.monotonic() - t0
        seqr.resume()
        assert took < 1.0, f"wait_applied(timeout=0.3) took {took:.2f}s"
    finally:
        seqr.resume()
        rt.close()
        lg.close()
        log.close()


def test_close_during_wait_applied_with_a_paused_sequencer(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore
    log = Log.create(rados_cluster, ceph.pool, log_name, width=3, sequencer=seqr.address)
    lg = Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
    rt = Runtime(lg, hole_wait=0.3)
    got: list[Any] = []
    try:
        m = rt.map("m")
        m["a"] = 1
        tail = lg.tail()
        seqr.pause()

        def waiter() -> None:
            t = time.monotonic()
            try:
                rt.wait_applied(tail + 5)
            except BaseException as e:  # noqa: BLE001
                got.append((e, time.monotonic()))

        th = threading.Thread(target=waiter)
        th.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        rt.close()
        th.join(30)
        seqr.resume()
        assert got and isinstance(got[0][0], RuntimeClosed)
        took = got[0][1] - t0
        assert took < 1.0, f"wait_applied noticed close() after {took:.2f}s"
    finally:
        seqr.resume()
        rt.close()
        lg.close()
        log.close()


def test_shared_clock_fills_a_fresh_position_below_a_future_fill(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore
    """A stored position above the sequencer's counter (Log.fill of a future
    position) is taken as "every position below was handed out, since now".
    The player keeps that in its shared clock: a position the sequencer hands
    out much later is filled as LOST at once, its writer given no hole_wait."""
    HW = 1.0
    log = Log.create(rados_cluster, ceph.pool, log_name, width=3, sequencer=seqr.address)
    raw = Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
    lg = Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
    rt = Runtime(lg, hole_wait=HW)
    waits: list[tuple[int, float]] = []
    try:
        m = rt.map("m")
        m["a"] = 1
        tail = raw.tail()
        raw.fill(tail + 50)  # a future position filled (a confused admin, or a tool writing ahead)
        p1 = raw.take_positions(1)  # handed out, never written
        rt.wait_applied(p1 + 1, timeout=30)  # plays p1 as a hole: asks highest (tail+50): kept
        assert [r.kind for r in raw.stream(p1, p1 + 1)] == [pyzlog.RecordKind.LOST]
        time.sleep(HW + 0.5)
        p2 = raw.take_positions(1)  # handed out now; its writer writes 0.3 s later
        assert p2 == p1 + 1
        t0 = time.monotonic()
        th = threading.Thread(target=lambda: rt.wait_applied(p2 + 1, timeout=30))
        th.start()
        time.sleep(0.3)
        try:
            raw.write(p2, b"late but within hole_wait")
            wrote = True
        except pyzlog.Filled:
            wrote = False
        th.join(30)
        took = time.monotonic() - t0
        assert wrote, f"position {p2} handed out {took:.2f}s ago was filled before hole_wait={HW}s"
    finally:
        rt.close()
        lg.close()
        raw.close()
        log.close()


def test_a_tail_poll_that_fails_with_a_bug_stops_the_runtime_for_every_waiter(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name, seqr, monkeypatch) -> None:
    """A waiter past the tail whose poll meets an error that is not the
    cluster's (a bug) gets RuntimeFailed, as a player's bug is told, and so
    does the next waiter: before, the poller thread died and later waits
    past the tail timed out (or, without a timeout, hung)."""
    from pyzlog.objects import RuntimeFailed

    log = Log.create(rados_cluster, ceph.pool, log_name, width=3, sequencer=seqr.address)
    lg = Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
    rt = Runtime(lg, hole_wait=0.3)
    try:
        rt.map("m")["a"] = 1
        tail = lg.tail()

        def broken_tail() -> int:
            raise OSError("a bug")

        monkeypatch.setattr(lg, "tail", broken_tail)
        with pytest.raises(RuntimeFailed, match="a bug"):
            rt.wait_applied(tail + 5, timeout=60)
        with pytest.raises(RuntimeFailed, match="a bug"):
            rt.wait_applied(tail + 6, timeout=60)
    finally:
        rt.close()
        lg.close()
        log.close()


@pytest.mark.parametrize("move", ["seal", "reconfigure"])
@pytest.mark.parametrize("streams", [False, True], ids=["scan", "streams"])
def test_a_stale_tail_from_a_sequencer_the_log_moved_past_burns_no_position(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name, seqr, streams, move) -> None:
    """The sequencer hands out p..p+4 (never written); the log then moves to
    a new epoch without it (slow tail finding, or a reconfiguration), so the
    next sequencer counts from p again. A runtime whose metadata is from
    before waits past the tail: the old sequencer still answers tail p+5 at
    its epoch. Nobody holds p..p+4 now, so none of them may be filled (a
    streams walk toward the wanted position took that tail on the
    sequencer's word; found by an adversarial review)."""
    log = Log.create(rados_cluster, ceph.pool, log_name, width=3, sequencer=seqr.address)
    lg = Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
    taker = Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
    mover = Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
    rt = Runtime(lg, hole_wait=0.3, streams=streams)
    try:
        rt.map("m")["a"] = 1
        rt.sync()
        p = taker.take_positions(5)  # handed out, their writers died
        if move == "reconfigure":
            mover.reconfigure(2)
            assert mover.state.meta.views[-1].start == p
        else:
            mover.seal_and_find_tail()
        assert lg.state.meta.epoch < mover.state.meta.epoch  # the runtime's handle is from before
        with pytest.raises(Timeout):
            rt.wait_applied(p + 8, timeout=1.8)  # several hole waits
        got = mover.read_positions(list(range(p, p + 8)))
        assert not [q for q, v in got.items() if v == -errno.ENOMSG], (p, got)
    finally:
        rt.close()
        for h in (lg, taker, mover, log):
            h.close()
