"""The C loops of async appends (native/appender_hot.cc), with no cluster:
settle() sorting posted outcomes, and settle_futures() (LazyFuture.settle_all's
loop) agreeing with the Python loop it replaced on every kind of future."""
from __future__ import annotations

import ctypes
import itertools
from concurrent.futures import Future
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pyzlog import _appender
from pyzlog.client import metrics
from pyzlog.core import futures as futures_mod
from pyzlog.core.futures import LazyFuture


def _arrays(tags: list[int], codes: list[int], positions: list[int]) -> tuple[Any, Any, Any]:
    return ((ctypes.c_uint64 * len(tags))(*tags), (ctypes.c_int32 * len(codes))(*codes),
            (ctypes.c_uint64 * len(positions))(*positions))


def _settle(items: dict[int, Any], tags: list[int], codes: list[int], positions: list[int],
            now: float) -> tuple[list[Any], list[Any]]:
    t, c, p = _arrays(tags, codes, positions)
    stored, others = _appender.settle(items, ctypes.addressof(t), ctypes.addressof(c), ctypes.addressof(p),
                                      len(tags), now)
    return stored, others


def test_settle_sorts_outcomes_by_owner_and_times_the_stored() -> None:
    a, b = object(), object()
    fa1, fa2, fb, fx = LazyFuture(), LazyFuture(), LazyFuture(), LazyFuture()
    items = {1: (a, fa1, b"x", 10.0), 2: (b, fb, b"y", 10.5), 3: (a, fa2, b"z", 9.0), 4: (a, fx, b"w", 10.0),
             9: (b, LazyFuture(), b"kept", 1.0)}
    _appender.configure_latency(metrics.LATENCY_BUCKETS)
    counts0, sum0 = _appender.latency()
    stored, others = _settle(items, [1, 2, 3, 4, 5], [0, 0, 0, -30, 0], [7, 8, 12, 9, 99], now=11.0)
    # the stored ones per owner in order, with their highest position
    assert stored == [(a, [(fa1, 7), (fa2, 12)], 12), (b, [(fb, 8)], 8)]
    # not stored: the item itself, with its code and position, for Python to judge
    assert others == [((a, fx, b"w", 10.0), -30, 9)]
    # tag 5 was not there (settled already): skipped; tag 9 not posted: kept
    assert list(items) == [9]
    counts, total = _appender.latency()
    added = [n - m for n, m in zip(counts, counts0)]
    assert sum(added) == 3 and abs((total - sum0) - (1.0 + 0.5 + 2.0)) < 1e-9
    # 1 s, 0.5 s and 2 s: each in the first bucket whose bound is at or above it
    bucket = metrics.LATENCY_BUCKETS.index
    assert (added[bucket(1.0)], added[bucket(0.5)], added[bucket(2.5)]) == (1, 1, 1)


def test_settle_hands_what_is_not_an_item_to_python_and_settles_the_rest() -> None:
    """Something in the items that is not (owner, future, data, float) goes
    back as not stored, for Python to judge (and fail, and log): the rest of
    the batch is still sorted (an adversary's find: the batch's other
    entries were left unsettled, their slots taken for ever)."""
    owner, fut = object(), LazyFuture()
    bad_shape, bad_time = ("not", "an", "item"), (owner, LazyFuture(), b"t", "not a time")
    items: dict[int, Any] = {1: bad_shape, 2: (owner, fut, b"ok", 1.0), 3: bad_time}
    stored, others = _settle(items, [1, 2, 3], [0, 0, 0], [7, 8, 9], now=2.0)
    assert stored == [(owner, [(fut, 8)], 8)]
    assert others == [(bad_shape, 0, 7), (bad_time, 0, 9)] and not items


def test_the_async_histogram_reads_what_settle_counted() -> None:
    """metrics.APPEND_SECONDS["async"] adds the C histogram in at each snapshot."""
    hist = metrics.APPEND_SECONDS["async"]
    import pyzlog.client.pipeline  # noqa: F401 - wires the C histogram in

    before, total_before = hist.snapshot()
    items = {k: (object(), LazyFuture(), b"", 5.0) for k in range(3)}
    _settle(items, [0, 1, 2], [0, 0, 0], [1, 2, 3], now=5.001)
    after, total_after = hist.snapshot()
    assert after[-1][1] - before[-1][1] == 3 and abs(total_after - total_before - 0.003) < 1e-9


