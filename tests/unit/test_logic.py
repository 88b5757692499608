"""The client's pure logic, with no cluster: where positions live, the gap
rule, the append rule, partition planning, option parsing."""
from __future__ import annotations

import errno

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyzlog
from pyzlog.client import reader
from pyzlog.client.appending import Outcome, judge, stored_form
from pyzlog.client.reader import HoleClock, check_stream_args
from pyzlog.core import wire
from pyzlog.core import layout
from pyzlog.core.layout import (by_object, check_name, check_position, data_oid, first_in_stride, oid_of, place_of,
                                stride_positions, view_end, view_of)
from pyzlog.core.wire import View


# ------------------------------------------------------------------ layout
VIEWS = (View(1, 0, 4), View(3, 10, 2), View(5, 30, 3))


def test_positions_map_to_the_object_of_their_view() -> None:
    assert view_of(VIEWS, 9) == VIEWS[0] and view_of(VIEWS, 10) == VIEWS[1] and view_of(VIEWS, 10**9) == VIEWS[2]
    assert oid_of("lg", VIEWS, 9) == "zlog.lg.1.1" and oid_of("lg", VIEWS, 11) == "zlog.lg.3.1"
    assert oid_of("lg", VIEWS, 31) == data_oid("lg", VIEWS[2], 1)
    assert [view_end(VIEWS, v) for v in VIEWS] == [10, 30, None]


@st.composite
def _views(draw: Any) -> tuple[View, ...]:
    """Views of rising start, each omap or data format (small stripes, so
    runs cross them; runs of 1 to 4 positions)."""
    starts = sorted(draw(st.sets(st.integers(1, 200), max_size=3)))
    views = []
    for epoch, start in enumerate([0, *starts], start=1):
        data = draw(st.booleans())
        unit = draw(st.integers(1, 4)) if data else 1
        views.append(View(epoch, start, draw(st.integers(1, 5)), wire.FORMAT_DATA if data else wire.FORMAT_OMAP,
                          slots=unit * draw(st.integers(1, 4)) if data else 0, unit=unit))
    return tuple(views)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 6), st.integers(1, 5), st.integers(1, 4))
def test_a_stripe_deals_every_position_to_one_object_in_runs(ss: int, width: int, unit: int, runs: int) -> None:
    """The stripe's positions, dealt by layout.index_of: each object holds
    `slots` of them, from its base, in runs of `unit` consecutive positions
    (unit 1: p % width); the slot, next/after/count helpers agree with the
    list, and with cls_zlog/ops.h (the class's and the data plane's
    definition) through the data plane's cffi module."""
    from pyzlog._dataplane import lib

    slots = unit * runs
    view = View(1, ss, width, wire.FORMAT_DATA, slots, 1 << 20, 1, unit)
    stripe = range(ss, ss + width * slots)
    held: dict[int, list[int]] = {i: [] for i in range(width)}
    for p in stripe:
        i = layout.index_of(view, p)
        assert i == lib.zlog_index_of(p, ss, width, unit)
        held[i].append(p)
    if unit == 1:
        assert all(layout.index_of(view, p) == p % width for p in stripe)
    for i, ps in held.items():
        base = layout.base_of(view, 0, i)
        assert len(ps) == slots and ps[0] == base == lib.zlog_base_of(ss, i, width, unit)
        assert all(b - a == 1 for k, (a, b) in enumerate(zip(ps, ps[1:])) if (k + 1) % unit)  # runs of `unit`
        for k, p in enumerate(ps):
            assert lib.zlog_object_holds(p - base, width, unit)
            assert lib.zlog_slot_of(p - base, width, unit) == k and lib.zlog_offset_of(k, width, unit) == p - base
            assert layout.held_after(base, width, unit, ps[0], k) == p
        for q in range(base, stripe.stop):
            own = [p for p in ps if p >= q]
            want = own[0] if own else None
            if want is not None:
                assert layout.next_held(base, width, unit, q) == want == base + lib.zlog_next_held(q - base, width, unit)
            assert layout.held_count(base, width, unit, base, q) == len([p for p in ps if p <= q])
            assert base + lib.zlog_prev_held(q - base, width, unit) == max(p for p in ps if p <= q)
    assert lib.zlog_geometry_ok(width, slots, unit) and not lib.zlog_geometry_ok(width, slots, 0)
    assert lib.zlog_geometry_ok(width, slots + 1, unit) == (unit == 1)  # slots a multiple of unit


