"""Streams on a real cluster (issue 25): entries carry the backpointers the
sequencer hands out with their positions; a runtime that hosts one object
follows them instead of reading the whole log; after a sequencer restart no
backpointer names a wrong position and readers fall back to a scan where
the sequencer knew nothing."""
from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from replicas import HOLE_WAIT, Replicas
from seqr_proc import SeqrProcess

from pyzlog import InvalidRequest, Log
from pyzlog.objects import Runtime, entry
from pyzlog.objects.entry import HEADER, HEADER_SIZE, MAGIC


@pytest.fixture
def logs(rados_cluster, ceph, log_name, seqr) -> Iterator[Replicas]:  # type: ignore[no-untyped-def]
    r = Replicas(rados_cluster, ceph.pool, log_name, seqr.address)
    yield r
    r.close()


def stream_entries(log: Log) -> dict[int, list[tuple[int, int, list[int], list[int]]]]:
    """{stream: [(position, horizon, recent backpointers, skip pointers)]} of
    every entry with a backpointer section, read from the whole log."""
    out: dict[int, list[tuple[int, int, list[int], list[int]]]] = {}
    for batch in log.stream_batches(0, log.tail(), hole_wait=HOLE_WAIT):
        for pos, data in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
            if data is None or data[:2] != MAGIC or not data[4] & entry.FLAG_BACKPOINTERS:
                continue
            assert HEADER.unpack_from(data)[1] == entry.VERSION
            _k, sections, _off = entry.parse_backpointers(data, pos)
            for s, (h, back, far) in sections.items():
                out.setdefault(s, []).append((pos, h, back, far))
    return out


def maps_state(rt: Runtime) -> dict[str, Any]:
    return {name: obj.snapshot() for name, obj in sorted(rt.hosted().items())}


