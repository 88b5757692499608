"""An async proposal's way into the log is in C (native/propose.c,
pyzlog.objects._propose): its seq and low-water mark, its entry, its
record and its append, and, once the append lands, Runtime._landed. The
streams runtime, RETIREs and retries send through the Python step
(_submit, after new_pending): both ways must make the same entries and
leave the same state, and each way something can go wrong between the
steps must end as it did in Python.
A runtime that is never started needs no cluster; its log here is a
stand-in that records the appends it is handed."""
from __future__ import annotations

import gc
import heapq
import threading
import time
import weakref
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyzlog import InvalidRequest, LazyFuture, Log, ZlogError
from pyzlog.client.log import TELLABLE_KEPT, _TELLABLE, _can_tell
from pyzlog.objects import NotApplied, ObjectsError, Runtime, RuntimeClosed, RuntimeFailed, entry
from pyzlog.objects.codec import MISSING, dumps
from pyzlog.objects.objects import _OP, MAP_PUT, _put_native
from pyzlog.client.streams import entry_backpointers
from pyzlog.objects import runtime as runtime_module
from pyzlog.objects.runtime import CMD, NOOP, _answer, _own_run, _Pending, _propose_native, _stream_entries

ME = 77


class Recorder:
    """What the runtime hands Log.append_async; raises `fail` if set."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, Any]] = []
        self.fail: BaseException | None = None

    def append_async(self, data: bytes, future: Any = None) -> Any:
        if self.fail is not None:
            raise self.fail
        self.sent.append((data, future))
        return future


def runtime(streams: bool = False) -> tuple[Runtime, Recorder]:
    rt = Runtime(Log.__new__(Log), client_id=ME, streams=streams)
    rt.map("m")
    rt._started = True  # (no player: nothing here plays)
    rec = Recorder()
    rt.log = rec  # type: ignore[assignment]
    return rt, rec


def state(rt: Runtime) -> tuple[Any, ...]:
    return (rt._next_seq, list(rt._unsettled), sorted(rt._settled), rt._in_flight, sorted(rt._pending),
            [(p.seq, p.data, p.attempts, p.flying, p.maybe_stored, p.streams, tuple(p.retire), p.ok)
             for p in rt._pending.values()])


def python_way(rt: Runtime, kind: int, stream: int, body: bytes) -> Any:
    p = rt._new_pending(kind, stream, body)
    rt._submit(p)
    return p.future


# (kind, body) proposals, with some settled between them (the low-water mark moves)
steps = st.lists(st.one_of(st.tuples(st.sampled_from([CMD, NOOP]), st.binary(max_size=40)),
                           st.tuples(st.just("settle"), st.integers(0, 30))), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(steps)
def test_the_c_way_and_the_python_way_make_the_same_entries_and_state(plan: list[tuple[Any, Any]]) -> None:
    c_rt, c_rec = runtime()
    py_rt, py_rec = runtime()
    stream = c_rt.map("m").stream
    for what, arg in plan:
        if what == "settle":  # as the play settles an applied proposal's seq
            for rt in (c_rt, py_rt):
                seqs = sorted(rt._pending)
                if seqs:
                    seq = seqs[arg % len(seqs)]
                    del rt._pending[seq]
                    rt._settle(seq)
            continue
        f_c = c_rt._propose(what, stream, arg)
        f_py = python_way(py_rt, what, stream, arg)
        assert type(f_c) is type(f_py) is LazyFuture and vars(f_c) == vars(f_py) and not f_c.done()
    assert [d for d, _ in c_rec.sent] == [d for d, _ in py_rec.sent]
    assert state(c_rt) == state(py_rt)
    for data, p in c_rec.sent:  # each append's future is its proposal, with the entry it was handed
        assert type(p) is _Pending and p.data is data and p.runtime is c_rt and p.flying
        h = entry.parse(data)
        assert (h.client, h.seq, h.stream) == (ME, p.seq, stream) and h.lwm <= p.seq


def test_a_proposal_made_in_python_starts_as_one_made_in_c() -> None:
    p = _Pending(3, b"x", None, 1.5)
    assert (p.seq, p.data, p.future, p.deadline, p.retire, p.streams, p.result, p.ok, p.flying, p.attempts,
            p.maybe_stored, p.runtime) == (3, b"x", None, 1.5, (), (), None, True, False, 0, False, None)
    assert _Pending(4, b"", None, 0.0, [1, 2]).retire == [1, 2]
    with pytest.raises(AttributeError):
        p.anything_else = 1  # type: ignore[attr-defined]  # (no __dict__: the append finds its methods by class)
    assert _can_tell(p)


def test_landed_counts_each_attempt_once_and_keeps_what_the_play_needs() -> None:
    rt, rec = runtime()
    f = rt._propose(CMD, rt.map("m").stream, b"body")
    data, p = rec.sent[0]
    assert rt._in_flight == 1 and p.flying
    for bad in ("5", -1, 2**70, 5.0):  # refused before anything changes
        with pytest.raises((ValueError, OverflowError)):
            p.set_result(bad)
    assert rt._in_flight == 1 and p.flying and not rt._own
    p.set_result(5)  # as the client's pipeline settles the append
    assert rt._in_flight == 0 and not p.flying
    assert rt._own == {5: data} and rt._own_heap == [5] and rt._target == 6
    p.set_result(5)  # a second outcome of the same attempt counts for nothing
    rt._landed(None, p=p)
    assert rt._in_flight == 0 and rt._own_heap == [5]
    assert not f.done()  # told by the play, once it applies position 5
    rt.applied = 10  # a position already played is not kept
    g = rt._propose(CMD, rt.map("m").stream, b"late")
    rec.sent[1][1].set_result(7)
    assert 7 not in rt._own and rt._target == 8 and not g.done()


def test_an_append_that_raises_is_judged_as_in_python() -> None:
    rt, rec = runtime()
    rt.propose_timeout = 1e-9  # given up at the first failure
    stream = rt.map("m").stream
    rec.fail = ZlogError("refused")
    f = rt._propose(CMD, stream, b"a")  # refused: nothing stored, told NotApplied, nothing raised
    with pytest.raises(NotApplied):
        f.result(0)
    assert rt._in_flight == 0 and not rt._pending
    rt.propose_timeout = 120.0
    rec.fail = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C inside append_async: raised again, and the entry may be stored
        rt._propose(CMD, stream, b"b")
    rec.fail = None
    [p] = rt._pending.values()
    assert p.maybe_stored and not p.flying and rt._in_flight == 0
    try:  # retried in the background with the same bytes (so applied at most once)
        deadline = time.monotonic() + 30
        while not rec.sent and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rec.sent == [(p.data, p)] and p.attempts == 2 and p.flying
    finally:
        with rt._cv_lock:
            rt._closing = rt._stopping = True  # the retrier's loop ends
            rt._cv.notify_all()


def test_a_proposal_to_a_closing_runtime_is_told_so_and_never_sent() -> None:
    """close() may begin between Runtime._propose's look and the count
    under _cv_lock (native/propose.c): told RuntimeClosed, not sent, its
    seq settled."""
    rt, rec = runtime()
    stream = rt.map("m").stream
    rt._closing = True
    f = _propose_native(rt, rt._core, CMD, stream, b"a", (stream,))
    with pytest.raises(RuntimeClosed):
        f.result(0)
    assert rec.sent == [] and not rt._pending and rt._in_flight == 0
    assert list(rt._unsettled) == [1] and 1 in rt._settled


@pytest.mark.parametrize("way", ["c", "python"])
def test_a_proposal_to_a_runtime_that_failed_meanwhile_is_told_so_and_never_sent(way: str) -> None:
    """The player may stop (a damaged entry) between _propose's look and
    the count under _cv_lock (an adversary's find: the proposal was
    registered after _fail told the pending ones, and waited until
    close()). Told RuntimeFailed, not sent."""
    rt, rec = runtime()
    stream = rt.map("m").stream
    if way == "c":  # (called past _propose's look)
        rt._failed = ObjectsError("damaged entry")
        f = _propose_native(rt, rt._core, CMD, stream, b"a", (stream,))
    else:  # a RETIRE's or a retry's way (_submit)
        p = rt._new_pending(NOOP, 0, b"")
        rt._failed = ObjectsError("damaged entry")
        rt._submit(p)
        f = p.future
    with pytest.raises(RuntimeFailed, match="damaged entry"):
        f.result(0)
    assert rec.sent == [] and not rt._pending and rt._in_flight == 0


def test_the_append_answers_for_a_class_once_and_keeps_few_classes() -> None:
    """Log.append_async checks each future= it is given; a class whose
    instances cannot hide set_result and set_exception (the proposals') is
    answered for once, and at most TELLABLE_KEPT classes are kept (an
    adversary's find: a program making classes kept every one alive)."""
    made = []
    for i in range(TELLABLE_KEPT * 2):
        cls = type(f"Sink{i}", (), {"__slots__": (), "set_result": lambda self, r: None,
                                    "set_exception": lambda self, e: None})
        assert _can_tell(cls())
        made.append(weakref.ref(cls))
        del cls
    assert len(_TELLABLE) <= TELLABLE_KEPT
    gc.collect()
    assert sum(r() is not None for r in made) <= TELLABLE_KEPT

    class Open:  # instances with a __dict__ can hide the methods: looked at each time
        def set_result(self, r: int) -> None: ...
        def set_exception(self, e: BaseException) -> None: ...

    hidden = Open()
    hidden.set_result = None  # type: ignore[assignment, method-assign]
    assert _can_tell(Open()) and not _can_tell(hidden) and Open not in _TELLABLE


# ------------------------------------------------------------ a map put in C
# keys and values around the codec's short/long boundary (255/256 bytes), multi-byte UTF-8 included
_texts = st.one_of(st.text(max_size=8), st.text(min_size=250, max_size=300),
                   st.builds(lambda n: "é" * n, st.integers(120, 140)))
_values = st.one_of(_texts, st.binary(max_size=8), st.binary(min_size=250, max_size=300),
                    st.integers(), st.none(), st.lists(st.integers(), max_size=3), st.floats(allow_nan=False))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(_texts, _values), min_size=1, max_size=20), st.booleans())
