"""Spark read throughput against the client's own stream, on one log.

    python -m pyzlog.bench.spark_bench --conf $CEPH_CONF --pool zlog [--entries 1000000]

Creates (or reuses) a log of `entries` small entries named bench-spark-<entries>,
then, in each of --rounds alternating rounds, times a single-process
log.stream() over the range and spark.read.format("zlog")...count() under local[1] and local[2] (a
session each), and reports rows/s and the medians of the per-round ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from ..core.cluster import connect
from ..core.errors import LogNotFound
from ..client.log import Log
from .bench import _fmt
from .cpu import CpuMeter

LOAD_BATCH = 16384


def ensure_bench_log(cluster: Any, pool: str, entries: int, size: int, width: int = 4) -> tuple[Log, float | None]:
    """The bench log with at least `entries` entries, and the load time if it was (re)filled."""
    name = f"bench-spark-{entries}"
    try:
        log = Log.open(cluster, pool, name)
    except LogNotFound:
        log = Log.create(cluster, pool, name, width=width)
    have = log.tail()
    if have >= entries:
        return log, None
    payload = os.urandom(size)
    t0 = time.perf_counter()
    while have < entries:
        n = min(LOAD_BATCH, entries - have)
        log.append_many([payload] * n)
        have = log.tail()
    return log, time.perf_counter() - t0


def _spark_pass(master: str, conf: str, pool: str, name: str, end: int, meter: CpuMeter,
                case: str) -> tuple[float, int]:
    """One DataFrame count of [0, end) under `master`, in a session of its own
    (the session's start and a warm-up count are not timed): (seconds, partitions)."""
    from ..spark.session import local_session

    spark = local_session(master, f"pyzlog-bench-{master}")
    try:
        def df(stop: int):  # type: ignore[no-untyped-def]
            return (spark.read.format("zlog").option("conf", conf).option("pool", pool)
                    .option("log", name).option("startingPosition", "0")
                    .option("endingPosition", str(stop)).load())
        df(1000).count()  # warm up: JVM code paths, Python workers
        parts = df(end).rdd.getNumPartitions()
        started = meter.start()
        t0 = time.perf_counter()
        n = df(end).count()
        took = time.perf_counter() - t0
        meter.stop(case, started)
        if n != end:
            raise AssertionError(f"{master}: counted {n} rows, expected {end}")
        return took, parts
    finally:
        spark.stop()


def _client_pass(conf: str, pool: str, name: str, end: int, meter: CpuMeter, case: str) -> float:
    """One log.stream() pass over [0, end) in this process."""
    cluster = connect(conf)
    try:
        log = Log.open(cluster, pool, name)
        started = meter.start()
        t0 = time.perf_counter()
        n = sum(1 for _ in log.stream(0, end))
        took = time.perf_counter() - t0
        meter.stop(case, started)
        log.close()
    finally:
        cluster.shutdown()
    if n != end:
        raise AssertionError(f"client stream read {n} records, expected {end}")
    return took


def run_spark_bench(conf: str, pool: str, entries: int = 1_000_000, size: int = 16,
                    rounds: int = 3) -> dict[str, Any]:
    cluster = connect(conf)
    try:
        log, load_s = ensure_bench_log(cluster, pool, entries, size)
        name = log.name
        views = [str(v) for v in log.views]
        log.close()
    finally:
        cluster.shutdown()
    # every reader runs once per round, so a change in the shared machine's
    # speed hits both sides of each round's ratios alike
    cases = ("client", "local1", "local2")
    secs: dict[str, list[float]] = {c: [] for c in cases}
    parts: dict[str, int] = {}
    # the OSD's CPU and the machine's: whether a reader was bound by the cluster
    meter = CpuMeter(conf)
    for r in range(rounds):
        secs["client"].append(_client_pass(conf, pool, name, entries, meter, "client"))
        for case, master in (("local1", "local[1]"), ("local2", "local[2]")):
            took, parts[case] = _spark_pass(master, conf, pool, name, entries, meter, case)
            secs[case].append(took)
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{c} {entries / secs[c][-1]:,.0f} rows/s" for c in cases),
              flush=True)

    def ratio(a: str, b: str) -> float:
        return statistics.median(secs[b][i] / secs[a][i] for i in range(rounds))

    def summary(c: str) -> dict[str, Any]:
        out: dict[str, Any] = {"seconds": statistics.median(secs[c]), "all_seconds": secs[c],
                               "rows_per_s": entries / statistics.median(secs[c])}
        out["cpu"] = meter.figures(c, entries * rounds)
        if c in parts:
            out["partitions"] = parts[c]
            # the work is in Spark's JVM and workers, not in this process
            del out["cpu"]["client_us_per_entry"], out["cpu"]["client_cores"]
        return out

    return {
        "log": name, "entries": entries, "entry_bytes": size, "views": views, "rounds": rounds,
        "load_seconds": load_s,
        "client_stream": summary("client"),
        "spark_local1": summary("local1"),
        "spark_local2": summary("local2"),
        "ratio_local1_vs_client": ratio("local1", "client"),
        "ratio_local2_vs_client": ratio("local2", "client"),
        "ratio_local2_vs_local1": ratio("local2", "local1"),
        "targets": {"local2_vs_client": 1.5, "local2_vs_local1": 1.8},
        "cpus": os.cpu_count(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conf", default=os.environ.get("CEPH_CONF"))
    p.add_argument("--pool", default="zlog")
    p.add_argument("--entries", type=int, default=1_000_000)
    p.add_argument("--size", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default: %(default)s)")
    p.add_argument("--out", default="results/bench-spark.json", help="results file (default: %(default)s)")
    a = p.parse_args()
    if not a.conf:
        p.error("--conf or $CEPH_CONF is required")
    result = run_spark_bench(a.conf, a.pool, a.entries, a.size, a.rounds)
    result["table"] = markdown_table(result)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(result["table"])
    print(f"\nresults: {out}")


def markdown_table(r: dict[str, Any]) -> str:
    rows = [("client `log.stream()`, one process", r["client_stream"]["rows_per_s"], 1.0),
            ("Spark `local[1]`", r["spark_local1"]["rows_per_s"], r["ratio_local1_vs_client"]),
            ("Spark `local[2]`", r["spark_local2"]["rows_per_s"], r["ratio_local2_vs_client"])]
    lines = [f"Scan of {r['entries']:,} entries of {r['entry_bytes']} B into a DataFrame count, "
             f"{r['cpus']} CPUs, {r['rounds']} alternating rounds (rows/s: median pass; ratios: median "
             "of the per-round ratios)", "",
             "| reader | rows/s | vs client stream() | OSD CPU µs/row | OSD cores | CPUs busy |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for (name, rate, ratio), key in zip(rows, ("client_stream", "spark_local1", "spark_local2")):
        cpu = r[key].get("cpu", {})
        lines.append(f"| {name} | {rate:,.0f} | {ratio:.2f} | {_fmt(cpu.get('osd_us_per_entry'), '.2f')} | "
                     f"{_fmt(cpu.get('osd_cores'), '.2f')} | {_fmt(cpu.get('machine_busy'), '.0%')} |")
    lines.append(f"\nlocal[2] / client stream(): {r['ratio_local2_vs_client']:.2f} (target >= 1.5); "
                 f"local[2] / local[1]: {r['ratio_local2_vs_local1']:.2f} (target >= 1.8)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
