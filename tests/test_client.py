"""The client API end to end: appends (sync, batched, async), reads, streams
with every gap kind, reconfiguration under load, sequencer failover, zstd."""
from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from clsobj import log_obj
from interrupts import InterruptAfter, InterruptedWindow
from seqr_proc import SeqrProcess, module_seqr  # noqa: F401 - the fixture `seqr`, once per file

import pyzlog
import pyzlog.client.positions
from pyzlog import Log, RecordKind
from pyzlog.core import wire
from pyzlog.core.native import Connection


@pytest.fixture(params=["sequencer", "no-sequencer"])
def log(request, rados_cluster, ceph, log_name, seqr):  # type: ignore[no-untyped-def]
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=3,
                    sequencer=seqr.address if request.param == "sequencer" else None)
    yield lg
    lg.close()


def test_append_read_tail(log: Log) -> None:
    assert log.tail() == 0
    positions = [log.append(b"entry-%d" % i) for i in range(50)]
    assert positions == list(range(50))
    assert [log.read(p) for p in positions] == [b"entry-%d" % i for i in range(50)]
    assert log.tail() == 50


def test_append_many(log: Log) -> None:
    positions = log.append_many([b"b%d" % i for i in range(300)])
    assert positions == list(range(300))
    assert all(log.read(p) == b"b%d" % i for i, p in enumerate(positions))