def test_a_map_put_in_c_makes_the_entry_and_state_of_the_python_way(puts: list[tuple[str, Any]],
                                                                   streams: bool) -> None:
    """ReplicatedMap.put_async's common case (a str key, a str or bytes
    value) is encoded and proposed in C (native/propose.c, put); other
    values go the Python way. Both make byte-identical entries and leave
    the same state as the general path (Runtime.propose of the encoded
    command): appended, or with streams queued for the senders."""
    c_rt, c_rec = runtime(streams)
    py_rt, py_rec = runtime(streams)
    m_c, m_py = c_rt.map("m"), py_rt.map("m")
    for key, value in puts:
        f_c = m_c.put_async(key, value)
        f_py = py_rt.propose(m_py, _OP[MAP_PUT] + dumps(key) + dumps(value))
        assert type(f_c) is type(f_py) is LazyFuture and not f_c.done()
    assert [d for d, _ in c_rec.sent] == [d for d, _ in py_rec.sent]
    assert [(p.data, p.attempts) for p in c_rt._queue] == [(p.data, p.attempts) for p in py_rt._queue]
    assert bool(c_rt._queue) == streams and bool(c_rec.sent) != streams
    assert state(c_rt) == state(py_rt)


def test_a_map_put_the_c_way_does_not_take_is_checked_the_python_way() -> None:
    rt, rec = runtime()
    m = rt.map("m")
    assert _put_native(rt, rt._core, m.stream, "k", 5) is None  # (an int value: the Python way's)
    assert _put_native(rt, rt._core, m.stream, b"k", b"v") is None  # (a bytes key too)
    assert rec.sent == [] and not rt._pending and rt._next_seq == 1
    with pytest.raises(InvalidRequest, match="not valid Unicode"):
        m.put_async("a\ud800", b"v")  # a lone surrogate in the key: refused, nothing taken
    with pytest.raises(InvalidRequest, match="not valid Unicode"):
        m.put_async("k", "v\udfff")
    assert rec.sent == [] and not rt._pending and rt._next_seq == 1
    with pytest.raises(InvalidRequest):
        m.put_async("k", MISSING)
    rt._closing = True  # closed: raised at once, as the Python way does (not a future told so)
    with pytest.raises(RuntimeClosed):
        m.put_async("k", b"v")
    rt._closing, rt._failed = False, ObjectsError("damaged entry")
    with pytest.raises(RuntimeFailed):
        m.put_async("k", b"v")
    assert rec.sent == [] and not rt._pending


