"""pyzlog.aio (issue 26) on the real cluster: thousands of appends under
asyncio.gather, back-pressure from the window, cancellation in the middle
of a batch that loses nothing, a sequencer failover under gather, streams
with every gap kind and no thread per reader, named consumers."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from interrupts import InterruptAfter, InterruptedWindow
from seqr_proc import Fleet

from pyzlog import CommitRefused, EntryTooLarge, InvalidRequest, Log, LogNotFound, NotWritten, RecordKind, aio
from pyzlog.client import metrics
from pyzlog.core import wire
from pyzlog.core.registry import registry_ioctx

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 300))


def stored(rados_cluster, pool: str, name: str) -> dict[int, bytes]:  # type: ignore[no-untyped-def]
    """Every data entry of the log, by position (read with the sync stream)."""
    log = Log.open(rados_cluster, pool, name)
    out = {r.position: r.data for r in log.stream(0) if r.kind is RecordKind.DATA}
    log.close()
    return out  # type: ignore[return-value]


def test_the_queue_notify_fd_is_readable_while_results_wait(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    """dp_queue_notify_fd: readable from a completion until wait() has
    handed out everything ready; a wake makes it readable too."""
    import select

    from pyzlog._dataplane import lib
    from pyzlog.core.native import Connection, Op

    log = Log.create(rados_cluster, ceph.pool, log_name, width=1)
    log.append_many([b"x", b"y"])
    conn = Connection.of(rados_cluster)
    q = conn.queue(max_results=1)
    fd = q.notify_fd()
    assert q.notify_fd() == fd  # one per queue

    def readable(timeout: float = 0.0) -> bool:
        return bool(select.select([fd], [], [], timeout)[0])

    assert not readable()
    epoch, place = log.state.locate(0)  # (epoch, Place) since the storage issue
    q.submit(log.state.data, place.oid, Op.READ, 1, epoch=epoch, position=0, format=place.format)
    q.submit(log.state.data, place.oid, Op.READ, 2, epoch=epoch, position=1, format=place.format)
    assert readable(30)
    q.drain(30)  # both replies in: one wait of max 1 leaves one ready
    assert [t for t, _, _ in q.wait(0)] == [1] and readable()
    assert [(t, c, v) for t, c, v in q.wait(0)] == [(2, 0, b"y")] and not readable()
    lib.dp_queue_wake(q.handle)
    assert readable() and q.wait(0) == [] and not readable()
    q.close()


def test_thousands_of_appends_under_gather(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    async def main() -> tuple[list[int], list[int], int]:
        log = await aio.Log.create(rados_cluster, ceph.pool, log_name, width=3, sequencer=seqr.address)
        assert isinstance(log, aio.AsyncLog) and log.window == 128
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, log.in_flight, log.sync._async.in_flight)  # noqa: SLF001
                await asyncio.sleep(0)

        w = asyncio.create_task(watch())
        singles = await asyncio.gather(*[log.append(b"a%d" % i) for i in range(5000)])
        many = await log.append_many([b"m%d" % i for i in range(700)])
        w.cancel()
        assert await log.read(singles[17]) == b"a17"
        await log.close()
        return singles, many, peak

    singles, many, peak = run(main())
    assert 1 <= peak <= 128  # never more than the window outstanding
    assert len(set(singles) | set(many)) == 5700
    assert many == sorted(many)
    data = stored(rados_cluster, ceph.pool, log_name)
    assert all(data[p] == b"a%d" % i for i, p in enumerate(singles))
    assert all(data[p] == b"m%d" % i for i, p in enumerate(many))
    assert len(data) == 5700


def test_back_pressure_with_a_small_window(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    async def main() -> tuple[int, int]:
        log = await aio.Log.create(rados_cluster, ceph.pool, log_name, sequencer=seqr.address, max_in_flight=4)
        peak = queued = 0

        async def watch() -> None:
            nonlocal peak, queued
            while True:
                peak = max(peak, log.in_flight, log.sync._async.in_flight)  # noqa: SLF001
                queued = max(queued, len(log._waiters))  # noqa: SLF001
                await asyncio.sleep(0)

        w = asyncio.create_task(watch())
        got = await asyncio.gather(*[log.append(b"%d" % i) for i in range(400)])
        w.cancel()
        assert sorted(got) == list(range(400))
        assert log.in_flight == 0
        await log.close()
        return peak, queued

    peak, queued = run(main())
    assert peak == 4 and queued > 300  # the rest waited their turn, on the loop


def test_typed_errors_and_reads(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        log = await aio.Log.create(rados_cluster, ceph.pool, log_name, sequencer=seqr.address,
                                   compression="zstd")
        with pytest.raises(EntryTooLarge):
            await log.append(b"\0" * (wire.MAX_ENTRY_BYTES + 1) + b"x" * 7)
        with pytest.raises(InvalidRequest):
            await log.append("text")  # type: ignore[arg-type]
        with pytest.raises(EntryTooLarge):  # checked before any is sent: nothing stored
            await log.append_many([b"ok", b"\0" * (wire.MAX_ENTRY_BYTES + 1) + b"y" * 7])
        assert await log.next_position_hint() == 0
        pos = await log.append(b"z" * 1000)
        assert await log.read(pos) == b"z" * 1000
        with pytest.raises(NotWritten):
            await log.read(pos + 5)
        with pytest.raises(InvalidRequest):
            await log.read(-1)
        with pytest.raises(InvalidRequest):
            log.stream(5, 2)
        assert log.in_flight == 0
        await log.close()

    run(main())
    with pytest.raises(LogNotFound):
        run(aio.Log.open(rados_cluster, ceph.pool, log_name + "-missing"))


def _accounting(rados_cluster, ceph, name: str, reported: dict[bytes, int | BaseException],  # type: ignore[no-untyped-def]
                returned: dict[bytes, int], everything: list[bytes]) -> tuple[int, int]:
    """Every entry is in the log at the position reported for it (returned
    to its task, or to on_cancelled), or was never sent and is not there."""
    assert not set(reported) & set(returned)
    failed = [d for d, o in reported.items() if not isinstance(o, int)]
    assert failed == []
    where = {**returned, **{d: o for d, o in reported.items() if isinstance(o, int)}}
    data = stored(rados_cluster, ceph.pool, name)
    assert {d: p for p, d in data.items()} == where  # nothing stored unreported, nothing reported missing
    unsent = [d for d in everything if d not in where]
    return len(reported), len(unsent)


def test_cancelling_append_many_midway_loses_nothing(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    reported: dict[bytes, int | BaseException] = {}
    entries = [b"c%05d" % i for i in range(3000)]
    base = dict(metrics.AIO_CANCELLED)
    counts = {k: v.value for k, v in base.items()}

    async def main() -> None:
        log = await aio.Log.create(rados_cluster, ceph.pool, log_name, sequencer=seqr.address, max_in_flight=32,
                                   on_cancelled=lambda d, o: reported.__setitem__(d, o))
        task = asyncio.create_task(log.append_many(entries))
        while log.sync.next_position_hint() < 500:  # part of the batch is stored
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await log.flush()  # the sent ones settle
        await log.close()

    run(main())
    n_reported, n_unsent = _accounting(rados_cluster, ceph, log_name, reported, {}, entries)
    assert n_reported >= 500 and n_unsent > 0, (n_reported, n_unsent)  # cut in the middle
    assert n_reported + n_unsent == 3000
    assert metrics.AIO_CANCELLED["stored"].value - counts["stored"] == n_reported
    assert metrics.AIO_CANCELLED["unsent"].value - counts["unsent"] == n_unsent


def test_cancelling_a_gather_of_appends_loses_nothing(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    reported: dict[bytes, int | BaseException] = {}
    returned: dict[bytes, int] = {}
    entries = [b"g%05d" % i for i in range(3000)]

    async def main() -> None:
        log = await aio.Log.create(rados_cluster, ceph.pool, log_name, sequencer=seqr.address, max_in_flight=64,
                                   on_cancelled=lambda d, o: reported.__setitem__(d, o))

        async def one(d: bytes) -> None:
            returned[d] = await log.append(d)

        tasks = [asyncio.create_task(one(d)) for d in entries]
        while len(returned) < 800:
            await asyncio.sleep(0.002)
        for t in tasks:  # some waiting for room, some sent, some done
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await log.flush()
        await log.close()

    run(main())
    n_reported, n_unsent = _accounting(rados_cluster, ceph, log_name, reported, returned, entries)
    assert len(returned) >= 800 and n_unsent > 0


def test_failover_under_gather(rados_cluster, ceph, log_name, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The active sequencer killed -9 while thousands of appends are awaited:
    every one succeeds, at a position of its own, with its data there."""
    fleet = Fleet(ceph.conf, ceph.pool, tmp_path, lease=1.0)
    try:
        a, b = fleet.start(), fleet.start()
        got: dict[int, bytes] = {}

        async def main() -> str:
            log = await aio.Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=a.address)
            first = await log.append(b"first")
            got[first] = b"first"
            assert (await log.refresh()).sequencer == a.address
            done = 0

            async def one(i: int) -> None:
                nonlocal done
                d = b"f%d" % i
                pos = await log.append(d)
                assert pos not in got
                got[pos] = d
                done += 1

            work = asyncio.gather(*[one(i) for i in range(6000)])
            while done < 1500:
                await asyncio.sleep(0.005)
            a.kill()  # kill -9 mid-gather
            await work
            after = await log.append(b"after")
            got[after] = b"after"
            owner = (await log.refresh()).sequencer
            await log.close()
            return str(owner)

        assert run(main()) == b.address
        assert len(got) == 6002
        data = stored(rados_cluster, ceph.pool, log_name)
        assert all(data[p] == d for p, d in got.items())
    finally:
        fleet.close()
        io = registry_ioctx(rados_cluster, ceph.pool)
        for p in fleet.started:
            try:
                io.remove_object(p.address)
            except Exception:  # noqa: BLE001 - removed by its own clean stop
                pass


