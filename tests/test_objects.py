"""Replicated objects on a real cluster (issue 25): the state-machine layer,
the map, counter, register and queue, exactly-once proposals, the gaps of
the log (LOST holes, foreign entries), transactions decided by replay, and
checkpoints with trimming. Several runtimes in one process stand for
several processes: each has its own Log, and none shares state with another
except through the log."""
from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from replicas import HOLE_WAIT, Replicas
from seqr_proc import module_seqr  # noqa: F401 - the fixture `seqr`, once per file

import pyzlog
from pyzlog import InvalidRequest, Timeout
from pyzlog.objects import (MISSING, BadEntry, CheckpointError, Counter, NotApplied, NotHosted, Queue,
                            RadosCheckpoints, Register, ReplicatedMap, Runtime, RuntimeClosed, RuntimeFailed,
                            StateMachine, UnsupportedEntry, WrongType)
from pyzlog.objects import codec, entry
from pyzlog.objects import runtime as runtime_module
from pyzlog.objects.objects import CTR_ADD, MAP_PUT, _OP


@pytest.fixture(params=["sequencer", "no-sequencer"])
def replicas(request, rados_cluster, ceph, log_name, seqr) -> Iterator[Replicas]:  # type: ignore[no-untyped-def]
    r = Replicas(rados_cluster, ceph.pool, log_name, seqr.address if request.param == "sequencer" else None)
    yield r
    r.close()


@pytest.fixture
def pair(rados_cluster, ceph, log_name, seqr) -> Iterator[Replicas]:  # type: ignore[no-untyped-def]
    r = Replicas(rados_cluster, ceph.pool, log_name, seqr.address)
    yield r
    r.close()


def hosting(rt: Runtime) -> tuple[ReplicatedMap, Counter, Register, Queue]:
    return rt.map("m"), rt.counter("c"), rt.register("r"), rt.queue("q")


def state_of(rt: Runtime) -> dict[str, Any]:
    return {name: obj.snapshot() for name, obj in sorted(rt.hosted().items())} | {"applied": rt.applied}


# ------------------------------------------------------------------ basics
def test_objects_return_results_and_replicas_agree(replicas: Replicas) -> None:
    a, b = replicas.new(), replicas.new()
    m, c, r, q = hosting(a)
    m2, c2, r2, q2 = hosting(b)
    m["x"] = 1
    assert m["x"] == 1 and m.get("nope") is None and "x" in m and len(m) == 1
    assert m.cas("x", 1, 2) is True and m.cas("x", 1, 3) is False and m["x"] == 2
    assert m.cas("y", MISSING, b"new") is True and m.cas("y", MISSING, b"again") is False
    assert m.delete("y") is True and m.delete("y") is False
    assert c.add(5) == 5 and c.add(-2) == 3
    assert r.cas(None, "first") is True and r.cas(None, "second") is False and r.value == "first"
    assert q.put("job-a") == 0 and q.put("job-b") == 1
    # b proposes too, through its own log object: the results follow the one order
    assert c2.add(10) == 13
    assert q2.get() == (0, "job-a")
    assert q.get() == (1, "job-b") and q.get() is None
    a.sync()
    b.sync()
    assert state_of(a) == state_of(b)
    assert m.to_dict() == m2.to_dict() == {"x": 2} and c.value == c2.value == 13


def test_sync_makes_reads_linearizable(pair: Replicas) -> None:
    a, b = pair.new(), pair.new()
    m, m2 = a.map("m"), b.map("m")
    for i in range(20):
        m[f"k{i}"] = i
        # b has no reason to play the log, until asked: after sync it sees every acknowledged write
        b.sync()
        assert m2[f"k{i}"] == i
    assert b.stats.read >= 20 and a.stats.from_memory >= 20


def test_async_proposals(pair: Replicas) -> None:
    a, b = pair.new(), pair.new()
    m, c = a.map("m"), a.counter("c")
    futures = [m.put_async(i % 50, b"v%d" % i) for i in range(1000)] + [c.add_async(1) for _ in range(100)]
    assert [f.result(60) for f in futures[:1000]] == [None] * 1000
    assert sorted(f.result(60) for f in futures[1000:]) == list(range(1, 101))
    b.map("m")
    b.counter("c")
    b.sync()
    assert state_of(a)["m"] and state_of(a) == state_of(b)