# ------------------------------------------------------------ settle_futures
def _python_settle_all(done: list[tuple[Future[Any], Any]]) -> tuple[list[Any], list[Any]]:
    """The loop settle_all ran in Python before it ran in C (the model)."""
    watched, called = [], []
    with futures_mod._make_condition:
        for fut, result in done:
            if type(fut) is LazyFuture and fut._settle_locked(result, None):
                if "_done_callbacks" in fut.__dict__:
                    called.append(fut)
            else:
                watched.append((fut, result))
    return called, watched


class _Sub(LazyFuture):
    pass


_KINDS = ("lazy", "lazy+callback", "watched", "cancelled", "settled", "plain", "subclass")


def _make(kind: str, log: list[tuple[int, Any]], k: int) -> Future[Any]:
    f: Future[Any] = Future() if kind == "plain" else _Sub() if kind == "subclass" else LazyFuture()
    if kind == "lazy+callback":
        f.add_done_callback(lambda x, k=k: log.append((k, x.result())))
    elif kind == "watched":
        f._condition  # noqa: B018 - someone waits on it: settled the ordinary way
    elif kind == "cancelled":
        f.cancel()
    elif kind == "settled":
        f.set_result("before")
    return f


@given(st.lists(st.sampled_from(_KINDS), max_size=12))
@settings(max_examples=200, deadline=None)
def test_settle_futures_in_c_agrees_with_the_python_loop(kinds: list[str]) -> None:
    logs: list[list[tuple[int, Any]]] = [[], []]
    done = [[(_make(kind, logs[side], k), k) for k, kind in enumerate(kinds)] for side in (0, 1)]
    c_called, c_left = _appender.settle_futures(done[0], LazyFuture, futures_mod._make_condition,
                                                futures_mod._DONE, futures_mod._futures.FINISHED)
    p_called, p_left = _python_settle_all(done[1])
    index = [{id(f): k for k, (f, _) in enumerate(side)} for side in done]
    assert [index[0][id(f)] for f in c_called] == [index[1][id(f)] for f in p_called]
    assert [(index[0][id(f)], r) for f, r in c_left] == [(index[1][id(f)], r) for f, r in p_left]
    for (f0, _), (f1, _) in zip(*done):
        assert (f0._state, f0._result, f0._exception) == (f1._state, f1._result, f1._exception)
    # and settle_all, which runs the C loop, leaves every future as Future would
    fresh = [(_make(kind, logs[0], k), k) for k, kind in enumerate(kinds)]
    LazyFuture.settle_all(fresh)
    for (f, k), kind in zip(fresh, kinds):
        assert f.cancelled() if kind == "cancelled" else f.result() == ("before" if kind == "settled" else k)


def test_settle_futures_refuses_what_is_not_a_pair_and_lets_the_lock_go() -> None:
    try:
        _appender.settle_futures([(LazyFuture(),)], LazyFuture, futures_mod._make_condition,
                                 futures_mod._DONE, futures_mod._futures.FINISHED)
    except TypeError as e:
        assert "pairs" in str(e)
    else:
        raise AssertionError("a malformed pair was taken")
    assert futures_mod._make_condition.acquire(blocking=False)  # not left held
    futures_mod._make_condition.release()


def test_tags_are_ints_of_any_size() -> None:
    """settle reads tags as u64 (what itertools.count hands out, far past 2**32)."""
    owner, fut = object(), LazyFuture()
    big = next(itertools.count(2**40))
    stored, others = _settle({big: (owner, fut, b"", 1.0)}, [big], [0], [5], now=1.0)
    assert stored == [(owner, [(fut, 5)], 5)] and others == []


def test_settle_holds_an_owner_whose_last_reference_was_its_item() -> None:
    """The items popped may hold an owner's last reference (a log dropped
    with appends in flight): what settle returns keeps it alive (an
    adversary's find: it was used after being freed)."""
    freed: list[int] = []

    class Owner:
        def __del__(self) -> None:
            freed.append(1)

    items = {1: (Owner(), LazyFuture(), b"a", 0.0), 2: (Owner(), LazyFuture(), b"b", 0.0)}
    stored, _ = _settle(items, [1, 2], [0, 0], [10, 11], now=1.0)
    assert not freed and [type(o).__name__ for o, _, _ in stored] == ["Owner", "Owner"]
    del stored
    assert freed == [1, 1]