@settings(max_examples=300, deadline=None)
@given(_views(), st.integers(0, 250), st.integers(0, 40), st.lists(st.integers(0, 300), max_size=30))
def test_grouping_by_object_places_each_position_as_place_of_does(views: tuple[View, ...], first: int, count: int,
                                                                  scattered: list[int]) -> None:
    """by_object (one Place per object, for batches) against place_of, position
    by position: a consecutive run (appends) and sorted positions with repeats
    (read_positions)."""
    for positions in (range(first, first + count), sorted(scattered)):
        groups = by_object("lg", views, positions)
        got = sorted((p, where) for where, ps in groups for p in ps)
        assert got == sorted((p, place_of("lg", views, p)) for p in positions)
        assert len({where.oid for where, _ in groups}) == len(groups)  # one group per object
        assert all(ps == sorted(ps) for _, ps in groups)
    for v in views:  # each object's share of a range of one view (Spark's backlog per object)
        lo = max(first, v.start)
        want = [0] * v.width
        for p in range(lo, lo + count):
            want[layout.index_of(v, p)] += 1
        assert layout.per_object_counts(v, lo, lo + count) == want
    if len(set(scattered)) > 1:  # out of order: refused, never grouped wrong
        with pytest.raises(pyzlog.InvalidRequest):
            by_object("lg", views, sorted(scattered, reverse=True))


@settings(max_examples=300, deadline=None)
@given(_views(), st.lists(st.integers(0, 400), max_size=60), st.integers(0, 5))
def test_positions_of_the_newest_view_are_grouped_in_c_as_the_layout_says(views: tuple[View, ...],
                                                                            offsets: list[int], repeat: int) -> None:
    """by_object's common case (every position in the newest view: a
    stream walk's reads) goes to native/layout.c: each group is one object's
    positions in order (repeats kept), the groups in the order of their
    first position, the Place that of its first position, and the ints the
    very objects given (no copy per position). Against a grouping written
    here from layout.stripe_of and index_of."""
    newest = views[-1]
    positions = sorted(newest.start + o for o in offsets + offsets[:repeat])
    want: dict[tuple[int, int], list[int]] = {}
    for p in positions:
        want.setdefault((layout.stripe_of(newest, p), layout.index_of(newest, p)), []).append(p)
    groups = by_object("lg", views, positions)
    assert [ps for _, ps in groups] == list(want.values())
    assert [where for where, _ in groups] == [place_of("lg", views, ps[0]) for ps in want.values()]
    given_ids = {id(p) for p in positions}
    assert all(id(p) in given_ids for _, ps in groups for p in ps)


@pytest.mark.parametrize("bad", [[5, 4], [1, 2**64], [1, -1], [1, "2"], [1, 2.0]],
                         ids=["unsorted", "past 64 bits", "negative", "a string", "a float"])
def test_grouping_refuses_what_is_not_sorted_positions(bad: list[Any]) -> None:
    """Bad input to the C grouping is InvalidRequest, never grouped wrong
    or an error from inside the extension."""
    with pytest.raises(pyzlog.InvalidRequest):
        by_object("lg", (View(1, 0, 3, wire.FORMAT_DATA, 8, unit=2),), bad)


class _Index:
    """Not an int, though it converts to one (as numpy's integers do)."""

    def __index__(self) -> int:
        return 5


@pytest.mark.parametrize("bad", [[True], [1.0], [-1], [wire.MAX_POSITION + 1], [2**64], ["1"], [_Index()], [[1]],
                                 [3, "x"]],
                         ids=["bool", "float", "negative", "past the last", "past 64 bits", "str", "__index__",
                              "unhashable", "unorderable"])
def test_a_list_of_positions_is_checked_as_one_position_is(bad: list[Any]) -> None:
    """check_positions (read_positions' input, native/layout.c's check)
    refuses what check_position refuses, naming the value, whatever its
    place in the list; a good list comes back sorted, each position once."""
    assert layout.check_positions([9, 0, wire.MAX_POSITION, 9]) == [0, 9, wire.MAX_POSITION]
    for positions in (bad, [0, *bad], [*bad, wire.MAX_POSITION]):
        with pytest.raises(pyzlog.InvalidRequest, match="bad position"):
            layout.check_positions(positions)
    if type(bad[0]) is not list:
        with pytest.raises(pyzlog.InvalidRequest):
            check_position(bad[-1])


