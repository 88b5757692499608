"""Adversarial tests of Log.stream() on the native read path (batches.Records
over BatchStream): every result must be what the oracle (tests/oracle.py:
round 2's stream() on python-rados) gives, and a stream must survive errors, abandonment
and interpreter exit.

Written by an adversary helper against the first native stream(); eight of
them failed then and pass now. Where a docstring says what the native path
"does" wrong, it describes that first version: the defect each test guards
against."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pyzlog import ClusterUnavailable, InvalidRequest, Log, RecordKind, ZlogError
from pyzlog.client import metrics

import oracle
from clsobj import log_obj

ROOT = Path(__file__).resolve().parent.parent


def full(stream: Any) -> list[tuple[int, str, bytes | None, int]]:
    return [(r.position, r.kind.value, r.data, r.epoch) for r in stream]


def both(rados_cluster, ceph, name, monkeypatch, **kw):  # type: ignore[no-untyped-def]
    """(native records, reference records) of the same stream() call."""
    want = full(oracle.stream(Log.open(rados_cluster, ceph.pool, name), **kw))
    got = full(Log.open(rados_cluster, ceph.pool, name).stream(**kw))
    return got, want


# ------------------------------------------------------------------ strides
def test_stride_partition_does_not_wait_on_or_fill_other_partitions_holes(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name, monkeypatch) -> None:
    """A partition (p % 2 == 0) of a width-1 log: position 1 (another
    partition's) is a hole. reader.Stream never looks at 1: it returns 0, 2
    at once and leaves 1 alone. The native stream reads the whole view, sees
    1 as a hole, waits hole_wait for it and fills it LOST (another reader's
    position), then filters it out."""
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=1)
    lg.write(0, b"a")
    lg.write(2, b"c")
    lg.write(3, b"d")
    got = full(Log.open(rados_cluster, ceph.pool, log_name).stream(0, 4, stride_index=0, stride=2, hole_wait=1.5))
    assert [(p, k, d) for p, k, d, _ in got] == [(0, "data", b"a"), (2, "data", b"c")]
    # position 1 belongs to partition 1: its writer may still write it
    lg.write(1, b"b")  # Filled if the partition-0 reader filled it


def test_stride_equal_to_width_sees_a_hole_at_its_objects_end(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name, monkeypatch) -> None:
    """Width 2, partition p % 2 == 0 (one object): 0..7 and 9 written, 8 never.
    8 lies below the tail (9 is stored in the other object), so reader.Stream
    waits and fills it LOST. The native scan of one object only asks that
    object's max_position (6) and takes 8 for the tail."""
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    lg.append_many([b"x%d" % i for i in range(8)])
    lg.write(9, b"x9")
    got = full(Log.open(rados_cluster, ceph.pool, log_name).stream(0, stride_index=0, stride=2, hole_wait=0.2))
    want = full(oracle.stream(Log.open(rados_cluster, ceph.pool, log_name), 0, stride_index=0, stride=2, hole_wait=0.2))
    assert [(p, k) for p, k, _, _ in want][-1] == (8, "lost")
    assert [(p, k) for p, k, _, _ in got] == [(p, k) for p, k, _, _ in want]


def test_stride_equal_to_width_follow_mode_fills_a_dead_writers_hole(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name) -> None:
    """Follow mode, same log: the reader must report 8 as LOST after hole_wait
    (its writer is dead, 9 was written), not wait at 'the tail' forever."""
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    lg.append_many([b"x%d" % i for i in range(8)])
    lg.write(9, b"x9")
    out: list[Any] = []

    def run() -> None:
        for r in Log.open(rados_cluster, ceph.pool, log_name).stream(0, follow=True, stride_index=0, stride=2,
                                                                     hole_wait=0.2):
            out.append((r.position, r.kind.value))
            if r.position >= 8:
                return

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(5)
    stuck = t.is_alive()
    seen = list(out)
    lg.write(10, b"x10")  # unblocks a reader stuck at 8 (object 0 now goes past it)
    t.join(10)
    assert not stuck and seen[-1] == (8, "lost"), seen


# ------------------------------------------------------------------ metrics
def test_bytes_in_counts_stored_bytes_of_compressed_entries(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name, monkeypatch) -> None:
    """metrics.BYTES_IN is 'bytes of entries read, as stored': the compressed
    size, as round 2's stream() counted it."""
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2, compression="zstd")
    lg.append_many([b"z" * 4000 + b"%d" % i for i in range(20)])
    b0, r0 = metrics.BYTES_IN.value, metrics.READS.value
    want = full(oracle.stream(Log.open(rados_cluster, ceph.pool, log_name), 0))
    ref_reads = len(want)
    ref_bytes = sum(len(log_obj(lg, lg.oid_of(p)).read(lg.epoch, p)[1]) for p, _, _, _ in want)  # as stored
    assert ref_bytes < sum(len(d) for _, _, d, _ in want)
    b0, r0 = metrics.BYTES_IN.value, metrics.READS.value
    got = full(Log.open(rados_cluster, ceph.pool, log_name).stream(0))
    assert got == want
    assert metrics.READS.value - r0 == ref_reads == 20
    assert metrics.BYTES_IN.value - b0 == ref_bytes