# ------------------------------------------------------------ Window
def test_the_window_bounds_waits_and_closes() -> None:
    import threading
    import time

    w = _appender.Window(2)
    assert w.wait_idle(0) and (w.in_flight, w.most, w.closed) == (0, 2, False)
    assert w.take() and w.take() and w.in_flight == 2 and not w.wait_idle(0.05)
    threading.Timer(0.2, w.give).start()
    t0 = time.monotonic()
    assert w.take()  # waited for the slot given back
    assert time.monotonic() - t0 >= 0.15 and w.in_flight == 2
    w.give(5)  # more than taken: none left, never below
    assert w.in_flight == 0 and w.wait_idle(None)
    threading.Timer(0.1, w.close).start()
    assert w.take() and w.take() and not w.take()  # full, then closed while waiting
    assert w.closed and not w.take()


def test_ctrl_c_while_waiting_for_room_takes_no_slot() -> None:
    """A wait for room lets the GIL go and looks for signals: Ctrl-C ends it
    with nothing taken, so flush() and close() are not left waiting for a
    slot nobody holds (Python's Condition could leave one, or raise
    'release unlocked lock', when interrupted)."""
    import _thread
    import signal
    import threading

    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # a background run starts with it ignored
    try:
        w = _appender.Window(1)
        assert w.take()
        threading.Timer(0.1, _thread.interrupt_main).start()
        try:
            w.take()
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("the wait was not interrupted")
        assert w.in_flight == 1
        w.give()
        assert w.wait_idle(1.0)
    finally:
        signal.signal(signal.SIGINT, old)


def test_a_window_holds_at_least_one() -> None:
    try:
        _appender.Window(0)
    except ValueError:
        pass
    else:
        raise AssertionError("an empty window was made")


def test_a_wait_longer_than_a_year_is_a_wait_for_ever() -> None:
    """Past what a deadline in nanoseconds holds, flush(timeout) still waits
    (it returned at once, or overflowed, before)."""
    import threading
    import time

    w = _appender.Window(1)
    assert w.take()
    threading.Timer(0.3, w.give).start()
    t0 = time.monotonic()
    assert w.wait_idle(1e300) and time.monotonic() - t0 >= 0.25
    try:
        w.wait_idle(float("nan"))
    except ValueError:
        pass
    else:
        raise AssertionError("a NaN timeout was taken")


def test_a_slot_is_taken_with_its_entry_or_not_at_all() -> None:
    """take(into, item) appends `item` in C with the slot (a Ctrl-C between
    the two would leave a slot that nothing gives back); an append that fails
    gives the slot back."""
    import collections

    w = _appender.Window(1)
    queue: collections.deque[str] = collections.deque()
    assert w.take(queue, "entry") and list(queue) == ["entry"] and w.in_flight == 1
    token: list[bool] = []
    assert w.take_over(token) and token == [True] and w.in_flight == 2  # past the bound, at once
    w.give(2)
    try:
        w.take(object(), "entry")  # nothing to append to
    except AttributeError:
        pass
    else:
        raise AssertionError("took a slot with nowhere to put its entry")
    assert w.in_flight == 0
    w.close()
    assert not w.take(queue, "late") and list(queue) == ["entry"]


def test_give_takes_a_positive_count() -> None:
    """give(-3) made room past the bound (an adversary's find)."""
    w = _appender.Window(1)
    for n in (0, -3):
        try:
            w.give(n)
        except ValueError:
            pass
        else:
            raise AssertionError(f"give({n}) was taken")
    assert w.take() and w.in_flight == 1


def test_a_hot_path_never_made_answers_rather_than_crashes() -> None:
    """HotPath.__new__ without __init__: arm/disarm/append answer (they
    crashed the interpreter on a NULL snapshot)."""
    hot = _appender.HotPath.__new__(_appender.HotPath)
    hot.arm(None, 0.0)
    hot.disarm()
    assert hot.append(b"x") is None and hot.take_bytes() == 0


def test_a_token_gives_its_slot_back_once() -> None:
    """give_token pops the token and gives the slot in one call: the read's
    outcome and an interrupted read_async may both try, one succeeds (a
    second Ctrl-C between a Python pop and give leaked the slot)."""
    w = _appender.Window(2)
    token: list[bool] = []
    assert w.take(token) and w.in_flight == 1
    assert w.give_token(token) and w.in_flight == 0 and token == []
    assert not w.give_token(token) and w.in_flight == 0
    try:
        w.give_token(("not", "a", "list"))
    except TypeError:
        pass
    else:
        raise AssertionError("a tuple was taken as a token")
