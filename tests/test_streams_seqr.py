"""The sequencer's streams (STREAM_NEXT / STREAM_TAIL, docs/seqr-protocol.md
"Streams"), against the C++ server in-process: no Ceph cluster needed, logs
installed with Server.install() as the recovery daemon does. Every
connection authenticates, as in production."""
from __future__ import annotations

import random
import struct
import threading

import pytest

from pyzlog import _seqr
from pyzlog._seqr import BAD_REQUEST, OK, RETRY, STALE_EPOCH, Client, Server
from seqr_wire import RESP

HOST = "127.0.0.1"
KEY = b"k" * 32
K = _seqr.STREAM_BACKPOINTERS


def bp3(streams: list) -> list:  # type: ignore[type-arg]
    """(stream, horizon, recent backpointers) of each stream of an answer."""
    return [(s, h, b) for s, h, b, _o, _l in streams]


@pytest.fixture
def server():
    srv = Server(HOST, 0)
    srv.set_pool("pool", [(1, KEY)])
    srv.start()
    srv.install("pool", "log", 1, 0)
    yield srv
    srv.stop()


def connect(port: int) -> Client:
    return Client(HOST, port, 5.0, {"pool": "pool", "keys": [(1, KEY)]})


def test_backpointers_name_each_streams_previous_positions(server) -> None:  # type: ignore[no-untyped-def]
    c = connect(server.port)
    st, epoch, pos, n, k, streams = c.streams("pool", "log", 1, 1, [7])
    assert (st, epoch, pos, n, k) == (OK, 1, 0, 1, K) and bp3(streams) == [(7, 0, [])]
    assert c.next("pool", "log", 1, 2) == (OK, 1, 1, 2)  # plain positions belong to no stream
    st, _, pos, n, _, streams = c.streams("pool", "log", 1, 3, [7, 9])
    assert (pos, n) == (3, 3) and bp3(streams) == [(7, 0, [0]), (9, 0, [])]
    # a batch of count positions: the stream's newest are its last ones
    st, _, pos, _, _, streams = c.streams("pool", "log", 1, 1, [9, 7])
    assert pos == 6 and bp3(streams) == [(9, 0, [5, 4, 3]), (7, 0, [5, 4, 3, 0])]
    # STREAM_TAIL takes nothing and answers the same lists
    st, _, pos, n, _, streams = c.streams("pool", "log", 1, 0, [7, 8])
    assert (st, pos, n) == (OK, 7, 0) and bp3(streams) == [(7, 0, [6, 5, 4, 3, 0]), (8, 0, [])]
    assert c.tail("pool", "log", 1) == (OK, 1, 7, 0)
    assert server.logs()[0]["streams"] == 2 and server.logs()[0]["streams_from"] == 0


def test_at_most_k_newest_first(server) -> None:  # type: ignore[no-untyped-def]
    c = connect(server.port)
    for _ in range(3 * K):
        c.streams("pool", "log", 1, 1, [1])
    _, _, pos, _, _, [(_s, _h, back, _o, _l)] = c.streams("pool", "log", 1, 0, [1])
    assert pos == 3 * K and back == list(range(3 * K - 1, 2 * K - 1, -1))
    _, _, pos, _, _, [(_s, _h, back, _o, _l)] = c.streams("pool", "log", 1, 5 * K, [1])
    assert back == list(range(3 * K - 1, 2 * K - 1, -1))
    _, _, _, _, _, [(_s, _h, back, _o, _l)] = c.streams("pool", "log", 1, 0, [1])
    assert back == list(range(8 * K - 1, 7 * K - 1, -1))


def test_concurrent_appenders_to_several_streams(server) -> None:  # type: ignore[no-untyped-def]
    """Every answer's backpointers are exactly the stream's previous
    positions (last K), whatever the interleaving of clients."""
    got: list[tuple[int, int, list[int], list[int]]] = []  # (pos, count, streams, ...)
    answers: list[tuple[int, int, list[tuple[int, int, list[int]]]]] = []
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        c = connect(server.port)
        for _ in range(300):
            streams = rnd.sample(range(1, 9), rnd.randint(1, 3))
            count = rnd.randint(1, 4)
            st, _, pos, n, _, bps = c.streams("pool", "log", 1, count, streams)
            assert st == OK and n == count
            with lock:
                answers.append((pos, count, bps))
        c.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    answers.sort()
    history: dict[int, list[int]] = {}
    for pos, count, bps in answers:
        for s, horizon, back, ordinal, levels in bps:
            mine = history.get(s, [])
            assert horizon == 0 and ordinal == len(mine)
            assert back == mine[::-1][:K]
            # skip pointers: the stream's newest entry whose ordinal is a multiple of 2^level
            for level, p in levels:
                assert p == mine[((ordinal - 1) >> level) << level]
        for s, _h, _b, _o, _l in bps:
            history.setdefault(s, []).extend(range(pos, pos + count))


