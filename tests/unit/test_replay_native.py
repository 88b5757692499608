"""The replay loop's common entries are applied in C (native/replay.c,
pyzlog.objects._replay); the Python loop in Runtime._apply_rows takes the
rest. Replaying the same entries with the C part and with the Python loop
alone (the C part made to decline every entry) must leave the same state:
every object, version, session, stream seen, count and own result. The
entries mix what the C part takes with everything it must leave alone."""
from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import ctypes

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pyzlog.objects._replay as native
import pyzlog.objects.runtime as runtime_module
from pyzlog import Log, RowSet
from pyzlog.objects import ObjectsError, Runtime, entry
from pyzlog.objects.codec import dumps
from pyzlog.objects.objects import MAP_DEL, MAP_PUT, _OP
from pyzlog.objects.runtime import _Pending
from pyzlog.objects.sessions import Session

ME = 77
CLIENTS = [ME, 5, 6]
HOSTED = ["m1", "m2"]


def runtime() -> Runtime:
    # a Runtime that is never started needs no cluster: _apply_rows works on its state alone
    rt = Runtime(Log.__new__(Log), client_id=ME)
    for name in HOSTED:
        rt.map(name)
    rt.counter("c")
    return rt


KEYS = st.one_of(st.text(max_size=6), st.binary(max_size=4), st.integers(-5, 5))
VALUES = st.one_of(st.binary(max_size=8), st.binary(min_size=250, max_size=300), st.text(max_size=4), st.integers())
OBJECTS = st.sampled_from(HOSTED + ["c", "elsewhere"])

# the common entry (the C part's), drawn as often as all the others together
common = st.tuples(st.just("put"), st.sampled_from(HOSTED + ["elsewhere"]), st.text(max_size=6), st.binary(max_size=8))
one = st.one_of(
    common, common, common, common, common, common,
    st.tuples(st.just("put"), OBJECTS, KEYS, VALUES),
    st.tuples(st.just("del"), OBJECTS, KEYS),
    st.tuples(st.just("bad-key"), OBJECTS),  # a str key's bytes that are not UTF-8
    st.tuples(st.just("gap")),
    st.tuples(st.just("foreign")),
    st.tuples(st.just("noop"), OBJECTS),
)
# (client index, seq step: 0 repeats the last seq, -2 a late copy, lwm step, backpointer section or not, what);
# mostly the common case (the next seq, the lwm unmoved) so that runs of it reach the C part
steps = st.lists(st.tuples(st.integers(0, 2), st.sampled_from([1, 1, 1, 1, 1, 0, 2, -2]),
                           st.sampled_from([0, 0, 0, 0, 0, 1, 3]), st.booleans(), one),
                 min_size=20, max_size=80)


def build(plan: list[tuple[Any, ...]]) -> list[bytes | None]:
    seq = dict.fromkeys(CLIENTS, 0)
    lwm = dict.fromkeys(CLIENTS, 0)
    out: list[bytes | None] = []
    for pos, (ci, dseq, dlwm, bps, (what, *args)) in enumerate(plan):
        client = CLIENTS[ci]
        if dseq >= 0:
            seq[client] += dseq
            lwm[client] = min(lwm[client] + dlwm, seq[client])
        # dseq < 0: a late copy of an earlier proposal (a retried append), maybe below the lwm
        this = seq[client] + min(dseq, 0)
        if what == "gap":
            out.append(None)
            continue
        if what == "foreign":
            out.append(b"raw bytes of another application")
            continue
        stream = entry.stream_id(args[0]) if args else 0
        kind = entry.NOOP if what == "noop" else entry.CMD
        if what == "put":
            body = _OP[MAP_PUT] + dumps(args[1]) + dumps(args[2])
        elif what == "del":
            body = _OP[MAP_DEL] + dumps(args[1])
        elif what == "bad-key":
            body = _OP[MAP_PUT] + bytes((dumps("ab")[0], 2)) + b"\xff\xfe" + dumps(b"v")
        else:
            body = b""
        data = entry.header(kind, client, max(this, 0), lwm[client], stream) + body
        if bps:
            data = entry.with_backpointers(data, pos, 4, [(stream, 0, [p for p in (pos - 1, pos - 3) if p >= 0], [])])
        out.append(data)
    return out