def test_streams_match_the_sync_stream_with_every_gap(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=3, sequencer=seqr.address)
    log.append_many([b"d%d" % i for i in range(50)])
    log.fill(log.take_positions(1))              # FILLED
    hole = log.take_positions(1)                 # a hole: LOST after hole_wait
    log.append_many([b"e%d" % i for i in range(20)])
    log.trim(3)                                  # TRIMMED
    log.reconfigure(width=2)
    log.append_many([b"w%d" % i for i in range(30)])

    async def main() -> tuple[list[Any], int, list[Any]]:
        alog = aio.AsyncLog(log)
        recs = [r async for r in alog.stream(0, hole_wait=0.3)]
        rows = 0
        async for b in alog.stream_batches(0, hole_wait=0.3):
            rows += b.num_rows
        part = [r async for r in alog.stream(0, stride_index=1, stride=2)]
        return recs, rows, part

    recs, rows, part = run(main())
    sync = list(log.stream(0))
    assert recs == sync and rows == len(sync) == 102
    kinds = {r.position: r.kind for r in recs}
    assert kinds[3] is RecordKind.TRIMMED and kinds[50] is RecordKind.FILLED and kinds[hole] is RecordKind.LOST
    assert part == [r for r in sync if r.position % 2 == 1]


def test_follow_streams_take_no_thread_per_reader(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    readers = 40

    async def main() -> tuple[list[list[bytes]], int]:
        log = await aio.Log.create(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
        before = threading.active_count()
        got: list[list[bytes]] = [[] for _ in range(readers)]

        async def read(k: int) -> None:
            async for rec in log.stream(0, follow=True):
                got[k].append(rec.data)  # type: ignore[arg-type]
                if len(got[k]) == 300:
                    return

        tasks = [asyncio.create_task(read(k)) for k in range(readers)]
        await asyncio.sleep(0.5)  # every reader waits at the tail
        for i in range(300):
            await log.append(b"n%d" % i)
            if i % 50 == 0:
                await asyncio.sleep(0.05)
        await asyncio.gather(*tasks)
        grown = threading.active_count() - before
        await log.close()
        return got, grown

    got, grown = run(main())
    assert all(g == [b"n%d" % i for i in range(300)] for g in got)
    # the default executor's few threads at most (tail refreshes), not one per reader
    assert grown < readers // 4, grown


async def cancel_a_waiting_next(s: Any) -> None:
    """An __anext__ of stream `s` that waits at the tail, cancelled."""
    waiter = asyncio.create_task(anext(s))
    await asyncio.sleep(0.3)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


def test_a_cancelled_stream_goes_on_where_it_was(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
    log.append_many([b"s%d" % i for i in range(10)])

    async def main() -> list[int]:
        alog = aio.AsyncLog(log)
        s = alog.stream(0, follow=True)
        seen = [(await anext(s)).position for _ in range(10)]
        await cancel_a_waiting_next(s)
        await alog.append_many([b"t%d" % i for i in range(5)])
        seen += [(await anext(s)).position for _ in range(5)]
        await s.aclose()
        return seen

    assert run(main()) == list(range(15))


def test_a_cancelled_batch_stream_goes_on_where_it_was(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    """stream_batches() too: it was a bare async generator, closed for good
    by the cancellation, so a following loop ended without a word."""
    log = Log.create(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
    log.append_many([b"s%d" % i for i in range(10)])

    async def main() -> list[int]:
        alog = aio.AsyncLog(log)
        s = alog.stream_batches(0, follow=True)
        seen = (await anext(s)).column(0).to_pylist()
        await cancel_a_waiting_next(s)
        await alog.append_many([b"t%d" % i for i in range(5)])
        while len(seen) < 15:
            seen += (await asyncio.wait_for(anext(s), 30)).column(0).to_pylist()
        await s.aclose()
        return seen

    assert run(main()) == list(range(15))


def test_async_consumer_commits_and_resumes(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        log = await aio.Log.create(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
        await log.append_many([b"c%d" % i for i in range(30)])
        c = await log.consumer("billing")
        assert not c.resumed and c.position == 0
        seen = []
        async for rec in c.stream(follow=False):
            seen.append(rec.position)
            if rec.position == 9:
                assert await c.commit() == 10  # the first commit creates the object
            if rec.position == 19:
                assert await c.commit() == 20  # the guarded aio write
        assert seen == list(range(30))
        again = await log.consumer("billing")
        assert again.resumed and again.position == 20
        with pytest.raises(CommitRefused):
            await again.commit(15)
        assert await again.lag() == 10
        assert (await again.committed_now()).position == 20  # type: ignore[union-attr]
        await log.close()

    run(main())


def test_the_example_service(ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    p = subprocess.run([sys.executable, str(root / "examples" / "aio_service.py"), "--conf", ceph.conf,
                        "--pool", ceph.pool, "--log", log_name, "--orders", "2000", "--seqr", seqr.address],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["appended"] == out["billed"] == 2000 and out["committed"] == out["tail"]
    assert out["duplicates"] == 0 and out["lag"] == 0
    # run again: the consumer resumes past what it committed, bills only the new orders
    p = subprocess.run([sys.executable, str(root / "examples" / "aio_service.py"), "--conf", ceph.conf,
                        "--pool", ceph.pool, "--log", log_name, "--orders", "100", "--seqr", seqr.address],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["appended"] == out["billed"] == 100 and out["resumed_at"] == 2000


@pytest.mark.parametrize("moment", ["read-after-sent", "append-retry-path-after-queued"])
def test_an_interrupt_in_a_send_counts_its_slot_once(rados_cluster, ceph, log_name, seqr, moment) -> None:  # type: ignore[no-untyped-def]
    """A Ctrl-C just after a read went, or just after an append was queued
    for the retry path, gives the AsyncLog's slot back once: the send's own
    cleanup and the outcome that comes all the same both gave it back, so
    in_flight went to -1 and flush() never returned (an adversary's find).
    The interrupted append's outcome goes to on_cancelled."""
    cancelled: list[tuple[bytes, object]] = []

    async def main() -> None:
        log = await aio.Log.create(rados_cluster, ceph.pool, log_name, sequencer=seqr.address, max_in_flight=4,
                                   on_cancelled=lambda data, outcome: cancelled.append((data, outcome)))
        position = await log.append(b"x")
        a = log.sync._async  # noqa: SLF001
        if moment == "read-after-sent":
            q = a.log.conn._completions()  # noqa: SLF001
            q.submit = InterruptAfter(q.submit)
            try:
                with pytest.raises(KeyboardInterrupt):
                    await log.read(position)
            finally:
                del q.submit
        else:
            window = a._window  # noqa: SLF001
            a._window = InterruptedWindow(window)  # noqa: SLF001
            a.positions.usable_now = lambda now=None: False  # as after a sequencer failure: the retry path
            try:
                with pytest.raises(KeyboardInterrupt):
                    await log.append(b"interrupted")
            finally:
                a._window = window  # noqa: SLF001
                del a.positions.usable_now
        for _ in range(100):
            await asyncio.sleep(0.05)
            if a.in_flight == 0 and (cancelled or moment == "read-after-sent"):
                break
        assert log.in_flight == 0 and a.in_flight == 0
        assert await log.read(position) == b"x"
        await asyncio.wait_for(log.flush(), 10)
        assert log.in_flight == 0
        await log.close()

    run(main())
    if moment != "read-after-sent":
        assert len(cancelled) == 1 and cancelled[0][0] == b"interrupted" and isinstance(cancelled[0][1], int)