# ------------------------------------------------------------ the player's side
def own_run_py(heap: list[int], own: dict[int, bytes], at: int, limit: int) -> tuple[list[bytes], int | None]:
    """Runtime._play's loop as it was in Python (the reference)."""
    while heap and heap[0] < at:
        own.pop(heapq.heappop(heap), None)
    run, p = [], at
    while heap and heap[0] == p and p < limit:
        heapq.heappop(heap)
        run.append(own.pop(p))
        p += 1
    return run, (heap[0] if heap else None)


@settings(max_examples=150, deadline=None)
@given(st.sets(st.integers(0, 60), max_size=40), st.integers(0, 40), st.integers(0, 70), st.sets(st.integers(0, 60)))
def test_own_run_takes_what_the_python_loop_took(positions: set[int], at: int, limit: int,
                                                forgotten: set[int]) -> None:
    heap = list(positions)
    heapq.heapify(heap)
    # a position below `at` may be in the heap and not in own (the play forgot it): dropped either way
    own = {p: p.to_bytes(2, "little") for p in positions if p >= at or p not in forgotten}
    heap2, own2 = list(heap), dict(own)
    assert _own_run(heap, own, at, limit) == own_run_py(heap2, own2, at, limit)
    assert heap == heap2 and own == own2


def test_own_run_raises_for_a_position_it_does_not_hold() -> None:
    with pytest.raises(KeyError):  # as own.pop(p) did: the heap and own disagree
        _own_run([3], {}, 3, 10)


