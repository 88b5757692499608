"""`zlog bench peer`: pyzlog against Redis Streams on the same machine.

The bench starts its own `redis-server` (Debian's, which `./dev setup`
installs) on a free loopback port with persistence off, and stops it by its
pid at the end, error and Ctrl-C included. zlog, raw librados and Redis cases
then run alternately in rounds, so a change in the shared machine's speed
hits both sides of each ratio alike; each figure is the median of the rounds.

Per case it records entries/s, latency, the client's CPU (this process, with
librados' and redis-py's work), the server's CPU (the local OSDs for zlog and
raw cases, the redis-server process for Redis ones, and the sequencer when
the bench started it), all per entry, and how busy the machine was.

The raw cases write the same bytes in the same batch shape with plain
librados, so "OSD CPU per coalesced append" can be judged against what the
OSD needs to store those bytes at all: an omap set of `batch` 1 KB values
per op, and an object-data append of `batch` entries' bytes per op. When the
stripe splits an append_many call over several objects, a third raw case
writes in the shape the OSD then sees (batch / objects entries per op), so
the split's share of the gap shows apart from cls_zlog's own.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.errors import ZlogError
from .bench import (ASYNC_SAMPLE, Run, ServerProcess, run_append_async, _batch_passes, _Bench, _case_runner, _fmt, _progress, _rados_done, _setup_line,
                    _stream_passes, _Ticker, die_with_parent, machine_info, run_async, run_sync, summarize_runs,
                    write_json)
from .cpu import CpuMeter

#: the target of issue 23: OSD CPU per coalesced append <= this x the raw batch write
OSD_TARGET_RATIO = 2.0
#: entries per XRANGE call; zlog's range reads also ask for 1024 entries per object call
XRANGE_COUNT = 1024
#: entries a raw object takes before the next one is used (4 MiB of 1 KB
#: entries, RADOS's usual object size), so raw objects stay bounded
RAW_OBJECT_ENTRIES = 4096
#: the Redis stream field an entry is stored under
FIELD = b"d"
#: the rate ratios reported: name -> (zlog case, the Redis case it is measured against)
COMPARED = {
    "append_async_vs_xadd": ("zlog_append_async", "redis_xadd_pipelined"),
    "append_many_vs_xadd": ("zlog_append_many", "redis_xadd_pipelined"),
    "append_vs_single_xadd": ("zlog_append", "redis_xadd"),
    "stream_vs_xrange": ("zlog_stream", "redis_xrange"),
    "stream_batches_vs_xrange": ("zlog_stream_batches", "redis_xrange"),
}
#: what RADOS itself gives a client in a zlog case's pattern, against the same Redis case: the
#: ceiling of that zlog case on this machine (append_many is one call of `batch` at a time)
CEILINGS = {
    "raw_append_one_at_a_time_vs_xadd": ("raw_append_sync", "redis_xadd_pipelined"),
}


# ------------------------------------------------------------ redis-server
class RedisServer(ServerProcess):
    """A redis-server of our own on a free loopback port, persistence off."""

    def __init__(self) -> None:
        super().__init__()
        self._dir = tempfile.TemporaryDirectory(prefix="zlog-bench-redis-")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, timeout: float = 20.0) -> RedisServer:
        exe = shutil.which("redis-server")
        if exe is None:
            raise ZlogError("redis-server is not installed: run ./dev setup (it installs Debian's redis-server)")
        try:
            import redis
        except ImportError:
            raise ZlogError("redis-py is not installed: run ./dev setup (the bench extra has it)") from None
        # a free port can be taken between our probe and the server's bind: try a few
        for _ in range(3):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            cmd = [*die_with_parent(), exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--daemonize", "no", "--dir", self._dir.name]
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
            client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)
            deadline = time.monotonic() + timeout
            try:
                while time.monotonic() < deadline and self.proc.poll() is None:
                    try:
                        if client.ping():
                            return self
                    except (redis.ConnectionError, redis.TimeoutError):  # not listening yet, or a slow start
                        time.sleep(0.05)
            finally:
                client.close()
            if self.proc.poll() is None:
                self.stop()
                raise ZlogError(f"redis-server did not answer on port {self.port} within {timeout:.0f}s")
        code = self.proc.returncode if self.proc is not None else None
        raise ZlogError(f"redis-server exited with {code}: {self.output()}")

    def stop(self) -> None:
        super().stop()
        self._dir.cleanup()


def _on_sigterm_interrupt() -> Any:
    """Make SIGTERM raise KeyboardInterrupt (in the main thread only, where
    Python delivers signals); returns the handler to put back, or None."""
    def interrupt(_sig: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave SIGTERM alone
        return None


# ------------------------------------------------------------------ drivers
def _entries(run: Run, per_op: int) -> Run:
    """A run of operations that store `per_op` entries each, counted in
    entries: (entries, elapsed, latency per operation)."""
    ops, elapsed, lats = run
    return ops * per_op, elapsed, lats


def _xrange_passes(client: Any, key: str, count: int, duration: float, tick: _Ticker,
                   counts: dict[str, int]) -> Run:
    """Whole XRANGE scans of the stream, `count` entries per call: (entries, elapsed, [])."""
    n = 0
    t0 = time.perf_counter()
    end = t0 + duration
    now = t0
    while now < end:
        lo: bytes | str = "-"
        while True:
            batch = client.xrange(key, min=lo, max="+", count=count)
            n += len(batch)
            now = time.perf_counter()
            tick(now)
            if len(batch) < count:
                counts["full_passes"] += 1
                break
            if now >= end:
                break
            lo = b"(" + batch[-1][0]  # exclusive: after the last id read
    tick.finish()
    return n, now - t0, []


class _RawBatches:
    """Raw librados batch writes of the zlog cases' bytes and shape: `batch`
    entries per op, striped over `width` objects like a log's entries, each
    object taking at most RAW_OBJECT_ENTRIES entries."""

    def __init__(self, b: _Bench, batch: int, width: int, data: bytes) -> None:
        self.b, self.batch, self.width = b, batch, width
        self.values = tuple([data] * batch)
        self.blob = data * batch
        self.ops = 0
        self._oids: dict[tuple[int, int], str] = {}

    def forget_objects(self) -> None:
        """After the bench removed its raw objects: later ops make new ones."""
        self._oids.clear()

    def _next(self) -> tuple[str, int]:
        """The object of the next op and its first entry's number."""
        k = self.ops
        self.ops += 1
        first = k * self.batch
        key = (k % self.width, first // (RAW_OBJECT_ENTRIES * self.width))
        oid = self._oids.get(key)
        if oid is None:
            oid = self._oids[key] = self.b.raw_oid()
        return oid, first

    def omap_set(self, _i: int, done: Any) -> None:
        import rados

        oid, first = self._next()
        keys = tuple(f"{p:016x}" for p in range(first, first + self.batch))  # zlog's key form
        with rados.WriteOpCtx() as op:
            self.b.ioctx.set_omap(op, keys, self.values)
            # the op is copied into the request: releasing it on return is safe
            self.b.ioctx.operate_aio_write_op(op, oid, oncomplete=_rados_done(done, "omap set"))

    def append(self, _i: int, done: Any) -> None:
        oid, _ = self._next()
        self.b.ioctx.aio_append(oid, self.blob, oncomplete=_rados_done(done, "append"))

    def append_sync(self, _i: int) -> None:
        """One batch's append, waited for: append_many's pattern, with no class in it."""
        oid, _ = self._next()
        self.b.ioctx.append(oid, self.blob)


class _ClientCounts:
    """The client's own counters (pyzlog.client.metrics), read through a
    registry of our own: entries stored, and the C++ append path's class
    calls, so a case can say how many entries went out per OSD op."""

    NAMES = ("appends", "native_class_calls", "native_entries_sent", "native_sequencer_requests")

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        from ..client import metrics

        self.registry = metrics.register(CollectorRegistry())

    def snap(self) -> dict[str, float | None]:
        return {n: self.registry.get_sample_value(f"zlog_client_{n}_total") for n in self.NAMES}

    @staticmethod
    def delta(a: dict[str, float | None], b: dict[str, float | None]) -> dict[str, float | None]:
        return {k: None if a.get(k) is None or b.get(k) is None else b[k] - a[k]  # type: ignore[operator]
                for k in b}


def _entry_layout(b: _Bench, log: Any, data: bytes) -> dict[str, Any]:
    """Where this build of cls_zlog keeps an entry: omap values or object data.
    The OSD ratio is taken against the raw write of the same kind."""
    import rados

    try:
        oid = log.oid_of(log.append(data))
        size, _ = b.ioctx.stat(oid)
        with rados.ReadOpCtx() as op:
            it, _ = b.ioctx.get_omap_vals(op, "", "", 100_000)
            b.ioctx.operate_read_op(op, oid)
            keys = sum(1 for _ in it)
    except Exception as e:  # noqa: BLE001 - a layout we cannot see: say so, and compare with both
        return {"layout": "unknown", "error": str(e)}
    layout = "data" if size >= len(data) else "omap" if keys else "unknown"
    return {"layout": layout, "object": oid, "object_bytes": size, "omap_keys": keys}


# -------------------------------------------------------------------- cases
@dataclass
class _Case:
    key: str
    label: str
    system: str  # zlog, raw or redis
    depth: int  # entries in flight (or per call)
    api: str
    run: Callable[[float, _Ticker], Run]
    latency_per: str = "entry"


def _kb(n: int) -> str:
    return f"{n // 1024} KB" if n % 1024 == 0 else f"{n} B"


def _median(vals: list[float | None]) -> float | None:
    return None if not vals or any(v is None for v in vals) else statistics.median(vals)  # type: ignore[type-var]


def _median_figures(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each CPU figure's median over the rounds (None if a round lacks it)."""
    return {k: _median([r.get(k) for r in rounds]) if k != "local_osds" else rounds[0][k] for k in rounds[0]}


def bench_peer(env: Any, *, duration: float = 5.0, rounds: int = 5, size: int = 1024, depth: int = 128,
               batch: int = 64, width: int = 4, entries: int = 20000, read_batch: int = XRANGE_COUNT,
               out: str = "results/bench-peer.json") -> dict[str, Any]:
    data = os.urandom(size)
    fields = {FIELD: data}
    # SIGTERM, like Ctrl-C, stops our servers and removes our logs on the way out
    old_term = _on_sigterm_interrupt()
    server = RedisServer()
    b: _Bench | None = None
    rc: Any = None
    try:
        server.start()  # first: a missing redis-server fails before any Ceph work
        import redis

        b = _Bench(env)
        rc = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=60)
        xadd_key, read_key = f"bench-{b.run_id}:append", f"bench-{b.run_id}:read"
        name, read_name = b.new_log(width), b.new_log(width)
        # the omap format (round 2's, and what a class without the data format
        # makes) in the same run: the baseline of the format's OSD figures
        omap_name, omap_read_name = b.new_log(width, "omap"), b.new_log(width, "omap")
        seqr_pid = b.seqr_proc.proc.pid if b.seqr_proc is not None and b.seqr_proc.proc else None
        with _progress() as progress:
            slice_s = duration / rounds
            new = _case_runner(progress, slice_s)
            # --- set-up, not timed: the sequencer serving both logs, the C++
            # append path started, and the same entries in both read sources
            log = b.open(name)
            seqr_ok = b.warm_up(log)
            alog = b.open(name, max_in_flight=depth)
            for _ in range(depth * 2):
                alog.append_async(data)
            alog.flush()
            layout = _entry_layout(b, log, data)
            # objects per append_many call, over a few calls: a stripe in runs
            # puts a call in one object, or two where it crosses a run's end
            calls = [log.append_many([data] * batch) for _ in range(8)]
            many_objects = statistics.mean(len({log.oid_of(p) for p in call}) for call in calls)
            # entries per OSD op of append_many when the stripe splits a call
            # over several objects (0: one op per call, the raw cases' shape)
            split = round(batch / many_objects) if many_objects > 1 else 0
            olog = b.open(omap_name)
            b.warm_up(olog)
            oalog = b.open(omap_name, max_in_flight=depth)
            for _ in range(depth * 2):
                oalog.append_async(data)
            oalog.flush()
            rlog = b.open(read_name)
            b.warm_up(rlog)
            lo, hi = _fill_read_sources(rlog, rc, read_key, data, entries, batch, depth, progress)
            orlog = b.open(omap_read_name)
            b.warm_up(orlog)
            olo, ohi = _fill_log(orlog, data, entries, batch)
            omap_counts = {"full_passes": 0, "gaps": 0}
            rc.xadd(xadd_key, fields)  # the key exists before its first timed case
            pipe = rc.pipeline(transaction=False)

            # one each, so omap sets and appends never share an object
            omap_raw, append_raw = _RawBatches(b, batch, width, data), _RawBatches(b, batch, width, data)
            # raw ops in flight: the same entries in flight as append_async at `depth`
            raw_depth = max(1, depth // batch)
            entries_many = [data] * batch
            stream_counts = {"full_passes": 0, "gaps": 0}
            batch_counts = {"full_passes": 0, "gaps": 0}
            xrange_counts = {"full_passes": 0}

            def xadd_pipelined(_i: int) -> None:
                for _ in range(depth):
                    pipe.xadd(xadd_key, fields)
                pipe.execute()

            # zlog and Redis alternate; each raw batch write follows the zlog
            # appends it is the baseline of
            plan = [
                _Case("zlog_append_async", f"zlog append_async, depth {depth}", "zlog", depth, "append_async",
                      lambda d, t: run_append_async(alog, data, d, t)),
                _Case("redis_xadd_pipelined", f"Redis XADD, pipelined ({depth})", "redis", depth,
                      "XADD pipeline", lambda d, t: _entries(run_sync(xadd_pipelined, d, t), depth),
                      f"pipeline of {depth}"),
                _Case("zlog_append_many", f"zlog append_many of {batch}", "zlog", batch, "append_many",
                      lambda d, t: _entries(run_sync(lambda i: log.append_many(entries_many), d, t), batch),
                      f"call of {batch}"),
                _Case("zlog_append_async_omap", f"zlog append_async, depth {depth}, omap format", "zlog", depth,
                      "append_async", lambda d, t: run_append_async(oalog, data, d, t)),
                _Case("zlog_append_many_omap", f"zlog append_many of {batch}, omap format", "zlog", batch,
                      "append_many",
                      lambda d, t: _entries(run_sync(lambda i: olog.append_many(entries_many), d, t), batch),
                      f"call of {batch}"),
                _Case("raw_omap", f"raw omap set, {batch} keys per op", "raw", raw_depth * batch,
                      "WriteOp set_omap (aio)",
                      lambda d, t: _entries(run_async(omap_raw.omap_set, raw_depth, d, t), batch),
                      f"op of {batch}"),
                _Case("raw_append", f"raw object-data append, {_kb(batch * size)} per op", "raw",
                      raw_depth * batch, "aio_append",
                      lambda d, t: _entries(run_async(append_raw.append, raw_depth, d, t), batch),
                      f"op of {batch}"),
                _Case("raw_append_sync", f"raw object-data append, {_kb(batch * size)} per op, one at a time",
                      "raw", batch, "append", lambda d, t: _entries(run_sync(append_raw.append_sync, d, t), batch),
                      f"op of {batch}"),
            ]
            split_raw = _RawBatches(b, max(split, 1), width, data)
            by_data = layout["layout"] == "data"
            if split:
                # the same layout as the entries, in the shape append_many sent:
                # how much of the gap to the raw batch write is the split
                plan.append(_Case(
                    "raw_split", (f"raw object-data append, {_kb(split * size)} per op" if by_data else
                                  f"raw omap set, {split} keys per op") + " (append_many's shape)", "raw",
                    max(1, depth // split) * split, "aio_append" if by_data else "WriteOp set_omap (aio)",
                    lambda d, t: _entries(run_async(split_raw.append if by_data else split_raw.omap_set,
                                                    max(1, depth // split), d, t), split), f"op of {split}"))
            # append_async's own shape: as many entries per op as its last
            # round sent per class call (the pipeline's counters), so its OSD
            # cost is judged against the raw write of the same bytes and shape
            shape = _AsyncShape(b, width, data, depth, max(split, 1), by_data)
            plan.append(_Case("raw_async_shape", ("raw object-data append" if by_data else "raw omap set")
                              + " in append_async's shape", "raw", depth, "aio_append" if by_data
                              else "WriteOp set_omap (aio)", shape.run, "op"))
            plan += [
                _Case("zlog_append", "zlog append, one at a time", "zlog", 1, "append",
                      lambda d, t: run_sync(lambda i: log.append(data), d, t)),
                _Case("redis_xadd", "Redis XADD, one at a time", "redis", 1, "XADD",
                      lambda d, t: run_sync(lambda i: rc.xadd(xadd_key, fields), d, t)),
                _Case("zlog_stream", "zlog stream()", "zlog", 0, "stream",
                      lambda d, t: _stream_passes(rlog.stream, lo, hi, size, d, t, stream_counts)),
                _Case("redis_xrange", f"Redis XRANGE, batches of {read_batch}", "redis", 0, "XRANGE COUNT",
                      lambda d, t: _xrange_passes(rc, read_key, read_batch, d, t, xrange_counts)),
                _Case("zlog_stream_batches", "zlog stream_batches()", "zlog", 0, "stream_batches",
                      lambda d, t: _batch_passes(rlog, lo, hi, size, d, t, batch_counts)),
                _Case("zlog_stream_batches_omap", "zlog stream_batches(), omap format", "zlog", 0, "stream_batches",
                      lambda d, t: _batch_passes(orlog, olo, ohi, size, d, t, omap_counts)),
            ]
            others = {"redis": [server.pid]} if server.pid else {}
            if seqr_pid:
                others["seqr"] = [seqr_pid]
            meter = CpuMeter(b.conf, others)
            counts = _ClientCounts()
            runs: dict[str, list[Run]] = {c.key: [] for c in plan}
            cpu_rounds: dict[str, list[dict[str, Any]]] = {c.key: [] for c in plan}
            client_rounds: dict[str, list[dict[str, float | None]]] = {c.key: [] for c in plan}
            for r in range(rounds):
                for c in plan:
                    tick = new(f"{c.label} ({r + 1}/{rounds})")
                    before = counts.snap()
                    started = meter.start()
                    run = c.run(slice_s, tick)
                    meter.stop(f"{c.key}#{r}", started)
                    client_rounds[c.key].append(_ClientCounts.delta(before, counts.snap()))
                    runs[c.key].append(run)
                    cpu_rounds[c.key].append(meter.figures(f"{c.key}#{r}", run[0]))
                    if c.key == "zlog_append_async":
                        shape.measured(_per_op(client_rounds[c.key][-1:]))
                    progress.update(tick.task, info=f"{run[0] / max(run[1], 1e-9):>10,.0f} entries/s")
                # between rounds, untimed: Redis keeps only this round's appends
                # and the raw objects go (XADD's and a raw write's cost do not
                # depend on what came before), so a memstore OSD and
                # redis-server stay small however long the run
                rc.delete(xadd_key)
                rc.xadd(xadd_key, fields)
                b.remove_raw()
                for r_ in (omap_raw, append_raw, split_raw, *shape.raws.values()):
                    r_.forget_objects()

        cases = _summarize(plan, runs, cpu_rounds, client_rounds, size)
        cases["zlog_append_many"]["entries_per_osd_op"] = batch / many_objects
        for key in ("raw_omap", "raw_append", "raw_append_sync"):
            cases[key]["entries_per_osd_op"] = float(batch)
        if split:
            cases["raw_split"]["entries_per_osd_op"] = float(split)
        cases["raw_async_shape"]["entries_per_osd_op"] = statistics.mean(shape.used) if shape.used else None
        cases["raw_async_shape"]["entries_per_op_rounds"] = shape.used
        cases["zlog_stream"].update(stream_counts)
        cases["zlog_stream_batches"].update(batch_counts)
        cases["zlog_stream_batches_omap"].update(omap_counts)
        cases["redis_xrange"].update(xrange_counts)

        ratios = {k: _rate_ratio(cases[a], cases[b_]) for k, (a, b_) in COMPARED.items()}
        ceilings = {k: _rate_ratio(cases[a], cases[b_]) for k, (a, b_) in CEILINGS.items()}
        result: dict[str, Any] = {
            "kind": "peer",
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "params": {"duration_s": duration, "rounds": rounds, "entry_bytes": size, "depth": depth,
                       "batch": batch, "width": width, "entries": entries, "read_batch": read_batch,
                       "raw_ops_in_flight": raw_depth, "raw_object_entries": RAW_OBJECT_ENTRIES,
                       "async_latency_sample": ASYNC_SAMPLE, "pool": b.pool},
            "machine": {**machine_info(b.cluster), **_redis_info(rc)},
            "redis": {"pid": server.pid, "port": server.port,
                      "command": "redis-server --port P --bind 127.0.0.1 --save '' --appendonly no "
                                 "--daemonize no"},
            "sequencer": {"address": b.seqr, "started_by_bench": b.seqr_proc is not None, "pid": seqr_pid,
                          "served_appends": seqr_ok},
            "logs": {"append": name, "read": read_name, "append_omap": omap_name, "read_omap": omap_read_name},
            "read_positions": [lo, hi],
            "entry_layout": layout,
            "rates": "entries_per_s: median of the rounds' rates; ops_per_s: all rounds together",
            "cases": cases,
            "ratios": ratios,
            "ratio_cases": {k: list(v) for k, v in COMPARED.items()},
            "ceilings": ceilings,
            "ceiling_cases": {k: list(v) for k, v in CEILINGS.items()},
            "osd_ratios": _osd_ratios(cases, cpu_rounds, layout["layout"], batch, size),
            "format_ratios": _format_ratios(cpu_rounds),
        }
    finally:
        try:
            if rc is not None:
                rc.close()
            if b is not None:
                b.close()
        finally:
            server.stop()
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
    result["markdown"] = markdown_peer(result)
    write_json(out, result)
    print(result["markdown"])
    print(f"\nresults: {out}")
    return result


def _fill_read_sources(rlog: Any, rc: Any, key: str, data: bytes, entries: int, batch: int, depth: int,
                       progress: Any) -> tuple[int, int]:
    """The same `entries` entries in the read log and the Redis stream `key`:
    the log's positions [lo, hi)."""
    task = progress.add_task(f"filling {entries} entries x2", total=2 * entries, info="")
    positions: list[int] = []
    while len(positions) < entries:
        positions += rlog.append_many([data] * min(batch, entries - len(positions)))
        progress.update(task, completed=len(positions))
    rc.delete(key)
    pipe = rc.pipeline(transaction=False)
    filled = 0
    while filled < entries:
        k = min(depth, entries - filled)
        for _ in range(k):
            pipe.xadd(key, {FIELD: data})
        pipe.execute()
        filled += k
        progress.update(task, completed=entries + filled)
    return min(positions), max(positions) + 1


def _fill_log(log: Any, data: bytes, entries: int, batch: int) -> tuple[int, int]:
    positions: list[int] = []
    while len(positions) < entries:
        positions += log.append_many([data] * min(batch, entries - len(positions)))
    return min(positions), max(positions) + 1


#: the data format's cases and the omap format's, compared by OSD CPU per entry
FORMAT_PAIRS = {"append_many": ("zlog_append_many", "zlog_append_many_omap"),
                "append_async": ("zlog_append_async", "zlog_append_async_omap"),
                "stream_batches": ("zlog_stream_batches", "zlog_stream_batches_omap")}
#: issue 23's read target: OSD CPU per entry of a range read <= this x the omap format's
READ_TARGET_RATIO = 1 / 3


def _format_ratios(cpu_rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """OSD CPU per entry of each case in the data format over the same case in
    the omap format (median of the per-round ratios; the rounds alternate)."""
    out: dict[str, Any] = {}
    for name, (data_case, omap_case) in FORMAT_PAIRS.items():
        vals = [(x.get("osd_us_per_entry"), y.get("osd_us_per_entry"))
                for x, y in zip(cpu_rounds[data_case], cpu_rounds[omap_case])]
        r = None if not vals or any(x is None or not y for x, y in vals) else \
            float(statistics.median(x / y for x, y in vals))  # type: ignore[operator]
        out[name] = {"data_vs_omap_osd": r}
    r = out["stream_batches"]["data_vs_omap_osd"]
    out["stream_batches"].update(target=READ_TARGET_RATIO, target_met=None if r is None else r <= READ_TARGET_RATIO)
    return out


def _summarize(plan: list[_Case], runs: dict[str, list[Run]], cpu_rounds: dict[str, list[dict[str, Any]]],
               client_rounds: dict[str, list[dict[str, float | None]]], size: int) -> dict[str, dict[str, Any]]:
    """Each case's figures: bench's summary, rates and CPU as medians of the rounds."""
    cases: dict[str, dict[str, Any]] = {}
    for c in plan:
        case = summarize_runs(c.key, c.system, c.depth, runs[c.key], size, api=c.api, label=c.label,
                              latency_per=c.latency_per)
        case["entries_per_s"] = statistics.median(case["rounds_ops_per_s"])
        case["cpu"] = _median_figures(cpu_rounds[c.key])
        case["cpu_rounds"] = cpu_rounds[c.key]
        # the server that stored or served this case's entries
        case["server"] = "redis-server" if c.system == "redis" else "osd"
        case["server_us_per_entry"] = case["cpu"]["redis_us_per_entry" if c.system == "redis"
                                                  else "osd_us_per_entry"]
        cases[c.key] = case
    _check_stored(cases, client_rounds)
    cases["zlog_append"]["entries_per_osd_op"] = 1.0
    cases["zlog_append_async"]["entries_per_osd_op"] = _per_op(client_rounds["zlog_append_async"])
    return cases


class _AsyncShape:
    """The raw case in append_async's shape: each round writes as many
    entries per op as append_async's run just before it sent per class call
    (rounded), `depth` entries in flight."""

    def __init__(self, b: _Bench, width: int, data: bytes, depth: int, first: int, by_data: bool) -> None:
        self.b, self.width, self.data, self.depth, self.by_data = b, width, data, depth, by_data
        self.entries = first  # until append_async has been measured
        self.raws: dict[int, _RawBatches] = {}
        self.used: list[int] = []

    def measured(self, per_op: float | None) -> None:
        if per_op:
            self.entries = max(1, round(per_op))

    def run(self, duration: float, tick: Any) -> Run:
        k = self.entries
        self.used.append(k)
        raw = self.raws.get(k)
        if raw is None:
            raw = self.raws[k] = _RawBatches(self.b, k, self.width, self.data)
        return _entries(run_async(raw.append if self.by_data else raw.omap_set, max(1, self.depth // k),
                                  duration, tick), k)


def _rate_ratio(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Median of the per-round ratios of a's rate to b's (the rounds alternate)."""
    return float(statistics.median(x / max(y, 1e-9) for x, y in zip(a["rounds_ops_per_s"], b["rounds_ops_per_s"])))


def _per_op(rounds: list[dict[str, float | None]]) -> float | None:
    """Entries per class call of the C++ append path over the rounds."""
    sent = [r.get("native_entries_sent") for r in rounds]
    calls = [r.get("native_class_calls") for r in rounds]
    if any(v is None for v in sent + calls) or not sum(calls):  # type: ignore[arg-type]
        return None
    return sum(sent) / sum(calls)  # type: ignore[arg-type]


def _check_stored(cases: dict[str, dict[str, Any]], client_rounds: dict[str, list[dict[str, float | None]]]) -> None:
    """Every zlog append a case counted was stored (the client's own count)."""
    for key in ("zlog_append_async", "zlog_append_many", "zlog_append"):
        stored = [r.get("appends") for r in client_rounds[key]]
        if any(v is None for v in stored):
            continue  # a client without the counter: the futures' results were checked
        cases[key]["stored"] = int(sum(stored))  # type: ignore[arg-type]
        if cases[key]["stored"] < cases[key]["ops"]:
            raise ZlogError(f"bench peer: {key} counted {cases[key]['ops']} appends but the client stored "
                            f"{cases[key]['stored']}")


def _osd_ratios(cases: dict[str, dict[str, Any]], cpu_rounds: dict[str, list[dict[str, Any]]], layout: str,
                batch: int, size: int) -> dict[str, Any]:
    """OSD CPU per entry of each coalesced append over that of a raw batch
    write of the same bytes (median of the per-round ratios)."""
    def per_round(a: str, b: str) -> float | None:
        vals = [(x.get("osd_us_per_entry"), y.get("osd_us_per_entry")) for x, y in zip(cpu_rounds[a], cpu_rounds[b])]
        if not vals or any(x is None or not y for x, y in vals):
            return None  # the OSDs are not on this host: no OSD figures
        return float(statistics.median(x / y for x, y in vals))  # type: ignore[operator]

    if layout == "omap":
        base, why = "raw_omap", ("cls_zlog keeps each entry as an omap value: the raw omap set of "
                                 f"{batch} values per op is the same storage work for the same bytes")
    elif layout == "data":
        base, why = "raw_append", ("cls_zlog keeps entries in object data: the raw append of "
                                   f"{batch * size} bytes per op is the same storage work for the same bytes")
    else:
        osd = {k: cases[k]["cpu"]["osd_us_per_entry"] for k in ("raw_omap", "raw_append")}
        base = min(osd, key=lambda k: osd[k] if osd[k] is not None else float("inf"))
        why = "where cls_zlog keeps entries could not be seen: the cheaper raw write of the two"
    out: dict[str, Any] = {"baseline": base, "why": why, "target": OSD_TARGET_RATIO}
    for case in ("zlog_append_many", "zlog_append_async"):
        vs = {f"vs_{raw}": per_round(case, raw) for raw in ("raw_omap", "raw_append")}
        r = vs[f"vs_{base}"]
        out[case] = {**vs, "ratio": r, "target_met": None if r is None else r <= OSD_TARGET_RATIO,
                     "entries_per_osd_op": cases[case].get("entries_per_osd_op"),
                     "baseline_entries_per_osd_op": float(batch)}
    if "raw_async_shape" in cases:
        out["zlog_append_async"]["vs_raw_async_shape"] = per_round("zlog_append_async", "raw_async_shape")
    if "raw_split" in cases:
        out["zlog_append_many"]["vs_raw_split"] = per_round("zlog_append_many", "raw_split")
        out["same_shape"] = {
            "case": "raw_split",
            "why": "the stripe splits an append_many call over several objects, so the OSD sees "
                   f"{cases['raw_split']['entries_per_osd_op']:g} entries per op, not {batch}: the raw write "
                   "of the same layout in that shape tells the split's share of the gap from cls_zlog's"}
    return out


def _redis_info(rc: Any) -> dict[str, Any]:
    import redis
    from redis.utils import HIREDIS_AVAILABLE

    info: dict[str, Any] = {"redis_py": redis.__version__,
                            "redis_py_parser": "hiredis" if HIREDIS_AVAILABLE else "python"}
    try:
        s = rc.info("server")
        info["redis_server"] = s.get("redis_version")
        info["redis_io_threads"] = rc.config_get("io-threads").get("io-threads")
    except Exception as e:  # noqa: BLE001 - best effort, like machine_info
        info["redis_error"] = str(e)
    return info


# ----------------------------------------------------------------- markdown
def markdown_peer(r: dict[str, Any]) -> str:
    p, m, cs, ra = r["params"], r["machine"], r["cases"], r["ratios"]
    lines = [f"pyzlog and Redis Streams, {p['entry_bytes']} B entries, width {p['width']}, {_setup_line(r)} "
             f"(figures: medians of the rounds); redis-server {m.get('redis_server', '?')} with persistence off, "
             f"redis-py {m.get('redis_py', '?')} ({m.get('redis_py_parser', '?')} parser)",
             "",
             "| case | entries/s | vs Redis | p50 ms | p99 ms | client CPU µs/entry | server CPU µs/entry "
             "| CPUs busy |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    rows = [("zlog_append_async", ra["append_async_vs_xadd"]), ("zlog_append_many", ra["append_many_vs_xadd"]),
            ("redis_xadd_pipelined", 1.0), ("zlog_append", ra["append_vs_single_xadd"]), ("redis_xadd", 1.0),
            ("zlog_stream", ra["stream_vs_xrange"]), ("zlog_stream_batches", ra["stream_batches_vs_xrange"]),
            ("redis_xrange", 1.0)]
    for key, vs in rows:
        c = cs[key]
        lat = c["latency_ms"]
        per = "" if c["latency_per"] == "entry" else f" (latency per {c['latency_per']})"
        lines.append(f"| {c['label']}{per} | {_fmt(c['entries_per_s'])} | {vs:.2f} | {_fmt(lat['p50'], '.2f')} | "
                     f"{_fmt(lat['p99'], '.2f')} | {_fmt(c['cpu']['client_us_per_entry'], '.1f')} | "
                     f"{_fmt(c['server_us_per_entry'], '.1f')} | {_fmt(c['cpu']['machine_busy'], '.0%')} |")
    lines += ["",
              "vs Redis: appends against pipelined XADD (the one-at-a-time append against one-at-a-time XADD), "
              "streams against XRANGE; the median of the per-round ratios. Server CPU: the OSD for zlog, "
              "redis-server for Redis.",
              "",
              "Where the append time goes (OSD and client CPU per entry, from /proc/PID/stat):",
              "",
              "| case | entries/s | entries per OSD op | OSD µs/entry | client µs/entry | sequencer µs/entry "
              "| OSD vs raw |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    o = r["osd_ratios"]
    for key in ("zlog_append", "zlog_append_async", "zlog_append_many", "zlog_append_async_omap",
                "zlog_append_many_omap", "raw_omap", "raw_append", "raw_append_sync", "raw_split",
                "raw_async_shape"):
        if key not in cs:
            continue
        c = cs[key]
        vs = o.get(key, {}).get("ratio")
        lines.append(f"| {c['label']} | {_fmt(c['entries_per_s'])} | {_fmt(c.get('entries_per_osd_op'), '.1f')} | "
                     f"{_fmt(c['cpu']['osd_us_per_entry'], '.1f')} | {_fmt(c['cpu']['client_us_per_entry'], '.1f')} | "
                     f"{_fmt(c['cpu'].get('seqr_us_per_entry'), '.2f')} | {_fmt(vs, '.2f')} |")
    base = o["baseline"]
    other = "raw_append" if base == "raw_omap" else "raw_omap"
    many, aio = o["zlog_append_many"], o["zlog_append_async"]
    lines += ["",
              f"OSD CPU per coalesced append against the {cs[base]['label']} (target <= {o['target']:g}): "
              f"append_many {_fmt(many['ratio'], '.2f')}, append_async {_fmt(aio['ratio'], '.2f')}; "
              f"why that baseline: {o['why']}. Against the {cs[other]['label']}: append_many "
              f"{_fmt(many[f'vs_{other}'], '.2f')}, append_async {_fmt(aio[f'vs_{other}'], '.2f')}."]
    if "same_shape" in o:
        lines[-1] += (f" In the shape append_many sent ({_fmt(many['entries_per_osd_op'], 'g')} entries per op: "
                      f"the stripe splits a call over objects), against the {cs['raw_split']['label']}: "
                      f"append_many {_fmt(many['vs_raw_split'], '.2f')}.")
    if "vs_raw_async_shape" in aio:
        lines[-1] += (f" In the shape append_async sent ({_fmt(aio['entries_per_osd_op'], '.1f')} entries per op), "
                      f"against the {cs['raw_async_shape']['label']}: append_async "
                      f"{_fmt(aio['vs_raw_async_shape'], '.2f')}.")
    ce = r.get("ceilings", {}).get("raw_append_one_at_a_time_vs_xadd")
    if ce is not None:
        lines += ["",
                  f"The ceiling of append_many here: the {cs['raw_append_sync']['label']} (append_many's pattern: "
                  f"one call waited for, then the next, no class, no sequencer) runs at {_fmt(ce, '.2f')}x "
                  f"pipelined XADD, against {_fmt(ra['append_many_vs_xadd'], '.2f')}x for append_many."]
    f = r.get("format_ratios")
    if f:
        sb = cs.get("zlog_stream_batches_omap")
        lines += ["",
                  "The data format against the omap format (OSD CPU per entry, data / omap, same run): "
                  f"append_many {_fmt(f['append_many']['data_vs_omap_osd'], '.2f')}, append_async "
                  f"{_fmt(f['append_async']['data_vs_omap_osd'], '.2f')}, stream_batches "
                  f"{_fmt(f['stream_batches']['data_vs_omap_osd'], '.2f')} (read target <= "
                  f"{f['stream_batches']['target']:.2f})" + (
                      f"; stream_batches in the omap format ran at {_fmt(sb['entries_per_s'])} entries/s, "
                      f"OSD {_fmt(sb['cpu']['osd_us_per_entry'], '.2f')} µs/entry" if sb else "") + "."]
    return "\n".join(lines)
