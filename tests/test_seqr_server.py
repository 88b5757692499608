"""Tests of the C++ sequencer (pyzlog._seqr). No Ceph cluster needed: logs are
installed directly with Server.install(), the way the recovery daemon does,
and pools are served with a key given directly (set_pool), the way the
daemon does with the pool's secret. Every connection authenticates, as in
production; the wire fuzzers run both before and after the handshake."""

from __future__ import annotations

import multiprocessing
import random
import socket
import struct
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyzlog import _seqr
from pyzlog._seqr import BAD_REQUEST, OK, RECOVERY_FAILED, RETRY, STALE_EPOCH, Client, Server
from seqr_wire import REQ_FIXED, RESP, check_no_entry, encode_request, python_handshake, read_all, read_frame

HOST = "127.0.0.1"
#: the key every test pool is served with (generation 1)
KEY = b"k" * 32
#: the pools the tests use; a connection is bound to one
POOLS = ["pool", "p", "nopool", "a", "x", "ab", "a\0b", "alive-pool", "p" * 255,
         *[f"pool{i}" for i in range(5)]]


def auth(pool: str = "pool", key: bytes = KEY, generation: int = 1) -> dict:
    return {"pool": pool, "keys": [(generation, key)]}


def serve(srv: Server, *pools: str) -> Server:
    for p in pools or POOLS:
        srv.set_pool(p, [(1, KEY)])
    return srv


def connect(port: int, pool: str = "pool", timeout: float = 5.0) -> Client:
    """A client authenticated for `pool`."""
    return Client(HOST, port, timeout, auth(pool))