def test_answer_settles_the_seqs_and_hands_out_results() -> None:
    rt, _ = runtime()
    made = [_Pending(seq, b"", LazyFuture(), 0.0) for seq in range(1, 6)]
    made[1].retire = [10, 11]  # a RETIRE settles what it retired
    error = NotApplied("no")
    made[2].ok, made[2].result = False, error
    made[3].future.cancel()  # its owner cancelled it: left alone
    made[0].result, made[4].result = "r1", "r5"
    answered, failed = _answer(rt._plock, rt._settled, made)
    assert rt._settled == {1, 2, 3, 4, 5, 10, 11}
    assert answered == [(made[0].future, "r1"), (made[1].future, None), (made[4].future, "r5")]
    assert failed == [(made[2].future, error)]
    assert all(p.result is None for p in made)  # taken out of the records
    with pytest.raises(TypeError):
        _answer(rt._plock, rt._settled, [object()])
    assert not rt._plock.locked()


# ------------------------------------------------------------ a streams batch's entries in C
@st.composite
def stream_batches(draw: Any) -> tuple[int, int, list[Any], list[bytes]]:
    first = draw(st.one_of(st.integers(1, 5000), st.integers(2**32 + 1, 2**40)))  # deltas of 4 and of 8 bytes
    k = draw(st.sampled_from([0, 16, 16, 1, 5, 255]))
    answer = []
    for s in draw(st.lists(st.integers(1, 2**64 - 1), min_size=1, max_size=3, unique=True)):
        back = sorted(draw(st.sets(st.integers(0, first - 1), max_size=20)), reverse=True)
        levels = draw(st.lists(st.tuples(st.integers(Log.STREAM_FIRST_LEVEL, 63), st.integers(0, first - 1)),
                               max_size=6))
        answer.append((s, draw(st.integers(0, first)), back, draw(st.integers(0, 2**20)), levels))
    datas = [entry.header(CMD, ME, seq, 1, 9) + body
             for seq, body in enumerate(draw(st.lists(st.binary(max_size=12), min_size=1, max_size=70)), 1)]
    return first, k, answer, datas


