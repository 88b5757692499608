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
import time
import weakref
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyzlog import LazyFuture, Log, ZlogError
from pyzlog.client.log import TELLABLE_KEPT, _TELLABLE, _can_tell
from pyzlog.objects import NotApplied, ObjectsError, Runtime, RuntimeClosed, RuntimeFailed, entry
from pyzlog.objects.runtime import CMD, NOOP, _Pending, _propose_native

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


def runtime() -> tuple[Runtime, Recorder]:
    rt = Runtime(Log.__new__(Log), client_id=ME)
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
            rt._closing = True  # the retrier's loop ends
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
