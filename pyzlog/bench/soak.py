"""`zlog bench soak`: hours of mixed work with sequencer failovers, watching
the client and the daemons for leaks (issue 24).

One log, served by two zlog-seqr daemons of a group of their own standing by
for each other. In this process, at a bounded rate: sync appends, async
appends (append_async windows), batch appends (append_many), a following
stream that checks position order, random reads of recently acknowledged
entries (checked against what was acknowledged), and a trimmer that keeps the
log short (trim_to), so the OSD's memory stays flat too. Every
`failover_every` seconds the active sequencer fails: by SIGSTOP past its lease
(it comes back and steps down, so both daemons live the whole run), and every
third round by kill -9 (a new standby replaces it).

Every `sample_interval` seconds it samples RSS, open file descriptors and
threads of this process and of each daemon (from /proc). The verdict: for
every process that lived past the warm-up (`warmup`, 5 minutes by default),
the mean of its last three samples is at most 10% above the mean of its
first three samples after the warm-up, for each of RSS, fds and threads.
"""
from __future__ import annotations

import collections
import json
import os
import random
import signal
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console

from ..client.log import Log
from ..core.errors import Trimmed, ZlogError
from .failover_bench import Daemon

console = Console(stderr=True)

GROWTH_LIMIT = 0.10
#: fds and threads are small integers: growth of at most this many is noise, not a leak
#: (a connection being re-made at the moment of a sample, a recovery thread)
ABS_SLACK = {"rss_kb": 0, "fds": 2, "threads": 2}
LEASE_S = 2.0


