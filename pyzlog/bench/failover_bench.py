"""`zlog bench failover`: how long appends go without the sequencer when
the active one dies or stalls, with a standby and no operator.

Two zlog-seqr daemons, a group of their own, stand by for the pool. Sync and async appenders run
throughout. Each round kills the log's active sequencer with SIGKILL (or
stops it with SIGSTOP, so only its lease tells the standby), and measures
the gap from the fault to the first append acknowledged through the new
sequencer. A killed daemon is started again (a new standby); a stopped one
is continued once replaced, and must step down by itself. At the end every
acknowledged append is read back: one position, one entry, as acknowledged.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console

from ..core.errors import ZlogError
from ..client.log import Log
from ..core.registry import DEFAULT_LEASE_SECONDS

console = Console(stderr=True)

KILL_TARGET_P99_S = 3.0
#: a pause is noticed after the lease; the target is lease + this
PAUSE_TARGET_MARGIN_S = 2.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Daemon:
    """One zlog-seqr standing by for `pool`, as a child process."""

    def __init__(self, conf: str, pool: str, lease: float, logdir: Path, group: str) -> None:
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        exe = shutil.which("zlog-seqr", path=str(Path(sys.executable).parent)) or "zlog-seqr"
        self.log_path = logdir / f"seqr-{self.port}.log"
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [exe, "--port", str(self.port), "--conf", conf, "--pool", pool, "--lease", str(lease),
                 "--group", group],
                stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            if self.proc.poll() is not None:
                raise ZlogError(f"zlog-seqr exited with {self.proc.returncode}; see {self.log_path}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise ZlogError(f"zlog-seqr did not start; see {self.log_path}") from None
                time.sleep(0.05)

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def end(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(5)


class Appenders:
    """Sync and async appenders; each acknowledgement with its time and the
    sequencer its client was using."""

    def __init__(self, cluster: Any, pool: str, name: str) -> None:
        self.logs = [Log.open(cluster, pool, name) for _ in range(2)]
        self.acked: dict[int, list[bytes]] = {}
        self.via: list[tuple[float, str]] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(2)]
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        lg = self.logs[i]
        k = 0
        while not self.stop.is_set():
            data = b"a%d-%d" % (i, k)
            k += 1
            try:
                pos = lg.append(data) if i == 0 else lg.append_async(data).result(timeout=130)
            except ZlogError as e:
                self.errors.append(str(e))
                continue
            via = lg.sequencer.address if lg.sequencer is not None and lg.positions.sequencer_usable() else ""
            with self.lock:
                self.acked.setdefault(pos, []).append(data)
                self.via.append((time.monotonic(), via))

    def first_via(self, address: str, after: float) -> float | None:
        """When the first append after `after` was acknowledged through `address`."""
        with self.lock:
            return next((t for t, a in self.via if a == address and t > after), None)

    def end(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(150)
        for lg in self.logs:
            lg.close()


def _wait(cond: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.02)
    return None


def _stats(gaps: list[float]) -> dict[str, Any]:
    if not gaps:
        return {"n": 0}
    s = sorted(gaps)
    return {"n": len(s), "p50_s": statistics.median(s), "p99_s": s[min(len(s) - 1, round(0.99 * (len(s) - 1)))],
            "max_s": s[-1], "all_s": [round(g, 3) for g in gaps]}


def run_failover_bench(cluster: Any, conf: str, pool: str, kills: int, pauses: int,
                       lease: float = DEFAULT_LEASE_SECONDS) -> dict[str, Any]:
    name = f"bench-failover-{uuid.uuid4().hex[:8]}"
    logdir = Path(tempfile.mkdtemp(prefix="zlog-failover-"))
    group = f"bench-{uuid.uuid4().hex[:8]}"  # other daemons of the pool take no part
    daemons = [Daemon(conf, pool, lease, logdir, group) for _ in range(2)]
    lg = Log.create(cluster, pool, name, width=4, sequencer=daemons[0].address)
    lg.append(b"first")
    gaps: dict[str, list[float]] = {"kill": [], "pause": []}
    failures: list[str] = []
    w = Appenders(cluster, pool, name)
    try:
        _wait(lambda: len(w.acked) > 100, 30)
        plan = ["kill"] * kills + ["pause"] * pauses
        for i, fault in enumerate(plan):
            active_addr = lg.refresh().sequencer
            active = next((d for d in daemons if d.address == active_addr), None)
            if active is None:
                failures.append(f"round {i}: the log's sequencer {active_addr!r} is none of the daemons" +
                                ("" if active_addr else " (the metadata names none: does every OSD run this "
                                 "cls_zlog? an older class does not record sequencers)"))
                break
            t0 = time.monotonic()
            active.signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            new = _wait(lambda: (lambda s: s if s and s != active_addr else None)(lg.refresh().sequencer),
                        lease + 30)
            first = new and _wait(lambda: w.first_via(new, t0), 30)
            if not first:
                failures.append(f"round {i} ({fault}): no append through a new sequencer within {lease + 60:.0f}s")
                break
            gaps[fault].append(first - t0)
            console.print(f"{fault} {len(gaps[fault])}/{kills if fault == 'kill' else pauses}: "
                          f"{active_addr} -> {new} in {first - t0:.2f}s")
            if fault == "kill":
                active.proc.wait(5)
                daemons.remove(active)
                daemons.append(Daemon(conf, pool, lease, logdir, group))  # an operator-less fleet keeps two
            else:
                active.signal(signal.SIGCONT)
            time.sleep(lease)  # the new standby is seen beating before the next round
    finally:
        w.end()
        for d in daemons:
            d.end()
    dup = [p for p, v in w.acked.items() if len(v) > 1]
    reader = Log.open(cluster, pool, name)
    wrong = [p for p, (d, *_) in w.acked.items() if reader.read(p) != d]
    stepped_down = sum(p.read_text(errors="replace").count("stepped down") for p in logdir.glob("*.log"))
    return {
        "log": name, "lease_s": lease, "kill": _stats(gaps["kill"]), "pause": _stats(gaps["pause"]),
        "acknowledged": len(w.acked), "append_errors": len(w.errors), "errors_sample": w.errors[:5],
        "anomalies": len(dup) + len(wrong), "duplicate_positions": dup[:10], "wrong_data": wrong[:10],
        "step_downs_logged": stepped_down, "failures": failures, "daemon_logs": str(logdir),
        # zlog-seqr --pool: every client (and each daemon's probe) passed the handshake
        "sequencer_auth": True,
        "targets": {"kill_p99_s": KILL_TARGET_P99_S, "pause_p99_s": lease + PAUSE_TARGET_MARGIN_S},
    }


def run_many_logs(cluster: Any, conf: str, pool: str, logs: int, lease: float) -> dict[str, Any]:
    """`logs` logs served by one of three daemons: kill it, and time until
    every one of its logs is served by another (recorded in its metadata),
    and whether any log of the two others changed hands or epoch."""
    from ..core.state import LogState

    group = f"bench-{uuid.uuid4().hex[:8]}"
    logdir = Path(tempfile.mkdtemp(prefix="zlog-failover-many-"))
    daemons = [Daemon(conf, pool, lease, logdir, group) for _ in range(3)]
    tag = uuid.uuid4().hex[:6]
    try:
        names = [f"bench-many-{tag}-{i}" for i in range(logs)]
        for i, n in enumerate(names):  # each daemon serves a third of them
            lg = Log.create(cluster, pool, n, width=2, sequencer=daemons[i % 3].address)
            lg.append(b"x")
            lg.close()
        states = {n: LogState(cluster, pool, n) for n in names}
        before = {n: st.refresh() for n, st in states.items()}
        victim = daemons[0]
        moved = [n for n, m in before.items() if m.sequencer == victim.address]
        t0 = time.monotonic()
        victim.signal(signal.SIGKILL)
        left = set(moved)
        while left and time.monotonic() - t0 < 120:
            left = {n for n in left if states[n].refresh().sequencer == victim.address}
            time.sleep(0.05)
        elapsed = time.monotonic() - t0
        disturbed = [n for n, m in before.items() if m.sequencer != victim.address and
                     (lambda now: (now.sequencer, now.epoch) != (m.sequencer, m.epoch))(states[n].refresh())]
        return {"logs": logs, "on_the_killed_daemon": len(moved), "moved_in_s": round(elapsed, 2),
                "not_moved": len(left), "others_disturbed": len(disturbed)}
    finally:
        for d in daemons:
            d.end()


def format_failover(r: dict[str, Any]) -> str:
    rows = ["| fault | rounds | p50 s | p99 s | max s | target p99 |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for fault, target in (("kill", r["targets"]["kill_p99_s"]), ("pause", r["targets"]["pause_p99_s"])):
        s = r[fault]
        if s["n"]:
            rows.append(f"| {'kill -9' if fault == 'kill' else 'SIGSTOP (lease ' + format(r['lease_s'], 'g') + ' s)'} "
                        f"| {s['n']} | {s['p50_s']:.2f} | {s['p99_s']:.2f} | {s['max_s']:.2f} | <= {target:g} |")
    many = r.get("many_logs")
    if many:
        rows.append("")
        rows.append(f"many logs: {many['on_the_killed_daemon']} of {many['logs']} logs served by the daemon "
                    f"killed -9 moved to the other two in {many['moved_in_s']} s ({many['not_moved']} not "
                    f"moved); logs of the live daemons disturbed: {many['others_disturbed']}")
    rows.append("")
    rows.append(f"{r['acknowledged']:,} appends acknowledged, {r['anomalies']} anomalies, "
                f"{r['append_errors']} append errors; step-downs logged by paused daemons: "
                f"{r['step_downs_logged']}")
    if r["failures"]:
        rows.append("FAILED: " + "; ".join(r["failures"]))
    return "\n".join(rows)


def bench_failover(cluster: Any, conf: str, pool: str, kills: int, pauses: int, lease: float, out: str,
                   many_logs: int = 0) -> None:
    from .bench import machine_info

    result = run_failover_bench(cluster, conf, pool, kills, pauses, lease)
    if many_logs:
        result["many_logs"] = many = run_many_logs(cluster, conf, pool, many_logs, lease)
        if many["not_moved"] or many["others_disturbed"]:
            result["failures"].append(f"many logs: {many}")
    result["machine"] = machine_info(cluster)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(format_failover(result))
    print(f"\nresults: {out}")
    if result["failures"] or result["anomalies"]:
        raise ZlogError("failover benchmark: " + "; ".join(result["failures"] or ["anomalies found"]))
