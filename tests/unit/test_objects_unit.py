"""The object layer's pure parts, with no cluster: the value codec (exact
round trips, damaged bytes refused with BadEntry, never a crash), the entry
header, the exactly-once sessions, and each object's apply against its own
model (deterministic: two replicas fed the same commands agree)."""
from __future__ import annotations

import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pyzlog
from pyzlog.objects import MISSING, BadEntry, Counter, Queue, Register, ReplicatedMap, UnsupportedEntry, WrongType
from pyzlog.objects import codec, entry
from pyzlog.objects.objects import MAP_CAS, MAP_DEL, MAP_PUT, Q_ACK, Q_CLAIM, Q_GET, Q_PUT, Q_RELEASE, _OP
from pyzlog.objects.sessions import Sessions

scalars = (st.none() | st.booleans() | st.integers(min_value=-(1 << 70), max_value=1 << 70)
           | st.floats(allow_nan=False) | st.text(max_size=300) | st.binary(max_size=300))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=5) | st.tuples(c, c)
                      | st.dictionaries(st.text(max_size=5) | st.integers(), c, max_size=5), max_leaves=30)


@given(values)
@settings(max_examples=300, deadline=None)
def test_codec_round_trips_exactly(v: object) -> None:
    back = codec.loads(codec.dumps(v))
    assert back == v and type(back) is type(v)
    assert codec.dumps(back) == codec.dumps(v)  # one form per value: replicas write the same bytes


def test_codec_keeps_missing_apart_from_none() -> None:
    assert codec.loads(codec.dumps(MISSING)) is MISSING
    assert codec.loads(codec.dumps([None, MISSING])) == [None, MISSING]
    assert repr(MISSING) == "MISSING" and not MISSING


@pytest.mark.parametrize("bad", [set(), object(), 1j, frozenset()])
def test_codec_refuses_what_it_does_not_carry(bad: object) -> None:
    with pytest.raises(pyzlog.InvalidRequest):
        codec.dumps(bad)


def test_codec_refuses_deep_nesting_both_ways() -> None:
    v: object = 1
    for _ in range(codec.MAX_DEPTH + 1):
        v = [v]
    with pytest.raises(pyzlog.InvalidRequest):
        codec.dumps(v)
    data = bytes([7]) + struct.pack("<I", 1)
    with pytest.raises(BadEntry):
        codec.loads(data * (codec.MAX_DEPTH + 2) + codec.dumps(1))


def _nested(depth: int) -> object:
    v: object = 1
    for _ in range(depth):
        v = [v]
    return v


def test_a_commands_values_leave_room_for_what_holds_them() -> None:
    """A key or value (dumps' default) nests at most ARG_DEPTH deep, so the
    checkpoint state or commit record that holds it (up to 6 levels more)
    still encodes and decodes. An adversary's find: a value 63 deep was
    taken, and from then on no checkpoint could be written."""
    deepest = _nested(codec.ARG_DEPTH)
    assert codec.loads(codec.dumps(deepest)) == deepest
    with pytest.raises(pyzlog.InvalidRequest, match=f"deeper than {codec.ARG_DEPTH}"):
        codec.dumps(_nested(codec.ARG_DEPTH + 1))
    state = {"objects": {"m": ["map", 1, [[deepest, deepest, 3]]]}}  # a checkpoint's shape, 5 levels down
    assert codec.loads(codec.dumps(state, codec.MAX_DEPTH)) == state
    with pytest.raises(pyzlog.InvalidRequest, match=f"deeper than {codec.MAX_DEPTH}"):
        codec.dumps(_nested(codec.MAX_DEPTH + 1), codec.MAX_DEPTH)


@pytest.mark.parametrize("bad", ["\ud800", ["ok", "\udfff"], {"k": "a\ud800b"}])
def test_a_str_that_is_not_unicode_is_a_clear_error(bad: object) -> None:
    """(an adversary's find: a raw UnicodeEncodeError from deep in the codec)"""
    with pytest.raises(pyzlog.InvalidRequest, match="not valid Unicode"):
        codec.dumps(bad)
    with pytest.raises(pyzlog.InvalidRequest, match="valid Unicode"):
        entry.stream_id("m\ud800")  # an object's name


@pytest.mark.parametrize("kw", [{"propose_timeout": float("nan")}, {"hole_wait": float("nan")},
                                {"follow": float("nan")}, {"propose_timeout": "10"}, {"hole_wait": -1},
                                {"propose_timeout": 0}, {"follow": 0}])
