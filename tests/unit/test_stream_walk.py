"""streams.walk() against a full scan, on an in-memory log and sequencer
(walkmodel.py): whatever the sequencer restarts, holes, transactions across
streams, entries of other layers and read ranges, a stream-only reader
finds exactly the entries a full scan finds, in order, and no other
stream's entry outside a scanned range. Plus what the walk costs: it
parses only the links of each chain, also when a link is a hole."""
from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyzlog.objects import entry
from pyzlog.objects.streams import WalkStats, walk

from walkmodel import FILLED, K, ModelLog, names, oracle

IDS = [entry.stream_id(n) for n in "abcd"]

stream_sets = st.lists(st.sampled_from(IDS), min_size=1, max_size=3, unique=True)
step = st.one_of(
    st.tuples(st.just("append"), stream_sets, st.text("wwwwwwwwd", min_size=1, max_size=40)),
    st.tuples(st.just("run"), st.sampled_from(IDS[:2]), st.integers(1, 80)),  # one at a time
    st.tuples(st.just("restart")),
    st.tuples(st.just("forget")),
    st.tuples(st.just("foreign"), st.integers(1, 5)),
    st.tuples(st.just("fill"), st.integers(0, 10**6)),
    st.tuples(st.just("slow"), stream_sets, st.integers(1, 4)),
)


def build(steps: list[tuple[Any, ...]], history: tuple[int, int] = (0, 0)) -> ModelLog:
    log = ModelLog(*history)
    for s in steps:
        if s[0] == "append":
            log.append(s[1], s[2])
        elif s[0] == "run":
            for _ in range(s[2]):
                log.append([s[1]], "w")
        elif s[0] == "restart":
            log.restart()
        elif s[0] == "forget":
            log.forget()
        elif s[0] == "foreign":
            log.foreign(s[1])
        elif s[0] == "fill":
            holes = [p for p in range(log.seq.counter) if p not in log.data]
            if holes:
                log.fill(holes[s[1] % len(holes)])
        elif s[0] == "slow":
            log.slow_append(s[1], s[2])
    return log


#: the sequencer's STREAM_HISTORY: none (an older zlog-seqr), short with a small
#: budget (histories cut, streams that find the budget spent get none), ample
histories = st.sampled_from([(0, 0), (24, 60), (40, 100), (8192, 1 << 22)])


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(step, min_size=1, max_size=14), st.sets(st.integers(0, 3), min_size=1, max_size=2),
       st.floats(0, 1), st.floats(0, 1), st.integers(0, 4), histories)
def test_walk_finds_what_a_full_scan_finds(steps: list[tuple[Any, ...]], wanted_at: set[int], lo_f: float,
                                           hi_f: float, known_every: int, history: tuple[int, int]) -> None:
    log = build(steps, history)
    tail = log.seq.counter
    wanted = sorted({IDS[i] for i in wanted_at})
    lo = int(lo_f * (tail + 3))
    hi = lo + int(hi_f * (tail + 5 - lo))  # below the tail too
    stored = sorted(p for p, d in log.data.items() if isinstance(d, bytes))
    known = {p: log.data[p] for i, p in enumerate(stored)  # own entries at hand (a proposer's)
             if known_every and (i * 7919 + known_every) % 5 == 0 and p >= lo}
    ps, datas, kinds, end = walk(log, wanted, lo, hi, known, 0.0, WalkStats())  # type: ignore[arg-type]
    assert end == max(lo, min(hi, tail))
    assert ps == sorted(set(ps)) and all(lo <= p < end for p in ps)
    w = set(wanted)
    mine = [p for p, d in zip(ps, datas) if names(d, p, w)]
    if kinds is None:  # nothing scanned: every entry handed back is the streams'
        assert mine == ps
    for p, d in zip(ps, datas):
        assert d is None or log.data.get(p) == d
    assert mine == oracle(log, w, lo, end)
    # what it vouched for cannot change: a sequencer starting now counts from `end` on
    assert end <= lo or log.max_stored() >= end - 1


