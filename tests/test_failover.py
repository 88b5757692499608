"""Sequencer discovery and failover with no operator (issue 15): clients
find the sequencer in the log's metadata and follow it; standby daemons take
over the logs of a daemon killed or paused past its lease; a paused daemon
that comes back steps down; a contested log settles on one owner; killing
one daemon moves only its logs."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from seqr_proc import Fleet, SeqrProcess

import pyzlog
from pyzlog import Log
from pyzlog.core import sequencer as sq
from pyzlog.core.registry import read_records, recent, registry_ioctx

LEASE = 1.0


def wait_until(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def daemons(ceph, rados_cluster, tmp_path: Path) -> Iterator[Callable[..., SeqrProcess]]:  # type: ignore[no-untyped-def]
    """Start standby daemons for the test pool; all stopped (and their
    registry records removed) at the end."""
    fleet = Fleet(ceph.conf, ceph.pool, tmp_path, LEASE)
    yield fleet.start
    fleet.close()
    io = registry_ioctx(rados_cluster, ceph.pool)
    for p in fleet.started:  # what a kill -9 left behind
        try:
            io.remove_object(p.address)
        except Exception:  # noqa: BLE001 - removed by its own clean stop
            pass


def owner(lg: Log) -> str:
    return lg.refresh().sequencer


class Appenders:
    """Threads appending (sync and async) through their own clients; every
    acknowledged position with its data, and the positions acknowledged
    through each sequencer address, with the time."""

    def __init__(self, cluster, pool: str, name: str, n: int = 2, seqr: str | None = None) -> None:  # type: ignore[no-untyped-def]
        self.logs = [Log.open(cluster, pool, name, sequencer=seqr) for _ in range(n)]
        self.acked: dict[int, list[bytes]] = {}
        self.via: list[tuple[float, str]] = []  # (time acknowledged, sequencer asked)
        self.errors: list[Exception] = []
        self.lock = threading.Lock()
        self.stop_flag = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i, lg), daemon=True)
                        for i, lg in enumerate(self.logs)]

    def _run(self, i: int, lg: Log) -> None:
        k = 0
        while not self.stop_flag.is_set():
            data = b"w%d-%d" % (i, k)
            k += 1
            try:
                if i % 2:
                    pos = lg.append_async(data).result(timeout=60)
                else:
                    pos = lg.append(data)
            except pyzlog.ZlogError as e:
                self.errors.append(e)
                continue
            seqr = lg.sequencer.address if lg.sequencer is not None and lg.positions.sequencer_usable() else ""
            with self.lock:
                self.acked.setdefault(pos, []).append(data)
                self.via.append((time.monotonic(), seqr))

    def start(self) -> Appenders:
        for t in self.threads:
            t.start()
        return self

    def first_via(self, address: str, after: float) -> float:
        with self.lock:
            return next((t for t, a in self.via if a == address and t > after), 0.0)

    def stop_and_check(self, cluster, pool: str, name: str) -> None:  # type: ignore[no-untyped-def]
        self.stop_flag.set()
        for t in self.threads:
            t.join(120)
            assert not t.is_alive(), "an appender hung"
        for lg in self.logs:
            lg.close()
        assert not self.errors, self.errors[:3]
        assert all(len(v) == 1 for v in self.acked.values()), "one position acknowledged twice"
        reader = Log.open(cluster, pool, name)
        assert all(reader.read(p) == d for p, (d,) in self.acked.items()), "an acknowledged entry is not there"


def test_clients_find_the_sequencer_in_the_metadata(rados_cluster, ceph, log_name, daemons) -> None:  # type: ignore[no-untyped-def]
    a = daemons(standby=False)
    lg = Log.create(rados_cluster, ceph.pool, log_name, sequencer=a.address)
    lg.append(b"x")
    assert owner(lg) == a.address  # the daemon recorded itself when it took the log
    other = Log.open(rados_cluster, ceph.pool, log_name)  # no address given
    assert other.append(b"y") == 1
    assert other.sequencer is not None and other.sequencer.address == a.address
    assert other.positions.sequencer_usable()


def test_a_new_log_gets_a_sequencer_from_the_registry(rados_cluster, ceph, log_name, daemons) -> None:  # type: ignore[no-untyped-def]
    a, b = daemons(), daemons()
    # a daemon answers on its port a moment before its first registry record lands
    wait_until(lambda: {a.address, b.address} <= {r.address for r in read_records(
        registry_ioctx(rados_cluster, ceph.pool))}, 30, "both daemons in the registry")
    lg = Log.create(rados_cluster, ceph.pool, log_name)
    lg.append(b"x")
    picked = owner(lg)
    # a live daemon of the registry (another test's daemon may be one of them)
    assert picked in {r.address for r in recent(read_records(registry_ioctx(rados_cluster, ceph.pool)))}
    # every client picks the same daemon for the same log
    assert Log.open(rados_cluster, ceph.pool, log_name).append(b"y") == 1
    assert owner(lg) == picked


def _takeover(rados_cluster, ceph, log_name, daemons, fault: str) -> tuple[float, SeqrProcess]:  # type: ignore[no-untyped-def]
    """The owner killed or paused under sync and async appenders: the gap
    from the fault to the first append acknowledged through the standby."""
    a, b = daemons(), daemons()
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=a.address)
    lg.append(b"first")
    assert owner(lg) == a.address
    w = Appenders(rados_cluster, ceph.pool, log_name).start()
    try:
        wait_until(lambda: len(w.acked) > 200, 30, "appends through the first sequencer")
        t0 = time.monotonic()
        if fault == "kill":
            a.kill()
        else:
            a.pause()
        wait_until(lambda: owner(lg) == b.address, 15, "the standby to take the log over")
        first = wait_until(lambda: w.first_via(b.address, t0), 15, "an append through the new sequencer")
        if fault == "pause":
            a.resume()  # it comes back while clients of both exist
            time.sleep(3 * LEASE)
        n = len(w.acked)
        wait_until(lambda: len(w.acked) > n + 100, 30, "appends after the change")
    finally:
        w.stop_and_check(rados_cluster, ceph.pool, log_name)
    assert owner(lg) == b.address
    return first - t0, a


def test_kill9_of_the_active_sequencer_with_a_standby(rados_cluster, ceph, log_name, daemons) -> None:  # type: ignore[no-untyped-def]
    gap, _ = _takeover(rados_cluster, ceph, log_name, daemons, "kill")
    assert gap < 10


def test_a_paused_sequencer_is_replaced_and_steps_down(rados_cluster, ceph, log_name, daemons, tmp_path) -> None:  # type: ignore[no-untyped-def]
    gap, old = _takeover(rados_cluster, ceph, log_name, daemons, "pause")
    assert gap < LEASE + 10
    assert "stepped down" in (tmp_path / "seqr0.log").read_text()
    # the old sequencer hands out no position for the log any more
    c = sq.SequencerClient(old.address, cluster=rados_cluster)
    lg = Log.open(rados_cluster, ceph.pool, log_name)
    for _ in range(50):
        status, *_ = c.next(ceph.pool, log_name, lg.epoch, 1)
        assert status != sq.OK
        if status == sq.RECOVERY_FAILED:
            break
        time.sleep(0.05)
    assert status == sq.RECOVERY_FAILED
    c.close()


def test_a_contested_log_settles_on_one_owner(rados_cluster, ceph, log_name, daemons) -> None:  # type: ignore[no-untyped-def]
    a, b = daemons(), daemons()
    Log.create(rados_cluster, ceph.pool, log_name, width=2)
    # clients told different sequencers, all at once
    wa = Appenders(rados_cluster, ceph.pool, log_name, n=2, seqr=a.address).start()
    wb = Appenders(rados_cluster, ceph.pool, log_name, n=2, seqr=b.address).start()
    lg = Log.open(rados_cluster, ceph.pool, log_name)
    try:
        wait_until(lambda: len(wa.acked) + len(wb.acked) > 300, 60, "appends")
        settled = lg.refresh()
        time.sleep(3)
        later = lg.refresh()
        assert later.sequencer == settled.sequencer and later.epoch == settled.epoch, \
            f"still changing hands: {settled} -> {later}"
        assert all(x.sequencer is not None and x.sequencer.address == later.sequencer
                   for x in wa.logs + wb.logs)
    finally:
        wa.stop_and_check(rados_cluster, ceph.pool, log_name)
        wb.stop_and_check(rados_cluster, ceph.pool, log_name)
    assert not set(wa.acked) & set(wb.acked)


def test_killing_one_daemon_moves_only_its_logs(rados_cluster, ceph, daemons) -> None:  # type: ignore[no-untyped-def]
    ds = [daemons() for _ in range(3)]
    names = [f"many-{i}-{time.monotonic_ns()}" for i in range(12)]
    logs = [Log.create(rados_cluster, ceph.pool, n) for n in names]
    for lg in logs:
        lg.append(b"x")
    before = {lg.name: lg.refresh() for lg in logs}
    by_daemon = {d.address: [n for n, m in before.items() if m.sequencer == d.address] for d in ds}
    victim = max(ds, key=lambda d: len(by_daemon[d.address]))
    assert by_daemon[victim.address], by_daemon
    victim.kill()
    moved = by_daemon[victim.address]
    wait_until(lambda: all(Log.open(rados_cluster, ceph.pool, n).refresh().sequencer != victim.address
                           for n in moved), 15, "the dead daemon's logs to move")
    for lg in logs:
        now = lg.refresh()
        if lg.name in moved:
            assert now.sequencer in {d.address for d in ds if d is not victim}
        else:
            assert (now.sequencer, now.epoch) == (before[lg.name].sequencer, before[lg.name].epoch), \
                "a log of a live daemon was disturbed"
        assert lg.append(b"after") > 0


def test_a_daemon_stopped_cleanly_hands_its_logs_on(rados_cluster, ceph, log_name, daemons) -> None:  # type: ignore[no-untyped-def]
    """SIGTERM removes the daemon's record: the standby takes its logs at
    once, without waiting for the lease."""
    a, b = daemons(), daemons()
    lg = Log.create(rados_cluster, ceph.pool, log_name, sequencer=a.address)
    lg.append(b"x")
    assert owner(lg) == a.address
    time.sleep(2 * LEASE)  # the standby has seen it beat
    assert a.stop() == 0
    wait_until(lambda: owner(lg) == b.address, 30, "the standby to take the log over")
    assert lg.append(b"y") == 1
    assert lg.sequencer is not None and lg.sequencer.address == b.address


def test_a_standby_started_after_the_owner_died_takes_over_when_asked(rados_cluster, ceph, log_name, daemons) -> None:  # type: ignore[no-untyped-def]
    """The log's recorded sequencer died before any standby saw it: a client
    that cannot reach it asks a daemon from the registry, which takes over."""
    a = daemons()
    lg = Log.create(rados_cluster, ceph.pool, log_name, sequencer=a.address)
    lg.append(b"x")
    a.kill()
    b = daemons()  # never saw `a`
    client = Log.open(rados_cluster, ceph.pool, log_name)
    positions = [client.append(b"y%d" % i) for i in range(20)]
    assert positions == list(range(1, 21))
    wait_until(lambda: owner(lg) == b.address, 10, "the new daemon to take the log over")
    wait_until(lambda: client.append(b"z") and client.positions.sequencer_usable()
               and client.sequencer is not None and client.sequencer.address == b.address, 10,
               "the client to use the new daemon")


# ------------------------------------------- the tail counts every stored entry
def test_an_entry_stored_without_the_sequencer_is_below_its_tail(rados_cluster, ceph, log_name, daemons) -> None:  # type: ignore[no-untyped-def]
    """Slow tail finding (a client that cannot reach the sequencer, here
    append_slow) stores past the sequencer's counter: it first takes an
    epoch of its own, so the sequencer's answer at its old epoch is not
    believed and every tail after the append lies above the entry (before
    the fix, tail() answered the stale counter: a replica's sync() then
    missed an acknowledged put, test_objects_faults)."""
    a = daemons(standby=False)
    writer = Log.create(rados_cluster, ceph.pool, log_name, sequencer=a.address)
    reader = Log.open(rados_cluster, ceph.pool, log_name)
    for i in range(3):
        writer.append(b"by the sequencer %d" % i)
    assert reader.tail() == 3  # the reader holds the sequencer's epoch
    served = reader.refresh().sequencer_epoch
    pos = writer.append_slow(b"without it")
    assert pos == 3
    assert reader.tail() > pos
    assert reader.refresh().epoch > served
    nxt = writer.append(b"by the sequencer again")
    assert nxt > pos and reader.read(pos) == b"without it" and reader.read(nxt) == b"by the sequencer again"


def test_positions_are_written_at_the_epoch_they_were_handed_out_under(rados_cluster, ceph, log_name, daemons) -> None:  # type: ignore[no-untyped-def]
    """The sequencer hands out a position, then takes the log over again at a
    newer epoch (counting only what is stored) before the writer writes it,
    while another thread of the writer reads the newer metadata. The write
    must go at the old epoch, be refused, and take a new position: written
    at the newer one, the sequencer's tail would stay at an acknowledged
    entry and hand its position out again."""
    a = daemons(standby=False)
    lg = Log.create(rados_cluster, ceph.pool, log_name, sequencer=a.address)
    other = Log.open(rados_cluster, ceph.pool, log_name)
    lg.append(b"first")
    take = lg.positions.take
    moved: list[int] = []

    def take_then_move_on(count: int) -> Any:
        got = take(count)
        if not moved:
            moved.append(got[0])
            other.seal_and_find_tail()  # an epoch without the sequencer ...
            other.tail()  # ... which the sequencer then takes the log over from
            assert other.refresh().sequencer_epoch > got[1].epoch
            lg.refresh()  # what another thread of this client would do meanwhile
        return got

    lg.positions.take = take_then_move_on  # type: ignore[method-assign]
    pos = lg.append(b"second")
    assert moved == [1]
    # refused at its epoch, the entry took a position from the sequencer that
    # took the log over (position 1 again: it was never stored), so that
    # sequencer counts it
    assert other.tail() > pos, "the entry was written at the newer epoch, past the sequencer's counter"
    assert other.read(pos) == b"second"


def test_a_slow_append_during_a_reconfiguration_lands_in_one_view(rados_cluster, ceph, log_name, daemons) -> None:  # type: ignore[no-untyped-def]
    """A reconfiguration of a data-format view installs its first epoch, then
    closes the old view at its end. A slow append in between used to store
    at that end at that epoch: the close refused it (EINVAL) and every later
    attempt did too, a log no reconfiguration or sequencer could move again.
    The first epoch now records the log's sequencer, so slow tail finding
    installs a newer one before storing, the reconfiguration's close is
    refused as stale, and it starts over. (A log that never had a sequencer
    records none: see the closing note of this change.)"""
    from pyzlog.core import tailfind

    a = daemons(standby=False)
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=a.address)
    other = Log.open(rados_cluster, ceph.pool, log_name)
    for i in range(3):
        lg.append(b"before %d" % i)
    close = tailfind.close_places
    slipped: list[int] = []

    def close_after_a_slow_append(log, places, epoch, end):  # type: ignore[no-untyped-def]
        if not slipped:
            slipped.append(other.append_slow(b"in between"))
        return close(log, places, epoch, end)

    tailfind.close_places = close_after_a_slow_append  # type: ignore[assignment]
    try:
        view = lg.reconfigure(3)
    finally:
        tailfind.close_places = close
    assert view.width == 3 and slipped
    assert other.read(slipped[0]) == b"in between"
    assert view.start > slipped[0]
    after = lg.append(b"after")
    assert after >= view.start and lg.read(after) == b"after"
    assert [r.data for r in lg.stream(0, after + 1) if r.data is not None][-2:] == [b"in between", b"after"]


def test_a_taken_position_is_written_at_the_epoch_it_was_handed_out_under(rados_cluster, ceph, log_name, daemons) -> None:  # type: ignore[no-untyped-def]
    """take_positions() and write(): a writer that holds a position while the
    sequencer takes the log over at a newer epoch is refused (StaleEpoch) and
    takes a new one. Written at the newer epoch, the entry would lie at the
    new sequencer's counter: its tail below an acknowledged entry."""
    a = daemons(standby=False)
    lg = Log.create(rados_cluster, ceph.pool, log_name, sequencer=a.address)
    other = Log.open(rados_cluster, ceph.pool, log_name)
    lg.append(b"first")
    held = lg.take_positions(1)
    other.seal_and_find_tail()
    assert other.tail() == held  # the sequencer took the log over; `held` was never stored
    lg.refresh()
    with pytest.raises(pyzlog.StaleEpoch, match="handed out at epoch"):
        lg.write(held, b"late")
    again = lg.take_positions(1)
    lg.write(again, b"in time")
    assert other.tail() > again and other.read(again) == b"in time"
    # a position nobody handed out through this Log is written as before, at the newest epoch
    lg.write(again + 1, b"chosen")
    assert other.read(again + 1) == b"chosen"
