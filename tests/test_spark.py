"""The PySpark connector (pyzlog.spark) against a real dev cluster and a local[2] Spark."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

import pyspark  # noqa: E402

from pyzlog import Log  # noqa: E402
from pyzlog.client.reader import RecordKind  # noqa: E402
from pyzlog.spark import READ_LIMITS, ZlogBadOffset, ZlogBatchReader, ZlogStreamReader, parse_options  # noqa: E402
from pyzlog.spark.plan import ZlogPartition  # noqa: E402
from seqr_proc import module_seqr  # noqa: E402, F401 - the fixture `seqr`, once per file
from vstartmod import ROOT  # noqa: E402

HOLE_WAIT = "0.5"
#: set in the run of this file under the oldest supported PySpark (see the last test)
NESTED = "ZLOG_SPARK_NESTED"


@pytest.fixture(scope="module")
def spark():  # type: ignore[no-untyped-def]
    from pyzlog.spark.session import local_session

    s = local_session("local[2]", "pyzlog-tests", **{"spark.driver.memory": "512m"})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def writes(spark):  # type: ignore[no-untyped-def]
    """What writes stored, as the driver sees it (registers the source again)."""
    from pyzlog.spark import register

    handle = register(spark)
    assert handle is not None
    return handle


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


def test_corrupt_entry_each_on_corrupt_mode(spark, ceph, rados_cluster, log_name):  # type: ignore[no-untyped-def]
    """A position damaged at rest (issue 24): the query fails naming it by
    default; onCorrupt=skip drops it, onCorrupt=rows returns it as kind corrupt."""
    import damage
    from test_corrupt import damage_entry

    log = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    log.append_many([b"d%d" % i for i in range(6)])
    io = damage.ioctx(rados_cluster, ceph.pool)
    try:
        damage_entry(io, log, 3)
    finally:
        io.close()
    with pytest.raises(Exception, match=r"position 3 of"):
        reader(spark, ceph, log_name).collect()
    data = [(p, b"d%d" % p, "data") for p in (0, 1, 2, 4, 5)]
    assert rows(reader(spark, ceph, log_name, onCorrupt="skip")) == data
    assert rows(reader(spark, ceph, log_name, onCorrupt="rows")) == sorted(data + [(3, None, "corrupt")])
    with pytest.raises(Exception, match="option onCorrupt"):
        reader(spark, ceph, log_name, onCorrupt="ignore").collect()


def test_earliest_skips_trimmed_prefix(spark, ceph, rados_cluster, log_name):  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=3)
    log.append_many([b"x%d" % i for i in range(12)])
    log.trim_to(4)
    assert [r[0] for r in rows(reader(spark, ceph, log_name))] == list(range(5, 12))
    with pytest.raises(Exception, match=r"position [0-4] was trimmed"):
        reader(spark, ceph, log_name, startingPosition=0).collect()


@pytest.mark.parametrize("unit", [1, None], ids=["unit1", "runs"])
def test_partitions_one_per_object_and_min_partitions(spark, ceph, rados_cluster, log_name, unit):  # type: ignore[no-untyped-def]
    """Unit 1: one partition per object (every 4th position); in runs (the
    default), one per range of consecutive positions, as many as objects."""
    log = Log.create(rados_cluster, ceph.pool, log_name, width=4, unit=unit)
    n = 1000
    log.append_many([b"%d" % i for i in range(n)])
    df = reader(spark, ceph, log_name)
    assert df.rdd.getNumPartitions() == 4
    per_part = df.rdd.mapPartitions(lambda it: [sorted(r.position for r in it)]).collect()
    assert [p[:2] for p in per_part] == ([[0, 4], [1, 5], [2, 6], [3, 7]] if unit == 1 else
                                         [[0, 1], [250, 251], [500, 501], [750, 751]])
    df10 = reader(spark, ceph, log_name, minPartitions=10)
    assert df10.rdd.getNumPartitions() == 12  # 3 sub-ranges of each of the 4
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

    def run(once: bool) -> list[int]:
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

    if READ_LIMITS:  # Spark 4.2+: Trigger.Once reads all there is, ignoring the cap (as for Kafka)
        assert run(once=True) == [50]
        assert run(once=True) == []          # restart from the checkpoint: nothing new
        log.append_many([b"s%d" % i for i in range(50, 75)])
        assert run(once=False) == [20, 5]    # restart, then capped triggers to the tail
    else:  # 4.0/4.1: the cap applies inside latestOffset(), so Once reads one capped batch
        assert run(once=True) == [20]        # first trigger: [0, 20)
        assert run(once=True) == [20]        # restart from the checkpoint: [20, 40)
        log.append_many([b"s%d" % i for i in range(50, 75)])
        assert run(once=False) == [20, 15]   # restart, then several capped triggers to the tail
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

    code = ("import sys, pyzlog, pyzlog.client.log, pyzlog.client.reader, pyzlog.admin.cli; "
            "assert 'pyspark' not in sys.modules, 'pyspark imported'")
    subprocess.run([sys.executable, "-P", "-c", code], check=True, cwd="/")


# ------------------------------------------------------------ reconfiguration

class AppendLoad:
    """Appends through the sequencer in the background, recording each acknowledged position."""

    def __init__(self, rados_cluster, pool: str, name: str, seqr_address: str) -> None:  # type: ignore[no-untyped-def]
        self.log = Log.open(rados_cluster, pool, name, sequencer=seqr_address)
        self.acked: dict[int, bytes] = {}
        self.errors: list[Exception] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        k = 0
        while not self._stop.is_set():
            batch = [b"load-%d" % (k + i) for i in range(8)]
            try:
                positions = self.log.append_many(batch)
            except Exception as e:  # noqa: BLE001 - reported by the test
                self.errors.append(e)
                return
            for p, d in zip(positions, batch):
                assert p not in self.acked
                self.acked[p] = d
            k += len(batch)
            time.sleep(0.005)

    def __enter__(self) -> "AppendLoad":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)
        self.log.close()
        assert not self.errors, self.errors


def _log_with_held_positions(rados_cluster, ceph, name: str, seqr,  # type: ignore[no-untyped-def]
                             unit: int | None = None) -> tuple[Log, dict[int, bytes], int]:
    """A width-4 log of 203 entries, then 20 positions handed out by the
    sequencer and not written (their writer is slow): the tail is 223 while
    the highest stored position is 202, so a reconfiguration now starts its
    view at 203, below the tail a read plans to."""
    log = Log.create(rados_cluster, ceph.pool, name, width=4, sequencer=seqr.address, unit=unit)
    data = [b"first-%d" % i for i in range(203)]
    stored = dict(zip(log.append_many(data), data))
    held = log.take_positions(20)
    assert held == 203 and log.tail() == 223
    return log, stored, held + 20


def _check_exactly_once(got: list[tuple[int, bytes | None, str]], start: int, end: int,
                        acked: dict[int, bytes]) -> None:
    """Every position of [start, end) exactly once, with its data or its gap kind."""
    assert [p for p, _, _ in got] == list(range(start, end))
    for pos, data, kind in got:
        if kind == "data":
            assert acked.get(pos) == data, pos
        else:  # a held position nobody wrote within holeWait: filled by the reader
            assert kind == "lost" and pos not in acked, (pos, kind)


def _batch_rows(batches) -> list[tuple[int, bytes | None, str]]:  # type: ignore[no-untyped-def]
    return [(r["position"], r["data"], r["kind"]) for b in batches for r in b.to_pylist()]


@pytest.mark.parametrize("unit,new_width", [(1, 3), (1, 8), (None, 3)], ids=["unit1-3", "unit1-8", "runs-3"])
@pytest.mark.parametrize("when", ["before", "while"])
def test_partitions_deliver_their_planned_positions_across_a_width_change(  # type: ignore[no-untyped-def]
        ceph, rados_cluster, log_name, seqr, unit, new_width, when):
    """The reader's contract, without Spark in between: partitions planned at
    width 4 are read after (or while) the log moves to width 3 or 8, under
    append load. Each delivers exactly its planned positions; together they
    cover the range once, each with its data or its gap kind. Unit 1 plans
    one partition per object; a view in runs, ranges of consecutive positions."""
    log, stored, end = _log_with_held_positions(rados_cluster, ceph, log_name, seqr, unit)
    opts = parse_options({"conf": ceph.conf, "pool": ceph.pool, "log": log_name, "sequencer": seqr.address,
                          "holeWait": "8", "onDataLoss": "rows"})
    reader = ZlogBatchReader(opts)
    parts = reader.partitions()
    assert {(p.width, p.index) for p in parts} == ({(4, i) for i in range(4)} if unit == 1 else {(1, 0)})
    assert len(parts) == 4
    assert max(p.end for p in parts) == end
    admin = Log.open(rados_cluster, ceph.pool, log_name)
    got: dict[int, list[tuple[int, bytes | None, str]]] = {}
    threads = [threading.Thread(target=lambda i=i, p=p: got.__setitem__(i, _batch_rows(reader.read(p))))
               for i, p in enumerate(parts)]
    if when == "before":
        admin.reconfigure(new_width)
    for t in threads:
        t.start()
    if when == "while":
        time.sleep(1.0)  # the partitions are waiting on the held positions
        admin.reconfigure(new_width)
    assert admin.views[-1].width == new_width and admin.views[-1].start == 203
    with AppendLoad(rados_cluster, ceph.pool, log_name, seqr.address) as load:
        for t in threads:
            t.join(120)
    assert len(got) == len(parts)
    for i, part in enumerate(parts):
        assert [p for p, _, _ in got[i]] == list(part.positions())
    every = sorted(r for rs in got.values() for r in rs)
    _check_exactly_once(every, 0, end, {**stored, **load.acked})
    assert sum(1 for r in every if r[2] == "data" and r[0] >= 203) > 0  # the new view served some
    # the record is the log's: a fresh read of the range agrees
    again = [(r.position, r.data, r.kind.value) for r in admin.stream(0, end, hole_wait=8)]
    assert again == every
    log.close()


@pytest.mark.parametrize("new_width", [3, 8])
def test_spark_batch_and_stream_exactly_once_across_width_changes(  # type: ignore[no-untyped-def]
        spark, ceph, rados_cluster, log_name, seqr, tmp_path, new_width):
    """Through Spark: a batch read planned at width 4 whose tasks are waiting
    on held positions while the width changes to 3 or 8 under append load;
    then a stream whose micro-batch is planned at that width and read while
    the width changes back to 4, with more micro-batches under load."""
    log, stored, end = _log_with_held_positions(rados_cluster, ceph, log_name, seqr)
    admin = Log.open(rados_cluster, ceph.pool, log_name)
    tracker = spark.sparkContext.statusTracker()

    def when_running(action, running) -> None:  # type: ignore[no-untyped-def]
        """Start `action` in a thread, call `running` once Spark runs its tasks."""
        out: dict[str, Any] = {}
        t = threading.Thread(target=lambda: out.update(result=action()))
        t.start()
        deadline = time.monotonic() + 60
        while not tracker.getActiveStageIds() and time.monotonic() < deadline and t.is_alive():
            time.sleep(0.05)
        time.sleep(0.5)
        running()
        return t, out

    opts = {"sequencer": seqr.address, "holeWait": 15, "onDataLoss": "rows"}
    loads: list[AppendLoad] = []

    def change_width(width: int) -> None:
        admin.reconfigure(width)
        loads.append(AppendLoad(rados_cluster, ceph.pool, log_name, seqr.address).__enter__())

    t, out = when_running(lambda: rows(reader(spark, ceph, log_name, endingPosition=end, **opts)),
                          lambda: change_width(new_width))
    t.join(180)
    loads[-1].__exit__()
    assert admin.views[-1].width == new_width and admin.views[-1].start == 203
    _check_exactly_once(out["result"], 0, end, {**stored, **loads[-1].acked})

    # the stream: its first micro-batch covers 20 more held positions in the new view
    held = log.take_positions(20)
    out_dir, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    sdf = (spark.readStream.format("zlog").option("conf", ceph.conf).option("pool", ceph.pool)
           .option("log", log_name).option("startingPosition", str(end)))
    for k, v in opts.items():
        sdf = sdf.option(k, str(v))
    q = sdf.load().writeStream.format("parquet").option("path", out_dir).option("checkpointLocation", ckpt).start()
    try:
        deadline = time.monotonic() + 60
        while not tracker.getActiveStageIds() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        change_width(4)
        time.sleep(2)  # micro-batches planned under load
        loads[-1].__exit__()
        final = log.tail()
        q.processAllAvailable()  # every trigger reads to the tail, which no longer moves
    finally:
        q.stop()
    assert q.exception() is None
    assert admin.views[-1].width == 4 and admin.views[-1].start <= held
    got = sorted((r.position, None if r.data is None else bytes(r.data), r.kind)
                 for r in spark.read.parquet(out_dir).collect())
    _check_exactly_once(got, end, final, {**stored, **loads[0].acked, **loads[1].acked})
    log.close()


# ------------------------------------------------------------------- options

def _load(spark, ceph, name: str | None, **opts: object):  # type: ignore[no-untyped-def]
    r = spark.read.format("zlog").option("conf", ceph.conf).option("pool", ceph.pool)
    if name is not None:
        r = r.option("log", name)
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def _stream(spark, ceph, name: str, **opts: object):  # type: ignore[no-untyped-def]
    r = (spark.readStream.format("zlog").option("conf", ceph.conf).option("pool", ceph.pool)
         .option("log", name).option("holeWait", HOLE_WAIT))
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def test_unknown_options_are_refused_at_load_and_start(spark, ceph, rados_cluster, log_name, tmp_path):  # type: ignore[no-untyped-def]
    Log.create(rados_cluster, ceph.pool, log_name).append(b"x")
    # load() itself fails, before any action, naming the near miss and the valid names
    with pytest.raises(Exception, match=r"unknown option 'startingpositon'\. Did you mean 'startingPosition'\?"
                                        r".*Valid options: log, pool, conf"):
        _load(spark, ceph, log_name, startingPositon="5")
    with pytest.raises(Exception, match=r"unknown option 'ondatloss'\. Did you mean 'onDataLoss'\?"):
        _load(spark, ceph, log_name, onDatLoss="skip")
    with pytest.raises(Exception, match=r"unknown option 'colour'\. Valid options:"):
        _load(spark, ceph, log_name, colour="red")
    with pytest.raises(Exception, match=r"'subscribe' is a Kafka source option: .*use option log"):
        _load(spark, ceph, None, subscribe=log_name)
    # a stream: refused by readStream...load(), before start()
    with pytest.raises(Exception, match=r"Did you mean 'maxEntriesPerTrigger'\?"):
        _stream(spark, ceph, log_name, maxEntriesPerTriger=5)
    # a sink: refused by writeStream...start()
    df = spark.createDataFrame([("a",)], "data string")
    with pytest.raises(Exception, match=r"Did you mean 'batchSize'\?"):
        (df.write.format("zlog").option("conf", ceph.conf).option("log", log_name).option("batchSise", 5)
         .mode("append").save())
    with pytest.raises(Exception, match=r"Did you mean 'createIfMissing'\?"):
        (_stream(spark, ceph, log_name).select("data").writeStream.format("zlog").option("conf", ceph.conf)
         .option("log", log_name + "-out").option("createIfMisssing", "false")
         .option("checkpointLocation", str(tmp_path / "ck")).start().awaitTermination(60))
    assert Log.open(rados_cluster, ceph.pool, log_name).tail() == 1


def test_kafka_option_names(spark, ceph, rados_cluster, log_name):  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    log.append_many([b"k%d" % i for i in range(10)])
    log.write(11, b"k11")  # 10 is a hole below the tail
    # startingOffsets / endingOffsets are startingPosition / endingPosition
    assert _load(spark, ceph, log_name, startingOffsets="latest").count() == 0
    assert [r[0] for r in rows(_load(spark, ceph, log_name, startingOffsets=3, endingOffsets=6))] == [3, 4, 5]
    # failOnDataLoss=false is onDataLoss=skip; true is fail
    got = rows(_load(spark, ceph, log_name, failOnDataLoss="false", holeWait=HOLE_WAIT))
    assert [r[0] for r in got] == list(range(10)) + [11]
    with pytest.raises(Exception, match=r"position 10 was lost"):
        _load(spark, ceph, log_name, failOnDataLoss="true", holeWait=HOLE_WAIT).collect()
    # minPartitions is the same name
    assert _load(spark, ceph, log_name, minPartitions=6, endingPosition=10).rdd.getNumPartitions() == 6
    # Kafka's per-partition JSON, and an option given under both names, are refused with a pointer
    with pytest.raises(Exception, match=r"startingOffsets: per-partition JSON offsets are Kafka's.*"
                                        r"use startingPosition"):
        _load(spark, ceph, log_name, startingOffsets='{"t":{"0":1}}')
    with pytest.raises(Exception, match=r"onDataLoss and failOnDataLoss \(an alias of onDataLoss\) were both"):
        _load(spark, ceph, log_name, onDataLoss="skip", failOnDataLoss="false")
    # maxOffsetsPerTrigger caps micro-batches like maxEntriesPerTrigger
    q = (_stream(spark, ceph, log_name, maxOffsetsPerTrigger=4, endingPosition=10).writeStream
         .format("memory").queryName("kafka_alias_" + log_name.replace("-", "_")).start())
    try:
        q.processAllAvailable()
        sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    finally:
        q.stop()
    assert sizes == [4, 4, 2]


def test_hole_wait_checked_at_load_and_schema_at_first_action(spark, ceph, rados_cluster, log_name):  # type: ignore[no-untyped-def]
    Log.create(rados_cluster, ceph.pool, log_name).append(b"x")
    for bad in ("nan", "inf", "-inf", "-1", "soon"):
        with pytest.raises(Exception, match=r"option holeWait: expected"):
            _load(spark, ceph, log_name, holeWait=bad)
    assert _load(spark, ceph, log_name, holeWait="0").count() == 1
    # Spark does not call a Python source at load() when a schema is given: a schema
    # other than the connector's is refused at the first action, naming the expected one
    expected = r"fixed schema struct<position:bigint,data:binary,kind:string,epoch:bigint>"
    for wrong in ("value string", "data string", "position int, data binary, kind string, epoch long"):
        df = (spark.read.format("zlog").schema(wrong).option("conf", ceph.conf).option("pool", ceph.pool)
              .option("log", log_name).load())
        with pytest.raises(Exception, match=r"zlog read: the schema given with \.schema\(\.\.\.\) is .* "
                                            + expected):
            df.collect()
    sdf = (spark.readStream.format("zlog").schema("n int").option("conf", ceph.conf)
           .option("pool", ceph.pool).option("log", log_name).load())
    q = sdf.writeStream.format("noop").start()
    with pytest.raises(Exception, match=r"zlog readStream: the schema given .* " + expected):
        q.awaitTermination(60)
    q.stop()
    # the connector's own schema, given explicitly, is fine
    assert (spark.read.format("zlog").schema("position long, data binary, kind string, epoch long")
            .option("conf", ceph.conf).option("pool", ceph.pool).option("log", log_name).load().count()) == 1


def test_stream_honours_ending_position(spark, ceph, rados_cluster, log_name):  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=3)
    log.append_many([b"e%d" % i for i in range(30)])
    q = (_stream(spark, ceph, log_name, startingPosition=5, endingPosition=17, maxEntriesPerTrigger=5)
         .writeStream.format("memory").queryName("ending_" + log_name.replace("-", "_")).start())
    try:
        q.processAllAvailable()
        log.append_many([b"e%d" % i for i in range(30, 40)])  # past the end: never read
        q.processAllAvailable()
        got = sorted(r.position for r in spark.table("ending_" + log_name.replace("-", "_")).collect())
        sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    finally:
        q.stop()
    assert got == list(range(5, 17))
    assert sizes == [5, 5, 2]


# --------------------------------------------------------------- checkpoints

def test_bad_checkpoint_offsets_name_the_checkpoint(spark, ceph, rados_cluster, log_name, tmp_path):  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    log.append_many([b"c%d" % i for i in range(20)])
    reader_ = ZlogStreamReader(parse_options({"conf": ceph.conf, "pool": ceph.pool, "log": log_name}))
    for bad in ({"position": -5}, '{"position": -5}', "not json", {"offset": 3}, {"position": "7"}, [3]):
        with pytest.raises(ZlogBadOffset, match=r"bad start offset .* in the query's checkpoint") as e:
            reader_.partitions(bad, {"position": 10})  # type: ignore[arg-type]
        assert repr(bad) in str(e.value)
    with pytest.raises(ZlogBadOffset, match=r"bad commit offset \{'position': -1\}"):
        reader_.commit({"position": -1})

    def run(ckpt: Path) -> Any:
        q = (_stream(spark, ceph, log_name, maxEntriesPerTrigger=10).writeStream.format("noop")
             .option("checkpointLocation", str(ckpt)).start())
        try:
            q.processAllAvailable()
        except Exception:
            pass
        finally:
            q.stop()
        return q.exception()

    def corrupt(ckpt: Path, text: str) -> None:
        """Replace the source's offset of the checkpoint's last batch."""
        last = max((p for p in (ckpt / "offsets").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        lines = last.read_text().splitlines()
        assert json.loads(lines[-1]) == {"position": 20}
        last.write_text("\n".join(lines[:-1] + [text]) + "\n")

    for text, shown in (('{"position":-5}', "{'position': -5}"), ('{"position": "x"}', "{'position': 'x'}"),
                        ('"not json"', "'not json'")):
        ckpt = tmp_path / f"ck-{len(text)}"
        assert run(ckpt) is None
        corrupt(ckpt, text)
        err = run(ckpt)
        assert err is not None
        assert f"zlog stream of log '{log_name}': bad start offset {shown} in the query's checkpoint" in str(err)
    # text that is not JSON at all never reaches the source: Spark's own runner parses
    # offsets first and fails the query with its JSONDecodeError (docs/spark.md, Checkpoints)
    ckpt = tmp_path / "ck-garbage"
    assert run(ckpt) is None
    corrupt(ckpt, "not json at all")
    err = run(ckpt)
    assert err is not None and "JSONDecodeError" in str(err)


# ------------------------------------------------------------------------ sink

def test_sink_finds_the_data_column_by_one_rule(spark, ceph, rados_cluster, log_name, tmp_path):  # type: ignore[no-untyped-def]
    """`Data` (any case) is the data column for batch and streaming writes alike."""
    df = spark.createDataFrame([(f"b{i}", i) for i in range(6)], "Data string, n int")
    df.write.format("zlog").option("conf", ceph.conf).option("pool", ceph.pool).option("log", log_name).mode(
        "append").save()
    src = log_name + "-src"
    Log.create(rados_cluster, ceph.pool, src, width=2).append_many([b"s%d" % i for i in range(7)])
    q = (_stream(spark, ceph, src).selectExpr("data AS Data").writeStream.format("zlog")
         .option("conf", ceph.conf).option("pool", ceph.pool).option("log", log_name)
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    assert q.exception() is None
    back = sorted(bytes(r.data) for r in _load(spark, ceph, log_name).collect())
    assert back == sorted([b"b%d" % i for i in range(6)] + [b"s%d" % i for i in range(7)])
    both = spark.createDataFrame([("a", "b")], "data string, DATA string")
    with pytest.raises(Exception, match=r"columns 'data', 'DATA' all match 'data'"):
        both.write.format("zlog").option("conf", ceph.conf).option("log", log_name).mode("append").save()


def test_the_driver_learns_what_writes_stored(spark, writes, ceph, rados_cluster, log_name, tmp_path):  # type: ignore[no-untyped-def]
    df = spark.createDataFrame([(f"w{i}",) for i in range(50)], "data string").repartition(3)
    df.write.format("zlog").option("conf", ceph.conf).option("pool", ceph.pool).option("log", log_name).option(
        "batchSize", "8").mode("append").save()
    report = writes.last
    assert report is not None and report.log == log_name and report.batch_id is None and report.committed
    assert (report.count, report.first, report.last, report.tasks) == (50, 0, 49, 3)
    assert sum(b - a + 1 for a, b in report.ranges) == 50
    stored = {r.position: bytes(r.data).decode() for r in _load(spark, ceph, log_name).collect()}
    assert sorted(stored.values()) == sorted(f"w{i}" for i in range(50))
    assert str(report) == f"zlog write to '{log_name}': 50 entries at positions 0..49"
    # a streaming write: one report per micro-batch, with its batch id
    src = log_name + "-src"
    Log.create(rados_cluster, ceph.pool, src, width=2).append_many([b"m%d" % i for i in range(23)])
    q = (_stream(spark, ceph, src, maxEntriesPerTrigger=10).select("data").writeStream.format("zlog")
         .option("conf", ceph.conf).option("pool", ceph.pool).option("log", log_name)
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    streamed = [r for r in writes.for_log(log_name) if r.batch_id is not None]
    assert [r.batch_id for r in streamed] == [0, 1, 2]
    assert [r.count for r in streamed] == [10, 10, 3]
    positions = sorted(p for r in streamed for a, b in r.ranges for p in range(a, b + 1))
    log = Log.open(rados_cluster, ceph.pool, log_name)
    assert positions == list(range(50, 73)) and log.tail() == 73
    assert all(log.read(p).startswith(b"m") for p in positions)


# ---------------------------------------------------- admission control (4.2+)

def test_available_now_reads_what_existed_in_capped_batches(spark, ceph, rados_cluster, log_name, tmp_path):  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=4, unit=1)  # every 4th position per object
    log.append_many([b"a%d" % i for i in range(1000)])
    name = "avail_" + log_name.replace("-", "_")
    stop = threading.Event()

    def keep_appending() -> None:  # entries that arrive after the start are not read
        while not q.recentProgress and not stop.is_set():
            time.sleep(0.01)  # from the end of the first batch on: after the target was taken
        while not stop.is_set():
            log.append_many([b"late"] * 5)
            time.sleep(0.05)

    q = (_stream(spark, ceph, log_name, maxEntriesPerTrigger=300).writeStream.format("memory")
         .queryName(name).trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "ck")).start())
    t = threading.Thread(target=keep_appending)
    t.start()
    try:
        assert q.awaitTermination(120)  # it stops by itself
    finally:
        stop.set()
        t.join()
        q.stop()
    assert q.exception() is None
    progress = [p for p in q.recentProgress if p["numInputRows"]]
    got = sorted(r.position for r in spark.table(name).collect())
    if READ_LIMITS:
        assert [p["numInputRows"] for p in progress] == [300, 300, 300, 100]
        assert got == list(range(1000))
        # progress: the source's latestOffset is the real tail (past the capped end), with how far
        # each batch left the stream behind it, over the log and its 4 objects
        first = progress[0]["sources"][0]
        assert _as_json(first["endOffset"]) == {"position": 300}
        latest = _as_json(first["latestOffset"])
        assert latest["position"] >= 1000
        behind = latest["position"] - 300
        assert latest["entriesBehindLatest"] == behind
        assert latest["minEntriesBehindLatest"] == behind // 4
        assert latest["maxEntriesBehindLatest"] == -(-behind // 4)
        assert latest["avgEntriesBehindLatest"] == round(behind / 4, 2)
    else:  # 4.0/4.1: no read limits for Python sources: Spark asks once and reads one capped batch
        assert [p["numInputRows"] for p in progress] == [300]
        assert got == list(range(300))
        assert _as_json(progress[0]["sources"][0]["latestOffset"]) == {"position": 300}


def _as_json(value: Any) -> Any:
    """Progress offsets: JSON text in 4.3, the repr of the parsed dict in 4.0."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return ast.literal_eval(value)