def test_append_many_moves_past_taken_positions(rados_cluster, ceph, log_name, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    log.fill(3)  # the slow path will try 0.. and find 3 taken
    monkeypatch.setattr(pyzlog.client.positions, "max_position", lambda _log: None)  # force positions 0..5 to be tried
    positions = log.append_many([b"x%d" % i for i in range(6)])
    assert len(set(positions)) == 6 and 3 not in positions
    assert all(log.read(p) == b"x%d" % i for i, p in enumerate(positions))


def test_async_hundreds_in_flight(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=4, sequencer=seqr.address, max_in_flight=256)
    assert log.append(b"warm-up") == 0  # the sequencer has recovered the log: no "initialising" answers
    before = log._async.stats()
    futs = [log.append_async(b"a%d" % i) for i in range(2000)]
    positions = [f.result(timeout=60) for f in futs]
    assert sorted(positions) == list(range(1, 2001))
    reads = [log.read_async(p) for p in positions]
    assert [f.result(timeout=60) for f in reads] == [b"a%d" % i for i in range(2000)]
    with pytest.raises(pyzlog.NotWritten):
        log.read_async(5000).result(timeout=10)
    log.flush(timeout=10)
    # every entry went through the C++ pipeline (none took the retry path),
    # and entries queued together shared class calls and sequencer requests
    st = {k: v - before[k] for k, v in log._async.stats().items()}
    assert log._async.retried == 0
    assert st["entries_sent"] == 2000 and st["handed_back"] == 0
    assert st["class_calls"] < 2000 and st["sequencer_requests"] < 2000
    log.close()


def test_append_batching_knobs_shape_the_batches(ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    """connect(append_batching=) reaches the connection's C++ pipeline: with
    max_batch=8 no sequencer request carries more than 8 entries (so 2000
    appends need at least 250), with a linger every entry is still stored."""
    cluster = pyzlog.connect(ceph.conf, append_batching=pyzlog.AppendBatching(max_batch=8, linger_us=300))
    try:
        log = Log.create(cluster, ceph.pool, log_name, width=2, sequencer=seqr.address, max_in_flight=256)
        log.append(b"warm-up")
        before = log._async.stats()
        futs = [log.append_async(b"k%d" % i) for i in range(2000)]
        positions = [f.result(timeout=60) for f in futs]
        st = {k: v - before[k] for k, v in log._async.stats().items()}
        assert sorted(positions) == list(range(1, 2001))
        assert [log.read(p) for p in positions[::97]] == [b"k%d" % i for i in range(0, 2000, 97)]
        assert st["entries_sent"] == 2000 and st["handed_back"] == 0
        assert st["sequencer_requests"] >= 2000 // 8 and st["class_calls"] >= 2000 // 8
        log.close()
    finally:
        cluster.shutdown()


def _stats_reach(log: Log, key: str, value: int, timeout: float = 10.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while (st := log._async.stats())[key] < value and time.monotonic() < deadline:
        time.sleep(0.01)
    return st


def test_a_second_batch_goes_once_the_window_is_full(ceph, log_name, seqr, paused_osd) -> None:  # type: ignore[no-untyped-def]
    """Two batches of a log in flight (the default): while one is, the next
    waits until no more entries can join it (the log's max_in_flight
    reached), so it goes whole, not one entry at a time; everything is
    stored once the OSD answers."""
    cluster = pyzlog.connect(ceph.conf)
    try:
        log = Log.create(cluster, ceph.pool, log_name, width=2, sequencer=seqr.address, max_in_flight=10)
        log.append(b"warm-up")
        log.append_async(b"warm-up").result(timeout=30)
        before = log._async.stats()
        paused_osd()  # the first batch's write stays in flight
        futs = [log.append_async(b"first")]
        st = _stats_reach(log, "sequencer_requests", before["sequencer_requests"] + 1)
        assert st["sequencer_requests"] == before["sequencer_requests"] + 1
        futs += [log.append_async(b"e%d" % i) for i in range(8)]  # 9 of 10 held: more could join
        time.sleep(0.5)
        assert log._async.stats()["sequencer_requests"] == before["sequencer_requests"] + 1
        futs.append(log.append_async(b"last"))  # the window is full: the batch goes, whole
        st = _stats_reach(log, "sequencer_requests", before["sequencer_requests"] + 2)
        assert st["sequencer_requests"] == before["sequencer_requests"] + 2
        assert st["entries_sent"] - before["entries_sent"] == 10
        paused_osd.resume()
        positions = [f.result(timeout=60) for f in futs]
        assert sorted(positions) == list(range(2, 12))
        assert [log.read(p) for p in positions] == [b"first", *(b"e%d" % i for i in range(8)), b"last"]
        log.close()
    finally:
        paused_osd.resume()
        cluster.shutdown()


@pytest.mark.parametrize("path", ["c-path", "python-path"])
def test_append_async_settles_a_given_future_instead_of_making_one(rados_cluster, ceph, log_name, seqr,  # type: ignore[no-untyped-def]
                                                                   path: str) -> None:
    """append_async(data, future=x) settles x (any object with set_result
    and set_exception, called once) and returns it: a layer that keeps its
    own record of each append (the replicated objects' pending proposals)
    makes no Future for it. Both ways in: the common case in C and the
    Python path. One that raises when told is logged; the others are told."""
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address)
    log.append_async(b"warm-up").result(timeout=30)
    if path == "python-path":
        log._async.hot_append = lambda _data, _future=None: None

    class Record:
        def __init__(self) -> None:
            self.told: list[tuple[str, Any]] = []
            self.event = threading.Event()

        def set_result(self, position: int) -> None:
            self.told.append(("stored", position))
            self.event.set()

        def set_exception(self, error: BaseException) -> None:
            self.told.append(("failed", error))
            self.event.set()

    class Raising(Record):
        def set_result(self, position: int) -> None:
            super().set_result(position)
            raise RuntimeError("a given future's own bug (the test)")

    # every seventh raises when told: the others of its batch are still told (an adversary's
    # find: one raising object silenced the rest of its batch, and proposals sharing the log hung)
    records = [Raising() if i % 7 == 3 else Record() for i in range(50)]
    for i, r in enumerate(records):
        assert log.append_async(b"entry %d" % i, future=r) is r
    assert all(r.event.wait(30) for r in records)
    time.sleep(0.05)  # (a second call would have come by now)
    for i, r in enumerate(records):
        assert len(r.told) == 1 and r.told[0][0] == "stored"
        assert log.read(r.told[0][1]) == b"entry %d" % i
    log.close()


@pytest.mark.parametrize("given", [False, True])
def test_an_async_append_on_a_closed_log_says_it_is_closed(rados_cluster, ceph, log_name, seqr,  # type: ignore[no-untyped-def]
                                                           given: bool) -> None:
    """append_async after close() raises LogClosed ("log is closed") and
    tells a given future nothing. A second adversary's find: where the
    closed log's pipeline was told the view again (a small window), the
    C++ pipeline's ValueError("no such log in the pipeline") came out."""
    log = Log.create(rados_cluster, ceph.pool, log_name, width=3, sequencer=seqr.address, max_in_flight=4)
    log.append_async(b"warm-up").result(timeout=30)
    log.close()
    told: list[object] = []

    class Record:
        def set_result(self, position: int) -> None:
            told.append(position)

        def set_exception(self, error: BaseException) -> None:
            told.append(error)

    for _ in range(3):
        with pytest.raises(pyzlog.LogClosed, match="log is closed"):
            log.append_async(b"after close", future=Record() if given else None)
    time.sleep(0.2)  # (a late settle would have come by now)
    assert told == [] and log._async.in_flight == 0


def test_a_closed_log_refuses_appends_and_sequencer_requests(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    """After close(), every append and every request for positions or the
    tail raises LogClosed, and none opens a connection to the sequencer
    again (they did: a sync append after close reconnected, and the new
    connection was never closed). What is stored can still be read."""
    log = Log.create(rados_cluster, ceph.pool, log_name, width=3, sequencer=seqr.address)
    pos = log.append(b"before close")
    log.close()
    stream = 7
    calls = {
        "append": lambda: log.append(b"x"),
        "append_many": lambda: log.append_many([b"x", b"y"]),
        "append_slow": lambda: log.append_slow(b"x"),
        "take_positions": lambda: log.take_positions(2),
        "append_streams": lambda: log.append_streams([stream], [b"x"], lambda d, p, k, b: d),
        "tail": log.tail,
        "stream_tail": lambda: log.stream_tail([stream]),
        "append_async": lambda: log.append_async(b"x"),
    }
    for name, call in calls.items():
        with pytest.raises(pyzlog.LogClosed, match="log is closed"):
            call()
    log.warm_sequencer()  # a hint: nothing, and no error
    assert log.sequencer is not None and not log.sequencer._conns, "a request after close connected again"
    assert log.read(pos) == b"before close"
    assert log.max_position() == pos  # (nothing was stored by the refused calls)


def test_append_async_refuses_a_future_it_cannot_tell(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    """future= takes an object with set_result and set_exception: anything
    else is refused before the entry goes (an adversary's find: it was
    stored, and the position lost in a logged AttributeError)."""
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address)
    class Raising:
        def __getattr__(self, name: str) -> Any:
            raise RuntimeError("a property that raises")

    for bad in (object(), 1, "a future", Future, Raising()):  # (Future: the class, not one)
        with pytest.raises(pyzlog.InvalidRequest, match="set_result and set_exception"):
            log.append_async(b"never stored", future=bad)
    assert log.append_async(b"stored").result(timeout=30) == 0  # the first entry: nothing went before it
    assert [r.data for r in log.stream()] == [b"stored"]
    log.close()


# an interrupt that lands in a gc callback (hypothesis keeps one) is only reported
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("op", ["c-path", "python-path", "read"])
def test_interrupts_while_appending_leave_no_slot_taken(rados_cluster, ceph, log_name, seqr, op) -> None:  # type: ignore[no-untyped-def]
    """KeyboardInterrupt raised at any moment of append_async or read_async
    (a timer every 0.7 ms, a small window so calls often wait for room)
    never leaves a slot of the window taken by an operation that does not
    go: flush() returns and every future handed out is settled (an
    adversary's storm: before, slots leaked on every path, so close() waited
    for ever, and Python's Condition raised 'release unlocked lock')."""
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address, max_in_flight=8)
    first = log.append(b"warm-up")
    log.append_async(b"warm-up").result(timeout=30)
    if op == "python-path":
        log._async.hot_append = lambda _data, _future=None: None
    futs: list[Future[Any]] = []
    armed = [False]

    def interrupt(*_: object) -> None:
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.0007, 0.0007)
    interrupts = 0
    # 3 s, and longer (up to 30 s) until more than 10 interrupts came: a signal handler runs
    # only between bytecodes, so a slow run (the sanitizer tier's, on a loaded machine) may
    # take few in 3 s (10 once)
    start = time.monotonic()

    def going() -> bool:
        now = time.monotonic()
        return now < start + 3 or (interrupts <= 10 and now < start + 30)

    try:
        while going():
            try:
                armed[0] = True
                while going():
                    futs.append(log.read_async(first) if op == "read" else log.append_async(b"i%d" % len(futs)))
            except KeyboardInterrupt:
                interrupts += 1
            armed[0] = False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, old)
    assert interrupts > 10 and futs
    log.flush(timeout=60)
    assert log._async.in_flight == 0
    if op == "read":
        assert all(f.result(timeout=10) == b"warm-up" for f in futs)
        log.close()
        return
    assert not log._async._pipe.items
    positions = [f.result(timeout=10) for f in futs]
    assert len(set(positions)) == len(positions)
    assert all(log.read(p) == b"i%d" % i for i, p in list(enumerate(positions))[::97])
    log.close()