@settings(max_examples=300, deadline=None)
@given(stream_batches())
def test_a_streams_batch_built_in_c_is_what_the_python_builds(batch: tuple[int, int, list[Any], list[bytes]]) -> None:
    """native/propose.c's stream_entries (Runtime._store's, through
    Log.append_streams(build_all=)) against the reference: the client's
    entry_backpointers and entry.with_backpointers, entry by entry (with
    and without the per-batch memo)."""
    first, k, answer, datas = batch
    memo: dict[tuple[int, int], list[int]] = {}
    want = [entry.with_backpointers(d, first + i, k, entry_backpointers(first, i, k, answer, memo))
            for i, d in enumerate(datas)]
    assert want == [entry.with_backpointers(d, first + i, k, entry_backpointers(first, i, k, answer))
                    for i, d in enumerate(datas)]
    assert _stream_entries(first, k, answer, datas, Log.STREAM_FIRST_LEVEL) == want


def test_a_streams_batch_with_a_bad_answer_or_entry_is_refused() -> None:
    one = entry.header(CMD, ME, 1, 1, 9) + b"x"
    level = Log.STREAM_FIRST_LEVEL
    with pytest.raises(ValueError, match="not below position"):  # a sequencer's backpointer at or above the entry
        _stream_entries(100, 16, [(7, 50, [100], 3, [])], [one], level)
    with pytest.raises(ValueError, match="past 2"):  # positions are below 2^63
        _stream_entries(2**63 - 1, 0, [(7, 50, [], 3, [])], [one], level)
    with pytest.raises(ValueError, match="too large"):
        _stream_entries(100, 16, [(7, 50, [99], 2**64 - 1, [])], [one], level)
    # the answer's parts may be any sequences, as the Python reads them
    assert (_stream_entries(100, 16, [[7, 50, (99, 98), 3, ((5, 20),)]], [one], level)
            == _stream_entries(100, 16, [(7, 50, [99, 98], 3, [(5, 20)])], [one], level))
    with pytest.raises(ValueError, match="not an entry of this layer"):
        _stream_entries(100, 16, [(7, 50, [99], 3, [])], [b"plain"], level)
    with pytest.raises(ValueError):
        _stream_entries(100, 16, [(7, 50, [99], 3)], [one], level)  # (an item of four)
    with pytest.raises(TypeError):
        _stream_entries(100, 16, [7], [one], level)  # (an item that is no sequence)
    with pytest.raises(ValueError):
        _stream_entries(100, 16, [(7, 50, [99], 3, [(64, 1)])], [one], level)  # (a level past 63)
    with pytest.raises((ValueError, OverflowError)):
        _stream_entries(100, 16, [(-7, 50, [99], 3, [])], [one], level)
    assert _stream_entries(100, 16, [], [one], level) == [entry.with_backpointers(one, 100, 16, [])]


