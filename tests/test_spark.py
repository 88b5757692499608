"""The PySpark connector (pyzlog.spark) against a real dev cluster and a local[2] Spark."""
from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyzlog import Log  # noqa: E402

HOLE_WAIT = "0.5"


@pytest.fixture(scope="module")
def spark():  # type: ignore[no-untyped-def]
    from pyzlog.spark.session import local_session

    s = local_session("local[2]", "pyzlog-tests", **{"spark.driver.memory": "512m"})
    yield s
    s.stop()


def reader(spark, ceph, name: str, **opts: object):  # type: ignore[no-untyped-def]
    r = (spark.read.format("zlog").option("conf", ceph.conf).option("pool", ceph.pool)
         .option("log", name).option("holeWait", HOLE_WAIT))
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def rows(df) -> list[tuple[int, bytes | None, str]]:  # type: ignore[no-untyped-def]
    """Sorted here rather than with orderBy, which reads the source twice."""
    return sorted((r.position, None if r.data is None else bytes(r.data), r.kind)
                  for r in df.collect())


def test_schema_and_simple_read(spark, ceph, rados_cluster, log_name):  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=4)
    log.append_many([f"e{i}".encode() for i in range(25)])
    df = reader(spark, ceph, log_name)
    assert df.schema.simpleString() == "struct<position:bigint,data:binary,kind:string,epoch:bigint>"
    got = rows(df)
    assert got == [(i, f"e{i}".encode(), "data") for i in range(25)]
    assert reader(spark, ceph, log_name, startingPosition=5, endingPosition=9).count() == 4
    assert reader(spark, ceph, log_name, startingPosition="latest").count() == 0
    # an end past the tail is cut at the tail: no hole is invented there
    assert reader(spark, ceph, log_name, startingPosition=20, endingPosition=1000).count() == 5


def _gappy_log(rados_cluster, pool: str, name: str) -> Log:  # type: ignore[no-untyped-def]
    """0..9 data, 3 trimmed, 10 filled, 11 a hole (never written), 12..14 data."""
    log = Log.create(rados_cluster, pool, name, width=3)
    log.append_many([b"d%d" % i for i in range(10)])
    log.fill(10)
    for p in (12, 13, 14):
        log.write(p, b"d%d" % p)
    log.trim(3)
    return log


def test_gaps_each_on_data_loss_mode(spark, ceph, rados_cluster, log_name):  # type: ignore[no-untyped-def]
    _gappy_log(rados_cluster, ceph.pool, log_name)
    data = [(p, b"d%d" % p, "data") for p in (0, 1, 2, 4, 5, 6, 7, 8, 9, 12, 13, 14)]
    # fail (default): the trimmed position is named; checked before any hole is filled
    with pytest.raises(Exception, match=r"position 3 was trimmed"):
        reader(spark, ceph, log_name, endingPosition=10).collect()
    # rows: every position with its kind; the hole at 11 is filled after holeWait -> lost
    t0 = time.monotonic()
    got = rows(reader(spark, ceph, log_name, onDataLoss="rows"))
    assert time.monotonic() - t0 >= 0.5
    expect = sorted(data + [(3, None, "trimmed"), (10, None, "filled"), (11, None, "lost")])
    assert got == expect
    # the reader recorded 11 as lost: every later read reports the same loss
    assert rows(reader(spark, ceph, log_name, onDataLoss="rows", startingPosition=11,
                       endingPosition=12)) == [(11, None, "lost")]
    # skip: only data
    assert rows(reader(spark, ceph, log_name, onDataLoss="skip")) == data


def test_fail_on_lost_hole(spark, ceph, rados_cluster, log_name):  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    log.append_many([b"a", b"b", b"c"])
    log.write(4, b"e")  # 3 is a hole below the tail
    with pytest.raises(Exception, match=r"position 3 was lost"):
        reader(spark, ceph, log_name).collect()
    # a re-run (or a retried task) fails the same way: the loss was recorded
    with pytest.raises(Exception, match=r"position 3 was lost"):
        reader(spark, ceph, log_name).collect()
    assert rows(reader(spark, ceph, log_name, onDataLoss="skip")) == \
        [(0, b"a", "data"), (1, b"b", "data"), (2, b"c", "data"), (4, b"e", "data")]