def test_proposals_in_bursts_and_alone_wake_a_sender_every_time(pair: Replicas,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A proposal never needs a sender's backstop: the first of a burst wakes
    one idle sender and the rest of the burst does not (the nudge), and a
    proposal alone after a burst wakes one again. With the backstop put out
    of reach, a lost wake-up leaves a proposal queued: its result times out."""
    monkeypatch.setattr(runtime_module, "SEND_BACKSTOP_SECONDS", 3600.0)
    a, b = pair.new(), pair.new()
    m = a.map("m")
    sizes = [1, 2, 3, 200, 1, 300, 1, 7, 1, 600, 1]
    for round_ in range(6):
        for n in sizes:
            futures = [m.put_async(f"k{i}", round_) for i in range(n)]
            assert [f.result(30) for f in futures] == [None] * n
        for _ in range(20):  # one at a time, from another thread than the bursts'
            outcome: list[Any] = []
            t = threading.Thread(target=lambda: outcome.append(m.put_async("one", round_).exception(30)))
            t.start()
            t.join(60)
            assert outcome == [None]
    b.map("m")
    b.sync()
    assert b.map("m").snapshot() == m.snapshot()


@pytest.mark.parametrize("interrupted", [False, True], ids=["played", "ctrl-c-before-the-play"])
def test_an_own_put_that_lands_above_a_put_in_flight_is_played(pair: Replicas, monkeypatch: pytest.MonkeyPatch,
                                                              interrupted: bool) -> None:
    """A put_async that lands while a put() below it is still on its way
    does not wake the player (it cannot play past the put's position yet);
    the put, playing to its own position, must leave the rest to the player.
    It played only to its own: the put_async stayed unplayed for ever,
    found in the direct-append change (a put_async racing a put, one round
    in four). A Ctrl-C on the put's thread as its play begins leaves the
    same to the player (an adversary's find: it did not)."""
    a = pair.new()
    m = a.map("m")
    m["warm"] = 0
    real = a.log.append
    appended, landed = threading.Event(), threading.Event()

    def held_append(data: bytes) -> int:
        pos = real(data)
        appended.set()
        landed.wait(30)  # the put_async above lands meanwhile
        return pos

    monkeypatch.setattr(a.log, "append", held_append)

    def ctrl_c_as_play_begins(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name == "_play_here":
            sys.setprofile(None)
            raise KeyboardInterrupt

    def put() -> None:
        if interrupted:
            sys.setprofile(ctrl_c_as_play_begins)
        try:
            m.put("sync", 1, timeout=30)
        except KeyboardInterrupt:
            pass
        finally:
            sys.setprofile(None)

    t = threading.Thread(target=put)
    t.start()
    assert appended.wait(30)
    below = a.log.tail() - 1
    f = m.put_async("async", 2)
    deadline = time.monotonic() + 30
    while not any(p > below for p in a._own) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert any(p > below for p in a._own)  # landed, above the put still held
    landed.set()
    t.join(30)
    assert f.result(10) is None and m["async"] == 2 and m["sync"] == 1


def test_a_user_state_machine(pair: Replicas) -> None:
    class Ledger(StateMachine):
        type_name = "ledger"

        def __init__(self) -> None:
            super().__init__()
            self.lines: list[str] = []

        def apply(self, command: Any, position: int) -> Any:
            if not isinstance(command, str):
                raise ValueError("a ledger line is a string")
            self.lines.append(f"{position}:{command}")
            return len(self.lines)

        def snapshot(self) -> Any:
            return list(self.lines)

        def restore(self, state: Any) -> None:
            self.lines = list(state)

    a, b = pair.new(), pair.new()
    la, lb = a.host("ledger", Ledger()), b.host("ledger", Ledger())
    assert la.propose("open") == 1 and lb.propose("credit 5") == 2
    with pytest.raises(ValueError):  # apply's exception is the command's outcome, the same everywhere
        la.propose(42)
    assert la.propose("close") == 3
    b.sync()
    assert la.lines == lb.lines and [x.split(":")[1] for x in la.lines] == ["open", "credit 5", "close"]


# ---------------------------------------------------------- typed errors
def test_bad_input_gets_typed_errors(pair: Replicas) -> None:
    a = pair.new()
    m = a.map("m")
    with pytest.raises(WrongType):
        a.counter("m")
    with pytest.raises(InvalidRequest):
        m.put(["unhashable"], 1)
    with pytest.raises(InvalidRequest):
        m.put("k", {1, 2})  # a set: no deterministic form
    with pytest.raises(InvalidRequest):
        a.counter("c").add("1")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        a.map("")
    with pytest.raises(InvalidRequest):
        Runtime("not a log")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        Runtime(pair.log, client_id=0)
    a.sync()
    with pytest.raises(InvalidRequest):  # hosted after the play started: it would have missed entries
        a.map("late")
    with pytest.raises(NotHosted):
        StateMachine().propose(1)
    with pytest.raises(CheckpointError):
        a.checkpoint()
    with pytest.raises(pyzlog.EntryTooLarge):
        m.put("big", b"x" * (2 << 20))
    # proposals sent in one batch with a bad one: only it fails
    futures = [m.put_async(f"k{i}", b"v") for i in range(20)]
    big = m.put_async("big", b"x" * (2 << 20))
    futures += [m.put_async(f"j{i}", b"v") for i in range(20)]
    assert [f.result(60) for f in futures] == [None] * 40
    with pytest.raises(pyzlog.EntryTooLarge):
        big.result(60)
    m["still"] = "works"
    a.close()
    with pytest.raises(RuntimeClosed):
        m["k"] = 1


# ---------------------------------------------------------- exactly once
def test_a_proposal_stored_twice_is_applied_once(pair: Replicas) -> None:
    """What a retried append leaves: the same bytes at two positions. Every
    replica applies the first and skips the second, and a copy appearing
    after the proposer's low-water mark passed it is skipped too."""
    a = pair.new()
    c = a.counter("c")
    client, stream = 0xC0FFEE, entry.stream_id("c")
    add = lambda seq, lwm, n: entry.header(entry.CMD, client, seq, lwm, stream) + _OP[CTR_ADD] + codec.dumps(n)  # noqa: E731
    lg = pair.log
    lg.append(add(1, 1, 10))
    lg.append(add(1, 1, 10))            # the retry's copy
    lg.append(add(2, 1, 100))
    lg.append(add(3, 3, 1000))          # the client's lwm is now 3: 1 and 2 are settled
    lg.append(add(2, 1, 100))           # a late copy of 2
    lg.append_many([add(4, 3, 5), add(4, 3, 5)])
    a.sync()
    assert c.value == 1115
    assert a.stats.duplicates == 3
    b = pair.new()
    b.counter("c")
    b.sync()
    assert state_of(b) == state_of(a)


def test_replay_applies_map_puts_of_every_shape_as_their_proposers_meant(pair: Replicas) -> None:
    """Replay reads a map put of a short str key and a short bytes value
    inline (runtime._apply_rows); every other shape, and damaged puts that
    look like that one, go through ReplicatedMap.apply_payload. A replica
    playing them all holds exactly what they say, each key at the version of
    its last put, and a damaged put changes nothing."""
    a = pair.new()
    m = a.map("m")
    stream = entry.stream_id("m")
    seq = iter(range(1, 1000))

    def put(body: bytes) -> int:
        s = next(seq)
        return pair.log.append(entry.header(entry.CMD, 0xBEEF, s, s, stream) + _OP[MAP_PUT] + body)

    d = codec.dumps
    want: dict[Any, tuple[Any, int]] = {}
    for key, value in [("k", b"v"), ("", b""), ("é" * 127, b"x" * 255), ("k" * 255, b"y" * 256), ("long" * 100, b"z"),
                       (7, b"int key"), (("t", 1), b"tuple key"), ("k", 3), ("s", "str value"), ("n", None),
                       ("k", b"again")]:
        want[key] = (value, put(d(key) + d(value)) + 1)
    short_key = bytes((codec.SSTR, 1)) + b"q"
    for damaged in [bytes((codec.SSTR, 2)) + b"\xff\xfe" + d(b"bad utf-8"),  # the fast path's shape, bad key
                    short_key + d(b"v") + b"junk",                      # bytes left after the value
                    short_key + bytes((codec.SBYTES, 10)) + b"short",   # a value cut short
                    short_key + bytes((codec.SBYTES,)),                 # no length byte
                    bytes((codec.SSTR, 9)) + b"q"]:                     # a key cut short
        put(damaged)
    a.sync()
    assert m.to_dict() == {k: v for k, (v, _) in want.items()}
    assert {k: m.read_version(k) for k in want} == {k: ver for k, (_, ver) in want.items()}
    b = pair.new()  # a replica that only replays
    b.map("m")
    b.sync()
    assert state_of(b) == state_of(a)


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_a_replica_replays_rows_as_read_or_record_batches_alike(rados_cluster, ceph, log_name, seqr,  # type: ignore[no-untyped-def]
                                                              compression: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica replaying another's entries applies them from the rows as
    they were read (RowSets: no bytes object per entry), or, on a compressed
    log whose entries must be decoded first, from record batches: the same
    state either way, a filled hole and a foreign entry included."""
    r = Replicas(rados_cluster, ceph.pool, log_name, seqr.address, compression=compression)
    lg = r.log
    try:
        a = r.new()
        maps = [a.map(f"m{i}") for i in range(3)]
        c = a.counter("c")
        futures = [maps[i % 3].put_async(f"k{i % 50}", bytes([i % 256]) * (i % 40)) for i in range(1500)]
        for f in futures:
            f.result(60)
        lg.append(b"not an entry of the object layer")
        lg.fill(lg.tail() + 1)  # a position filled (a hole that writers lost)
        c.add(7)
        maps[0]["after"] = b"the hole"
        a.sync()
        kinds: list[str] = []
        real = runtime_module.Runtime._apply_rows

        def noting(self: Runtime, positions: Any = (), datas: Any = (), kinds_: Any = None, rows: Any = None) -> None:
            kinds.append("rows" if rows is not None else "lists")
            real(self, positions, datas, kinds_, rows)

        monkeypatch.setattr(runtime_module.Runtime, "_apply_rows", noting)
        b = r.new()
        for i in range(3):
            b.map(f"m{i}")
        b.counter("c")
        b.sync()
        assert state_of(b) == state_of(a)
        assert b.stats.gaps >= 1 and b.stats.foreign == 1 and b.stats.applied == a.stats.applied
        assert ("rows" in kinds) == (compression == "none") and ("lists" in kinds) == (compression != "none")
    finally:
        r.close()


@pytest.mark.parametrize("streams", [False, True])
def test_foreign_entries_are_skipped_and_newer_ones_stop_the_runtime(rados_cluster, ceph, log_name,  # type: ignore[no-untyped-def]
                                                                     streams: bool) -> None:
    """Raw entries of another writer are skipped, also text that starts
    "ZO" like the layer's magic (an adversary's find: "ZONE A 21.5C" read
    as an entry of version 78 stopped every replica): a version of 0 or
    past entry.MAX_LAYER_VERSION is not the layer's. With streams and no
    sequencer the walk scans the whole log and meets them too."""
    pair = Replicas(rados_cluster, ceph.pool, log_name, None)
    try:
        _foreign_entries(pair, streams)
    finally:
        pair.close()


def _foreign_entries(pair: Replicas, streams: bool) -> None:
    a = pair.new(streams=streams)
    m = a.map("m")
    m["a"] = 1
    pair.log.append(b"someone else's raw entry")
    pair.log.append(b"ZO")  # too short to be ours
    pair.log.append(b"ZONE A temperature 21.5C" + b" " * 20)
    pair.log.append(b"ZO" + bytes(40))
    pair.log.append(b"ZO\x10" + b"\x01" * 60)  # version 16: past the layer's
    m["b"] = 2
    a.sync()
    assert m.to_dict() == {"a": 1, "b": 2}
    if not streams:
        assert a.stats.foreign == 5
    pair.log.append(entry.HEADER.pack(b"ZO", entry.VERSION + 1, 1, 0, 1, 1, 1, entry.stream_id("m")) + b"future")
    with pytest.raises(RuntimeFailed) as e:
        a.sync()
    assert isinstance(e.value.__cause__, UnsupportedEntry)
    with pytest.raises(RuntimeFailed):
        m["c"] = 3


def test_damaged_entries(pair: Replicas) -> None:
    """A command whose arguments do not parse is refused by every replica
    alike (its outcome, the state unchanged); a commit record that does not
    parse stops the runtime, as a header of a newer version does."""
    a, b = pair.new(), pair.new()
    m = a.map("m")
    b.map("m")
    pair.log.append(entry.header(entry.CMD, 5, 1, 1, entry.stream_id("m")) + _OP[MAP_PUT] + b"\x05\xff\xff")
    m["ok"] = 1
    assert m.to_dict() == {"ok": 1}
    pair.log.append(entry.header(entry.TXN, 5, 2, 1) + entry.pack_u64s([entry.stream_id("m")]) + b"\x07junk")
    for rt in (a, b):
        with pytest.raises(RuntimeFailed) as e:
            rt.sync()
        assert isinstance(e.value.__cause__, BadEntry)


def test_a_lost_hole_is_skipped_by_every_replica(pair: Replicas) -> None:
    """A proposer took a position and died before writing it: readers wait
    hole_wait, fill it as LOST and move on, all skipping the same position."""
    a, b = pair.new(), pair.new()
    m, m2 = a.map("m"), b.map("m")
    m["before"] = 1
    hole = pair.log.take_positions(1)  # never written
    m["after"] = 2  # its position is above the hole: applying it waits for the hole
    assert m.to_dict() == {"before": 1, "after": 2}
    b.sync()
    assert m2.to_dict() == m.to_dict()
    assert a.stats.gaps + b.stats.gaps >= 2 and a.applied > hole
    assert [r.kind for r in pair.log.stream(hole, hole + 1)] == [pyzlog.RecordKind.LOST]


@pytest.mark.parametrize("streams", [False, True], ids=["scan", "streams"])
def test_waiting_past_the_tail_waits_for_the_writers_and_burns_no_position(pair: Replicas, streams: bool) -> None:
    """wait_applied(p) with p past the log's tail: the positions up to p are
    not handed out yet, so the runtime waits for their writers (it asks the
    tail again) and never plays them as holes, which would fill them as LOST
    after hole_wait and send their writers elsewhere. With streams, the
    first walk toward p stops at the tail its stream request answers."""
    a, b = pair.new(streams=streams), pair.new(streams=streams)
    m, m2 = a.map("m"), b.map("m")
    m["first"] = 0
    tail = pair.log.tail()
    with pytest.raises(Timeout, match=f"not played to {tail + 5}"):
        b.wait_applied(tail + 5, timeout=5 * HOLE_WAIT)  # several hole waits pass
    for i in range(5):
        m[f"k{i}"] = i
    b.wait_applied(tail + 5, timeout=60)
    assert m2.to_dict() == m.to_dict() == {"first": 0} | {f"k{i}": i for i in range(5)}
    assert [r.kind for r in pair.log.stream(tail, tail + 5)] == [pyzlog.RecordKind.DATA] * 5
    assert b.stats.gaps == 0


def test_a_stream_replica_catching_up_asks_no_tail_first(pair: Replicas, monkeypatch: pytest.MonkeyPatch) -> None:
    """wait_applied(p) on a runtime with streams, p handed out already: the
    player walks toward p at once, and the walk's own stream request tells
    the tail, so the log's tail is not asked first (one sequencer request,
    not two). What it plays is what a full replay plays."""
    a = pair.new(streams=True)
    m, other = a.map("m"), a.map("other")
    for i in range(40):
        m.put_async(f"k{i}", i)
        other.put_async(f"k{i}", -i)
    a.sync()
    tail = pair.log.tail()
    b = pair.new(streams=True)
    m2 = b.map("m")
    asked: list[int] = []
    real_tail = b.log.tail

    def counted_tail() -> int:
        asked.append(1)
        return real_tail()

    monkeypatch.setattr(b.log, "tail", counted_tail)
    b.wait_applied(tail, timeout=60)
    assert m2.to_dict() == m.to_dict() == {f"k{i}": i for i in range(40)}
    assert b.applied >= tail and b.stats.read == 40 and b.walk_stats.scans == 0, (b.stats, b.walk_stats)
    assert asked == [], "the log's tail was asked before the walk"


# ------------------------------------------------------------ transactions
def test_a_conflicting_transaction_aborts_everywhere(pair: Replicas) -> None:
    a, b, c = pair.new(), pair.new(), pair.new()
    ma, mb, mc = a.map("acct"), b.map("acct"), c.map("acct")
    ma["alice"] = 100
    ma["bob"] = 0
    with a.transaction() as tx:
        bal = ma["alice"]
        mb["alice"] = 50  # b writes what a's transaction read, before a's commit record
        ma["alice"] = bal - 30
        ma["bob"] = ma["bob"] + 30
    assert tx.committed is False and tx.results == []
    assert ma.to_dict() == {"alice": 50, "bob": 0}
    with a.transaction() as tx2:
        bal = ma["alice"]
        ma["alice"] = bal - 30
        ma["bob"] = ma["bob"] + 30
    assert tx2.committed is True
    c.sync()
    b.sync()
    assert ma.to_dict() == mb.to_dict() == mc.to_dict() == {"alice": 20, "bob": 30}
    assert a.stats.aborted == b.stats.aborted == c.stats.aborted == 1


def test_transactions_across_objects(pair: Replicas) -> None:
    a, b = pair.new(), pair.new()
    m, ctr, reg, q = hosting(a)
    hosting(b)
    q.put("job-1")
    q.put("job-2")
    with a.transaction() as tx:
        item = q.get()  # taken at commit, if the queue did not change meanwhile
        assert item == (0, "job-1")
        m[f"done-{item[0]}"] = item[1]
        ctr.add(1)
        assert ctr.value == 1  # reads its own writes
        reg.set("last: job-1")
        assert reg.get() == "last: job-1" and m.get("done-0") == "job-1" and len(m) == 1
    assert tx.committed and len(tx.results) == 4
    assert q.waiting() == [(1, "job-2")] and m["done-0"] == "job-1" and ctr.value == 1
    b.sync()
    assert state_of(a) == state_of(b)


def test_read_only_and_failed_transactions_append_nothing(pair: Replicas) -> None:
    a = pair.new()
    m = a.map("m")
    m["x"] = 1
    tail = pair.log.tail()
    with a.transaction() as tx:
        assert m["x"] == 1 and m.get("y") is None
    assert tx.committed is True
    with pytest.raises(KeyError):
        with a.transaction():
            m["z"] = 5
            m["missing"]  # noqa: B018 - raises
    assert pair.log.tail() == tail and "z" not in m
    with pytest.raises(InvalidRequest):
        with a.transaction():
            with a.transaction():
                pass


def test_a_transaction_belongs_to_the_asyncio_task_that_opened_it(pair: Replicas) -> None:
    """Two asyncio tasks on one thread: A holds a transaction open across an
    await and then gives it up; B's plain put meanwhile is B's own, appended
    and applied at once. An adversary's find: the transaction was kept per
    thread, so B's put went into A's and was lost with it, with no error."""
    import asyncio

    a = pair.new()
    m = a.map("m")
    seen: dict[str, Any] = {}

    async def task_a() -> None:
        with pytest.raises(RuntimeError):
            with a.transaction():
                m["a"] = 1
                await asyncio.sleep(0.2)  # B runs meanwhile
                raise RuntimeError("A gives its transaction up")

    async def task_b() -> None:
        await asyncio.sleep(0.05)
        seen["in_a_transaction"] = a.current_transaction() is not None
        m.put("b", "from B", timeout=30)

    async def both() -> None:
        await asyncio.gather(task_a(), task_b())

    asyncio.run(both())
    assert seen == {"in_a_transaction": False} and a.current_transaction() is None
    fresh = pair.new()
    m2 = fresh.map("m")
    fresh.sync(30)
    assert m.to_dict() == m2.to_dict() == {"b": "from B"}


def test_what_a_replica_could_not_carry_is_refused_before_it_is_appended(pair: Replicas) -> None:
    """An adversary's finds, refused up front and nothing appended: MISSING
    as a map value (the key read as absent yet was listed) or a queue item
    (it could not be acked); a value nested too deep for a checkpoint to
    hold (a 63-deep one was taken, then no checkpoint could be written); odd
    arguments. The deepest value and key taken checkpoint, load in a new
    replica, and a transaction reading that key commits."""
    a = pair.new(checkpoints=True)
    m, q = a.map("m"), a.queue("q")
    m["x"] = 1
    tail = pair.log.tail()
    for call in (lambda: m.put("k", MISSING), lambda: m.put_async("k", MISSING), lambda: m.__setitem__("k", MISSING),
                 lambda: q.put(MISSING), lambda: q.put_async(MISSING),
                 lambda: m.put("k", _nested(codec.ARG_DEPTH + 1)), lambda: a.atomically(lambda: None, retries=-1),
                 lambda: a.wait_applied("3", 1), lambda: m.put("\ud800", 1)):  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest):
            call()
    with pytest.raises(InvalidRequest):
        with a.transaction():
            m["k"] = MISSING
    assert pair.log.tail() == tail and "k" not in m and len(m) == 1
    deep = _nested(codec.ARG_DEPTH)
    deep_key = (deep,) * 1  # a tuple key holding the deepest list there can be below it
    m.put("deep", deep, timeout=30)
    with pytest.raises(InvalidRequest):
        m.put(deep_key, 1)  # one level more than a key may hold
    key = _nested_tuple(codec.ARG_DEPTH)
    m.put(key, "at the deepest key", timeout=30)
    q.put(deep, timeout=30)
    a.checkpoint()
    b = pair.new(checkpoints=True)
    m2, q2 = b.map("m"), b.queue("q")
    b.start()
    assert b.stats.reloads == 1
    b.sync(30)
    assert m2.to_dict() == m.to_dict() and m2["deep"] == deep and m2[key] == "at the deepest key"
    assert q2.snapshot() == q.snapshot()
    with b.transaction() as tx:
        m2["copy"] = m2[key]
    assert tx.committed and m2["copy"] == "at the deepest key"


def _nested(depth: int) -> Any:
    v: Any = 1
    for _ in range(depth):
        v = [v]
    return v


def _nested_tuple(depth: int) -> Any:
    v: Any = 1
    for _ in range(depth):
        v = (v,)
    return v


def test_a_transaction_takes_nothing_from_tasks_it_outlives_or_generators_left_open(pair: Replicas) -> None:
    """A second adversary's finds against the context variable, each a
    write lost with no error: a task or thread started inside the block
    inherits it, yet writes after the block are its own; a transaction held
    open by an abandoned async generator no longer swallows its caller's
    puts; a generator closed inside another transaction leaves that one
    whole (it aborts, and its later write with it)."""
    import asyncio
    import contextvars
    import gc

    a, rival = pair.new(), pair.new()
    m, m_rival = a.map("m"), rival.map("m")
    m["x"] = 0

    async def background() -> None:
        await asyncio.sleep(0.2)  # the block has committed by now
        m.put("from a task", 1, timeout=30)

    def worker() -> None:
        time.sleep(0.2)
        m.put("from a thread", 1, timeout=30)

    async def spawning() -> None:
        with a.transaction() as tx:
            m["in the block"] = 1
            task = asyncio.create_task(background())
            thread = asyncio.create_task(asyncio.to_thread(worker))
        assert tx.committed
        await asyncio.wait_for(asyncio.gather(task, thread), 30)

    async def held() -> Any:
        with a.transaction() as tx:
            m["in an abandoned block"] = 1
            yield tx
            yield tx

    async def abandoning() -> None:
        async for _ in held():
            break
        gc.collect()
        await asyncio.sleep(0.1)  # the loop's finalizer closes the generator, in a task of its own
        assert a.current_transaction() is None
        m.put("after the abandoned block", 1, timeout=30)

    asyncio.run(spawning())
    asyncio.run(abandoning())

    def gen() -> Iterator[None]:
        with a.transaction():
            m["in the generator"] = 1
            yield

    g = gen()
    contextvars.copy_context().run(next, g)
    with a.transaction() as tx_b:
        assert m["x"] == 0
        m_rival["x"] = 99  # what tx_b read changes: it aborts
        g.close()
        m["all or nothing with tx_b"] = 1
    assert tx_b.committed is False
    fresh = pair.new()
    m2 = fresh.map("m")
    fresh.sync(30)
    a.sync(30)
    assert m.to_dict() == m2.to_dict() == {"x": 99, "in the block": 1, "from a task": 1, "from a thread": 1,
                                            "after the abandoned block": 1}


def test_a_put_async_on_a_closed_log_fails_at_once(pair: Replicas) -> None:
    """A put_async whose Log was closed under the runtime is told NotApplied
    at once: a closed Log refuses every retry. An adversary's find: it was
    retried until propose_timeout (120 s by default) ran out."""
    a = pair.new()
    m = a.map("m")
    m["a"] = 1
    a.log.close()
    f = m.put_async("b", 2)
    with pytest.raises(NotApplied, match="log is closed"):
        f.result(30)  # (before: pending for 120 s)
    assert a.stats.retries == 0 and m.to_dict() == {"a": 1}


@pytest.mark.parametrize("streams", [False, True], ids=["plain", "streams"])
def test_close_plays_the_puts_on_their_way_and_tells_each_its_outcome(pair: Replicas, streams: bool) -> None:
    """close() with puts still on their way: it plays them first, so each
    Future tells its real outcome. Before, close() stopped the play and told
    RuntimeClosed to puts whose entries the log already held, which every
    other replica applies. Whatever close() tells must match what a replica
    reading the log afterwards holds."""
    a = pair.new(streams=streams)
    m = a.map("m")
    m["warm"] = b"w"
    futures = {f"k{i}": m.put_async(f"k{i}", b"v") for i in range(2000)}
    a.close()
    told = {k: type(f.exception(0)).__name__ for k, f in futures.items()}
    fresh = pair.new()
    mf = fresh.map("m")
    fresh.sync(timeout=60)
    held = set(mf.keys()) - {"warm"}
    assert {k for k, t in told.items() if t == "NoneType"} == held  # acknowledged exactly when the log has it
    assert told == dict.fromkeys(futures, "NoneType")  # a healthy cluster: close() waited for every one


@pytest.mark.parametrize("streams", [False, True], ids=["plain", "streams"])
def test_puts_made_while_close_runs_are_told_what_the_log_holds(pair: Replicas, streams: bool) -> None:
    """A thread keeps putting while another closes the runtime (an
    adversary's find): puts that got in as close() began were sent, landed
    after the play had stopped, and were told RuntimeClosed though the log
    held them (259 of 45,531; with streams 768). Each one's Future must say
    what a replica reading the log afterwards finds."""
    a = pair.new(streams=streams)
    m = a.map("m")
    m["warm"] = b"w"
    futures: dict[str, Any] = {}

    def writer() -> None:
        for i in range(10**9):
            try:
                futures[f"k{i}"] = m.put_async(f"k{i}", b"v")
            except RuntimeClosed:  # the close has begun: refused at once, nothing appended
                return

    th = threading.Thread(target=writer)
    th.start()
    time.sleep(0.3)
    a.close()
    th.join(60)
    told = {k: type(f.exception(30)).__name__ for k, f in futures.items()}
    fresh = pair.new()
    mf = fresh.map("m")
    fresh.sync(timeout=60)
    held = set(mf.keys()) - {"warm"}
    assert set(told.values()) <= {"NoneType", "RuntimeClosed"}
    assert {k for k, t in told.items() if t == "NoneType"} == held


def test_close_leaves_no_thread_of_the_runtime_running(pair: Replicas, monkeypatch: pytest.MonkeyPatch) -> None:
    """Appends that keep failing are retried until close(): its wait for the
    pending proposals took the whole timeout, the threads' joins got none,
    and the player and the retrier were still running when close()
    returned (an adversary's find). The wait now takes half."""
    a = pair.new()
    m = a.map("m")
    m["warm"] = b"w"

    def refused(data: bytes, future: Any = None) -> Any:
        raise pyzlog.ZlogError("refused")

    monkeypatch.setattr(a.log, "append_async", refused)
    futures = [m.put_async(f"k{i}", b"v") for i in range(3)]
    deadline = time.monotonic() + 30
    while a._retrier is None and time.monotonic() < deadline:  # (the first retry is scheduled)
        time.sleep(0.01)
    threads = [t for t in (a._player, a._retrier, *a._senders) if t is not None]
    assert threads
    a.close(timeout=1.0)
    assert [t.name for t in threads if t.is_alive()] == []
    assert all(f.done() for f in futures)


def test_concurrent_transfers_conserve_the_total(pair: Replicas) -> None:
    rts = [pair.new() for _ in range(3)]
    maps = [rt.map("acct") for rt in rts]
    for i in range(5):
        maps[0][f"a{i}"] = 100
    errors: list[BaseException] = []

    def transfers(k: int) -> None:
        rt, m = rts[k % 3], maps[k % 3]
        import random
        rnd = random.Random(k)
        try:
            for _ in range(15):
                src, dst = rnd.sample(range(5), 2)

                def move() -> None:
                    s = m[f"a{src}"]
                    amount = min(s, rnd.randint(1, 30))
                    m[f"a{src}"] = s - amount
                    m[f"a{dst}"] = m[f"a{dst}"] + amount

                rt.atomically(move)
        except BaseException as e:  # noqa: BLE001 - asserted below
            errors.append(e)

    threads = [threading.Thread(target=transfers, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    for rt in rts:
        rt.sync()
    assert maps[0].to_dict() == maps[1].to_dict() == maps[2].to_dict()
    assert sum(maps[0].values()) == 500
    assert rts[0].stats.aborted == rts[1].stats.aborted == rts[2].stats.aborted


# ------------------------------------------------------------------- queue
def test_a_group_consumes_each_item_exactly_once(pair: Replicas) -> None:
    rts = [pair.new() for _ in range(3)]
    queues = [rt.queue("jobs") for rt in rts]
    ids = [queues[0].put_async(f"job-{i}") for i in range(60)]
    assert sorted(f.result(60) for f in ids) == list(range(60))
    # (async puts are not ordered among themselves: an append retried lands later; each item's id
    # is the one its put returned)
    put = sorted((f.result(), f"job-{i}") for i, f in enumerate(ids))
    got: list[list[tuple[int, Any]]] = [[], [], []]

    def consume(k: int) -> None:
        q = queues[k]
        while True:
            if k == 2:  # claim and ack: only one ack per item ever succeeds
                item = q.claim(lease=30)
                if item is None:
                    return
                assert q.ack(item[0]) is True
            else:
                item = q.get()
                if item is None:
                    return
            got[k].append(item)

    threads = [threading.Thread(target=consume, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    everything = sorted(got[0] + got[1] + got[2])
    assert everything == put
    for rt in rts:
        rt.sync()
    assert all(len(q) == 0 for q in queues)


def test_an_expired_claim_goes_to_the_next_consumer(pair: Replicas) -> None:
    a, b = pair.new(), pair.new()
    qa, qb = a.queue("jobs"), b.queue("jobs")
    qa.put("only")
    first = qa.claim(lease=0.001, consumer="dead-worker")  # it never acks
    import time
    time.sleep(0.01)
    second = qb.claim(lease=30)
    assert first == second == (0, "only")
    assert qa.ack(0, consumer="dead-worker") is False  # it lost the claim
    assert qb.ack(0) is True and qb.ack(0) is False
    a.sync()
    assert len(qa) == 0 and qa.claimed() == {}


# -------------------------------------------------------------- checkpoints
def test_checkpoint_trim_and_a_new_process_starting_from_it(pair: Replicas) -> None:
    a = pair.new(checkpoints=True)
    m, c, r, q = hosting(a)
    behind = pair.new(checkpoints=True)  # a replica that plays now, then not until after the trim
    hosting(behind)
    for i in range(200):
        m.put_async(f"k{i % 37}", i)
    behind.sync()
    for i in range(100):
        m.put_async(f"k{i % 37}", -i)
    c.add(7)
    q.put("job")
    a.sync()
    info = a.checkpoint()
    assert info.complete and info.position == a.applied and set(info.objects) == {"m", "c", "r", "q"}
    for i in range(50):
        m[f"after{i}"] = i
    for keep in (0, -1, 1.5, float("nan"), "1", True):  # nan and "1" raised TypeError from deep inside
        with pytest.raises(InvalidRequest):
            a.trim(keep)  # type: ignore[arg-type]
    assert pair.log.first_position() == 0
    assert a.trim() == info.position - 1
    assert pair.log.first_position() == info.position
    # a new process: starts from the checkpoint and reads only what follows it
    n = pair.new(checkpoints=True)
    hosting(n)
    n.sync()
    assert n.stats.reloads == 1 and n.stats.read <= 60
    assert state_of(n) == state_of(a)
    # the replica that was behind meets the trimmed prefix and reloads
    behind.sync()
    assert behind.stats.reloads == 1 and state_of(behind) == state_of(a)
    # without a checkpoint store the trimmed history cannot be rebuilt
    bare = pair.new()
    bare.map("m")
    players = f"zlog-objects-play-{bare.log.name}"
    before = sum(t.name == players for t in threading.enumerate())
    for _ in range(3):  # each start starts a player first (it connects to the sequencer meanwhile)
        with pytest.raises(CheckpointError):
            bare.sync()
    deadline = time.monotonic() + 10  # ... which returns once its start failed
    while sum(t.name == players for t in threading.enumerate()) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sum(t.name == players for t in threading.enumerate()) == before
    assert bare._player is not None and not bare._player.is_alive()  # (close() joins it)
    # a checkpoint of only some objects is not complete: it does not allow a trim alone
    part = pair.new(checkpoints=True)
    part.map("m")
    part.sync()
    pinfo = part.checkpoint()
    assert not pinfo.complete
    assert [i.position for i in a.checkpoints.list() if i.complete] == [info.position]  # type: ignore[union-attr]


def test_a_streams_replica_behind_a_trim_reloads_and_never_skips_the_trimmed_entries(pair: Replicas) -> None:
    """A streams replica that falls behind a trim (made below a whole-log
    replica's checkpoint) meets its stream's entries trimmed when it walks.
    It passed over them as "not the stream's" and went on: 39 of 45 keys
    lost, and its next checkpoint spread the loss to new replicas (an
    adversary's find). Now it reloads from the checkpoint; one with no
    checkpoint store stops, like a full replica, rather than skip them."""
    writer = pair.new(streams=True)
    wm = writer.map("m")
    behind = pair.new(streams=True, checkpoints=True)
    bm = behind.map("m")
    bare = pair.new(streams=True)
    bare.map("m")
    wm.put("k0", 0)
    behind.sync(30)
    bare.sync(30)
    for i in range(1, 40):
        wm.put(f"k{i}", i)
    whole = pair.new(checkpoints=True)  # every stream: its checkpoints are complete, so a trim may follow
    whole.map("m")
    whole.sync(30)
    info = whole.checkpoint()
    assert info.complete
    for i in range(40, 45):
        wm.put(f"k{i}", i)
    assert whole.trim() is not None and pair.log.first_position() > 1
    behind.sync(60)
    writer.sync(30)
    assert behind.stats.reloads == 1 and dict(bm.items()) == dict(wm.items()) and len(wm) == 45
    with pytest.raises(RuntimeFailed, match="trimmed"):
        bare.sync(60)
    # and a new streams replica starting from the behind one's checkpoint has everything too
    later = behind.checkpoint()
    fresh = pair.new(streams=True, checkpoints=True)
    fm = fresh.map("m")
    fresh.sync(60)
    assert fresh.stats.reloads == 1 and later.position <= fresh.applied and dict(fm.items()) == dict(wm.items())


def test_a_damaged_checkpoint_is_refused(pair: Replicas) -> None:
    a = pair.new(checkpoints=True)
    a.map("m")["k"] = "v"
    info = a.checkpoint()
    store = a.checkpoints
    assert isinstance(store, RadosCheckpoints)
    store.io.write(info.oid, b"\x00\x00", 3)
    b = pair.new(checkpoints=True)
    b.map("m")
    with pytest.raises(CheckpointError):
        b.start()


def test_a_proposer_restarting_with_its_id_continues_its_seqs(pair: Replicas) -> None:
    a = pair.new(client_id=77)
    a.counter("c").add(1)
    a.counter("c").add(1)
    a.close()
    again = pair.new(client_id=77)
    ctr = again.counter("c")
    again.start()
    assert ctr.add(1) == 3  # not taken for a copy of seq 1
