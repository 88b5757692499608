"""Revoked and rotated cephx keys (issue 24), on the dev cluster.

- A client whose key is deleted, or whose caps no longer cover the pool, is
  refused with PermissionDenied when it connects or opens a log, within its
  timeout: never a hang, never a ClusterUnavailable. (A connection made
  before the revocation keeps the tickets it holds until they expire: that is
  Ceph's, see docs/deploy.md "Revoking and rotating keys".)
- A zlog-seqr daemon whose key is rotated (the old key deleted, a new one
  written to its keyring file) picks the new key up on SIGHUP: it checks the
  new keyring, stops cleanly and executes itself again (same pid), and serves
  its log again with nothing lost. A keyring that does not work is refused
  and the daemon goes on with the key it has.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from seqr_proc import SeqrProcess

import pyzlog
from pyzlog import Log, PermissionDenied


def ceph_cmd(conf: str, *args: str) -> str:
    return subprocess.run(["ceph", "-c", conf, *args], check=True, capture_output=True, text=True,
                          timeout=60).stdout


@pytest.fixture
def user(ceph, tmp_path: Path) -> Iterator[Callable[..., tuple[str, Path]]]:  # type: ignore[no-untyped-def]
    """user(osd_caps) -> (client name, keyring path) of a new cephx client."""
    made: list[str] = []

    def make(osd_caps: str | None = None) -> tuple[str, Path]:
        name = f"client.k{uuid.uuid4().hex[:8]}"
        keyring = tmp_path / f"{name}.keyring"
        ceph_cmd(ceph.conf, "auth", "get-or-create", name, "mon", "allow r", "osd",
                 osd_caps or f"allow rwx pool={ceph.pool}", "-o", str(keyring))
        made.append(name)
        return name, keyring

    yield make
    for name in made:
        subprocess.run(["ceph", "-c", ceph.conf, "auth", "del", name], capture_output=True, timeout=60)


def rotate(conf: str, name: str, keyring: Path, caps: list[str]) -> None:
    """A new key for `name` (the old one no longer works), written to `keyring`."""
    ceph_cmd(conf, "auth", "del", name)
    ceph_cmd(conf, "auth", "get-or-create", name, *caps, "-o", str(keyring))


def test_a_deleted_key_is_refused_within_the_timeout(user, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    name, keyring = user()
    c = pyzlog.connect(ceph.conf, client=name, keyring=str(keyring), connect_timeout=5)
    Log.create(c, ceph.pool, log_name).close()
    c.shutdown()
    ceph_cmd(ceph.conf, "auth", "del", name)
    with pytest.raises(PermissionDenied, match="cephx refused"):
        pyzlog.connect(ceph.conf, client=name, keyring=str(keyring), connect_timeout=5)
    # the command line says the same, as one line, exit status 1
    r = subprocess.run([str(Path(sys.executable).parent / "zlog"), "--conf", ceph.conf, "--pool", ceph.pool,
                        "--client", name, "--keyring", str(keyring), "--timeout", "5", "info", log_name],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "cephx refused" in r.stderr, r.stderr


def test_caps_taken_away_are_refused_within_the_timeout(user, rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    with Log.create(rados_cluster, ceph.pool, log_name) as lg:
        lg.append(b"kept")
    name, keyring = user()
    ceph_cmd(ceph.conf, "auth", "caps", name, "mon", "allow r", "osd", "allow rwx pool=some-other-pool")
    c = pyzlog.connect(ceph.conf, client=name, keyring=str(keyring), connect_timeout=5, op_timeout=5)
    try:
        with pytest.raises(PermissionDenied, match="lack 'r'"):
            Log.open(c, ceph.pool, log_name)
    finally:
        c.shutdown()


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def _wait(cond: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def seqr_as(ceph, tmp_path: Path) -> Iterator[Callable[[str, Path], SeqrProcess]]:  # type: ignore[no-untyped-def]
    started: list[SeqrProcess] = []

    def start(name: str, keyring: Path) -> SeqrProcess:
        p = SeqrProcess(ceph.conf, log_path=tmp_path / f"seqr-{len(started)}.log",
                        args=("--pool", ceph.pool, "--no-standby", "--client", name, "--keyring", str(keyring),
                              "--log-level", "info"),
                        pool=ceph.pool).start()
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


def test_a_daemon_takes_a_rotated_key_on_sighup(user, seqr_as, rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    caps = ["mon", "allow r", "osd", f"allow rwx pool={ceph.pool}"]
    name, keyring = user()
    d = seqr_as(name, keyring)
    assert d.proc is not None and d.log_path is not None
    pid = d.proc.pid
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=d.address)
    acked = {lg.append(b"before-%d" % i): b"before-%d" % i for i in range(20)}
    assert lg.positions.sequencer_usable()
    old = keyring.read_text()

    rotate(ceph.conf, name, keyring, caps)
    assert keyring.read_text() != old
    stale = keyring.parent / "old.keyring"
    stale.write_text(old)
    with pytest.raises(PermissionDenied):  # the rotation is real: the old key is refused
        pyzlog.connect(ceph.conf, client=name, keyring=str(stale), connect_timeout=5)

    os.kill(pid, signal.SIGHUP)
    _wait(lambda: "restarting to connect with the new key" in d.log_path.read_text(errors="replace"), 60,
          "the daemon to see its new keyring")
    _wait(lambda: d.log_path.read_text(errors="replace").count("serving on") >= 2 and _listening(d.port), 60,
          "the daemon to serve again")
    assert d.proc.poll() is None and d.proc.pid == pid  # the same process: a supervisor sees no exit

    # appends go on (through the restarted daemon, which recovers the log with its new key)
    for i in range(20):
        acked[lg.append(b"after-%d" % i)] = b"after-%d" % i
    _wait(lambda: lg.refresh().sequencer == d.address and lg.append(b"via") is not None
          and lg.positions.sequencer_usable(), 60, "appends through the restarted daemon")
    assert "recovery failed" not in d.log_path.read_text(errors="replace")
    reader = Log.open(rados_cluster, ceph.pool, log_name)
    assert all(reader.read(p) == v for p, v in acked.items()), "an acknowledged entry is not there"
    assert len(acked) == 40

    # a second log, new to the daemon: recovery (seal, tail finding) works with the new key
    with Log.create(rados_cluster, ceph.pool, log_name + "-2", sequencer=d.address) as lg2:
        assert lg2.append(b"x") == 0 and lg2.positions.sequencer_usable()
    lg.close()


def test_a_bad_new_keyring_keeps_the_daemon_serving(user, seqr_as, rados_cluster, ceph, log_name) -> None:  # type: ignore[no-untyped-def]
    name, keyring = user()
    d = seqr_as(name, keyring)
    assert d.proc is not None and d.log_path is not None
    lg = Log.create(rados_cluster, ceph.pool, log_name, sequencer=d.address)
    assert lg.append(b"a") == 0
    keyring.write_text(f"[{name}]\n\tkey = AQBJ2xJmAAAAABAAxxxxxxxxxxxxxxxxxxxxxxxxxxx==\n")
    os.kill(d.proc.pid, signal.SIGHUP)
    _wait(lambda: "does not work" in d.log_path.read_text(errors="replace"), 60, "the bad keyring to be refused")
    assert d.proc.poll() is None and d.log_path.read_text(errors="replace").count("serving on") == 1
    assert lg.append(b"b") == 1 and lg.positions.sequencer_usable()
    lg.close()
