"""Benchmarks behind `zlog bench append|read|seqr`.

Each benchmark runs every case for a bounded time, prints a Markdown table
(stdout), shows a progress bar (stderr) and writes a JSON results file with
the figures, the parameters and the machine it ran on. `append` also plots
throughput against depth (PNG beside the JSON).

Baselines are raw librados operations of the same size, at the same depth, on
the same pool (no object class): the cost of zlog is the ratio to them.
"""
from __future__ import annotations

import json
import os
import statistics
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import Future
from pathlib import Path
from collections.abc import Iterable
from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from ..core.errors import ZlogError
from .cpu import CpuMeter

APPEND_TARGET_RATIO = 0.8
#: issue 26: await append at many tasks over append_async at the same depth
AIO_TARGET_RATIO = 0.9
READ_TARGET_RATIO = 5.0
#: raw objects the read baseline writes (and removes) at most
RAW_READ_OBJECTS = 4096

console = Console(stderr=True)

Done = Callable[[BaseException | None], None]


# ---------------------------------------------------------------- figures
def _pct(sorted_vals: list[float], q: float) -> float | None:
    if not sorted_vals:
        return None
    i = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[i]


def summarize(name: str, system: str, depth: int, ops: int, elapsed: float, size: int,
              latencies: list[float], **extra: Any) -> dict[str, Any]:
    """One case's figures. `latencies` are seconds per operation (or call)."""
    lat = sorted(latencies)
    el = max(elapsed, 1e-9)
    return {
        "name": name, "system": system, "depth": depth, "ops": ops, "elapsed_s": round(elapsed, 4),
        "ops_per_s": ops / el, "mb_per_s": ops * size / el / 1e6, "entry_bytes": size,
        "latency_ms": {
            "p50": None if not lat else _pct(lat, 0.50) * 1e3,  # type: ignore[operator]
            "p99": None if not lat else _pct(lat, 0.99) * 1e3,  # type: ignore[operator]
            "mean": None if not lat else sum(lat) / len(lat) * 1e3,
            "samples": len(lat),
        },
        **extra,
    }


#: one timed run of a case: (operations, elapsed seconds, latencies)
Run = tuple[int, float, list[float]]


def summarize_runs(name: str, system: str, depth: int, runs: list[Run], size: int,
                   **extra: Any) -> dict[str, Any]:
    """One case's figures over its rounds, with each round's rate."""
    c = summarize(name, system, depth, sum(x[0] for x in runs), sum(x[1] for x in runs), size,
                  [v for x in runs for v in x[2]], **extra)
    c["rounds_ops_per_s"] = [x[0] / x[1] for x in runs]
    return c


def round_ratios(a: list[Run], b: list[Run]) -> list[float]:
    """Rate of a over rate of b, round by round (the rounds alternate)."""
    return [(an / ae) / max(bn / be, 1e-9) for (an, ae, _), (bn, be, _) in zip(a, b)]


def _setup_line(r: dict[str, Any]) -> str:
    """The cluster and machine a result came from, and how it was timed."""
    p, m = r["params"], r["machine"]
    return (f"{m.get('cluster_osds', '?')} OSD(s) ({', '.join(m.get('objectstore', ['?']))}), "
            f"{m['nproc']} CPUs, {p['duration_s']:g} s per case in {p.get('rounds', 1)} alternating rounds")


# ----------------------------------------------------------------- drivers
class _Ticker:
    """Advances a progress task by wall time, at most every 0.1 s."""

    def __init__(self, progress: Progress | None, task: Any, duration: float) -> None:
        self.progress, self.task, self.duration = progress, task, duration
        self.t0 = time.perf_counter()
        self.next = 0.0

    def __call__(self, now: float) -> None:
        if self.progress is not None and now >= self.next:
            self.progress.update(self.task, completed=min(now - self.t0, self.duration))
            self.next = now + 0.1

    def finish(self) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=self.duration)


def run_sync(op: Callable[[int], Any], duration: float, tick: _Ticker) -> Run:
    """op(i) one at a time for `duration`: (ops, elapsed, latencies)."""
    lats: list[float] = []
    t0 = time.perf_counter()
    end = t0 + duration
    i = 0
    now = t0
    while now < end:
        ts = now
        op(i)
        now = time.perf_counter()
        lats.append(now - ts)
        i += 1
        tick(now)
    tick.finish()
    return i, now - t0, lats


#: run_append_async: one call in this many is timed to completion (the others run bare)
ASYNC_SAMPLE = 64


