"""Writing to a log: each task appends its rows' `data` column with append_many.

A log is append-only, so a failed job cannot take back what its tasks already
appended: abort() reports those entries (count and positions) and leaves them.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamWriter,
                                    WriterCommitMessage)
from pyspark.sql.types import BinaryType, StringType, StructType

from ..core.errors import ZlogError
from .connection import opened_log
from .options import ZlogOptions
from .report import WriteReport

logger = logging.getLogger("pyzlog.spark")


@dataclass
class ZlogCommitMessage(WriterCommitMessage):
    """What one task appended: `count` entries at positions min..max, exactly `ranges`."""
    count: int = 0
    min: int | None = None
    max: int | None = None
    ranges: list[tuple[int, int]] = field(default_factory=list)  # inclusive runs

    def add(self, positions: list[int]) -> None:
        for p in sorted(positions):
            if self.ranges and self.ranges[-1][1] + 1 == p:
                self.ranges[-1] = (self.ranges[-1][0], p)
            else:
                self.ranges.append((p, p))
        if positions:
            self.count += len(positions)
            self.min = min(positions) if self.min is None else min(self.min, min(positions))
            self.max = max(positions) if self.max is None else max(self.max, max(positions))


class ZlogWriteFailed(ZlogError):
    """A write task failed after appending some entries (they stay in the log)."""


def summarize(messages: Iterable[Any]) -> dict[str, Any]:
    done = [m for m in messages if isinstance(m, ZlogCommitMessage)]
    counted = [m for m in done if m.count]
    return {
        "tasks": len(done),
        "count": sum(m.count for m in done),
        "min": min((m.min for m in counted if m.min is not None), default=None),
        "max": max((m.max for m in counted if m.max is not None), default=None),
        "ranges": sorted(r for m in done for r in m.ranges),
    }


def _report(opts: ZlogOptions, messages: list[Any], batch_id: int | None, committed: bool) -> WriteReport:
    s = summarize(messages)
    return WriteReport(opts.log, batch_id, s["count"], s["min"], s["max"],
                       tuple(tuple(r) for r in s["ranges"]), s["tasks"], committed)


def data_column(schema: StructType, overwrite: bool) -> str:
    """The one rule for batch and streaming writes: the column named `data`
    in any case (`data`, `Data`, ...), binary or string. Returns its exact name."""
    if overwrite:
        raise ValueError("zlog: a log is append-only; write with mode('append') (streaming: "
                         "outputMode('append')), not overwrite or complete")
    found = [f for f in schema.fields if f.name.lower() == "data"]
    if not found:
        raise ValueError(f"zlog write: the DataFrame needs a 'data' column (binary or string); "
                         f"it has {', '.join(schema.fieldNames()) or 'no columns'}")
    if len(found) > 1:
        raise ValueError(f"zlog write: columns {', '.join(repr(f.name) for f in found)} all match "
                         "'data'; keep one")
    f = found[0]
    if not isinstance(f.dataType, (BinaryType, StringType)):
        raise ValueError(f"zlog write: column {f.name!r} must be binary or string, "
                         f"not {f.dataType.simpleString()}")
    return f.name


def _entries(items: Iterator[Any], column: str) -> Iterator[bytes]:
    """`column` values of Arrow batches (batch writes) or Rows (streaming
    writes), as bytes (strings UTF-8 encoded)."""
    for item in items:
        if isinstance(item, pa.RecordBatch):
            values: Iterable[Any] = item.column(column).to_pylist()
        else:
            values = (item[column],)
        for v in values:
            if v is None:
                raise ValueError(f"zlog write: column {column!r} has a null value (entries cannot be null)")
            yield v.encode("utf-8") if isinstance(v, str) else bytes(v)


def append_all(opts: ZlogOptions, items: Iterator[Any], column: str) -> ZlogCommitMessage:
    """One task's write: append_many per batchSize entries."""
    msg = ZlogCommitMessage()
    try:
        with opened_log(opts) as log:
            batch: list[bytes] = []
            for entry in _entries(items, column):
                batch.append(entry)
                if len(batch) >= opts.batch_size:
                    msg.add(log.append_many(batch))
                    batch = []
            if batch:
                msg.add(log.append_many(batch))
    except Exception as e:
        if msg.count:
            logger.error("zlog write to %r failed after appending %d entries at %s; they stay in the log",
                         opts.log, msg.count, msg.ranges)
            raise ZlogWriteFailed(f"zlog write to {opts.log!r} failed after appending {msg.count} "
                                  f"entries (positions {msg.min}..{msg.max}, runs {msg.ranges}); "
                                  f"they stay in the log: {e}") from e
        raise
    return msg


def _abort_report(opts: ZlogOptions, messages: list[Any], what: str) -> None:
    s = summarize(messages)
    failed = sum(1 for m in messages if m is None)
    logger.error("zlog %s to %r aborted: %d entries appended by %d successful tasks stay in the log "
                 "(positions %s..%s, runs %s); %d failed tasks report their own partial appends in "
                 "their error", what, opts.log, s["count"], s["tasks"], s["min"], s["max"],
                 s["ranges"], failed)


class ZlogWriter(DataSourceArrowWriter):
    def __init__(self, opts: ZlogOptions, schema: StructType, overwrite: bool, reports: Any = None) -> None:
        self.column = data_column(schema, overwrite)
        self.opts = opts
        self.reports = reports  # an accumulator of WriteReports in the driver (report.py)
        with opened_log(opts, create=opts.create):  # create it once, on the driver
            pass

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ZlogCommitMessage:
        return append_all(self.opts, iterator, self.column)

    def commit(self, messages: list[Any]) -> None:
        _publish(self.reports, _report(self.opts, messages, None, committed=True))

    def abort(self, messages: list[Any]) -> None:
        _abort_report(self.opts, messages, "write")
        _publish(self.reports, _report(self.opts, messages, None, committed=False))


class ZlogStreamWriter(DataSourceStreamWriter):
    """At-least-once: a micro-batch that is run again appends its rows again."""

    def __init__(self, opts: ZlogOptions, schema: StructType, overwrite: bool, reports: Any = None) -> None:
        self.column = data_column(schema, overwrite)  # "complete" mode cannot replace a log either
        self.opts = opts
        self.reports = reports
        with opened_log(opts, create=opts.create):
            pass

    def write(self, iterator: Iterator[Any]) -> ZlogCommitMessage:
        return append_all(self.opts, iterator, self.column)

    def commit(self, messages: list[Any], batchId: int) -> None:
        _publish(self.reports, _report(self.opts, messages, batchId, committed=True))

    def abort(self, messages: list[Any], batchId: int) -> None:
        _abort_report(self.opts, messages, f"stream write batch {batchId}")
        _publish(self.reports, _report(self.opts, messages, batchId, committed=False))


def _publish(reports: Any, report: WriteReport) -> None:
    """To the driver through the accumulator (see report.py), and to this
    worker's log (the driver's stderr where Spark forwards it)."""
    logger.info("%s", report)
    if reports is not None:
        reports.add([report])
