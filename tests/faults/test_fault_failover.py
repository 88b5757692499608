"""Issue 15's faults as rows: protocol steps cut in half and sequencer
failover, each under sync and async appenders and a following reader,
checked by the history checker. No operator acts in any of them."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from seqr_proc import Fleet, SeqrProcess

from pyzlog import Log

from faultlib import Workload, final_scan, wait_until
from history import History

LEASE = 1.0


@pytest.fixture
def standbys(ceph, tmp_path: Path) -> Iterator[Callable[[], SeqrProcess]]:  # type: ignore[no-untyped-def]
    """zlog-seqr daemons standing by for each other (a group of their own)."""
    fleet = Fleet(ceph.conf, ceph.pool, tmp_path, LEASE, group=f"fault-{uuid.uuid4().hex[:8]}")
    yield fleet.start
    fleet.close()


def owner(cluster, pool: str, name: str) -> str:  # type: ignore[no-untyped-def]
    return Log.open(cluster, pool, name).refresh().sequencer


def run_child(conf: str, pool: str, name: str, patch: str, action: str) -> int:
    """A client process that applies `patch` (code that makes it die at a
    protocol step) and then runs `action` on the log; its exit status."""
    code = f"""
import os, pyzlog, pyzlog.core.tailfind as tf, pyzlog.core.metadata as md
from pyzlog import Log
lg = Log.open(pyzlog.connect({conf!r}), {pool!r}, {name!r})
{patch}
{action}
os._exit(0)
"""
    return subprocess.run([sys.executable, "-P", "-c", code], timeout=120).returncode


#: where a reconfiguration dies: patches for run_child
CUT_POINTS = {
    "after some seals": "real = tf.seal_places\n"
                        "tf.seal_places = lambda log, places, epoch: (real(log, places[:1], epoch), os._exit(9))",
    "after all seals": "real = tf.seal_places\n"
                       "tf.seal_places = lambda *a: (real(*a), os._exit(9))",
    "after closing, before installing": "md.MetaStore.propose_view = lambda *a, **k: os._exit(9)",
    "after installing": "real = md.MetaStore.propose_view\n"
                        "md.MetaStore.propose_view = lambda *a, **k: (real(*a, **k), os._exit(9))",
}


def test_reconfigure_killed_at_each_cut_point(rados_cluster, ceph, log_name, standbys, fault_report) -> None:  # type: ignore[no-untyped-def]
    """A process reconfiguring the log dies after some seals, after all
    seals, after closing the view, and after installing it (before the
    sequencer learned of it), one after another under load."""
    a = standbys()
    Log.create(rados_cluster, ceph.pool, log_name, width=3, sequencer=a.address).close()
    h = History()
    w = Workload(h, rados_cluster, ceph.pool, log_name, sequencer=a.address, appenders=2,
                 hole_wait=1.0, async_window=32).start()
    try:
        wait_until(lambda: w.counts()["acked"] >= 100, 60, "the first appends")
        for k, (cut, patch) in enumerate(CUT_POINTS.items()):
            rc = run_child(ceph.conf, ceph.pool, log_name, patch, f"lg.reconfigure(width={2 + k % 2})")
            assert rc == 9, f"the reconfiguration did not die {cut} (exit {rc})"
            t = time.monotonic()
            wait_until(lambda: w.acked_since(t) >= 50, 30, f"appends after a reconfiguration died {cut}")
    finally:
        w.stop()
    rep = fault_report("reconfigure killed at each cut point (some seals, all seals, closed, installed)",
                       h, final_scan(rados_cluster, ceph.pool, log_name), cuts=len(CUT_POINTS))
    assert rep.ok, rep.summary()


def test_sequencer_killed_mid_recovery(rados_cluster, ceph, log_name, standbys, fault_report, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The sequencer serving the log dies while recovering it (after sealing,
    before installing); a standby takes the log over."""
    victim = tmp_path / "victim.py"
    victim.write_text(f"""
import os, signal, threading, pyzlog, pyzlog.core.metadata as md
from pyzlog.daemon.service import SequencerDaemon
real = md.MetaStore.new_epoch
calls = []
def dies_on_the_second(self, *a, **k):
    calls.append(1)
    if len(calls) >= 2:
        os._exit(9)  # the second recovery: sealed, not installed
    return real(self, *a, **k)
md.MetaStore.new_epoch = dies_on_the_second
d = SequencerDaemon(pyzlog.connect({ceph.conf!r}), port=0, pools=({ceph.pool!r},), lease={LEASE},
                    group="mid-{log_name}")
d.start()
print(d.address, flush=True)
threading.Event().wait()
""")
    proc = subprocess.Popen([sys.executable, "-P", str(victim)], stdout=subprocess.PIPE, text=True)
    try:
        address = proc.stdout.readline().strip()  # type: ignore[union-attr]
        b = SeqrProcess(ceph.conf, log_path=tmp_path / "standby.log",
                        args=("--pool", ceph.pool, "--lease", str(LEASE), "--group", f"mid-{log_name}")).start()
        Log.create(rados_cluster, ceph.pool, log_name, width=3, sequencer=address).close()
        h = History()
        w = Workload(h, rados_cluster, ceph.pool, log_name, sequencer=address, appenders=2,
                     hole_wait=1.0, async_window=32).start()
        try:
            wait_until(lambda: w.counts()["acked"] >= 100, 60, "appends through the first recovery")
            Log.open(rados_cluster, ceph.pool, log_name).seal_and_find_tail()  # a newer epoch: recover again
            proc.wait(30)
            assert proc.returncode == 9
            wait_until(lambda: owner(rados_cluster, ceph.pool, log_name) == b.address, 30,
                       "the standby to take the log over")
            t = time.monotonic()
            wait_until(lambda: w.acked_since(t) >= 100, 30, "appends through the standby")
        finally:
            w.stop()
            b.kill()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    rep = fault_report("sequencer killed mid-recovery (sealed, not installed), standby takes over",
                       h, final_scan(rados_cluster, ceph.pool, log_name))
    assert rep.ok, rep.summary()


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_active_sequencer_fails_with_a_standby(rados_cluster, ceph, log_name, standbys, fault_report,  # type: ignore[no-untyped-def]
                                               fault, tmp_path) -> None:
    """kill -9 of the active sequencer (twice, each time started again as a
    standby), or SIGSTOP past its lease and SIGCONT while clients of both
    exist: it steps down, and nothing it hands out afterwards is acknowledged."""
    a, b = standbys(), standbys()
    Log.create(rados_cluster, ceph.pool, log_name, width=3, sequencer=a.address).close()
    h = History()
    w = Workload(h, rados_cluster, ceph.pool, log_name, sequencer=a.address, appenders=2,
                 hole_wait=1.0, async_window=32).start()
    daemons = {a.address: a, b.address: b}
    try:
        wait_until(lambda: w.counts()["acked"] >= 100, 60, "the first appends")
        for _ in range(2 if fault == "kill" else 1):
            active = daemons[owner(rados_cluster, ceph.pool, log_name)]
            if fault == "kill":
                active.kill()
            else:
                active.pause()
            wait_until(lambda: owner(rados_cluster, ceph.pool, log_name) != active.address, 15,
                       "a standby to take the log over")
            t = time.monotonic()
            wait_until(lambda: w.acked_since(t) >= 100, 30, "appends through the standby")
            if fault == "kill":
                del daemons[active.address]
                new = standbys()
                daemons[new.address] = new
            else:
                active.resume()
                wait_until(lambda: "stepped down" in (tmp_path / "seqr0.log").read_text(), 15,
                           "the paused sequencer to step down")
                t = time.monotonic()
                wait_until(lambda: w.acked_since(t) >= 100, 30, "appends after it came back")
            time.sleep(LEASE)
    finally:
        w.stop()
    what = ("active sequencer kill -9 x2 with a standby" if fault == "kill" else
            f"active sequencer SIGSTOP past its lease ({LEASE:g} s), taken over, SIGCONT: steps down")
    rep = fault_report(what, h, final_scan(rados_cluster, ceph.pool, log_name))
    assert rep.ok, rep.summary()