def test_a_new_epoch_forgets_streams_never_answers_wrongly(server) -> None:  # type: ignore[no-untyped-def]
    c = connect(server.port)
    for _ in range(5):
        c.streams("pool", "log", 1, 1, [3])
    # a recovery (another daemon, a restart): the counter comes from the objects
    server.install("pool", "log", 2, 40)
    st, epoch, pos, _, _, streams = c.streams("pool", "log", 1, 1, [3])
    assert st == STALE_EPOCH and streams == []
    st, epoch, pos, _, _, streams = c.streams("pool", "log", 2, 1, [3])
    assert (st, epoch, pos) == (OK, 2, 40) and bp3(streams) == [(3, 40, [])]  # unknown below 40
    _, _, _, _, _, streams = c.streams("pool", "log", 2, 0, [3])
    assert bp3(streams) == [(3, 40, [40])]
    # the same epoch again (a repeated install) keeps what it knows
    server.install("pool", "log", 2, 30)
    assert bp3(c.streams("pool", "log", 2, 0, [3])[5]) == [(3, 40, [40])]
    # forgotten, then recovered: unknown below the new counter
    server.forget("pool", "log")
    assert c.streams("pool", "log", 2, 1, [3])[0] == RETRY
    server.install("pool", "log", 3, 50)
    assert bp3(c.streams("pool", "log", 3, 1, [3])[5]) == [(3, 50, [])]


def _raw_request(op: int, count: int, tail: bytes, pool: bytes = b"pool", log: bytes = b"log") -> bytes:
    body = struct.pack("<BQQIH", op, 9, 1, count, len(pool)) + pool + struct.pack("<H", len(log)) + log + tail
    return struct.pack("<I", len(body)) + body


@pytest.mark.parametrize("op,count,tail", [
    (3, 1, b""),                                            # no stream count
    (3, 1, struct.pack("<H", 0)),                           # no stream
    (3, 1, struct.pack("<HQ", 2, 5)),                       # one id short
    (3, 1, struct.pack("<HQQ", 1, 5, 6)),                   # trailing bytes
    (3, 1, struct.pack("<HQQ", 2, 5, 5)),                   # a stream twice
    (3, 0, struct.pack("<HQ", 1, 5)),                       # STREAM_NEXT of nothing
    (4, 1, struct.pack("<HQ", 1, 5)),                       # STREAM_TAIL that takes
    (3, 1, struct.pack("<H", 65) + b"\1" * 8 * 65),         # more streams than allowed
    (1, 1, struct.pack("<HQ", 1, 5)),                       # a plain NEXT with a stream section
    (5, 0, struct.pack("<HQ", 1, 5)),                       # STREAM_HISTORY of nothing
    (5, _seqr.MAX_STREAM_HISTORY + 1, struct.pack("<HQ", 1, 5)),  # more history than kept
    (5, 1, struct.pack("<HQQ", 1, 5, 6)),                   # trailing bytes
    (5, 8192, struct.pack("<H", 9) + b"".join(struct.pack("<Q", i) for i in range(1, 10))),  # over 65,536 in all
])
def test_malformed_stream_requests_are_bad_requests(server, op: int, count: int, tail: bytes) -> None:  # type: ignore[no-untyped-def]
    c = connect(server.port)
    c.send_raw(_raw_request(op, count, tail))
    buf = b""
    while len(buf) < RESP.size:
        buf += c.recv_raw(4096, 2.0)
    length, status, rid, epoch, pos, n = RESP.unpack_from(buf)
    assert (length, status, rid, pos, n) == (29, BAD_REQUEST, 9, 0, 0)
    assert len(buf) == RESP.size
    # the connection goes on, and nothing was handed out
    assert c.tail("pool", "log", 1) == (OK, 1, 0, 0)
    assert server.logs()[0]["streams"] == 0