@pytest.mark.parametrize("moment", ["read-after-slot", "read-after-sent", "append-retry-path-after-slot"])
def test_an_interrupt_just_after_a_step_leaves_the_window_right(rados_cluster, ceph, log_name, seqr, moment) -> None:  # type: ignore[no-untyped-def]
    """A Ctrl-C handled between two steps of read_async, or of an append
    going the retry path (no usable sequencer), neither leaves a slot taken
    (flush() then waited for ever) nor gives one back twice (flush() then
    returned with an operation in flight, and read_async raised
    InvalidStateError): an adversary's three finds."""
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address, max_in_flight=4)
    position = log.append(b"x")
    log.append_async(b"w").result(timeout=30)
    a = log._async
    window = a._window
    other = []
    window.take(other)  # stands for another operation in flight
    if moment == "read-after-sent":
        q = a.log.conn._completions()
        real = q.submit
        # the interrupt comes once the completion thread has settled the read
        q.submit = InterruptAfter(real, lambda: time.sleep(0.3))
        try:
            with pytest.raises(KeyboardInterrupt):
                log.read_async(position)
        finally:
            del q.submit
    else:
        a._window = InterruptedWindow(window)
        if moment == "append-retry-path-after-slot":
            a.positions.usable_now = lambda now=None: False  # as after a sequencer failure
        try:
            with pytest.raises(KeyboardInterrupt):
                if moment == "read-after-slot":
                    log.read_async(position)
                else:
                    log.append_async(bytearray(b"retried"))  # not bytes: the Python path
        finally:
            a._window = window
            vars(a.positions).pop("usable_now", None)
    if moment == "append-retry-path-after-slot":
        time.sleep(1)  # the entry queued with its slot goes all the same
        assert window.in_flight == 1
        assert log.read(log.tail() - 1) == b"retried"
    else:
        time.sleep(0.5)
        assert window.in_flight == 1  # the other operation's slot, counted once
        assert not window.wait_idle(0.2)
    window.give()
    log.flush(timeout=10)
    assert a.in_flight == 0
    assert log.read_async(position).result(timeout=10) == b"x"
    log.close()


def test_entries_stranded_on_the_retry_path_still_go(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    """A Ctrl-C between queuing an entry for the retry path and scheduling
    its job (left as: the entry queued, the job marked scheduled, no job)
    wedged the log's retry path for good; the retry thread now looks for
    such entries every second. And a retry thread whose start() a Ctrl-C
    stopped is started again (an adversary's finds)."""
    from pyzlog.client.appending import stored_form
    from pyzlog.core.futures import LazyFuture

    log = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address, max_in_flight=4)
    log.append_async(b"w").result(timeout=30)
    a = log._async
    fut: Future[int] = LazyFuture()
    assert a._window.take(a._retries, (a, fut, stored_form(log.state, b"stranded"), time.monotonic()))
    a._retry_scheduled = True  # as the interrupt left it: no job will come
    assert log.read(fut.result(timeout=30)) == b"stranded"
    assert log.append_async(b"after").result(timeout=30) >= 0 and not a._retry_scheduled

    pipe = a._pipe
    pipe._worker = threading.Thread(target=lambda: None)  # recorded, never started
    ran = threading.Event()
    pipe.later(ran.set)
    assert ran.wait(30)
    log.flush(timeout=30)
    assert a.in_flight == 0
    log.close()


