"""Host side of the network fault suite: the Docker test bed as a module
fixture, the faults (docker network disconnect/connect, iptables and tc run
in a container's network namespace with nsenter, docker pause) and the
traffic that meets them (a workload on this host plus one in a client
container, their histories merged for the checker).

The cluster comes from docker/cluster.py: 1 mon, 3 OSD hosts (pool size 3,
min_size 2, one replica per host), 2 sequencers, cephx, on a network of its
own. One cluster serves every test of the module; it is removed when the
module is done, or by a watcher if the test run is killed. Each fault is
healed by its test, and `NetCluster.heal()` (run after every test) undoes
whatever a failed test left, then waits for 3 OSDs up, a write to go through
and the sequencers to listen. Set ZLOG_DOCKER_TESTS=0 to leave these tests
out (they are skipped then, and say so); otherwise a missing Docker is
installed and started, as `./dev docker` would.
"""
from __future__ import annotations

import ipaddress
import json
import subprocess
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from pyzlog import Log

from dockermod import dcluster
from faultlib import final_scan, wait_until
from history import APPEND, LOST, OK, STREAM_READ, History
from netload import NetWorkload, load_history

TESTS = Path(__file__).resolve().parents[2]
#: client ops give up after this long (an OSD cut off takes ~15 s to be marked down)
OP_TIMEOUT = 10.0
HOLE_WAIT = 1.0


def client_sequencer(nc: "NetCluster") -> str:
    """The sequencer address clients are given. Today clients name one
    sequencer (the first) and fall back to slow tail finding when it is
    unreachable; with standby sequencers (issue 15) this is where clients
    get the list of all of them."""
    return nc.sequencers[0]