def test_the_grouping_checks_its_view_arguments_and_survives_a_finalizer() -> None:
    """native/layout.c's group(): a width, unit, start or span out of its
    range is refused, never wrapped; and a finalizer that empties the
    output while it is being made (found through the collector) does not
    crash it (it once held borrowed pointers into that output)."""
    import subprocess
    import sys
    import textwrap

    from pyzlog.core._layout import group

    assert group([1, 2, 3], 0, 0, 2, 1) == [[1, 3], [2]]
    for args in ((0, 0, 2**32 + 2, 1), (0, 0, 2, -1), (2**64, 0, 2, 1), (0, 2**64 + 2, 2, 1), (0, 0, -2, 1)):
        with pytest.raises(OverflowError):
            group([1, 2, 3], *args)
    # in a fresh interpreter, where the collector's state is known (a crash kills only it)
    code = textwrap.dedent("""
        import gc
        from pyzlog.core._layout import group
        first = 10**18 + 7
        positions = [first + i for i in range(2000)]
        armed, emptied = [True], []
        class Emptier:
            def __init__(self):
                self.me = self  # a cycle: freed by a collection, which group()'s allocations run
            def __del__(self):
                if not armed[0]:
                    return
                for o in gc.get_objects():
                    if type(o) is list and o and type(o[0]) is list and o[0] and o[0][0] is positions[0]:
                        armed[0] = False
                        emptied.append(len(o))
                        o.clear()
                        return
                Emptier()
        gc.set_threshold(1, 1, 1)
        for _ in range(5):
            Emptier()
        got = group(positions, first, 0, 3, 1)
        armed[0] = False
        gc.set_threshold(700, 10, 10)
        assert all(ps == sorted(ps) for ps in got)
        print("emptied" if emptied else "no finalizer ran inside group()")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0 and out.stdout.strip() == "emptied", (out.returncode, out.stdout, out.stderr[-2000:])


@settings(max_examples=200, deadline=None)
@given(_views(), st.integers(0, 2**32 - 2), st.integers(0, 5))
def test_an_object_name_gives_back_its_place(views: tuple[View, ...], stripe: int, index: int) -> None:
    """place_named is data_oid's inverse, and names of no object of the view
    (another view or log, even one whose name extends this one's; a bad
    index; leading zeros) are None."""
    v = views[-1]
    stripe, index = (stripe if v.bounded else 0), index % v.width
    oid = data_oid("lg", v, index, stripe)
    assert layout.place_named("lg", v, oid) == layout.Place(oid, v, stripe, index)
    others = [data_oid("lg", w, index, stripe) for w in views[:-1]] + [data_oid("lg.1", v, index, stripe),
                                                                    data_oid("l", v, index, stripe)]
    bad_index = data_oid("lg", v, v.width, stripe)
    zeros = oid.rsplit(".", 1)[0] + ".0" + str(index) if v.bounded else f"zlog.lg.{v.epoch}.0{index}"
    for name in [*others, bad_index, zeros, oid + ".0", oid[:-1] + "x"]:
        assert layout.place_named("lg", v, name) is None, name


@pytest.mark.parametrize("start,end,stride", [(0, 40, 4), (7, 100, 3), (5, 6, 8), (9, 9, 2), (0, 1, 1)])
def test_stride_arithmetic(start: int, end: int, stride: int) -> None:
    for index in range(stride):
        want = [p for p in range(start, end) if p % stride == index]
        assert list(stride_positions(index, stride, start, end)) == want
        first = first_in_stride(start, index, stride)
        assert first >= start and first % stride == index and first - start < stride


@pytest.mark.parametrize("bad", ["", "-x", "a/b", "x" * 201, 3, None])
def test_bad_names(bad: object) -> None:
    with pytest.raises(pyzlog.InvalidRequest):
        check_name(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, wire.MAX_POSITION + 1, 1.0, "3", True])
def test_bad_positions(bad: object) -> None:
    with pytest.raises(pyzlog.InvalidRequest):
        check_position(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("kw", [{"stride": 0, "stride_index": 0}, {"stride": 2}, {"stride": 2, "stride_index": 2},
                                {"stride": 2.0, "stride_index": 0}, {"start": 5, "end": 4}, {"start": -1}])
def test_bad_stream_arguments(kw: dict) -> None:  # type: ignore[type-arg]
    args = {"start": 0, "end": None, "stride_index": None, "stride": None} | kw
    with pytest.raises(pyzlog.InvalidRequest):
        check_stream_args(args["start"], args["end"], args["stride_index"], args["stride"])


# ---------------------------------------------------------------- gap rule
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_hole_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(reader.time, "monotonic", clock)
    holes = HoleClock(2.0)
    assert holes.since(5, None, lambda: None) is None  # nothing later is stored: the tail
    assert holes.since(5, None, lambda: 4) is None  # only lower positions are
    first = holes.since(5, None, lambda: 9)  # 9 is stored: 5 is a hole from now
    assert first == 100.0 and holes.wait_for(first) > 0
    clock.now += 1.0
    assert holes.since(6, None, lambda: 9) == 100.0  # holes found together wait together
    clock.now += 1.5
    assert holes.wait_for(first) == 0  # its wait is over: fill it
    assert holes.since(12, 12, lambda: None) is None  # a view end is a bound for positions below it only
    assert holes.since(11, 12, lambda: None) == clock.now
    known = HoleClock(2.0, known_tail=50)  # a partitioned reader that knows the tail
    assert known.since(40, None, lambda: None) == clock.now and known.since(60, None, lambda: None) is None


def test_a_readers_durable_hole_clock_keeps_stored_bounds_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that reads in pieces shares what stays true (a stored
    position above, a view's end) across them, never a piece's known_tail:
    positions handed out by a sequencer's counter but not written are handed
    out again after a failover, and their new writers get a full hole_wait."""
    clock = Clock()
    monkeypatch.setattr(reader.time, "monotonic", clock)
    kept = HoleClock(2.0)
    piece = HoleClock(2.0, known_tail=30, durable=kept)
    asked: list[int] = []
    def top(value: int | None) -> Any:
        return lambda: asked.append(1) or value
    assert piece.since(10, None, top(20)) == 100.0  # stored up to 20: known now, and kept
    assert piece.since(25, None, top(20)) == 100.0  # below known_tail only: the piece's own
    clock.now += 5.0
    later = HoleClock(2.0, known_tail=40, durable=kept)
    assert later.since(12, None, top(20)) == 100.0 and asked == [1, 1]  # the kept bound covers 12: not asked
    assert later.since(25, None, top(None)) == 105.0  # the first piece's known_tail was not kept
    alone = HoleClock(2.0, durable=kept)
    assert alone.since(25, None, top(None)) is None and alone.since(15, None, top(None)) == 100.0
    assert alone.since(33, 35, top(None)) == 105.0 and kept.since(34, None, top(None)) == 105.0  # a view end is kept


def test_a_position_stored_past_the_counter_is_kept_only_up_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fill of a future position (past the sequencer's counter) does not
    make the positions below it handed out: the durable clock keeps the
    bound only up to the piece's known_tail, and the piece asks once per
    hole its known_tail already covers."""
    clock = Clock()
    monkeypatch.setattr(reader.time, "monotonic", clock)
    kept = HoleClock(2.0)
    piece = HoleClock(2.0, known_tail=30, durable=kept)
    asked: list[int] = []
    def top() -> int:
        asked.append(1)
        return 80  # filled past the counter (30)
    assert piece.since(10, None, top) == 100.0 and piece.since(10, None, top) == 100.0 and len(asked) == 1
    assert piece.since(40, None, top) == 100.0  # this piece's own reading of the stored 80
    clock.now += 5.0
    later = HoleClock(2.0, known_tail=60, durable=kept)
    assert later.since(40, None, top) == 105.0  # handed out since: a full hole_wait from now
    assert later.since(20, None, top) == 100.0  # below both 30 and 80: kept


# ------------------------------------------------------------- append rule
def test_judge() -> None:
    assert judge(0, "lg", 5) is Outcome.STORED
    assert judge(-errno.ESTALE, "lg", 5) is Outcome.STALE
    for taken in (errno.EROFS, errno.ENOMSG, errno.EIDRM):
        assert judge(-taken, "lg", 5) is Outcome.TAKEN
    for code, kind in ((errno.EFBIG, pyzlog.EntryTooLarge), (errno.EIO, pyzlog.Corrupt),
                       (errno.EDQUOT, pyzlog.PoolFull), (errno.ETIMEDOUT, pyzlog.Timeout)):
        with pytest.raises(kind):
            judge(-code, "lg", 5)


class FakeLog:
    def __init__(self, plain: bool) -> None:
        self.plain = plain

    def encode(self, data: bytes) -> bytes:
        return b"Z" + data


def test_stored_form() -> None:
    assert stored_form(FakeLog(True), b"abc") == b"abc"  # type: ignore[arg-type]
    assert stored_form(FakeLog(True), bytearray(b"abc")) == b"abc"  # type: ignore[arg-type]
    assert stored_form(FakeLog(False), b"abc") == b"Zabc"  # type: ignore[arg-type]
    with pytest.raises(pyzlog.InvalidRequest):
        stored_form(FakeLog(True), "text")  # type: ignore[arg-type]
    with pytest.raises(pyzlog.EntryTooLarge):
        stored_form(FakeLog(True), b"x" * (wire.MAX_ENTRY_BYTES + 1))  # type: ignore[arg-type]
    with pytest.raises(pyzlog.EntryTooLarge):  # within the limit, but not once encoded
        stored_form(FakeLog(False), b"x" * wire.MAX_ENTRY_BYTES)  # type: ignore[arg-type]


# ---------------------------------------------------------------- Spark
def test_partition_planning() -> None:
    pytest.importorskip("pyspark")
    from pyzlog.spark.plan import plan_partitions

    parts = plan_partitions(VIEWS, 5, 40, known_tail=38)
    covered = sorted(p for part in parts for p in part.positions())
    assert covered == list(range(5, 40))  # exactly the range, each position once
    assert all(part.known_tail == 38 for part in parts)
    assert {(p.epoch, p.width) for p in parts} == {(1, 4), (3, 2), (5, 3)}
    split = plan_partitions(VIEWS[:1], 0, 100, known_tail=100, min_partitions=10)
    assert len(split) >= 10 and sorted(p for part in split for p in part.positions()) == list(range(100))


@settings(max_examples=200, deadline=None)
@given(_views(), st.integers(0, 250), st.integers(0, 300), st.integers(0, 12))
def test_partitions_cover_the_range_once_in_runs_or_not(views: tuple[View, ...], start: int, count: int,
                                                        min_partitions: int) -> None:
    """A view in runs is cut into ranges of consecutive positions (stride 1),
    one per object of its width; one of unit 1 by object (stride = width);
    either way every position of the range exactly once."""
    pytest.importorskip("pyspark")
    from pyzlog.spark.plan import plan_partitions

    parts = plan_partitions(views, start, start + count, known_tail=start + count, min_partitions=min_partitions)
    covered = sorted(p for part in parts for p in part.positions())
    assert covered == list(range(start, start + count))
    for part in parts:
        v = next(v for v in views if v.epoch == part.epoch)
        assert (part.width, part.index) == (1, 0) if v.unit > 1 else part.width == v.width
        assert part.start < part.end and part.count() > 0


def test_spark_options(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("pyspark")
    from pyzlog.spark.options import parse_options

    conf = tmp_path / "ceph.conf"
    conf.write_text("[global]\n")
    opts = parse_options({"log": "events", "conf": str(conf), "startingOffsets": "12", "failOnDataLoss": "false",
                          "minPartitions": "3"})
    assert (opts.log, opts.starting, opts.on_data_loss, opts.min_partitions) == ("events", 12, "skip", 3)
    for bad in ({"conf": str(conf)}, {"log": "x", "conf": str(conf), "holeWait": "-1"},
                {"log": "x", "conf": str(conf), "subscribe": "t"}, {"log": "x", "conf": str(conf), "lgo": "y"},
                {"log": "x", "conf": str(tmp_path / "missing.conf")}):
        with pytest.raises(ValueError):
            parse_options(bad)


def test_command_line_usage_errors() -> None:
    from click.testing import CliRunner

    from pyzlog.admin.cli import cli

    runner = CliRunner()
    assert runner.invoke(cli, ["--help"]).exit_code == 0
    bad = runner.invoke(cli, ["create", "x", "--width", "0"])
    assert bad.exit_code == 2 and "width" in bad.output
    assert runner.invoke(cli, ["no-such-command"]).exit_code == 2


@given(st.integers(min_value=1, max_value=3600))
def test_every_op_is_seen_laggy_before_it_times_out(op_timeout: int) -> None:
    """pyzlog.connect's objecter settings: some tick falls in every op's
    window between 'laggy' (objecter_timeout) and its timeout, so a client
    asks for a newer OSD map before giving up on an op (the network fault
    test test_net_client_learns_that_a_cut_off_osd_is_down shows why)."""
    from pyzlog.core.cluster import laggy_settings
    s = laggy_settings(op_timeout)
    laggy, tick = float(s["objecter_timeout"]), float(s["objecter_tick_interval"])
    assert 0 < tick and laggy + tick < op_timeout
    assert laggy <= 10 and tick <= 5  # never later than librados' defaults