def own_proposals(datas: list[bytes | None]) -> dict[int, bytes]:
    """What this runtime proposed under each of its seqs in `datas`: the
    first entry of ME with that seq, as proposed (no backpointer section);
    under every fifth seq something else, as if a runtime of the same client
    id had taken the seq first (its proposal is then NotApplied)."""
    own: dict[int, bytes] = {}
    for d in datas:
        if d is None or d[:2] != entry.MAGIC or len(d) < entry.HEADER_SIZE:
            continue
        _m, _v, kind, flags, client, seq, lwm, stream = entry.HEADER.unpack_from(d)
        if client != ME or seq in own:
            continue
        try:
            off = entry.body_offset(d) if flags & entry.FLAG_BACKPOINTERS else entry.HEADER_SIZE
        except ObjectsError:
            continue
        own[seq] = entry.header(kind, ME, seq, lwm, stream) + (d[off:] if seq % 5 else b"another incarnation's")
    return own


class Columns:
    """`datas` as a RowSet's columns (RowSet.columns): C arrays, kept here
    alive, of positions (from 0), data pointers (NULL for a gap, a
    "filled" row unless `kinds` says otherwise), lengths and kind codes."""

    def __init__(self, datas: list[bytes | None], kinds: list[str] | None = None) -> None:
        n = len(datas)
        self.datas = datas  # the bytes the pointers point into
        self.positions = (ctypes.c_uint64 * max(n, 1))(*range(n))
        self.data = (ctypes.c_void_p * max(n, 1))(*[None if d is None else ctypes.cast(ctypes.c_char_p(d),
                                                                                          ctypes.c_void_p).value
                                                     for d in datas])
        self.lens = (ctypes.c_uint32 * max(n, 1))(*[0 if d is None else len(d) for d in datas])
        codes = [RowSet.KIND_NAMES.index(kinds[i] if kinds else ("filled" if d is None else "data"))
                 for i, d in enumerate(datas)]
        self.kinds = (ctypes.c_uint8 * max(n, 1))(*codes)

    def columns(self) -> tuple[int, int, int, int]:
        return tuple(ctypes.addressof(a) for a in (self.positions, self.data, self.lens, self.kinds))  # type: ignore[return-value]


def replay(datas: list[bytes | None], python_only: bool, monkeypatch: pytest.MonkeyPatch,
           lwm_of_5: int | None = None, columns: bool = False) -> dict[str, Any]:
    rt = runtime()
    if lwm_of_5 is not None:  # a session as a checkpoint restored it
        rt._sessions.by_client[5] = Session(lwm_of_5)
    futures = {}
    own = own_proposals(datas)
    for s in range(1, 40):  # own proposals awaiting their result
        f: Future[Any] = Future()
        rt._pending[s] = _Pending(s, own.get(s, entry.header(entry.CMD, ME, s, 0, 0) + b"never sent"), f, 0.0)
        futures[s] = f
    taken = [0]
    real = runtime_module._apply_common
    real_columns = runtime_module._apply_common_columns

    def counted(*args: Any) -> tuple[int, int]:
        j, k = real(*args)
        taken[0] += k
        return j, k

    def counted_columns(*args: Any) -> tuple[int, int, int]:
        j, k, after = real_columns(*args)
        taken[0] += k
        return j, k, after

    cols = Columns(datas) if columns else None
    with monkeypatch.context() as m:
        m.setattr(runtime_module, "_apply_common", (lambda positions, datas, i, *rest: (i, 0)) if python_only else counted)
        m.setattr(runtime_module, "_apply_common_columns", counted_columns)
        stopped = None
        for lo in range(0, len(datas), 7):  # in chunks, as the player applies them
            chunk = datas[lo:lo + 7]
            positions = range(lo, lo + len(chunk)) if lo % 2 else list(range(lo, lo + len(chunk)))
            try:
                if cols is not None:  # the rows of one RowSet, in chunks of it
                    rt._apply_rows(rows=(cols, cols.columns(), lo, lo + len(chunk)))  # type: ignore[arg-type]
                else:
                    rt._apply_rows(positions, chunk, None)
            except ObjectsError as e:  # an entry this build cannot read stops the runtime there
                stopped = (type(e).__name__, str(e))
                break
    hosted = rt.hosted()
    return {
        "state": {name: (obj.snapshot(), obj.version) for name, obj in sorted(hosted.items())},
        "sessions": {c: (s.lwm, sorted(s.seen)) for c, s in rt._sessions.by_client.items()},
        "seen": sorted(rt._streams_seen),
        "stats": rt.stats,
        "applied": rt.applied,
        "stopped": stopped,
        "native": 0 if python_only else taken[0],
        "own": {s: (repr(f.exception()) if f.exception() else f.result()) if f.done() else "pending"
                for s, f in futures.items()},
    }


