"""Revoked and rotated cephx keys (issue 24), on the dev cluster.

- A client whose key is deleted, or whose caps no longer cover the pool, is
  refused with PermissionDenied when it connects or opens a log, within its
  timeout: never a hang, never a ClusterUnavailable.
- A connection made before the revocation keeps the tickets it holds (that is
  Ceph's, see docs/deploy.md "Revoking and rotating keys"): `zlog revoke`
  deletes the key and blocklists every open connection of the entity, and
  every call of a Log already open on one (sync, async through the C++
  pipeline, batches, reads, streams, a following stream) raises Blocklisted
  (a PermissionDenied) within its timeout; nothing acknowledged before is lost.
  A zlog-seqr daemon revoked so stops serving and exits, saying why.
- A zlog-seqr daemon whose key is rotated (the old key deleted, a new one
  written to its keyring file) picks the new key up on SIGHUP: it checks the
  new keyring, stops cleanly and executes itself again (same pid), and serves
  its log again with nothing lost. A keyring that does not work is refused
  and the daemon goes on with the key it has.
"""
from __future__ import annotations

import errno
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from seqr_proc import SeqrProcess

import pyzlog
from pyzlog import Blocklisted, Log, PermissionDenied


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


def zlog(conf: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).parent / "zlog"), "--conf", conf, *args],
                          capture_output=True, text=True, timeout=300)


def refused_in_time(call: Callable[[], object], deadline: float = 60.0, what: str = "") -> BaseException:
    """What `call` raised, run on a thread given `deadline` seconds: it must
    raise, not return, and not hang."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(("returned", call()))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(deadline)
    assert out, f"still running after {deadline:.0f}s: a hang"
    assert isinstance(out[0], BaseException), f"{out[0]!r}: a revoked client was served ({what})"
    return out[0]


def test_revoke_cuts_off_a_client_already_connected(user, rados_cluster, ceph, log_name, tmp_path) -> None:  # type: ignore[no-untyped-def]
    name, keyring = user()
    seqr = SeqrProcess(ceph.conf, log_path=tmp_path / "seqr.log", pool=ceph.pool).start()  # an admin daemon
    try:
        Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address).close()
        c = pyzlog.connect(ceph.conf, client=name, keyring=str(keyring), connect_timeout=5, op_timeout=5)
        lg = Log.open(c, ceph.pool, log_name, sequencer=seqr.address)
        acked = {lg.append(b"sync-%d" % i): b"sync-%d" % i for i in range(10)}
        futures = [(lg.append_async(b"async-%d" % i), b"async-%d" % i) for i in range(50)]
        acked.update((f.result(60), v) for f, v in futures)
        acked.update(zip(lg.append_many([b"many-%d" % i for i in range(8)]), [b"many-%d" % i for i in range(8)]))
        assert lg.positions.sequencer_usable()  # the positions came from the sequencer: the pipeline wrote
        # a following stream, open across the revocation
        seen: list[object] = []
        follower = threading.Thread(target=lambda: seen.append(refused_in_time(
            lambda: [seen.append(r.position) for r in lg.stream(0, follow=True, hole_wait=1)], 120)), daemon=True)
        follower.start()
        t0 = time.monotonic()
        while len(seen) < len(acked) and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        assert sorted(p for p in seen if isinstance(p, int)) == sorted(acked)

        r = zlog(ceph.conf, "--pool", ceph.pool, "revoke", name)
        assert r.returncode == 0, r.stderr
        assert f"{name}: key deleted;" in r.stdout
        blocked = re.findall(r"^  (\S+/\d+)$", r.stdout, re.M)
        # every librados instance of this process that has a session (python-rados, the data plane, ...)
        assert len(blocked) >= 2, r.stdout

        calls: dict[str, Callable[[], object]] = {
            "append": lambda: lg.append(b"after"),
            "append_async": lambda: lg.append_async(b"after-async").result(60),
            "append_many": lambda: lg.append_many([b"a", b"b"]),
            "read": lambda: lg.read(0),
            "stream": lambda: list(lg.stream(0, max(acked))),
            "tail": lambda: lg.tail(),
            "open": lambda: Log.open(c, ceph.pool, log_name),
        }
        for what, call in calls.items():
            e = refused_in_time(call, what=what)
            assert isinstance(e, Blocklisted) and isinstance(e, PermissionDenied), f"{what}: {e!r}"
            assert e.errno == errno.ESHUTDOWN == pyzlog.core.errors.EBLOCKLISTED, f"{what}: {e!r}"
        follower.join(150)
        assert isinstance(seen[-1], Blocklisted), f"the following stream ended with {seen[-1]!r}"
        with pytest.raises(PermissionDenied):  # and it cannot come back with its old key
            pyzlog.connect(ceph.conf, client=name, keyring=str(keyring), connect_timeout=5)
        # the blocklisted instances keep their monitor sessions: revoking again renews their entries
        again = zlog(ceph.conf, "--pool", ceph.pool, "revoke", name)
        assert again.returncode == 0 and f"{name}: had no key;" in again.stdout, again.stderr
        assert sorted(re.findall(r"^  (\S+/\d+)$", again.stdout, re.M)) == sorted(blocked)
        # closing what a revoked client holds does not hang either
        refused_in_time(lambda: (lg.close(), c.shutdown(), 1 / 0), what="close")
    finally:
        seqr.stop()

    reader = Log.open(rados_cluster, ceph.pool, log_name)
    assert {p: reader.read(p) for p in acked} == acked, "an acknowledged entry is lost"
    reader.close()


def test_revoke_refuses_what_it_must_not_do(ceph) -> None:  # type: ignore[no-untyped-def]
    for entity, says in (("osd.0", "takes a client entity"), ("client.admin", "runs as"),
                         (f"client.nobody{uuid.uuid4().hex[:6]}", "nothing to revoke")):
        r = zlog(ceph.conf, "revoke", entity)
        assert r.returncode == 1 and says in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_a_revoked_daemon_stops_serving(user, rados_cluster, ceph, log_name, tmp_path) -> None:  # type: ignore[no-untyped-def]
    name, keyring = user()
    log_path = tmp_path / "seqr.log"
    d = SeqrProcess(ceph.conf, log_path=log_path, pool=ceph.pool,
                    args=("--pool", ceph.pool, "--no-standby", "--client", name, "--keyring", str(keyring),
                          "--secret-refresh", "1")).start()
    try:
        assert d.proc is not None
        lg = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=d.address)
        acked = {lg.append(b"before-%d" % i): b"before-%d" % i for i in range(10)}
        assert lg.positions.sequencer_usable()
        r = zlog(ceph.conf, "--pool", ceph.pool, "revoke", name)
        assert r.returncode == 0 and "blocklisted" in r.stdout, r.stderr
        try:  # it finds out within --secret-refresh with no client asking, and exits
            d.proc.wait(60)
        except subprocess.TimeoutExpired:
            raise AssertionError("a revoked daemon is still serving:\n" + log_path.read_text()[-2000:]) from None
        text = log_path.read_text(errors="replace")
        assert d.proc.returncode == 1 and "cut off from the cluster" in text and "blocklisted" in text, text[-2000:]
        assert not _listening(d.port)
        # its clients go on without it (slow tail finding), and nothing acknowledged is lost
        for i in range(10):
            acked[lg.append(b"after-%d" % i)] = b"after-%d" % i
        lg.close()
    finally:
        d.stop()
    reader = Log.open(rados_cluster, ceph.pool, log_name)
    assert {p: reader.read(p) for p in acked} == acked
    reader.close()
