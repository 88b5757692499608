"""Adversarial tests of the one stream walk (batches.BatchStream._steps)
and its two drivers (blocking _walk, aio_stream on an event loop), and of
RecordBatch's exact-in-bulk read metrics. Written by an adversary helper
against the sans-I/O walk; each docstring says what the walk did wrong
when the test was written."""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from pyzlog import Log, RecordKind
from pyzlog.client import metrics


def positions(records: Any) -> list[tuple[int, str]]:
    return [(r.position, r.kind.value) for r in records]


def holes_log(rados_cluster, ceph, name):  # type: ignore[no-untyped-def]
    """0..4 data, 5 and 6 holes (no writer will come), 7..9 data."""
    lg = Log.create(rados_cluster, ceph.pool, name, width=2)
    lg.append_many([b"a%d" % i for i in range(5)])
    for p in (7, 8, 9):
        lg.write(p, b"a%d" % p)
    return lg


WANT = [(p, "data") for p in range(5)] + [(5, "lost"), (6, "lost")] + [(p, "data") for p in (7, 8, 9)]


def test_closing_a_stream_at_a_lost_record_does_not_hand_it_out_twice(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name) -> None:
    """The walk yielded a filled hole's LOST row before it moved past the
    position (scan.skip() came after the yield): a stream closed there
    walked again from the hole and handed it out a second time (the hole
    now reads as filled LOST)."""
    holes_log(rados_cluster, ceph, log_name)
    s = Log.open(rados_cluster, ceph.pool, log_name).stream(0, hole_wait=0.1)
    got = []
    for r in s:
        got.append((r.position, r.kind.value))
        if r.kind is RecordKind.LOST:
            break
    s.close()
    got += positions(s)
    assert got == WANT


def test_an_async_stream_closed_at_a_lost_record_does_not_repeat_it(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name) -> None:
    """AsyncRecords.aclose() at a LOST record, then iterating on: the same
    duplicate as the blocking stream's (one walk, two drivers)."""
    from pyzlog.aio import AsyncLog

    holes_log(rados_cluster, ceph, log_name)

    async def read() -> list[tuple[int, str]]:
        alog = AsyncLog(Log.open(rados_cluster, ceph.pool, log_name))
        try:
            s = alog.stream(0, hole_wait=0.1)
            got = []
            async for r in s:
                got.append((r.position, r.kind.value))
                if r.kind is RecordKind.LOST:
                    break
            await s.aclose()
            got += [(r.position, r.kind.value) async for r in s]
            return got
        finally:
            await alog.close()

    assert asyncio.run(asyncio.wait_for(read(), 120)) == WANT


def test_reads_never_count_an_entry_that_could_not_be_decoded(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name) -> None:
    """RecordBatch.next() took the record off its list iterator before it
    decoded it: a metrics scrape on another thread in between counted it as
    read, and kept it counted after the decode failed (READS one over what
    was handed out, for good). Position 5 of a zstd log is not a zstd frame;
    the reader retries it many times while a thread reads READS without a
    pause."""
    import sys

    from pyzlog import ZlogError
    from pyzlog.client import ops

    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2, compression="zstd")
    lg.append_many([b"ok%d" % i for i in range(5)])
    ops.write(lg.state, 5, b"\x00not zstd at all")
    s = Log.open(rados_cluster, ceph.pool, log_name).stream(0)
    r0 = metrics.READS.value
    assert [next(s).position for _ in range(5)] == [0, 1, 2, 3, 4]
    stop = threading.Event()
    seen = [0]

    def scrape() -> None:
        while not stop.is_set():
            seen[0] = max(seen[0], metrics.READS.value - r0)

    t = threading.Thread(target=scrape)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the window is a few bytecodes
    t.start()
    try:
        for _ in range(20000):
            try:
                next(s)
            except ZlogError:
                pass
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    s.close()
    assert (seen[0], metrics.READS.value - r0) == (5, 5)


def test_a_newer_seal_met_while_asking_where_the_tail_is_is_waited_out(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name) -> None:
    """A partition reader (stride = width) reads one object; whether the
    position after its last entry lies below the tail is asked of the other
    objects. Those were sealed at a newer epoch that no metadata names (a
    sequencer that died between sealing and publishing): the refusal came
    out of the walk as a bare StaleEpoch, where every read of the walk
    itself waits for the new epoch (and repairs a half-done seal)."""
    from pyzlog.core.layout import stripe_places
    from pyzlog.core.native import Op

    lg = Log.create(rados_cluster, ceph.pool, log_name, width=4)
    lg.append_many([b"x%d" % i for i in range(8)])
    st = lg.state
    view = st.meta.views[-1]
    for place in stripe_places(log_name, view, 0)[1:]:
        code, _ = st.conn.call_raw(st.data, place.oid, Op.SEAL, epoch=st.epoch + 1, format=view.format)
        assert code == 0
    reader = Log.open(rados_cluster, ceph.pool, log_name)
    assert positions(reader.stream(0, stride_index=0, stride=4)) == [(0, "data"), (4, "data")]
    assert positions(reader.stream(1)) == [(p, "data") for p in range(1, 8)]


def test_a_follow_outlives_epoch_changes_further_apart_than_the_stale_limit(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name, monkeypatch) -> None:
    """A follow at an idle tail reads batches with no rows. When only rows
    reset its stale wait, an epoch change more than the wait's limit after
    the one before it raised StaleEpoch out of the stream (limit cut to 1 s
    here, 30 s by default)."""
    from functools import partial

    from pyzlog.client import batches
    from pyzlog.core.tailfind import find_tail

    monkeypatch.setattr(batches, "StaleWait", partial(batches.StaleWait, limit=1.0))
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    lg.append_many([b"a", b"b"])
    writer = Log.open(rados_cluster, ceph.pool, log_name)
    s = Log.open(rados_cluster, ceph.pool, log_name).stream(0, follow=True)
    got: list[int] = []
    failed: list[BaseException] = []

    def follow() -> None:
        try:
            for r in s:
                got.append(r.position)
                if len(got) == 3:
                    return
        except BaseException as e:  # noqa: BLE001 - what the test reports
            failed.append(e)

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    while len(got) < 2 and t.is_alive():
        time.sleep(0.05)
    for _ in range(2):
        find_tail(writer.state)  # an epoch change: the follower's next read is refused once
        time.sleep(1.5)  # the follower polls the tail meanwhile, at the new epoch
    writer.append(b"c")
    t.join(60)
    s.close()
    assert failed == [] and got == [0, 1, 2]