def test_client_checks_arguments(server) -> None:  # type: ignore[no-untyped-def]
    c = connect(server.port)
    with pytest.raises(ValueError):
        c.streams("pool", "log", 1, 1, [])
    with pytest.raises(ValueError):
        c.streams("pool", "log", 1, 1, list(range(1, 66)))
    with pytest.raises(ValueError):  # a history request takes no positions
        c.streams("pool", "log", 1, 1, [5], 10)
    with pytest.raises(ValueError):
        c.streams("pool", "log", 1, 0, [5], _seqr.MAX_STREAM_HISTORY + 1)
    with pytest.raises(ValueError):  # an answer of at most 512 KB
        c.streams("pool", "log", 1, 0, list(range(1, 10)), _seqr.MAX_STREAM_HISTORY)
    assert c.tail("pool", "log", 1) == (OK, 1, 0, 0)


def test_stream_request_before_the_handshake_is_refused(server) -> None:  # type: ignore[no-untyped-def]
    import socket

    s = socket.create_connection((HOST, server.port))
    s.sendall(_raw_request(3, 1, struct.pack("<HQ", 1, 5)))
    buf = b""
    while len(buf) < RESP.size:
        chunk = s.recv(4096)
        if not chunk:
            break
        buf += chunk
    s.close()
    assert RESP.unpack_from(buf)[1] == _seqr.AUTH_REQUIRED
    assert server.logs()[0]["streams"] == 0


def test_skip_pointers_reach_back_by_powers_of_two(server) -> None:  # type: ignore[no-untyped-def]
    c = connect(server.port)
    positions = []
    for i in range(300):
        c.next("pool", "log", 1, 1)  # another stream's entry between each of ours
        positions.append(c.streams("pool", "log", 1, 1, [5])[2])
    _, _, _, _, _, [(_s, _h, back, ordinal, levels)] = c.streams("pool", "log", 1, 0, [5])
    assert ordinal == 300 and back == positions[::-1][:K]
    first = _seqr.STREAM_FIRST_LEVEL
    assert [lv for lv, _p in levels] == list(range(first, 10))  # 2^8 < 299 < 2^9: level 9 names ordinal 0
    assert dict(levels) == {lv: positions[(299 >> lv) << lv] for lv in range(first, 10)}


def test_history_answers_each_streams_last_positions(server) -> None:  # type: ignore[no-untyped-def]
    """STREAM_HISTORY: STREAM_TAIL's answer, and each stream's last positions
    (newest first, as many as asked for and kept), batches included; an
    unknown stream has none, a new epoch forgets them all, and nothing is
    handed out."""
    c = connect(server.port)
    mine: dict[int, list[int]] = {7: [], 9: []}
    rng = random.Random(5)
    for _ in range(200):
        ids = rng.choice([[7], [9], [7, 9]])
        count = rng.choice([1, 1, 3, 40])
        st, _, pos, _, _, _ = c.streams("pool", "log", 1, count, ids)
        assert st == OK
        for s in ids:
            mine[s].extend(range(pos, pos + count))
        c.next("pool", "log", 1, 2)  # positions of no stream between
    tail = c.tail("pool", "log", 1)[2]
    st, epoch, pos, n, k, streams = c.streams("pool", "log", 1, 0, [9, 7, 8], 5000)
    assert (st, pos, n, k) == (OK, tail, 0, K)
    assert [(s, h, hist) for s, h, _b, _o, _l, hist in streams] == [
        (9, 0, mine[9][::-1][:5000]), (7, 0, mine[7][::-1][:5000]), (8, 0, [])]
    for s, _h, back, ordinal, _l, hist in streams:  # the recent list leads it
        assert back == hist[:K] and ordinal == len(mine.get(s, []))
    _, _, _, _, _, short = c.streams("pool", "log", 1, 0, [7], 10)
    assert short[0][5] == mine[7][::-1][:10]
    assert c.tail("pool", "log", 1) == (OK, 1, tail, 0)
    server.install("pool", "log", 2, tail + 10)
    _, _, _, _, _, after = c.streams("pool", "log", 2, 0, [7], 100)
    assert after[0][1:3] == (tail + 10, []) and after[0][5] == []


