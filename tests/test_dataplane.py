"""The native data plane (pyzlog.core.native, native/dataplane.c) on a real
cluster: every kind of call and its result, range windows walked into Arrow
batches, view scans, async callbacks on the completion thread, typed errors,
and lifetimes (queues dropped or a process exiting with calls in flight, a
stopped OSD). Its logs are in the omap format, whose objects protocol 1
reads too (the replies are checked against it); the data format's objects
are read the same way, with the format named (test_batches, test_cls_data)."""
from __future__ import annotations

import errno
import gc
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

import pyzlog
from pyzlog import Log
from pyzlog.core import wire
from pyzlog.core.errors import (
    ClusterUnavailable,
    Filled,
    NotWritten,
    PoolNotFound,
    StaleEpoch,
    Trimmed,
    error_for,
)
from pyzlog.core.layout import META_NAMESPACE, view_objects
from pyzlog.core.native import Connection, Op
from pyzlog.core.scan import (
    STOP_END,
    STOP_FULL,
    STOP_MISSING,
    STOP_NEED,
    RangeWindow,
    ViewScan,
    batch_of,
    batch_schema,
    build_batch,
)
from pyzlog._dataplane import lib

from clsobj import log_obj
from seqr_proc import module_seqr  # noqa: F401 - the fixture `seqr`, once per file

MAX_CALLS_PER_OP = lib.DP_MAX_CALLS_PER_OP


def error(code: int, what: str, position: int | None = None) -> pyzlog.ZlogError:
    return error_for(code, what, position=position)


def read(q, pool, oid, epoch: int, pos: int, tag: int) -> None:  # type: ignore[no-untyped-def]
    q.submit(pool, oid, Op.READ, tag, epoch=epoch, position=pos)


def read_range(q, pool, oid, epoch: int, first: int, last: int, n: int, nbytes: int,  # type: ignore[no-untyped-def]
               tag: int) -> None:
    q.submit(pool, oid, Op.READ_RANGE, tag, epoch=epoch, position=first, last=last, max_entries=n, max_bytes=nbytes)


@pytest.fixture(scope="module")
def native(rados_cluster):  # type: ignore[no-untyped-def]
    return Connection.of(rados_cluster)


@pytest.fixture
def queue(native):  # type: ignore[no-untyped-def]
    q = native.queue()
    yield q
    q.close()


def wait_all(queue, timeout: float = 30.0) -> dict[int, tuple[int, object]]:  # type: ignore[no-untyped-def]
    """Every pending result, by tag."""
    out: dict[int, tuple[int, object]] = {}
    deadline = time.monotonic() + timeout
    while queue.pending:
        assert time.monotonic() < deadline, "results did not arrive"
        for tag, code, value in queue.wait(1.0):
            out[tag] = (code, value)
    return out


@pytest.fixture
def gappy_log(rados_cluster, ceph, log_name) -> Iterator[Log]:  # type: ignore[no-untyped-def]
    """Width 4: data at 0..39 except the gaps below; 13 filled (junk), 17
    filled as lost, 21 trimmed, 25 unwritten (a hole), 40 filled (the tail
    is 41); everything below 2 trimmed by trim_to."""
    log = Log.create(rados_cluster, ceph.pool, log_name, width=4, format="omap")
    gaps = {13, 17, 21, 25}
    log.append_many([b"d%d" % p for p in range(13)])
    for p in range(14, 40):
        if p not in gaps:
            log.write(p, b"d%d" % p)
    log.fill(13)
    log.fill_lost(17)
    log.write(21, b"d21")
    log.trim(21)
    log.fill(40)
    log.trim_to(1)
    yield log
    log.close()


def native_oids(log: Log) -> list[bytes]:
    return [o.encode() for o in view_objects(log.name, log.views[-1])]


# ----------------------------------------------------------------- calls
def test_single_reads_match_the_python_path(native, queue, gappy_log: Log) -> None:  # type: ignore[no-untyped-def]
    log = gappy_log
    pool = native.pool(log.pool)
    for p in range(45):
        read(queue, pool, log.oid_of(p), log.epoch, p, p)
    got = wait_all(queue)
    assert sorted(got) == list(range(45))
    for p, (code, value) in got.items():
        try:
            expected: object = log.read(p)
        except (NotWritten, Filled, Trimmed) as e:
            expected = type(e)
        if code == 0:
            assert value == expected, p
        else:
            assert value is None
            assert type(error(code, f"read at {p}", p)) is expected, (p, code)
    assert got[5] == (0, b"d5")
    assert got[13][0] == -errno.ENOMSG and got[0][0] == -errno.EIDRM and got[25][0] == -errno.ENODATA