def test_a_done_callback_that_appends_never_waits_for_room(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    """A done-callback runs on the completion thread, the one thread that
    makes room in the window: an append_async or read_async there takes its
    slot at once, past max_in_flight if need be, rather than wait for ever,
    and flush() there is refused at once (an adversary's hangs: callbacks
    that appended while other threads filled the window, or flushed)."""
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address, max_in_flight=1)
    log.append(b"warm-up")
    done = threading.Event()
    got: list[Future[Any]] = []

    refused: list[BaseException] = []

    def more(_f: Future[int]) -> None:
        got.extend([log.append_async(b"c1"), log.append_async(b"c2"), log.read_async(0)])  # the window holds 1
        try:
            log.flush()  # would wait for this very thread to settle c1
        except pyzlog.InvalidRequest as e:
            refused.append(e)
        done.set()

    log.append_async(b"a").add_done_callback(more)
    assert done.wait(30)
    assert len(refused) == 1 and "done-callback" in str(refused[0])
    assert [log.read(f.result(timeout=30)) for f in got[:2]] == [b"c1", b"c2"]
    assert got[2].result(timeout=30) == b"warm-up"
    log.flush(timeout=30)
    assert log._async.in_flight == 0
    log.close()


def test_append_async_takes_the_common_case_in_c_and_loses_nothing(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    """Most async appends go the C way (native/appender_hot.cc); what is not
    its case (not bytes, over the size limit, disarmed, a compressed log)
    Python takes; every entry is stored once, where its future says."""
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address)
    log.append(b"warm-up")
    futs = [log.append_async(b"e%d" % i) for i in range(3000)]
    positions = [f.result(timeout=60) for f in futs]
    assert sorted(positions) == list(range(1, 3001))
    assert [log.read(p) for p in positions[::101]] == [b"e%d" % i for i in range(0, 3000, 101)]
    hot = log._async._hot
    assert hot.appended >= 1500, hot.appended  # the rest: the first after each wait for room, and re-arming
    taken = hot.appended
    odd = [bytearray(b"ba"), memoryview(b"mv")]
    assert [log.read(log.append_async(d).result(timeout=30)) for d in odd] == [b"ba", b"mv"]
    with pytest.raises(pyzlog.EntryTooLarge):
        log.append_async(b"x" * (wire.MAX_ENTRY_BYTES + 1))
    assert hot.appended == taken  # Python took those
    hot.disarm()
    assert hot.append(b"x") is None and not hot.armed
    assert log.read(log.append_async(b"again").result(timeout=30)) == b"again"
    assert hot.armed  # Python looked again and re-armed it
    log.close()
    zlog = Log.create(rados_cluster, ceph.pool, log_name + "-z", width=2, sequencer=seqr.address,
                      compression="zstd")
    futs = [zlog.append_async(b"z%d" % i * 50) for i in range(200)]
    assert [zlog.read(f.result(timeout=30)) for f in futs] == [b"z%d" % i * 50 for i in range(200)]
    assert zlog._async._hot.appended == 0  # entries it would store as given: never armed for zstd
    zlog.close()


@pytest.mark.parametrize("batching, most", [({"window_entries": 4}, 4), ({"window_bytes": 3000}, 2)],
                         ids=["entries", "bytes"])
def test_append_window_bounds_what_is_in_flight(ceph, log_name, seqr, batching, most) -> None:  # type: ignore[no-untyped-def]
    """The connection's window: append_async waits for room, so no more than
    the window is ever queued or in flight; an entry larger than the byte
    window still goes, alone."""
    cluster = pyzlog.connect(ceph.conf, append_batching=pyzlog.AppendBatching(**batching))
    try:
        log = Log.create(cluster, ceph.pool, log_name, width=2, sequencer=seqr.address, max_in_flight=256)
        log.append(b"warm-up")
        native = Connection.of(cluster).pipeline()  # the connection's C++ pipeline, shared by its logs
        seen = 0
        futs = []
        for i in range(300):
            futs.append(log.append_async(b"%04d" % i + b"w" * 1020))
            seen = max(seen, native.in_flight)
        big = log.append_async(b"B" * 10_000)
        positions = [f.result(timeout=60) for f in futs]
        assert sorted(positions) == list(range(1, 301))
        assert log.read(big.result(timeout=60)) == b"B" * 10_000
        assert 1 <= seen <= most
        assert [log.read(p)[:4] for p in positions[::37]] == [b"%04d" % i for i in range(0, 300, 37)]
        log.close()
    finally:
        cluster.shutdown()


def test_a_done_callback_that_ends_its_thread_stops_no_later_append(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    """A done-callback calling sys.exit() runs on the connection's completion
    thread: logged, and every later async append and read still settles."""
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address)
    left = []

    def leave(_f: Future[int]) -> None:
        if threading.current_thread() is not threading.main_thread():  # settled already: it runs here, at once
            left.append(threading.current_thread().name)
            raise SystemExit("a callback calling sys.exit()")

    seqr.pause()  # the appends wait for positions: their callbacks are added before they settle
    try:
        first = [log.append_async(b"a%d" % i) for i in range(50)]
        for f in first:
            f.add_done_callback(leave)
    finally:
        seqr.resume()
    assert sorted(f.result(timeout=60) for f in first) == list(range(50))
    assert left and set(left) == {"pyzlog-complete"}
    futs = [log.append_async(b"b%d" % i) for i in range(200)]
    assert sorted(f.result(timeout=30) for f in futs) == list(range(50, 250))
    assert log.read_async(50).result(timeout=30).startswith(b"b")
    log.close()


