"""Spark read throughput against the client's own stream, on one log.

    python -m pyzlog.tools.spark_bench --conf $CEPH_CONF --pool zlog [--entries 1000000]

Creates (or reuses) a log of `entries` small entries named bench-spark-<entries>,
then times spark.read.format("zlog")...count() under local[1] and local[2]
(a separate SparkSession each) and a single-process log.stream() over the
same range, and reports rows/s and the ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from ..cluster import connect
from ..errors import LogNotFound
from ..log import Log

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


def _spark_count(master: str, conf: str, pool: str, name: str, end: int, repeat: int) -> dict[str, Any]:
    from ..spark.session import local_session

    spark = local_session(master, f"pyzlog-bench-{master}")
    try:
        def df(stop: int):  # type: ignore[no-untyped-def]
            return (spark.read.format("zlog").option("conf", conf).option("pool", pool)
                    .option("log", name).option("startingPosition", "0")
                    .option("endingPosition", str(stop)).load())
        df(1000).count()  # warm up: JVM code paths, Python workers
        times = []
        parts = df(end).rdd.getNumPartitions()
        for _ in range(repeat):
            t0 = time.perf_counter()
            n = df(end).count()
            times.append(time.perf_counter() - t0)
            if n != end:
                raise AssertionError(f"{master}: counted {n} rows, expected {end}")
        best = min(times)
        return {"seconds": best, "all_seconds": times, "rows_per_s": end / best, "partitions": parts}
    finally:
        spark.stop()


def run_spark_bench(conf: str, pool: str, entries: int = 1_000_000, size: int = 16,
                    repeat: int = 2) -> dict[str, Any]:
    cluster = connect(conf)
    try:
        log, load_s = ensure_bench_log(cluster, pool, entries, size)
        name = log.name
        t0 = time.perf_counter()
        n = sum(1 for _ in log.stream(0, entries))
        client_s = time.perf_counter() - t0
        if n != entries:
            raise AssertionError(f"client stream read {n} records, expected {entries}")
        views = [str(v) for v in log.views]
        log.close()
    finally:
        cluster.shutdown()
    client = {"seconds": client_s, "rows_per_s": entries / client_s}
    local1 = _spark_count("local[1]", conf, pool, name, entries, repeat)
    local2 = _spark_count("local[2]", conf, pool, name, entries, repeat)
    return {
        "log": name, "entries": entries, "entry_bytes": size, "views": views,
        "load_seconds": load_s,
        "client_stream": client,
        "spark_local1": local1,
        "spark_local2": local2,
        "ratio_local1_vs_client": local1["rows_per_s"] / client["rows_per_s"],
        "ratio_local2_vs_client": local2["rows_per_s"] / client["rows_per_s"],
        "ratio_local2_vs_local1": local2["rows_per_s"] / local1["rows_per_s"],
        "cpus": os.cpu_count(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conf", default=os.environ.get("CEPH_CONF"))
    p.add_argument("--pool", default="zlog")
    p.add_argument("--entries", type=int, default=1_000_000)
    p.add_argument("--size", type=int, default=16)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--out", default="results/bench-spark.json", help="results file (default: %(default)s)")
    a = p.parse_args()
    if not a.conf:
        p.error("--conf or $CEPH_CONF is required")
    result = run_spark_bench(a.conf, a.pool, a.entries, a.size, a.repeat)
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
    lines = [f"Scan of {r['entries']:,} entries of {r['entry_bytes']} B into a DataFrame count", "",
             "| reader | rows/s | vs client |", "| --- | ---: | ---: |"]
    lines += [f"| {name} | {rate:,.0f} | {ratio:.2f} |" for name, rate, ratio in rows]
    lines.append(f"\nlocal[2] / local[1]: {r['ratio_local2_vs_local1']:.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