class NetCluster:
    """The Docker cluster with the faults the suite injects."""

    def __init__(self, cluster: Any, tmp: Path) -> None:
        self.c = cluster
        self.tmp = tmp
        st = cluster.state()
        self.conf: str = cluster.conf
        self.pool: str = st["pool"]
        self.subnet = ipaddress.IPv4Network(st["subnet"])
        self.sequencers: list[str] = cluster.sequencers
        self.capped: set[str] = set()

    # -------------------------------------------------------------- helpers
    @property
    def hosts(self) -> dict[str, str]:
        """Every host of the cluster now, and its address (an OSD host
        destroyed for good leaves, its replacement joins)."""
        hosts: dict[str, str] = self.c.state()["hosts"]
        return hosts

    def ip(self, host: str) -> str:
        return str(self.hosts[host])

    def nsenter(self, host: str, *cmd: str, check: bool = True) -> str:
        """Run a command of this machine (iptables, tc, ip) in the network
        namespace of a container: the container needs no NET_ADMIN."""
        return dcluster.run(["nsenter", "-t", str(self.c.pid(host)), "-n", *cmd], timeout=30, check=check)

    def iptables(self, host: str, *rule: str) -> None:
        self.nsenter(host, "iptables", "-w", *rule)

    def iface(self, host: str) -> str:
        """The container's interface on the cluster network (its name
        changes after a disconnect and connect)."""
        for line in self.nsenter(host, "ip", "-o", "-4", "addr", "show").splitlines():
            f = line.split()
            if len(f) > 3 and f[3].split("/")[0] == self.ip(host):
                return f[1]
        raise AssertionError(f"{host} has no interface with {self.ip(host)}")

    def host_peer(self, host: str) -> str:
        """The host-side end of a container's veth pair."""
        # "9: eth1@if10: <...>": the peer's index follows "@if"
        line = self.nsenter(host, "ip", "-o", "link", "show", "dev", self.iface(host))
        iflink = line.split(":")[1].strip().rpartition("@if")[2]
        for d in Path("/sys/class/net").iterdir():
            try:
                if (d / "ifindex").read_text().strip() == iflink:
                    return d.name
            except OSError:
                continue
        raise AssertionError(f"no host interface with index {iflink} (peer of {host})")

    # --------------------------------------------------------------- faults
    def disconnect(self, host: str) -> None:
        dcluster.docker("network", "disconnect", self.c.network, self.c.container(host))

    def connect(self, host: str) -> None:
        dcluster.docker("network", "connect", "--ip", self.ip(host), self.c.network, self.c.container(host))

    def connected(self, host: str) -> bool:
        out = dcluster.docker("inspect", "--format", "{{json .NetworkSettings.Networks}}", self.c.container(host))
        return self.c.network in json.loads(out or "{}")

    def pause(self, host: str) -> None:
        dcluster.docker("pause", self.c.container(host))

    def unpause(self, host: str) -> None:
        dcluster.docker("unpause", self.c.container(host))

    def cap_bandwidth(self, host: str, rate: str) -> None:
        """A token bucket both ways: egress of the container's interface and
        of its host-side veth (which is the container's ingress)."""
        self.capped.add(host)
        for dev, ns in ((self.iface(host), True), (self.host_peer(host), False)):
            cmd = ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                   "burst", "16kb", "latency", "300ms"]
            self.nsenter(host, *cmd) if ns else dcluster.run(cmd, timeout=30)

    def uncap_bandwidth(self, host: str) -> None:
        self.nsenter(host, "tc", "qdisc", "del", "dev", self.iface(host), "root", check=False)
        dcluster.run(["tc", "qdisc", "del", "dev", self.host_peer(host), "root"], timeout=30, check=False)
        self.capped.discard(host)

    def up_osds(self) -> int:
        return int(self.c.up_osds())

    def osd_is_up(self, i: int) -> bool:
        try:
            dump = json.loads(self.c.ceph("osd", "dump", "-f", "json", timeout=20))
        except (dcluster.DockerError, ValueError):
            return False
        return any(o["osd"] == i and o["up"] == 1 for o in dump["osds"])

    def wait_clean(self, timeout: float = 300) -> None:
        wait_until(lambda: self.c.clean(self.c.pg_states()), timeout, "every PG active+clean", interval=1)

    def diagnosis(self) -> str:
        """What the cluster says of itself, for a test that saw no progress:
        health and each PG's state as its primary reports it (the bed runs
        no mgr, so `ceph pg dump` knows nothing)."""
        out = []
        try:
            out.append(self.c.ceph("health", "detail", timeout=30).strip())
        except dcluster.DockerError as e:
            out.append(f"ceph health detail failed: {e}")
        try:
            states = self.c.pg_states()
            out += [f"pg {pg}: {p['state']} up {p['up']} acting {p['acting']}" for pg, p in sorted(states.items())
                    if p["state"] != "active+clean" or len(p["acting"]) < 3]
            out.append(f"{sum(p['state'] == 'active+clean' for p in states.values())} of {len(states)} PGs "
                       "active+clean")
        except (dcluster.DockerError, ValueError) as e:
            out.append(f"PG states unknown: {e}")
        for host, osd_id in sorted(self.c.osd_ids().items()):  # what each OSD is still working on
            try:
                ops = json.loads(dcluster.docker("exec", self.c.container(host), "ceph", "daemon", f"osd.{osd_id}",
                                                 "dump_ops_in_flight", timeout=20))
                out.append(f"osd.{osd_id} ops in flight: {ops.get('num_ops')}")
                out += [f"  {o.get('description', '')[:160]} age {o.get('age', 0):.1f}s "
                        f"{o.get('type_data', {}).get('flag_point', '')}" for o in ops.get("ops", [])[:8]]
            except (dcluster.DockerError, ValueError) as e:
                out.append(f"osd.{osd_id} ops unknown: {str(e)[:200]}")
        return "\n".join(out)

    def container_logs(self, host: str) -> str:
        p = subprocess.run(["docker", "logs", self.c.container(host)], capture_output=True, timeout=30)
        return (p.stdout + p.stderr).decode(errors="replace")

    # ----------------------------------------------------------------- heal
    def heal(self, timeout: float = 120) -> None:
        """Undo every fault on every host, then wait until the cluster serves."""
        paused = dcluster.docker("ps", "--filter", f"label={dcluster.LABEL}={self.c.name}",
                                 "--filter", "status=paused", "--format", "{{.Names}}").split()
        if paused:
            dcluster.docker("unpause", *paused)
        for host in self.hosts:
            if not self.connected(host):
                self.connect(host)
            for chain in ("INPUT", "OUTPUT"):
                self.iptables(host, "-F", chain)
        for host in list(self.capped):
            self.uncap_bandwidth(host)
        self.c.wait_osds_up(len(self.c.osd_hosts), timeout)
        self.c.wait_writable(timeout)
        for addr in self.sequencers:
            h, p = addr.rsplit(":", 1)
            wait_until(lambda h=h, p=int(p): dcluster._listening(h, p), 60, f"the sequencer at {addr}")


