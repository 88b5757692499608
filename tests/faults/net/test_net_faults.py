"""Network faults on a multi-host cluster in Docker (docker/cluster.py).

Each test runs the history checker's workload from this host and from a
client container at once (sync, batch and async appenders and a following
reader on each, one log), injects one network fault, heals it, and checks
the merged history against a final scan: 0 anomalies. One cluster serves the
whole suite: every fault here leaves it healthy once healed (memstore OSDs
are never restarted), and the `net` fixture heals whatever a failed test
left behind before the next one.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import rados

import pyzlog
from pyzlog import RecordKind

from faultlib import wait_until
from history import APPEND, OK, PENDING, UNKNOWN
from netlib import NetCluster, Traffic

#: the first test also builds the images (about a minute from nothing) and starts the cluster
pytestmark = pytest.mark.timeout(600)

#: long enough for readers (hole wait 1 s) to fill what a cut-off client holds
CUT_SECONDS = 6.0
#: how long the loss, bandwidth and partition faults last
FAULT_SECONDS = 10.0


def _osd_index(host: str) -> int:
    return int(host.removeprefix("osd"))


def test_net_osd_cut_off(net: NetCluster, net_rados, fault_report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """osd1's host leaves the network (docker network disconnect) until the
    mon marks it down and both clients have gone on without it (2 of 3
    copies), then is connected again with its address and rejoins."""
    victim = "osd1"
    with Traffic(net, net_rados, tmp_path) as t:
        t.wait_both_acked()
        t.mark("disconnected")
        net.disconnect(victim)
        wait_until(lambda: not net.osd_is_up(_osd_index(victim)), 60, f"{victim} marked down")
        t.mark("marked down")
        t.wait_progress_after(t.events["marked down"], n=20, timeout=60)  # on 2 of 3 copies
        t.mark("went on without it")
        net.connect(victim)
        t.mark("connected")
        wait_until(lambda: net.osd_is_up(_osd_index(victim)), 60, f"{victim} up again")
        t.mark("up again")
        t.wait_progress_after(t.events["up again"])
    rep = fault_report("network: OSD host cut off (docker network disconnect) until marked down, "
                       "then reconnected", t.h, t.final_scan(), **t.extra())
    assert rep.ok, rep.summary()


def test_net_one_way_partition(net: NetCluster, net_rados, fault_report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """osd0 drops every packet from osd1 (iptables in osd0's namespace) for
    10 s: a one-way partition between two OSDs that both stay up and reach
    everyone else. Replication between them stalls until it heals."""
    a, b = "osd0", "osd1"
    with Traffic(net, net_rados, tmp_path) as t:
        t.wait_both_acked()
        t.mark("partitioned")
        net.iptables(a, "-A", "INPUT", "-s", net.ip(b), "-j", "DROP")
        time.sleep(FAULT_SECONDS)
        down_during = [h for h in (a, b) if not net.osd_is_up(_osd_index(h))]
        net.iptables(a, "-D", "INPUT", "-s", net.ip(b), "-j", "DROP")
        t.mark("healed")
        t.wait_progress_after(t.events["healed"])
    rep = fault_report(f"network: one-way partition {b} -> {a} (iptables DROP in {a}) {FAULT_SECONDS:.0f} s",
                       t.h, t.final_scan(), marked_down_during=down_during, **t.extra())
    assert rep.ok, rep.summary()


def test_net_sequencer_cut_off(net: NetCluster, net_rados, fault_report, tmp_path: Path,  # type: ignore[no-untyped-def]
                               caplog: pytest.LogCaptureFixture) -> None:
    """The active sequencer keeps running but no client reaches it (its port
    dropped both ways in its namespace; it still reaches Ceph). Clients fall
    back to slow tail finding, and use it again once it is reachable.

    Today clients name one sequencer; with standbys (issue 15) this is where
    the standby takes over, and the checks stay the same."""
    caplog.set_level(logging.WARNING, logger="pyzlog")
    active = "seqr0"
    port = net.sequencers[0].rsplit(":", 1)[1]
    rules = [("INPUT", "--dport"), ("OUTPUT", "--sport")]
    with Traffic(net, net_rados, tmp_path) as t:
        assert t.sequencer.startswith(net.ip(active) + ":")
        t.wait_both_acked()
        t.mark("cut")
        for chain, flag in rules:
            net.iptables(active, "-A", chain, "-p", "tcp", flag, port, "-j", "DROP")
        time.sleep(CUT_SECONDS)
        for chain, flag in rules:
            net.iptables(active, "-D", chain, "-p", "tcp", flag, port, "-j", "DROP")
        t.mark("healed")
        t.wait_progress_after(t.events["healed"])
        # clients try the sequencer again within a second or two of its return
        wait_until(lambda: "use it again" in caplog.text and
                   "use it again" in net.container_logs(t.client.host), 30,
                   "clients on the host and in the container to use the sequencer again")
    during = t.acked_between(t.events["cut"] + 2.5, t.events["healed"])
    rep = fault_report(f"network: active sequencer cut off from its clients {CUT_SECONDS:.0f} s "
                       "(still running), then healed", t.h, t.final_scan(), port=port,
                       acked_by_slow_tail_finding=during, **t.extra())
    assert during > 0, "appends should go on by slow tail finding while the sequencer is cut off"
    assert rep.ok, rep.summary()


def test_net_client_cut_off_mid_append(net: NetCluster, net_rados, fault_report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The client container is cut off while it holds positions: first its
    writes to the OSDs are dropped (its appenders take positions from the
    sequencer, their writes do not leave), then everything, for 6 s, longer
    than the readers' hole wait. Readers fill what it held (LOST). Healed,
    its late writes reach the OSDs: each must be refused and go to a new
    position, never be acknowledged at a position a reader filled."""
    with Traffic(net, net_rados, tmp_path) as t:
        victim = t.client.host
        t.wait_both_acked()
        t.mark("writes cut")
        for osd in net.c.osd_hosts:
            net.iptables(victim, "-A", "OUTPUT", "-d", net.ip(osd), "-j", "DROP")
        time.sleep(0.5)  # its appenders now hold positions they cannot write
        subnet = str(net.subnet)
        net.iptables(victim, "-A", "INPUT", "-s", subnet, "-j", "DROP")
        net.iptables(victim, "-A", "OUTPUT", "-d", subnet, "-j", "DROP")
        t.mark("cut off")
        time.sleep(CUT_SECONDS)
        net.iptables(victim, "-F", "INPUT")
        net.iptables(victim, "-F", "OUTPUT")
        t.mark("healed")
        t.wait_progress_after(t.events["healed"])
    final = t.final_scan()
    t_cut, t_heal = t.events["writes cut"], t.events["healed"]
    lost = t.lost_seen_between(t_cut, t_heal + 5)
    # the cut client's appends that were in flight across the cut
    mid = [o for o in t.h.ops if o.kind == APPEND and o.process.startswith("c")
           and o.start < t.events["cut off"] and (o.end is None or o.end > t_heal)]
    late_ok = [o for o in mid if o.outcome == OK]
    late_unknown = [o for o in mid if o.outcome in (UNKNOWN, PENDING)]
    rep = fault_report(f"network: client host cut off mid-append {CUT_SECONDS:.0f} s (> hole wait 1 s), "
                       "then healed", t.h, final, lost_filled=len(lost), in_flight_across_cut=len(mid),
                       late_acknowledged=len(late_ok), late_unknown=len(late_unknown), **t.extra())
    assert lost, "readers should have filled positions the cut-off client held"
    assert mid, "the client should have been mid-append when cut off"
    acked_at = {o.position for o in t.h.ops if o.kind == APPEND and o.outcome == OK}
    assert not acked_at & set(lost), "an append was acknowledged at a position a reader filled"
    assert all(final[p].kind != RecordKind.DATA for p in lost), "a filled position holds data"
    assert rep.ok, rep.summary()


def test_net_packet_loss(net: NetCluster, net_rados, fault_report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """30 % of the packets to and from osd2 are dropped (iptables statistic
    match, both directions) for 10 s."""
    victim = "osd2"
    rule = ["-m", "statistic", "--mode", "random", "--probability", "0.3", "-j", "DROP"]
    with Traffic(net, net_rados, tmp_path) as t:
        t.wait_both_acked()
        t.mark("loss on")
        net.iptables(victim, "-A", "INPUT", *rule)
        net.iptables(victim, "-A", "OUTPUT", *rule)
        time.sleep(FAULT_SECONDS)
        net.iptables(victim, "-D", "INPUT", *rule)
        net.iptables(victim, "-D", "OUTPUT", *rule)
        t.mark("loss off")
        t.wait_progress_after(t.events["loss off"])
    during = t.acked_between(t.events["loss on"], t.events["loss off"])
    rep = fault_report(f"network: 30% packet loss on an OSD host {FAULT_SECONDS:.0f} s (iptables statistic)",
                       t.h, t.final_scan(), acked_during=during, **t.extra())
    assert during > 0, "appends should go on over a lossy link"
    assert rep.ok, rep.summary()


def test_net_bandwidth_cap(net: NetCluster, net_rados, fault_report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """osd0's link is capped at 1 Mbit/s both ways (tc tbf on its interface
    and on the host end of its veth) for 10 s."""
    victim, rate = "osd0", "1mbit"
    with Traffic(net, net_rados, tmp_path) as t:
        t.wait_both_acked()
        t.mark("capped")
        net.cap_bandwidth(victim, rate)
        time.sleep(FAULT_SECONDS)
        net.uncap_bandwidth(victim)
        t.mark("uncapped")
        t.wait_progress_after(t.events["uncapped"])
    during = t.acked_between(t.events["capped"], t.events["uncapped"])
    rep = fault_report(f"network: OSD host capped at 1 Mbit/s both ways {FAULT_SECONDS:.0f} s (tc tbf)",
                       t.h, t.final_scan(), acked_during=during, **t.extra())
    assert during > 0, "appends should go on over a slow link"
    assert rep.ok, rep.summary()


def test_net_paused_host(net: NetCluster, net_rados, fault_report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """osd2's host is frozen (docker pause) until the mon marks it down and
    both clients have gone on without it, then thawed; it finds itself
    marked down and rejoins."""
    victim = "osd2"
    with Traffic(net, net_rados, tmp_path) as t:
        t.wait_both_acked()
        t.mark("paused")
        net.pause(victim)
        wait_until(lambda: not net.osd_is_up(_osd_index(victim)), 60, f"{victim} marked down")
        t.mark("marked down")
        t.wait_progress_after(t.events["marked down"], n=20, timeout=60)  # on 2 of 3 copies
        t.mark("went on without it")
        net.unpause(victim)
        t.mark("unpaused")
        wait_until(lambda: net.osd_is_up(_osd_index(victim)), 60, f"{victim} up again")
        t.mark("up again")
        t.wait_progress_after(t.events["up again"])
    rep = fault_report("network: OSD host paused (docker pause) until marked down, then thawed",
                       t.h, t.final_scan(), **t.extra())
    assert rep.ok, rep.summary()


def test_net_client_learns_that_a_cut_off_osd_is_down(net: NetCluster) -> None:
    """A client whose ops all go to one OSD, which leaves the network: once
    the mon marks it down, the client's next op goes to the new primary.
    librados learns of a newer OSD map only from a tick that finds an op in
    flight longer than objecter_timeout (or from another OSD's reply): with
    an op timeout below that, each op timed out before any tick saw it
    laggy, and the client retried at the dead OSD for ever (found as both
    clients of test_net_osd_cut_off stuck for minutes on a healthy
    cluster). pyzlog.connect sets both from its op timeout."""
    victim = "osd1"
    osd_id = net.c.osd_ids()[victim]
    r = pyzlog.connect(net.conf, op_timeout=4)
    try:
        io = r.open_ioctx(net.pool)
        for i in range(1000):  # an object whose primary is the victim
            name = f"laggy-{i}"
            where = json.loads(net.c.ceph("osd", "map", net.pool, name, "-f", "json"))
            if where["acting_primary"] == osd_id:
                break
        else:
            raise AssertionError(f"no object of 1000 maps to osd.{osd_id}")
        io.write_full(name, b"before")  # the client now holds a map in which the victim is up
        net.disconnect(victim)
        wait_until(lambda: not net.osd_is_up(osd_id), 60, f"{victim} marked down")
        attempts = []

        def read() -> bool:
            try:
                attempts.append(io.read(name))
                return True
            except rados.TimedOut:
                attempts.append(None)
                return False
        # a few op timeouts: the first may still go to the victim
        wait_until(read, 40, f"a read of {name} (primary was osd.{osd_id}) after it was marked down", interval=0)
        assert attempts[-1] == b"before", attempts
        io.close()
    finally:
        r.shutdown()
        if not net.connected(victim):
            net.connect(victim)