def test_behind_latest_over_views() -> None:
    from pyzlog.spark.source import behind_latest
    from pyzlog.core.wire import FORMAT_DATA, View

    views = (View(1, 0, 4), View(2, 10, 2))
    assert behind_latest(views, 6, 14) == {"entriesBehindLatest": 8, "minEntriesBehindLatest": 1,
                                           "avgEntriesBehindLatest": 1.33, "maxEntriesBehindLatest": 2}
    caught_up = behind_latest(views, 14, 14)
    assert caught_up == {"entriesBehindLatest": 0, "minEntriesBehindLatest": 0,
                         "avgEntriesBehindLatest": 0.0, "maxEntriesBehindLatest": 0}
    # a view from 14 in runs of 4 over 2 objects: 14..17 and 22..25 in object 0, 18..21 in object 1
    runs = views + (View(3, 14, 2, FORMAT_DATA, 8, 1 << 20, 1, 4),)
    assert behind_latest(runs, 16, 22) == {"entriesBehindLatest": 6, "minEntriesBehindLatest": 2,
                                           "avgEntriesBehindLatest": 3.0, "maxEntriesBehindLatest": 4}


# -------------------------------------------------------------------- versions

def test_spark_suite_on_the_oldest_supported_pyspark(ceph) -> None:  # type: ignore[no-untyped-def]
    """This file again, under the oldest PySpark the `spark` extra accepts, which
    ./dev setup installs beside the pinned newest one (.spark-compat/)."""
    if os.environ.get(NESTED):
        pytest.skip("this is that run")
    found = sorted((ROOT / ".spark-compat").glob("pyspark-4.0.*"))
    assert found, "no PySpark 4.0 beside the newest: run ./dev setup"
    env = {**os.environ, NESTED: "1", "PYTHONPATH": str(found[-1]), "ZLOG_TEST_CONF": ceph.conf,
           "ZLOG_TEST_POOL": ceph.pool}
    code = "import pyspark, sys; print(pyspark.__version__)"
    version = subprocess.run([sys.executable, "-P", "-c", code], env=env, cwd="/", check=True,
                             capture_output=True, text=True).stdout.strip()
    assert version.startswith("4.0.") and version != pyspark.__version__
    # the bench measures, it checks no API the newest PySpark has alone; one width change of two suffices
    run = subprocess.run([sys.executable, "-P", "-m", "pytest", "tests/test_spark.py", "-q", "-x",
                          "-p", "no:cacheprovider",
                          "--deselect", "tests/test_spark.py::test_spark_bench_reports_rates_and_where_the_cpu_went",
                          "--deselect",
                          "tests/test_spark.py::test_spark_batch_and_stream_exactly_once_across_width_changes[8]"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout.splitlines()[-1]


def test_spark_bench_reports_rates_and_where_the_cpu_went(ceph, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The Spark bench, small: every reader counts every row, and each case
    says how busy the OSD and the machine were while it ran."""
    out = tmp_path / "spark.json"
    p = subprocess.run([sys.executable, "-P", "-m", "pyzlog.bench.spark_bench", "--conf", ceph.conf, "--pool",
                        ceph.pool, "--entries", "20000", "--rounds", "1", "--out", str(out)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["entries"] == 20000 and "| Spark `local[2]` |" in p.stdout
    readers = ("client_stream", "spark_local1", "spark_local2")
    for case in readers:
        cpu = r[case]["cpu"]
        assert r[case]["rows_per_s"] > 0 and 0 < cpu["machine_busy"] <= 1
        assert ceph.dir is None or cpu["osd_cores"] is not None  # our own cluster's OSD runs on this host
    # CPU time comes in 10 ms ticks: a short pass may see none, all four together do
    assert ceph.dir is None or sum(r[case]["cpu"]["osd_cores"] for case in readers) > 0
    assert r["client_stream"]["cpu"]["client_us_per_entry"] > 0
    assert "client_us_per_entry" not in r["spark_local2"]["cpu"]  # Spark's work is not in the driver
