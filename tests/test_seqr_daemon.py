"""zlog-seqr against the real cluster: recovery, restarts, two daemons, shutdown."""
from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from clsobj import log_obj
from pyzlog.core.layout import view_objects
from seqr_proc import SeqrProcess

import pyzlog
from pyzlog import Log, SequencerClient
from pyzlog.core import wire
from pyzlog.core import sequencer as sq


def next_ok(client: SequencerClient, pool: str, name: str, epoch: int, count: int = 1):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, e, pos, n = client.next(pool, name, epoch, count)
        if status != sq.RETRY:
            return status, e, pos, n
        time.sleep(0.01)
    raise AssertionError("sequencer kept answering RETRY")


def test_recovery_seals_and_seeds_counter(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name, width=3)
    for p in (0, 1, 2, 9):
        log.write(p, b"before")
    client = SequencerClient(seqr.address, cluster=rados_cluster)
    status, epoch, pos, n = next_ok(client, ceph.pool, log_name, log.epoch)
    # the daemon took a new epoch, so the client's epoch is stale now
    assert status == sq.STALE_EPOCH and epoch == 2
    assert log.refresh().epoch == 2
    status, epoch, pos, n = next_ok(client, ceph.pool, log_name, 2, 5)
    assert (status, epoch, pos, n) == (sq.OK, 2, 10, 5)  # max + 1
    # every data object is sealed at the new epoch
    for oid in view_objects(log_name, log.views[-1]):
        st = log_obj(log, oid).stat()[1]
        assert st.sealed_epoch == 2
    assert client.tail(ceph.pool, log_name, 2)[2] == 15  # TAIL takes nothing


def test_unknown_log_fails_and_daemon_keeps_serving(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    client = SequencerClient(seqr.address, cluster=rados_cluster)
    status, *_ = next_ok(client, ceph.pool, "no-such-log", 1)
    assert status == sq.RECOVERY_FAILED
    with pytest.raises(pyzlog.SequencerRefused, match="no-such-pool"):  # no secret to prove anything with
        client.next("no-such-pool", "x", 1)
    log = Log.create(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
    assert log.append(b"still serving") == 0


def test_unique_gap_free_across_clients(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    log = Log.create(rados_cluster, ceph.pool, log_name)
    log.write(0, b"x")
    epoch = log.seal_and_find_tail()[0]  # so recovery happens before the race
    first = SequencerClient(seqr.address, cluster=rados_cluster)
    status, epoch, start, _ = next_ok(first, ceph.pool, log_name, epoch + 0)
    if status == sq.STALE_EPOCH:
        status, epoch, start, _ = next_ok(first, ceph.pool, log_name, epoch)
    assert status == sq.OK
    ranges: list[tuple[int, int]] = [(start, 1)]
    lock = threading.Lock()

    def worker(i: int) -> None:
        c = SequencerClient(seqr.address, cluster=rados_cluster)
        mine = []
        for k in range(300):
            s, _, p, n = c.next(ceph.pool, log_name, epoch, 1 + (k + i) % 7)
            assert s == sq.OK
            mine.append((p, n))
        with lock:
            ranges.extend(mine)
        c.close()

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    covered = sorted(p for s, n in ranges for p in range(s, s + n))
    assert covered == list(range(start, start + len(covered)))  # unique and gap-free


def _appender(log: Log, wid: int, count: int, acked: dict, errors: list,  # type: ignore[type-arg]
              stop: threading.Event | None = None) -> None:
    for k in range(count):
        if stop is not None and stop.is_set():
            return
        data = b"w%d-%d" % (wid, k)
        try:
            pos = log.append(data)
        except pyzlog.ZlogError as e:  # an append may fail; it must then not be acknowledged
            errors.append(e)
            continue
        acked.setdefault(pos, []).append(data)


def test_restart_under_load(rados_cluster, ceph, log_name, seqr) -> None:  # type: ignore[no-untyped-def]
    Log.create(rados_cluster, ceph.pool, log_name, width=4)
    acked: dict[int, list[bytes]] = {}
    errors: list[Exception] = []
    logs = [Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address) for _ in range(4)]
    stop = threading.Event()
    ts = [threading.Thread(target=_appender, args=(lg, i, 10**9, acked, errors, stop))
          for i, lg in enumerate(logs)]
    for t in ts:
        t.start()
    served_before = 0
    for _ in range(3):
        time.sleep(1.5)  # clients go back to the sequencer within a second of it returning
        served_before = len(acked)
        seqr.kill(signal.SIGKILL)
        time.sleep(0.3)
        seqr.start()
    time.sleep(1.5)
    stop.set()
    for t in ts:
        t.join(60)
        assert not t.is_alive()
    assert not errors
    assert len(acked) > served_before > 0, "clients did not carry on after the last restart"
    assert all(len(v) == 1 for v in acked.values()), "a position was acknowledged twice"
    reader = Log.open(rados_cluster, ceph.pool, log_name)
    for pos, (data,) in acked.items():
        assert reader.read(pos) == data
    assert reader.refresh().epoch >= 4  # every restart recovered with a new epoch


def test_two_daemons_on_one_log(rados_cluster, ceph, log_name, seqr, tmp_path) -> None:  # type: ignore[no-untyped-def]
    other = SeqrProcess(ceph.conf, log_path=tmp_path / "seqr2.log").start()
    try:
        Log.create(rados_cluster, ceph.pool, log_name, width=2)
        acked: dict[int, list[bytes]] = {}
        errors: list[Exception] = []
        logs = [Log.open(rados_cluster, ceph.pool, log_name,
                         sequencer=(seqr if i % 2 else other).address) for i in range(4)]
        ts = [threading.Thread(target=_appender, args=(lg, i, 150, acked, errors)) for i, lg in enumerate(logs)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
            assert not t.is_alive()
        assert not errors
        assert all(len(v) == 1 for v in acked.values()), "one position acknowledged with two values"
        assert len(acked) == 4 * 150
        reader = Log.open(rados_cluster, ceph.pool, log_name)
        assert all(reader.read(p) == d for p, (d,) in acked.items())
    finally:
        other.kill()


def test_sigterm_is_clean(ceph, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    p = SeqrProcess(ceph.conf, log_path=tmp_path / "s.log").start()
    assert p.stop() == 0
    text = (tmp_path / "s.log").read_text()
    assert "serving on 127.0.0.1" in text and "shutting down" in text and "Traceback" not in text


def test_daemon_with_cluster_down(tmp_path: Path) -> None:
    conf = tmp_path / "ceph.conf"
    conf.write_text("[global]\nmon host = [v2:127.0.0.1:1]\n")
    import subprocess
    import sys
    exe = Path(sys.executable).parent / "zlog-seqr"
    out = subprocess.run([str(exe), "--conf", str(conf), "--port", "0", "--pool", "zlog"], capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 1 and "Error: cannot reach the Ceph cluster" in out.stderr
    assert "Traceback" not in out.stderr
    # a daemon must be told which pools it serves (or be run --insecure on purpose)
    out = subprocess.run([str(exe), "--conf", str(conf), "--port", "0"], capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 2 and "say which pools this daemon serves (--pool POOL" in out.stderr