def test_contested_ownership(rados_cluster, ceph, log_name, standbys, fault_report) -> None:  # type: ignore[no-untyped-def]
    """Clients told two different sequencers append at once: the log settles
    on one owner (no epoch change for seconds), every client follows it."""
    a, b = standbys(), standbys()
    Log.create(rados_cluster, ceph.pool, log_name, width=3).close()
    h = History()
    wa = Workload(h, rados_cluster, ceph.pool, log_name, sequencer=a.address, appenders=2,
                  hole_wait=1.0, async_window=32, prefix="a").start()
    wb = Workload(h, rados_cluster, ceph.pool, log_name, sequencer=b.address, appenders=2,
                  hole_wait=1.0, reader=False, prefix="b").start()
    lg = Log.open(rados_cluster, ceph.pool, log_name)
    try:
        wait_until(lambda: wa.counts()["acked"] + wb.counts()["acked"] >= 300, 60, "appends")
        settled = lg.refresh()
        t = time.monotonic()
        wait_until(lambda: wa.acked_since(t) + wb.acked_since(t) >= 300, 60, "appends while settled")
        time.sleep(2)
        later = lg.refresh()
        assert (later.sequencer, later.epoch) == (settled.sequencer, settled.epoch), \
            f"the log kept changing hands: {settled} -> {later}"
    finally:
        wb.stop()
        wa.stop()
    rep = fault_report("contested ownership: clients told two sequencers", h,
                       final_scan(rados_cluster, ceph.pool, log_name), owner=later.sequencer)
    assert rep.ok, rep.summary()


def test_randomized_nemesis_round_with_a_standby(ceph, standbys, fault_report, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """One 20 s round of tests/faults/nemesis.py with two daemons standing by
    for each other, clients told different ones, the nemesis pausing and
    killing whichever serves the log (issue 15's runs that did not finish)."""
    from nemesis import run_once

    out = run_once(ceph.conf, ceph.pool, [standbys(), standbys()], 20.0, seed=int(time.time()) % 1000,
                   workdir=tmp_path,
                   checker=lambda h, final: fault_report("randomized nemesis with a standby sequencer, 20 s",
                                                         h, final))
    assert out["acknowledged"] > 200
    assert out["ok"], out["summary"]