class PerPool:
    """One authenticated connection per pool, used like one client."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conns: dict[str, Client] = {}

    def next(self, pool: str, log: str, epoch: int, count: int = 1):  # type: ignore[no-untyped-def]
        if pool not in self.conns:
            self.conns[pool] = connect(self.port, pool)
        return self.conns[pool].next(pool, log, epoch, count)


def read_responses(c: Client, n: int, timeout: float = 2.0) -> list[tuple[int, int, int, int, int]]:
    """Read n raw response frames from c (status, rid, epoch, position, count)."""
    buf = b""
    deadline = time.monotonic() + timeout
    while len(buf) < n * RESP.size:
        chunk = c.recv_raw(65536, max(0.01, deadline - time.monotonic()))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    out = []
    for i in range(n):
        length, status, rid, epoch, pos, count = RESP.unpack_from(buf, i * RESP.size)
        assert length == 29
        out.append((status, rid, epoch, pos, count))
    return out


@pytest.fixture
def server():
    srv = serve(Server(HOST, 0))
    srv.start()
    yield srv
    srv.stop()


def ready(srv: Server, pool: str = "pool", log: str = "log", epoch: int = 1, nxt: int = 0):
    assert srv.install(pool, log, epoch, nxt)


def assert_alive(srv: Server, pool: str = "alive-pool", log: str = "alive-log") -> None:
    """A fresh, well-formed client still gets correct answers."""
    assert srv.running
    with connect(srv.port, pool) as c:
        st0, ep, pos, cnt = c.tail(pool, log, 7)
        if st0 == RETRY:  # first use of this log: install it
            srv.install(pool, log, 7, 1000)
            st0, ep, pos, cnt = c.tail(pool, log, 7)
        assert (st0, ep, cnt) == (OK, 7, 0)
        st1, ep1, pos1, cnt1 = c.next(pool, log, 7, 3)
        assert (st1, ep1, pos1, cnt1) == (OK, 7, pos, 3)


# ---------------------------------------------------------------------------
# constants and basic API


def test_constants():
    assert (OK, STALE_EPOCH, RETRY, BAD_REQUEST, RECOVERY_FAILED) == (0, 1, 2, 3, 4)
    assert (_seqr.NOT_AUTHORISED, _seqr.RATE_LIMITED, _seqr.AUTH_REQUIRED, _seqr.AUTH_FAILED, _seqr.NOT_SERVED,
            _seqr.BAD_VERSION, _seqr.TLS_REQUIRED, _seqr.BAD_HANDSHAKE) == tuple(range(5, 13))
    assert _seqr.PROTOCOL_VERSION == 2
    assert _seqr.DEFAULT_MAX_FRAME == 1024
    assert _seqr.DEFAULT_MAX_NAME == 255
    assert _seqr.DEFAULT_MAX_CONNECTIONS == 1024
    assert _seqr.DEFAULT_MAX_COUNT == 65536


def test_start_stop_idempotent():
    srv = Server()
    assert srv.port == 0 and not srv.running
    srv.stop()  # not started: no-op
    srv.start()
    assert srv.port > 0 and srv.running
    with pytest.raises(Exception):
        srv.start()
    srv.stop()
    srv.stop()
    assert not srv.running
    with pytest.raises(ConnectionRefusedError):
        Client(HOST, srv.port, timeout_s=1.0)


def test_context_manager_and_destructor():
    with serve(Server()) as srv:
        port = srv.port
        with connect(port, "p") as c:
            assert c.next("p", "l", 1)[0] == RETRY
    del srv
    with pytest.raises(ConnectionError):
        Client(HOST, port, timeout_s=1.0)


# ---------------------------------------------------------------------------
# recovery protocol


def test_first_request_retry_then_install(server):
    c = connect(server.port)
    assert c.next("pool", "log", 3) == (RETRY, 0, 0, 0)
    assert server.wait_recovery(2.0) == [("pool", "log", 3)]
    # still initialising: RETRY, and no second recovery request
    assert c.next("pool", "log", 3)[0] == RETRY
    assert c.tail("pool", "log", 3)[0] == RETRY
    assert server.wait_recovery(0.05) == []
    assert server.install("pool", "log", 3, 42)
    assert c.next("pool", "log", 3) == (OK, 3, 42, 1)
    assert c.next("pool", "log", 3, 10) == (OK, 3, 43, 10)
    assert c.next("pool", "log", 3) == (OK, 3, 53, 1)
    logs = server.logs()
    assert logs == [
        {"pool": "pool", "log": "log", "state": "ready", "epoch": 3, "next": 54, "message": "",
         # per-log answers (the metrics' source): 3 RETRY, 3 OK with 12 positions
         "requests": 6, "positions": 12, "stale": 0, "retries": 3, "recovery_failed": 0,
         # streams (none asked for): known from the recovered counter on
         "streams": 0, "streams_from": 42}
    ]
    st_ = server.stats()
    assert st_["positions"] == 12 and st_["retries"] == 3 and st_["recoveries_queued"] == 1


def test_tail_does_not_consume(server):
    ready(server, epoch=2, nxt=100)
    c = connect(server.port)
    for _ in range(5):
        assert c.tail("pool", "log", 2) == (OK, 2, 100, 0)
    assert c.next("pool", "log", 2, 4) == (OK, 2, 100, 4)
    assert c.tail("pool", "log", 2) == (OK, 2, 104, 0)
    assert c.next("pool", "log", 2) == (OK, 2, 104, 1)


def test_stale_epoch(server):
    ready(server, epoch=5, nxt=10)
    c = connect(server.port)
    assert c.next("pool", "log", 4) == (STALE_EPOCH, 5, 0, 0)
    assert c.next("pool", "log", 0) == (STALE_EPOCH, 5, 0, 0)
    assert c.tail("pool", "log", 1) == (STALE_EPOCH, 5, 0, 0)
    # stale requests do not consume positions
    assert c.next("pool", "log", 5) == (OK, 5, 10, 1)
    assert server.stats()["stale"] == 3


def test_higher_epoch_triggers_recovery(server):
    ready(server, epoch=5, nxt=10)
    c = connect(server.port)
    assert c.next("pool", "log", 5)[0] == OK
    assert c.next("pool", "log", 7) == (RETRY, 5, 0, 0)
    assert server.wait_recovery(2.0) == [("pool", "log", 7)]
    # the log is initialising now: even the old epoch gets RETRY
    assert c.next("pool", "log", 5)[0] == RETRY
    assert server.logs()[0]["state"] == "initialising"
    assert server.install("pool", "log", 8, 500)
    assert c.next("pool", "log", 7) == (STALE_EPOCH, 8, 0, 0)
    assert c.next("pool", "log", 8) == (OK, 8, 500, 1)
    # install at a lower epoch is ignored; same epoch never moves backwards
    assert not server.install("pool", "log", 6, 0)
    assert server.install("pool", "log", 8, 0)
    assert c.next("pool", "log", 8) == (OK, 8, 501, 1)
    assert server.install("pool", "log", 8, 1000)
    assert c.next("pool", "log", 8) == (OK, 8, 1000, 1)


def test_recovery_failed_rate_limited(server):
    c = connect(server.port, "nopool")
    assert c.next("nopool", "nolog", 1)[0] == RETRY
    assert server.wait_recovery(2.0) == [("nopool", "nolog", 1)]
    assert server.fail("nopool", "nolog", "no such log")
    info = server.logs()[0]
    assert info["state"] == "failed" and info["message"] == "no such log"
    assert c.next("nopool", "nolog", 1) == (RECOVERY_FAILED, 0, 0, 0)
    assert c.tail("nopool", "nolog", 1)[0] == RECOVERY_FAILED
    assert server.wait_recovery(0.05) == []
    time.sleep(1.05)
    # after a second a request triggers a new recovery attempt
    assert c.next("nopool", "nolog", 2)[0] == RETRY
    assert server.wait_recovery(2.0) == [("nopool", "nolog", 2)]
    assert c.next("nopool", "nolog", 2)[0] == RETRY
    server.install("nopool", "nolog", 2, 0)
    assert c.next("nopool", "nolog", 2) == (OK, 2, 0, 1)
    # fail() on a READY log is ignored
    assert not server.fail("nopool", "nolog", "late failure")
    assert c.next("nopool", "nolog", 2) == (OK, 2, 1, 1)
    assert server.stats()["recovery_failed"] == 2


def test_wait_recovery_releases_gil_and_wakes(server):
    got = []
    t = threading.Thread(target=lambda: got.extend(server.wait_recovery(5.0)))
    t.start()
    time.sleep(0.05)
    c = connect(server.port, "a")
    assert c.next("a", "b", 9)[0] == RETRY
    t.join(3.0)
    assert not t.is_alive()
    assert got == [("a", "b", 9)]
    t0 = time.monotonic()
    assert server.wait_recovery(0.1) == []
    assert 0.05 < time.monotonic() - t0 < 1.0
    # stop() wakes a waiter
    t = threading.Thread(target=lambda: got.extend(server.wait_recovery(30.0)))
    t.start()
    time.sleep(0.05)
    server.stop()
    t.join(3.0)
    assert not t.is_alive()


def test_many_logs_and_pools_independent(server):
    c = PerPool(server.port)
    names = [(f"pool{p}", f"log{l}") for p in range(5) for l in range(20)]
    for i, (p, l) in enumerate(names):
        assert c.next(p, l, i + 1)[0] == RETRY
    reqs = []
    while len(reqs) < len(names):
        batch = server.wait_recovery(1.0)
        assert batch
        reqs.extend(batch)
    assert sorted(reqs) == sorted((p, l, i + 1) for i, (p, l) in enumerate(names))
    for i, (p, l) in enumerate(names):
        server.install(p, l, i + 1, i * 1000)
    for rnd in range(3):
        for i, (p, l) in enumerate(names):
            assert c.next(p, l, i + 1, 2) == (OK, i + 1, i * 1000 + 2 * rnd, 2)
    # same log name in different pools, and names that would collide if
    # they were simply concatenated
    server.install("ab", "c", 1, 0)
    server.install("a", "bc", 1, 500)
    server.install("a\0b", "c", 1, 900)
    assert c.next("ab", "c", 1) == (OK, 1, 0, 1)
    assert c.next("a", "bc", 1) == (OK, 1, 500, 1)
    assert c.next("a\0b", "c", 1) == (OK, 1, 900, 1)
    assert server.stats()["logs"] == len(names) + 3


def test_bad_requests_keep_connection_open(server):
    ready(server, epoch=1, nxt=0)
    c = connect(server.port)
    assert c.next("pool", "log", 1, 65536) == (OK, 1, 0, 65536)
    bad = [
        lambda: c.next("pool", "log", 1, 0),
        lambda: c.next("pool", "log", 1, 65537),
        lambda: c.next("", "log", 1),
        lambda: c.next("pool", "", 1),
        lambda: c.next("p" * 256, "log", 1),
        lambda: c.next("pool", "l" * 256, 1),
    ]
    for f in bad:
        assert f() == (BAD_REQUEST, 0, 0, 0)
    # unknown op and TAIL with a count, via send_request
    for op, count in [(0, 1), (3, 1), (255, 1), (2, 1)]:
        rid = c.send_request(op, "pool", "log", 1, count)
        assert c.recv() == (rid, BAD_REQUEST, 0, 0, 0)
    # trailing bytes after the log name, and a name length overrunning the frame
    payload = REQ_FIXED.pack(1, 77, 1, 1, 4) + b"pool" + struct.pack("<H", 3) + b"log" + b"xx"
    c.send_raw(struct.pack("<I", len(payload)) + payload)
    payload = REQ_FIXED.pack(1, 78, 1, 1, 200) + b"pool" + struct.pack("<H", 3) + b"log"
    c.send_raw(struct.pack("<I", len(payload)) + payload)
    assert c.recv() == (77, BAD_REQUEST, 0, 0, 0)
    assert c.recv() == (78, BAD_REQUEST, 0, 0, 0)
    # names of exactly max_name bytes are fine
    assert c.next("pool", "l" * 255, 1)[0] == RETRY
    assert connect(server.port, "p" * 255).next("p" * 255, "l" * 255, 1)[0] == RETRY
    assert c.next("pool", "log", 1) == (OK, 1, 65536, 1)
    assert server.stats()["bad_requests"] == 12
    assert server.stats()["bad_frames"] == 0


def test_limits_are_configurable():
    with serve(Server(HOST, 0, max_connections=8, max_frame=100, max_name=10, max_count=5), "pool") as srv:
        srv.install("pool", "log", 1, 0)
        c = connect(srv.port)
        assert c.next("pool", "log", 1, 5) == (OK, 1, 0, 5)
        assert c.next("pool", "log", 1, 6)[0] == BAD_REQUEST
        assert c.next("p" * 11, "log", 1)[0] == BAD_REQUEST
        # a frame longer than max_frame closes the connection
        with pytest.raises(ConnectionError):
            c.next("p" * 40, "l" * 40, 1)
        assert srv.stats()["bad_frames"] == 1
        assert connect(srv.port).next("pool", "log", 1) == (OK, 1, 5, 1)
    with pytest.raises(ValueError):
        Server(max_frame=10)


# ---------------------------------------------------------------------------
# uniqueness and gap-freedom under concurrency


def _proc_worker(args):
    port, count, total, depth = args
    from pyzlog._seqr import Client as C

    c = C("127.0.0.1", port, 10.0, {"pool": "pool", "keys": [(1, b"k" * 32)]})
    r = c.pipeline_next("pool", "log", 1, count, total, depth, collect=True)
    c.close()
    assert r["ok"] == total
    return r["ranges"]


def check_ranges(ranges, start):
    ranges = sorted(ranges)
    pos = start
    for p, n in ranges:
        assert p == pos, f"gap or overlap at {pos}: next range starts at {p}"
        pos += n
    return pos


def test_unique_gap_free_threads_and_processes(server):
    start = 1_000_000
    ready(server, epoch=1, nxt=start)
    ranges = []
    lock = threading.Lock()
    errors = []

    def thread_worker(seed):
        try:
            rnd = random.Random(seed)
            clients = [connect(server.port) for _ in range(3)]
            local = []
            for i in range(300):
                c = rnd.choice(clients)
                cnt = rnd.choice([1, 1, 2, 7, 64, 1000])
                status, ep, pos, n = c.next("pool", "log", 1, cnt)
                assert (status, ep, n) == (OK, 1, cnt)
                local.append((pos, n))
            # pipelined, Python side
            c = clients[0]
            rids = [c.send_next("pool", "log", 1, 1 + j % 5) for j in range(200)]
            for j, rid in enumerate(rids):
                r = c.recv()
                assert r[0] == rid and r[1] == OK and r[4] == 1 + j % 5
                local.append((r[3], r[4]))
            # pipelined, C++ side
            r = clients[1].pipeline_next("pool", "log", 1, 3, 2000, 32, collect=True)
            assert r["ok"] == 2000
            local.extend(r["ranges"])
            with lock:
                ranges.extend(local)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        async_res = pool.map_async(
            _proc_worker, [(server.port, 1, 5000, 64), (server.port, 17, 3000, 16)]
        )
        threads = [threading.Thread(target=thread_worker, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        proc_ranges = async_res.get(60)
    assert not errors, errors
    for r in proc_ranges:
        ranges.extend(r)
    total = sum(n for _, n in ranges)
    end = check_ranges(ranges, start)
    assert end == start + total
    assert server.logs()[0]["next"] == end
    assert server.stats()["positions"] == total


# ---------------------------------------------------------------------------
# pipelining


def test_pipelining_in_order(server):
    ready(server, epoch=4, nxt=0)
    c = connect(server.port)
    rids = []
    for i in range(2000):
        if i % 10 == 0:
            rids.append(c.send_tail("pool", "log", 4))
        elif i % 13 == 0:
            rids.append(c.send_next("pool", "log", 3))  # stale
        else:
            rids.append(c.send_next("pool", "log", 4, 2))
    assert rids == sorted(rids) and len(set(rids)) == len(rids)
    expect = 0
    for i, rid in enumerate(rids):
        r_rid, status, epoch, pos, count = c.recv()
        assert r_rid == rid
        if i % 10 == 0:
            assert (status, epoch, pos, count) == (OK, 4, expect, 0)
        elif i % 13 == 0:
            assert (status, epoch) == (STALE_EPOCH, 4)
        else:
            assert (status, epoch, pos, count) == (OK, 4, expect, 2)
            expect += 2
    r = c.pipeline_next("pool", "log", 4, 5, 10000, 128)
    assert r["ok"] == 10000 and r["ascending"]
    assert (r["first_position"], r["last_position"]) == (expect, expect + 50000 - 1)
    assert c.next("pool", "log", 4) == (OK, 4, expect + 50000, 1)


def test_pipeline_counts_statuses(server):
    c = connect(server.port, "x")
    r = c.pipeline_next("x", "y", 1, 1, 100, 10)
    assert r["retry"] == 100 and r["ok"] == 0 and r["first_position"] is None
    server.install("x", "y", 2, 0)
    r = c.pipeline_next("x", "y", 1, 1, 100, 10)
    assert r["stale"] == 100


def test_echo_server():
    e = _seqr.EchoServer(HOST, 0)
    e.start()
    try:
        c = Client(HOST, e.port)
        r = c.pipeline_echo(40, 5000, 32)
        assert r["requests"] == 5000
        assert r["bytes_received"] == 5000 * 44
        c.send_raw(b"\x03\x00\x00\x00abc")
        assert c.recv_raw(100, 2.0) == b"\x03\x00\x00\x00abc"
        assert e.frames == 5001
    finally:
        e.stop()


# ---------------------------------------------------------------------------
# robustness


@pytest.fixture(scope="module")
def shared_server():
    srv = serve(Server(HOST, 0, max_connections=64))
    srv.start()
    srv.install("pool", "log", 1, 0)
    yield srv
    srv.stop()


FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _send_and_drain(port: int, data: bytes, authenticated: bool = True) -> bytes:
    c = connect(port, timeout=2.0) if authenticated else Client(HOST, port, timeout_s=2.0)
    got = b""
    try:
        c.send_raw(data)
        while True:
            chunk = c.recv_raw(65536, 0.05)
            if not chunk:
                break
            got += chunk
    except (TimeoutError, ConnectionError):
        pass
    finally:
        c.close()
    return got


def _check_responses(got: bytes, rids: list[int] | None = None) -> None:
    assert len(got) % RESP.size == 0
    for i in range(len(got) // RESP.size):
        length, status, rid, _ep, _pos, _cnt = RESP.unpack_from(got, i * RESP.size)
        assert length == 29 and status in (OK, STALE_EPOCH, RETRY, BAD_REQUEST, RECOVERY_FAILED,
                                           _seqr.NOT_AUTHORISED)
        if rids is not None:
            assert rid == rids[i]


@FUZZ
@given(data=st.binary(min_size=0, max_size=3000))
def test_fuzz_random_bytes(shared_server, data):
    _check_responses(_send_and_drain(shared_server.port, data))
    assert_alive(shared_server)


@FUZZ
@given(data=st.binary(min_size=0, max_size=3000))
def test_fuzz_random_bytes_before_the_handshake(shared_server, data):
    positions = shared_server.stats()["positions"]
    check_no_entry(_send_and_drain(shared_server.port, data, authenticated=False))
    assert shared_server.stats()["positions"] == positions
    assert_alive(shared_server)


@FUZZ
@given(
    op=st.integers(0, 255),
    rid=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 2**64 - 1),
    count=st.integers(0, 2**32 - 1),
    pool=st.binary(max_size=300),
    log=st.binary(max_size=300),
    cut=st.integers(0, 700),
)
def test_fuzz_truncated_frames(shared_server, op, rid, epoch, count, pool, log, cut):
    frame = encode_request(op, rid, epoch, count, pool, log)
    cut = min(cut, len(frame) - 1)
    _check_responses(_send_and_drain(shared_server.port, frame[:cut]))
    assert_alive(shared_server)


@FUZZ
@given(op=st.sampled_from([1, 2]), rid=st.integers(0, 2**64 - 1), epoch=st.integers(0, 2**64 - 1),
       count=st.integers(0, 2**32 - 1), n=st.integers(1, 3))
def test_fuzz_requests_with_no_handshake(shared_server, op, rid, epoch, count, n):
    """The issue's attack: requests for a served pool and log, from a socket
    with no key. Each connection gets one AUTH_REQUIRED and is closed."""
    frame = encode_request(op, rid, epoch, count, b"pool", b"log")
    before = shared_server.stats()
    got = _send_and_drain(shared_server.port, frame * n, authenticated=False)
    assert got == struct.pack("<IBQQQI", 29, _seqr.AUTH_REQUIRED, rid, 0, 0, 0)
    after = shared_server.stats()
    assert after["positions"] == before["positions"] and after["requests"] == before["requests"]
    assert after["refused"]["no_handshake"] == before["refused"]["no_handshake"] + 1
    assert_alive(shared_server)


@FUZZ
@given(version=st.integers(0, 255), flags=st.integers(0, 65535), nonce=st.binary(min_size=16, max_size=16),
       pool=st.one_of(st.just(b"pool"), st.binary(max_size=300)), generation=st.integers(0, 2**32 - 1),
       mac=st.binary(min_size=32, max_size=32), proof_op=st.sampled_from([_seqr.OP_PROOF, 1, 0, 255]),
       then=st.binary(max_size=200))
def test_fuzz_handshakes(shared_server, version, flags, nonce, pool, generation, mac, proof_op, then):
    """HELLO and PROOF frames with any field, a request after them: a
    handshake with no key never yields a WELCOME, a position or an epoch."""
    hello = struct.pack("<BBH", _seqr.OP_HELLO, version, flags) + nonce + struct.pack("<H", len(pool)) + pool
    proof = struct.pack("<B3xI", proof_op, generation) + mac
    data = (struct.pack("<I", len(hello)) + hello + struct.pack("<I", len(proof)) + proof
            + encode_request(1, 9, 1, 1, b"pool", b"log") + then)
    positions = shared_server.stats()["positions"]
    check_no_entry(_send_and_drain(shared_server.port, data, authenticated=False))
    assert shared_server.stats()["positions"] == positions
    assert_alive(shared_server)


@FUZZ
@given(length=st.one_of(st.integers(1025, 2**32 - 1), st.integers(0, 24)),
       tail=st.binary(max_size=100))
def test_fuzz_bad_length_closes_connection(shared_server, length, tail):
    before = shared_server.stats()["bad_frames"]
    c = connect(shared_server.port, timeout=2.0)
    c.send_raw(struct.pack("<I", length) + tail)
    try:
        assert c.recv_raw(100, 2.0) == b""  # closed by the server
    except ConnectionResetError:
        pass
    c.close()
    assert shared_server.stats()["bad_frames"] == before + 1
    assert_alive(shared_server)


@FUZZ
@given(payload=st.binary(min_size=25, max_size=1024), n=st.integers(1, 3))
def test_fuzz_garbage_after_good_header(shared_server, payload, n):
    """Any frame with a valid length gets exactly one response carrying its
    request id, and the connection stays open."""
    frame = struct.pack("<I", len(payload)) + payload
    rid = struct.unpack_from("<Q", payload, 1)[0]
    c = connect(shared_server.port, timeout=2.0)
    c.send_raw(frame * n)
    got = read_responses(c, n)
    assert all(r[1] == rid for r in got)
    # the same connection still serves well-formed requests
    st_, ep, _pos, cnt = c.next("pool", "log", 1)
    assert (st_, ep, cnt) == (OK, 1, 1)
    c.close()
    assert_alive(shared_server)


def test_connection_closed_mid_frame(shared_server):
    frame = encode_request(1, 5, 1, 1, b"pool", b"log")
    for cut in (1, 3, 4, 10, len(frame) - 1):
        c = connect(shared_server.port)
        c.send_raw(frame + frame[:cut])
        assert read_responses(c, 1)[0][:2] == (OK, 5)
        c.close()
    assert_alive(shared_server)


def test_max_connections():
    with serve(Server(HOST, 0, max_connections=4), "pool") as srv:
        srv.install("pool", "log", 1, 0)
        clients = [connect(srv.port) for _ in range(4)]
        for c in clients:
            assert c.next("pool", "log", 1)[0] == OK
        with pytest.raises(ConnectionError):  # accepted, then closed: the handshake fails
            connect(srv.port, timeout=2.0)
        assert srv.stats()["connections_rejected"] >= 1
        assert srv.stats()["connections_open"] == 4
        clients.pop().close()
        deadline = time.monotonic() + 5
        while srv.stats()["connections_open"] != 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        c = connect(srv.port)
        assert c.next("pool", "log", 1)[0] == OK
        for c2 in clients:
            assert c2.next("pool", "log", 1)[0] == OK


def test_many_idle_connections(server):
    idle = [connect(server.port) for _ in range(300)]
    # half of them send a partial frame and then go quiet
    frame = encode_request(1, 1, 1, 1, b"pool", b"log")
    for c in idle[::2]:
        c.send_raw(frame[:7])
    deadline = time.monotonic() + 5
    while server.stats()["connections_open"] < 300:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert_alive(server)
    for c in idle:
        c.close()
    deadline = time.monotonic() + 5
    while server.stats()["connections_open"] > 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_client_timeout_no_hang():
    # a listener that never accepts/answers: the handshake, and raw requests, time out
    ls = socket.socket()
    ls.bind((HOST, 0))
    ls.listen(8)
    try:
        with pytest.raises(TimeoutError):
            connect(ls.getsockname()[1], timeout=0.3)
        c = Client(HOST, ls.getsockname()[1], timeout_s=0.3)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            c.next("pool", "log", 1)
        assert time.monotonic() - t0 < 2.0
        with pytest.raises(TimeoutError):
            c.recv_raw(10, 0.1)
    finally:
        ls.close()


def test_server_stopped_under_client():
    srv = serve(Server(), "pool")
    srv.start()
    srv.install("pool", "log", 1, 0)
    c = connect(srv.port, timeout=1.0)
    assert c.next("pool", "log", 1)[0] == OK
    rid = c.send_next("pool", "log", 1)
    assert c.recv()[0] == rid
    srv.stop()
    t0 = time.monotonic()
    with pytest.raises((ConnectionError, TimeoutError)):
        c.next("pool", "log", 1)
    with pytest.raises((ConnectionError, TimeoutError)):
        c.pipeline_next("pool", "log", 1, 1, 1000, 16)
    assert time.monotonic() - t0 < 3.0
    with pytest.raises(ConnectionRefusedError):
        Client(HOST, srv.port, timeout_s=1.0)


def test_closed_client_raises():
    with serve(Server(), "pool") as srv:
        c = connect(srv.port)
        c.close()
        assert c.closed
        with pytest.raises(ConnectionError):
            c.next("pool", "log", 1)


# ---------------------------------------------------------------------------
# the handshake (docs/seqr-protocol.md, "Handshake"), spoken from Python (seqr_wire.py)


def test_the_handshake_as_documented(server):
    """A Python implementation of the documented handshake gets in, proves
    the server holds the key too, and then speaks plain requests."""
    ready(server, epoch=3, nxt=40)
    sock, w, _ = python_handshake(HOST, server.port, b"pool", KEY)
    assert w["op"] == _seqr.OP_WELCOME and w["status"] == OK and w["server_proved"]
    assert w["max_count"] == _seqr.DEFAULT_MAX_COUNT and (w["max_rate"], w["max_outstanding"]) == (0, 0)
    sock.sendall(encode_request(1, 5, 3, 2, b"pool", b"log"))
    assert RESP.unpack(struct.pack("<I", 29) + read_frame(sock)) == (29, OK, 5, 3, 40, 2)
    sock.close()
    assert server.stats()["auth_ok"] == 1


def test_refusals_reveal_nothing(server):
    """No key, a wrong key, a key for another pool, an unknown generation,
    a pool not served, a replayed handshake: no WELCOME, no position, no
    epoch, each counted by reason; the server serves others meanwhile."""
    ready(server, epoch=3, nxt=40)
    port = server.port
    with pytest.raises(_seqr.AuthError, match="wrong key") as e:
        Client(HOST, port, 2.0, auth(key=b"w" * 32))
    assert (e.value.status, e.value.reason) == (_seqr.AUTH_FAILED, _seqr.REASON_WRONG_PROOF)
    with pytest.raises(_seqr.AuthError, match="does not serve") as e:
        Client(HOST, port, 2.0, auth("elsewhere"))
    assert e.value.status == _seqr.NOT_SERVED
    # the key is bound to its pool: pool p's key (the same bytes here) does not open "pool" as another name
    sock, w, _ = python_handshake(HOST, port, b"pool", KEY, generation=7)
    assert (w["status"], w["reason"]) == (_seqr.AUTH_FAILED, _seqr.REASON_UNKNOWN_GENERATION)
    assert sock.recv(100) == b""  # closed after the refusal
    sock.close()
    # a handshake recorded off the wire and played again: the server's fresh nonce defeats it
    sock, w, sent = python_handshake(HOST, port, b"pool", KEY)
    assert w["status"] == OK
    sock.close()
    replay = socket.create_connection((HOST, port), timeout=5)
    replay.sendall(sent + encode_request(1, 6, 3, 1, b"pool", b"log"))
    got = read_all(replay)
    check_no_entry(got)
    assert got[4] == _seqr.OP_CHALLENGE and got[36] == _seqr.OP_WELCOME and got[37] == _seqr.AUTH_FAILED
    replay.close()
    refused = server.stats()["refused"]
    assert (refused["wrong_key"], refused["not_served"], refused["unknown_generation"]) == (2, 1, 1)
    assert server.stats()["positions"] == 0
    assert_alive(server, "pool", "log2")


def test_a_liveness_probe_is_answered_and_not_a_refusal(server):
    """Daemons ask each other whether they are alive with a HELLO naming no
    pool: answered (the probe returns), not logged, not counted as refused."""
    Client(HOST, server.port, 2.0, {"probe": True}).close()
    st_ = server.stats()
    assert st_["probes"] == 1 and sum(st_["refused"].values()) == 0 and st_["auth_ok"] == 0
    with pytest.raises((ConnectionError, TimeoutError)):  # nothing answers a probe there
        ls = socket.socket()
        ls.bind((HOST, 0))
        ls.listen(1)
        try:
            Client(HOST, ls.getsockname()[1], 0.3, {"probe": True})
        finally:
            ls.close()


def test_connections_are_bound_to_their_pool(server):
    """A connection authenticated for one pool gets NOT_AUTHORISED for any
    other pool's log, which never starts a recovery there."""
    ready(server, pool="a", epoch=2, nxt=7)
    c = connect(server.port, "pool")
    assert c.next("a", "log", 2) == (_seqr.NOT_AUTHORISED, 0, 0, 0)
    assert c.tail("a", "log", 2) == (_seqr.NOT_AUTHORISED, 0, 0, 0)
    assert c.next("x", "new-log", 1) == (_seqr.NOT_AUTHORISED, 0, 0, 0)
    assert server.wait_recovery(0.05) == []
    assert connect(server.port, "a").next("a", "log", 2) == (OK, 2, 7, 1)
    assert server.stats()["not_authorised"] == 3