def test_read_of_an_object_never_created_is_not_written(native, queue, log_name, rados_cluster, ceph) -> None:  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=4, format="omap")
    read(queue, native.pool(ceph.pool), log.oid_of(7), log.epoch, 7, 1)
    ((code, value),) = wait_all(queue).values()
    assert code == -errno.ENOENT and value is None
    assert isinstance(error(code, "read at 7", 7), NotWritten)


def test_read_many_shares_one_op_and_fails_per_position(native, queue, gappy_log: Log) -> None:  # type: ignore[no-untyped-def]
    log = gappy_log
    pool = native.pool(log.pool)
    positions = [1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41]  # object 1 of 4
    queue.read_many(pool, log.oid_of(1), log.epoch, positions, [1000 + p for p in positions])
    got = wait_all(queue)
    codes = {tag - 1000: code for tag, (code, _) in got.items()}
    assert codes == {1: -errno.EIDRM, 5: 0, 9: 0, 13: -errno.ENOMSG, 17: -errno.ENOMSG, 21: -errno.EIDRM,
                     25: -errno.ENODATA, 29: 0, 33: 0, 37: 0, 41: -errno.ENODATA}
    assert got[1005] == (0, b"d5") and got[1037] == (0, b"d37")


def test_read_many_over_the_op_limit_is_split(native, queue, rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=1, format="omap")
    n = MAX_CALLS_PER_OP + 300
    log.append_many([b"v%d" % i for i in range(n)])
    queue.read_many(native.pool(ceph.pool), log.oid_of(0), log.epoch, list(range(n)), list(range(n)))
    assert queue.pending == n
    got = wait_all(queue)
    assert got == {i: (0, b"v%d" % i) for i in range(n)}


def test_stat_max_position_and_meta(native, queue, gappy_log: Log) -> None:  # type: ignore[no-untyped-def]
    log = gappy_log
    pool = native.pool(log.pool)
    oids = view_objects(log.name, log.views[-1])
    for i, oid in enumerate(oids):
        queue.submit(pool, oid, Op.STAT, 100 + i)
        queue.submit(pool, oid, Op.MAX_POSITION, 200 + i, epoch=log.epoch)
    queue.submit(pool, "no-such-object", Op.STAT, 300)
    queue.submit(pool, "no-such-object", Op.MAX_POSITION, 301, epoch=log.epoch)
    meta = native.pool(log.pool, META_NAMESPACE)
    queue.submit(meta, log.name, Op.META_GET, 400)
    got = wait_all(queue)
    for i, oid in enumerate(oids):
        assert got[100 + i] == log_obj(log, oid, 1).stat()  # what protocol 1 says
        assert got[200 + i] == log_obj(log, oid, 1).max_position(log.epoch)
    assert got[200][1] == 40 and got[101][1].trim_below == 2  # type: ignore[union-attr]
    assert got[300] == (-errno.ENOENT, None)
    assert got[301] == (-errno.ENOENT, None)  # the OSD answers for a missing object
    code, raw = got[400]
    assert code == 0 and wire.parse_meta(raw) == log.refresh()  # type: ignore[arg-type]


def test_stale_epoch_comes_back_as_a_code(native, queue, gappy_log: Log) -> None:  # type: ignore[no-untyped-def]
    log = gappy_log
    oid = log.oid_of(5)
    assert log_obj(log, oid).seal(log.epoch + 5) == 0
    pool = native.pool(log.pool)
    read(queue, pool, oid, log.epoch, 5, 1)
    read_range(queue, pool, oid, log.epoch, 0, 100, 16, 1 << 20, 2)
    read(queue, pool, oid, log.epoch + 5, 5, 3)
    got = wait_all(queue)
    assert got[1] == (-errno.ESTALE, None) and got[2] == (-errno.ESTALE, None)
    assert got[3] == (0, b"d5")
    assert isinstance(error(-errno.ESTALE, "read"), StaleEpoch)