def test_reads_metric_counts_only_records_handed_out(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name, monkeypatch) -> None:
    """A reader that takes 5 records and stops counts 5 reads, not the whole
    batch the stream converted."""
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    lg.append_many([b"x%d" % i for i in range(100)])
    s = Log.open(rados_cluster, ceph.pool, log_name).stream(0)
    r0 = metrics.READS.value
    for _ in range(5):
        next(s)
    assert metrics.READS.value - r0 == 5
    s.close()


# ------------------------------------------------------------------- errors
def test_an_undecodable_entry_does_not_skip_the_records_before_and_after(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name, monkeypatch) -> None:
    """Position 5 of a zstd log holds bytes that are not a zstd frame (a
    foreign writer). reader.Stream yields 0..4 and then raises at 5 (on
    every retry: it never skips). The native stream decodes the whole batch
    first: it raises before handing out 0..4, and the retry goes on after
    the batch, so 0..9 are never seen."""
    from pyzlog.client import ops

    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2, compression="zstd")
    lg.append_many([b"ok%d" % i for i in range(5)])
    ops.write(lg.state, 5, b"\x00not zstd at all")
    lg.write(6, b"ok6")
    lg.append_many([b"ok%d" % i for i in range(7, 10)])

    def drain(stream: Any) -> tuple[list[Any], int]:
        got, errors = [], 0
        for _ in range(20):
            try:
                got.append(next(stream).position)
            except StopIteration:
                break
            except Exception:  # noqa: BLE001
                errors += 1
                if errors >= 3:
                    break
        return got, errors

    want = drain(oracle.stream(Log.open(rados_cluster, ceph.pool, log_name), 0))
    got = drain(Log.open(rados_cluster, ceph.pool, log_name).stream(0))
    assert want[0][:5] == [0, 1, 2, 3, 4]
    assert got == want


def test_error_once_inside_hole_handling_no_dup_no_skip(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name, monkeypatch) -> None:
    """An error from fill_hole (the cluster times out while filling a hole),
    then next() again: every position once, in order."""
    from pyzlog.client import batches

    lg = Log.create(rados_cluster, ceph.pool, log_name, width=3)
    lg.append_many([b"a%d" % i for i in range(10)])
    lg.write(12, b"a12")  # 10, 11 holes
    lg.append_many([b"b%d" % i for i in range(5)])
    real = batches.fill_hole
    calls = {"n": 0}

    def flaky(log: Any, pos: int) -> bool:
        calls["n"] += 1
        if calls["n"] == 2:
            raise ClusterUnavailable("injected")
        return real(log, pos)

    monkeypatch.setattr(batches, "fill_hole", flaky)
    s = lg.stream(0, hole_wait=0.1)
    got, errors = [], 0
    while True:
        try:
            got.append((next(s).position))
        except ClusterUnavailable:
            errors += 1
        except StopIteration:
            break
    assert errors == 1
    assert got == list(range(len(got))) and len(got) == 18


# -------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw", [
    {"stride": 0, "stride_index": 0},
    {"stride": -2, "stride_index": 0},
    {"stride": 2, "stride_index": -1},
    {"stride": 2, "stride_index": 2},
    {"stride": 2},
    {"stride_index": 0},
    {"start": -1},
    {"start": 5, "end": 4},
    {"start": 0, "end": 1 << 64},
    {"start": 1 << 64},
    {"start": 1.5},
    {"start": True},
    {"start": 0, "end": 2.0},
    {"stride": 2.0, "stride_index": 0},
    {"stride": 2, "stride_index": 0.0},
    {"stride": 2, "stride_index": True},
])
def test_bad_arguments_are_invalid_requests(rados_cluster, ceph, log_name, kw) -> None:  # type: ignore[no-untyped-def]
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    lg.append_many([b"x%d" % i for i in range(10)])
    with pytest.raises(InvalidRequest):
        s = Log.open(rados_cluster, ceph.pool, log_name).stream(**kw)
        list(s)