def proc_sample(pid: int) -> dict[str, int] | None:
    """RSS (KiB), open fds and threads of `pid`, or None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    out = {"fds": fds}
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            out["rss_kb"] = int(line.split()[1])
        elif line.startswith("Threads:"):
            out["threads"] = int(line.split()[1])
    return out if "rss_kb" in out and "threads" in out else None


class Workload:
    """The client's work, on threads of this process; counters and errors."""

    def __init__(self, cluster: Any, pool: str, name: str, rate: float, size: int, keep: int) -> None:
        self.cluster, self.pool, self.name = cluster, pool, name
        self.rate, self.size, self.keep = rate, size, keep
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self.error_samples: list[str] = []
        self.anomalies: list[str] = []
        #: recently acknowledged (position, data): bounded, the reader checks them
        self.recent: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=4096)
        self.logs: list[Log] = []
        self.threads = [threading.Thread(target=f, name=f"soak-{f.__name__}", daemon=True)
                        for f in (self.sync_appends, self.async_appends, self.batch_appends, self.streamer,
                                  self.reader, self.trimmer)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _open(self) -> Log:
        lg = Log.open(self.cluster, self.pool, self.name)
        with self.lock:
            self.logs.append(lg)
        return lg

    def _err(self, what: str, e: BaseException) -> None:
        with self.lock:
            self.errors[what] += 1
            if len(self.error_samples) < 20:
                self.error_samples.append(f"{what}: {type(e).__name__}: {e}")

    def _acked(self, what: str, pairs: list[tuple[int, bytes]]) -> None:
        with self.lock:
            self.counts[what] += len(pairs)
            self.recent.extend(pairs)

    def _pace(self, n: int, share: float) -> None:
        """Sleep for n entries at `share` of the rate."""
        self.stop.wait(n / max(self.rate * share, 1e-6))

    def _data(self, tag: str, k: int) -> bytes:
        head = b"%s-%d-" % (tag.encode(), k)
        return head + b"x" * max(0, self.size - len(head))

    def sync_appends(self) -> None:
        lg, k = self._open(), 0
        while not self.stop.is_set():
            d = self._data("s", k)
            k += 1
            try:
                self._acked("sync", [(lg.append(d), d)])
            except ZlogError as e:
                self._err("sync", e)
            self._pace(1, 0.2)

    def async_appends(self) -> None:
        lg, k = self._open(), 0
        while not self.stop.is_set():
            batch = [self._data("a", k + i) for i in range(32)]
            k += len(batch)
            futs = [(lg.append_async(d), d) for d in batch]
            got = []
            for f, d in futs:
                try:
                    got.append((f.result(timeout=120), d))
                except ZlogError as e:
                    self._err("async", e)
                except TimeoutError as e:
                    self._err("async-timeout", e)
            self._acked("async", got)
            self._pace(len(batch), 0.4)

    def batch_appends(self) -> None:
        lg, k = self._open(), 0
        while not self.stop.is_set():
            batch = [self._data("b", k + i) for i in range(16)]
            k += len(batch)
            try:
                self._acked("batch", list(zip(lg.append_many(batch), batch)))
            except ZlogError as e:
                self._err("batch", e)
            self._pace(len(batch), 0.4)

    def streamer(self) -> None:
        """Follows the log from its first position; positions must come in order."""
        lg = self._open()
        while not self.stop.is_set():
            try:
                last = None
                for rec in lg.stream(lg.first_position(), follow=True, hole_wait=5.0):
                    if last is not None and rec.position != last + 1:
                        with self.lock:
                            self.anomalies.append(f"stream: {last} then {rec.position}")
                    last = rec.position
                    with self.lock:
                        self.counts["streamed"] += 1
                    if self.stop.is_set():
                        return
            except ZlogError as e:
                # e.g. the trimmer passed the stream: start again where the log begins
                self._err("stream", e)
                self.stop.wait(0.5)

    def reader(self) -> None:
        lg = self._open()
        rnd = random.Random(7)
        while not self.stop.is_set():
            with self.lock:
                pick = self.recent[rnd.randrange(len(self.recent))] if self.recent else None
            if pick is None:
                self.stop.wait(0.1)
                continue
            pos, data = pick
            try:
                got = lg.read(pos)
                with self.lock:
                    self.counts["read"] += 1
                if got != data:
                    with self.lock:
                        self.anomalies.append(f"read {pos}: not what was acknowledged")
            except ZlogError as e:
                if not isinstance(e, Trimmed):  # the trimmer may pass an old pick
                    self._err("read", e)
            self.stop.wait(0.02)

    def trimmer(self) -> None:
        lg = self._open()
        while not self.stop.wait(10):
            try:
                tail = lg.tail()
                if tail > self.keep:
                    lg.trim_to(tail - self.keep)
                    with self.lock:
                        self.counts["trims"] += 1
            except ZlogError as e:
                self._err("trim", e)

    def end(self) -> None:
        self.stop.set()
        streamer = next(t for t in self.threads if t.name == "soak-streamer")
        for t in self.threads:
            if t is not streamer:
                t.join(150)
        # a following stream sees the stop flag only with its next record: give it one
        if streamer.is_alive() and self.logs:
            try:
                self.logs[0].append(b"soak: end")
            except ZlogError:
                pass
        streamer.join(30)
        for lg in self.logs:
            try:
                lg.close()
            except ZlogError:
                pass


def _means(series: list[dict[str, Any]], key: str) -> tuple[float, float] | None:
    vals = [s[key] for s in series]
    if len(vals) < 2:
        return None
    k = min(3, max(1, len(vals) // 3))
    return statistics.fmean(vals[:k]), statistics.fmean(vals[-k:])


def verdict(samples: list[dict[str, Any]], warmup: float) -> dict[str, Any]:
    """Per process: growth of each figure from just after the warm-up to the end."""
    by_proc: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for s in samples:
        for who, fig in s["procs"].items():
            by_proc[who].append({"t": s["t"], **fig})
    out: dict[str, Any] = {"limit": GROWTH_LIMIT, "warmup_s": warmup, "procs": {}, "ok": True, "judged": 0}
    for who, series in by_proc.items():
        born = series[0]["t"] if who != "client" else 0.0
        after = [s for s in series if s["t"] - born >= warmup]
        row: dict[str, Any] = {"samples": len(series), "samples_after_warmup": len(after)}
        means = {k: _means(after, k) for k in ("rss_kb", "fds", "threads")}
        if any(m is None for m in means.values()):
            row["judged"] = False  # too short a life after the warm-up to say
        else:
            row["judged"] = True
            out["judged"] += 1
            for k, m in means.items():
                assert m is not None
                first, last = m
                growth = (last - first) / first if first else 0.0
                ok = last <= first * (1 + GROWTH_LIMIT) + ABS_SLACK[k]
                row[k] = {"after_warmup": round(first, 1), "end": round(last, 1), "growth": round(growth, 4),
                          "ok": ok}
                out["ok"] = out["ok"] and ok
        out["procs"][who] = row
    if not out["judged"]:
        out["ok"] = None  # nothing lived long enough past the warm-up: no verdict
    return out


def run_soak(cluster: Any, conf: str, pool: str, seconds: float, sample_interval: float = 60.0,
             failover_every: float = 180.0, warmup: float = 300.0, rate: float = 300.0, size: int = 256,
             keep: int = 20000, lease: float = LEASE_S) -> dict[str, Any]:
    name = f"soak-{uuid.uuid4().hex[:8]}"
    logdir = Path(tempfile.mkdtemp(prefix="zlog-soak-"))
    group = f"soak-{uuid.uuid4().hex[:8]}"
    daemons = [Daemon(conf, pool, lease, logdir, group) for _ in range(2)]
    daemon_ids = {d.proc.pid: f"daemon-{i}" for i, d in enumerate(daemons)}
    lg = Log.create(cluster, pool, name, width=4, sequencer=daemons[0].address)
    lg.append(b"first")
    w = Workload(cluster, pool, name, rate, size, keep)
    samples: list[dict[str, Any]] = []
    failovers: list[dict[str, Any]] = []
    failures: list[str] = []
    t0 = time.monotonic()
    next_sample, next_failover, rounds = t0, t0 + failover_every, 0

    def sample() -> None:
        procs: dict[str, Any] = {}
        me = proc_sample(os.getpid())
        if me is not None:
            procs["client"] = me
        for d in daemons:
            s = proc_sample(d.proc.pid)
            if s is not None:
                procs[daemon_ids[d.proc.pid]] = s
        with w.lock:
            counts = dict(w.counts)
            errors = sum(w.errors.values())
        samples.append({"t": round(time.monotonic() - t0, 1), "procs": procs, "counts": counts, "errors": errors})
        console.print(f"[{samples[-1]['t']:7.0f}s] " + ", ".join(
            f"{who} rss {f['rss_kb'] // 1024} MiB fds {f['fds']} thr {f['threads']}" for who, f in procs.items()) +
            f"; acked {sum(counts.get(k, 0) for k in ('sync', 'async', 'batch')):,} errors {errors}")

    def failover() -> None:
        nonlocal rounds
        rounds += 1
        kind = "kill" if rounds % 3 == 0 else "pause"
        active_addr = lg.refresh().sequencer
        active = next((d for d in daemons if d.address == active_addr), None)
        if active is None:
            failures.append(f"failover {rounds}: the log's sequencer {active_addr!r} is none of the daemons")
            return
        f0 = time.monotonic()
        active.signal(signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        new = None
        while time.monotonic() - f0 < lease + 60:
            s = lg.refresh().sequencer
            if s and s != active_addr:
                new = s
                break
            time.sleep(0.05)
        took = time.monotonic() - f0
        if kind == "kill":
            active.proc.wait(10)
            daemons.remove(active)
            d = Daemon(conf, pool, lease, logdir, group)
            daemon_ids[d.proc.pid] = f"daemon-{len(daemon_ids)}"
            daemons.append(d)
        else:
            active.signal(signal.SIGCONT)  # it comes back and must step down
        failovers.append({"t": round(f0 - t0, 1), "kind": kind, "from": daemon_ids.get(active.proc.pid),
                          "to": new, "took_s": round(took, 2)})
        console.print(f"failover {rounds} ({kind}): {active_addr} -> {new} in {took:.2f}s")
        if new is None:
            failures.append(f"failover {rounds} ({kind}): no new sequencer within {lease + 60:.0f}s")

    w.start()
    try:
        while True:
            now = time.monotonic()
            if now >= next_sample:
                sample()
                next_sample += sample_interval
            if now - t0 >= seconds:
                break
            if failover_every > 0 and now >= next_failover:
                failover()
                next_failover = time.monotonic() + failover_every
            time.sleep(max(0.0, min(next_sample, next_failover if failover_every > 0 else next_sample,
                                    t0 + seconds) - time.monotonic()))
    finally:
        w.end()
        for d in daemons:
            d.end()
    stepped_down = sum(p.read_text(errors="replace").count("stepped down") for p in logdir.glob("*.log"))
    # the following stream must keep up: appends went on while it delivered nothing
    stalled = run_ = 0
    for a, b in zip(samples, samples[1:]):
        acked = sum(b["counts"].get(k, 0) - a["counts"].get(k, 0) for k in ("sync", "async", "batch"))
        run_ = run_ + 1 if acked > 0 and b["counts"].get("streamed", 0) == a["counts"].get("streamed", 0) else 0
        stalled = max(stalled, run_)
    if stalled >= 3 and stalled * sample_interval >= 120:  # a failover's hole wait is seconds, not minutes
        failures.append(f"the following stream delivered nothing for {stalled} sample intervals while appends "
                        f"went on (stopped at {samples[-1]['counts'].get('streamed', 0):,} records)")
    result: dict[str, Any] = {
        "log": name, "seconds": round(time.monotonic() - t0, 1), "planned_seconds": seconds,
        "sample_interval_s": sample_interval, "failover_every_s": failover_every, "lease_s": lease,
        "rate_per_s": rate, "entry_bytes": size, "kept_entries": keep,
        "counts": dict(w.counts), "errors": dict(w.errors), "error_samples": w.error_samples,
        "anomalies": w.anomalies[:20], "anomaly_count": len(w.anomalies),
        "failovers": failovers, "step_downs_logged": stepped_down, "stream_stalled_intervals": stalled,
        "failures": failures,
        "daemon_logs": str(logdir), "samples": samples, "verdict": verdict(samples, warmup),
    }
    return result


def format_soak(r: dict[str, Any]) -> str:
    v = r["verdict"]
    rows = [f"soak: {r['seconds'] / 60:.1f} min, {len(r['samples'])} samples, {len(r['failovers'])} failovers "
            f"({sum(f['kind'] == 'kill' for f in r['failovers'])} kill -9), "
            f"{sum(r['counts'].get(k, 0) for k in ('sync', 'async', 'batch')):,} appends acknowledged, "
            f"{r['counts'].get('streamed', 0):,} streamed, {r['counts'].get('read', 0):,} reads checked, "
            f"{sum(r['errors'].values())} errors, {r['anomaly_count']} anomalies",
            "", "| process | samples | RSS MiB after warm-up -> end | fds | threads | ok |",
            "| --- | ---: | --- | --- | --- | --- |"]
    for who, row in v["procs"].items():
        if not row["judged"]:
            rows.append(f"| {who} | {row['samples']} | (too short-lived after the warm-up to judge) | | | |")
            continue
        rows.append(f"| {who} | {row['samples']} | {row['rss_kb']['after_warmup'] / 1024:.1f} -> "
                    f"{row['rss_kb']['end'] / 1024:.1f} ({row['rss_kb']['growth']:+.1%}) | "
                    f"{row['fds']['after_warmup']:g} -> {row['fds']['end']:g} | "
                    f"{row['threads']['after_warmup']:g} -> {row['threads']['end']:g} | "
                    f"{'yes' if all(row[k]['ok'] for k in ('rss_kb', 'fds', 'threads')) else 'NO'} |")
    rows.append("")
    rows.append("verdict: " + {True: f"no growth beyond {v['limit']:.0%} after the warm-up",
                               False: "GROWTH beyond the limit", None: "none (run too short)"}[v["ok"]])
    if r["failures"]:
        rows.append("FAILED: " + "; ".join(r["failures"]))
    return "\n".join(rows)


def bench_soak(cluster: Any, conf: str, pool: str, seconds: float, out: str, **kw: Any) -> dict[str, Any]:
    from .bench import machine_info

    result = run_soak(cluster, conf, pool, seconds, **kw)
    result["machine"] = machine_info(cluster)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(format_soak(result))
    print(f"\nresults: {out}")
    if result["failures"] or result["anomaly_count"] or result["verdict"]["ok"] is False:
        raise ZlogError("soak: " + "; ".join(result["failures"] or
                                             (["anomalies found"] if result["anomaly_count"] else []) or
                                             ["growth beyond the limit"]))
    return result
