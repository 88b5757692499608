"""Who may take positions (issue 27), on the real cluster with real zlog-seqr
daemons: the issue's attack from a socket with no key, a wrong key, another
pool's key and a replayed handshake gets no position and no epoch, writes
nothing, and leaves the daemon serving others; a connection is bound to its
pool; the secret rotates under load with no append failing; per-connection
limits refuse with RATE_LIMITED and clients back off; TLS on and off."""
from __future__ import annotations

import os
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from seqr_proc import SeqrProcess, free_port
from seqr_wire import check_no_entry, encode_request, make_cert, python_handshake, read_all

import pyzlog
from pyzlog import Credentials, Log, TLSSettings, _seqr  # type: ignore[attr-defined]
from pyzlog.client import metrics as client_metrics
from pyzlog.client.reader import RecordKind
from pyzlog.core import sequencer as sq
from pyzlog.core.registry import answers
from pyzlog.core.seqr_auth import SECRET_NAMESPACE, read_secret, rotate_secret

HOST = "127.0.0.1"


def wait_until(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def refused(m: dict[Any, float], reason: str) -> float:
    return m[("zlog_seqr_auth_refused_total", (("reason", reason),))]


@pytest.fixture(scope="module")
def other_pool(rados_cluster) -> str:  # type: ignore[no-untyped-def]
    """A second pool of the cluster, with its own sequencer secret."""
    name = "zlog-auth-other"
    if not rados_cluster.pool_exists(name):
        rados_cluster.create_pool(name)
    read_secret(rados_cluster, name)
    return name


@pytest.fixture
def daemon(ceph, tmp_path: Path) -> Iterator[Callable[..., SeqrProcess]]:  # type: ignore[no-untyped-def]
    """zlog-seqr processes (authentication on, as by default), with metrics."""
    started: list[SeqrProcess] = []

    def start(*args: str, pool: str | None = None) -> SeqrProcess:
        port = free_port()
        p = SeqrProcess(ceph.conf, log_path=tmp_path / f"seqr{len(started)}.log", pool=pool or ceph.pool,
                        args=("--metrics", str(port), *args))
        p.metrics_port = port  # type: ignore[attr-defined]
        started.append(p.start())
        wait_until(lambda: _scrapes(port), 10, "the metrics port")
        return p

    yield start
    for p in started:
        p.kill()


def _scrapes(port: int) -> bool:
    try:
        scrape(port)
        return True
    except OSError:
        return False


def _attack(port: int, pool: bytes, log: bytes, epoch: int, prefix: bytes = b"") -> bytes:
    """The issue's attack: ten NEXT requests of 65,536 positions on one socket."""
    with socket.create_connection((HOST, port), timeout=5) as s:
        s.sendall(prefix + b"".join(encode_request(1, i, epoch, 65536, pool, log) for i in range(10)))
        return read_all(s)


# --------------------------------------------------------------------------- the attack


def test_the_issues_attack_gets_no_position_no_epoch_and_writes_nothing(
        rados_cluster, ceph, log_name, daemon, other_pool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    seqr = daemon("--pool", ceph.pool, "--pool", other_pool, "--no-standby")  # serves both pools
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address)
    assert [lg.append(b"e%d" % i) for i in range(3)] == [0, 1, 2]
    epoch = lg.epoch
    before = scrape(seqr.metrics_port)
    pool, name = ceph.pool.encode(), log_name.encode()

    # 1. no key at all: the request as the issue sent it, at the log's epoch and at 0
    for e in (epoch, 0):
        got = _attack(seqr.port, pool, name, e)
        assert got == struct.pack("<IBQQQI", 29, _seqr.AUTH_REQUIRED, 0, 0, 0, 0)  # one refusal, then closed
    # 2. a wrong key: refused at the proof; the requests pipelined behind it are never read
    sock, fields, _ = python_handshake(HOST, seqr.port, pool, os.urandom(32))
    assert (fields["op"], fields["status"]) == (_seqr.OP_WELCOME, _seqr.AUTH_FAILED)
    sock.close()
    # (at a generation the daemon accepts: other tests may have rotated the pool's secret)
    generations = [g for g, _ in read_secret(rados_cluster, ceph.pool).pairs()]
    with pytest.raises(_seqr.AuthError, match="wrong key"):
        _seqr.Client(HOST, seqr.port, 5.0, {"pool": ceph.pool, "keys": [(max(generations), os.urandom(32))]})
    # 3. the key of another pool (this client may read that one): no good for this pool
    others = read_secret(rados_cluster, other_pool).pairs()
    with pytest.raises(_seqr.AuthError, match="wrong key|does not accept"):
        _seqr.Client(HOST, seqr.port, 5.0, {"pool": ceph.pool, "keys": others})
    # ... and a connection authenticated for the other pool may not name this one
    c = _seqr.Client(HOST, seqr.port, 5.0, {"pool": other_pool, "keys": others})
    for _ in range(10):
        assert c.next(ceph.pool, log_name, epoch, 65536) == (_seqr.NOT_AUTHORISED, 0, 0, 0)
    assert c.tail(ceph.pool, log_name, epoch) == (_seqr.NOT_AUTHORISED, 0, 0, 0)
    c.close()
    # 4. a legitimate handshake recorded off the wire and played again, requests behind it
    key = dict(read_secret(rados_cluster, ceph.pool).pairs())
    sock, fields, sent = python_handshake(HOST, seqr.port, pool, key[max(key)])
    assert fields["status"] == _seqr.OK and fields["server_proved"]
    sock.close()
    replayed = _attack(seqr.port, pool, name, epoch, prefix=sent)
    check_no_entry(replayed)
    assert replayed[4] == _seqr.OP_CHALLENGE and replayed[36:38] == bytes([_seqr.OP_WELCOME, _seqr.AUTH_FAILED])
    # 5. a pool the daemon does not serve: refused before any recovery work
    with pytest.raises(_seqr.AuthError, match="does not serve"):
        _seqr.Client(HOST, seqr.port, 5.0, {"pool": "zlog-not-served", "keys": others})

    after = scrape(seqr.metrics_port)
    assert refused(after, "no_handshake") - refused(before, "no_handshake") == 2
    wrong = [refused(m, "wrong_key") + refused(m, "unknown_generation") for m in (before, after)]
    assert wrong[1] - wrong[0] == 4  # two wrong keys, another pool's key, the replay
    assert refused(after, "not_served") - refused(before, "not_served") == 1
    assert after[("zlog_seqr_not_authorised_answers_total", ())] == 11
    for series in ("zlog_seqr_positions_total", "zlog_seqr_recoveries_queued_total"):
        assert after[(series, ())] == before[(series, ())], series
    text = (tmp_path / "seqr0.log").read_text()
    assert "refused the connection from 127.0.0.1" in text and "(wrong_key)" in text and "Traceback" not in text

    # nothing was taken or written: the next append gets position 3, and a
    # reader finds 0..3 all data (no hole to wait out, no LOST record)
    assert lg.append(b"after") == 3
    records = list(Log.open(rados_cluster, ceph.pool, log_name).stream(0, 4))
    assert [(r.position, r.kind) for r in records] == [(p, RecordKind.DATA) for p in range(4)]
    assert lg.tail() == 4
    # the daemon serves others meanwhile, other pool included
    assert Log.create(rados_cluster, other_pool, log_name, sequencer=seqr.address).append(b"x") == 0


def test_a_client_that_may_not_read_the_secret_is_refused_clearly(ceph, log_name, daemon,
                                                                   tmp_path) -> None:  # type: ignore[no-untyped-def]
    """cephx decides who gets in: a user without access to the namespace of
    the secret gets a clear refusal, and its appends go on by slow tail
    finding (correct, slower), never a traceback."""
    seqr = daemon()
    name = f"auth27-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    keyring = tmp_path / f"{name}.keyring"
    subprocess.run(["ceph", "-c", ceph.conf, "auth", "get-or-create", f"client.{name}", "mon", "allow r", "osd",
                    f'allow rwx pool={ceph.pool} namespace="", allow rwx pool={ceph.pool} namespace=zlog.meta',
                    "-o", str(keyring)], check=True, capture_output=True, timeout=60)
    r = pyzlog.connect(ceph.conf, keyring=str(keyring), client=f"client.{name}")
    try:
        c = sq.SequencerClient(seqr.address, cluster=r)
        with pytest.raises(pyzlog.SequencerRefused, match=f"cephx refused reading the sequencer secret.*"
                                                          f"{SECRET_NAMESPACE}"):
            c.next(ceph.pool, log_name, 1)
        lg = Log.create(r, ceph.pool, log_name, sequencer=seqr.address)
        assert [lg.append(b"x"), lg.append(b"y")] == [0, 1]
        lg.close()
    finally:
        r.shutdown()


# --------------------------------------------------------------------------- rotation


def test_rotation_under_load_fails_no_append(rados_cluster, ceph, log_name, daemon, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Three rotations while sync and async appenders run: a plain one (the
    old key stays accepted), a second (the first generation is revoked and
    its connections closed), and a revocation at once with SIGHUP. No append
    fails, none is lost or acknowledged twice, and appends keep going
    through the sequencer."""
    from test_failover import Appenders
    seqr = daemon("--secret-refresh", "0.3")
    Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address).close()
    w = Appenders(rados_cluster, ceph.pool, log_name, n=4, seqr=seqr.address).start()
    port = seqr.metrics_port

    def generation() -> float:
        return scrape(port)[("zlog_seqr_secret_generation", (("pool", ceph.pool),))]

    try:
        for drop in (False, False, True):
            wait_until(lambda: len(w.acked) > 100, 30, "appends")
            new = rotate_secret(rados_cluster, ceph.pool, drop_previous=drop).current.generation
            if drop:
                os.kill(seqr.proc.pid, signal.SIGHUP)  # type: ignore[union-attr]
            wait_until(lambda: generation() == new, 10, f"the daemon to take generation {new}")
            n = len(w.acked)
            wait_until(lambda: len(w.acked) > n + 200, 30, f"appends after rotating to generation {new}")
        t0 = time.monotonic()
        wait_until(lambda: w.first_via(seqr.address, t0), 15, "an append through the sequencer after the last")
    finally:
        w.stop_and_check(rados_cluster, ceph.pool, log_name)
    m = scrape(port)
    assert m[("zlog_seqr_connections_revoked_total", ())] >= 1
    assert "sequencer secret rotated to generation" in (tmp_path / "seqr0.log").read_text()


def test_seqr_secret_commands(rados_cluster, ceph) -> None:  # type: ignore[no-untyped-def]
    exe = Path(sys.executable).parent / "zlog"

    def zlog(*args: str) -> str:
        p = subprocess.run([str(exe), "--conf", ceph.conf, "--pool", ceph.pool, "seqr-secret", *args],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
        return p.stdout

    before = read_secret(rados_cluster, ceph.pool)
    out = zlog("rotate")
    g = before.current.generation + 1
    assert f"generation {g}: current" in out and f"generation {g - 1}: previous (still accepted)" in out
    out = zlog("rotate", "--drop-previous")
    assert f"generation {g + 1}: current" in out and "previous" not in out
    assert f"sequencer secret generation {g + 1}" in zlog("show")
    assert before.current.secret.hex() not in out  # the key itself is never printed


# --------------------------------------------------------------------------- limits


def test_limits_refuse_with_a_status_and_clients_back_off(rados_cluster, ceph, log_name, daemon) -> None:  # type: ignore[no-untyped-def]
    seqr = daemon("--max-rate", "2000", "--max-outstanding", "200")
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2, sequencer=seqr.address)
    assert lg.append(b"first") == 0
    c = sq.SequencerClient(seqr.address, cluster=rados_cluster)
    assert c.next(ceph.pool, log_name, lg.epoch, 201)[0] == sq.BAD_REQUEST  # over what a connection may hold
    assert c.next(ceph.pool, log_name, lg.epoch, 200)[0] == sq.OK
    status, epoch, pos, wait_ms = c.next(ceph.pool, log_name, lg.epoch, 200)
    assert (status, epoch, pos) == (sq.RATE_LIMITED, 0, 0) and wait_ms >= 1  # refused, nothing revealed
    c.close()
    rate_limited = client_metrics.RATE_LIMITED.value
    # clients over their budget wait and carry on: batches, single and async appends
    errors: list[Exception] = []

    def batches() -> None:
        try:
            for i in range(15):
                lg.append_many([b"b%d-%d" % (i, k) for k in range(100)])
        except pyzlog.ZlogError as e:
            errors.append(e)

    t = threading.Thread(target=batches)
    t.start()
    futs = [lg.append_async(b"a%d" % i) for i in range(1000)]
    singles = [lg.append(b"s%d" % i) for i in range(200)]
    positions = [f.result(timeout=60) for f in futs] + singles
    t.join(120)
    assert not errors and not t.is_alive()
    assert len(set(positions)) == len(positions)
    m = scrape(seqr.metrics_port)
    assert m[("zlog_seqr_rate_limited_answers_total", ())] >= 1
    assert client_metrics.RATE_LIMITED.value > rate_limited  # the client saw RATE_LIMITED and waited
    reader = Log.open(rados_cluster, ceph.pool, log_name)
    assert reader.read(positions[-1]) == b"s199"


# --------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("certs")
    cert, key = make_cert(d, "seqr")
    other_cert, other_key = make_cert(d, "impostor")
    return {"cert": cert, "key": key, "other_cert": other_cert, "other_key": other_key}


def test_tls_on(rados_cluster, ceph, log_name, daemon, certs, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    seqr = daemon("--tls-cert", certs["cert"], "--tls-key", certs["key"])
    tls = Credentials(rados_cluster, TLSSettings(True, certs["cert"]))  # verified against its certificate
    lg = Log.create(rados_cluster, ceph.pool, log_name, width=2,
                    sequencer=sq.SequencerClient(seqr.address, credentials=tls))
    assert [lg.append(b"x"), lg.append_async(b"y").result(timeout=30)] == [0, 1]
    assert lg.positions.sequencer_usable()
    # the C++ append pipeline authenticates over TLS itself: nothing handed back to Python
    before = lg._async.stats()
    assert [f.result(timeout=30) for f in [lg.append_async(b"n%d" % i) for i in range(200)]] == list(range(2, 202))
    after = lg._async.stats()
    assert after["entries_sent"] - before["entries_sent"] == 200
    assert after["handed_back"] == before["handed_back"]
    assert sq.authenticate(seqr.address, ceph.pool, tls).endswith(", TLS")
    # from the environment, unverified: the channel binding still protects the proof
    monkeypatch.setenv("PYZLOG_SEQR_TLS", "1")
    assert Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address).append(b"z") == 202
    monkeypatch.delenv("PYZLOG_SEQR_TLS")
    # plaintext: refused with what to do
    with pytest.raises(pyzlog.SequencerRefused, match="requires TLS.*PYZLOG_SEQR_TLS"):
        sq.SequencerClient(seqr.address, cluster=rados_cluster).next(ceph.pool, log_name, 1)
    # a certificate the client's CA did not sign
    wrong = Credentials(rados_cluster, TLSSettings(True, certs["other_cert"]))
    with pytest.raises(pyzlog.SequencerUnavailable, match="certificate verif"):
        sq.SequencerClient(seqr.address, credentials=wrong).next(ceph.pool, log_name, 1)
    # daemons probing each other: plaintext or TLS, the probe is answered and is no refusal
    assert answers(seqr.address, 2.0) and answers(seqr.address, 2.0, tls)
    m = scrape(seqr.metrics_port)
    assert m[("zlog_seqr_connections_tls_total", ())] >= 3
    assert refused(m, "tls_required") == 1 and m[("zlog_seqr_probes_total", ())] == 2


def test_tls_off(rados_cluster, ceph, log_name, daemon) -> None:  # type: ignore[no-untyped-def]
    seqr = daemon()
    lg = Log.create(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
    assert lg.append(b"x") == 0
    tls = Credentials(rados_cluster, TLSSettings(True))
    with pytest.raises(pyzlog.SequencerUnavailable, match="TLS handshake failed"):
        sq.SequencerClient(seqr.address, credentials=tls).next(ceph.pool, log_name, lg.epoch)
    assert lg.append(b"y") == 1
    # a SequencerClient made without a cluster reads the secret with its log's
    bare = Log.open(rados_cluster, ceph.pool, log_name, sequencer=sq.SequencerClient(seqr.address))
    assert bare.append(b"z") == 2 and bare.positions.sequencer_usable()
    assert scrape(seqr.metrics_port)[("zlog_seqr_connections_tls_total", ())] == 0


def _relay(listener: socket.socket, upstream: tuple[str, int], certs: dict[str, str], stop: threading.Event) -> None:
    """A man in the middle: terminates the client's TLS with its own
    certificate and opens its own TLS to the daemon, copying bytes."""
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(certs["other_cert"], certs["other_key"])
    client_side = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_side.check_hostname = False
    client_side.verify_mode = ssl.CERT_NONE
    listener.settimeout(0.2)
    while not stop.is_set():
        try:
            raw, _ = listener.accept()
        except TimeoutError:
            continue
        try:  # a failed handshake drops this connection only; the relay goes on accepting
            down = server_side.wrap_socket(raw, server_side=True)
            up = client_side.wrap_socket(socket.create_connection(upstream, timeout=30), server_hostname="seqr")
            up.settimeout(None)
        except OSError:
            raw.close()
            continue

        def pump(a: ssl.SSLSocket, b: ssl.SSLSocket) -> None:
            try:
                while chunk := a.recv(65536):
                    b.sendall(chunk)
            except OSError:
                pass
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

        threading.Thread(target=pump, args=(down, up), daemon=True).start()
        threading.Thread(target=pump, args=(up, down), daemon=True).start()


def test_tls_channel_binding_defeats_a_man_in_the_middle(rados_cluster, ceph, daemon, certs) -> None:  # type: ignore[no-untyped-def]
    """A client that does not verify certificates, talking through a relay
    that terminates TLS: the relay sees the handshake in the clear, but the
    proof covers the client's TLS session, not the relay's, so the daemon
    refuses it (and the client would refuse the daemon's)."""
    seqr = daemon("--tls-cert", certs["cert"], "--tls-key", certs["key"])
    listener = socket.create_server((HOST, 0))
    stop = threading.Event()
    t = threading.Thread(target=_relay, args=(listener, (HOST, seqr.port), certs, stop), daemon=True)
    t.start()
    try:
        unverified = Credentials(rados_cluster, TLSSettings(True)).native(ceph.pool)
        assert _seqr.Client(HOST, seqr.port, 30.0, unverified).authenticated  # direct: fine
        with pytest.raises(_seqr.AuthError, match="wrong key"):
            # a generous deadline: the relay's two TLS handshakes run in Python threads on a loaded machine
            _seqr.Client(HOST, listener.getsockname()[1], 30.0, unverified)
    finally:
        stop.set()
        t.join(5)
        listener.close()
    assert refused(scrape(seqr.metrics_port), "wrong_key") == 1


# --------------------------------------------------------------------------- opting out


def test_insecure_is_an_explicit_choice_on_both_sides(rados_cluster, ceph, log_name, daemon, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    seqr = daemon("--insecure", "--pool", ceph.pool, "--no-standby")
    Log.create(rados_cluster, ceph.pool, log_name).close()
    # a client holding the key does not trust a daemon that cannot prove it holds it too
    with pytest.raises(pyzlog.SequencerRefused, match="asks for no proof"):
        sq.SequencerClient(seqr.address, cluster=rados_cluster).tail(ceph.pool, log_name, 1)
    monkeypatch.setenv("PYZLOG_SEQR_INSECURE", "1")
    lg = Log.open(rados_cluster, ceph.pool, log_name, sequencer=seqr.address)
    assert lg.append(b"x") == 0 and lg.positions.sequencer_usable()
    # even so, the daemon serves only its --pool pools, and a connection only its own pool
    with pytest.raises(pyzlog.SequencerRefused, match="does not serve"):
        sq.SequencerClient(seqr.address).next("zlog-not-served", "x", 1)
    c = _seqr.Client(HOST, seqr.port, 5.0, {"pool": ceph.pool, "insecure": True})
    assert c.next("zlog-not-served", "x", 1)[0] == _seqr.NOT_AUTHORISED