@pytest.mark.parametrize("stride", [10**6, 1 << 63, (1 << 64) - 1, 1 << 64, 10**30])
def test_a_huge_stride_is_a_partition_of_one_position(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name, monkeypatch, stride) -> None:
    """stride larger than any position: partition 0 holds position 0 only.
    Either that or an InvalidRequest, the same on both paths; never a
    pyarrow/cffi error."""
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=3)
    lg.append_many([b"x%d" % i for i in range(10)])

    def attempt(reader: Any) -> Any:
        try:
            return full(reader(Log.open(rados_cluster, ceph.pool, log_name), 0, 10, stride_index=0, stride=stride))
        except InvalidRequest:
            return "invalid"

    want = attempt(oracle.stream)
    got = attempt(Log.stream)
    assert got == want


NATIVE_SCRIPT = r"""
import sys, os, json
sys.path.insert(0, {root!r})
import pyzlog
from pyzlog import Log
c = pyzlog.connect({conf!r})
kw = json.loads({kw!r})
out = [[r.position, r.kind.value, None if r.data is None else r.data.hex(), r.epoch]
       for r in Log.open(c, {pool!r}, {name!r}).stream(**kw)]
print("OUT" + json.dumps(out), flush=True)
os._exit(0)
"""


def native_in_subprocess(ceph, name: str, kw: dict, timeout: float = 30):  # type: ignore[no-untyped-def]
    """stream(**kw) on the native path in a child (a hang cannot take the test run with it)."""
    import json

    script = NATIVE_SCRIPT.format(root=str(ROOT), conf=ceph.conf, pool=ceph.pool, name=name, kw=json.dumps(kw))
    try:
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=timeout, cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        pytest.fail(f"native stream(**{kw}) still running after {timeout} s")
    line = [x for x in p.stdout.decode().splitlines() if x.startswith("OUT")]
    assert line, p.stderr.decode()[-3000:]
    return [(a, b, None if c is None else bytes.fromhex(c), d) for a, b, c, d in json.loads(line[0][3:])]


def test_a_bounded_stream_at_the_tail_ends(rados_cluster, ceph, log_name, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """stream(tail, tail + 1) on a width-3 log: nothing there, so no records.
    The native scan waits for a reply of every object in refresh_max(), but
    objects with no position in [10, 11) are never asked: it loops forever."""
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=3)
    lg.append_many([b"x%d" % i for i in range(10)])
    assert full(oracle.stream(Log.open(rados_cluster, ceph.pool, log_name), 10, 11)) == []
    assert native_in_subprocess(ceph, log_name, {"start": 10, "end": 11}) == []


CASES = ["5:5", "V:V", "T:", "T:T+5", "M:M", "M:", "3:V", "V-1:V+1", "0:V/2/1", "V-1:V+3/2/0",
         "1:2/3/0", "0:/5/4", "4:V+4/3/1", "V-2:/3/2", "10**12:", "10**12:10**12+5"]


@pytest.mark.parametrize("case", CASES)
def test_empty_and_far_ranges(rados_cluster, ceph, log_name, monkeypatch, case) -> None:  # type: ignore[no-untyped-def]
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=3)
    lg.append_many([b"x%d" % i for i in range(10)])
    lg.reconfigure(width=2)
    lg.refresh()
    lg.append_many([b"y%d" % i for i in range(10)])
    V = lg.views[-1].start  # noqa: N806
    T, M = lg.tail(), wire_max()  # noqa: N806
    rng, _, part = case.partition("/")
    a, _, b = rng.partition(":")
    kw: dict[str, Any] = {"start": eval(a), "end": eval(b) if b else None, "hole_wait": 0.1}
    if part:
        st, si = part.split("/")
        kw.update(stride=int(st), stride_index=int(si))
    want = full(oracle.stream(Log.open(rados_cluster, ceph.pool, log_name), **kw))
    assert native_in_subprocess(ceph, log_name, kw) == want