def run_async(start: Callable[[int, Done], None], depth: int, duration: float,
              tick: _Ticker, drain_timeout: float = 120.0) -> Run:
    """Keeps `depth` operations in flight for `duration`.

    start(i, done) begins operation i and arranges done(error or None) to be
    called when it completes; latency is from that call to done()."""
    sem = threading.Semaphore(depth)
    lats: list[float] = []
    errors: list[BaseException] = []
    t0 = time.perf_counter()
    end = t0 + duration
    i = 0
    now = t0
    while now < end and not errors:
        sem.acquire()
        ts = time.perf_counter()

        def done(err: BaseException | None, ts: float = ts) -> None:
            lats.append(time.perf_counter() - ts)
            if err is not None:
                errors.append(err)
            sem.release()

        try:
            start(i, done)
        except BaseException:
            sem.release()
            raise
        i += 1
        now = time.perf_counter()
        tick(now)
    deadline = time.monotonic() + drain_timeout
    for _ in range(depth):
        if not sem.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise ZlogError(f"benchmark: operations still in flight after {drain_timeout:.0f}s")
    elapsed = time.perf_counter() - t0
    tick.finish()
    if errors:
        raise errors[0]
    return len(lats), elapsed, lats


def run_aio(log: Any, data: bytes, tasks: int, duration: float, tick: _Ticker) -> Run:
    """`tasks` asyncio tasks each awaiting log's appends one after another
    for `duration` (pyzlog.aio on `log`, its window log's max_in_flight):
    (appends, elapsed, latencies of each await, the wait for room included)."""
    import asyncio

    from ..client.aio import AsyncLog

    async def main() -> Run:
        alog = AsyncLog(log)
        lats: list[float] = []
        t0 = time.perf_counter()
        end = t0 + duration

        async def worker() -> None:
            perf, append, lat = time.perf_counter, alog.append, lats.append
            now = perf()
            while now < end:
                await append(data)
                ts, now = now, perf()
                lat(now - ts)
            tick(now)

        await asyncio.gather(*[worker() for _ in range(tasks)])
        await alog.flush()
        elapsed = time.perf_counter() - t0
        tick.finish()
        return len(lats), elapsed, lats

    return asyncio.run(main())


def run_append_async(log: Any, data: bytes, duration: float, tick: _Ticker) -> Run:
    """append_async in a bare loop (what an application's loop costs: the
    log's max_in_flight keeps its depth), then flush(); one call in
    ASYNC_SAMPLE is timed to its completion. Not run_async: its semaphore
    and a callback per operation cost the client more than an append does."""
    lats: list[float] = []
    sampled = []
    append = log.append_async
    n = 0
    t0 = time.perf_counter()
    end = t0 + duration
    now = t0
    while now < end:
        for _ in range(ASYNC_SAMPLE - 1):
            append(data)
        ts = time.perf_counter()
        fut = append(data)
        fut.add_done_callback(lambda _f, ts=ts: lats.append(time.perf_counter() - ts))
        sampled.append(fut)
        n += ASYNC_SAMPLE
        now = time.perf_counter()
        tick(now)
    log.flush()
    elapsed = time.perf_counter() - t0
    for fut in sampled:
        fut.result()  # a failed append raises here, not as throughput
    tick.finish()
    return n, elapsed, lats


def _future_done(fut: Future[Any], done: Done) -> None:
    fut.add_done_callback(lambda f: done(f.exception()))


def _rados_done(done: Done, what: str) -> Callable[..., None]:
    def cb(completion: Any, *_: Any) -> None:
        ret = completion.get_return_value()
        done(None if ret >= 0 else ZlogError(f"raw {what}: errno {-ret}"))
    return cb


