"""scan.ViewScan against a fake completion queue: the walk of one view's
objects into Arrow batches, with replies that arrive out of order, are cut
short, fail, or are abandoned. The windows are real (RangeWindow.parse of
protocol 1 replies built here), so only the cluster is missing."""
from __future__ import annotations

import errno
import itertools
import struct
from typing import Any

import pytest

import pyzlog
from pyzlog.core.errors import error_for
from pyzlog.core.native import Op
from pyzlog.core import scan as scan_mod
from pyzlog.core.scan import STOP_END, STOP_MISSING, RangeWindow, ViewScan

WRITTEN, FILLED, TRIMMED = 1, 2, 3


class FakeConn:
    op_timeout = 1.0

    def error(self, code: int, what: str, **kw: Any) -> pyzlog.ZlogError:
        return error_for(code, what)


class FakeQueue:
    """Answers read_range from objects kept here, in the order `wait` picks."""

    def __init__(self, objects: dict[bytes, dict[int, tuple[int, bytes]]], trim_below: int = 0,
                 reverse: bool = False) -> None:
        self.objects = objects
        self.trim_below = trim_below
        self.reverse = reverse  # hand results back newest first
        self.conn = FakeConn()
        self.tags = itertools.count()
        self.pending: list[tuple[int, int, Any]] = []
        self.calls: list[tuple[bytes, int, int]] = []
        self.fail: dict[int, int] = {}  # call number -> code

    def submit(self, pool: Any, oid: bytes, op: int, tag: int, **f: Any) -> None:
        assert op == Op.READ_RANGE
        n = len(self.calls)
        self.calls.append((oid, f["position"], f["last"]))
        if n in self.fail:
            self.pending.append((tag, self.fail[n], None))
            return
        self.pending.append((tag, 0, self.reply(oid, f["epoch"], f["position"], f["last"], f["max_entries"],
                                                f["max_bytes"])))

    def reply(self, oid: bytes, epoch: int, first: int, last: int, n: int, nbytes: int) -> RangeWindow:
        entries = self.objects.get(oid, {})
        rows, size, nxt = [], 0, last + 1
        for p in sorted(x for x in entries if max(first, self.trim_below) <= x <= last):
            state, data = entries[p]
            if rows and size + len(data) > nbytes:
                nxt = p
                break
            rows.append(struct.pack("<QBQI", p, state, epoch, len(data)) + data)
            size += len(data)
            if len(rows) == n:
                nxt = p + 1
                break
        top = max(entries, default=None)
        head = struct.pack("<QBQQI", self.trim_below, top is not None, top or 0, nxt, len(rows))
        return RangeWindow.parse(head + b"".join(rows), first, 1)

    def wait(self, timeout: float | None = None, max_results: int | None = None) -> list[tuple[int, int, Any]]:
        out = list(reversed(self.pending)) if self.reverse else list(self.pending)
        self.pending.clear()
        return out

    def close(self) -> None:
        self.pending.clear()


def striped(width: int, entries: dict[int, tuple[int, bytes]]) -> dict[bytes, dict[int, tuple[int, bytes]]]:
    objs: dict[bytes, dict[int, tuple[int, bytes]]] = {b"o%d" % i: {} for i in range(width)}
    for p, e in entries.items():
        objs[b"o%d" % (p % width)][p] = e
    return objs


def rows(scan: ViewScan) -> list[tuple[int, str, bytes | None]]:
    return [(r["position"], r["kind"], r["data"]) for b in scan.batches() for r in b.to_pylist()]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("per_call,call_bytes", [(1024, 1 << 20), (2, 1 << 20), (1024, 3)])
def test_walks_a_view_in_order_whatever_the_replies(reverse: bool, per_call: int, call_bytes: int) -> None:
    log = {p: (WRITTEN, b"d%d" % p) for p in range(40)}
    log[7] = (FILLED, b"")
    log[9] = (FILLED, b"\x01")  # a hole a reader filled as lost
    log[11] = (TRIMMED, b"")
    del log[30]  # a hole: the scan stops there; what it is is its caller's call
    q = FakeQueue(striped(4, log), trim_below=2, reverse=reverse)
    scan = ViewScan(q, None, [b"o0", b"o1", b"o2", b"o3"], 1, 0, 100, per_call=per_call,  # type: ignore[arg-type]
                    call_bytes=call_bytes)
    got = rows(scan)
    assert [p for p, _, _ in got] == list(range(30)) and scan.position == 30
    assert got[0] == (0, "trimmed", None) and got[2] == (2, "data", b"d2")
    assert (got[7][1], got[9][1], got[11][1]) == ("filled", "lost", "trimmed")
    scan.refresh_max()
    assert scan.max_position() == 39  # a later position is stored: 30 is below the tail
    scan.skip()
    assert [p for p, _, _ in rows(scan)] == list(range(31, 40))


