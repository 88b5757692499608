"""A Spark pipeline from one log to another.

    export CEPH_CONF=$PWD/run/cluster/ceph.conf      # ./dev demo starts this cluster
    .venv/bin/python examples/spark_pipeline.py [--events 10000] [--pool zlog]

Creates a source log and appends N JSON events, reads it with
spark.read.format("zlog"), keeps the "click" events and upper-cases their
user, appends the result to a second log, reads that back and prints counts.
"""
from __future__ import annotations

import argparse
import json
import os
import uuid

import pyzlog
from pyzlog import Log
from pyzlog.spark.session import local_session


def main() -> None:
    p = argparse.ArgumentParser(description="zlog -> Spark -> zlog")
    p.add_argument("--conf", default=os.environ.get("CEPH_CONF"))
    p.add_argument("--pool", default="zlog")
    p.add_argument("--events", type=int, default=10_000)
    p.add_argument("--master", default="local[2]")
    a = p.parse_args()
    if not a.conf:
        p.error("--conf or $CEPH_CONF is required")
    suffix = uuid.uuid4().hex[:8]
    src, dst = f"spark-demo-src-{suffix}", f"spark-demo-dst-{suffix}"

    cluster = pyzlog.connect(a.conf)
    try:
        log = Log.create(cluster, a.pool, src, width=4)
        kinds = ("click", "view", "scroll")
        events = [json.dumps({"id": i, "user": f"user{i % 97}", "kind": kinds[i % 3]}).encode()
                  for i in range(a.events)]
        for i in range(0, len(events), 4096):
            log.append_many(events[i:i + 4096])
        log.close()
        print(f"source log {src!r}: {a.events} events appended")
    finally:
        cluster.shutdown()

    spark = local_session(a.master, "zlog-pipeline")
    try:
        from pyspark.sql import functions as F

        def zlog(name: str):  # type: ignore[no-untyped-def]
            return (spark.read.format("zlog").option("conf", a.conf).option("pool", a.pool)
                    .option("log", name))

        events_df = zlog(src).load()
        schema = "id long, user string, kind string"
        parsed = events_df.select("position", F.from_json(F.col("data").cast("string"), schema).alias("e"))
        clicks = (parsed.where(F.col("e.kind") == "click")
                  .select(F.to_json(F.struct(F.col("position").alias("source_position"), "e.id",
                                             F.upper("e.user").alias("user"), "e.kind")).alias("data")))
        (clicks.write.format("zlog").option("conf", a.conf).option("pool", a.pool)
         .option("log", dst).mode("append").save())

        back = zlog(dst).load()
        n_src, n_dst = events_df.count(), back.count()
        sample = [json.loads(bytes(r.data)) for r in back.orderBy("position").limit(3).collect()]
        upper = back.where(F.get_json_object(F.col("data").cast("string"), "$.user").rlike("^USER")).count()
        print(f"read {n_src} events from {src!r}; wrote {n_dst} click events to {dst!r} "
              f"(expected {sum(1 for i in range(a.events) if i % 3 == 0)}); {upper} have an upper-case user")
        print("first entries of the output log:", sample)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
