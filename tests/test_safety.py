"""Safety regressions: each test reproduced a defect against the real cluster
(issue 16) before its fix. Data anomalies first, then bounded waits: whatever a
dead or slow process leaves half done, every operation ends within a bounded
time (succeeds, or raises a typed error)."""
from __future__ import annotations

import dataclasses
import errno
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from clsobj import log_obj
from seqr_proc import module_seqr  # noqa: F401 - the fixture `seqr`, once per file

import pyzlog
import pyzlog.client.ops
from pyzlog import Log, RecordKind
from pyzlog.core import wire
from pyzlog.core.cluster import open_ioctx
from pyzlog.core.layout import META_NAMESPACE, Place, view_objects, view_places
from pyzlog.core.native import Op

#: a wait that a dead process can cause must end well within this (the
#: client finishes a half-done epoch change after a few seconds)
BOUND = 25.0


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """fn()'s result, failing the test if it has not returned in `seconds`."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still waiting after {seconds:.0f}s"
    if "error" in out:
        raise out["error"]
    return out["value"]


def seal_raw(lg: Log, epoch: int, indices: list[int] | None = None) -> None:
    """Seal objects of the newest view at `epoch` as a process would that then
    died before installing the epoch in the metadata."""
    oids = view_objects(lg.name, lg.views[-1])
    for i in (range(len(oids)) if indices is None else indices):
        assert log_obj(lg, oids[i]).seal(epoch) == 0


def kinds(records: Any) -> list[RecordKind]:
    return [r.kind for r in records]


# ------------------------------------------------------------ data anomalies

@pytest.mark.parametrize("with_seqr", [False, True], ids=["no-sequencer", "sequencer"])
def test_trimmed_positions_are_never_handed_out_again(rados_cluster, ceph, log_name, seqr,
                                                      with_seqr) -> None:  # type: ignore[no-untyped-def]
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=4,
                    sequencer=seqr.address if with_seqr else None)
    assert lg.append_many([b"e%d" % i for i in range(10)]) == list(range(10))
    lg.trim_to(20)  # above everything stored
    lg.reconfigure(width=3)
    p = lg.append(b"after the trim")
    assert p > 20, f"position {p} was trimmed, and is handed out again"
    assert lg.first_position() == 21
    fresh = Log.open(rados_cluster, ceph.pool, log_name)
    recs = list(fresh.stream(0))
    assert kinds(recs[:21]) == [RecordKind.TRIMMED] * 21
    assert recs[-1].position == p and recs[-1].data == b"after the trim"
    for q in (0, 15, 20):
        with pytest.raises(pyzlog.Trimmed):
            fresh.read(q)


@pytest.mark.parametrize("with_seqr", [False, True], ids=["no-sequencer", "sequencer"])
def test_a_trim_above_a_view_nobody_wrote_to_yet_is_never_handed_out(rados_cluster, ceph, log_name, seqr,
                                                                     with_seqr) -> None:  # type: ignore[no-untyped-def]
    """trim_to above the tail right after a reconfiguration, before any
    append opened a stripe of the new view (no object of it holds the
    watermark): the next views and the sequencer still start above it.
    (CI on 99583e3: data at positions trimmed by trim_to(tail() + 50).)"""
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=3,
                    sequencer=seqr.address if with_seqr else None)
    assert lg.append_many([b"e%d" % i for i in range(10)]) == list(range(10))
    lg.reconfigure(width=2)
    lg.trim_to(60)
    other = Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address if with_seqr else None)
    assert other.append(b"before the next view") > 60
    lg.reconfigure(width=3)
    p = lg.append(b"after the trim")
    assert p > 60, f"position {p} was trimmed, and is handed out again"
    assert other.append(b"another") > 60
    recs = list(Log.open(rados_cluster, ceph.pool, log_name).stream(0, hole_wait=0.2))
    assert kinds(recs[:61]) == [RecordKind.TRIMMED] * 61
    assert sorted(r.data for r in recs if r.kind == RecordKind.DATA) == [b"after the trim", b"another",
                                                                         b"before the next view"]


def test_a_stripe_opened_after_the_trim_point_rose_refuses_what_lies_below_it(rados_cluster, ceph,
                                                                               log_name) -> None:  # type: ignore[no-untyped-def]
    """A trimmer between raising the log's trim point and trimming the
    objects (it lists the stripes open then) while a writer opens the next
    stripe for a position handed out before: the objects the writer makes
    carry the watermark, so the write is refused, not stored under it. A
    trim_to cut short after raising the trim point is finished by the next."""
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2, slots=4)  # 8 positions a stripe
    assert lg.append_many([b"e%d" % i for i in range(3)]) == [0, 1, 2]
    first = lg.take_positions(20)  # 3..22: stripes 0, 1, 2
    lg.state.meta_store.trim(12)  # the trimmer's first step, and nothing more yet
    with pytest.raises(pyzlog.Trimmed):
        lg.write(first + 7, b"handed out before the trim")  # 10, in stripe 1, not open yet
    lg.write(first + 12, b"above the trim")  # 15
    lg.trim_to(12)  # the trimmer was cut short; this one trims what it left (stripe 0) too
    assert pyzlog.client.ops._objects_trimmed_below(lg.state) == 13  # the next one starts there
    for q in (3, 10, 12):
        with pytest.raises(pyzlog.Trimmed):
            Log.open(rados_cluster, ceph.pool, log_name).read(q)
    assert Log.open(rados_cluster, ceph.pool, log_name).read(15) == b"above the trim"


def test_a_trim_above_the_tail_inside_a_reconfiguration_does_not_wedge_the_log(
        rados_cluster, ceph, log_name, seqr, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """trim_to(12) above the tail (9) at the epoch a reconfiguration has just
    installed, before it closes the objects at 10. The trim's watermark used
    to raise their max past the end, and every later epoch change failed to
    close them (InvalidRequest for ever, appends included; found by an
    adversarial review). The objects now refuse that epoch (sealed above it)
    and the trim waits for the new view; the class also lowers a max only a
    trim raised to the end, should a close meet one."""
    import pyzlog.core.tailfind as tailfind

    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2, slots=4, sequencer=seqr.address)
    assert lg.append_many([b"e%d" % i for i in range(10)]) == list(range(10))
    trimmer = Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
    close = tailfind.close_places
    trimmed: dict[str, int] = {}  # object -> the trimmer's TRIM_TO result
    closed: set[str] = set()

    def trim_then_close(log, places, epoch, end):  # type: ignore[no-untyped-def]
        if places[0].view.width == 2 and not trimmed:  # the trimmer's steps, up to its object trims
            trimmer.state.meta_store.trim(12)
            meta = trimmer.state.refresh()
            listed = pyzlog.client.ops._trimmed_places(trimmer.state, meta, 12, 0)
            trimmed.update((p.oid, code) for p, (code, _) in zip(listed, trimmer.state.conn.calls(
                [(trimmer.state.data, p.oid, Op.TRIM_TO, {"epoch": meta.epoch, "position": 12, "format": p.format})
                 for p in listed])))
            closed.update(p.oid for p in places)
        return close(log, places, epoch, end)

    monkeypatch.setattr(tailfind, "close_places", trim_then_close)
    assert lg.reconfigure(width=3).width == 3
    monkeypatch.setattr(tailfind, "close_places", close)
    assert closed and {trimmed[oid] for oid in closed} == {-errno.ESTALE}, (trimmed, closed)
    pyzlog.client.ops.trim_to(trimmer.state, 12)  # the trimmer goes on
    assert Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address).append(b"after") > 12
    assert lg.append(b"after, too") > 12
    assert lg.reconfigure(width=2).width == 2
    for q in (0, 9, 10, 12):
        with pytest.raises(pyzlog.Trimmed):
            Log.open(rados_cluster, ceph.pool, log_name).read(q)


@pytest.mark.parametrize("stripes", ["stripe-open-ahead", "no-stripe-open"])
def test_a_slow_append_inside_a_reconfiguration_is_never_orphaned(rados_cluster, ceph, log_name,
                                                                   stripes, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A log without a sequencer: an append by slow tail finding at the epoch
    a reconfiguration has just installed, before it closes the old view.
    It used to be stored past the end the view was then closed at (or, in
    a view with no stripe open, in a stripe the close never saw), and the
    next view started below it: acknowledged, then read as not written and
    its position handed out again. Found by an adversarial review."""
    import pyzlog.core.tailfind as tailfind
    from pyzlog.core.layout import place
    from pyzlog.core.stripes import make

    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2, slots=4)  # 8 positions a stripe
    assert lg.append_many([b"e%d" % i for i in range(10)]) == list(range(10))
    if stripes == "stripe-open-ahead":
        st = lg.state
        st.refresh()
        assert make(st, st.meta.epoch, place(log_name, st.meta.views[-1], 16)) == 0
    else:
        lg.reconfigure(width=3)  # a view from 10 with no stripe open
    close = tailfind.close_places
    acked: list[int] = []
    appender: list[threading.Thread] = []

    def append_then_close(log, places, epoch, end):  # type: ignore[no-untyped-def]
        if not appender:  # stored at once (the bug), or waits for the reconfiguration to finish
            appender.append(threading.Thread(target=lambda: acked.append(
                Log.open(rados_cluster, ceph.pool, log_name).append(b"in the window"))))
            appender[0].start()
            appender[0].join(1.0)
        return close(log, places, epoch, end)

    monkeypatch.setattr(tailfind, "close_places", append_then_close)
    other_width = 3 if stripes == "stripe-open-ahead" else 2
    assert lg.reconfigure(width=other_width).width == other_width
    monkeypatch.setattr(tailfind, "close_places", close)
    appender[0].join(BOUND)
    assert acked, "the append in the window never finished"
    positions = acked
    later = [Log.open(rados_cluster, ceph.pool, log_name).append(b"later %d" % i) for i in range(3)]
    assert positions[0] not in later, f"position {positions[0]} was acknowledged and handed out again"
    assert Log.open(rados_cluster, ceph.pool, log_name).read(positions[0]) == b"in the window"
    recs = list(Log.open(rados_cluster, ceph.pool, log_name).stream(0, hole_wait=0.2))
    assert sorted(r.data for r in recs if r.kind == RecordKind.DATA) == sorted(
        [b"e%d" % i for i in range(10)] + [b"in the window"] + [b"later %d" % i for i in range(3)])