def test_earliest_skips_trimmed_prefix(spark, ceph, rados_cluster, log_name):  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=3)
    log.append_many([b"x%d" % i for i in range(12)])
    log.trim_to(4)
    assert [r[0] for r in rows(reader(spark, ceph, log_name))] == list(range(5, 12))
    with pytest.raises(Exception, match=r"position [0-4] was trimmed"):
        reader(spark, ceph, log_name, startingPosition=0).collect()


def test_partitions_one_per_object_and_min_partitions(spark, ceph, rados_cluster, log_name):  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=4)
    n = 1000
    log.append_many([b"%d" % i for i in range(n)])
    df = reader(spark, ceph, log_name)
    assert df.rdd.getNumPartitions() == 4
    per_part = df.rdd.mapPartitions(lambda it: [sorted(r.position for r in it)]).collect()
    assert [p[:2] for p in per_part] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    df10 = reader(spark, ceph, log_name, minPartitions=10)
    assert df10.rdd.getNumPartitions() == 12  # 3 sub-ranges of each of the 4 objects
    got = sorted((r.position, bytes(r.data)) for r in df10.collect())
    assert got == [(i, b"%d" % i) for i in range(n)]
    counts = df10.rdd.mapPartitions(lambda it: [sum(1 for _ in it)]).collect()
    assert sum(counts) == n and min(counts) > 0


def test_read_across_view_change(spark, ceph, rados_cluster, log_name):  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    if not hasattr(log, "reconfigure"):
        pytest.skip("Log.reconfigure does not exist yet")
    log.append_many([b"v1-%d" % i for i in range(11)])
    view = log.reconfigure(3)
    assert view.start == 11
    log.append_many([b"v2-%d" % i for i in range(11, 30)])
    df = reader(spark, ceph, log_name)
    assert df.rdd.getNumPartitions() == 2 + 3
    got = rows(df)
    assert [r[0] for r in got] == list(range(30))
    assert all(r[2] == "data" for r in got)
    assert got[10][1] == b"v1-10" and got[11][1] == b"v2-11"
    # a range that straddles the boundary, split further
    df2 = reader(spark, ceph, log_name, startingPosition=8, endingPosition=14, minPartitions=7)
    assert [r[0] for r in rows(df2)] == list(range(8, 14))