def test_a_long_stream_is_walked_parsing_one_entry_in_about_eight() -> None:
    """1,024 entries of one stream: the chain down from the oldest recent
    position and the skip pointers' lattice are parsed, the rest only
    checked; the rounds of reads grow as the log of the length."""
    log = ModelLog()
    for _ in range(1024):
        log.append([IDS[0]], "w")
    st = WalkStats()
    ps, _datas, kinds, end = walk(log, [IDS[0]], 0, 1024, None, 0.0, st)  # type: ignore[arg-type]
    assert ps == list(range(1024)) and kinds is None and end == 1024
    assert st.parsed <= 1024 // 8 + 16 and st.rounds <= 8 and st.scans == 0, st


def test_a_hole_where_a_chain_goes_on_is_stepped_over() -> None:
    """The sequencer's oldest recent position (the one link its answer
    leads to, and the skip pointers' target) is a dead writer's hole: the
    next newer recent position leads on instead, so the walk still parses
    one entry in about eight and takes no more rounds than with no hole
    (found by an adversarial review: it used to parse every entry)."""
    for n in (96, 400, 1024):
        log = ModelLog()
        for i in range(n):
            log.append([IDS[0]], "d" if i == n - 16 else "w")
        st = WalkStats()
        ps, _datas, _kinds, end = walk(log, [IDS[0]], 0, n, None, 0.0, st)  # type: ignore[arg-type]
        assert ps == [p for p in range(n) if p != n - 16] and end == n
        assert st.parsed <= n // 8 + 16 and st.scans == 0, (n, st)


def test_with_the_sequencers_history_a_stream_is_found_in_one_round() -> None:
    """STREAM_HISTORY: the sequencer answers a stream's last positions (up to
    8,192): one round of reads finds them all, and only the oldest (the
    chain's link, which vouches down to the horizon) is parsed."""
    log = ModelLog(history=8192, budget=1 << 22)
    for _ in range(1024):
        log.append([IDS[0]], "w")
        log.append([IDS[1]], "ww")
    mine = [p for p in range(3 * 1024) if p % 3 == 0]
    st = WalkStats()
    ps, _datas, kinds, end = walk(log, [IDS[0]], 0, 3 * 1024, None, 0.0, st)  # type: ignore[arg-type]
    assert ps == mine and kinds is None and end == 3 * 1024
    assert st.rounds == 1 and st.read == 1024 and st.parsed <= 2 and st.scans == 0, st


@pytest.mark.parametrize("damage", ["repeat", "out of order", "both"])
def test_a_history_with_repeats_or_out_of_order_is_read_once_in_order(damage: str) -> None:
    """The walk's first round is the history sorted (newest first, it is
    one run): a sequencer's list with a position twice or out of order must
    not make it read a position twice or out of order, nor change what it
    finds."""
    log = ModelLog(history=8192, budget=1 << 22)
    for _ in range(300):
        log.append([IDS[0]], "w")
        log.append([IDS[1]], "ww")
    mine = [p for p in range(900) if p % 3 == 0]
    real = log.stream_tail

    def damaged(streams: list[int], history: int = 0) -> Any:
        tail, k, answer, epoch = real(streams, history)
        s, horizon, back, ordinal, levels = answer[0]
        back = list(back)
        if damage in ("repeat", "both"):
            back.insert(5, back[7])
        if damage in ("out of order", "both"):
            back[2], back[9] = back[9], back[2]
        return tail, k, [(s, horizon, back, ordinal, levels)], epoch

    log.stream_tail = damaged  # type: ignore[method-assign]
    st = WalkStats()
    ps, _datas, _kinds, end = walk(log, [IDS[0]], 0, 900, None, 0.0, st)  # type: ignore[arg-type]
    assert ps == mine and end == 900
    first = log.reads[0]
    assert first == sorted(set(first)) and set(mine) <= set(first)


