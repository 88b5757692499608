"""Tests of the C++ sequencer (pyzlog._seqr). No Ceph cluster needed: logs are
installed directly with Server.install(), the way the recovery daemon does."""

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

HOST = "127.0.0.1"
REQ_FIXED = struct.Struct("<BQQIH")  # op, request_id, epoch, count, pool_len
RESP = struct.Struct("<IBQQQI")  # length, status, request_id, epoch, position, count


def encode_request(op: int, rid: int, epoch: int, count: int, pool: bytes, log: bytes) -> bytes:
    payload = (
        REQ_FIXED.pack(op, rid, epoch, count, len(pool)) + pool + struct.pack("<H", len(log)) + log
    )
    return struct.pack("<I", len(payload)) + payload


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
    srv = Server(HOST, 0)
    srv.start()
    yield srv
    srv.stop()


def ready(srv: Server, pool: str = "pool", log: str = "log", epoch: int = 1, nxt: int = 0):
    assert srv.install(pool, log, epoch, nxt)


def assert_alive(srv: Server, pool: str = "alive-pool", log: str = "alive-log") -> None:
    """A fresh, well-formed client still gets correct answers."""
    assert srv.running
    with Client(HOST, srv.port, timeout_s=5.0) as c:
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
    with Server() as srv:
        port = srv.port
        with Client(HOST, port) as c:
            assert c.next("p", "l", 1)[0] == RETRY
    del srv
    with pytest.raises(ConnectionError):
        Client(HOST, port, timeout_s=1.0)


# ---------------------------------------------------------------------------
# recovery protocol


def test_first_request_retry_then_install(server):
    c = Client(HOST, server.port)
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
         "requests": 6, "positions": 12, "stale": 0, "retries": 3, "recovery_failed": 0}
    ]
    st_ = server.stats()
    assert st_["positions"] == 12 and st_["retries"] == 3 and st_["recoveries_queued"] == 1


def test_tail_does_not_consume(server):
    ready(server, epoch=2, nxt=100)
    c = Client(HOST, server.port)
    for _ in range(5):
        assert c.tail("pool", "log", 2) == (OK, 2, 100, 0)
    assert c.next("pool", "log", 2, 4) == (OK, 2, 100, 4)
    assert c.tail("pool", "log", 2) == (OK, 2, 104, 0)
    assert c.next("pool", "log", 2) == (OK, 2, 104, 1)


def test_stale_epoch(server):
    ready(server, epoch=5, nxt=10)
    c = Client(HOST, server.port)
    assert c.next("pool", "log", 4) == (STALE_EPOCH, 5, 0, 0)
    assert c.next("pool", "log", 0) == (STALE_EPOCH, 5, 0, 0)
    assert c.tail("pool", "log", 1) == (STALE_EPOCH, 5, 0, 0)
    # stale requests do not consume positions
    assert c.next("pool", "log", 5) == (OK, 5, 10, 1)
    assert server.stats()["stale"] == 3


def test_higher_epoch_triggers_recovery(server):
    ready(server, epoch=5, nxt=10)
    c = Client(HOST, server.port)
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
    c = Client(HOST, server.port)
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
    c = Client(HOST, server.port)
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
    c = Client(HOST, server.port)
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
    c = Client(HOST, server.port)
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
    assert c.next("p" * 255, "l" * 255, 1)[0] == RETRY
    assert c.next("pool", "log", 1) == (OK, 1, 65536, 1)
    assert server.stats()["bad_requests"] == 12
    assert server.stats()["bad_frames"] == 0


def test_limits_are_configurable():
    with Server(HOST, 0, max_connections=8, max_frame=100, max_name=10, max_count=5) as srv:
        srv.install("pool", "log", 1, 0)
        c = Client(HOST, srv.port)
        assert c.next("pool", "log", 1, 5) == (OK, 1, 0, 5)
        assert c.next("pool", "log", 1, 6)[0] == BAD_REQUEST
        assert c.next("p" * 11, "log", 1)[0] == BAD_REQUEST
        # a frame longer than max_frame closes the connection
        with pytest.raises(ConnectionError):
            c.next("p" * 40, "l" * 40, 1)
        assert srv.stats()["bad_frames"] == 1
        assert Client(HOST, srv.port).next("pool", "log", 1) == (OK, 1, 5, 1)
    with pytest.raises(ValueError):
        Server(max_frame=10)


# ---------------------------------------------------------------------------
# uniqueness and gap-freedom under concurrency


def _proc_worker(args):
    port, count, total, depth = args
    from pyzlog._seqr import Client as C

    c = C("127.0.0.1", port, timeout_s=10.0)
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
            clients = [Client(HOST, server.port) for _ in range(3)]
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
    c = Client(HOST, server.port)
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
    c = Client(HOST, server.port)
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
    srv = Server(HOST, 0, max_connections=64)
    srv.start()
    srv.install("pool", "log", 1, 0)
    yield srv
    srv.stop()


FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _send_and_drain(port: int, data: bytes) -> bytes:
    c = Client(HOST, port, timeout_s=2.0)
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
        assert length == 29 and status in (OK, STALE_EPOCH, RETRY, BAD_REQUEST, RECOVERY_FAILED)
        if rids is not None:
            assert rid == rids[i]


@FUZZ
@given(data=st.binary(min_size=0, max_size=3000))
def test_fuzz_random_bytes(shared_server, data):
    _check_responses(_send_and_drain(shared_server.port, data))
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
@given(length=st.one_of(st.integers(1025, 2**32 - 1), st.integers(0, 24)),
       tail=st.binary(max_size=100))
def test_fuzz_bad_length_closes_connection(shared_server, length, tail):
    before = shared_server.stats()["bad_frames"]
    c = Client(HOST, shared_server.port, timeout_s=2.0)
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
    c = Client(HOST, shared_server.port, timeout_s=2.0)
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
        c = Client(HOST, shared_server.port)
        c.send_raw(frame + frame[:cut])
        assert read_responses(c, 1)[0][:2] == (OK, 5)
        c.close()
    assert_alive(shared_server)


def test_max_connections():
    with Server(HOST, 0, max_connections=4) as srv:
        srv.install("pool", "log", 1, 0)
        clients = [Client(HOST, srv.port) for _ in range(4)]
        for c in clients:
            assert c.next("pool", "log", 1)[0] == OK
        extra = Client(HOST, srv.port, timeout_s=2.0)  # accepted, then closed
        with pytest.raises(ConnectionError):
            extra.next("pool", "log", 1)
        assert srv.stats()["connections_rejected"] >= 1
        assert srv.stats()["connections_open"] == 4
        clients.pop().close()
        deadline = time.monotonic() + 5
        while srv.stats()["connections_open"] != 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        c = Client(HOST, srv.port)
        assert c.next("pool", "log", 1)[0] == OK
        for c2 in clients:
            assert c2.next("pool", "log", 1)[0] == OK


def test_many_idle_connections(server):
    idle = [Client(HOST, server.port) for _ in range(300)]
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
    # a listener that never accepts/answers: requests must time out
    ls = socket.socket()
    ls.bind((HOST, 0))
    ls.listen(8)
    try:
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
    srv = Server()
    srv.start()
    srv.install("pool", "log", 1, 0)
    c = Client(HOST, srv.port, timeout_s=1.0)
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
    with Server() as srv:
        c = Client(HOST, srv.port)
        c.close()
        assert c.closed
        with pytest.raises(ConnectionError):
            c.next("pool", "log", 1)