def test_insecure_server_needs_no_key_but_binds_pools():
    with Server(HOST, 0, require_auth=False) as srv:  # no pool set: every pool
        srv.install("any", "log", 1, 0)
        with pytest.raises(_seqr.AuthError, match="asks for no proof"):
            Client(HOST, srv.port, 2.0, {"pool": "any"})  # a client does not accept that by default
        c = Client(HOST, srv.port, 2.0, {"pool": "any", "insecure": True})
        assert not c.authenticated and c.next("any", "log", 1) == (OK, 1, 0, 1)
        assert c.next("other", "log", 1)[0] == _seqr.NOT_AUTHORISED
        srv.set_pool("only", [])
        with pytest.raises(_seqr.AuthError, match="does not serve"):
            Client(HOST, srv.port, 2.0, {"pool": "any", "insecure": True})


def test_rotation_keeps_connections_and_revocation_closes_them(server):
    ready(server, epoch=1, nxt=0)
    old = connect(server.port)
    k2 = b"2" * 32
    server.set_pool("pool", [(2, k2), (1, KEY)])  # rotated: 2 current, 1 still accepted
    assert old.next("pool", "log", 1)[0] == OK  # a connection made before goes on
    late = connect(server.port)
    assert late.generation == 1  # a client that has only the old key gets in
    both = Client(HOST, server.port, 2.0, {"pool": "pool", "keys": [(1, KEY), (2, k2)]})
    assert both.generation == 2  # the server's current generation is preferred
    new = Client(HOST, server.port, 2.0, auth(key=k2, generation=2))
    assert server.set_pool("pool", [(3, b"3" * 32), (2, k2)]) == 2  # generation 1 revoked: its two closed
    assert new.next("pool", "log", 1)[0] == OK and both.next("pool", "log", 1)[0] == OK
    for gone in (old, late):
        with pytest.raises(ConnectionError):
            gone.next("pool", "log", 1)
    with pytest.raises(_seqr.AuthError, match="does not accept key generation 1"):
        connect(server.port)  # only generation 1, the server now 3 and 2
    with pytest.raises(_seqr.AuthError, match="no key .* accepts"):  # a client ahead of the server
        Client(HOST, server.port, 2.0, auth(key=b"4" * 32, generation=4))
    assert server.pools()["pool"] == [3, 2]
    assert server.stats()["revoked"] == 2