def test_a_runtime_refuses_odd_settings(kw: dict[str, object]) -> None:
    """An adversary's find: a NaN propose_timeout passed `<= 0` and a
    failing append was retried for ever."""
    from pyzlog import Log
    from pyzlog.objects import Runtime

    with pytest.raises(pyzlog.InvalidRequest):
        Runtime(Log.__new__(Log), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("data", [b"", b"\xff", b"\x05\xff\xff\xff\x7f", b"\x07\xff\xff\xff\xff",
                                  b"\x09\x01\x00\x00\x00\x07\x00\x00\x00\x00\x00",  # a list as a dict key
                                  b"\x0c\x02\xc3", codec.dumps(1) + b"\x00", b"\x03\x01"])
def test_codec_refuses_damaged_bytes(data: bytes) -> None:
    with pytest.raises(BadEntry):
        codec.loads(data)


@given(st.dictionaries(st.text(max_size=8), st.binary(max_size=20) | st.integers(), min_size=1, max_size=6))
@settings(max_examples=200, deadline=None)
def test_codec_refuses_every_cut_of_a_map(d: dict[str, object]) -> None:
    """A map's usual items (short str keys, short bytes values) have their own
    path through the decoder: every cut short form of them is refused, not
    read as a smaller map."""
    data = codec.dumps(d)
    assert codec.loads(data) == d
    for n in range(len(data)):
        with pytest.raises(BadEntry):
            codec.loads(data[:n])


_i64 = st.integers(-(1 << 63), (1 << 63) - 1)
_triples = st.lists(st.tuples(st.text(max_size=300), st.binary(max_size=300), _i64).map(list) | _i64, max_size=6)


def _reference_loads(data: bytes) -> object:
    """The codec's form read the plain way, in Python (the product decodes in
    C, native/codec.c): the value, or BadEntry for what must be refused."""
    T = codec  # the tags, as codec.py defines them

    def take(off: int, n: int) -> bytes:
        if off + n > len(data):
            raise IndexError
        return data[off:off + n]

    def dec(off: int, depth: int) -> tuple[object, int]:
        tag = data[off]
        off += 1
        if tag in (T._SSTR, T._SBYTES, T._STR, T._BYTES):
            short = tag in (T._SSTR, T._SBYTES)
            n = data[off] if short else struct.unpack("<I", take(off, 4))[0]
            off += 1 if short else 4
            raw = take(off, n)
            return (raw.decode() if tag in (T._SSTR, T._STR) else raw), off + n
        if tag == T._SINT:
            return struct.unpack("<b", take(off, 1))[0], off + 1
        if tag in (T._INT, T._FLOAT):
            return struct.unpack("<q" if tag == T._INT else "<d", take(off, 8))[0], off + 8
        if tag == T._BIGINT:
            n = int.from_bytes(take(off, 2), "little")
            return int.from_bytes(take(off + 2, n), "little", signed=True), off + 2 + n
        consts = {T._NONE: None, T._TRUE: True, T._FALSE: False, T._MISSING: MISSING}
        if tag in consts:
            return consts[tag], off
        if tag in (T._LIST, T._TUPLE, T._DICT):
            if depth >= codec.MAX_DEPTH:
                raise IndexError
            n = struct.unpack("<I", take(off, 4))[0]
            off += 4
            if n > len(data) - off:
                raise IndexError
            items = []
            for _ in range(n * (2 if tag == T._DICT else 1)):
                x, off = dec(off, depth + 1)
                items.append(x)
            if tag == T._DICT:
                return dict(zip(items[::2], items[1::2])), off
            return (items if tag == T._LIST else tuple(items)), off
        raise IndexError

    try:
        v, off = dec(0, 0)
    except (IndexError, UnicodeDecodeError, TypeError):
        return BadEntry
    return v if off == len(data) else BadEntry


def _loads_or_bad(data: bytes) -> object:
    try:
        return codec.loads(data)
    except BadEntry:
        return BadEntry


_flips = st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=3)