def test_read_range_window_is_the_reply(native, queue, gappy_log: Log) -> None:  # type: ignore[no-untyped-def]
    log = gappy_log
    pool = native.pool(log.pool)
    oids = view_objects(log.name, log.views[-1])
    for i, oid in enumerate(oids):
        read_range(queue, pool, oid, log.epoch, 0, 1000, 512, 1 << 20, i)
    got = wait_all(queue)
    for i, oid in enumerate(oids):
        code, window = got[i]
        assert code == 0 and isinstance(window, RangeWindow)
        ret, py = log_obj(log, oid, 1).read_range(log.epoch, 0, 1000, 512, 1 << 20)  # protocol 1's reply
        assert ret == 0 and py is not None
        assert list(window.entries()) == py.entries
        assert (window.first, window.next, window.trim_below, window.max_position) == \
            (0, py.next, py.trim_below, py.max_position)
        assert window.count == window.remaining == len(py.entries)
        assert window.data_bytes == sum(len(e.data) for e in py.entries)


# ----------------------------------------------------------------- Arrow
def test_window_record_batch_columns(native, queue, gappy_log: Log) -> None:  # type: ignore[no-untyped-def]
    log = gappy_log
    read_range(queue, native.pool(log.pool), log.oid_of(1), log.epoch, 0, 1000, 512, 1 << 20, 0)
    ((code, window),) = wait_all(queue).values()
    assert code == 0
    batch = window.record_batch()  # type: ignore[union-attr]
    assert batch.schema.field("position").type == pa.uint64()
    rows = batch.to_pylist()
    assert [(r["position"], r["kind"], r["data"]) for r in rows] == [
        (5, "data", b"d5"), (9, "data", b"d9"), (13, "filled", None), (17, "lost", None),
        (21, "trimmed", None), (29, "data", b"d29"), (33, "data", b"d33"), (37, "data", b"d37")]
    assert all(r["epoch"] == log.epoch for r in rows)
    assert batch.column("data").null_count == 3
    signed = window.record_batch(signed=True)  # type: ignore[union-attr]
    assert signed.schema.field("epoch").type == pa.int64() and signed.column("position").to_pylist()[0] == 5
    del window, batch
    gc.collect()
    assert signed.column("data").to_pylist()[0] == b"d5"  # the batch keeps its own memory


def test_batches_made_in_python_share_the_schema(native, queue, gappy_log: Log) -> None:  # type: ignore[no-untyped-def]
    log = gappy_log
    read_range(queue, native.pool(log.pool), log.oid_of(1), log.epoch, 0, 1000, 512, 1 << 20, 0)
    ((_, window),) = wait_all(queue).values()
    lost = batch_of([25], ["lost"], [log.epoch], [None])
    assert lost.schema == batch_schema() == window.record_batch().schema  # type: ignore[union-attr]
    table = pa.Table.from_batches([window.record_batch(), lost])  # type: ignore[union-attr]
    assert table.column("kind").to_pylist()[-2:] == ["data", "lost"]
    assert batch_of([1], ["data"], [2], [b"x"], signed=True).schema == batch_schema(signed=True)


def windows_of(native, queue, log: Log, first: int = 0, last: int = 1000, per_call: int = 512,  # type: ignore[no-untyped-def]
               call_bytes: int = 1 << 20) -> list[RangeWindow]:
    pool = native.pool(log.pool)
    oids = view_objects(log.name, log.views[-1])
    for i, oid in enumerate(oids):
        read_range(queue, pool, oid, log.epoch, first + ((i - first) % len(oids)), last, per_call, call_bytes, i)
    got = wait_all(queue)
    return [got[i][1] for i in range(len(oids))]  # type: ignore[misc]


def test_build_batch_walks_positions_and_stops_at_the_first_gap(native, queue, gappy_log: Log) -> None:  # type: ignore[no-untyped-def]
    wins = windows_of(native, queue, gappy_log)
    built = build_batch(wins, 0, 100)
    rows = built.batch.to_pylist()
    assert [r["position"] for r in rows] == list(range(25))
    assert [r["kind"] for r in rows[:3]] == ["trimmed", "trimmed", "data"]  # below trim_below: epoch 0
    assert rows[0]["epoch"] == 0 and rows[2]["data"] == b"d2"
    assert (rows[13]["kind"], rows[17]["kind"], rows[21]["kind"]) == ("filled", "lost", "trimmed")
    assert (built.stop, built.stop_position) == (STOP_MISSING, 25)
    # the caller decides what 25 is; going on from 26 reads to the tail
    rest = build_batch(wins, 26, 100)
    assert [r["position"] for r in rest.batch.to_pylist()] == list(range(26, 41))
    assert (rest.stop, rest.stop_position) == (STOP_MISSING, 41)


