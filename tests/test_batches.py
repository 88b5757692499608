"""Log.stream_batches / read_batches: Arrow batches on the native read path,
with the same positions, gaps and hole filling as Log.stream()."""
from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import oracle

from pyzlog import InvalidRequest, Log, RecordKind


def rows(batches: Any) -> list[tuple[int, str, bytes | None]]:
    out = []
    for b in batches:
        d = b.to_pydict()
        out.extend(zip(d["position"], d["kind"], d["data"]))
    return out


def records(stream: Any) -> list[tuple[int, str, bytes | None]]:
    return [(r.position, r.kind.value, r.data) for r in stream]


def drain(stream: Any, error: type[Exception]) -> tuple[list[bytes | None], int]:
    """Every record's data, calling next() again after each `error` (as a
    reader that rides out a timeout does), and how many errors there were."""
    got, errors = [], 0
    while True:
        try:
            got.append(next(stream).data)
        except error:
            errors += 1
        except StopIteration:
            return got, errors


def gappy(rados_cluster, ceph, name: str, compression: str = "none") -> Log:  # type: ignore[no-untyped-def]
    """Data, a fill, a trim, two holes below the tail, then a second view of
    another width with more of each."""
    lg = Log.create(rados_cluster, ceph.pool, name, width=3, compression=compression)
    lg.append_many([b"a%d" % i for i in range(40)])
    lg.fill(40)
    lg.trim(3)
    lg.write(43, b"after-holes")  # 41, 42: holes below the tail
    lg.reconfigure(width=2)
    start = lg.views[-1].start
    lg.append_many([b"b%d" % i for i in range(30)])
    lg.fill(start + 30)
    lg.write(start + 32, b"after-hole")  # start + 31: a hole
    return lg