@pytest.mark.parametrize("way", ["put", "propose"])
def test_an_interrupt_after_a_streams_proposal_is_registered_leaves_it_queued(way: str) -> None:
    """Streams on, a proposal is registered, counted and queued in C
    (native/propose.c, enqueue) before any Python code runs: a Ctrl-C in
    Runtime._queued (a sender's wake-up) leaves it queued, so a sender
    appends it and the play tells it. (An adversary's find: it was left
    registered and never queued, its seq pinning every later entry's
    low-water mark until close().)"""
    rt, _ = runtime(streams=True)
    m = rt.map("m")

    def interrupted(p: Any) -> Any:
        raise KeyboardInterrupt

    rt._queued = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        if way == "put":
            m.put_async("k", b"v")
        else:
            rt._propose(CMD, m.stream, b"body")
    [p] = rt._queue
    assert p.attempts == 1 and rt._pending == {1: p} and not p.future.done()


def test_a_failed_streams_runtime_sends_nothing_it_had_queued() -> None:
    """Once the runtime failed (its proposers told RuntimeFailed by _fail),
    a sender drops what it takes from the queue instead of appending it (an
    adversary's find: 192,820 such entries were still appended, for other
    replicas to apply)."""
    rt, _ = runtime(streams=True)
    m = rt.map("m")
    sent: list[Any] = []
    rt.log.append_streams = lambda *a, **k: sent.append(a)  # type: ignore[attr-defined]
    futures = [m.put_async(f"k{i}", b"v") for i in range(5)]
    rt._fail(ObjectsError("damaged entry"))
    gate = threading.Lock()
    sender = threading.Thread(target=rt._send_loop, args=(gate,))
    rt._senders = [sender]
    sender.start()
    for f in futures:
        with pytest.raises(RuntimeFailed):
            f.result(10)
    deadline = time.monotonic() + 10
    while rt._queue and time.monotonic() < deadline:
        time.sleep(0.01)
    with rt._send_cv_lock:
        rt._closing = rt._stopping = True
        rt._send_cv.notify_all()
    sender.join(10)
    assert not sender.is_alive() and not rt._queue and sent == [] and not rt._pending


def test_answer_refuses_a_proposal_with_no_seq_or_future() -> None:
    rt, _ = runtime()
    blank = _Pending.__new__(_Pending)  # (no __init__: every field unset)
    cut = _Pending(1, b"", LazyFuture(), 0.0)
    del cut.seq
    for bad in (blank, cut):  # an adversary's find: these crashed the process
        with pytest.raises(TypeError, match="no seq or future"):
            _answer(rt._plock, rt._settled, [bad])
    assert not rt._plock.locked()


def test_a_streams_proposer_waits_while_the_senders_queue_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Streams on, put_async waits while more than MAX_QUEUED proposals
    wait for the senders, as append_async does past max_in_flight (an
    adversary's find: four threads queued 500,000 puts in a second while
    3,600 were stored, memory without bound); a sender taking a batch, or
    close(), lets it go. Its proposal is queued meanwhile."""
    monkeypatch.setattr(runtime_module, "MAX_QUEUED", 3)
    rt, _ = runtime(streams=True)
    m = rt.map("m")
    for i in range(3):  # up to the bound: no wait
        m.put_async(f"k{i}", b"v")
    done = threading.Event()
    blocked = threading.Thread(target=lambda: (m.put_async("k3", b"v"), done.set()))
    blocked.start()
    assert not done.wait(0.3) and len(rt._queue) == 4  # queued, and held back
    rt._queue.popleft(), rt._queue.popleft()  # as a sender takes a batch
    rt._room_made()
    assert done.wait(10)
    m.put_async("k4", b"v")
    again = threading.Thread(target=m.put_async, args=("k5", b"v"))
    again.start()
    time.sleep(0.2)
    assert again.is_alive()
    rt._closing = True  # close() lets every waiting proposer go
    with rt._send_cv_lock:
        rt._room.notify_all()
    again.join(10)
    assert not again.is_alive()