def test_build_batch_limits_and_windows(native, queue, gappy_log: Log) -> None:  # type: ignore[no-untyped-def]
    wins = windows_of(native, queue, gappy_log)
    full = build_batch(wins, 2, 100, max_rows=5)
    assert (full.batch.num_rows, full.stop, full.stop_position) == (5, STOP_FULL, 7)
    small = build_batch(wins, 7, 100, max_bytes=5)  # "d7" "d8": a third entry would pass 5 bytes
    assert (small.batch.num_rows, small.stop, small.stop_position) == (2, STOP_FULL, 9)
    end = build_batch(wins, 9, 12)
    assert (end.batch.num_rows, end.stop, end.stop_position) == (3, STOP_END, 12)
    need = build_batch([wins[0], None, wins[2], wins[3]], 12, 100)
    assert (need.batch.num_rows, need.stop, need.stop_position, need.stop_object) == (1, STOP_NEED, 13, 1)
    # one object's positions only (a Spark partition): 4, 8, 12, ... from object 1
    wins = windows_of(native, queue, gappy_log)
    stride = build_batch([None, wins[1], None, None], 5, 100, step=4)
    assert [(r["position"], r["kind"]) for r in stride.batch.to_pylist()] == [
        (5, "data"), (9, "data"), (13, "filled"), (17, "lost"), (21, "trimmed")]
    assert (stride.stop, stride.stop_position) == (STOP_MISSING, 25)


def test_build_batch_needs_a_window_that_covers_the_position(native, queue, gappy_log: Log) -> None:  # type: ignore[no-untyped-def]
    # windows of [0, 19] cut short at 3 entries per object (0 and 1 are trimmed away)
    wins = windows_of(native, queue, gappy_log, 0, 19, per_call=3)
    assert [w.next for w in wins] == [13, 14, 11, 12]
    built = build_batch(wins, 0, 100)
    assert built.batch.num_rows == 14
    assert (built.stop, built.stop_position, built.stop_object) == (STOP_NEED, 14, 2)


def test_view_scan_matches_stream(native, gappy_log: Log) -> None:  # type: ignore[no-untyped-def]
    log = gappy_log
    expected = [(r.position, r.kind.value, r.data) for r in log.stream(0, 25, hole_wait=0)]
    for per_call, call_bytes in ((512, 4 << 20), (2, 4 << 20), (512, 3)):  # windows cut short by count or bytes
        scan = ViewScan(native.queue(), native.pool(log.pool), native_oids(log), log.epoch, 0, 100,
                        per_call=per_call, call_bytes=call_bytes)
        rows = [(r["position"], r["kind"], r["data"]) for b in scan.batches() for r in b.to_pylist()]
        assert rows == expected, (per_call, call_bytes)
        assert scan.position == 25
        scan.refresh_max()
        assert scan.max_position() == 40  # the hole is below the tail: the caller's gap rules fill it
        scan.skip()
        after = [r["position"] for b in scan.batches() for r in b.to_pylist()]
        assert after == list(range(26, 41)) and scan.position == 41
        scan.close()


def test_view_scan_one_object_and_missing_objects(native, rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=8, format="omap")
    log.append_many([b"x%d" % p for p in range(3)])  # objects 3..7 never created
    scan = ViewScan(native.queue(), native.pool(log.pool), native_oids(log), log.epoch, 0, 100)
    assert [r["position"] for b in scan.batches() for r in b.to_pylist()] == [0, 1, 2]
    scan.refresh_max()
    assert scan.max_position() == 2 and scan.position == 3
    scan.close()
    log.append_many([b"y%d" % p for p in range(3, 300)])
    scan = ViewScan(native.queue(), native.pool(log.pool), native_oids(log), log.epoch, 2, 300, step=8,
                    per_call=7)
    assert [r["position"] for b in scan.batches() for r in b.to_pylist()] == list(range(2, 300, 8))
    scan.close()


def test_view_scan_forget_from_rereads(native, rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2, format="omap")
    log.append_many([b"a", b"b"])
    scan = ViewScan(native.queue(), native.pool(log.pool), native_oids(log), log.epoch, 0, 1000)
    assert [r["data"] for b in scan.batches() for r in b.to_pylist()] == [b"a", b"b"]
    log.append_many([b"c", b"d"])
    assert scan.next_batch().batch.num_rows == 0  # still the old windows
    scan.forget_from(2)
    assert [r["data"] for b in scan.batches() for r in b.to_pylist()] == [b"c", b"d"]
    scan.close()