def test_batches_match_stream(rados_cluster, ceph, log_name, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    lg = gappy(rados_cluster, ceph, log_name)
    got = rows(Log.open(rados_cluster, ceph.pool, log_name).stream_batches(0, hole_wait=0.2))
    want = records(oracle.stream(Log.open(rados_cluster, ceph.pool, log_name), 0, hole_wait=0.2))
    assert got == want
    assert [p for p, _, _ in got] == list(range(len(got)))
    kinds = {k for _, k, _ in got}
    assert kinds == {"data", "filled", "trimmed", "lost"}
    start = lg.views[-1].start
    assert (41, "lost", None) in got and (start + 31, "lost", None) in got and (3, "trimmed", None) in got
    assert rows(lg.read_batches(10, 20)) == [(p, "data", b"a%d" % p) for p in range(10, 20)]


def test_batches_of_a_stride_across_a_width_change(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    """Partitions planned at width 3 (p % 3 == i) read exactly their positions,
    whatever views hold them now."""
    lg = gappy(rados_cluster, ceph, log_name)
    everything = rows(lg.stream_batches(0, hole_wait=0.2))
    end = everything[-1][0] + 1
    parts = [rows(lg.stream_batches(0, end, stride_index=i, stride=3, hole_wait=0.2)) for i in range(3)]
    for i, part in enumerate(parts):
        assert all(p % 3 == i for p, _, _ in part)
    assert sorted(r for part in parts for r in part) == everything


def test_batches_decode_compressed_entries(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2, compression="zstd")
    lg.append_many([b"z" * 500 + b"%d" % i for i in range(50)])
    assert rows(lg.stream_batches(0)) == [(i, "data", b"z" * 500 + b"%d" % i) for i in range(50)]


def test_batches_follow_the_tail_and_a_reconfiguration(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    lg.append_many([b"x%d" % i for i in range(10)])
    reader = Log.open(rados_cluster, ceph.pool, log_name)

    def later() -> None:
        time.sleep(0.3)
        lg.append_many([b"y%d" % i for i in range(10)])
        Log.open(rados_cluster, ceph.pool, log_name).reconfigure(width=3)  # the reader's epoch goes stale
        lg.refresh()
        lg.append_many([b"z%d" % i for i in range(10)])

    t = threading.Thread(target=later)
    t.start()
    seen: list[tuple[int, str, bytes | None]] = []
    for b in reader.stream_batches(0, follow=True, hole_wait=0.5):
        seen.extend(rows([b]))
        if len(seen) >= 30:
            break
    t.join()
    assert [d for _, _, d in seen] == [b"x%d" % i for i in range(10)] + [b"y%d" % i for i in range(10)] + \
        [b"z%d" % i for i in range(10)]
    assert [p for p, _, _ in seen] == list(range(30))


def test_a_hole_is_lost_for_every_later_reader(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    lg.write(0, b"a")
    lg.write(2, b"c")
    assert rows(lg.stream_batches(0, hole_wait=0.1)) == [(0, "data", b"a"), (1, "lost", None), (2, "data", b"c")]
    assert [r.kind for r in Log.open(rados_cluster, ceph.pool, log_name).stream(0)] == \
        [RecordKind.DATA, RecordKind.LOST, RecordKind.DATA]


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_stream_is_the_oracles(rados_cluster, ceph, log_name, compression) -> None:  # type: ignore[no-untyped-def]
    """stream() gives the oracle's records (round 2's stream() on
    python-rados), epochs and read counts, whole and as stride partitions
    planned at another width."""
    from pyzlog.client import metrics

    gappy(rados_cluster, ceph, log_name, compression)
    full = lambda r: [(x.position, x.kind, x.data, x.epoch) for x in r]  # noqa: E731
    lg = Log.open(rados_cluster, ceph.pool, log_name)
    before = metrics.READS.value
    want = full(oracle.stream(lg, 0, hole_wait=0.2))  # fills the holes: both then read the same log
    counted = metrics.READS.value - before
    end = want[-1][0] + 1
    want_parts = [full(oracle.stream(lg, 0, end, stride_index=i, stride=3)) for i in range(3)]
    lg = Log.open(rados_cluster, ceph.pool, log_name)
    stream = lg.stream(0, hole_wait=0.2)
    before = metrics.READS.value
    assert full(stream) == want
    assert metrics.READS.value - before == counted == sum(1 for w in want if w[1] is RecordKind.DATA)
    assert [full(lg.stream(0, end, stride_index=i, stride=3)) for i in range(3)] == want_parts
    assert {w[1] for w in want} == set(RecordKind) - {RecordKind.CORRUPT}  # (a healthy log has every other kind)
    if compression == "zstd":
        assert (0, RecordKind.DATA, b"a0") == want[0][:3]


def test_an_abandoned_native_stream_lets_go(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    """Breaking out of stream() closes its reads: many abandoned streams
    leave nothing behind, and bad stride arguments are refused up front."""
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    lg.append_many([b"x%d" % i for i in range(100)])
    next(lg.stream(0))
    threads = threading.active_count()
    for _ in range(200):
        s = lg.stream(0)
        assert next(s).data == b"x0"
        s.close()
    assert [r.data for r in lg.stream(98)] == [b"x98", b"x99"]
    assert threading.active_count() <= threads
    for bad in ({"stride": 0, "stride_index": 0}, {"stride": 3}, {"stride": 3, "stride_index": 3}):
        with pytest.raises(InvalidRequest):
            lg.stream(0, **bad)
        with pytest.raises(InvalidRequest):
            lg.stream_batches(0, **bad)


def test_a_native_stream_goes_on_after_an_error(rados_cluster, ceph, log_name, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A reader that catches an error (an OSD timeout, say) and calls next()
    again gets the following positions, none twice and none skipped, as on
    python-rados (a generator would be finished after raising)."""
    from pyzlog import ClusterUnavailable
    from pyzlog.core import scan as fr
    from pyzlog.client import log as log_mod

    monkeypatch.setattr(log_mod, "STREAM_BATCH_ROWS", 16)
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=3)
    lg.append_many([b"e%d" % i for i in range(200)])
    real = fr.ViewScan.next_batch
    calls = {"n": 0}

    def flaky(self):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] in (3, 4, 9):
            raise ClusterUnavailable("injected: an OSD did not answer in time")
        return real(self)

    monkeypatch.setattr(fr.ViewScan, "next_batch", flaky)
    got, errors = drain(lg.stream(0), ClusterUnavailable)
    assert errors == 3
    assert got == [b"e%d" % i for i in range(200)]


def test_an_error_with_the_read_ahead_loses_no_batch(rados_cluster, ceph, log_name, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A failed reply collected after a batch was built (while reading ahead)
    must not lose that batch: a stale epoch there is handled inside, another
    error is raised and the stream goes on, both without skipping a position.
    (Found by the nemesis: a follow reader jumped 129 positions after a
    stale epoch arrived with the read-ahead.)"""
    from pyzlog import ClusterUnavailable, StaleEpoch
    from pyzlog.core import scan as fr
    from pyzlog.client import log as log_mod

    monkeypatch.setattr(log_mod, "STREAM_BATCH_ROWS", 16)
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=3)
    lg.append_many([b"e%d" % i for i in range(300)])
    real = fr.ViewScan._collect
    calls = {"n": 0}
    plan = {2: StaleEpoch("injected: a reply refused the epoch"), 5: StaleEpoch("injected: again"),
            8: ClusterUnavailable("injected: a reply timed out")}

    def flaky(self, timeout):  # type: ignore[no-untyped-def]
        if timeout == 0:  # the collect after a batch is built
            calls["n"] += 1
            if calls["n"] in plan:
                raise plan[calls["n"]]
        return real(self, timeout)

    monkeypatch.setattr(fr.ViewScan, "_collect", flaky)
    want = [b"e%d" % i for i in range(300)]
    got, errors = drain(lg.stream(0), ClusterUnavailable)
    assert errors == 1 and calls["n"] > 8
    assert got == want
    calls["n"] = 0
    del plan[8]  # a batch stream is a generator: it ends at an error it does not handle
    from pyzlog.client.batches import BatchStream

    batches = [b.column(1).to_pylist()
               for b in BatchStream(lg.state, 0, None, follow=False, hole_wait=0.2, max_rows=16)]
    assert calls["n"] >= 5
    assert [d for b in batches for d in b] == want


def test_scans_sharing_a_queue_never_take_each_others_replies(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    """A stream moves to a new ViewScan on the same queue at every view
    change, with the old scan's calls still in flight: their late replies
    must not be taken for the new scan's (they were, when each scan counted
    its tags from 0: "the reply made no progress", or another call's rows)."""
    from pyzlog.core import scan as fr
    from pyzlog.core.layout import view_objects
    from pyzlog.core.native import Connection

    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    lg.append_many([b"e%d" % i for i in range(2000)])
    native = Connection.of(lg.state.cluster)
    pool, queue = native.pool(ceph.pool), native.queue()
    oids = view_objects(log_name, lg.views[-1])
    try:
        for start in (0, 1500, 700, 1900, 10):
            fmt, unit = lg.views[-1].format, lg.views[-1].unit
            abandoned = fr.ViewScan(queue, pool, oids, lg.epoch, 0, 2000, per_call=64, format=fmt, unit=unit)
            abandoned.start()  # its calls are in flight when the next scan starts
            scan = fr.ViewScan(queue, pool, oids, lg.epoch, start, 2000, per_call=64, format=fmt, unit=unit)
            rows = [d for b in scan.batches() for d in b.column(1).to_pylist()]
            assert rows == [b"e%d" % i for i in range(start, 2000)]
    finally:
        queue.close()