def replay_both(datas: list[bytes | None], monkeypatch: pytest.MonkeyPatch,
                lwm_of_5: int | None = None) -> tuple[dict[str, Any], int]:
    """The outcome of replaying `datas` with the C part, asserted equal to
    the Python loop's alone, and how many entries the C part applied."""
    fast = replay(datas, False, monkeypatch, lwm_of_5)
    slow = replay(datas, True, monkeypatch, lwm_of_5)
    from_columns = replay(datas, False, monkeypatch, lwm_of_5, columns=True)
    taken = fast.pop("native")
    assert from_columns.pop("native") == taken  # the same entries in C, from a RowSet's columns
    slow.pop("native")
    assert fast == slow
    assert from_columns == fast
    return fast, taken


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps, st.one_of(st.none(), st.integers(0, 79)), st.integers(3, 255))
def test_the_native_loop_applies_what_the_python_loop_applies(plan: list[tuple[Any, ...]], odd_at: int | None,
                                                              version: int) -> None:
    datas = build(plan)
    if odd_at is not None and odd_at < len(datas) and (d := datas[odd_at]) is not None and d[:2] == entry.MAGIC:
        datas[odd_at] = d[:2] + bytes((version,)) + d[3:]  # a version this build cannot read: the runtime stops
    with pytest.MonkeyPatch.context() as mp:
        TAKEN.append(replay_both(datas, mp)[1])


TAKEN: list[int] = []


def test_the_comparison_reached_the_native_loop() -> None:
    """(After the property test, in this module's order:) its examples
    had entries that the C part applied, thousands in all."""
    assert sum(1 for t in TAKEN if t) >= 20 and sum(TAKEN) >= 1000, (len(TAKEN), sum(TAKEN))


def test_the_native_loop_takes_the_common_entries() -> None:
    """Puts of short str keys and bytes values to hosted maps, and commands
    for objects hosted elsewhere, from known sessions: all in C."""
    rt = runtime()
    datas: list[bytes | None] = [entry.header(entry.NOOP, 5, 1, 0, 0)]  # the session, made by the Python loop
    for i in range(2, 50):
        name = HOSTED[i % 2] if i % 3 else "elsewhere"
        body = _OP[MAP_PUT] + dumps(f"k{i}") + dumps(b"v" * i)
        datas.append(entry.header(entry.CMD, 5, i, 0, entry.stream_id(name)) + body)
    rt._apply_rows(list(range(1)), datas[:1], None)
    j, k = native.apply_common(list(range(1, 50)), datas[1:], 0, rt._sessions.by_client, rt._objects,
                               rt._streams_seen, ME, rt._pending, rt._done)
    assert (j, k) == (48, 48)
    assert rt.hosted()["m2"].get("k49") == b"v" * 49 and rt.hosted()["m1"].version == 46 and entry.stream_id("elsewhere") in rt._streams_seen