def test_arrow_decoding_of_many_entries(native, rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=3, format="omap")
    payloads = [os.urandom(p % 50) for p in range(3000)]
    for i in range(0, 3000, 1000):
        log.append_many(payloads[i:i + 1000])
    scan = ViewScan(native.queue(), native.pool(log.pool), native_oids(log), log.epoch, 0, 3000, per_call=256)
    table = pa.Table.from_batches(list(scan.batches()))
    scan.close()
    assert table.column("position").to_pylist() == list(range(3000))
    assert table.column("data").to_pylist() == payloads
    assert set(table.column("kind").to_pylist()) == {"data"}


# ----------------------------------------------------------------- async
def test_async_calls_complete_on_one_thread(native, gappy_log: Log) -> None:  # type: ignore[no-untyped-def]
    """submit(): callbacks run on the connection's one completion thread, with
    the same values and codes as a queue's results."""
    log = gappy_log
    pool = native.pool(log.pool)
    got: dict[int, tuple[int, object]] = {}
    threads: set[str] = set()
    done = threading.Event()

    def callback(p: int):  # type: ignore[no-untyped-def]
        def cb(code: int, value: object) -> None:
            got[p] = (code, value)
            threads.add(threading.current_thread().name)
            if len(got) == 45:
                done.set()
        return cb

    for p in range(45):
        native.submit(pool, log.oid_of(p), Op.READ, callback(p), epoch=log.epoch, position=p)
    assert done.wait(30)
    assert threads == {"pyzlog-complete"}
    assert got[3] == (0, b"d3") and got[25] == (-errno.ENODATA, None) and got[13] == (-errno.ENOMSG, None)
    assert all(code in (0, -errno.ENODATA, -errno.ENOMSG, -errno.EIDRM, -errno.ENOENT) for code, _ in got.values())


# ----------------------------------------------------------------- errors
def test_connection_is_shared_and_errors_are_typed(native, rados_cluster, ceph) -> None:  # type: ignore[no-untyped-def]
    assert Connection.of(rados_cluster) is native
    assert native.pool(ceph.pool) is native.pool(ceph.pool)
    with pytest.raises(PoolNotFound):
        native.pool("no-such-pool")
    with pytest.raises(ValueError, match="malformed"):
        RangeWindow.parse(b"short")
    with pytest.raises(ValueError, match="malformed"):  # n says one entry, none follows
        RangeWindow.parse(bytes(25) + (1).to_bytes(4, "little"), protocol=1)
    assert isinstance(error(-errno.ETIMEDOUT, "read"), ClusterUnavailable)
    q = native.queue()
    assert q.wait(5.0) == [] and q.pending == 0  # nothing in flight: no waiting
    assert q.drain(0.1)
    q.close()
    with pytest.raises(pyzlog.ZlogError, match="closed"):
        read(q, native.pool(ceph.pool), "x", 1, 0, 0)
    assert q.pending == 0
    assert isinstance(error(-errno.EIO, "read"), pyzlog.Corrupt)
    assert isinstance(error(-errno.EDQUOT, "write"), pyzlog.PoolFull)
    assert isinstance(error(-errno.ETIMEDOUT, "read"), TimeoutError)  # and a ZlogError
    assert error(-errno.ESTALE, "read").errno == errno.ESTALE


def test_closed_connection_refuses_reads(ceph) -> None:  # type: ignore[no-untyped-def]
    cluster = pyzlog.connect(ceph.conf)
    try:
        native = Connection.of(cluster)
        pool = native.pool(ceph.pool)
        q = native.queue()
        assert native.close() == 0
        with pytest.raises(ClusterUnavailable, match="closed"):
            read(q, pool, "x", 1, 0, 0)
        assert Connection.of(cluster) is not native  # a new one on demand
        q.close()
    finally:
        cluster.shutdown()

