"""Reading one partition on an executor: its planned positions as Arrow batches."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from ..core.errors import ZlogError
from ..client.reader import RecordKind
from .connection import opened_log
from .options import ZlogOptions
from .plan import ZlogPartition

#: rows per Arrow record batch handed to Spark
BATCH_ROWS = 4096

SCHEMA_DDL = "position long, data binary, kind string, epoch long"
SCHEMA = StructType([StructField("position", LongType()), StructField("data", BinaryType()),
                     StructField("kind", StringType()), StructField("epoch", LongType())])
ARROW_SCHEMA = pa.schema([
    pa.field("position", pa.int64()),
    pa.field("data", pa.binary()),
    pa.field("kind", pa.string()),
    pa.field("epoch", pa.int64()),
])


class ZlogDataLoss(ZlogError):
    """A TRIMMED or LOST position in a read with onDataLoss=fail."""

    def __init__(self, log: str, position: int, kind: RecordKind, hole_wait: float) -> None:
        self.position = position
        self.kind = kind
        why = ("was trimmed: its data is gone" if kind == RecordKind.TRIMMED else
               f"was lost: it stayed unwritten for holeWait={hole_wait:g}s below the tail "
               "(its writer died) and was filled")
        super().__init__(f"zlog data loss in log {log!r}: position {position} {why}. "
                         "Set option onDataLoss=skip to drop such positions, or onDataLoss=rows "
                         "to return them as rows with their kind")


def _batch(pos: list[int], data: list[bytes | None], kind: list[str], epoch: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(pos, pa.int64()), pa.array(data, pa.binary()),
         pa.array(kind, pa.string()), pa.array(epoch, pa.int64())], schema=ARROW_SCHEMA)


def read_partition(opts: ZlogOptions, part: object,
                   batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    # An empty plan reaches here as Spark's own placeholder partition (or None).
    if not isinstance(part, ZlogPartition) or part.start >= part.end:
        return
    with opened_log(opts) as log:
        if log.epoch < part.epoch:
            log.refresh()
        # Exactly the planned positions (p % width == index of the planned view),
        # read from whichever view holds each one now: a reconfiguration since
        # planning moves where they are read from, never which are delivered.
        args: dict[str, Any] = dict(
            stride_index=part.index, stride=part.width, known_tail=part.known_tail,
            hole_wait=opts.hole_wait, on_corrupt="fail" if opts.on_corrupt == "fail" else "skip")
        try:
            batches = log.stream_batches(part.start, part.end, signed=True, **args)
        except ImportError:  # no native read path in this build: records through python-rados
            yield from _from_records(opts, log.stream(part.start, part.end, **args), batch_rows)
            return
        for batch in batches:
            out = _spark_rows(opts, batch)
            for i in range(0, out.num_rows, batch_rows):
                yield out.slice(i, batch_rows)


def _spark_rows(opts: ZlogOptions, batch: pa.RecordBatch) -> pa.RecordBatch:
    """A stream_batches batch as the source's rows, with onDataLoss applied:
    rows keeps every kind; otherwise filled positions are dropped, and
    trimmed or lost ones are dropped (skip) or fail the read (fail). A
    corrupt row (onCorrupt=skip or rows; with fail the stream raised
    CorruptEntry) is kept only with onCorrupt=rows."""
    import pyarrow.compute as pc

    kind = batch.column(2).dictionary_decode()
    if opts.on_corrupt != "rows":
        keep = pc.not_equal(kind, RecordKind.CORRUPT.value)
        batch, kind = batch.filter(keep), kind.filter(keep)
    if opts.on_data_loss != "rows":
        if opts.on_data_loss == "fail":
            lost = pc.or_(pc.equal(kind, RecordKind.TRIMMED.value), pc.equal(kind, RecordKind.LOST.value))
            if pc.any(lost).as_py():
                i = pc.index(lost, True).as_py()
                raise ZlogDataLoss(opts.log, batch.column(0)[i].as_py(), RecordKind(kind[i].as_py()),
                                   opts.hole_wait)
        keep = pc.or_(pc.equal(kind, RecordKind.DATA.value), pc.equal(kind, RecordKind.CORRUPT.value))
        batch, kind = batch.filter(keep), kind.filter(keep)
    return pa.RecordBatch.from_arrays([batch.column(0), batch.column(1), kind, batch.column(3)],
                                      schema=ARROW_SCHEMA)


def _from_records(opts: ZlogOptions, stream: Iterator[Any], batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The same rows from Records (the python-rados stream)."""
    rows = opts.on_data_loss == "rows"
    pos: list[int] = []
    data: list[bytes | None] = []
    kind: list[str] = []
    epoch: list[int] = []
    for rec in stream:
        if rec.kind == RecordKind.CORRUPT:
            if opts.on_corrupt != "rows":
                continue
        elif rec.kind != RecordKind.DATA and not rows:
            if rec.kind == RecordKind.FILLED or opts.on_data_loss == "skip":
                continue
            raise ZlogDataLoss(opts.log, rec.position, rec.kind, opts.hole_wait)
        pos.append(rec.position)
        data.append(rec.data)
        kind.append(rec.kind.value)
        epoch.append(rec.epoch)
        if len(pos) >= batch_rows:
            yield _batch(pos, data, kind, epoch)
            pos, data, kind, epoch = [], [], [], []
    if pos:
        yield _batch(pos, data, kind, epoch)
