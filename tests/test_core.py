"""The Python core: logs, typed errors, slow tail finding, concurrent writers."""
from __future__ import annotations

import multiprocessing as mp
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

import pyzlog
from pyzlog import Log
from pyzlog.core import wire
from pyzlog.core.native import Connection

from clsobj import log_obj, shape
from pyzlog.core.layout import view_objects


@pytest.fixture
def log(rados_cluster, ceph, log_name):  # type: ignore[no-untyped-def]
    return Log.create(rados_cluster, ceph.pool, log_name, width=3)


def test_create_open_list(rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    created = Log.create(rados_cluster, ceph.pool, log_name, width=5, config={"x": 1})
    assert shape(created.views) == [(1, 0, 5)]
    assert created.config == {"x": 1, "compression": "none"}
    with pytest.raises(pyzlog.LogExists):
        Log.create(rados_cluster, ceph.pool, log_name)
    opened = Log.open(rados_cluster, ceph.pool, log_name)
    assert opened.meta == created.meta
    assert log_name in Log.list(rados_cluster, ceph.pool)
    with pytest.raises(pyzlog.LogNotFound, match="does not exist"):
        Log.open(rados_cluster, ceph.pool, log_name + "-missing")
    with pytest.raises(pyzlog.PoolNotFound, match="no-such-pool"):
        Log.open(rados_cluster, "no-such-pool", log_name)


@pytest.mark.parametrize("name", ["", "-lead", "a/b", "x" * 201, "sp ace", "ünï"])
def test_bad_names(rados_cluster, ceph, name: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(pyzlog.InvalidRequest, match="bad log name"):
        Log.create(rados_cluster, ceph.pool, name)


@pytest.mark.parametrize("width", [0, -1, wire.MAX_WIDTH + 1, 2.5])
def test_bad_width(rados_cluster, ceph, log_name, width) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(pyzlog.InvalidRequest, match="stripe width"):
        Log.create(rados_cluster, ceph.pool, log_name, width=width)
    with pytest.raises(pyzlog.LogNotFound):
        Log.open(rados_cluster, ceph.pool, log_name)


def test_position_operations(log: Log) -> None:
    log.write(4, b"four")
    assert log.read(4) == b"four"
    with pytest.raises(pyzlog.ReadOnly) as ei:
        log.write(4, b"again")
    assert ei.value.position == 4
    with pytest.raises(pyzlog.NotWritten):
        log.read(5)
    with pytest.raises(pyzlog.NotWritten):
        log.read(10**12)  # an object that was never created
    log.fill(5)
    with pytest.raises(pyzlog.Filled):
        log.read(5)
    with pytest.raises(pyzlog.Filled):
        log.write(5, b"late")
    log.trim(4)
    with pytest.raises(pyzlog.Trimmed):
        log.read(4)


def test_trim_to_covers_every_object(log: Log) -> None:
    for p in range(12):
        log.write(p, b"%d" % p)
    log.trim_to(7)
    for p in range(8):
        with pytest.raises(pyzlog.Trimmed):
            log.read(p)
    assert [log.read(p) for p in range(8, 12)] == [b"8", b"9", b"10", b"11"]


@pytest.mark.parametrize("bad", [-1, 2**64, wire.MAX_POSITION + 1, "3", 1.0, True])
def test_bad_positions(log: Log, bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(pyzlog.InvalidRequest, match="bad position"):
        log.read(bad)
    with pytest.raises(pyzlog.InvalidRequest, match="bad position"):
        log.write(bad, b"x")


def test_entry_limits(log: Log) -> None:
    with pytest.raises(pyzlog.EntryTooLarge):
        log.write(1, b"x" * (wire.MAX_ENTRY_BYTES + 1))
    with pytest.raises(pyzlog.InvalidRequest, match="bytes"):
        log.write(1, "text")  # type: ignore[arg-type]
    with pytest.raises(pyzlog.NotWritten):
        log.read(1)
    log.write(1, b"")
    assert log.read(1) == b""


# ------------------------------------------------------------ tail finding


def test_slow_tail_finding(log: Log) -> None:
    assert log.seal_and_find_tail() == (2, 0)  # empty log
    for p in (0, 1, 7, 20):
        log.write(p, b"x")
    log.fill(31)
    epoch, nxt = log.seal_and_find_tail()
    assert (epoch, nxt) == (3, 32)
    assert log.epoch == 3
    # every object of the view is sealed at the new epoch: old-epoch writes are refused
    for oid in view_objects(log.name, log.views[-1]):
        ret, st = log_obj(log, oid).stat()
        assert ret == 0 and st is not None and st.sealed_epoch == 3
    stale = log_obj(log, log.oid_of(40)).write(2, 40, b"old")
    assert isinstance(pyzlog.core.errors.error_for(stale, "write"), pyzlog.StaleEpoch)
    # a client holding the old epoch refreshes by itself and succeeds
    other = Log.open(log.cluster, log.pool, log.name)
    other.state._meta = wire.Meta(2, other.meta.config, other.views)
    other.write(41, b"fresh")
    assert other.epoch == 3 and log.read(41) == b"fresh"


def test_tail_finding_contacts_objects_together(log: Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """Objects are contacted concurrently: one batch of calls per step, never
    one call after another."""
    log.write(3, b"x")
    batches: list[list[str]] = []
    real_calls = Connection.calls

    def recording(self, items):  # type: ignore[no-untyped-def]
        batches.append([op.name for _pool, _oid, op, _fields in items])
        return real_calls(self, items)

    monkeypatch.setattr(Connection, "calls", recording)
    _epoch, nxt = log.seal_and_find_tail()
    assert nxt == 4
    data = [b for b in batches if b[0] in ("SEAL", "STAT")]
    # stat (pick the epoch), seal, stat again (the max, and any view end): each on all 3 at once
    assert data == [["STAT"] * 3, ["SEAL"] * 3, ["STAT"] * 3], batches


def test_concurrent_tail_finders(log: Log) -> None:
    for p in range(10):
        log.write(p, b"x")
    results: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            mine = Log.open(log.cluster, log.pool, log.name)
            for _ in range(5):
                results.append(mine.seal_and_find_tail())
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=run) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    epochs = [e for e, _ in results]
    assert len(set(epochs)) == len(epochs) == 20  # every finder got its own epoch
    assert {n for _, n in results} == {10}
    assert log.refresh().epoch == max(epochs)


def test_append_slow(log: Log) -> None:
    positions = [log.append_slow(b"e%d" % i) for i in range(30)]
    assert positions == list(range(30))
    log.fill(40)
    assert log.append_slow(b"after the fill") == 41


# ------------------------------------------------- concurrency across processes


def _writer(conf: str, pool: str, name: str, wid: int, positions: list[int], q) -> None:  # type: ignore[no-untyped-def]
    cluster = pyzlog.connect(conf)
    log = Log.open(cluster, pool, name)
    won = []
    for p in positions:
        try:
            log.write(p, b"writer-%d-pos-%d" % (wid, p))
            won.append(p)
        except pyzlog.ReadOnly:
            pass
    reads = {p: log.read(p) for p in positions}
    q.put((wid, won, reads))
    cluster.shutdown()


def test_processes_race_for_positions(log: Log, ceph) -> None:  # type: ignore[no-untyped-def]
    positions = list(range(150))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(ceph.conf, ceph.pool, log.name, w, positions, q))
             for w in range(4)]
    for p in procs:
        p.start()
    out = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    winners: dict[int, int] = {}
    for wid, won, _ in out:
        for p in won:
            assert p not in winners, f"position {p} won twice"
            winners[p] = wid
    assert sorted(winners) == positions  # exactly one winner for each
    for _, _, reads in out:  # every reader saw the winner's bytes
        assert reads == {p: b"writer-%d-pos-%d" % (winners[p], p) for p in positions}


# ------------------------------------------------------ cluster-level errors


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cluster_down_times_out(ceph, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    conf = tmp_path / "ceph.conf"
    keyring = Path(ceph.conf).parent / "keyring"
    shutil.copy(keyring, tmp_path / "keyring")
    conf.write_text(f"[global]\nmon host = [v2:127.0.0.1:{_free_port()}]\n"
                    f"keyring = {tmp_path}/keyring\nauth client required = cephx\n")
    t0 = time.monotonic()
    with pytest.raises(pyzlog.ClusterUnavailable, match="cannot reach"):
        pyzlog.connect(conf, connect_timeout=3)
    assert time.monotonic() - t0 < 30  # a timeout, not a hang


def test_missing_conf() -> None:
    with pytest.raises(pyzlog.ClusterUnavailable, match="ceph.conf not found"):
        pyzlog.connect("/nonexistent/ceph.conf")


def test_client_without_key_is_refused(ceph, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "keyring"
    bad.write_text("[client.admin]\n\tkey = AQBm2mNkAAAAABAAmm0o6wxI3Qx0A2UhC0W0Ag==\n")
    with pytest.raises((pyzlog.PermissionDenied, pyzlog.ClusterUnavailable)):
        pyzlog.connect(ceph.conf, keyring=str(bad), connect_timeout=5)