def test_data_plane_connects_like_the_callers_rados(ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    """The data plane opens its connection with the settings of the caller's
    rados.Rados (a plain one too); if cephx refuses it, opening the log says
    so, naming the client."""
    import rados

    plain = rados.Rados(conffile=ceph.conf, rados_id="admin")
    plain.connect(timeout=10)
    try:
        log = Log.create(plain, ceph.pool, log_name, sequencer=seqr.address)
        log.append(b"warm-up")
        positions = [f.result(timeout=30) for f in [log.append_async(b"p%d" % i) for i in range(50)]]
        assert sorted(positions) == list(range(1, 51))
        assert [log.read(p) for p in positions] == [b"p%d" % i for i in range(50)]
        assert log._async.retried == 0  # all through the C++ pipeline
        log.close()
    finally:
        plain.shutdown()

    cluster = pyzlog.connect(ceph.conf)
    cluster.client_name = "client.nosuch"  # cephx will refuse the second connection
    try:
        with pytest.raises(pyzlog.ZlogError, match="client.nosuch"):
            Log.open(cluster, ceph.pool, log_name, sequencer=seqr.address)
    finally:
        cluster.shutdown()


def test_async_coalesced_batch_moves_past_a_filled_position(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    """write_many is all or nothing: when it meets a position a reader filled,
    the other entries are stored where they were, leaving no holes."""
    log = Log.create(rados_cluster, ceph.pool, log_name, width=1, sequencer=seqr.address, max_in_flight=512)
    assert log.append(b"first") == 0
    for p in (3, 40, 41, 200):
        log.fill(p)
    before = log._async.stats()
    futs = [log.append_async(b"e%d" % i) for i in range(400)]
    positions = [f.result(timeout=60) for f in futs]
    assert len(set(positions)) == 400 and not {3, 40, 41, 200} & set(positions)
    assert [log.read(p) for p in positions] == [b"e%d" % i for i in range(400)]
    kinds = {r.position: r.kind for r in log.stream(0, max(positions) + 1, hole_wait=0.2)}
    assert [p for p, k in kinds.items() if k != RecordKind.DATA] == [3, 40, 41, 200]  # filled, no holes
    st = {k: v - before[k] for k, v in log._async.stats().items()}
    assert st["split_batches"] >= 1 and st["class_calls"] < st["entries_sent"]
    log.close()


def test_async_reconfigure_and_sequencer_restart_while_appending(rados_cluster, ceph, log_name, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The C++ path under epoch changes: new views, and a sequencer killed and
    restarted (down meanwhile: appends go on by slow tail finding)."""
    s = SeqrProcess(ceph.conf, log_path=tmp_path / "s.log").start()
    try:
        Log.create(rados_cluster, ceph.pool, log_name, width=2)
        log = Log.open(rados_cluster, ceph.pool, log_name, sequencer=s.address, max_in_flight=64)
        acked: dict[int, bytes] = {}
        futs: list[tuple[bytes, Future[int]]] = []
        before = log._async.stats()
        stop = threading.Event()

        def appender() -> None:
            k = 0
            while not stop.is_set():
                data = b"x%d" % k
                futs.append((data, log.append_async(data)))
                k += 1
                if k % 50 == 0:
                    time.sleep(0.01)

        t = threading.Thread(target=appender)
        t.start()
        admin = Log.open(rados_cluster, ceph.pool, log_name)
        time.sleep(0.5)
        admin.reconfigure(3)
        time.sleep(0.5)
        s.kill(signal.SIGKILL)
        time.sleep(0.5)
        s.start()
        time.sleep(1.5)  # clients look for the sequencer again after a second
        admin.reconfigure(1)
        time.sleep(0.5)
        stop.set()
        t.join(30)
        for data, fut in futs:
            pos = fut.result(timeout=120)
            assert pos not in acked
            acked[pos] = data
        assert len(acked) > 500
        assert log.positions.sequencer_usable()
        assert log._async.retried > 0  # the C++ path met the epoch changes and the sequencer's death
        after = log._async.stats()["entries_sent"]
        assert after > before["entries_sent"]
        tail_entries = [log.append_async(b"after-%d" % i) for i in range(200)]
        for f in tail_entries:
            f.result(timeout=60)
        assert log._async.stats()["entries_sent"] >= after + 200  # back on the C++ path
        reader = Log.open(rados_cluster, ceph.pool, log_name)
        assert [v.width for v in reader.views][-1] == 1
        streamed = {r.position: r.data for r in reader.stream(0, max(acked) + 1, hole_wait=0.2)
                    if r.kind == RecordKind.DATA}
        assert {p: d for p, d in streamed.items() if not d.startswith(b"after-")} == acked
        log.close()
    finally:
        s.kill()


def test_stream_reports_every_gap_kind(log: Log) -> None:
    for p in range(12):
        if p not in (4, 7, 9):
            log.write(p, b"d%d" % p)
    log.fill(4)
    log.trim(7)
    # 9 stays unwritten below the tail: a hole the reader fills after the wait
    t0 = time.monotonic()
    recs = list(log.stream(0, hole_wait=0.3))
    assert time.monotonic() - t0 >= 0.3
    assert [r.position for r in recs] == list(range(12))
    kinds = {r.position: r.kind for r in recs}
    assert kinds[4] == RecordKind.FILLED and kinds[7] == RecordKind.TRIMMED and kinds[9] == RecordKind.LOST
    assert all(r.data == b"d%d" % r.position for r in recs if r.kind == RecordKind.DATA)
    with pytest.raises(pyzlog.Filled):  # the reader filled the hole for good
        log.read(9)
    # and every later reader reports the same loss, not a plain fill
    assert [r.kind for r in log.stream(9, 10)] == [RecordKind.LOST]
    assert log.first_position() == 0
    log.trim_to(5)
    assert [r.kind for r in log.stream(0, 6)] == [RecordKind.TRIMMED] * 6
    assert log.first_position() == 6


def test_stream_a_long_range_in_order(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=5)
    n = 5000
    log.append_many([b"%06d" % i for i in range(n)])
    recs = list(log.stream(0))
    assert [r.position for r in recs] == list(range(n))
    assert [r.data for r in recs] == [b"%06d" % i for i in range(n)]
    assert [r.position for r in log.stream(1234, 1240)] == list(range(1234, 1240))


def test_follow_sees_new_entries_and_holes(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address)
    got: list[pyzlog.Record] = []

    def follow() -> None:
        for rec in Log.open(rados_cluster, ceph.pool, log_name).stream(0, follow=True, hole_wait=0.3):
            got.append(rec)
            if len(got) == 6:
                return

    t = threading.Thread(target=follow)
    t.start()
    time.sleep(0.3)
    for i in range(3):
        log.append(b"f%d" % i)
    hole = log.take_positions(1)  # a writer takes a number and dies
    log.append(b"after-hole")
    log.append(b"last")
    t.join(30)
    assert not t.is_alive()
    assert [r.position for r in got] == list(range(6))
    assert got[hole].kind == RecordKind.LOST
    assert [r.data for r in got if r.kind == RecordKind.DATA] == [b"f0", b"f1", b"f2", b"after-hole", b"last"]


def test_reconfigure_while_appending(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    Log.create(rados_cluster, ceph.pool, log_name, width=2)
    acked: dict[int, bytes] = {}
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[Exception] = []

    def appender(wid: int) -> None:
        lg = Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
        k = 0
        while not stop.is_set():
            data = b"w%d-%d" % (wid, k)
            try:
                pos = lg.append(data)
            except pyzlog.ZlogError as e:
                errors.append(e)
                return
            with lock:
                assert pos not in acked
                acked[pos] = data
            k += 1

    ts = [threading.Thread(target=appender, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    admin = Log.open(rados_cluster, ceph.pool, log_name)
    for width in (4, 1, 3):
        time.sleep(0.5)
        view = admin.reconfigure(width)
        assert view.width == width
    time.sleep(0.5)
    stop.set()
    for t in ts:
        t.join(60)
    assert not errors
    views = admin.refresh().views
    assert [v.width for v in views] == [2, 4, 1, 3]
    assert all(views[i].start <= views[i + 1].start for i in range(len(views) - 1))
    assert max(acked) >= views[-1].start  # appends went on in the newest view
    reader = Log.open(rados_cluster, ceph.pool, log_name)
    assert all(reader.read(p) == d for p, d in acked.items())
    streamed = {r.position: r.data for r in reader.stream(0, hole_wait=0.2) if r.kind == RecordKind.DATA}
    assert streamed == acked


def test_sequencer_down_and_back(rados_cluster, ceph, log_name, tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    s = SeqrProcess(ceph.conf, log_path=tmp_path / "s.log").start()
    try:
        log = Log.create(rados_cluster, ceph.pool, log_name, sequencer=s.address)
        first = [log.append(b"a%d" % i) for i in range(20)]
        s.kill(signal.SIGKILL)
        with caplog.at_level("WARNING", logger="pyzlog"):
            during = [log.append(b"b%d" % i) for i in range(20)]
        assert "slow tail finding" in caplog.text
        s.start()
        time.sleep(1.2)  # clients look for the sequencer again after a second
        after = [log.append(b"c%d" % i) for i in range(20)]
        assert log.positions.sequencer_usable()
        allpos = first + during + after
        assert len(set(allpos)) == 60
        assert [log.read(p) for p in allpos] == [b"%s%d" % (c, i) for c in (b"a", b"b", b"c") for i in range(20)]
    finally:
        s.kill()


def test_zstd_compression(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, compression="zstd")
    payload = b"compressible " * 500
    pos = log.append(payload)
    assert log.read(pos) == payload
    ret, stored = log_obj(log, log.oid_of(pos)).read(log.epoch, pos)
    assert ret == 0
    assert len(stored) < len(payload) // 10
    # a reader that was not told about compression decodes by itself
    other = Log.open(rados_cluster, ceph.pool, log_name)
    assert other.config["compression"] == "zstd"
    assert [r.data for r in other.stream(0)] == [payload]
    assert other.read_async(pos).result(10) == payload
    with pytest.raises(pyzlog.InvalidRequest, match="unknown compression"):
        Log.create(rados_cluster, ceph.pool, log_name + "x", compression="lz5")


def test_bad_arguments(log: Log) -> None:
    with pytest.raises(pyzlog.InvalidRequest, match="bad range"):
        log.stream(10, 5)
    with pytest.raises(pyzlog.InvalidRequest, match="bad position"):
        log.stream(-1)
    with pytest.raises(pyzlog.InvalidRequest):
        log.append("not bytes")  # type: ignore[arg-type]
    with pytest.raises(pyzlog.EntryTooLarge):
        log.append_async(b"x" * (wire.MAX_ENTRY_BYTES + 1))
    if log.state.meta.views[-1].bounded:
        with pytest.raises(pyzlog.InvalidRequest, match="past its view's last stripe"):
            log.fill(wire.MAX_POSITION - 2)  # its stripe number would not fit the wire's 32 bits
    with pytest.raises(pyzlog.InvalidRequest, match="stripe width"):
        log.reconfigure(0)
    with pytest.raises(pyzlog.InvalidRequest, match="sequencer address"):
        Log.open(log.cluster, log.pool, log.name, sequencer="nohostport")


def test_stream_from_the_middle_sees_holes_on_unread_objects(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=4)
    for p in range(6):
        log.write(p, b"d%d" % p)
    log.fill(8)  # 6 and 7 were handed out and never written; 8 lives on an object not read yet
    recs = [(r.position, r.kind) for r in log.stream(5, hole_wait=0.2)]
    assert recs == [(5, RecordKind.DATA), (6, RecordKind.LOST), (7, RecordKind.LOST), (8, RecordKind.FILLED)]


def test_abandoned_stream_exits_cleanly(ceph, log_name, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Read-ahead still in flight when the program ends must not abort it."""
    import subprocess
    import sys
    script = tmp_path / "abandon.py"
    script.write_text(f"""
import pyzlog
c = pyzlog.connect({ceph.conf!r})
log = pyzlog.Log.create(c, {ceph.pool!r}, {log_name!r}, width=8)
log.append_many([b"x" * 100] * 5000)
for rec in log.stream(0):
    break
print("done")
""")
    out = subprocess.run([sys.executable, "-P", str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "done" and "terminate" not in out.stderr


def test_dropped_follow_streams_survive_gc(ceph, log_name, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A follow stream dropped with read-ahead in flight, then gc.collect():
    the pending aio must keep its ioctx alive (this used to segfault)."""
    import subprocess
    import sys
    script = tmp_path / "gc_streams.py"
    script.write_text(f"""
import gc, threading
import pyzlog
from pyzlog import Log
r = pyzlog.connect({ceph.conf!r})
w = Log.create(r, {ceph.pool!r}, {log_name!r}, width=4)
w.append_many([b"x%d" % i for i in range(200)])
for k in range(15):
    lg = Log.open(r, {ceph.pool!r}, {log_name!r})
    s = lg.stream(0, follow=True, hole_wait=1)
    for n, rec in enumerate(s, 1):
        if n == 200 + k:
            break
        if n == 199 + k:
            threading.Timer(0.05, lambda: w.append(b"y")).start()
    lg.close()
    del s, lg
    gc.collect()
    sum(i * i for i in range(100000))
print("survived")
""")
    out = subprocess.run([sys.executable, "-P", str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "survived", (out.returncode, out.stderr[-2000:])


def test_a_stream_started_after_shutdown_is_refused(ceph, log_name, seqr, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A thread that starts a stream after its connection shut down (as at
    exit) gets ClusterUnavailable: it made a queue on the freed data-plane
    connection, and releasing that queue freed it again (abort: double free)."""
    import subprocess
    import sys
    Log.create(c := pyzlog.connect(ceph.conf), ceph.pool, log_name, sequencer=seqr.address).append(b"x")
    c.shutdown()
    script = tmp_path / "after_shutdown.py"
    script.write_text(f"""
import pyzlog
cl = pyzlog.connect({ceph.conf!r})
lg = pyzlog.Log.open(cl, {ceph.pool!r}, {log_name!r})
assert sum(b.num_rows for b in lg.stream_batches(0, 1)) == 1
cl.shutdown()
for _ in range(3):
    try:
        list(lg.stream_batches(0, 1))
    except pyzlog.ClusterUnavailable as e:
        print("refused:", e)
""")
    out = subprocess.run([sys.executable, "-P", "-X", "faulthandler", str(script)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    assert out.stdout.count("refused: the data plane connection is closed") == 3, out.stdout


def test_exit_is_clean_while_daemon_threads_drop_batches(tmp_path: Path) -> None:
    """Daemon threads build and drop zero-copy Arrow batches while the
    program exits. Arrow lets go of a batch's memory in a noexcept C++
    destructor; anything there that gives up the GIL (a cffi free, a Python
    __del__) let a daemon thread exit through it as the interpreter
    finalized: std::terminate, an abort in about 1 run in 30 (with thread
    switches forced often). Twenty runs, every exit status 0."""
    import subprocess
    import sys
    script = tmp_path / "churn_exit.py"
    script.write_text("""
import sys, threading, time
from pyzlog.core import scan
sys.setswitchinterval(1e-6)
def churn():
    while True:
        b = scan.build_batch([None], 0, 10).batch
        s = b.slice(0, 0)
        del b, s
for _ in range(3):
    threading.Thread(target=churn, daemon=True).start()
time.sleep(0.2)
""")
    for run in range(20):
        out = subprocess.run([sys.executable, "-P", "-X", "faulthandler", str(script)], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, (run, out.returncode, out.stderr[-3000:])


@pytest.mark.parametrize("pause", [0.1, 0.3, 0.6])
def test_exit_is_clean_whatever_threads_wait_on(ceph, log_name, seqr, tmp_path: Path, pause: float) -> None:  # type: ignore[no-untyped-def]
    """The program ends while daemon threads follow a stream, read and append
    without pause (issue 15: a stream thread crashed the exit with SIGSEGV;
    librados aborted on a call made after it was shut down). Exit status 0;
    the threads get a typed error, never a crash."""
    import subprocess
    import sys
    Log.create(ceph_cluster := pyzlog.connect(ceph.conf), ceph.pool, log_name, sequencer=seqr.address).append(b"x")
    ceph_cluster.shutdown()
    script = tmp_path / "busy_exit.py"
    script.write_text(f"""
import threading, time
import pyzlog
lg = pyzlog.Log.open(pyzlog.connect({ceph.conf!r}), {ceph.pool!r}, {log_name!r})
def follow():
    for _ in lg.stream(0, follow=True, hole_wait=30):
        pass
def reads():
    while True:
        lg.read_async(0).result()
def appends():
    while True:
        lg.append_async(b"z")
for target in (follow, reads, appends, follow):
    threading.Thread(target=target, daemon=True).start()
time.sleep({pause})
print("exiting", flush=True)
""")
    out = subprocess.run([sys.executable, "-P", "-X", "faulthandler", str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    assert out.stdout.strip() == "exiting"
    assert "ceph_assert" not in out.stderr and "Fatal Python error" not in out.stderr


def test_read_async_outcomes(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    """read_async: data, every gap as its typed error, and positions across a
    reconfiguration another client made (the stale epoch is handled inside)."""
    writer = Log.create(rados_cluster, ceph.pool, log_name, width=3)
    writer.append_many([b"d%d" % i for i in range(6)])
    writer.fill(6)
    writer.trim(1)
    log = Log.open(rados_cluster, ceph.pool, log_name)
    assert [log.read_async(p).result(timeout=30) for p in (0, 2, 5)] == [b"d0", b"d2", b"d5"]
    for pos, error in ((1, pyzlog.Trimmed), (6, pyzlog.Filled), (7, pyzlog.NotWritten), (10**6, pyzlog.NotWritten)):
        with pytest.raises(error):
            log.read_async(pos).result(timeout=30)
    writer.reconfigure(width=2)  # `log` still holds the old epoch
    p = writer.append(b"after")
    assert log.read_async(p).result(timeout=30) == b"after"
    assert log.read_async(3).result(timeout=30) == b"d3"
    futs = [log.read_async(i % 6 if i % 6 != 1 else 0) for i in range(2000)]
    assert sum(1 for f in futs if f.result(timeout=60)) == 2000


def test_warm_sequencer_connects_ahead_for_the_first_request(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    """Log.warm_sequencer() opens the sequencer connection (its handshake
    reads the pool's secret) so the first request does not wait for it; a
    replicated-objects runtime's player calls it while start() reads the
    first position. A sequencer nobody answers at is no error there: the
    first request meets it, as it would have."""
    Log.create(rados_cluster, ceph.pool, log_name, width=2).close()
    with Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address) as lg:
        client = lg.positions.sequencer
        assert client is not None and ceph.pool not in client._conns
        lg.warm_sequencer()
        conn = client._conns[ceph.pool]
        assert not conn.closed
        assert lg.append(b"first") == 0 and client._conns[ceph.pool] is conn  # the request used it
        lg.warm_sequencer()  # connected already: nothing changes
        assert client._conns[ceph.pool] is conn
    lg.warm_sequencer()  # closed (a failed start's player may get here late): connects to nothing
    assert not client._conns
    from seqr_proc import free_port

    with Log.open(rados_cluster, ceph.pool, log_name, sequencer=f"127.0.0.1:{free_port()}") as lg:
        lg.warm_sequencer()  # refused: logged, not raised
        assert lg.tail() == 1  # found without it (slow tail finding), as before


def test_a_request_behind_a_failed_warm_up_does_not_connect_again(rados_cluster, ceph, log_name, tmp_path,  # type: ignore[no-untyped-def]
                                                                   monkeypatch) -> None:
    """A paused sequencer: the runtime's player warms the connection up and
    waits the whole timeout for the handshake, holding the client's lock. A
    tail request made meanwhile waited for the lock and then made its own
    connection attempt, a second timeout (a second adversary's find). It now
    fails at once with the warm-up's error and falls back: one attempt."""
    from pyzlog.core.sequencer import SequencerClient

    paused = SeqrProcess(ceph.conf, log_path=tmp_path / "paused.log").start()
    attempts: list[str] = []
    real = SequencerClient._connect

    def counted(self: SequencerClient, pool: str) -> Any:
        attempts.append(pool)
        return real(self, pool)

    Log.create(rados_cluster, ceph.pool, log_name, width=2).close()
    lg = Log.open(rados_cluster, ceph.pool, log_name, sequencer=paused.address)
    try:
        monkeypatch.setattr(SequencerClient, "_connect", counted)
        paused.pause()
        warm = threading.Thread(target=lg.warm_sequencer)
        warm.start()
        while not attempts:  # the warm-up holds the lock, connecting
            time.sleep(0.01)
        assert lg.tail() == 0  # behind it, then without the sequencer
        warm.join(30)
        assert not warm.is_alive() and attempts == [ceph.pool]
    finally:
        paused.resume()
        lg.close()
        paused.kill()