# ---------------------------------------------------------------- traffic
class ContainerClient:
    """One client host in a container: netload.py's workload, appending to
    and reading the same log as the host's, until stopped."""

    def __init__(self, nc: NetCluster, index: int, log_name: str, out: Path, prefix: str,
                 sequencer: str | None) -> None:
        self.nc = nc
        self.host = f"client{index}"
        self.ip = str(nc.subnet[40 + index])
        self.log_name = log_name
        self.out = out
        self.prefix = prefix
        self.sequencer = sequencer
        out.mkdir(parents=True, exist_ok=True)

    def start(self) -> "ContainerClient":
        args = ["python3", "-P", "/zlog-tests/faults/net/netload.py", "--conf", "/etc/ceph/ceph.conf",
                "--pool", self.nc.pool, "--log", self.log_name, "--prefix", self.prefix, "--out", "/out",
                "--hole-wait", str(HOLE_WAIT), "--op-timeout", str(OP_TIMEOUT)]
        if self.sequencer:
            args += ["--sequencer", self.sequencer]
        dcluster.docker("rm", "-f", self.nc.c.container(self.host), check=False)  # a failed test's
        self.nc.c.run_client(self.host, self.ip, args, {str(TESTS): "/zlog-tests:ro", str(self.out): "/out"})
        return self

    def acked(self) -> int:
        try:
            return int(json.loads((self.out / "progress.json").read_text())["acked"])
        except (OSError, ValueError, KeyError):
            return 0

    def request_stop(self) -> None:
        (self.out / "stop").touch()

    def finish(self, timeout: float = 240) -> tuple[list[Any], dict[str, int], dict[str, Any]]:
        """Wait for the client to stop and remove its container; its history."""
        self.request_stop()
        name = self.nc.c.container(self.host)
        try:
            dcluster.docker("wait", name, timeout=timeout)
        except dcluster.DockerError:
            pass  # the summary says what went wrong
        logs = self.nc.container_logs(self.host)
        dcluster.docker("rm", "-f", name, check=False)
        hist = self.out / "history.jsonl"
        if not hist.exists():
            raise AssertionError(f"{self.host} wrote no history; its output:\n{logs[-3000:]}")
        ops, starts = load_history(hist)
        summary = json.loads((self.out / "summary.json").read_text())
        if summary.get("error"):
            raise AssertionError(f"{self.host}: {summary['error']}\n{logs[-3000:]}")
        return ops, starts, summary


class Traffic:
    """The workload of one test: on this host 2 sync appenders, a batch
    appender, an async appender (32 in flight) and a following reader; the
    same in a client container. Leaving the block stops both (each appends
    its sentinel, its reader reaches it) and merges the container's history
    into `h`."""

    def __init__(self, nc: NetCluster, r: Any, tmp: Path, *, client_index: int = 0) -> None:
        self.nc = nc
        self.r = r
        self.name = f"net-{uuid.uuid4().hex[:12]}"
        self.h = History()
        self.sequencer = client_sequencer(nc)
        Log.create(r, nc.pool, self.name, width=4).close()
        self.host = NetWorkload(self.h, r, nc.pool, self.name, sequencer=self.sequencer, appenders=2,
                                batch=8, async_window=32, hole_wait=HOLE_WAIT, prefix="h")
        self.client = ContainerClient(nc, client_index, self.name, tmp / "client", "c", self.sequencer)
        self.client_summary: dict[str, Any] = {}
        self.events: dict[str, float] = {}

    def __enter__(self) -> "Traffic":
        self.client.start()
        self.host.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.client.request_stop()
        try:
            self.host.stop()
        finally:
            ops, starts, self.client_summary = self.client.finish()
            self.h.extend(ops, starts)

    # ------------------------------------------------------------- progress
    def mark(self, event: str) -> float:
        self.events[event] = t = time.monotonic()
        print(f"[{time.strftime('%H:%M:%S')}] {event}", flush=True)
        return t

    def wait_both_acked(self, n: int = 50, timeout: float = 90) -> None:
        wait_until(lambda: self.host.counts()["acked"] >= n and self.client.acked() >= n, timeout,
                   f"{n} acknowledged appends on the host and in {self.client.host}")

    def wait_progress_after(self, t: float, n: int = 50, timeout: float = 120) -> None:
        """Both the host and the container acknowledge n more appends after t."""
        base = self.client.acked()
        try:
            wait_until(lambda: self.host.acked_since(t) >= n and self.client.acked() >= base + n, timeout,
                       f"{n} appends acknowledged on the host and in {self.client.host} after the fault")
        except AssertionError as e:
            raise AssertionError(f"{e} (host: {self.host.acked_since(t)}, {self.client.host}: "
                                 f"{self.client.acked() - base})\n{self.nc.diagnosis()}") from None

    def acked_between(self, t0: float, t1: float) -> int:
        return sum(1 for o in self.h.ops if o.kind == APPEND and o.outcome == OK and o.end is not None
                   and t0 <= o.end <= t1)

    def lost_seen_between(self, t0: float, t1: float) -> list[int]:
        """Positions a streaming reader declared LOST (and filled) in [t0, t1]."""
        return sorted({o.position for o in self.h.ops if o.kind == STREAM_READ and o.seen == LOST
                       and o.position is not None and o.end is not None and t0 <= o.end <= t1})

    def final_scan(self) -> dict[int, Any]:
        return final_scan(self.r, self.nc.pool, self.name, hole_wait=HOLE_WAIT)

    def extra(self) -> dict[str, Any]:
        """Figures for the report row besides the checker's."""
        return {"log": self.name, "client_acked": self.client_summary.get("acked"),
                "client_async_acked": self.client_summary.get("async_acked"),
                "host_async_acked": self.host.async_acked(),
                "events": {k: round(v - min(self.events.values()), 1) for k, v in self.events.items()}
                if self.events else {}}