def test_one_object_of_a_view_and_a_bounded_range() -> None:
    log = {p: (WRITTEN, b"x") for p in range(100)}
    q = FakeQueue(striped(4, log))
    scan = ViewScan(q, None, [b"o0", b"o1", b"o2", b"o3"], 1, 5, 60, step=4)  # type: ignore[arg-type]
    assert [p for p, _, _ in rows(scan)] == list(range(5, 60, 4))
    assert {oid for oid, _, _ in q.calls} == {b"o1"}  # only the object asked for is read
    assert scan.next_batch().stop == STOP_END


def test_a_failed_reply_raises_its_error_and_the_walk_goes_on_where_it_stopped() -> None:
    log = {p: (WRITTEN, b"x%d" % p) for p in range(50)}
    q = FakeQueue(striped(2, log))
    q.fail[3] = -errno.ESTALE  # a read-ahead call is refused
    scan = ViewScan(q, None, [b"o0", b"o1"], 1, 0, 50, per_call=8)  # type: ignore[arg-type]
    seen: list[int] = []
    with pytest.raises(pyzlog.StaleEpoch):
        for b in scan.batches():
            seen += b.column(0).to_pylist()
    scan.epoch = 2  # the caller refreshed its view
    seen += [p for p, _, _ in rows(scan)]
    assert seen == list(range(50))  # nothing lost, nothing twice


def test_forget_from_reads_again_and_late_replies_are_ignored() -> None:
    objs = striped(2, {0: (WRITTEN, b"a"), 1: (WRITTEN, b"b")})
    q = FakeQueue(objs)
    scan = ViewScan(q, None, [b"o0", b"o1"], 1, 0, 1000)  # type: ignore[arg-type]
    assert [d for _, _, d in rows(scan)] == [b"a", b"b"]
    objs[b"o0"][2] = (WRITTEN, b"c")
    objs[b"o1"][3] = (WRITTEN, b"d")
    built = scan.next_batch()
    assert built.batch.num_rows == 0 and built.stop == STOP_MISSING  # the windows it holds say 2 is unwritten
    scan.forget_from(2)
    q.pending.insert(0, (10**6, 0, q.reply(b"o0", 1, 0, 9, 16, 1 << 20)))  # a reply to nothing asked: ignored
    assert [d for _, _, d in rows(scan)] == [b"c", b"d"]


def dealt(width: int, unit: int, ss: int, entries: dict[int, tuple[int, bytes]]) -> dict[bytes, dict[int, tuple[int, bytes]]]:
    """A stripe starting at ss dealt in runs of `unit` (layout.index_of)."""
    from pyzlog.core import wire
    from pyzlog.core.layout import index_of

    view = wire.View(1, ss, width, wire.FORMAT_DATA, 1 << 20, 1 << 30, 1, unit)
    objs: dict[bytes, dict[int, tuple[int, bytes]]] = {b"o%d" % i: {} for i in range(width)}
    for p, e in entries.items():
        objs[b"o%d" % index_of(view, p)][p] = e
    return objs


@pytest.mark.parametrize("per_call,call_bytes", [(1024, 1 << 20), (3, 1 << 20), (1024, 5)])
def test_a_stripe_in_runs_gives_the_same_records_as_row_sets_and_as_batches(per_call: int, call_bytes: int) -> None:
    """A stripe from 5 dealt in runs of 4 over 3 objects, read from an odd
    position: the records made from RowSets (pointers into the replies,
    stream()'s) are the records made from record batches, and stay readable
    after the scan has dropped every window they point into; nothing is
    left allocated once they are gone."""
    from pyzlog._dataplane import lib
    from pyzlog.client.batches import RecordBatch

    log = {p: (WRITTEN, b"d%d" % p * (p % 3)) for p in range(5, 90)}
    log[20] = (FILLED, b"")
    log[21] = (FILLED, b"\x01")
    log[33] = (TRIMMED, b"")
    live = (lib.dp_live(3), lib.dp_live(4))  # windows, batches (and row sets)

    def records(rows: bool) -> list[Any]:
        q = FakeQueue(dealt(3, 4, 5, log))
        scan = ViewScan(q, None, [b"o0", b"o1", b"o2"], 1, 7, 90, per_call=per_call,  # type: ignore[arg-type]
                        call_bytes=call_bytes, unit=4, stripe_start=5, rows=rows, max_rows=10)
        rb, out, its = RecordBatch(None), [], []
        for b in scan.batches():
            rb.load(b)
            its.append(rb.pending)
        scan.forget_from(7)  # the scan lets go of every window
        del scan, q, b
        for it in its:
            out += list(it)
        return out

    want = records(False)
    assert [r.position for r in want] == list(range(7, 90))
    assert want[20 - 7].kind.value == "filled" and want[21 - 7].kind.value == "lost" and want[33 - 7].data is None
    assert records(True) == want
    assert (lib.dp_live(3), lib.dp_live(4)) == live