def test_streaming_triggers_and_restart(spark, ceph, rados_cluster, log_name, tmp_path):  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=3)
    log.append_many([b"s%d" % i for i in range(50)])
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")

    def run(once: bool) -> None:
        sdf = (spark.readStream.format("zlog").option("conf", ceph.conf).option("pool", ceph.pool)
               .option("log", log_name).option("maxEntriesPerTrigger", "20")
               .option("holeWait", HOLE_WAIT).load())
        w = (sdf.writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", ckpt))
        q = (w.trigger(once=True) if once else w).start()
        try:
            if once:
                q.awaitTermination(120)
            else:
                q.processAllAvailable()
            progress = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
        finally:
            q.stop()
        assert q.exception() is None
        return progress

    assert run(once=True) == [20]        # first trigger: [0, 20)
    assert run(once=True) == [20]        # restart from the checkpoint: [20, 40)
    log.append_many([b"s%d" % i for i in range(50, 75)])
    assert run(once=False) == [20, 15]  # restart, then several capped triggers to the tail
    got = sorted((r.position, bytes(r.data)) for r in spark.read.parquet(out).collect())
    assert got == [(i, b"s%d" % i) for i in range(75)]  # none twice, none missing
    offsets = sorted((p for p in (tmp_path / "ckpt" / "offsets").iterdir() if p.name.isdigit()),
                     key=lambda p: int(p.name))
    assert json.loads(offsets[-1].read_text().splitlines()[-1]) == {"position": 75}


def test_batch_write_and_read_back(spark, ceph, rados_cluster, log_name):  # type: ignore[no-untyped-def]
    df = spark.createDataFrame([(f"w{i}",) for i in range(300)], "data string").repartition(3)
    (df.write.format("zlog").option("conf", ceph.conf).option("pool", ceph.pool)
     .option("log", log_name).option("batchSize", "64").mode("append").save())
    log = Log.open(rados_cluster, ceph.pool, log_name)
    assert log.tail() == 300
    back = sorted(bytes(r.data).decode() for r in reader(spark, ceph, log_name).collect())
    assert back == sorted(f"w{i}" for i in range(300))
    # binary column, appended after the first write
    bdf = spark.createDataFrame([(bytes([i]), i) for i in range(10)], "data binary, n int")
    (bdf.write.format("zlog").option("conf", ceph.conf).option("pool", ceph.pool)
     .option("log", log_name).mode("append").save())
    assert reader(spark, ceph, log_name, startingPosition=300).count() == 10


def test_streaming_write(spark, ceph, rados_cluster, log_name, tmp_path):  # type: ignore[no-untyped-def]
    src = log_name + "-src"
    log = Log.create(rados_cluster, ceph.pool, src, width=2)
    log.append_many([b"m%d" % i for i in range(40)])
    sdf = (spark.readStream.format("zlog").option("conf", ceph.conf).option("pool", ceph.pool)
           .option("log", src).option("maxEntriesPerTrigger", "15").load())
    q = (sdf.select("data").writeStream.format("zlog").option("conf", ceph.conf)
         .option("pool", ceph.pool).option("log", log_name)
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    back = sorted(bytes(r.data) for r in reader(spark, ceph, log_name).collect())
    assert back == sorted(b"m%d" % i for i in range(40))


def test_bad_options(spark, ceph, rados_cluster, log_name):  # type: ignore[no-untyped-def]
    def load(**opts: str):  # type: ignore[no-untyped-def]
        r = spark.read.format("zlog").option("conf", ceph.conf).option("pool", ceph.pool)
        for k, v in opts.items():
            r = r.option(k, v)
        return r.load()

    with pytest.raises(Exception, match="option log is required"):
        load().collect()
    with pytest.raises(Exception, match=f"option log: no log named '{log_name}'"):
        load(log=log_name).collect()
    Log.create(rados_cluster, ceph.pool, log_name).append(b"x")
    with pytest.raises(Exception, match="option startingPosition: bad position 'soon'"):
        load(log=log_name, startingPosition="soon").collect()
    with pytest.raises(Exception, match="option endingPosition: bad position '-3'"):
        load(log=log_name, endingPosition="-3").collect()
    with pytest.raises(Exception, match="start 5 is after end 2"):
        load(log=log_name, startingPosition="5", endingPosition="2").collect()
    with pytest.raises(Exception, match="option onDataLoss"):
        load(log=log_name, onDataLoss="ignore").collect()
    with pytest.raises(Exception, match="option pool: pool 'no-such-pool'"):
        load(log=log_name, pool="no-such-pool").collect()
    with pytest.raises(Exception, match="option conf: ceph.conf not found"):
        load(log=log_name, conf="/nonexistent/ceph.conf").collect()
    df = spark.createDataFrame([(1,)], "n int")
    with pytest.raises(Exception, match="needs a 'data' column"):
        (df.write.format("zlog").option("conf", ceph.conf).option("pool", ceph.pool)
         .option("log", log_name).mode("append").save())
    with pytest.raises(Exception, match="append-only"):
        (spark.createDataFrame([("a",)], "data string").write.format("zlog").option("conf", ceph.conf)
         .option("pool", ceph.pool).option("log", log_name).mode("overwrite").save())
    assert Log.open(rados_cluster, ceph.pool, log_name).tail() == 1  # nothing was appended


def test_client_does_not_import_spark() -> None:
    import subprocess
    import sys

    code = ("import sys, pyzlog, pyzlog.log, pyzlog.reader, pyzlog.cli; "
            "assert 'pyspark' not in sys.modules, 'pyspark imported'")
    subprocess.run([sys.executable, "-P", "-c", code], check=True, cwd="/")