def test_backpointers_correct_under_concurrent_appenders(logs: Replicas) -> None:
    """Three runtimes append to six maps at once, one at a time and in
    batches: every entry's backpointers are exactly its stream's previous
    positions (the last K), and a runtime hosting one map reads only its
    entries and reaches the state a full replay reaches."""
    writers = [logs.new(streams=True) for _ in range(3)]
    names = [f"m{i}" for i in range(6)]

    def work(rt: Runtime, seed: int) -> None:
        rnd = random.Random(seed)
        maps = [rt.map(n) for n in names]
        futures = []
        for i in range(120):
            m = rnd.choice(maps)
            if i % 3:
                m[f"k{rnd.randrange(20)}"] = i
            else:
                futures.append(m.put_async(f"a{rnd.randrange(20)}", i))
        for f in futures:
            f.result(60)
        with rt.transaction():  # a commit record in two streams (blind writes: no reads)
            maps[0][f"tx{seed}"] = seed
            maps[1][f"tx{seed}"] = seed

    threads = [threading.Thread(target=work, args=(rt, i)) for i, rt in enumerate(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)

    found = stream_entries(logs.log)
    k = 16
    assert set(found) == {entry.stream_id(n) for n in names}
    for s, rows in found.items():
        positions = [p for p, _h, _b, _f in rows]
        for i, (pos, horizon, back, far) in enumerate(rows):
            assert horizon == 0
            assert back == positions[:i][::-1][:k], (s, pos)
            # skip pointers: the newest entry whose ordinal is a multiple of 2^level (below the recent ones)
            want = []
            for level in range(4, 64):
                m = ((i - 1) >> level) << level
                if i > k and m < i - k and (not want or positions[m] < want[-1]):
                    want.append(positions[m])
                if i <= k or m == 0:
                    break
            assert far == want, (s, pos)

    full = logs.new()
    for n in names:
        full.map(n)
    full.sync()
    for n in names:
        one = logs.new(streams=True)
        one.map(n)
        one.sync()
        assert maps_state(one) == {n: full.map(n).snapshot()}
        assert one.walk_stats.scans == 0 and one.walk_stats.not_ours == 0
        assert one.stats.read == len(found[entry.stream_id(n)])
        # parsed whole: the chain down from the answer's oldest recent backpointer
        # (every K-th entry), the skip pointers' (multiples of 16) and the
        # transactions' commits (two streams); the rest only checked
        assert one.walk_stats.parsed <= 2 * (len(found[entry.stream_id(n)]) // k + 1) + 8, one.walk_stats


def test_sequencer_restart_never_leaves_a_wrong_backpointer(logs: Replicas, seqr: SeqrProcess, ceph) -> None:  # type: ignore[no-untyped-def]
    """Appends, a kill -9 of the sequencer, a new one on the same address,
    more appends. Every backpointer an entry carries names an entry of its
    stream; entries after the restart know nothing below the new horizon;
    a stream-only reader scans below it and agrees with a full replay."""
    w = logs.new(streams=True)
    a, b = w.map("a"), w.map("b")
    for i in range(30):
        (a if i % 3 else b)[f"k{i}"] = i
    seqr.kill()
    again = SeqrProcess(ceph.conf, port=seqr.port, log_path=seqr.log_path).start()
    try:
        for i in range(30, 60):
            (a if i % 3 else b)[f"k{i}"] = i
        # a proposal left in flight at the kill may have been retried: let everything land
        w.sync()
        found = stream_entries(logs.log)
        horizons = set()
        for s, rows in found.items():
            mine = {p for p, _h, _b, _f in rows}
            for pos, horizon, back, far in rows:
                horizons.add(horizon)
                for bp in back + far:
                    assert bp in mine and bp < pos, (s, pos, bp)
                    assert bp >= horizon
        assert 0 in horizons and max(horizons) > 0  # the restart made a horizon
        full = logs.new()
        full.map("a")
        full.map("b")
        full.sync()
        one = logs.new(streams=True)
        one.map("a")
        one.sync()
        assert maps_state(one) == {"a": full.map("a").snapshot()}
        assert one.walk_stats.scans >= 1  # below the horizon it scanned
        # a reader that starts above the horizon follows backpointers only
        one.map("a")["late"] = 1
        later = logs.new(streams=True)
        later.map("a")
        later.sync()
        assert later.map("a")["late"] == 1
    finally:
        again.kill()


def test_stream_only_replicas_of_a_map_counter_and_queue_match_full_replay(logs: Replicas) -> None:
    w = logs.new(streams=True)
    m, c, q = w.map("m"), w.counter("c"), w.queue("q")
    for i in range(40):
        m[f"k{i % 7}"] = i
        c.add(i)
        if i % 4 == 0:
            q.put(f"job{i}")
        if i % 9 == 0:
            q.get()
    with w.transaction():
        m["t"] = "x"
        q.put("in-tx")
    full = logs.new()
    for name, host in (("m", full.map), ("c", full.counter), ("q", full.queue)):
        host(name)
    full.sync()
    for name in ("m", "c", "q"):
        rt = logs.new(streams=True)
        getattr(rt, {"m": "map", "c": "counter", "q": "queue"}[name])(name)
        rt.sync()
        assert maps_state(rt) == {name: full.hosted()[name].snapshot()}


def test_a_stream_replay_reads_the_sequencers_history_in_one_round(logs: Replicas, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The sequencer keeps each stream's last positions (STREAM_HISTORY): a
    stream-only replica of one map among three finds its 300 entries in one
    round of reads. Against a sequencer without it (an older zlog-seqr
    answers the op with BAD_REQUEST) it walks the backpointers instead, in
    more rounds, and reaches the same state."""
    w = logs.new(streams=True)
    maps = [w.map(f"m{i}") for i in range(3)]
    futures = [maps[i % 3].put_async(f"k{i % 50}", i) for i in range(900)]
    for f in futures:  # every put in the log (a sync alone covers only what is handed out when it asks)
        f.result(60)
    w.sync()
    one = logs.new(streams=True)
    one.map("m1")
    one.sync()
    assert maps_state(one) == {"m1": maps[1].snapshot()}
    st = one.walk_stats
    assert st.rounds == 1 and st.read == 300 and st.scans == 0, st

    from pyzlog.core.sequencer import BAD_REQUEST, SequencerClient
    real = SequencerClient.streams

    def older(self, pool, log, epoch, count, streams, history=0):  # type: ignore[no-untyped-def]
        if history:
            return (BAD_REQUEST, 0, 0, 0, 0, [])  # as a zlog-seqr from before STREAM_HISTORY answers
        return real(self, pool, log, epoch, count, streams)

    monkeypatch.setattr(SequencerClient, "streams", older)
    walker = logs.new(streams=True)
    walker.map("m1")
    walker.sync()
    assert maps_state(walker) == {"m1": maps[1].snapshot()}
    st = walker.walk_stats
    assert st.rounds > 1 and st.scans == 0, st


def test_read_positions_in_one_call_per_object(logs: Replicas) -> None:
    """read_set (the class's read of any positions of one object) answers
    what a read of each position answers: data, filled, lost, trimmed,
    unwritten; malformed calls are refused EINVAL."""
    import errno

    from pyzlog.core.layout import place_of
    from pyzlog.core.native import Op

    lg = logs.log
    for i in range(6):
        assert lg.append(b"e%d" % i) == i
    assert lg.take_positions(2) == 6
    lg.fill(6)
    lg.fill_lost(7)
    for i in range(8, 12):
        assert lg.append(b"e%d" % i) == i
    lg.trim_to(1)
    pos = lg.take_positions(2)  # handed out, never written
    wanted = [0, 1, 2, 5, 6, 7, 11, pos, pos + 1]
    got = lg.read_positions(wanted)
    assert got == {0: -errno.EIDRM, 1: -errno.EIDRM, 2: b"e2", 5: b"e5", 6: -errno.ENOMSG, 7: -errno.ENOMSG,
                   11: b"e11", pos: -errno.ENODATA, pos + 1: -errno.ENODATA}
    st = lg.state
    where = place_of(st.name, st.meta.views, 5)
    mine = [p for p in range(2, 12) if place_of(st.name, st.meta.views, p).oid == where.oid]
    assert 5 in mine and len(mine) >= 3
    other = next(p for p in range(6, 1 << 20) if place_of(st.name, st.meta.views, p).oid != where.oid)
    for entries in ([(mine[-1], b""), (5, b"")],  # not ascending
                    [(5, b"x")],                  # data with a position
                    [(other, b"")]):              # a position of another object
        code, _ = st.conn.call_raw(st.data, where.oid, Op.READ_SET, epoch=st.meta.epoch, entries=entries,
                                   format=where.format)
        assert code == -errno.EINVAL, entries
    code, window = st.conn.call_raw(st.data, where.oid, Op.READ_SET, epoch=st.meta.epoch,
                                    entries=[(p, b"") for p in mine], format=where.format)
    assert code == 0 and [e.position for e in window.entries()] == mine  # every one is stored


def test_read_positions_under_an_old_epoch_reads_each_position_afresh(rados_cluster, ceph,  # type: ignore[no-untyped-def]
                                                                      log_name) -> None:
    """A reader whose epoch the log has moved past is refused (ESTALE) by
    every object; it reads the metadata and asks again, and each position
    gets the new answer: data, filled, unwritten, never the refusal (nor a
    position taken for unwritten because the first answer was dropped).
    Duplicates in the request are read once."""
    import errno

    lg = Log.create(rados_cluster, ceph.pool, log_name, width=3)
    other = Log.open(rados_cluster, ceph.pool, log_name)
    try:
        for i in range(30):
            assert lg.append(b"s%d" % i) == i
        lg.fill(30)
        old = lg.state.meta.epoch
        other.seal_and_find_tail()  # a new epoch: every object sealed past lg's
        assert lg.state.meta.epoch == old < other.state.meta.epoch
        wanted = [29, 3, 3, 30, 31, 40, 0, 17, 17]
        got = lg.read_positions(wanted)
        assert got == {0: b"s0", 3: b"s3", 17: b"s17", 29: b"s29", 30: -errno.ENOMSG, 31: -errno.ENODATA,
                       40: -errno.ENODATA}
        assert lg.state.meta.epoch == other.state.meta.epoch
    finally:
        lg.close()
        other.close()


def test_a_queue_read_set_sends_positions_from_a_plain_array(logs: Replicas) -> None:
    """Queue.read_set (read_positions' submit, native dp_read_set) answers
    what the request built field by field answers, and refuses a call of no
    positions or more than the class takes before anything is sent."""
    from pyzlog.core import wire
    from pyzlog.core.layout import by_object
    from pyzlog.core.native import Op

    lg = logs.log
    for i in range(40):
        lg.append(b"q%d" % i)
    st = lg.state
    where, mine = by_object(st.name, st.meta.views, list(range(0, 40, 3)))[0]
    code, built = st.conn.call_raw(st.data, where.oid, Op.READ_SET, epoch=st.meta.epoch,
                                   entries=[(p, b"") for p in mine], format=where.format)
    assert code == 0
    with st.conn._waiter() as q:
        q.read_set(st.data, where.oid, st.meta.epoch, where.format, mine, 7)
        [(tag, code, window)] = q.wait(30.0)
        assert (tag, code) == (7, 0)
        assert [(e.position, e.data) for e in window.entries()] == [(e.position, e.data) for e in built.entries()]
        assert [e.data for e in window.entries()] == [b"q%d" % p for p in mine]
        for bad in ([], list(range(wire.MAX_BATCH_ENTRIES + 1))):
            with pytest.raises(InvalidRequest):
                q.read_set(st.data, where.oid, st.meta.epoch, where.format, bad, 8)
        assert q.pending == 0 and q.wait(0.1) == []


def test_read_positions_cuts_apart_entries_read_together(logs: Replicas) -> None:
    """The class reads the bytes of entries lying close together in an
    object in one read and cuts them apart (cls_zlog/store.cc,
    DataStore::get_many): any set of positions reads back what each
    position read alone does, with entries of many sizes (some further
    apart than one read spans), written out of order, and lost fills and
    unwritten positions among them."""
    rnd = random.Random(11)
    lg = logs.log
    first = lg.take_positions(600)
    late = list(range(first + 300, first + 600))
    rnd.shuffle(late)
    order = list(range(first, first + 300)) + late  # bytes in position order, then not
    for p in order:
        r = rnd.random()
        if r < 0.05:
            lg.fill_lost(p)
        elif r > 0.1:
            size = rnd.choice([1, 40, 700, 3000, 5000, 30000])
            lg.write(p, p.to_bytes(4, "little") + rnd.randbytes(size))
    alone = {p: lg.read_positions([p])[p] for p in order}
    assert sum(type(v) is bytes for v in alone.values()) > 450
    everything = sorted(order)
    for subset in (everything, everything[::3], everything[1::7],
                   sorted(rnd.sample(everything, 200)), sorted(rnd.sample(everything, 20))):
        assert lg.read_positions(subset) == {p: alone[p] for p in subset}


def test_a_bad_entry_in_a_batch_fails_alone_with_streams(logs: Replicas) -> None:
    """An entry too large is refused before any position is taken: the
    others of its batch are appended, and no position is left a hole."""
    import pyzlog

    rt = logs.new(streams=True)
    m = rt.map("m")
    futures = [m.put_async(f"k{i}", b"v") for i in range(20)]
    big = m.put_async("big", b"x" * (2 << 20))
    futures += [m.put_async(f"j{i}", b"v") for i in range(20)]
    assert [f.result(60) for f in futures] == [None] * 40
    with pytest.raises(pyzlog.EntryTooLarge):
        big.result(60)
    rt.sync()
    assert logs.log.tail() <= 41  # 40 puts (and at most a RETIRE): nothing taken and thrown away
    assert len(m) == 40


def test_a_walk_whose_sequencer_died_asks_the_one_that_took_over(rados_cluster, ceph, log_name,  # type: ignore[no-untyped-def]
                                                                  tmp_path, monkeypatch) -> None:
    """A reader whose metadata names a sequencer that died (another took the
    log over since) reads the metadata again when that one does not answer,
    and walks with the new one's answer (the walk does not read the
    metadata before asking): only what lies below the new one's horizon is
    scanned, not the whole range. A reader that found no sequencer at all
    before the takeover (and so asks none for a while) asks the new one as
    soon as its metadata names it."""
    import time

    import pyzlog.client.positions
    from pyzlog.core.sequencer import OK, SequencerClient
    from pyzlog.objects.streams import WalkStats, walk

    monkeypatch.setattr(pyzlog.client.positions, "SEQUENCER_RECHECK_SECONDS", 3600.0)

    a = SeqrProcess(ceph.conf, log_path=tmp_path / "a.log").start()
    b = SeqrProcess(ceph.conf, log_path=tmp_path / "b.log").start()
    handles: list[Log] = []
    try:
        lg = Log.create(rados_cluster, ceph.pool, log_name, width=3, sequencer=a.address)
        handles.append(lg)
        rt = Runtime(lg, streams=True)
        m, other = rt.map("m"), rt.map("o")
        for i in range(30):
            m.put(f"k{i}", b"v")
            other.put(f"x{i}", b"v")
        reader, early = Log.open(rados_cluster, ceph.pool, log_name), Log.open(rados_cluster, ceph.pool, log_name)
        handles += [reader, early]
        assert reader.state.meta.sequencer == a.address
        a.kill()
        lost = WalkStats()
        walk(early, [m.stream], 0, 60, None, 2.0, lost)
        assert lost.ranges == [(0, 60)]  # no sequencer answers: all of it scanned (and none asked for a while)
        ask_b = SequencerClient(b.address, cluster=rados_cluster, timeout=2.0)
        deadline = time.monotonic() + 60
        while ask_b.tail(ceph.pool, log_name, lg.state.meta.epoch)[0] != OK:  # B takes the log over
            assert time.monotonic() < deadline, "sequencer B did not take the log over"
            lg.state.refresh()
            time.sleep(0.05)
        for i in range(30, 60):
            m.put(f"k{i}", b"v")
            other.put(f"x{i}", b"v")
        tail = rt.sync()
        rt.close()
        assert reader.state.meta.sequencer == a.address  # what it read at open: the dead one
        stats = WalkStats()
        ps, datas, _kinds, end = walk(reader, [m.stream], 0, tail, None, 2.0, stats)
        # what A handed out lies below B's horizon (B knows streams from there on): scanned; the rest
        # by B's answer (a walk that got no answer scans the whole range)
        assert end == tail == 120 and stats.rounds == 1 and stats.ranges == [(0, 60)], stats
        early.state.refresh()  # its metadata names B now: B is asked at once
        stats = WalkStats()
        assert walk(early, [m.stream], 0, tail, None, 2.0, stats)[3] == tail and stats.ranges == [(0, 60)], stats
        heads = [entry.parse(d) if d is not None else None for d in datas]  # a scanned range: every entry
        assert [p for p, h in zip(ps, heads) if h and h.stream == m.stream] == list(range(0, 120, 2))
    finally:
        for h in handles:
            h.close()
        a.kill()
        b.kill()


def test_a_reader_from_before_a_reconfiguration_reads_the_new_views_entries(rados_cluster, ceph,  # type: ignore[no-untyped-def]
                                                                            log_name, monkeypatch) -> None:
    """A reader whose metadata predates a reconfiguration maps the new view's
    positions to objects of stripes its view never opened (ENOENT): it reads
    the metadata again and finds the entries, where it answered "not
    written" before (read_positions, read and read_async alike; a stream
    walk reads without reading the metadata first)."""
    import pyzlog.core.state

    monkeypatch.setattr(pyzlog.core.state, "VIEW_RECHECK_SECONDS", 0.0)  # however soon after it last read it
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=3, slots=32)
    other = Log.open(rados_cluster, ceph.pool, log_name)
    readers = [Log.open(rados_cluster, ceph.pool, log_name) for _ in range(2)]
    try:
        for i in range(100):
            lg.append(b"a%d" % i)
        old = lg.state.meta.epoch
        other.reconfigure(5)
        ps = [other.append(b"b%d" % i) for i in range(100)]
        assert all(h.state.meta.epoch == old < other.state.meta.epoch for h in [lg, *readers])
        last, want = ps[-5:], [b"b%d" % i for i in range(95, 100)]
        assert lg.read_positions(last) == dict(zip(last, want))
        assert [readers[0].read(p) for p in last] == want
        assert [f.result(30) for f in [readers[1].read_async(p) for p in last]] == want
    finally:
        for h in (lg, other, *readers):
            h.close()


def test_reads_of_a_stripe_not_opened_yet_read_the_metadata_at_most_so_often(  # type: ignore[no-untyped-def]
        rados_cluster, ceph, log_name, monkeypatch) -> None:
    """What the recheck above costs a reader polling the next position at a
    stripe's end (its object not made yet): the metadata is read again at
    most once per VIEW_RECHECK_SECONDS, not once per poll; and a metadata
    read that fails (here the log was deleted under the reader) leaves the
    reads' own answers standing, the readable ones with their data."""
    import errno

    import pyzlog.core.state
    from pyzlog.core.layout import META_NAMESPACE

    monkeypatch.setattr(pyzlog.core.state, "VIEW_RECHECK_SECONDS", 3600.0)
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=3, slots=16)
    try:
        for i in range(48):  # the first stripe, full: position 48 lies in one not opened yet
            lg.append(b"a%d" % i)
        st = lg.state
        st.read_at = 0.0  # long ago: the next recheck reads
        with pytest.raises(pyzlog.NotWritten):
            lg.read(48)
        read_at = st.read_at
        assert read_at > 0.0  # it read the metadata once
        for _ in range(5):
            with pytest.raises(pyzlog.NotWritten):
                lg.read(48)
            assert lg.read_positions([48, 49]) == {48: -errno.ENODATA, 49: -errno.ENODATA}
            assert lg.read_async(48).exception(30) is not None
        assert st.read_at == read_at  # and not again within the interval
        io = rados_cluster.open_ioctx(ceph.pool)
        io.set_namespace(META_NAMESPACE)
        io.remove_object(log_name)
        io.close()
        st.read_at = 0.0
        assert lg.read_positions([5, 20, 48]) == {5: b"a5", 20: b"a20", 48: -errno.ENODATA}
        with pytest.raises(pyzlog.NotWritten):
            lg.read(48)
    finally:
        lg.close()


@pytest.mark.parametrize("fmt,compression", [("omap", "none"), ("data", "zstd")])
def test_read_positions_other_formats(rados_cluster, ceph, log_name, seqr, fmt: str, compression: str) -> None:  # type: ignore[no-untyped-def]
    import errno

    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address, format=fmt,
                    compression=compression)
    try:
        for i in range(10):
            lg.append(b"v%d" % i * 50)
        hole = lg.take_positions(1)
        lg.fill_lost(hole)
        got = lg.read_positions([1, 4, 5, 9, hole, hole + 1])
        assert got == {1: b"v1" * 50, 4: b"v4" * 50, 5: b"v5" * 50, 9: b"v9" * 50, hole: -errno.ENOMSG,
                       hole + 1: -errno.ENODATA}
    finally:
        lg.close()