def test_a_trim_while_appends_are_in_flight_never_comes_back(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    """The realistic form: trim_to(tail() - 1) with async appends in flight,
    then a reconfiguration. No position at or below the watermark is ever
    acknowledged after the trim, nor holds data again."""
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=3, sequencer=seqr.address)
    acked_at: dict[int, str] = {}  # position -> the phase its append was issued in

    def note(phase: str) -> Callable[[Any], None]:
        def done(f: Any) -> None:
            if f.exception() is None:
                acked_at[f.result()] = phase
        return done

    for i in range(300):
        lg.append_async(b"a%d" % i).add_done_callback(note("before"))
    q = lg.tail() - 1
    lg.trim_to(q)
    for i in range(300):
        lg.append_async(b"b%d" % i).add_done_callback(note("after"))
    lg.reconfigure(width=2)
    for i in range(50):
        lg.append_async(b"c%d" % i).add_done_callback(note("after"))
    lg.flush()
    # an append issued before the trim may be acknowledged after it (stored,
    # then trimmed); one issued after it must never get a trimmed position
    late = sorted(p for p, phase in acked_at.items() if p <= q and phase == "after")
    assert not late, f"appends issued after trim_to({q}) acknowledged at trimmed positions {late[:10]}"
    recs = list(Log.open(rados_cluster, ceph.pool, log_name).stream(0, hole_wait=0.2))
    assert all(r.kind == RecordKind.TRIMMED for r in recs[:q + 1])
    data_at = {r.position for r in recs if r.kind == RecordKind.DATA}
    assert data_at == {p for p in acked_at if p > q}


