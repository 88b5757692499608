"""An OSD host dies for good on the BlueStore bed, and a replacement joins.

The history checker's workload (this host and a client container: sync,
batch and async appenders and a following reader on each, one log) runs
throughout: an OSD host leaves the network and its container is removed with
its store (a silent death, as a power loss); its peers
report it down; the mon marks it out by itself (`mon osd down out interval`
is short on this module's bed); appends and both followers go on with 2
copies (pool size 3, min_size 2: PGs active+undersized+degraded, since CRUSH
has only 2 hosts left); a replacement host joins with a new OSD id, is
backfilled, and every PG is active+clean on 3 live OSDs again. Then 0
anomalies, every acknowledged append read back by both followers, and the
sequencer still serving.

A module of its own, because its bed differs from test_net_faults.py's
(BlueStore, and OSDs marked out once down) and it leaves the bed with other
OSD hosts than it found. The timings (kill to marked down, to out, to
backfilled) are in the report row; none is a pass criterion.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from pyzlog.client import metrics

from faultlib import wait_until
from history import APPEND, DATA, OK, STREAM_READ
from netlib import NetCluster, Traffic

#: seconds a down OSD stays in before the mon marks it out (Ceph's default is 600)
DOWN_OUT_INTERVAL = 10
BED = {"bluestore": True, "down_out_interval": DOWN_OUT_INTERVAL}
#: the bed comes up first (3 BlueStore mkfs); backfill on a loaded machine is slow
pytestmark = pytest.mark.timeout(1500)

def _osd_health(checks: dict[str, Any]) -> list[str]:
    """The health checks about OSDs and PGs (the bed runs no mgr, so PG ones
    cannot appear yet; others, e.g. MON_DISK_LOW on a full disk, are not this test's)."""
    return sorted(c for c in checks if c.startswith(("OSD_", "PG_")))


def _wait_down_then_out(net: NetCluster, t: Traffic, osd_id: int, timeout: float = 300) -> None:
    """Mark the moments the mon's map shows the OSD down, then out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = net.c.osd_state(osd_id)
        if st is not None:
            up, is_in = st
            if not up and "marked down" not in t.events:
                t.mark("marked down")
            if not is_in:
                assert not up, f"osd.{osd_id} is out but up: it was destroyed"
                t.mark("marked out")
                return
        time.sleep(0.5)
    raise AssertionError(f"osd.{osd_id} was not marked down and out within {timeout:.0f}s "
                         f"(now {net.c.osd_state(osd_id)})")


def _health(net: NetCluster) -> dict[str, Any]:
    checks: dict[str, Any] = json.loads(net.c.ceph("health", "detail", "-f", "json"))["checks"]
    return checks


def test_net_osd_host_death(net: NetCluster, net_rados, fault_report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    victim = "osd1"
    dead_id = net.c.osd_ids()[victim]
    with Traffic(net, net_rados, tmp_path) as t:
        t.wait_both_acked()
        t.mark("destroyed")
        net.c.destroy_osd_host(victim)
        _wait_down_then_out(net, t, dead_id)

        # degraded: 2 hosts left for 3 replicas; min_size 2 keeps every PG active
        t.wait_progress_after(t.events["marked out"], n=50, timeout=180)
        t.mark("went on degraded")
        degraded = net.c.pg_states()
        assert all(p["state"].startswith("active") and dead_id not in p["acting"] for p in degraded.values()), \
            degraded
        undersized = sum(1 for p in degraded.values() if "undersized" in p["state"])
        assert undersized == len(degraded), f"with 2 OSD hosts every PG should be undersized: {degraded}"

        host, new_id = net.c.add_osd_host(say=print)
        t.mark("replacement up")
        assert new_id != dead_id
        wait_until(lambda: net.c.clean(net.c.pg_states()), 900, "backfill to the replacement (every PG "
                   "active+clean on 3 live OSDs)", interval=2)
        t.mark("backfilled")
        clean = net.c.pg_states()
        on_new = sum(1 for p in clean.values() if new_id in p["acting"])

        # the sequencer still hands out positions: no slow tail finding on this host from here on
        t.wait_progress_after(t.events["backfilled"])
        slow0 = metrics.SLOW_POSITIONS.value
        t.mark("sequencer check")
        t.wait_progress_after(t.events["sequencer check"])
        slow_after = metrics.SLOW_POSITIONS.value - slow0

    final = t.final_scan()
    health = _health(net)
    ev = t.events
    timings = {k: round(ev[e] - ev["destroyed"], 1) for k, e in
               (("marked down", "marked down"), ("marked out", "marked out"),
                ("replacement up", "replacement up"), ("backfilled", "backfilled"))}
    rep = fault_report(f"network: OSD host dies for good (BlueStore; off the network, container and store "
                       f"removed), marked out "
                       f"by the mon after {DOWN_OUT_INTERVAL} s, replacement host backfilled",
                       t.h, final, dead_osd=dead_id, replacement_osd=new_id, replacement_host=host,
                       pgs=len(clean), pgs_undersized_while_degraded=undersized, pgs_on_replacement=on_new,
                       acked_degraded=t.acked_between(ev["marked out"], ev["replacement up"]),
                       acked_while_backfilling=t.acked_between(ev["replacement up"], ev["backfilled"]),
                       slow_positions_after_backfill=slow_after, health=sorted(health),
                       timings=timings, **t.extra())

    assert on_new == len(clean), "with 3 hosts again every PG has a copy on the replacement"
    assert t.acked_between(ev["marked out"], ev["replacement up"]) > 0, "appends should go on degraded"
    assert rep.ok, rep.summary()
    assert slow_after == 0, "appends took positions by slow tail finding after the backfill"
    # every acknowledged append was read back at its position by the followers: each one
    # everything below where it stopped (its own workload's sentinel), one of them the rest
    acked = {o.position: o.data for o in t.h.ops if o.kind == APPEND and o.outcome == OK}
    unread = set(acked)
    for reader in ("h-reader", "c-reader"):
        seen = {o.position: o.data for o in t.h.ops
                if o.kind == STREAM_READ and o.process == reader and o.seen == DATA}
        assert seen, f"{reader} read nothing"
        end = max(seen)
        missing = sorted(p for p, d in acked.items() if p <= end and seen.get(p) != d)
        assert not missing, f"{reader} did not read back {len(missing)} acknowledged appends: {missing[:10]}"
        unread -= {p for p in acked if p <= end}
    assert not unread, f"acknowledged appends no follower read: {sorted(unread)[:10]}"
    assert not _osd_health(health), f"health after the replacement: {health}"
    assert net.c.osd_state(dead_id) == (False, False), "the dead OSD should stay down and out"