def test_a_cut_history_goes_on_down_the_chain() -> None:
    """A history cut short (per stream, or by the server's budget, which a
    stream made after it was spent finds empty) vouches only down to its
    oldest position: the walk goes on from there by backpointers and still
    finds every entry, with no scan."""
    log = ModelLog(history=100, budget=150)
    for _ in range(120):
        log.append([IDS[0]], "w")  # a history of 100 (its cap), then its oldest give way
    for _ in range(60):
        log.append([IDS[1]], "w")  # the budget's last 50, then its oldest give way
    for _ in range(500):
        log.append([IDS[0]], "w")
        log.append([IDS[1]], "w")
        log.append([IDS[2]], "w")  # none left for it: recent positions only
    assert [len(h) for h in log.seq.history_of(IDS[:3], 8192)] == [100, 50, 0]
    for sid in IDS[:3]:
        st = WalkStats()
        ps, _datas, kinds, end = walk(log, [sid], 0, 1680, None, 0.0, st)  # type: ignore[arg-type]
        assert ps == oracle(log, {sid}, 0, 1680) and len(ps) in (620, 560, 500) and kinds is None, st
        assert end == 1680
        assert st.scans == 0 and st.rounds > 1, st


def test_many_holes_a_history_lists_are_read_as_one_range() -> None:
    """A history lists a batch whose writer died (or is still writing): its
    100 positions are read with one stream_batches over the range they span,
    not one call each; a few holes are still read one by one."""
    for dead, calls in ((100, 1), (3, 3)):
        log = ModelLog(history=8192, budget=1 << 22)
        for _ in range(200):
            log.append([IDS[0]], "w")
            log.append([IDS[1]], "w")
        log.append([IDS[0]], "d" * dead)
        log.append([IDS[0]], "w")
        st = WalkStats()
        ps, _datas, kinds, end = walk(log, [IDS[0]], 0, log.seq.counter, None, 0.0, st)  # type: ignore[arg-type]
        assert ps == oracle(log, {IDS[0]}, 0, end) and len(ps) == 201 and st.scans == 0, st
        assert len(log.scans) == calls, log.scans


def test_a_walk_whose_last_position_is_stored_asks_no_max_position() -> None:
    """The first round also reads hi - 1, whoever's it is: found written or
    filled, what the answer vouches for is stored up to hi (a sequencer that
    starts later counts from past it), so max_position's round trip is not
    needed. Found unwritten (a writer in flight or dead), it is asked, and
    the positions above it are scanned with the hole rules (filled here)."""
    log = ModelLog(history=8192, budget=1 << 22)
    for _ in range(50):
        log.append([IDS[0]], "w")
        log.append([IDS[1]], "w")
    st = WalkStats()
    ps, _d, kinds, end = walk(log, [IDS[0]], 0, 100, None, 0.0, st)  # type: ignore[arg-type]
    assert ps == list(range(0, 100, 2)) and kinds is None and end == 100
    assert log.max_position_calls == 0 and st.read == 50 and 99 in log.reads[0], (st, log.reads)
    log.fill(100)
    log.seq.counter = 101  # a filled hole at the end vouches as well as an entry
    walk(log, [IDS[0]], 0, 101, None, 0.0, WalkStats())  # type: ignore[arg-type]
    assert log.max_position_calls == 0
    log.append([IDS[1]], "wd")  # the last position handed out, not written
    ps, _d, kinds, end = walk(log, [IDS[0]], 0, 103, None, 0.0, WalkStats())  # type: ignore[arg-type]
    assert log.max_position_calls == 1 and end == 103 and log.data[102] == FILLED
    assert [p for p, k in zip(ps, kinds or []) if k == "data" and p % 2 == 0][:50] == list(range(0, 100, 2))


def test_a_walk_past_the_tail_stops_there_and_fills_nothing_beyond() -> None:
    """past_tail (hi beyond what was handed out, a waiter's position): the
    walk ends at the sequencer's tail, or with no sequencer answering at the
    position after the highest stored, and leaves every position past it
    alone (a fill there would burn a position before its writer comes)."""
    log = ModelLog(history=8192, budget=1 << 22)
    for _ in range(20):
        log.append([IDS[0]], "w")
    log.append([IDS[0]], "dd")  # handed out, writers in flight
    ps, _d, _k, end = walk(log, [IDS[0]], 0, 1000, None, 0.0, WalkStats(), past_tail=True)  # type: ignore[arg-type]
    assert end == 22 and [p for p in ps if p < 20] == list(range(20))
    log.seq.counter += 5  # handed out since, not written
    log.seqr_down = True
    before = dict(log.data)
    ps, _d, _k, end = walk(log, [IDS[0]], 0, 1000, None, 0.0, WalkStats(), past_tail=True)  # type: ignore[arg-type]
    assert end == log.max_stored() + 1 == 22 and all(p < 22 for p in log.data) and \
        {p: d for p, d in log.data.items() if p < 20} == {p: d for p, d in before.items() if p < 20}