def test_a_reconfiguration_cut_in_half_is_finished_at_its_recorded_end(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    """Killed after closing some objects at the new view's start, before the
    metadata had the new view: the next client finishes it there."""
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=3)
    lg.append_many([b"x%d" % i for i in range(5)])
    epoch = lg.epoch + 1
    seal_raw(lg, epoch)
    places = view_places(lg.name, lg.views[-1])
    assert log_obj(lg, places[0].oid).close(epoch, 5) == 0
    p = within(BOUND, lambda: lg.append(b"after"))
    assert p == 5 and lg.views[-1].start == 5 and lg.epoch > epoch
    # the old view's objects keep refusing positions of the new one
    assert log_obj(lg, places[2].oid).write(lg.epoch, places[2].next_held(8), b"z") == -errno.ESTALE
    assert [r.data for r in Log.open(rados_cluster, ceph.pool, log_name).stream(0)] == \
        [b"x%d" % i for i in range(5)] + [b"after"]


def test_refresh_never_goes_back_to_an_older_epoch(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    a = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    before = a.state.meta_store.get()
    Log.open(rados_cluster, ceph.pool, log_name).reconfigure(width=3)
    epoch = a.refresh().epoch  # 2 (omap), or 3 (data: the epoch is installed, then the view)
    assert epoch >= 2
    a.state.meta_store.get = lambda: before  # type: ignore[method-assign]  # a slow refresh's older read
    assert a.refresh().epoch == epoch
    assert a.epoch == epoch and len(a.views) == 2


def test_an_old_views_object_refuses_positions_past_its_end(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    a = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    assert a.append(b"x") == 0
    Log.open(rados_cluster, ceph.pool, log_name).reconfigure(width=3)  # new view from 1 at epoch 2
    new = a.state.meta_store.get()
    # what a thread sharing `a` could hold after a slower refresh stored the
    # old view history beside the new epoch: new epoch, old views
    a.state._meta = dataclasses.replace(new, views=new.views[:1])
    pos = a.append(b"y")
    fresh = Log.open(rados_cluster, ceph.pool, log_name)
    assert fresh.read(pos) == b"y", "acknowledged, but not where readers look"
    assert [(r.position, r.kind, r.data) for r in fresh.stream(pos, pos + 1)] == \
        [(pos, RecordKind.DATA, b"y")]


def test_every_reader_reports_one_kind_at_a_position(rados_cluster, ceph, log_name, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    lg.write(1, b"x")  # position 0 is a hole below the tail
    reader = Log.open(rados_cluster, ceph.pool, log_name)
    fill = pyzlog.client.ops.fill

    def loses_the_race(log, position: int, reason: int = wire.FILL_JUNK) -> None:  # type: ignore[no-untyped-def]
        if reason == wire.FILL_LOST:
            lg.fill(position)  # a client's plain fill lands before the reader's
        fill(log, position, reason)

    monkeypatch.setattr(pyzlog.client.ops, "fill", loses_the_race)
    seen = list(reader.stream(0, hole_wait=0.05))
    again = list(Log.open(rados_cluster, ceph.pool, log_name).stream(0))
    assert kinds(seen) == kinds(again) == [RecordKind.FILLED, RecordKind.DATA]


# --------------------------------------------------------------- bounded waits

@pytest.mark.parametrize("sealed", [[0, 1, 2, 3], [0]], ids=["all-sealed", "some-sealed"])
@pytest.mark.parametrize("with_seqr", [False, True], ids=["no-sequencer", "sequencer"])
def test_a_half_done_epoch_change_does_not_wedge_the_log(rados_cluster, ceph, log_name, seqr,
                                                         sealed, with_seqr) -> None:  # type: ignore[no-untyped-def]
    """A sequencer or reconfiguration killed after sealing, before installing."""
    address = seqr.address if with_seqr else None
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=4, sequencer=address)
    old = lg.append_many([b"old%d" % i for i in range(8)])
    seal_raw(lg, lg.epoch + 1, sealed)
    reader = Log.open(rados_cluster, ceph.pool, log_name)
    recs = within(BOUND, lambda: list(reader.stream(0, old[-1] + 1)))
    assert [r.data for r in recs] == [b"old%d" % i for i in range(8)]
    p = within(BOUND, lambda: lg.append(b"new"))
    assert p > old[-1] and reader.read(p) == b"new"
    f = lg.append_async(b"async")
    assert reader.read(within(BOUND, lambda: f.result())) == b"async"


def test_no_sequencer_client_finishes_an_interrupted_reconfiguration(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2)
    lg.append_many([b"a", b"b", b"c"])
    seal_raw(lg, lg.epoch + 1)
    # max_position (slow tail finding's step) must not spin on the sealed objects
    assert within(BOUND, lg.max_position) == 2
    assert within(BOUND, lambda: lg.append(b"d")) == 3


def test_a_recovery_asked_for_while_one_finishes_is_not_dropped(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    from pyzlog.daemon.service import SequencerDaemon

    class SlowToFinish:
        """The daemon's server, pausing after each install: the finished
        recovery still counts as running while a newer epoch is shown."""

        def __init__(self, server: Any) -> None:
            self._server = server
            self.installed = threading.Event()

        def install(self, *args: Any) -> Any:
            applied = self._server.install(*args)
            self.installed.set()
            time.sleep(1.0)
            return applied

        def __getattr__(self, name: str) -> Any:
            return getattr(self._server, name)

    daemon = SequencerDaemon(rados_cluster, port=0, pools=(ceph.pool,), standby=False)
    slow = SlowToFinish(daemon.server)
    daemon.server = slow  # type: ignore[assignment]
    daemon.start()
    try:
        lg = Log.create(rados_cluster, ceph.pool, log_name, width=2)
        client = pyzlog.SequencerClient(f"127.0.0.1:{daemon.port}", cluster=rados_cluster)
        client.next(ceph.pool, log_name, lg.epoch)  # unknown log: a recovery starts
        assert slow.installed.wait(10)
        epoch = lg.seal_and_find_tail()[0]  # another client moves the epoch on
        client.next(ceph.pool, log_name, epoch)  # -> the daemon must recover again

        def ready() -> bool:
            state = [x for x in daemon.server.logs() if x["log"] == log_name]
            return bool(state) and state[0]["state"] == "ready" and state[0]["epoch"] > epoch

        deadline = time.monotonic() + 10
        while not ready() and time.monotonic() < deadline:
            client.next(ceph.pool, log_name, epoch)
            time.sleep(0.1)
        assert ready(), f"log left as {[x for x in daemon.server.logs() if x['log'] == log_name]}"
    finally:
        daemon.stop()


def _remove_log(rados_cluster: Any, pool: str, lg: Log) -> None:
    data = open_ioctx(rados_cluster, pool)
    meta = open_ioctx(rados_cluster, pool, META_NAMESPACE)
    for v in lg.views:
        for oid in view_objects(lg.name, v):
            try:
                data.remove_object(oid)
            except Exception:  # noqa: BLE001 - never created
                pass
    meta.remove_object(lg.name)


def test_a_log_created_again_under_its_name_while_a_sequencer_serves_it(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    first = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address)
    for _ in range(3):
        first.append(b"first life")
    first.reconfigure(width=2)
    first.append(b"first life")  # the sequencer serves it at epoch 4 or so
    _remove_log(rados_cluster, ceph.pool, first)
    again = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address)
    assert again.epoch == 1
    p = within(BOUND, lambda: again.append(b"second life"))
    assert again.read(p) == b"second life"
    f = again.append_async(b"second life, async")
    assert again.read(within(BOUND, lambda: f.result())) == b"second life, async"


def test_holes_found_together_are_waited_for_together(rados_cluster, ceph, log_name,  # type: ignore[no-untyped-def]
                                                      monkeypatch) -> None:
    """One hole_wait for all forty holes of a lost batch, not forty of them:
    the stream's own sleeps (what it meant to wait, not the wall clock) add
    up to about one hole_wait."""
    from pyzlog.client import batches

    slept: list[float] = []
    real_sleep = batches.time.sleep

    class Clock:
        monotonic = staticmethod(batches.time.monotonic)

        @staticmethod
        def sleep(s: float) -> None:
            slept.append(s)
            real_sleep(s)

    monkeypatch.setattr(batches, "time", Clock)
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=4)
    lg.write(40, b"x")  # 0..39 were handed out and never written: one lost batch
    recs = within(120, lambda: list(lg.stream(0, hole_wait=1.0)))
    assert kinds(recs) == [RecordKind.LOST] * 40 + [RecordKind.DATA]
    assert sum(slept) < 3.0, f"the stream slept {sum(slept):.1f}s over 40 holes"