def wire_max() -> int:
    from pyzlog.core import wire

    return wire.MAX_POSITION


# ------------------------------------------------------------- differential
def build_log(rados_cluster, ceph, name: str, ops_list: list[tuple[str, int]], width: int,  # type: ignore[no-untyped-def]
              compression: str) -> Log:
    lg = Log.create(rados_cluster, ceph.pool, name, width=width, compression=compression)
    for op, arg in ops_list:
        tail = lg.tail()
        try:
            if op == "append":
                lg.append_many([b"d%d-" % i + b"q" * (i % 50) for i in range(arg)])
            elif op == "hole":  # write past the tail, leaving `arg` holes
                lg.write(tail + arg, b"past%d" % arg)
            elif op == "fill":
                lg.fill(max(tail - 1 - arg, 0))
            elif op == "trim":
                lg.trim(max(tail - 1 - arg, 0))
            elif op == "trim_to":
                lg.trim_to(min(arg, tail))
            elif op == "reconf":
                lg.reconfigure(width=arg)
                lg.refresh()
            elif op == "empty":
                lg.append(b"")
        except ZlogError:
            pass
    return lg


def test_differential_random_logs(rados_cluster, ceph, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import uuid

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    op = st.one_of(
        st.tuples(st.just("append"), st.integers(1, 30)),
        st.tuples(st.just("hole"), st.integers(0, 4)),
        st.tuples(st.just("fill"), st.integers(0, 5)),
        st.tuples(st.just("trim"), st.integers(0, 5)),
        st.tuples(st.just("trim_to"), st.integers(0, 40)),
        st.tuples(st.just("reconf"), st.integers(1, 5)),
        st.tuples(st.just("empty"), st.just(0)),
    )

    @settings(max_examples=int(os.environ.get("ADV_EXAMPLES", "10")), deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(ops_list=st.lists(op, min_size=1, max_size=8), width=st.integers(1, 4),
           compression=st.sampled_from(["none", "zstd"]), data=st.data())
    def check(ops_list, width, compression, data) -> None:  # type: ignore[no-untyped-def]
        name = f"log-{uuid.uuid4().hex[:12]}"
        lg = build_log(rados_cluster, ceph, name, ops_list, width, compression)
        tail = lg.tail()
        # the whole log first (fills every hole, so what follows is stable)
        got, want = both(rados_cluster, ceph, name, monkeypatch, start=0, hole_wait=0.05)
        again = full(oracle.stream(Log.open(rados_cluster, ceph.pool, name), 0))
        assert got == again, (ops_list, width)
        assert want == again
        for _ in range(3):
            start = data.draw(st.integers(0, tail + 3))
            # (an end past an unwritten tail position hangs the native path:
            # test_a_bounded_stream_at_the_tail_ends)
            end = data.draw(st.one_of(st.none(), st.integers(min(start, tail), tail)))
            start = min(start, end) if end is not None else start
            kw: dict[str, Any] = {"start": start, "end": end, "hole_wait": 0.05}
            if data.draw(st.booleans()):
                stride = data.draw(st.integers(1, 6))
                kw.update(stride=stride, stride_index=data.draw(st.integers(0, stride - 1)))
            g, w = both(rados_cluster, ceph, name, monkeypatch, **kw)
            assert g == w, (ops_list, width, compression, kw)

    check()


# ------------------------------------------------------------------ follow
def test_follow_sees_every_acknowledged_append_once_across_reconfigures(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name) -> None:
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    acked: list[tuple[int, bytes]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def appender(tag: int) -> None:
        w = Log.open(rados_cluster, ceph.pool, log_name)
        i = 0
        while not stop.is_set() and i < 150:
            d = b"w%d-%d" % (tag, i)
            try:
                p = w.append(d)
            except ZlogError:
                continue
            with lock:
                acked.append((p, d))
            i += 1

    def reconf() -> None:
        r = Log.open(rados_cluster, ceph.pool, log_name)
        for width in (3, 1, 4):
            time.sleep(0.3)
            r.reconfigure(width=width)

    seen: list[Any] = []
    reader_done = threading.Event()

    def reader() -> None:
        for r in Log.open(rados_cluster, ceph.pool, log_name).stream(0, follow=True, hole_wait=0.5):
            seen.append((r.position, r.kind.value, r.data))
            if r.kind is RecordKind.DATA and sum(1 for s in seen if s[1] == "data") >= 450:
                break
        reader_done.set()

    rt = threading.Thread(target=reader, daemon=True)
    rt.start()
    ws = [threading.Thread(target=appender, args=(k,)) for k in range(3)]
    ct = threading.Thread(target=reconf)
    for t in ws + [ct]:
        t.start()
    for t in ws + [ct]:
        t.join(60)
    reader_done.wait(30)
    assert reader_done.is_set(), f"reader stuck after {len(seen)} records"
    positions = [s[0] for s in seen]
    assert positions == sorted(set(positions))
    data_at = {p: d for p, k, d in seen if k == "data"}
    for p, d in acked:
        assert data_at.get(p) == d, (p, d)


# ------------------------------------------------------------------- holes
def test_two_readers_race_to_fill_a_hole_and_a_late_write_is_refused(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name) -> None:
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=3)
    lg.append_many([b"a%d" % i for i in range(5)])
    lg.write(7, b"a7")  # 5, 6 holes
    results: list[Any] = [None, None]
    barrier = threading.Barrier(2)

    def read(i: int) -> None:
        s = Log.open(rados_cluster, ceph.pool, log_name).stream(0, hole_wait=0.3)
        barrier.wait()
        results[i] = full(s)

    ts = [threading.Thread(target=read, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(20)
    late_ok = []
    for p in (5, 6):
        try:
            lg.write(p, b"late")
            late_ok.append(p)
        except ZlogError:
            pass
    assert late_ok == []
    for res in results:
        assert [(p, k) for p, k, _, _ in res] == [(p, "data") for p in range(5)] + [(5, "lost"), (6, "lost"),
                                                                                      (7, "data")]
    for res in [full(lg.stream(0))]:
        assert [(p, k) for p, k, _, _ in res][5:7] == [(5, "lost"), (6, "lost")]


# -------------------------------------------------------- abandon / exit
def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_abandoning_1000_streams_mid_batch_leaks_nothing(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    import gc

    lg = Log.create(rados_cluster, ceph.pool, log_name, width=3)
    lg.append_many([b"x%d" % i for i in range(3000)])
    for _ in range(20):
        s = lg.stream(0)
        next(s)
    gc.collect()
    time.sleep(0.5)
    threads, fds = threading.active_count(), _fds()
    for i in range(1000):
        s = lg.stream(i)
        assert next(s).position == i
        if i % 2:
            s.close()  # type: ignore[attr-defined]
        del s
    gc.collect()
    time.sleep(1.0)
    assert threading.active_count() <= threads
    assert _fds() <= fds + 2
    # follow-mode streams abandoned while waiting at the tail
    for _ in range(100):
        s = lg.stream(2999, follow=True)
        assert next(s).position == 2999
        del s
    gc.collect()
    time.sleep(1.0)
    assert threading.active_count() <= threads
    assert _fds() <= fds + 2


EXIT_SCRIPT = r"""
import sys, threading, time, os
sys.path.insert(0, {root!r})
import pyzlog
from pyzlog import Log
c = pyzlog.connect({conf!r})
lg = Log.open(c, {pool!r}, {name!r})
started = threading.Barrier({n} + 1)
def run(i):
    s = lg.stream(i, follow=True, hole_wait=0.5)
    next(s)
    started.wait()
    try:
        for r in s:
            pass
    except pyzlog.ZlogError:
        pass  # ClusterUnavailable("the process is exiting"): a clean refusal
for i in range({n}):
    threading.Thread(target=run, args=(i,), daemon=True).start()
started.wait()
def appender():
    try:
        while True:
            lg.append(b"more")
    except pyzlog.ZlogError:
        pass
threading.Thread(target=appender, daemon=True).start()
time.sleep(0.3)
{ending}
"""


@pytest.mark.parametrize("ending", ["sys.exit(0)", "pass", "os._exit(0) if False else None\nraise SystemExit"])
def test_exit_with_follow_streams_in_flight(rados_cluster, ceph, log_name, ending) -> None:  # type: ignore[no-untyped-def]
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    lg.append_many([b"x%d" % i for i in range(20)])
    script = EXIT_SCRIPT.format(root=str(ROOT), conf=ceph.conf, pool=ceph.pool, name=log_name, n=6, ending=ending)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60, cwd=str(ROOT))
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 0, err[-3000:]
    for bad in ("terminate called", "Fatal Python error", "Segmentation", "Traceback"):
        assert bad not in err, err[-3000:]