def test_history_keeps_the_newest_within_its_caps(server) -> None:  # type: ignore[no-untyped-def]
    """At most MAX_STREAM_HISTORY per stream, and a budget over all streams:
    a stream that finds it spent gets no history (its recent list still
    answers), one that has some keeps its size, its oldest giving way to its
    newest: a history is always the stream's latest positions, none missing."""
    cap = _seqr.MAX_STREAM_HISTORY
    budget = _seqr.STREAM_HISTORY_BUDGET
    c = connect(server.port)
    full = budget // cap  # streams whose full histories spend the budget
    ids = list(range(1, full + 1))
    for i in range(0, full, 64):
        assert c.streams("pool", "log", 1, cap, ids[i:i + 64])[0] == OK
    _, _, pos, _, _, _ = c.streams("pool", "log", 1, 3, [ids[0], 10**6])  # 10**6: new, after the budget ran out
    _, _, _, _, _, got = c.streams("pool", "log", 1, 0, [ids[0], ids[1], 10**6], cap)
    (_, _, _, _, _, h0), (_, _, _, _, _, h1), (_, _, back, _, _, h2) = got
    assert len(h0) == cap and h0[:3] == [pos + 2, pos + 1, pos] and h0[3:] == list(range(cap - 1, 2, -1))
    assert h1 == list(range(cap - 1, -1, -1))  # the first request: positions shared by 64 streams
    assert h2 == [] and back == [pos + 2, pos + 1, pos]
    assert server.stats()["stream_history_positions"] == budget  # spent
    # a log recovered at a new epoch gives its histories back to the budget ...
    server.install("pool", "log", 2, 10**7)

    def new_stream_history(sid: int, epoch: int) -> list[int]:
        _, _, first, _, _, _ = c.streams("pool", "log", epoch, 5, [sid])
        got = c.streams("pool", "log", epoch, 0, [sid], cap)[5][0][5]
        return [first + 4 - p for p in got]  # 0..4 if it has its 5 positions, newest first

    assert new_stream_history(10**6 + 1, 2) == [0, 1, 2, 3, 4]
    # ... and so does a log forgotten (its server no longer serves it)
    server.install("pool", "log2", 1, 0)
    for i in range(0, full, 64):
        assert c.streams("pool", "log2", 1, cap, ids[i:i + 64])[0] == OK  # the budget spent again
    assert new_stream_history(10**6 + 2, 2) == []
    assert server.forget("pool", "log2")
    assert new_stream_history(10**6 + 3, 2) == [0, 1, 2, 3, 4]
    assert server.stats()["stream_history_positions"] == 2 * 5  # the new streams that got one keep 5 each


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024


def test_a_client_that_does_not_read_its_answers_cannot_swell_the_server(server) -> None:  # type: ignore[no-untyped-def]
    """History answers are up to 5,000 times their request: a client that
    sends 200 requests (each answered with 512 KB) in one go and reads
    nothing makes the server hold about a megabyte, not 100 MB; the rest of
    its requests wait in its buffer and are answered, all and in order, as
    it reads (the server runs in this process: its memory is ours)."""
    c = connect(server.port)
    streams = list(range(1, 9))
    assert c.streams("pool", "log", 1, 8192, streams)[0] == OK  # 8 streams of 8,192 positions
    body = struct.pack("<H", 8) + b"".join(struct.pack("<Q", s) for s in streams)
    reqs = b"".join(_raw_request(5, 8192, body)[:5] + struct.pack("<Q", 100 + i) + _raw_request(5, 8192, body)[13:]
                    for i in range(200))
    before = _rss()
    c.send_raw(reqs)
    import time

    time.sleep(1.0)  # the server has read what it will
    grown = _rss() - before
    assert grown < 40 << 20, f"the server took {grown >> 20} MB for answers nobody reads"
    got, ids = b"", []
    while len(ids) < 200:
        got += c.recv_raw(1 << 20, 10.0)
        while len(got) >= 4:
            (n,) = struct.unpack_from("<I", got)
            if len(got) < 4 + n:
                break
            _l, st, rid, _e, _p, _c = RESP.unpack_from(got)
            assert st == OK and n > 512 * 1024
            ids.append(rid)
            got = got[4 + n:]
    assert ids == [100 + i for i in range(200)]
    assert c.tail("pool", "log", 1)[0] == OK  # the connection goes on