@given(v=values | _triples, flips=_flips)
@settings(max_examples=500, deadline=None)
def test_codec_reads_damaged_bytes_as_a_plain_reference_decoder_does(v: object, flips: list[tuple[int, int]]) -> None:
    """The C decoder reads any value, every cut short form of it and any
    bytes changed in it exactly as a plain decoder of the form does: the
    same value, or BadEntry from both. A map snapshot's items ([short str,
    short bytes, int]) and a session's seqs are what checkpoints hold most."""
    data = codec.dumps(v, codec.MAX_DEPTH)
    assert codec.loads(data) == v
    for n in range(len(data)):
        with pytest.raises(BadEntry):
            codec.loads(data[:n])
    bad = bytearray(data)
    for at, byte in flips:
        if bad:
            bad[at % len(bad)] = byte
    # by repr: a changed byte can make a float NaN, which equals nothing, itself included
    assert repr(_loads_or_bad(bytes(bad))) == repr(_reference_loads(bytes(bad)))


@given(st.binary(max_size=64))
@settings(max_examples=500, deadline=None)
def test_codec_reads_random_bytes_as_a_plain_reference_decoder_does(data: bytes) -> None:
    assert repr(_loads_or_bad(data)) == repr(_reference_loads(data))


def test_codec_takes_any_bytes_like_value_and_refuses_bad_offsets() -> None:
    data = codec.dumps({"k": [b"v", 7]})
    assert codec.loads(bytearray(data)) == codec.loads(memoryview(data)) == {"k": [b"v", 7]}
    assert codec.load_from(b"\x00" + data, 1) == ({"k": [b"v", 7]}, len(data) + 1)
    for off in (-1, len(data), len(data) + 1, 1 << 63):  # an offset read from damaged bytes
        with pytest.raises(BadEntry):
            codec.load_from(data, off)