def test_a_truncated_entry_with_a_backpointer_flag_is_a_damaged_entry() -> None:
    """An entry cut within its backpointer section (37 or 38 bytes, the flag
    set) is a BadEntry, told like any damaged entry, not an IndexError."""
    from pyzlog.objects.errors import BadEntry

    for cut in (entry.HEADER_SIZE, entry.HEADER_SIZE + 1, entry.HEADER_SIZE + 10):
        rt = runtime()
        data = entry.with_backpointers(entry.header(entry.CMD, 5, 1, 0, entry.stream_id("m1")), 9, 4,
                                       [(entry.stream_id("m1"), 0, [3], [])])[:cut]
        with pytest.raises(BadEntry):
            rt._apply_rows([9], [data], None)


def test_more_streams_than_the_native_loop_keeps_at_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C part keeps the objects of 16 streams at hand per call; a chunk
    that meets 40 (and the hosted maps between them) is applied the same."""
    datas: list[bytes | None] = [entry.header(entry.NOOP, 5, 1, 0, 0)]
    for i in range(2, 300):
        name = HOSTED[i % 2] if i % 5 == 0 else f"other-{i % 40}"
        datas.append(entry.header(entry.CMD, 5, i, 0, entry.stream_id(name)) + _OP[MAP_PUT] + dumps(f"k{i % 7}")
                     + dumps(bytes([i % 256]) * 3))
    fast, taken = replay_both(datas, monkeypatch)
    assert taken > 250 and len(fast["seen"]) == len({i % 40 for i in range(2, 300) if i % 5}) > 16


@pytest.mark.parametrize("lwm", [-1, 0, 3, 2**64 - 1, 2**64, 2**70])
def test_a_session_whose_lwm_is_no_u64_is_left_to_the_python_loop(lwm: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A damaged checkpoint may restore a session's lwm as any int: the C
    part leaves such a session's entries to the Python loop (found by an
    adversarial review: it raised OverflowError and stopped the runtime)."""
    datas: list[bytes | None] = [entry.header(entry.CMD, 5, s, 0, entry.stream_id("m1")) + _OP[MAP_PUT]
                                 + dumps(f"k{s}") + dumps(b"v") for s in range(1, 6)]
    replay_both(datas, monkeypatch, lwm)


def test_a_finalizer_that_empties_the_entries_mid_call_stops_the_native_loop_cleanly() -> None:
    """An allocation in the C part may start a garbage collection, whose
    finalizers may run any Python code: one that empties the list of
    entries ends the call at that point, instead of reading freed memory
    (found by an adversarial review: a segfault). Run in a subprocess so a
    crash fails this test rather than the suite."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import gc
        from pyzlog import Log
        from pyzlog.objects import Runtime, entry
        from pyzlog.objects.codec import dumps
        from pyzlog.objects.objects import MAP_PUT, _OP
        from pyzlog.objects.runtime import _apply_common
        from pyzlog.objects.sessions import Session
        rt = Runtime(Log.__new__(Log), client_id=77)
        rt.map("m1")
        rt._sessions.by_client[5] = Session(0)
        datas = [entry.header(entry.CMD, 5, i, 0, entry.stream_id("m1")) + _OP[MAP_PUT] + dumps(f"k{i}")
                 + dumps(b"x" * 100) for i in range(1, 3000)]
        class Cycle:
            def __del__(self):
                datas.clear()
        gc.collect()
        gc.set_threshold(100)
        c = Cycle()
        c.me = c
        del c
        j, k = _apply_common(list(range(1, 3000)), datas, 0, rt._sessions.by_client, rt._objects,
                             rt._streams_seen, 77, {}, [])
        assert j == k and 0 < j < 2999 and len(rt.hosted()["m1"]._data) == j, (j, k)
        print("ok", j)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0 and out.stdout.startswith("ok"), (out.returncode, out.stdout, out.stderr[-2000:])


@pytest.mark.parametrize("native_loop", [True, False], ids=["C", "python"])
def test_an_own_seq_taken_by_another_runtime_of_the_client_id_is_not_applied(native_loop: bool,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime started again with its client id while the last one's
    appends were on their way can meet that one's entry under a seq it has
    given a proposal of its own. The proposal is then NotApplied (never an
    acknowledgement with the other entry's result), whether the other entry
    comes while it is pending or before it was made and its own copy is a
    duplicate; the other entry is applied, as everywhere else."""
    from pyzlog.objects import NotApplied
    if not native_loop:
        monkeypatch.setattr(runtime_module, "_apply_common", lambda positions, datas, i, *rest: (i, 0))
    rt = runtime()
    m1 = entry.stream_id("m1")

    def put(seq: int, key: str, value: bytes) -> bytes:
        return entry.header(entry.CMD, ME, seq, 1, m1) + _OP[MAP_PUT] + dumps(key) + dumps(value)

    mine, theirs = Future[Any](), Future[Any]()
    rt._pending[2] = _Pending(2, put(2, "b", b"mine"), mine, 0.0)
    rt._apply_rows([0, 1], [put(1, "w", b"w"), put(2, "a", b"theirs")], None)  # the other runtime's seq 2
    assert isinstance(mine.exception(timeout=1), NotApplied)
    rt._pending[3] = _Pending(3, put(3, "c", b"mine"), theirs, 0.0)  # made after the other's seq 3 was applied
    rt._apply_rows([2, 3], [put(3, "d", b"theirs"), put(3, "c", b"mine")], None)
    assert isinstance(theirs.exception(timeout=1), NotApplied)
    assert rt.hosted()["m1"].items() == [("w", b"w"), ("a", b"theirs"), ("d", b"theirs")]
    ok = Future[Any]()
    rt._pending[4] = _Pending(4, put(4, "e", b"mine"), ok, 0.0)
    rt._apply_rows([4], [put(4, "e", b"mine")], None)
    assert ok.result(timeout=1) is None and rt.hosted()["m1"].get("e") == b"mine" and not rt._pending