@pytest.mark.parametrize("unit,start", [(1, 0), (1, 6), (4, 5), (4, 11), (6, 5), (6, 20)])
def test_calls_start_small_grow_to_per_call_and_every_objects_end_at_the_same_row(
        unit: int, start: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first batch comes after a short read (FIRST_CALL entries per
    object), the calls then double up to per_call; each round of calls ends
    at one row of the stripe for every object, so a batch ends once per
    round and not at each object's boundary in turn (a stripe in runs read
    from mid-run once gave a batch per run). A unit that does not divide
    per_call rounds a call up to a whole row, not down (down took up to
    twice the calls)."""
    monkeypatch.setattr(scan_mod, "FIRST_CALL", 4)
    ss, width, per_call, end = 5, 3, 16, 400
    row = width * unit
    log = {p: (WRITTEN, b"d") for p in range(ss, end)}
    q = FakeQueue(dealt(3, unit, ss, log) if unit > 1 else striped(3, log))
    scan = ViewScan(q, None, [b"o0", b"o1", b"o2"], 1, ss + start, end, per_call=per_call,  # type: ignore[arg-type]
                    unit=unit, stripe_start=ss if unit > 1 else 0)
    sizes = [len(b) for b in scan.batches()]
    assert sum(sizes) == end - ss - start
    base = ss if unit > 1 else 0
    row0 = (ss + start - base) // row
    # calls end at rows row0 + 4/unit.., doubling to per_call entries per object
    first_rows = max(1, 4 // unit)
    ends, r, step = [], row0, first_rows
    while base + r * row < end:
        r += step
        ends.append(min(base + r * row, end))
        step = min(2 * step, -(-per_call // unit))  # per_call, to a whole row (unit 6: 18 entries)
    rounds: dict[bytes, list[int]] = {}
    for oid, first, last in q.calls:  # a call ends in the last row of the round its first position is in
        e = next(e for e in ends if first < e)
        assert e - row <= last < e
        rounds.setdefault(oid, []).append(ends.index(e))
    for got in rounds.values():  # each object's calls: one per round, in turn, from the first it has positions in
        assert got == list(range(got[0], len(ends))) and got[0] <= 1
    # a batch per round: each ends where a round of calls ends (the first may
    # run into the second round: an object whose positions start there)
    stops = list(itertools.accumulate(sizes, initial=ss + start))[1:]
    assert stops[1:] == ends[1:] and stops[0] <= ends[1]


@pytest.mark.parametrize("unit", [1, 3, 128, 257, 300, 640, 4100])
def test_no_unit_costs_more_calls_than_reading_per_call_at_a_time(unit: int) -> None:
    """Ending calls at rows never costs more calls than reading per_call
    entries at a time would (plus the first, smaller ones): a unit that does
    not divide per_call is rounded up to a whole row, not down (down took up
    to twice the calls), and a run longer than per_call is read per_call at
    a time."""
    width, per_call, ss, start, end = 4, 512, 3, 1000, 60_000
    log = {p: (WRITTEN, b"") for p in range(ss, end)}
    q = FakeQueue(dealt(width, unit, ss, log) if unit > 1 else striped(width, log))
    scan = ViewScan(q, None, [b"o%d" % i for i in range(width)], 1, start, end,  # type: ignore[arg-type]
                    per_call=per_call, unit=unit, stripe_start=ss if unit > 1 else 0)
    assert sum(len(b) for b in scan.batches()) == end - start
    ramp = (per_call // scan_mod.FIRST_CALL).bit_length()  # the first, smaller calls
    for i in range(width):
        oid = b"o%d" % i
        held = sum(1 for p in range(start, end) if p in q.objects[oid])
        calls = sum(1 for o, _, _ in q.calls if o == oid)
        assert calls <= -(-held // per_call) + ramp + 1, (oid, held, calls)