@pytest.mark.parametrize("tag", [codec._LIST, codec._TUPLE, codec._DICT])
def test_nested_counts_that_claim_all_that_is_left_cost_no_memory_ahead(tag: int) -> None:
    """64 nested containers, each claiming a count of everything left (an
    adversary's find: a tuple's slots were made at the claimed size, 8 bytes
    per byte of input at each level, 2 GiB for 4 MiB). Refused with BadEntry,
    and the memory taken on the way is what the items read cost (the
    innermost count's million one-byte Nones: 8 bytes each in a list, and
    a tuple's copy of it), not 64 times that."""
    import tracemalloc
    size = 1 << 20
    head = b"".join(bytes([tag]) + struct.pack("<I", size - 5 * (i + 1)) for i in range(codec.MAX_DEPTH))
    data = head + b"\x00" * (size - len(head))
    tracemalloc.start()
    try:
        with pytest.raises(BadEntry):
            codec.loads(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 24 * size, f"{peak >> 20} MiB taken to refuse {size >> 20} MiB"


@given(values, values, st.binary(max_size=3))
@settings(max_examples=300, deadline=None)
def test_key_value_reads_what_the_general_decoder_reads(key: object, value: object, tail: bytes) -> None:
    """load_key_value (a put's key and value, with a fast path for short str
    keys and short bytes values) answers what load_from twice answers, and
    refuses with BadEntry what that refuses, bytes left over included."""
    data = b"\x10" + codec.dumps(key) + codec.dumps(value) + tail
    if tail:
        with pytest.raises(BadEntry):
            codec.load_key_value(data, 1)
        return
    k, v = codec.load_key_value(data, 1)
    assert (k, v) == (key, value) and type(k) is type(key) and type(v) is type(value)


@pytest.mark.parametrize("data", [
    codec.dumps("k")[:-1],                                  # the key cut short
    codec.dumps("k") + b"\x0d\x05ab",                       # the value cut short
    b"\x0c\x02\xc3\x28" + codec.dumps(b"v"),                # a key that is not UTF-8
    codec.dumps("k"),                                       # no value
    codec.dumps("k") + codec.dumps(b"v") + b"\x00",          # a byte left over
])
def test_key_value_refuses_damaged_puts(data: bytes) -> None:
    with pytest.raises(BadEntry):
        codec.load_key_value(data, 0)


# ------------------------------------------------------------------ header
def test_header_layout() -> None:
    h = entry.header(entry.CMD, 0x0102030405060708, 7, 3, 99)
    assert len(h) == entry.HEADER_SIZE == 37 and h[:2] == b"ZO" and h[2] == 1 and h[3] == entry.CMD
    got = entry.parse(h + b"payload")
    assert got == entry.Header(entry.CMD, 0, 0x0102030405060708, 7, 3, 99)
    assert entry.parse(b"raw bytes of someone else") is None and entry.parse(b"ZO") is None


def test_newer_entries_are_refused_not_skipped() -> None:
    with pytest.raises(UnsupportedEntry):
        entry.parse(entry.HEADER.pack(b"ZO", 3, 1, 0, 1, 1, 0, 0))
    with pytest.raises(UnsupportedEntry):
        entry.parse(entry.HEADER.pack(b"ZO", 1, 9, 0, 1, 1, 0, 0))


def test_stream_ids() -> None:
    assert entry.stream_id("users") == entry.stream_id("users") != entry.stream_id("users2")
    assert 0 < entry.stream_id("x") < 1 << 64
    for bad in ["", "x" * 201, 3, None]:
        with pytest.raises(pyzlog.InvalidRequest):
            entry.stream_id(bad)  # type: ignore[arg-type]


def test_id_lists() -> None:
    packed = entry.pack_u64s([1, 2, 1 << 63])
    assert entry.unpack_u64s(packed + b"rest", 0) == ([1, 2, 1 << 63], len(packed))
    with pytest.raises(BadEntry):
        entry.unpack_u64s(packed[:-1], 0)


# ---------------------------------------------------------------- sessions
def test_sessions_apply_each_proposal_once() -> None:
    s = Sessions()
    assert s.admit(1, 1, 1) and s.admit(1, 2, 1)
    assert not s.admit(1, 1, 1)            # a retried copy
    assert s.admit(1, 4, 1) and s.admit(1, 3, 1)  # out of order is fine
    assert not s.admit(1, 3, 5) and not s.admit(1, 2, 5)  # the lwm passed them
    assert s.admit(2, 1, 1)                # another client
    assert s.retire(1, [6, 5], 5) == [] and not s.admit(1, 6, 5)  # retired: never applied later
    assert s.retire(1, [4], 4) == [4]      # retiring one that was applied says so


def test_sessions_prune_and_snapshot_canonically() -> None:
    s, t = Sessions(), Sessions()
    rnd = random.Random(1)
    seqs = list(range(1, 2000))
    for q in seqs:
        s.admit(7, q, max(1, q - 10))
    shuffled = seqs[:]
    rnd.shuffle(shuffled)
    for q in sorted(shuffled):  # the same entries: the same state, whenever pruning ran
        t.admit(7, q, max(1, q - 10))
    assert s.snapshot() == t.snapshot()
    assert len(s.by_client[7].seen) < 200  # pruned below the lwm
    r = Sessions.restore(s.snapshot())
    assert r.snapshot() == s.snapshot() and not r.admit(7, 1990, 1989) and r.admit(7, 2000, 1990)


# ----------------------------------------------------------------- objects
def _apply(obj: object, payloads: list[bytes]) -> list[object]:
    return [obj.apply_payload(p, 0, i) for i, p in enumerate(payloads)]  # type: ignore[attr-defined]


def test_map_commands_and_versions() -> None:
    m = ReplicatedMap()
    d = codec.dumps
    out = _apply(m, [_OP[MAP_PUT] + d("a") + d(1), _OP[MAP_CAS] + d("a") + d(1) + d(2),
                     _OP[MAP_CAS] + d("a") + d(1) + d(3), _OP[MAP_CAS] + d("b") + d(MISSING) + d(9),
                     _OP[MAP_DEL] + d("a"), _OP[MAP_DEL] + d("a"), _OP[MAP_CAS] + d("b") + d(9) + d(MISSING)])
    assert out == [None, True, False, True, True, False, True]
    assert m.to_dict() == {}
    m.apply_payload(_OP[MAP_PUT] + d(("t", 1)) + d(b"v"), 0, 41)
    assert m.get(("t", 1)) == b"v" and m.version_of(("t", 1)) == 42 and m.version_of("zz") == 0
    m2 = ReplicatedMap()
    m2.restore(codec.loads(codec.dumps(m.snapshot())))
    assert m2.to_dict() == m.to_dict() and m2.version_of(("t", 1)) == 42
    with pytest.raises(WrongType):
        m.apply_payload(b"\x20" + d(1), 0, 50)
    with pytest.raises(BadEntry):
        m.apply_payload(_OP[MAP_PUT] + d("a") + d(1) + b"junk", 0, 51)


def test_queue_claims_are_exactly_once() -> None:
    q = Queue()
    d = codec.dumps
    assert _apply(q, [_OP[Q_PUT] + d("a"), _OP[Q_PUT] + d("b"), _OP[Q_PUT] + d("c")]) == [0, 1, 2]
    claim = lambda who, now: _OP[Q_CLAIM] + d(who) + d(1000) + d(now)  # noqa: E731
    assert q.apply_payload(claim("x", 0), 0, 10) == [0, "a"]
    assert q.apply_payload(claim("y", 500), 0, 11) == [1, "b"]        # x's claim has not run out
    assert q.apply_payload(claim("y", 1500), 0, 12) == [0, "a"]       # it has now: to y
    assert q.apply_payload(_OP[Q_ACK] + d(0) + d("x"), 0, 13) is False  # x lost it
    assert q.apply_payload(_OP[Q_ACK] + d(0) + d("y"), 0, 14) is True
    assert q.apply_payload(_OP[Q_ACK] + d(0) + d("y"), 0, 15) is False  # once
    assert q.apply_payload(_OP[Q_RELEASE] + d(1) + d("y"), 0, 16) is True
    assert q.apply_payload(_OP[Q_GET], 0, 17) == [1, "b"]             # released: back at the head
    assert q.apply_payload(_OP[Q_GET], 0, 18) == [2, "c"]
    assert q.apply_payload(_OP[Q_GET], 0, 19) is None


@given(st.lists(st.tuples(st.sampled_from(["put", "del", "cas"]), st.integers(0, 3), st.integers(0, 3)),
                max_size=60))
@settings(max_examples=200, deadline=None)
def test_replicas_fed_the_same_commands_agree(cmds: list[tuple[str, int, int]]) -> None:
    d = codec.dumps
    payloads = []
    for op, k, v in cmds:
        payloads.append(_OP[MAP_PUT] + d(k) + d(v) if op == "put" else _OP[MAP_DEL] + d(k) if op == "del"
                        else _OP[MAP_CAS] + d(k) + d(v) + d(v + 1))
    a, b = ReplicatedMap(), ReplicatedMap()
    assert _apply(a, payloads) == _apply(b, payloads)
    assert a.snapshot() == b.snapshot()
    model: dict[int, int] = {}
    for op, k, v in cmds:
        if op == "put":
            model[k] = v
        elif op == "del":
            model.pop(k, None)
        elif model.get(k) == v:
            model[k] = v + 1
    assert a.to_dict() == model


def test_counter_and_register() -> None:
    c, r = Counter(), Register()
    d = codec.dumps
    assert _apply(c, [b"\x20" + d(5), b"\x20" + d(-2), b"\x21" + d(10)]) == [5, 3, 10]
    with pytest.raises(BadEntry):
        c.apply_payload(b"\x20" + d("x"), 0, 0)
    assert _apply(r, [b"\x31" + d(None) + d("a"), b"\x31" + d(None) + d("b"), b"\x30" + d([1])]) == [True, False,
                                                                                                    None]
    assert r.value == [1]


def test_backpointer_sections_round_trip() -> None:
    plain = entry.header(entry.TXN, 5, 6, 7) + entry.pack_u64s([11, 12]) + b"body"
    pos = 10_000_000_000
    bps = [(11, 0, [pos - 1, pos - 5], [3]), (12, pos - 2, [], [])]  # a delta over 2**32 takes 8-byte width
    data = entry.with_backpointers(plain, pos, 16, bps)
    h = entry.parse(data)
    assert h is not None and h.flags & entry.FLAG_BACKPOINTERS and data[2] == entry.VERSION
    assert (h.kind, h.client, h.seq, h.lwm) == (entry.TXN, 5, 6, 7)
    k, sections, off = entry.parse_backpointers(data, pos)
    assert k == 16 and sections == {11: (0, [pos - 1, pos - 5], [3]), 12: (pos - 2, [], [])}
    assert off == entry.body_offset(data) and data[off:] == plain[entry.HEADER_SIZE:]
    assert entry.body_offset(plain) == entry.HEADER_SIZE
    with pytest.raises(BadEntry):
        entry.parse_backpointers(data[:entry.HEADER_SIZE + 10], pos)
    with pytest.raises(BadEntry):
        entry.body_offset(data[:entry.HEADER_SIZE + 10])
    with pytest.raises(BadEntry):  # a backpointer above the entry it is read at
        entry.parse_backpointers(data, 2)
    with pytest.raises(entry.InvalidRequest):
        entry.with_backpointers(plain, 5, 16, [(1, 0, [5], [])])  # not below the entry


def test_entry_backpointers_within_a_batch() -> None:
    from pyzlog.client.streams import entry_backpointers

    # the stream's entries so far are at 0, 10, 20, ... (ordinals 0..39); a batch of 8 at 1000..1007
    old = [10 * i for i in range(40)]
    levels = [(lv, old[(39 >> lv) << lv]) for lv in range(4, 7)]
    answer = [(7, 0, old[::-1][:16], 40, levels)]
    mine = old + list(range(1000, 1008))
    for i in range(8):
        (s, h, recent, far), = entry_backpointers(1000, i, 16, answer)
        me = 40 + i
        assert (s, h) == (7, 0) and recent == mine[:me][::-1][:16]
        want = []
        for lv in range(4, 7):
            m = ((me - 1) >> lv) << lv
            if m < me - 16 and (not want or mine[m] < want[-1]):
                want.append(mine[m])
        assert far == want
    assert entry_backpointers(20, 3, 0, answer) == [(7, 23, [], [])]  # slow tail finding: nothing known


@given(st.integers(0, 5000), st.integers(1, 300), st.integers(0, 40), st.sampled_from([0, 1, 4, 16, 20]))
@settings(max_examples=200, deadline=None)
def test_skip_pointers_worked_out_once_per_block_are_each_entrys_own(ordinal: int, n: int, known: int,
                                                                    k: int) -> None:
    """append_streams works skip pointers out once per block of ordinals
    (a memo per batch): every entry of a batch gets what it gets alone."""
    from pyzlog.client.streams import entry_backpointers

    old = [3 * i for i in range(ordinal)]  # the stream's positions so far
    levels = [(lv, old[((ordinal - 1) >> lv) << lv]) for lv in range(4, 14) if ordinal and known > lv]
    answer = [(7, 0, old[::-1][:16], ordinal, levels), (9, 5, [], 0, [])]
    first = 3 * ordinal + 10
    memo: dict[tuple[int, int], list[int]] = {}
    for i in range(n):
        assert entry_backpointers(first, i, k, answer, memo) == entry_backpointers(first, i, k, answer)


@pytest.mark.parametrize("key", [float("nan"), (1, float("nan")), ("a", (2.5, float("-nan")))],
                         ids=["nan", "in-a-tuple", "nested"])
def test_a_map_key_holding_a_nan_is_refused(key: object) -> None:
    """A NaN never equals itself: a key holding one was stored and could
    never be read back (each replica decodes a new NaN). Refused before
    anything is appended, so a runtime that never started will do."""
    from pyzlog import Log
    from pyzlog.objects import Runtime

    m = Runtime(Log.__new__(Log), client_id=9).map("m")
    for call in (lambda: m.put(key, 1), lambda: m.put_async(key, 1), lambda: m.cas(key, 1, 2),
                 lambda: m.delete(key)):
        with pytest.raises(pyzlog.InvalidRequest, match="NaN"):
            call()
    assert m.get((1, 2.0)) is None  # a float key without a NaN is a key like any other


@pytest.mark.parametrize("call", [
    "claim(lease=float('inf'))", "claim(lease=float('nan'))", "claim(lease=0)", "claim(lease=-1)",
    "claim(lease='5')", "claim(lease=None)", "claim(lease=True)", "claim(lease=2**62)",
    "claim(consumer=float('nan'))", "claim(consumer={})", "claim(consumer=7)",
    "ack('x')", "ack(None)", "ack(float('nan'))", "ack(1.9)", "release(1.9)", "ack(True)", "release(False)",
    "ack(1, consumer=b'me')",
])
def test_a_queue_refuses_bad_arguments_with_a_clear_error(call: str) -> None:
    """Each was taken: a lease of inf or '5' raised OverflowError or
    TypeError from inside the layer, ack(1.9) acknowledged item 1, a
    consumer named NaN held its claim for good (no name equals it), a lease
    of 2**62 s stored a deadline past the codec's 64-bit int. Refused before
    anything is appended, so a runtime that never started will do."""
    from pyzlog import Log
    from pyzlog.objects import Runtime

    q = Runtime(Log.__new__(Log), client_id=9).queue("q")
    with pytest.raises(pyzlog.InvalidRequest):
        eval(call, {"float": float}, {"claim": q.claim, "ack": q.ack, "release": q.release})