def test_position_budget_per_connection():
    """max_outstanding positions at once, max_rate a second: over it,
    RATE_LIMITED with a wait in ms and nothing handed out."""
    with serve(Server(HOST, 0, max_rate=1000, max_outstanding=100), "pool") as srv:
        srv.install("pool", "log", 1, 0)
        c = connect(srv.port)
        assert c.limits == {"max_count": 100, "max_outstanding": 100, "max_rate": 1000}
        assert c.next("pool", "log", 1, 101)[0] == BAD_REQUEST  # more than the budget can ever hold
        assert c.next("pool", "log", 1, 60) == (OK, 1, 0, 60)
        status, epoch, pos, wait_ms = c.next("pool", "log", 1, 60)
        assert (status, epoch, pos) == (_seqr.RATE_LIMITED, 0, 0) and 1 <= wait_ms <= 60
        assert connect(srv.port).next("pool", "log", 1, 100) == (OK, 1, 60, 100)  # per connection
        time.sleep(wait_ms / 1000 + 0.05)
        assert c.next("pool", "log", 1, 60) == (OK, 1, 160, 60)
        r = c.pipeline_next("pool", "log", 1, 10, 1000, 64)
        assert r["rate_limited"] > 0 and r["ok"] + r["rate_limited"] == 1000
        assert c.tail("pool", "log", 1)[0] == OK  # TAIL takes nothing and is never limited
        assert srv.stats()["rate_limited"] == 1 + r["rate_limited"]
        srv.set_limits(0, 0)
        assert c.next("pool", "log", 1, 65536)[0] == OK


def test_a_connection_that_never_authenticates_is_closed():
    with serve(Server(HOST, 0, handshake_timeout_s=0.3), "pool") as srv:
        quiet = socket.create_connection((HOST, srv.port), timeout=5)
        assert quiet.recv(10) == b""  # closed by the server
        quiet.close()
        assert srv.stats()["handshake_timeouts"] == 1
        assert connect(srv.port).tail("pool", "log", 1)[0] == RETRY