def test_a_walk_past_the_tail_takes_no_tail_from_a_sequencer_the_log_moved_past() -> None:
    """past_tail, and the answer comes from a sequencer the log has moved
    past (paused, or the log sealed without it): it names positions that
    were handed out then and never written, which the next sequencer hands
    out again. The walk sees the epoch moved and scans by what is stored
    only: it ends where the stored entries end and fills none of them."""
    log = ModelLog(history=8192, budget=1 << 22)
    for _ in range(20):
        log.append([IDS[0]], "w")
    old = log.seq
    log.append([IDS[1]], "ddddd")  # 20..24 handed out, their writers died
    log.restart()  # the log moves on: the next sequencer counts from 20 again
    assert log.seq.counter == 20

    def stale_answer(streams: list[int], history: int = 0) -> tuple[int, int, list[Any], int]:
        _pos, answer = old.answer(streams, 0)
        return old.counter, K, answer, log.epoch - 1

    log.stream_tail = stale_answer  # type: ignore[method-assign]
    ps, _d, _k, end = walk(log, [IDS[0]], 0, 1000, None, 0.0, WalkStats(), past_tail=True)  # type: ignore[arg-type]
    assert end == 20 and ps == list(range(20)) and log.max_stored() == 19


def _check_stream_in_python(batch: list[int], got: dict[int, Any], single: bytes, lead: set[int], hi: int,
                            light: dict[int, bytes], found: dict[int, bytes]) -> list[int]:
    """The comprehension native check_stream replaced, as the walk had it."""
    ok = {p: data for p in batch
          if type(data := got.get(p)) is bytes and data.startswith(single, 38)
          and data.startswith(entry.MAGIC) and data[4] & entry.FLAG_BACKPOINTERS and p not in lead}
    light.update(ok)
    found.update((p, d) for p, d in ok.items() if p < hi)
    return [p for p in batch if p not in ok]


def _walk_entry(stream: int, streams_named: int, flags: int, magic: bytes, cut: int) -> bytes:
    data = bytearray(entry.header(entry.CMD, 1, 1, 0, stream))
    data[:2] = magic
    data[4] = flags
    data += bytes([4, streams_named]) + stream.to_bytes(8, "little") + b"\x00" * 30  # K, then the section's head
    return bytes(data[:cut])


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60),
                          st.one_of(st.integers(-70, 0),
                                    st.builds(_walk_entry, st.sampled_from([7, 8, 2**64 - 1]), st.sampled_from([1, 2]),
                                              st.sampled_from([0, entry.FLAG_BACKPOINTERS, 0xFF]),
                                              st.sampled_from([entry.MAGIC, b"XX"]), st.integers(0, 90)))),
                max_size=40),
       st.sampled_from([7, 2**64 - 1]), st.sets(st.integers(0, 60)), st.integers(0, 61), st.sets(st.integers(0, 60)))
def test_the_native_light_check_agrees_with_the_python_one(rows: list[tuple[int, Any]], stream: int,
                                                           lead: set[int], hi: int, asked: set[int]) -> None:
    from pyzlog.objects._replay import check_stream

    got = dict(rows)
    batch = sorted(asked | set(got))
    single = b"\x01" + stream.to_bytes(8, "little")
    light_c: dict[int, bytes] = {1000: b"kept"}
    found_c: dict[int, bytes] = {}
    light_py, found_py = dict(light_c), dict(found_c)
    rest_c = check_stream(batch, got, single, lead, hi, light_c, found_c)
    rest_py = _check_stream_in_python(batch, got, single, lead, hi, light_py, found_py)
    assert (rest_c, light_c, found_c) == (rest_py, light_py, found_py)