def test_a_trimmed_row_of_a_rowset_stops_the_play_there_and_a_filled_one_is_a_gap() -> None:
    """Rows read from a RowSet's columns: a row of kind "trimmed" raises
    the runtime's trim signal at its position, with every row before it
    applied; "filled" and "lost" rows are gaps, as in a record batch."""
    from pyzlog.objects.streams import BehindTrim

    rt = runtime()
    m1 = entry.stream_id("m1")
    datas: list[bytes | None] = [entry.header(entry.NOOP, 5, 1, 0, 0)]
    datas += [entry.header(entry.CMD, 5, s, 0, m1) + _OP[MAP_PUT] + dumps(f"k{s}") + dumps(b"v") for s in range(2, 6)]
    datas += [None, None, None]
    datas += [entry.header(entry.CMD, 5, 9, 0, m1) + _OP[MAP_PUT] + dumps("k9") + dumps(b"v")]
    kinds = ["data"] * 5 + ["filled", "lost", "trimmed", "data"]
    cols = Columns(datas, kinds)
    with pytest.raises(BehindTrim) as e:
        rt._apply_rows((), [], None, (cols, cols.columns(), 0, len(datas)))  # type: ignore[arg-type]
    assert e.value.position == 7
    assert rt.applied == 7 and rt.stats.gaps == 2 and sorted(rt.hosted()["m1"]._data) == ["k2", "k3", "k4", "k5"]
    assert native.row_at(cols.columns(), len(datas), 7) == (7, None, RowSet.KIND_NAMES.index("trimmed"))
    assert native.row_at(cols.columns(), len(datas), 8)[1] == datas[8]
    with pytest.raises(IndexError):
        native.row_at(cols.columns(), len(datas), len(datas))


@pytest.mark.parametrize("columns", [(-8, -8, -8, -8), (2**64, 1, 1, 1), (0, 1, 1, 1), (1, 2, 3), (1.0, 2, 3, 4)])
def test_bad_columns_are_a_clean_error(columns: Any) -> None:
    """Addresses are checked as far as they can be: a negative or too large
    int, a null, a wrong count or type is an error, never read (an
    adversary's find: a negative address passed and crashed)."""
    with pytest.raises((TypeError, ValueError, OverflowError)):
        native.row_at(columns, 1, 0)
    with pytest.raises((TypeError, ValueError, OverflowError)):
        native.apply_common_columns(columns, 1, 0, {}, {}, set(), ME, {}, [])
