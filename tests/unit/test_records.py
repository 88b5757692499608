"""pyzlog._records: stream()'s records made one at a time from a batch's
columns, against the same batch read through pyarrow; and what it refuses."""
from __future__ import annotations

import operator

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyzlog._records import records
from pyzlog.client.batches import RecordBatch
from pyzlog.client.reader import Record, RecordKind
from pyzlog.core.scan import KIND_NAMES, batch_of

KINDS = tuple(RecordKind(k) for k in KIND_NAMES)
ROWS = st.lists(st.tuples(st.integers(0, 2**64 - 2), st.sampled_from(KIND_NAMES), st.integers(0, 2**64 - 2),
                          st.binary(max_size=40)), max_size=30)


def _iterate(b: pa.RecordBatch) -> list[Record]:
    pos, data, kinds, epochs = (b.column(i) for i in range(4))
    validity, offsets, values = data.buffers()
    return list(records(pos.buffers()[1], offsets, values, validity if data.null_count else None,
                        kinds.indices.buffers()[1], epochs.buffers()[1], data.offset, b.num_rows, Record, KINDS))


def _want(b: pa.RecordBatch) -> list[Record]:
    return [Record(r["position"], RecordKind(r["kind"]), r["data"], r["epoch"]) for r in b.to_pylist()]


@settings(max_examples=200, deadline=None)
@given(ROWS, st.integers(0, 30), st.integers(0, 30))
def test_records_are_the_batchs_rows(rows: list[tuple[int, str, int, bytes]], a: int, n: int) -> None:
    """Every row as a Record (data None unless the kind is data), also for a
    slice of the batch (arrays with an offset)."""
    b = batch_of([p for p, *_ in rows], [k for _, k, _, _ in rows], [e for *_, e, _ in rows],
                 [d if k == "data" else None for _, k, _, d in rows])
    got = _iterate(b)
    assert got == _want(b) and all(type(r) is Record for r in got)
    part = b.slice(min(a, len(rows)), n)
    assert _iterate(part) == _want(part)


def test_the_iterator_counts_down_and_holds_its_buffers() -> None:
    b = batch_of([5, 6, 7], ["data", "lost", "data"], [2, 2, 3], [b"five", None, b"seven"])
    pos, data, kinds, epochs = (b.column(i) for i in range(4))
    validity, offsets, values = data.buffers()
    it = records(pos.buffers()[1], offsets, values, validity, kinds.indices.buffers()[1], epochs.buffers()[1], 0,
                 3, Record, KINDS)
    del b, pos, data, kinds, epochs, validity, offsets, values  # the iterator keeps what it reads
    assert operator.length_hint(it) == 3
    assert next(it) == Record(5, RecordKind.DATA, b"five", 2)
    assert operator.length_hint(it) == 2
    assert list(it) == [Record(6, RecordKind.LOST, None, 2), Record(7, RecordKind.DATA, b"seven", 3)]
    assert operator.length_hint(it) == 0 and next(it, None) is None


def test_bad_columns_are_refused() -> None:
    b = batch_of([1, 2], ["data", "data"], [1, 1], [b"a", b"b"])
    pos, data, kinds, epochs = (b.column(i) for i in range(4))
    _, offsets, values = data.buffers()
    args = [pos.buffers()[1], offsets, values, None, kinds.indices.buffers()[1], epochs.buffers()[1], 0, 2]
    with pytest.raises(ValueError, match="positions"):
        records(*args[:6], 0, 3, Record, KINDS)  # more rows than the columns hold
    with pytest.raises(ValueError, match="data"):
        records(*args[:2], b"x", *args[3:], Record, KINDS)  # offsets past the data
    with pytest.raises(ValueError, match="kind code"):
        list(records(*args, Record, KINDS[:0]))  # a code with no kind
    with pytest.raises(TypeError):
        records(*args, dict, KINDS)  # not a tuple type
    with pytest.raises(ValueError):
        records(*args[:6], -1, 1, Record, KINDS)


def test_counts_follow_what_was_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """RecordBatch counts entries and stored bytes exactly as handed out,
    null rows (gaps) counting neither, a part of a batch as well."""
    from pyzlog.client import metrics

    counted: list[tuple[int, int]] = []
    monkeypatch.setattr(metrics, "read_many", lambda n, nbytes: counted.append((n, nbytes)))
    rb = RecordBatch(None)
    rb.load(batch_of([0, 1, 2, 3], ["data", "filled", "data", "data"], [1] * 4, [b"aa", None, b"bbb", b"c"]))
    assert next(rb.pending).data == b"aa" and next(rb.pending).kind == RecordKind.FILLED
    rb.count()
    assert counted == [(1, 2)]
    rb.load(batch_of([4], ["data"], [1], [b"dddd"]))  # the rest of the first batch is counted as handed out
    assert counted == [(1, 2)]
    list(rb.pending)
    rb.count()
    assert counted == [(1, 2), (1, 4)]