# ------------------------------------------------------------ environment
def machine_info(cluster: Any = None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["mem_gb"] = round(int(line.split()[1]) / 1024 / 1024, 1)
                break
    except OSError:
        pass
    if cluster is not None:
        try:
            ret, out, _ = cluster.mon_command(json.dumps({"prefix": "osd metadata", "format": "json"}),
                                              b"", timeout=10)
            if ret == 0:
                osds = json.loads(out)
                info["cluster_osds"] = len(osds)
                info["objectstore"] = sorted({o.get("osd_objectstore", "?") for o in osds})
                info["ceph_version"] = sorted({o.get("ceph_version_short") or o.get("ceph_version", "?")
                                               for o in osds})
        except Exception as e:  # noqa: BLE001 - machine info is best effort
            info["cluster_error"] = str(e)
        try:
            info["librados"] = ".".join(map(str, cluster.version()))
        except Exception:  # noqa: BLE001
            pass
    return info


def die_with_parent() -> list[str]:
    """A command prefix after which the kernel sends the server SIGTERM when
    the bench dies, even by SIGKILL, so no server a bench started outlives it
    (util-linux's setpriv execs the command: the pid stays the server's).
    Empty where setpriv is missing."""
    exe = shutil.which("setpriv")
    return [exe, "--pdeathsig", "TERM"] if exe else []


class ServerProcess:
    """A server a bench starts on a free loopback port: its output kept in a
    temporary file, stopped by its pid."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._log = tempfile.TemporaryFile()

    def output(self) -> str:
        """The last line it wrote."""
        self._log.seek(0)
        lines = self._log.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else ""

    def stop(self) -> None:
        """SIGTERM by pid (SIGKILL after 10 s); safe to call twice."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._log.close()


class SeqrProcess(ServerProcess):
    """A zlog-seqr subprocess on a free loopback port, serving `pool` (clients
    authenticated, as by default); stopped by its pid."""

    def __init__(self, conf: str, keyring: str | None, client: str, pool: str) -> None:
        super().__init__()
        self.conf, self.keyring, self.client, self.pool = conf, keyring, client, pool

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> "SeqrProcess":
        exe = shutil.which("zlog-seqr", path=str(Path(sys.executable).parent)) or shutil.which("zlog-seqr")
        if not exe:
            raise ZlogError("zlog-seqr not found next to this Python or on PATH")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        cmd = [*die_with_parent(), exe, "--port", str(self.port), "--conf", self.conf, "--client", self.client,
               "--log-level", "warning", "--pool", self.pool, "--no-standby"]
        if self.keyring:
            cmd += ["--keyring", self.keyring]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ZlogError(f"zlog-seqr exited with {self.proc.returncode}: {self.output()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise ZlogError(f"zlog-seqr did not listen within {timeout:.0f}s")



class _Bench:
    """What a Ceph benchmark needs: cluster, pool, a sequencer, cleanup."""

    def __init__(self, env: Any) -> None:
        from ..core.cluster import resolve_conf

        self.env = env
        self.cluster = env.cluster
        self.conf = resolve_conf(env.conf)
        self.pool = env.pool
        self.run_id = uuid.uuid4().hex[:12]
        self.seqr_proc: SeqrProcess | None = None
        self.seqr = env.seqr
        if not self.seqr:
            self.seqr_proc = SeqrProcess(self.conf, env.keyring, env.client, env.pool).start()
            self.seqr = self.seqr_proc.address
        from ..core.cluster import open_ioctx

        self.ioctx = open_ioctx(self.cluster, self.pool)
        self.raw_objects: list[str] = []
        self.logs: list[Any] = []
        self.log_names: list[str] = []

    def new_log(self, width: int, format: str = "data", slots: int | None = None) -> Any:
        from ..client.log import Log
        from ..core.metadata import DEFAULT_SLOTS

        name = f"bench-{self.run_id}-{uuid.uuid4().hex[:6]}"
        Log.create(self.cluster, self.pool, name, width=width, format=format,
                   slots=DEFAULT_SLOTS if slots is None else slots)
        self.log_names.append(name)
        return name

    def open(self, name: str, max_in_flight: int | None = None, coalesce: bool = True) -> Any:
        from ..client.log import Log

        kw = {} if max_in_flight is None else {"max_in_flight": max_in_flight}
        log = Log.open(self.cluster, self.pool, name, sequencer=self.seqr, coalesce=coalesce, **kw)
        self.logs.append(log)
        return log

    def raw_oid(self) -> str:
        oid = f"bench-{self.run_id}.raw.{len(self.raw_objects)}"
        self.raw_objects.append(oid)
        return oid

    def warm_up(self, log: Any) -> bool:
        """Appends until the sequencer serves the log; True if it does."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            log.append(b"warm-up")
            if log.positions.sequencer_usable():
                for _ in range(20):
                    log.append(b"warm-up")
                return True
            time.sleep(0.2)
        return False

    def close(self) -> None:
        for log in self.logs:
            try:
                log.close()
            except Exception:  # noqa: BLE001 - best effort
                pass
        try:
            if self.raw_objects:
                self.remove_raw()
            self._remove_logs()
        finally:
            try:
                self.ioctx.close()
            finally:
                if self.seqr_proc is not None:
                    self.seqr_proc.stop()

    def _remove_logs(self) -> None:
        """Delete the benchmark's own logs (every view's data objects and the
        metadata object), so runs do not fill a memstore dev cluster."""
        from ..core.cluster import open_ioctx
        from ..core.layout import META_NAMESPACE, view_objects
        from ..client.log import Log

        meta = open_ioctx(self.cluster, self.pool, META_NAMESPACE)
        try:
            for name in self.log_names:
                lg = Log.open(self.cluster, self.pool, name)
                views = lg.views
                lg.close()
                self._remove_objects([oid for v in views for oid in view_objects(name, v)], self.ioctx)
                self._remove_objects([name], meta)
        finally:
            meta.close()

    def remove_raw(self) -> None:
        self._remove_objects(self.raw_objects, self.ioctx)
        self.raw_objects.clear()

    @staticmethod
    def _remove_objects(oids: list[str], ioctx: Any) -> None:
        sem = threading.Semaphore(128)
        for oid in oids:
            sem.acquire()
            try:
                ioctx.aio_remove(oid, oncomplete=lambda *_: sem.release())
            except Exception:  # noqa: BLE001 - best effort
                sem.release()
        for _ in range(128):
            sem.acquire(timeout=30)


def _progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description:<28}"), BarColumn(), TextColumn("{task.fields[info]}"),
                    TimeRemainingColumn(), console=console, transient=False)


def _case_runner(progress: Progress, duration: float) -> Callable[[str], _Ticker]:
    def new(desc: str) -> _Ticker:
        return _Ticker(progress, progress.add_task(desc, total=duration, info=""), duration)
    return new


def _note(progress: Progress, tick: _Ticker, case: dict[str, Any]) -> None:
    progress.update(tick.task, info=f"{case['ops_per_s']:>10,.0f} ops/s")


def write_json(out: str, result: dict[str, Any]) -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return path


def _fmt(v: float | None, spec: str = ",.0f") -> str:
    return "-" if v is None else format(v, spec)


# ------------------------------------------------------------------- append
def bench_append(env: Any, *, duration: float = 10.0, rounds: int = 5, size: int = 1024,
                 depths: list[int] | None = None, batch: int = 64, width: int = 4,
                 aio_tasks: int = 1000, out: str = "results/bench-append.json") -> dict[str, Any]:
    """Append cases at each depth; at the deepest, `aio_tasks` asyncio tasks
    awaiting append (pyzlog.aio) in the same alternating rounds (0: none)."""
    depths = depths or [1, 16, 128]
    data = os.urandom(size)
    b = _Bench(env)
    meter = CpuMeter(b.conf)  # this process and the local OSDs, from /proc
    cases: dict[str, dict[str, Any]] = {}
    try:
        name = b.new_log(width)
        with _progress() as progress:
            new = _case_runner(progress, duration / rounds)
            warm = b.open(name)
            seqr_ok = b.warm_up(warm)
            slice_s = duration / rounds
            ratios_by_depth: dict[str, list[float]] = {}  # per round
            aio_vs_async: dict[str, Any] | None = None
            single_ratios: dict[str, float] = {}  # zlog without coalescing / raw
            for depth in depths:
                log = b.open(name, max_in_flight=depth)
                single = b.open(name, max_in_flight=depth, coalesce=False)
                zlog_runs: list[Run] = []
                single_runs: list[Run] = []
                bare_runs: list[Run] = []
                raw_runs: list[Run] = []
                aio_runs: list[Run] = []
                with_aio = aio_tasks > 0 and depth == max(depths) and depth > 1
                # zlog and raw alternate in short rounds, so a change in the
                # shared machine's speed hits both sides of each ratio alike
                for r in range(rounds):
                    tick = new(f"zlog append depth {depth} ({r + 1}/{rounds})")
                    started = meter.start()
                    if depth == 1:
                        zlog_runs.append(run_sync(lambda i: log.append(data), slice_s, tick))
                    else:
                        zlog_runs.append(run_async(
                            lambda i, done: _future_done(log.append_async(data), done), depth, slice_s, tick))
                        log.flush()
                        meter.stop(f"zlog_depth{depth}", started)
                        tick.finish()
                        # the same appends in a bare loop: the client's own cost, with no callback per op
                        tick = new(f"zlog append_async bare loop depth {depth} ({r + 1}/{rounds})")
                        started = meter.start()
                        bare_runs.append(run_append_async(log, data, slice_s, tick))
                        meter.stop(f"zlog_bare_depth{depth}", started)
                        tick.finish()
                        if with_aio:
                            # the same window, filled by asyncio tasks awaiting append
                            tick = new(f"zlog await append, {aio_tasks} tasks ({r + 1}/{rounds})")
                            started = meter.start()
                            aio_runs.append(run_aio(log, data, aio_tasks, slice_s, tick))
                            meter.stop(f"zlog_aio_tasks{aio_tasks}", started)
                        started = meter.start()
                        # the same without coalescing: one class write per entry
                        tick = new(f"zlog one write per entry depth {depth} ({r + 1}/{rounds})")
                        single_runs.append(run_async(
                            lambda i, done: _future_done(single.append_async(data), done), depth, slice_s, tick))
                        single.flush()
                        meter.stop(f"zlog_single_depth{depth}", started)
                    if depth == 1:
                        meter.stop(f"zlog_depth{depth}", started)
                    tick.finish()
                    tick = new(f"raw write_full depth {depth} ({r + 1}/{rounds})")
                    if depth == 1:
                        raw_runs.append(run_sync(lambda i: b.ioctx.write_full(b.raw_oid(), data), slice_s, tick))
                    else:
                        raw_runs.append(run_async(
                            lambda i, done: b.ioctx.aio_write_full(b.raw_oid(), data,
                                                                   oncomplete=_rados_done(done, "write")),
                            depth, slice_s, tick))
                    tick.finish()
                ratios_by_depth[str(depth)] = round_ratios(zlog_runs, raw_runs)
                if single_runs:
                    single_ratios[str(depth)] = statistics.median(round_ratios(single_runs, raw_runs))
                for system, runs, api in (("zlog", zlog_runs, "append" if depth == 1 else "append_async"),
                                          ("zlog_single", single_runs, "append_async(coalesce=False)"),
                                          ("zlog_bare", bare_runs, "append_async in a bare loop"),
                                          ("raw", raw_runs, "write_full" if depth == 1 else "aio_write_full")):
                    if runs:
                        key = f"{system}_depth{depth}"
                        cases[key] = summarize_runs(key, system, depth, runs, size, api=api)
                        if system != "raw":
                            cases[key]["cpu"] = meter.figures(key, cases[key]["ops"])
                if aio_runs:
                    key = f"zlog_aio_tasks{aio_tasks}"
                    cases[key] = summarize_runs(key, "zlog_aio", depth, aio_runs, size,
                                                api="await pyzlog.aio append", tasks=aio_tasks)
                    cases[key]["cpu"] = meter.figures(key, cases[key]["ops"])
                    aio_vs_async = {"tasks": aio_tasks, "depth": depth, "round_ratios": round_ratios(aio_runs, zlog_runs),
                                    "target_ratio": AIO_TARGET_RATIO}
                    aio_vs_async["ratio"] = statistics.median(aio_vs_async["round_ratios"])
                    aio_vs_async["target_met"] = aio_vs_async["ratio"] >= AIO_TARGET_RATIO

            log = b.open(name)
            tick = _case_runner(progress, duration)(f"zlog append_many x{batch}")
            entries = [data] * batch
            calls, el, lats = run_sync(lambda i: log.append_many(entries), duration, tick)
            cases[f"zlog_batch{batch}"] = c = summarize(
                f"zlog_batch{batch}", "zlog", 1, calls * batch, el, size, [], api="append_many", batch=batch,
                calls=calls)
            lat = sorted(lats)
            c["latency_ms"] = {"per": "call", "p50": _pct(lat, 0.5) * 1e3 if lat else None,  # type: ignore[operator]
                               "p99": _pct(lat, 0.99) * 1e3 if lat else None,  # type: ignore[operator]
                               "mean": sum(lat) / len(lat) * 1e3 if lat else None, "samples": len(lat)}
            _note(progress, tick, c)
        ratios = {d: statistics.median(rs) for d, rs in ratios_by_depth.items()}
        result: dict[str, Any] = {
            "kind": "append",
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "params": {"duration_s": duration, "rounds": rounds, "entry_bytes": size, "depths": depths,
                       "batch": batch, "aio_tasks": aio_tasks,
                       "width": width, "pool": b.pool,
                       # how the cases keep their depth: zlog_bare in the log's own window, the others
                       # (and raw) with a semaphore and a callback per operation, as aio awaits each
                       "bare_driver": f"bare loop, the log's max_in_flight as the window, "
                                      f"1 call in {ASYNC_SAMPLE} timed",
                       "driver": "run_async: a semaphore and a callback per operation"},
            "machine": machine_info(b.cluster),
            "log": name,
            "sequencer": {"address": b.seqr, "started_by_bench": b.seqr_proc is not None,
                          "served_appends": seqr_ok},
            "cases": cases,
            "ratios": ratios,
            "round_ratios": ratios_by_depth,
            "target_ratio": APPEND_TARGET_RATIO,
            "target_met": {d: r >= APPEND_TARGET_RATIO for d, r in ratios.items()},
            "ratios_one_write_per_entry": single_ratios,
            # await pyzlog.aio append (many tasks) over append_async, same depth, per round
            "aio_vs_append_async": aio_vs_async,
        }
    finally:
        b.close()
    png = str(Path(out).with_suffix(".png"))
    result["plot"] = plot_append(result, png)
    result["markdown"] = markdown_append(result)
    write_json(out, result)
    print(result["markdown"])
    print(f"\nresults: {out}\nplot:    {png}")
    return result


def markdown_append(r: dict[str, Any]) -> str:
    p = r["params"]
    lines = [f"Append, {p['entry_bytes']} B entries, width {p['width']}, {_setup_line(r)} "
             "(zlog/raw: median of the per-round ratios)",
             "",
             "| case | depth | ops/s | MB/s | p50 ms | p99 ms | zlog/raw | client CPU µs/entry |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    single = r.get("ratios_one_write_per_entry", {})
    labels = {"zlog": "zlog append_async", "zlog_single": "zlog append_async, coalesce=False",
              "zlog_bare": "zlog append_async, bare loop", "raw": "raw librados write_full"}
    for d in p["depths"]:
        for sysname in ("zlog", "zlog_bare", "zlog_single", "raw"):
            c = r["cases"].get(f"{sysname}_depth{d}")
            if c is None:
                continue
            ratio = {"zlog": f"{r['ratios'][str(d)]:.2f}",
                     "zlog_single": f"{single[str(d)]:.2f}" if str(d) in single else ""}.get(sysname, "")
            label = "zlog append" if sysname == "zlog" and d == 1 else labels[sysname]
            lines.append(f"| {label} | {d} | {_fmt(c['ops_per_s'])} | {_fmt(c['mb_per_s'], '.2f')} | "
                         f"{_fmt(c['latency_ms']['p50'], '.2f')} | {_fmt(c['latency_ms']['p99'], '.2f')} | "
                         f"{ratio} | {_fmt(c.get('cpu', {}).get('client_us_per_entry'), '.1f')} |")
    c = r["cases"][f"zlog_batch{p['batch']}"]
    lines.append(f"| zlog append_many (x{p['batch']}, per call) | 1 | {_fmt(c['ops_per_s'])} | "
                 f"{_fmt(c['mb_per_s'], '.2f')} | {_fmt(c['latency_ms']['p50'], '.2f')} | "
                 f"{_fmt(c['latency_ms']['p99'], '.2f')} | | {_fmt(c.get('cpu', {}).get('client_us_per_entry'), '.1f')} |")
    aio = r.get("aio_vs_append_async")
    if aio:
        c = r["cases"][f"zlog_aio_tasks{aio['tasks']}"]
        base = r["cases"][f"zlog_depth{aio['depth']}"]
        lines.insert(-1, f"| zlog await append ({aio['tasks']} asyncio tasks) | {aio['depth']} | "
                         f"{_fmt(c['ops_per_s'])} | {_fmt(c['mb_per_s'], '.2f')} | "
                         f"{_fmt(c['latency_ms']['p50'], '.2f')} | {_fmt(c['latency_ms']['p99'], '.2f')} | | "
                         f"{_fmt(c.get('cpu', {}).get('client_us_per_entry'), '.1f')} |")
        lines += ["", f"await append at {aio['tasks']} tasks / append_async at depth {aio['depth']}: "
                      f"{aio['ratio']:.2f} (median of rounds {', '.join(f'{x:.2f}' for x in aio['round_ratios'])}; "
                      f"target {aio['target_ratio']}); client CPU per entry: "
                      f"{_fmt(c.get('cpu', {}).get('client_us_per_entry'), '.1f')} µs vs "
                      f"{_fmt(base.get('cpu', {}).get('client_us_per_entry'), '.1f')} µs; "
                      f"machine busy {_fmt(c.get('cpu', {}).get('machine_busy'), '.0%')} vs "
                      f"{_fmt(base.get('cpu', {}).get('machine_busy'), '.0%')}"]
    return "\n".join(lines)


def plot_append(r: dict[str, Any], png: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    depths = r["params"]["depths"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for sysname, label, style in (("zlog", "zlog append", "o-"),
                                  ("zlog_single", "zlog append, coalesce=False", "^-"),
                                  ("raw", "raw librados write_full", "s--")):
        xs = [d for d in depths if f"{sysname}_depth{d}" in r["cases"]]
        if xs:
            ax.plot(xs, [r["cases"][f"{sysname}_depth{d}"]["ops_per_s"] for d in xs], style, label=label)
    batch = r["cases"].get(f"zlog_batch{r['params']['batch']}")
    if batch:
        ax.axhline(batch["ops_per_s"], color="gray", linestyle=":",
                   label=f"zlog append_many (batches of {r['params']['batch']})")
    if len(depths) > 1:
        ax.set_xscale("log", base=2)
    ax.set_xticks(depths)
    ax.set_xticklabels([str(d) for d in depths])
    ax.set_xlabel("operations in flight (depth)")
    ax.set_ylabel("appends / s")
    ax.set_title(f"Append throughput, {r['params']['entry_bytes']} B entries")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)
    return png


# --------------------------------------------------------------------- read
def _fill_log(log: Any, entries: int, data: bytes, progress: Progress) -> list[int]:
    task = progress.add_task(f"filling {entries} entries", total=entries, info="")
    positions: list[int] = []
    while len(positions) < entries:
        positions += log.append_many([data] * min(64, entries - len(positions)))
        progress.update(task, completed=len(positions))
    return positions


def _stream_passes(open_stream: Callable[[int, int], Iterable[Any]], lo: int, hi: int, size: int,
                   duration: float, tick: _Ticker, counts: dict[str, int]) -> Run:
    """Whole passes of open_stream(lo, hi) until `duration` is up: (entries, elapsed, [])."""
    n = 0
    t0 = time.perf_counter()
    end = t0 + duration
    now = t0
    while now < end:
        for rec in open_stream(lo, hi):
            if rec.data is not None and len(rec.data) == size:
                n += 1
            else:
                counts["gaps"] += 1
            if n % 256 == 0:
                now = time.perf_counter()
                tick(now)
                if now >= end:
                    break
        else:
            counts["full_passes"] += 1
        now = time.perf_counter()
    tick.finish()
    return n, now - t0, []


def _batch_passes(log: Any, lo: int, hi: int, size: int, duration: float, tick: _Ticker,
                  counts: dict[str, int]) -> Run:
    """Whole stream_batches() passes over [lo, hi): (entries, elapsed, [])."""
    n = 0
    t0 = time.perf_counter()
    end = t0 + duration
    now = t0
    while now < end:
        for batch in log.stream_batches(lo, hi):
            n += batch.num_rows - batch.column(1).null_count
            counts["gaps"] += batch.column(1).null_count
            now = time.perf_counter()
            tick(now)
            if now >= end:
                break
        else:
            counts["full_passes"] += 1
        now = time.perf_counter()
    tick.finish()
    return n, now - t0, []


def _write_raw_objects(b: _Bench, m: int, data: bytes, progress: Progress) -> list[str]:
    task = progress.add_task(f"raw: writing {m} objects", total=m, info="")
    oids = [b.raw_oid() for _ in range(m)]
    sem = threading.Semaphore(64)
    errs: list[BaseException] = []

    def written(e: BaseException | None) -> None:
        if e is not None:
            errs.append(e)
        sem.release()

    for i, oid in enumerate(oids):
        sem.acquire()
        b.ioctx.aio_write_full(oid, data, oncomplete=_rados_done(written, "write"))
        if i % 256 == 0:
            progress.update(task, completed=i)
    for _ in range(64):
        sem.acquire()
    if errs:
        raise errs[0]
    progress.update(task, completed=m)
    return oids


def bench_read(env: Any, *, duration: float = 6.0, rounds: int = 3, entries: int = 20000, size: int = 1024,
               depth: int = 16, width: int = 4, out: str = "results/bench-read.json") -> dict[str, Any]:
    data = os.urandom(size)
    b = _Bench(env)
    try:
        name = b.new_log(width)
        with _progress() as progress:
            new = _case_runner(progress, duration / rounds)
            log = b.open(name)
            alog = b.open(name, max_in_flight=depth)
            t0 = time.perf_counter()
            positions = _fill_log(log, entries, data, progress)
            fill_s = time.perf_counter() - t0
            lo, hi = min(positions), max(positions) + 1
            # raw baseline: objects of the same size, read at random
            m = min(entries, RAW_READ_OBJECTS)
            oids = _write_raw_objects(b, m, data, progress)
            rnd = random.Random(1)

            def raw_read(i: int, done: Done) -> None:
                def cb(completion: Any, buf: Any) -> None:
                    ret = completion.get_return_value()
                    done(None if ret >= 0 else ZlogError(f"raw aio_read: errno {-ret}"))
                b.ioctx.aio_read(oids[rnd.randrange(m)], size, 0, oncomplete=cb)

            # (case, label, system, depth, api, run(duration, tick))
            stream_counts = {"full_passes": 0, "gaps": 0}
            batch_counts = {"full_passes": 0, "gaps": 0}

            plan: list[tuple[str, str, str, int, str, Callable[[float, _Ticker], Any]]] = [
                ("zlog_stream", "zlog stream()", "zlog", 0, "stream",
                 lambda d, t: _stream_passes(log.stream, lo, hi, size, d, t, stream_counts)),
                ("zlog_stream_batches", "zlog stream_batches()", "zlog", 0, "stream_batches",
                 lambda d, t: _batch_passes(log, lo, hi, size, d, t, batch_counts)),
                ("zlog_read", "zlog read() random", "zlog", 1, "read",
                 lambda d, t: run_sync(lambda i: log.read(rnd.randrange(lo, hi)), d, t)),
                ("raw_read", "raw read depth 1", "raw", 1, "read",
                 lambda d, t: run_sync(lambda i: b.ioctx.read(oids[rnd.randrange(m)], size), d, t)),
                (f"zlog_read_async_depth{depth}", f"zlog read_async depth {depth}", "zlog", depth, "read_async",
                 lambda d, t: run_async(lambda i, done: _future_done(alog.read_async(rnd.randrange(lo, hi)), done),
                                        depth, d, t)),
                (f"raw_read_depth{depth}", f"raw aio_read depth {depth}", "raw", depth, "aio_read",
                 lambda d, t: run_async(raw_read, depth, d, t)),
            ]
            # every case runs in each round, so a change in the shared
            # machine's speed hits both sides of each ratio alike
            runs: dict[str, list[Run]] = {key: [] for key, *_ in plan}
            meter = CpuMeter(b.conf)
            for r in range(rounds):
                for key, label, *_, run in plan:
                    tick = new(f"{label} ({r + 1}/{rounds})")
                    started = meter.start()
                    runs[key].append(run(duration / rounds, tick))
                    meter.stop(key, started)
                    tick.finish()
            cases = {key: summarize_runs(key, system, d, runs[key], size, api=api)
                     for key, _, system, d, api, _ in plan}
            for key, case in cases.items():
                case["cpu"] = meter.figures(key, case["ops"])
            cases["zlog_stream"].update(stream_counts)
            cases["zlog_stream_batches"].update(batch_counts)

        def ratio(a: str, b_: str) -> float:
            return statistics.median(round_ratios(runs[a], runs[b_]))

        ratios = {
            "stream_vs_single_read": ratio("zlog_stream", "zlog_read"),
            "stream_batches_vs_stream": ratio("zlog_stream_batches", "zlog_stream"),
            "read_vs_raw": ratio("zlog_read", "raw_read"),
            f"read_async_vs_raw_depth{depth}": ratio(f"zlog_read_async_depth{depth}", f"raw_read_depth{depth}"),
            "stream_vs_raw_depth": ratio("zlog_stream", f"raw_read_depth{depth}"),
        }
        result: dict[str, Any] = {
            "kind": "read",
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "params": {"duration_s": duration, "rounds": rounds, "entries": entries, "entry_bytes": size,
                       "depth": depth, "width": width, "pool": b.pool, "raw_objects": m},
            "machine": machine_info(b.cluster),
            "log": name,
            "positions": [lo, hi],
            "fill_s": fill_s,
            "sequencer": {"address": b.seqr, "started_by_bench": b.seqr_proc is not None},
            "cases": cases,
            "ratios": ratios,
            "target_ratio": READ_TARGET_RATIO,
            "target_met": ratios["stream_vs_single_read"] >= READ_TARGET_RATIO,
        }
    finally:
        b.close()
    result["markdown"] = markdown_read(result)
    write_json(out, result)
    print(result["markdown"])
    print(f"\nresults: {out}")
    return result


def markdown_read(r: dict[str, Any]) -> str:
    p = r["params"]
    d = p["depth"]
    lines = [f"Read, {p['entries']} entries of {p['entry_bytes']} B, width {p['width']}, {_setup_line(r)} "
             "(ratios: median of the per-round ratios)",
             "",
             "| case | depth | entries/s | MB/s | p50 ms | p99 ms | client CPU µs/entry | OSD CPU µs/entry "
             "| OSD cores | CPUs busy |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    rows = [("zlog stream()", "zlog_stream"),
            ("zlog stream_batches() (Arrow)", "zlog_stream_batches"),
            ("zlog read() random", "zlog_read"),
            ("zlog read_async random", f"zlog_read_async_depth{d}"),
            ("raw librados read", "raw_read"), ("raw librados aio_read", f"raw_read_depth{d}")]
    for label, key in rows:
        c = r["cases"][key]
        cpu = c.get("cpu", {})
        lines.append(f"| {label} | {c['depth'] or '-'} | {_fmt(c['ops_per_s'])} | {_fmt(c['mb_per_s'], '.2f')} | "
                     f"{_fmt(c['latency_ms']['p50'], '.2f')} | {_fmt(c['latency_ms']['p99'], '.2f')} | "
                     f"{_fmt(cpu.get('client_us_per_entry'), '.2f')} | {_fmt(cpu.get('osd_us_per_entry'), '.2f')} | "
                     f"{_fmt(cpu.get('osd_cores'), '.2f')} | {_fmt(cpu.get('machine_busy'), '.0%')} |")
    ra = r["ratios"]
    lines.append("")
    lines.append(f"stream / single reads: **{ra['stream_vs_single_read']:.1f}x** "
                 f"(target >= {r['target_ratio']:g}); read_async / raw aio_read at depth {d}: "
                 f"{ra[f'read_async_vs_raw_depth{d}']:.2f} (target >= 0.9); stream_batches / stream(): "
                 f"{ra['stream_batches_vs_stream']:.1f}x")
    return "\n".join(lines)


# --------------------------------------------------------------------- seqr
def bench_seqr(duration: float = 3.0, processes: int = 2, depth: int = 128,
               out: str = "results/bench-seqr.json") -> dict[str, Any]:
    from .seqr_bench import format_seqr_bench, run_seqr_bench

    total = 13 * duration + 4
    stop = threading.Event()
    with _progress() as progress:
        task = progress.add_task("sequencer (11 cases)", total=total, info="")

        def advance() -> None:
            t0 = time.monotonic()
            while not stop.wait(0.1):
                progress.update(task, completed=min(time.monotonic() - t0, total * 0.99))

        th = threading.Thread(target=advance, daemon=True)
        th.start()
        try:
            result = run_seqr_bench(duration, processes, depth)
        finally:
            stop.set()
            th.join()
        progress.update(task, completed=total)
    result = {"kind": "seqr", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **result,
              "machine": machine_info(), "table": format_seqr_bench(result)}
    result["markdown"] = markdown_seqr(result)
    write_json(out, result)
    print(result["markdown"])
    print(f"\nresults: {out}")
    return result


def markdown_seqr(r: dict[str, Any]) -> str:
    lines = [f"Sequencer, {r['duration_s']:g} s per case, {r['machine']['nproc']} CPUs",
             "",
             "| case | conns | depth | count | requests/s | positions/s | latency us | vs echo | vs no auth |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for c in r["cases"].values():
        vs, va = c.get("vs_echo"), c.get("vs_noauth")
        lines.append(f"| {c['name']} | {c['connections']} | {c['depth']} | {c['count']} | "
                     f"{c['requests_per_s']:,.0f} | {c['positions_per_s']:,.0f} | "
                     f"{_fmt(c.get('latency_us'), '.1f')} | {'-' if vs is None else f'{vs:.2f}'} | "
                     f"{'-' if va is None else f'{va:.2f}'} |")
    lines.append("")
    lines.append(f"Authenticated / not, pipelined: {r['ratios']['pipelined_auth_vs_noauth']:.2f} "
                 f"(target >= {r['targets']['auth_vs_noauth']:g}); "
                 f"{r['processes']} processes: {r['ratios']['processes_auth_vs_noauth']:.2f}")
    for kind, h in r.get("handshake", {}).items():
        lines.append(f"Handshake ({kind}): {h['per_s']:,.0f} connections/s ({h['ms']:.2f} ms each)")
    return "\n".join(lines)
