"""Micro-benchmark of the native read path (pyzlog.fastread) against today's.

`bench_fastread(env)` runs, in alternating rounds against one cluster:

- single-position reads at depth 16: the native ReadQueue (one op per read,
  and one op per object for the reads sent together), its Future-per-read
  form (`Reads`, the shape of `Log.read_async`), today's `Log.read_async`,
  and raw python-rados `aio_read` of objects of the same size;
- range scans of a whole log decoded into Arrow record batches (`ViewScan`)
  against today's `Log.stream()` on the same log, with 1 KB and 16 B entries.

Ratios are medians of the per-round ratios; results go to a JSON file
(default results/bench-fastread.json). Phase 2 hooks this into `zlog bench
read`; until then: `python -m pyzlog.tools.fastread_bench --conf ceph.conf`.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from .bench import (
    Done,
    Run,
    _Bench,
    _case_runner,
    _fill_log,
    _fmt,
    _future_done,
    _progress,
    _setup_line,
    _Ticker,
    _write_raw_objects,
    machine_info,
    round_ratios,
    run_async,
    summarize_runs,
    write_json,
)
from ..core.errors import ZlogError

READ_TARGET = 0.9    # native single reads / raw aio_read at depth 16
SCAN_TARGET = 3.0    # native scan to Arrow / Log.stream(), entries/s


def _native_reads(queue: Any, pool: Any, oid_of: Callable[[int], bytes], epoch: int,
                  pick: Callable[[], int], depth: int, duration: float, tick: _Ticker,
                  coalesce: bool) -> Run:
    """Keep `depth` reads in flight through one ReadQueue for `duration`: one
    thread submits and waits, no Python callback per read. With `coalesce`,
    the reads sent together for one object share one op (read_many)."""
    sent_at: dict[int, float] = {}
    lats: list[float] = []
    tag = 0
    t0 = time.perf_counter()
    end = t0 + duration
    now = t0

    def send(k: int) -> None:
        nonlocal tag
        ts = time.perf_counter()
        if not coalesce:
            for _ in range(k):
                pos = pick()
                queue.read(pool, oid_of(pos), epoch, pos, tag)
                sent_at[tag] = ts
                tag += 1
            return
        by_oid: dict[bytes, tuple[list[int], list[int]]] = {}
        for _ in range(k):
            pos = pick()
            ps, ts_ = by_oid.setdefault(oid_of(pos), ([], []))
            ps.append(pos)
            ts_.append(tag)
            sent_at[tag] = ts
            tag += 1
        for oid, (ps, tags) in by_oid.items():
            queue.read_many(pool, oid, epoch, ps, tags)

    send(depth)
    while True:
        results = queue.wait(30.0)
        if not results:
            raise ZlogError("native reads: no result in 30 s")
        now = time.perf_counter()
        for t, code, value in results:
            if code:
                raise ZlogError(f"native read: errno {-code}")
            lats.append(now - sent_at.pop(t))
        tick(now)
        if now < end:
            send(len(results))
        elif not sent_at:
            break
    tick.finish()
    return len(lats), now - t0, lats


def _native_scan(native: Any, pool: Any, log: Any, lo: int, hi: int, size: int, duration: float,
                 tick: _Ticker, counts: dict[str, float], per_call: int, ahead: int) -> Run:
    """Whole scans of [lo, hi) into Arrow batches until `duration` is up."""
    from ..core.fastread import STOP_MISSING, ViewScan
    from ..core.layout import view_objects

    oids = view_objects(log.name, log.views[-1])
    n = 0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    end = t0 + duration
    now = t0
    while now < end:
        scan = ViewScan(native.queue(), pool, oids, log.epoch, lo, hi, per_call=per_call, ahead=ahead)
        try:
            while True:
                built = scan.next_batch()
                batch = built.batch
                rows = batch.num_rows
                data = batch.column(1)
                if data.null_count or rows and len(data.buffers()[2] or b"") != rows * size:
                    counts["gaps"] += data.null_count or 1
                n += rows
                now = time.perf_counter()
                tick(now)
                if built.stop == STOP_MISSING:
                    raise ZlogError(f"scan stopped at unwritten position {built.stop_position}")
                if scan.position >= hi or now >= end:
                    break
            if scan.position >= hi:
                counts["full_passes"] += 1
        finally:
            scan.close()
    tick.finish()
    counts["client_cpu_s"] += time.process_time() - cpu0
    return n, now - t0, []


def _stream_passes(log: Any, lo: int, hi: int, size: int, duration: float, tick: _Ticker,
                   counts: dict[str, float]) -> Run:
    """Whole Log.stream() passes over [lo, hi) until `duration` is up."""
    n = 0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    end = t0 + duration
    now = t0
    while now < end:
        for rec in log.stream(lo, hi):
            if rec.data is None or len(rec.data) != size:
                counts["gaps"] += 1
            n += 1
            if n % 256 == 0:
                now = time.perf_counter()
                tick(now)
                if now >= end:
                    break
        else:
            counts["full_passes"] += 1
        now = time.perf_counter()
    tick.finish()
    counts["client_cpu_s"] += time.process_time() - cpu0
    return n, now - t0, []


def bench_fastread(env: Any, *, duration: float = 12.0, rounds: int = 4, entries: int = 20000,
                   small_entries: int = 100000, size: int = 1024, small_size: int = 16, depth: int = 16,
                   width: int = 4, per_call: int = 1024, ahead: int = 4,
                   out: str = "results/bench-fastread.json") -> dict[str, Any]:
    """Run every case, `duration` seconds each split over `rounds` alternating rounds."""
    from ..core.fastread import Native, Reads

    b = _Bench(env)
    native = Native.of(b.cluster)
    pool = native.pool(b.pool)
    try:
        with _progress() as progress:
            new = _case_runner(progress, duration / rounds)
            name = b.new_log(width)
            log = b.open(name)
            alog = b.open(name, max_in_flight=depth)
            positions = _fill_log(log, entries, os.urandom(size), progress)
            lo, hi = min(positions), max(positions) + 1
            small_name = b.new_log(width)
            small = b.open(small_name)
            small_pos = _fill_log(small, small_entries, os.urandom(small_size), progress)
            slo, shi = min(small_pos), max(small_pos) + 1
            m = min(entries, 4096)
            raw_oids = _write_raw_objects(b, m, os.urandom(size), progress)
            rnd = random.Random(1)
            oid_bytes: dict[int, bytes] = {p % width: log.oid_of(p).encode() for p in range(lo, lo + width)}

            def oid_of(p: int) -> bytes:  # one view: the object is p % width
                return oid_bytes[p % width]

            def pick() -> int:
                return rnd.randrange(lo, hi)

            reads = Reads(native)

            def raw_read(i: int, done: Done) -> None:
                def cb(completion: Any, buf: Any) -> None:
                    ret = completion.get_return_value()
                    done(None if ret >= 0 else ZlogError(f"raw aio_read: errno {-ret}"))
                b.ioctx.aio_read(raw_oids[rnd.randrange(m)], size, 0, oncomplete=cb)

            def future_read(i: int, done: Done) -> None:
                pos = pick()
                fut = reads.read(pool, oid_of(pos), log.epoch, pos)
                fut.add_done_callback(lambda f: done(None if f.result()[0] == 0 else
                                                     ZlogError(f"read: errno {-f.result()[0]}")))

            counts: dict[str, dict[str, float]] = {
                k: {"full_passes": 0, "gaps": 0, "client_cpu_s": 0.0}
                for k in ("scan_1k", "stream_1k", "scan_16", "stream_16")}
            d = depth
            plan: list[tuple[str, str, str, int, str, int, Callable[[float, _Ticker], Run]]] = [
                (f"native_read_depth{d}", f"native read depth {d}", "native", d, "ReadQueue.read", size,
                 lambda t, k: _native_reads(native.queue(), pool, oid_of, log.epoch, pick, d, t, k, False)),
                (f"native_read_many_depth{d}", f"native read_many depth {d}", "native", d, "ReadQueue.read_many",
                 size, lambda t, k: _native_reads(native.queue(), pool, oid_of, log.epoch, pick, d, t, k, True)),
                (f"native_futures_depth{d}", f"native Future/read depth {d}", "native", d, "Reads.read", size,
                 lambda t, k: run_async(future_read, d, t, k)),
                (f"zlog_read_async_depth{d}", f"Log.read_async depth {d}", "zlog", d, "Log.read_async", size,
                 lambda t, k: run_async(lambda i, done: _future_done(alog.read_async(pick()), done), d, t, k)),
                (f"raw_aio_read_depth{d}", f"raw aio_read depth {d}", "raw", d, "aio_read", size,
                 lambda t, k: run_async(raw_read, d, t, k)),
                ("native_scan_1k", f"native scan {size} B", "native", 0, "ViewScan", size,
                 lambda t, k: _native_scan(native, pool, log, lo, hi, size, t, k, counts["scan_1k"], per_call,
                                           ahead)),
                ("stream_1k", f"Log.stream() {size} B", "zlog", 0, "Log.stream", size,
                 lambda t, k: _stream_passes(log, lo, hi, size, t, k, counts["stream_1k"])),
                ("native_scan_16", f"native scan {small_size} B", "native", 0, "ViewScan", small_size,
                 lambda t, k: _native_scan(native, pool, small, slo, shi, small_size, t, k, counts["scan_16"],
                                           per_call, ahead)),
                ("stream_16", f"Log.stream() {small_size} B", "zlog", 0, "Log.stream", small_size,
                 lambda t, k: _stream_passes(small, slo, shi, small_size, t, k, counts["stream_16"])),
            ]
            runs: dict[str, list[Run]] = {key: [] for key, *_ in plan}
            for r in range(rounds):
                for key, label, *_, run in plan:
                    tick = new(f"{label} ({r + 1}/{rounds})")
                    runs[key].append(run(duration / rounds, tick))
                    tick.finish()
            reads.close()
            cases = {key: summarize_runs(key, system, dep, runs[key], sz, api=api)
                     for key, _, system, dep, api, sz, _ in plan}
            for k, c in counts.items():
                case = cases["native_" + k if k.startswith("scan") else k]
                case.update(c)
                # the client process's CPU (all its threads, librados' included) per entry
                case["client_cpu_us_per_entry"] = c["client_cpu_s"] / max(case["ops"], 1) * 1e6

        def ratio(a: str, b_: str) -> tuple[float, list[float]]:
            per_round = round_ratios(runs[a], runs[b_])
            return statistics.median(per_round), per_round

        ratios: dict[str, float] = {}
        for k in ("1k", "16"):  # client CPU per entry, stream over native scan
            ratios[f"client_cpu_stream_vs_scan_{k}"] = (cases[f"stream_{k}"]["client_cpu_us_per_entry"]
                                                         / max(cases[f"native_scan_{k}"]["client_cpu_us_per_entry"],
                                                               1e-9))
        round_r: dict[str, list[float]] = {}
        for key, a, b_ in (("native_read_vs_raw", f"native_read_depth{d}", f"raw_aio_read_depth{d}"),
                           ("native_read_many_vs_raw", f"native_read_many_depth{d}", f"raw_aio_read_depth{d}"),
                           ("native_futures_vs_raw", f"native_futures_depth{d}", f"raw_aio_read_depth{d}"),
                           ("read_async_vs_raw", f"zlog_read_async_depth{d}", f"raw_aio_read_depth{d}"),
                           ("scan_vs_stream_1k", "native_scan_1k", "stream_1k"),
                           ("scan_vs_stream_16", "native_scan_16", "stream_16")):
            ratios[key], round_r[key] = ratio(a, b_)
        result: dict[str, Any] = {
            "kind": "fastread",
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "params": {"duration_s": duration, "rounds": rounds, "entries": entries, "entry_bytes": size,
                       "small_entries": small_entries, "small_entry_bytes": small_size, "depth": depth,
                       "width": width, "per_call": per_call, "ahead": ahead, "pool": b.pool,
                       "raw_objects": m},
            "machine": machine_info(b.cluster),
            "logs": {name: [lo, hi], small_name: [slo, shi]},
            "cases": cases,
            "ratios": ratios,
            "round_ratios": round_r,
            "targets": {"native_read_vs_raw": READ_TARGET, "scan_vs_stream_1k": SCAN_TARGET,
                        "scan_vs_stream_16": SCAN_TARGET},
        }
        result["targets_met"] = {k: ratios[k] >= t for k, t in result["targets"].items()}
    finally:
        b.close()
    result["markdown"] = markdown_fastread(result)
    write_json(out, result)
    print(result["markdown"])
    print(f"\nresults: {out}")
    return result


def markdown_fastread(r: dict[str, Any]) -> str:
    p = r["params"]
    d = p["depth"]
    lines = [f"Native read path, width {p['width']}, {_setup_line(r)} (ratios: median of the per-round ratios)",
             "",
             "| case | entry B | depth | entries/s | MB/s | p50 ms | p99 ms | client CPU us/entry |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    rows = [("native ReadQueue.read (one op per read)", f"native_read_depth{d}"),
            ("native ReadQueue.read_many (one op per object)", f"native_read_many_depth{d}"),
            ("native Reads.read (a Future per read)", f"native_futures_depth{d}"),
            ("today's Log.read_async", f"zlog_read_async_depth{d}"),
            ("raw python-rados aio_read", f"raw_aio_read_depth{d}"),
            ("native ViewScan to Arrow", "native_scan_1k"), ("today's Log.stream()", "stream_1k"),
            ("native ViewScan to Arrow", "native_scan_16"), ("today's Log.stream()", "stream_16")]
    for label, key in rows:
        c = r["cases"][key]
        lines.append(f"| {label} | {c['entry_bytes']} | {c['depth'] or '-'} | {_fmt(c['ops_per_s'])} | "
                     f"{_fmt(c['mb_per_s'], '.2f')} | {_fmt(c['latency_ms']['p50'], '.2f')} | "
                     f"{_fmt(c['latency_ms']['p99'], '.2f')} | {_fmt(c.get('client_cpu_us_per_entry'), '.2f')} |")
    ra, t = r["ratios"], r["targets"]
    reads = (f"native read / raw aio_read at depth {d}: **{ra['native_read_vs_raw']:.2f}** "
             f"(target >= {t['native_read_vs_raw']:g}); one op per object: {ra['native_read_many_vs_raw']:.2f}; "
             f"a Future per read: {ra['native_futures_vs_raw']:.2f}; today's read_async: "
             f"{ra['read_async_vs_raw']:.2f}")
    scans = (f"scan to Arrow / stream(): **{ra['scan_vs_stream_1k']:.1f}x** with {p['entry_bytes']} B entries, "
             f"**{ra['scan_vs_stream_16']:.1f}x** with {p['small_entry_bytes']} B entries "
             f"(target >= {t['scan_vs_stream_1k']:g}); client CPU per entry: "
             f"{ra['client_cpu_stream_vs_scan_1k']:.1f}x and {ra['client_cpu_stream_vs_scan_16']:.1f}x less")
    lines += ["", reads, scans]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from ..admin.cli import Env

    ap = argparse.ArgumentParser(prog="python -m pyzlog.tools.fastread_bench", description=__doc__.split("\n")[0])
    ap.add_argument("--conf", default=os.environ.get("CEPH_CONF"))
    ap.add_argument("--pool", default="zlog")
    ap.add_argument("--seqr", default=None, help="HOST:PORT (default: start one)")
    ap.add_argument("--keyring", default=None)
    ap.add_argument("--client", default="client.admin")
    ap.add_argument("--duration", type=float, default=12.0, help="seconds per case, over all rounds")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--entries", type=int, default=20000)
    ap.add_argument("--small-entries", type=int, default=100000)
    ap.add_argument("--per-call", type=int, default=1024, help="entries per read_range call of the native scan")
    ap.add_argument("--ahead", type=int, default=4, help="read_range calls in flight per object (native scan)")
    ap.add_argument("--out", default="results/bench-fastread.json")
    a = ap.parse_args(argv)
    env = Env(a.conf, a.pool, a.seqr, a.keyring, a.client, None)
    try:
        bench_fastread(env, duration=a.duration, rounds=a.rounds, entries=a.entries,
                       small_entries=a.small_entries, per_call=a.per_call, ahead=a.ahead, out=a.out)
    except ZlogError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