class _CloseOnNextAcquire:
    """The connection's lock, except that the next acquire once armed lets
    another thread run close() to the end first: a close that lands between
    a lent queue's last call and its return to the idle list."""

    def __init__(self, conn: Connection) -> None:
        self.conn, self.lock, self.armed = conn, conn._lock, False  # noqa: SLF001

    def __enter__(self) -> None:
        if self.armed:
            self.armed = False
            closer = threading.Thread(target=self.conn.close)
            closer.start()
            closer.join(60)
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_a_queue_handed_back_as_the_connection_closes_is_closed(ceph) -> None:  # type: ignore[no-untyped-def]
    cluster = pyzlog.connect(ceph.conf)
    try:
        native = Connection.of(cluster)
        lock = _CloseOnNextAcquire(native)
        native._lock = lock  # type: ignore[assignment]  # noqa: SLF001
        with native._waiter() as q:  # noqa: SLF001
            assert q.pending == 0
            lock.armed = True
        assert native.closed
        assert q._q is None, "a queue given back after close() swapped the idle list out was never closed"  # noqa: SLF001
        assert not native._idle_queues  # noqa: SLF001
    finally:
        cluster.shutdown()


# ------------------------------------------------------- faults and lifetime
def _run(script: str, tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "script.py"
    path.write_text(script)
    return subprocess.run([sys.executable, "-P", str(path)], capture_output=True, text=True, timeout=timeout,
                          check=False)


def _crashed(out: subprocess.CompletedProcess[str]) -> bool:
    return out.returncode != 0 or any(w in out.stderr for w in ("terminate", "Segmentation", "Abort", "Fatal"))


def test_dropped_queues_free_every_completion(ceph, log_name, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Queues, scans and async calls dropped with hundreds of calls in flight: every
    op, completion, window and queue is freed once librados is done."""
    out = _run(f"""
import gc, time
import pyzlog
from pyzlog import Log
from pyzlog.core.native import Connection, Op
from pyzlog.core.scan import ViewScan
from pyzlog._dataplane import lib
from pyzlog.core.layout import view_objects
c = pyzlog.connect({ceph.conf!r})
log = Log.create(c, {ceph.pool!r}, {log_name!r}, width=4, format="omap")
log.append_many([b"x" * 200] * 4000)
native = Connection.of(c)
pool = native.pool({ceph.pool!r})
oids = view_objects(log.name, log.views[-1])
for k in range(20):
    q = native.queue()
    for i in range(100):
        q.submit(pool, log.oid_of(i), Op.READ, i, epoch=log.epoch, position=i)
        q.submit(pool, oids[i % 4], Op.READ_RANGE, 1000 + i, epoch=log.epoch, position=0, last=4000,
                 max_entries=512, max_bytes=1 << 20)
    q.read_many(pool, oids[0], log.epoch, list(range(0, 400, 4)), list(range(100)))
    if k % 2:
        q.wait(1.0)  # some delivered (their windows live on in `res`), the rest dropped
    del q
    scan = ViewScan(native.queue(), pool, oids, log.epoch, 0, 4000, per_call=64, ahead=4)
    next(scan.batches())
    del scan
    for i in range(50):
        native.submit(pool, log.oid_of(i), Op.READ, lambda code, value: None, epoch=log.epoch, position=i)
log.close()
c.shutdown()  # the connection's own queues (completions, sync calls) go with it
gc.collect()
names = ("ops", "completions", "queues", "windows", "batches")
deadline = time.monotonic() + 60
while any(lib.dp_live(i) for i in range(5)) and time.monotonic() < deadline:
    time.sleep(0.05)
    gc.collect()
print({{n: lib.dp_live(i) for i, n in enumerate(names)}})
""", tmp_path)
    assert not _crashed(out), out.stderr[-3000:]
    assert out.stdout.strip() == str({"ops": 0, "completions": 0, "queues": 0, "windows": 0, "batches": 0})


def test_exit_with_reads_in_flight(ceph, log_name, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A program that ends with native reads, a scan, async reads and appends in
    flight exits 0, promptly, without a crash."""
    out = _run(f"""
import pyzlog
from pyzlog import Log
from pyzlog.core.native import Connection, Op
from pyzlog.core.scan import ViewScan
from pyzlog.core.layout import view_objects
c = pyzlog.connect({ceph.conf!r})
log = Log.create(c, {ceph.pool!r}, {log_name!r}, width=8, format="omap")
log.append_many([b"y" * 500] * 5000)
native = Connection.of(c)
pool = native.pool({ceph.pool!r})
oids = view_objects(log.name, log.views[-1])
q = native.queue()
for i in range(300):
    q.submit(pool, oids[i % 8], Op.READ_RANGE, i, epoch=log.epoch, position=0, last=5000, max_entries=512,
             max_bytes=4 << 20)
scan = ViewScan(native.queue(), pool, oids, log.epoch, 0, 5000, per_call=128, ahead=4)
first = next(scan.batches())
for i in range(500):
    native.submit(pool, log.oid_of(i), Op.READ, lambda code, value: None, epoch=log.epoch, position=i)
futs = [log.read_async(i) for i in range(500)] + [log.append_async(b"z") for _ in range(500)]
print("exiting", first.num_rows > 0)
""", tmp_path)
    assert not _crashed(out), out.stderr[-3000:]
    assert out.stdout.strip() == "exiting True"


def test_reads_of_a_stopped_cluster_time_out(ceph, log_name, paused_osd) -> None:  # type: ignore[no-untyped-def]
    cluster = pyzlog.connect(ceph.conf, op_timeout=2)
    try:
        log = Log.create(cluster, ceph.pool, log_name, width=2, format="omap")
        log.append_many([b"z"] * 10)
        native = Connection.of(cluster)
        assert native.op_timeout == 2
        pool = native.pool(ceph.pool)
        q = native.queue()
        scan = ViewScan(native.queue(), pool, native_oids(log), log.epoch, 0, 1000)
        paused_osd()
        for p in range(10):
            read(q, pool, log.oid_of(p), log.epoch, p, p)
        read_range(q, pool, log.oid_of(0), log.epoch, 0, 100, 10, 1 << 20, 100)
        got = wait_all(q, timeout=60)  # every call ends with a code: none hangs
        assert {code for code, _ in got.values()} == {-errno.ETIMEDOUT}
        with pytest.raises(ClusterUnavailable):
            list(scan.batches())
        scan.close()
        q.close()
    finally:
        cluster.shutdown()


def test_exit_while_reads_hang_on_a_stopped_osd(ceph, log_name, paused_osd, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    script = f"""
import sys
import pyzlog
from pyzlog import Log
from pyzlog.core.native import Connection, Op
c = pyzlog.connect({ceph.conf!r}, op_timeout=60)
log = Log.create(c, {ceph.pool!r}, {log_name!r}, width=2, format="omap")
log.append_many([b"z"] * 10)
native = Connection.of(c)
pool = native.pool({ceph.pool!r})
q = native.queue()
print("ready", flush=True)
sys.stdin.readline()  # the OSD is stopped now
for p in range(100):
    q.submit(pool, log.oid_of(p), Op.READ, p, epoch=log.epoch, position=p)
print("exiting", q.pending, flush=True)
"""
    path = tmp_path / "hang.py"
    path.write_text(script)
    proc = subprocess.Popen([sys.executable, "-P", str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        if proc.stdout.readline().strip() != "ready":
            raise AssertionError(f"the script did not start: {proc.communicate(timeout=30)[1][-3000:]}")
        paused_osd()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        # the exit waits briefly for the calls in flight, not for their 60 s op timeout
        out, err = proc.communicate(timeout=45)
        assert proc.returncode == 0, err[-3000:]
        assert out.strip() == "exiting 100"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ten_logs_share_one_connection_and_a_fixed_set_of_threads(ceph, seqr, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A process appending asynchronously to 10 logs holds one data-plane
    connection (one librados handle) and as many threads as with one log:
    the logs share the completion thread, the retry thread and the C++
    sender, and nothing starts a thread per log or per call."""
    out = _run(f"""
import os, threading, uuid
import pyzlog
from pyzlog._dataplane import lib
c = pyzlog.connect({ceph.conf!r})

def appending(n):
    logs = [pyzlog.Log.create(c, {ceph.pool!r}, "threads-" + uuid.uuid4().hex[:8], sequencer={seqr.address!r})
            for _ in range(n)]
    futs = [lg.append_async(b"x") for _ in range(300) for lg in logs]
    futs += [lg.read_async(0) for lg in logs]
    for f in futs:
        f.result(60)
    return logs

def census():
    return (lib.dp_live(5), len(os.listdir("/proc/self/task")), sorted(t.name for t in threading.enumerate()))

one = appending(1)
first = census()
ten = appending(10)
after = census()
import json
print(json.dumps({{"first": first, "after": after}}))
""", tmp_path)
    assert not _crashed(out), out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["after"] == got["first"], got  # no new connection, no new thread at all
    connections, _, names = got["first"]
    assert connections == 1 and "pyzlog-complete" in names
